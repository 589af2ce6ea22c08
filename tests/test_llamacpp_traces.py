"""Recorded CUPTI timelines of the real llama.cpp (``data/traces/llamacpp/``, written on a GPU by
``benchmarks/llamacpp_record_trace.py``): what llama.cpp's own switches do on the device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_recorded_traces import _max_streams_busy

from workbench.trace.io import load_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces" / "llamacpp"


def _load(name: str):
    path = TRACES / f"{name}.json.gz"
    if not path.exists():
        pytest.skip(f"{path.relative_to(TRACES.parents[2])} is not recorded yet: run "
                    "benchmarks/llamacpp_gpu_run.sh on a GPU machine and commit its traces/")
    return load_trace(path)


def _kernels(trace) -> pd.DataFrame:
    ev = trace.events
    return ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)].sort_values("start_ns", kind="stable")


def _steady(k: pd.DataFrame) -> pd.DataFrame:
    """The last token's kernels (llama.cpp may still be capturing its graph on the first)."""
    return k[k["token"] == k["token"].max()]


@pytest.mark.parametrize("name", ["llama-3.2-1b-L2_graphs", "llama-3.2-1b-L2_graphs-pdl",
                                  "llama-3.2-1b-L2_graphs-pdl-qkv"])
def test_recorded_llamacpp_trace_is_a_cupti_timeline_named_by_ggml_op(name):
    tr = _load(name)
    assert tr.meta["source"] == "cupti" and tr.meta["backend"] == "llamacpp"
    assert "H100" in tr.meta["gpu_name"] or "H200" in tr.meta["gpu_name"]
    k = _kernels(tr)
    assert len(tr.tokens()) >= 4 and len(k) > 0
    assert (k["op"] != "").mean() >= 0.9, sorted(set(k.loc[k["op"] == "", "name"]))
    assert (tr.events["kind"] == "marker").sum() == len(tr.tokens())
    assert (TRACES / f"{name}.json.gz").stat().st_size < 400_000


def test_graphs_with_pdl_overlap_consecutive_kernels_on_one_stream():
    """PDL lets llama.cpp's next kernel start before its predecessor ends; with PDL off they do not."""
    def overlap(name: str) -> tuple[int, int]:
        k = _steady(_kernels(_load(name)))
        main = k[k["stream"] == k["stream"].mode().iloc[0]]
        s, e = main["start_ns"].to_numpy(), main["end_ns"].to_numpy()
        return int((s[1:] < np.maximum.accumulate(e)[:-1]).sum()), len(s) - 1

    n, boundaries = overlap("llama-3.2-1b-L2_graphs-pdl")
    assert n > boundaries / 2, f"only {n} of {boundaries} kernel boundaries overlap under PDL"
    n_off, _ = overlap("llama-3.2-1b-L2_graphs")
    assert n_off < n / 4, f"{n_off} overlaps with PDL off"



def test_graph_opt_runs_three_streams_at_once():
    """GGML_CUDA_GRAPH_OPT forks Q, K and V onto three streams inside the CUDA graph."""
    k = _steady(_kernels(_load("llama-3.2-1b-L2_graphs-pdl-qkv")))
    assert k["stream"].nunique() >= 3
    assert _max_streams_busy(k) >= 3
    single = _steady(_kernels(_load("llama-3.2-1b-L2_graphs-pdl")))
    assert single["stream"].nunique() == 1
