"""benchmarks/pdl_early_launch.py's table: a kernel's step is its end after the previous kernel's
end on its stream, so a kernel PDL started early is charged what it added, not its duration."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("pdl_early_launch", ROOT / "benchmarks" / "pdl_early_launch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_step_is_end_after_the_previous_end(bench) -> None:
    ev = []
    for tok in (0, 1, 2):
        t0 = tok * 100_000
        # a mat-vec, then a kernel PDL started 5 us before the mat-vec ended, on one stream
        ev += [{"kind": "kernel", "token": tok, "stream": 7, "node": "l_out-3", "name": "k_mv",
                "start_ns": t0, "end_ns": t0 + 30_000},
               {"kind": "kernel", "token": tok, "stream": 7, "node": "v_cache_store-4", "name": "k_qkv",
                "start_ns": t0 + 25_000, "end_ns": t0 + 50_000}]
    st = bench.steps(pd.DataFrame(ev), first_token=1).set_index("fam")["step"]
    assert st["v_cache_store"] == pytest.approx(20.0)  # 50 - 30 us, not its 25 us duration
    assert pd.isna(st["l_out"])  # the first kernel of a token has no predecessor on its stream
