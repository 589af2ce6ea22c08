"""CUPTI records -> Trace without a GPU: tokens from host marks, nodes matched inside graph replay."""

from __future__ import annotations

import pytest

from workbench.models import build_graph, preset
from workbench.strategy import Strategy, compile_plan
from workbench.trace.cupti_names import api_name, kernel_base_name
from workbench.trace.cupti_records import (
    KernelSite,
    activity_to_record,
    copies_from_plan,
    match_kernels,
    records_to_trace,
    sites_from_plan,
)


def test_names_lose_versions_mangling_and_templates() -> None:
    assert api_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    assert api_name("cudaMemcpyAsync_v3020_ptsz") == "cudaMemcpyAsync"
    assert kernel_base_name("_Z8rms_normPKfPfi") == "rms_norm"
    assert kernel_base_name("_ZN2wb7mul_matEPK6__halfPfi") == "mul_mat"
    assert kernel_base_name("mul_mat<4, true>") == "mul_mat"


def test_same_name_kernels_on_three_streams_map_by_stream_history() -> None:
    sites = [KernelSite("norm", 0, "rms_norm"), KernelSite("Q", 0, "mul_mat"), KernelSite("K", 1, "mul_mat"),
             KernelSite("V", 2, "mul_mat"), KernelSite("attn", 0, "attn")]
    smap: dict[int, int] = {}
    # token 0: they start in plan order and teach the stream map
    rec = [dict(name="rms_norm", stream=7), dict(name="mul_mat", stream=7), dict(name="mul_mat", stream=21),
           dict(name="mul_mat", stream=22), dict(name="attn", stream=7)]
    assert match_kernels(rec, sites, smap) == ["norm", "Q", "K", "V", "attn"]
    # token 1: V starts before K and Q; the learned CUDA stream -> plan stream map keeps them apart
    rec = [dict(name="rms_norm", stream=7), dict(name="mul_mat", stream=22), dict(name="mul_mat", stream=21),
           dict(name="mul_mat", stream=7), dict(name="attn", stream=7)]
    assert match_kernels(rec, sites, smap) == ["norm", "V", "K", "Q", "attn"]


def test_an_unplanned_kernel_is_left_unnamed_and_a_missing_one_skipped() -> None:
    sites = [KernelSite("a", 0, "add"), KernelSite("b", 0, "mul"), KernelSite("c", 0, "add")]
    rec = [dict(name="add"), dict(name="memset_kernel"), dict(name="add")]
    assert match_kernels(rec, sites) == ["a", "", "c"]


def _graph_replay_records(plan, n_tokens: int, node_ids: bool) -> tuple[list[dict], list[tuple[int, int]]]:
    """What CUPTI reports for ``n_tokens`` graph replays of ``plan`` (per-copy sync), Q/K/V racing."""
    recs: list[dict] = []
    marks: list[tuple[int, int]] = []
    t, corr = 1_000, 100
    streams = {0: 13, 1: 14, 2: 15}
    for tok in range(n_tokens):
        marks.append((tok, t))
        t += 10
        for op in plan.host_program:
            corr += 1
            if op.kind == "stream_sync":
                recs.append(dict(src="runtime", name="cudaStreamSynchronize_v3020", start=t, end=t + 300, corr=corr))
                recs.append(dict(src="sync", name="Stream Synchronize", start=t, end=t + 300, corr=corr, stream=13))
                t += 400
            elif op.kind.startswith("memcpy"):
                recs.append(dict(src="runtime", name=op.api + "_v3020", start=t, end=t + 500, corr=corr))
                kind = "H2D" if op.kind == "memcpy_h2d" else "D2H"
                recs.append(dict(src="memcpy", name=f"Memcpy {kind}", start=t + 100, end=t + 200, corr=corr,
                                 stream=13, bytes=op.nbytes, copy_kind=kind))
                t += 600
            elif op.kind == "graph_launch":
                recs.append(dict(src="runtime", name="cudaGraphLaunch_v10000", start=t, end=t + 2000, corr=corr))
                k0 = t + 1000
                # Q/K/V start in reverse order on their streams: V first
                order = sorted(plan.launches, key=lambda la: (la.index if la.node.op != "MUL_MAT" or la.index > 5
                                                              else 6 - la.index))
                for la in order:
                    recs.append(dict(src="kernel", name=f"_Z{len(la.node.op)}{la.node.op.lower()}Pf", start=k0,
                                     end=k0 + 800, corr=corr, stream=streams[la.stream], graph_id=1,
                                     graph_node_id=(50 + 2 * la.index) if node_ids else 0))
                    k0 += 500
                t = k0 + 100
    return recs, marks


