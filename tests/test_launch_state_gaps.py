"""benchmarks/launch_state.py --gaps: the gap between consecutive kernels of one stream, read from
recorded timelines to the ns (CUPTI's stamps sit where float64 steps by 256 ns)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
CUPTI_EPOCH_NS = 1_795_917_429_777_295_744


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("launch_state", ROOT / "benchmarks" / "launch_state.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gaps_are_exact_at_cuptis_epoch_and_per_stream(bench, tmp_path) -> None:
    rows = []
    for stream, gap in ((7, 96), (9, 416)):
        t = CUPTI_EPOCH_NS + 13 + stream
        for i in range(5):
            rows.append({"model": "m", "strategy": "graphs", "node": f"n{stream}-{i}", "name": "k",
                         "start_ns": t, "end_ns": t + 1000, "stream": stream})
            t += 1000 + gap
    csv = tmp_path / "k.csv.gz"
    pd.DataFrame(rows).to_csv(csv, index=False)
    g = bench.kernel_gaps(pd.DataFrame(rows))
    assert sorted(g.unique()) == [96, 416] and len(g) == 8  # no gap across the two streams
    t = bench.gap_table([str(csv)])
    assert t.loc[0, "kernels"] == 10 and t.loc[0, "gap_p25_ns"] == 96 and t.loc[0, "gap_p75_ns"] == 416


def test_llama_cpp_replays_its_graphs_with_96_ns_gaps(bench) -> None:
    """The committed llama.cpp capture that launch_state_h200.md (session 30) reads."""
    path = ROOT / "data" / "traces" / "llamacpp" / "h200_captures" / "llama-3.2-1b-L16_pdl0.parquet"
    t = bench.gap_table([str(path)])
    assert t.loc[0, "kernels"] == 213 and t.loc[0, "gap_median_ns"] == 96
