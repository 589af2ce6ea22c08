"""Reading and writing the calibration's JSON files (the raw measurements may be gzipped)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def write_json(path: Path, obj: Any) -> None:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))