@pytest.mark.parametrize("node_ids", [True, False], ids=["graph-node-ids", "stream-ids"])
def test_graph_replay_trace_has_tokens_nodes_rows_and_syncs(node_ids: bool) -> None:
    plan = compile_plan(build_graph(preset("llama-tiny", layers=1)), Strategy(graphs=True, streams="qkv", pdl=True))
    sites = sites_from_plan(plan, lambda la: (la.node.op.lower(), None))
    recs, marks = _graph_replay_records(plan, 3, node_ids)
    # without graph node ids, the executor's plan stream -> CUDA stream ids tell Q, K and V apart
    stream_ids = None if node_ids else {0: 13, 1: 14, 2: 15}
    tr = records_to_trace(recs, marks, sites, copies_from_plan(plan), end_mark=10**9, stream_ids=stream_ids,
                          gpu="synthetic")
    ev = tr.events
    assert tr.tokens() == [0, 1, 2]
    kern = ev[ev.kind == "kernel"]
    assert len(kern) == 3 * len(plan.launches) and (kern.node != "").all()
    for tok in range(3):
        k = kern[kern.token == tok].set_index("node")
        assert k.loc["Vcur-0", "stream"] == 15 and k.loc["Kcur-0", "stream"] == 14 and k.loc["Qcur-0", "stream"] == 13
        assert sorted(k.index) == sorted(la.node.name for la in plan.launches)
    assert set(kern.row) == {"Stream 13", "Stream 14", "Stream 15"}
    api = ev[ev.row == "CUDA API"]
    assert set(api.kind) == {"api", "sync"} and "cudaGraphLaunch" in set(api.name)
    syncs = api[api.kind == "sync"]
    assert (syncs.name == "cudaStreamSynchronize").all() and (syncs.stream == 13).all()
    h2d = ev[(ev.kind == "memcpy") & (ev.copy_kind == "H2D")]
    assert list(h2d[h2d.token == 0].node) == ["inp_tokens", "inp_pos", "inp_kv_idx", "kq_mask"]
    # every device event carries its API call's correlation id
    assert set(ev[ev.kind != "api"].corr_id) <= set(api.corr_id)


def test_no_records_give_an_empty_trace_with_the_schema() -> None:
    tr = records_to_trace([], [(0, 10)], end_mark=20)
    assert len(tr) == 0 and tr.meta["source"] == "cupti"
    assert list(tr.events.columns)[:5] == ["row", "kind", "name", "start_ns", "end_ns"]


def test_graph_level_records_become_one_span_per_replay_with_the_launch_token() -> None:
    recs = [dict(src="runtime", start=0, end=10, corr=5, name="cudaGraphLaunch_v10000", tid=1, pid=1),
            dict(src="graph", start=20, end=500, corr=5, stream=7, graph_id=3, device=0),
            dict(src="runtime", start=600, end=610, corr=9, name="cudaGraphLaunch_v10000", tid=1, pid=1),
            dict(src="graph", start=650, end=1100, corr=9, stream=7, graph_id=3, device=0)]
    tr = records_to_trace(recs, [(0, 0), (1, 550)], end_mark=2000)
    g = tr.events[tr.events["kind"] == "graph"].sort_values("start_ns")
    assert list(g["token"]) == [0, 1] and list(g["row"]) == ["Stream 7", "Stream 7"]
    assert list(g["name"]) == ["CUDA graph 3", "CUDA graph 3"] and list(g["corr_id"]) == [5, 9]
    assert (g["graph_id"] == 3).all()


