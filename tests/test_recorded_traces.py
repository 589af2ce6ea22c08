"""The recorded GPU traces in ``data/traces/`` (CUPTI, written by ``benchmarks/record_traces.py``)
show what each knob does on a real GPU; these tests read them without one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.trace import API_ROW
from workbench.trace.io import load_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def _load(name: str):
    path = TRACES / f"{name}.json.gz"
    assert path.exists(), f"{path} is missing: record it with benchmarks/record_traces.py on a GPU"
    return load_trace(path)


def _kernels(trace) -> pd.DataFrame:
    ev = trace.events
    return ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)].sort_values("start_ns", kind="stable")


@pytest.mark.parametrize("name", ["llama-3.2-1b-L2_graphs-pdl", "llama-3.2-1b-L2_graphs-qkv",
                                  "llama-3.2-1b-L2_eager-per-copy", "llama-3.2-1b_all-on"])
def test_recorded_trace_is_a_measured_cupti_timeline_with_nodes(name: str) -> None:
    tr = _load(name)
    assert tr.meta["source"] == "cupti" and ("H100" in tr.meta["gpu_name"] or "H200" in tr.meta["gpu_name"])
    k = _kernels(tr)
    assert len(tr.tokens()) >= 3 and len(k) > 0
    assert (k["node"] != "").all(), "every kernel is mapped to its Plan node"
    per_token = k.groupby("token")["node"].apply(lambda s: sorted(s))
    assert all(nodes == per_token.iloc[0] for nodes in per_token), "each token runs the same nodes"
    api = tr.events[tr.events["row"] == API_ROW]
    assert set(k["corr_id"]) <= set(api["corr_id"]), "device work links to the API call that issued it"
    assert (TRACES / f"{name}.json.gz").stat().st_size < 400_000


def test_graph_pdl_run_overlaps_consecutive_kernels_on_one_stream() -> None:
    k = _kernels(_load("llama-3.2-1b-L2_graphs-pdl"))
    assert k["stream"].nunique() == 1
    overlaps = boundaries = 0
    for _, g in k.groupby("token"):
        s, e = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        boundaries += len(s) - 1
        overlaps += int((s[1:] < e[:-1]).sum())  # the next kernel starts before its predecessor ends
    assert overlaps > boundaries / 2, f"only {overlaps} of {boundaries} kernel boundaries overlap under PDL"


def _max_streams_busy(k: pd.DataFrame) -> int:
    """The most distinct streams with a kernel running at one instant."""
    best = 0
    for t in k["start_ns"].to_numpy():
        running = k[(k["start_ns"] <= t) & (k["end_ns"] > t)]
        best = max(best, running["stream"].nunique())
    return best


def test_qkv_run_has_three_streams_busy_at_once() -> None:
    tr = _load("llama-3.2-1b-L2_graphs-qkv")
    k = _kernels(tr)
    assert k["stream"].nunique() >= 3
    assert _max_streams_busy(k[k["token"] == k["token"].max()]) >= 3
    qkv = k[k["node"].str.match(r"[QKV]cur-0$")]
    assert qkv.groupby("token")["stream"].nunique().min() == 3, "Q, K and V of a layer run on three streams"


def test_per_copy_run_syncs_before_every_copy() -> None:
    tr = _load("llama-3.2-1b-L2_eager-per-copy")
    ev = tr.events
    host = ev[(ev["row"] == API_ROW) & (ev["token"] >= 0)
              & ev["name"].isin(["cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize"])]
    for tok, g in host.sort_values("start_ns").groupby("token"):
        names = list(g["name"])
        copies = [i for i, n in enumerate(names) if n == "cudaMemcpy"]
        assert len(copies) >= 4, f"token {tok}: the step's inputs are copied one by one"
        assert all(i > 0 and names[i - 1] == "cudaStreamSynchronize" for i in copies), f"token {tok}: {names}"
    # the copies are blocking: each one ends before the host issues the next call
    h2d = ev[(ev["kind"] == "memcpy") & (ev["copy_kind"] == "H2D") & (ev["token"] >= 0)]
    calls = ev[(ev["row"] == API_ROW) & (ev["name"] == "cudaMemcpy")].set_index("corr_id")
    assert np.all(h2d["end_ns"].to_numpy() <= calls.loc[h2d["corr_id"], "end_ns"].to_numpy())


def test_graph_level_trace_spans_replays_and_details_the_last_tokens() -> None:
    """``workbench run --trace``'s default on a GPU: one GRAPH_TRACE span per graph replay, the
    last 2 tokens kernel by kernel (where PDL overlap and the qkv streams show)."""
    tr = _load("llama-3.2-1b_all-on_graph-level")
    assert tr.meta["graph_trace"] == "graph" and list(tr.meta["node_tokens"]) == [4, 5]
    ev = tr.events
    spans = ev[(ev["kind"] == "graph") & (ev["token"] >= 0)].sort_values("token")
    assert list(spans["token"]) == [0, 1, 2, 3]
    launches = ev[(ev["row"] == API_ROW) & (ev["name"] == "cudaGraphLaunch")].set_index("corr_id")
    assert (launches.loc[spans["corr_id"], "token"].to_numpy() == spans["token"].to_numpy()).all()
    assert (launches.loc[spans["corr_id"], "end_ns"].to_numpy() <= spans["end_ns"].to_numpy()).all()
    k = _kernels(tr)
    assert set(k["token"]) == {4, 5} and (k["node"] != "").all() and k["stream"].nunique() == 3
    overlaps = sum(int((g["start_ns"].to_numpy()[1:] < g["end_ns"].to_numpy()[:-1]).sum())
                   for _, g in k.groupby(["token", "stream"]))
    assert overlaps > 0, "PDL overlap shows in the node-detail tokens"
    # a span covers its replay: about as long as the node tokens' first-to-last kernel
    node_span = k.groupby("token").apply(lambda g: g["end_ns"].max() - g["start_ns"].min())
    assert np.median(spans["end_ns"] - spans["start_ns"]) == pytest.approx(np.median(node_span), rel=0.3)
