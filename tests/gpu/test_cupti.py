"""CUPTI capture of the cuda executor (needs a GPU; cupti-python for all but the fallback test)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.models import preset
from workbench.strategy import Strategy
from workbench.trace import API_ROW

CFG = preset("llama-tiny", layers=2)


def _run(strategy: Strategy, tokens: int = 3):
    import workbench

    return workbench.run(CFG, strategy, tokens=tokens, backend="cuda", trace=True, node_tokens=None)


def _needs_cupti() -> None:
    from workbench.trace.cupti import cupti_available

    if not cupti_available():
        pytest.skip("cupti-python is not installed")


def _check_nodes(run) -> None:
    """Every kernel of every token is one Plan node, each node once per token, in Plan order per stream."""
    ev = run.trace.events
    k = ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)]
    assert (k["node"] != "").all(), k[k["node"] == ""][["name", "token"]]
    plan = run.plan
    order = {la.node.name: la.index for la in plan.launches}
    for tok, g in k.groupby("token"):
        assert sorted(g["node"]) == sorted(order), f"token {tok}"
        for _, s in g.sort_values("start_ns").groupby("stream"):
            idx = [order[n] for n in s["node"]]
            assert idx == sorted(idx), f"token {tok}: stream runs nodes out of Plan order"


def test_graph_replay_kernels_map_to_plan_nodes_with_correlation_ids() -> None:
    _needs_cupti()
    run = _run(Strategy(graphs=True, pdl=True, streams="qkv", sync="implicit"))
    ev = run.trace.events
    assert run.trace.meta["source"] == "cupti"
    _check_nodes(run)
    launches = ev[(ev["row"] == API_ROW) & (ev["name"] == "cudaGraphLaunch") & (ev["token"] >= 0)]
    assert sorted(launches["token"]) == [0, 1, 2]
    k = ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)]
    assert set(k["corr_id"]) == set(launches["corr_id"])  # one graph launch issues each token's kernels
    assert (k["graph_id"] > 0).all()
    assert set(k["row"]) == {f"Stream {s}" for s in k["stream"].unique()}


def test_eager_trace_has_one_launch_call_per_kernel() -> None:
    _needs_cupti()
    run = _run(Strategy(streams="qkv", sync="boundary"))
    ev = run.trace.events
    _check_nodes(run)
    k = ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)]
    calls = ev[(ev["row"] == API_ROW) & ev["name"].str.contains("LaunchKernel") & (ev["token"] >= 0)]
    assert len(set(k["corr_id"])) == len(k) and set(k["corr_id"]) <= set(calls["corr_id"])
    assert len(k["stream"].unique()) == 3  # the qkv fork runs on three CUDA streams


def test_per_copy_trace_syncs_before_every_input_copy() -> None:
    _needs_cupti()
    run = _run(Strategy())
    ev = run.trace.events
    host = ev[(ev["row"] == API_ROW) & (ev["token"] == 1)].sort_values("start_ns")
    names = [n for n in host["name"] if n in ("cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize")]
    copies = [i for i, n in enumerate(names) if n == "cudaMemcpy"]
    assert len(copies) == len(run.plan.graph.inputs)
    assert all(names[i - 1] == "cudaStreamSynchronize" for i in copies)
    h2d = ev[(ev["kind"] == "memcpy") & (ev["copy_kind"] == "H2D") & (ev["token"] == 1)]
    assert list(h2d.sort_values("start_ns")["node"]) == list(run.plan.graph.inputs)


def test_graph_level_trace_one_span_per_replay_and_kernels_in_node_tokens() -> None:
    _needs_cupti()
    import workbench

    run = workbench.run(CFG, Strategy(graphs=True, pdl=True, streams="qkv", sync="implicit"), tokens=4,
                        backend="cuda", trace=True, node_tokens=1)
    ev = run.trace.events
    spans = ev[(ev["kind"] == "graph") & (ev["token"] >= 0)]
    assert sorted(spans["token"]) == [0, 1, 2]  # token 3 is traced per kernel instead
    assert (spans["end_ns"] > spans["start_ns"]).all() and (spans["row"].str.startswith("Stream ")).all()
    launches = ev[(ev["row"] == API_ROW) & (ev["name"] == "cudaGraphLaunch") & (ev["token"] >= 0)]
    assert sorted(launches["token"]) == [0, 1, 2, 3]
    assert set(spans["corr_id"]) <= set(launches["corr_id"])
    k = ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)]
    assert set(k["token"]) == {3}
    _check_nodes(run)
    assert run.stats["graph_trace"] == "graph" and run.stats["node_tokens"] == [3]
    assert run.stats["us_per_token_graph_level"] > 0


def test_node_tokens_in_the_middle_switch_back_to_graph_spans_safely(monkeypatch) -> None:
    _needs_cupti()
    import workbench
    from workbench.exec import cuda_backend

    st = Strategy(graphs=True, pdl=True)
    # a node token in the middle of the run
    monkeypatch.setattr(cuda_backend, "graph_trace_mode", lambda n, total: ("graph", (1,)))
    run = workbench.run(CFG, st, tokens=4, backend="cuda", trace=True)
    ev = run.trace.events
    assert sorted(ev.loc[(ev["kind"] == "graph") & (ev["token"] >= 0), "token"]) == [0, 2, 3]
    assert set(ev.loc[(ev["kind"] == "kernel") & (ev["token"] >= 0), "token"]) == {1}
    _check_nodes(run)


def test_run_cli_traces_graph_level_by_default(tmp_path) -> None:
    _needs_cupti()
    import json
    import subprocess
    import sys

    out = tmp_path / "t.json"
    res = subprocess.run([sys.executable, "-m", "workbench.cli", "run", "--model", "llama-tiny", "--layers", "2",
                          "--backend", "cuda", "--graphs", "--tokens", "5", "--trace", str(out), "--json"],
                         capture_output=True, text=True, check=True)
    info = json.loads(res.stdout)
    assert info["graph_trace"] == "graph" and info["node_tokens"] == [3, 4]
    from workbench.trace.io import load_trace

    ev = load_trace(out).events
    assert set(ev.loc[ev["kind"] == "kernel", "token"]) == {3, 4}
    assert set(ev.loc[(ev["kind"] == "graph") & (ev["token"] >= 0), "token"]) == {0, 1, 2}


def test_panel_runs_on_the_cuda_backend_with_a_cupti_timeline() -> None:
    _needs_cupti()
    from workbench.view.panel import ControlPanel

    p = ControlPanel("llama-tiny", layers=2, tokens=4, backend="cuda", strategy=Strategy(graphs=True, pdl=True))
    entry = p.run()
    assert entry is not None, p.last_error
    run = entry.run
    assert run.backend == "cuda" and run.trace.meta["source"] == "cupti"
    assert set(run.trace.events.loc[run.trace.events["kind"] == "kernel", "token"]) == {2, 3}


def test_trace_time_per_token_agrees_with_the_host_clock() -> None:
    _needs_cupti()
    from workbench.trace.stats import us_per_token

    run = _run(Strategy(graphs=True), tokens=6)
    assert us_per_token(run.trace) == pytest.approx(run.stats["us_per_token"], rel=0.25)


def test_without_cupti_a_coarse_cuda_event_trace_and_a_notice(monkeypatch, capsys) -> None:
    import workbench.trace.cupti as cupti_mod

    monkeypatch.setattr(cupti_mod, "cupti_available", lambda: False)
    run = _run(Strategy(graphs=True), tokens=3)
    assert "cupti-python is not installed" in capsys.readouterr().err
    ev = run.trace.events
    assert run.trace.meta["source"] == "cuda-events"
    spans = ev[ev["kind"] == "kernel"].sort_values("token")
    assert list(spans["token"]) == [0, 1, 2] and (spans["end_ns"] > spans["start_ns"]).all()
    assert np.all(np.diff(spans["start_ns"].to_numpy()) > 0)