def test_graph_level_capture_switches_kinds_per_token() -> None:
    from workbench.trace.cupti import CuptiCapture

    node = CuptiCapture()
    assert node._kinds_for(detail=False) == list(CuptiCapture.KINDS) and not node.needs_fresh_graphs
    cap = CuptiCapture(graph_trace="graph", node_tokens=[6, 7])
    graph_kinds = cap._kinds_for(detail=False)
    assert "GRAPH_TRACE" in graph_kinds and "CONCURRENT_KERNEL" not in graph_kinds
    assert {"RUNTIME", "DRIVER", "MEMCPY", "SYNCHRONIZATION"} <= set(graph_kinds)
    # node tokens: per-kernel records, and GRAPH_TRACE off (with it on, graph nodes give no kernels)
    assert cap._kinds_for(detail=True) == list(CuptiCapture.KINDS)
    assert cap.needs_fresh_graphs and cap.meta["node_tokens"] == [6, 7]
    assert not node.before_token(0)  # node-level captures never switch
    with pytest.raises(ValueError, match="'node'.*'graph'"):
        CuptiCapture(graph_trace="nodes")


def _enum_names(enum: str, value: int) -> str:
    """Stands in for CUPTI's enums: the value is the index in a short table per enum."""
    table = {"ActivityKind": ["CONCURRENT_KERNEL", "RUNTIME", "MEMCPY", "SYNCHRONIZATION", "NAME"],
             "ActivityMemcpyKind": ["HTOD", "DTOH"], "ActivityMemoryKind": ["PAGEABLE", "PINNED", "DEVICE"],
             "ActivitySynchronizationType": ["STREAM_SYNCHRONIZE"], "RUNTIME": ["cudaGraphLaunch_v10000"]}
    return table[enum][value]


def test_activity_objects_become_plain_records_without_cupti() -> None:
    from types import SimpleNamespace as A

    common = dict(start=10, end=20, correlation_id=4, stream_id=7, device_id=0, graph_id=0)
    k = activity_to_record(A(kind=0, name="rms_norm", graph_node_id=2, grid_x=4, grid_y=1, grid_z=1, block_x=256,
                             block_y=1, block_z=1, **common), _enum_names)
    assert k["src"] == "kernel" and k["grid"] == (4, 1, 1) and k["corr"] == 4 and k["stream"] == 7
    api = activity_to_record(A(kind=1, cbid=0, thread_id=3, process_id=9, start=1, end=2, correlation_id=4),
                             _enum_names)
    assert api == dict(src="runtime", start=1, end=2, corr=4, name="cudaGraphLaunch_v10000", tid=3, pid=9)
    d2h = activity_to_record(A(kind=2, copy_kind=1, src_kind=2, dst_kind=1, bytes=64, **common), _enum_names)
    assert d2h["copy_kind"] == "D2H" and d2h["name"] == "[CUDA memcpy Device-to-Host] (Pinned)"
    sync = activity_to_record(A(kind=3, type=0, start=1, end=2, correlation_id=5, stream_id=7), _enum_names)
    assert sync["src"] == "sync" and sync["name"] == "Stream Synchronize"
    assert activity_to_record(A(kind=4), _enum_names) is None  # a kind the trace does not keep


@pytest.mark.parametrize("module", ["workbench.trace.chrome", "workbench.trace.nsys", "workbench.trace.cupti_records"])
def test_trace_readers_import_without_cupti_python(module: str, monkeypatch) -> None:
    """The file readers and the record conversion must work where cupti-python is missing: they
    take CUDA names from ``cupti_names``, never from the live-capture module."""
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "cupti", None)  # `import cupti` now raises ImportError
    for name in (module, "workbench.trace.cupti"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module(module)
    assert "workbench.trace.cupti" not in sys.modules, f"{module} imports the live CUPTI capture"
