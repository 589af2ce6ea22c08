"""Load any trace file into a Trace by sniffing its format (not trusting its suffix).

- SQLite (``SQLite format 3`` header): an Nsight Systems export (``workbench.trace.nsys``);
- JSON, optionally gzip-compressed (``.json.gz`` as the PyTorch profiler may write): a
  workbench Perfetto export (``otherData.producer == "workbench"``) is read back exactly,
  any other Chrome trace as a PyTorch-profiler / Kineto trace (``workbench.trace.chrome``);
- an ``.nsys-rep`` / ``.qdrep`` report: a clear error saying how to export it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from .table import Trace, TraceError

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
EXPECTED = ("an Nsight Systems SQLite export (nsys export --type sqlite), a PyTorch-profiler / Kineto Chrome "
            "trace JSON (.json or .json.gz) or a workbench Perfetto JSON export")


def sniff(path: str | Path) -> str:
    """``nsys``, ``perfetto`` (a workbench export), ``chrome`` or ``nsys-rep``; TraceError otherwise."""
    return _detect(Path(path))[0]


def _detect(path: Path) -> tuple[str, object]:
    """The format of ``path`` and, for JSON, the parsed object (parsed once)."""
    if not path.exists():
        raise FileNotFoundError(f"no such trace file: {path}")
    if path.is_dir():
        raise TraceError(f"{path} is a directory; expected a file: {EXPECTED}")
    with open(path, "rb") as f:
        head = f.read(64)
    if head.startswith(SQLITE_MAGIC):
        return "nsys", None
    if path.suffix.lower() in (".nsys-rep", ".qdrep"):
        return "nsys-rep", None
    obj = _json(path, head)
    from .perfetto import is_workbench_json

    return ("perfetto" if is_workbench_json(obj) else "chrome"), obj


def _json(path: Path, head: bytes) -> object:
    opener = gzip.open if head.startswith(GZIP_MAGIC) else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise TraceError(f"{path.name} is neither SQLite nor (gzipped) JSON text ({type(e).__name__}); "
                         f"expected {EXPECTED}") from None
    except json.JSONDecodeError as e:
        what = "empty" if not head.strip() else f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        raise TraceError(f"{path.name} is {what}; expected {EXPECTED}") from None


def load_trace(path: str | Path) -> Trace:
    """Read a trace file of any supported format."""
    path = Path(path)
    kind, obj = _detect(path)
    if kind == "nsys-rep":
        raise TraceError(f"{path.name} is an Nsight Systems report, which only nsys can read: export it with "
                         f"`nsys export --type sqlite -o {path.stem}.sqlite {path.name}` and load the .sqlite")
    if kind == "nsys":
        from .nsys import read_nsys_sqlite

        trace = read_nsys_sqlite(path)
    elif kind == "perfetto":
        from .perfetto import from_perfetto

        trace = from_perfetto(obj)
    else:
        from .chrome import read_chrome_trace

        trace = read_chrome_trace(obj)
    trace.meta.setdefault("file", str(path))
    return trace
