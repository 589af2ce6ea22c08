"""HTA-style analyses: GPU idle gaps and their causes, syncs per token, launch overhead, kernel
overlap per stream, per-token critical path, kernel summary by family, speedup tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fixtures.synthetic import LATENCY_NS, LAUNCH_NS, SYNC_NS, synthetic_trace

from workbench.trace import Trace
from workbench.trace import analysis as A
from workbench.trace.stats import merged_intervals, summarize


@pytest.fixture(scope="module")
def eager() -> Trace:
    return synthetic_trace(3, 2, pdl=True)


@pytest.fixture(scope="module")
def graphs() -> Trace:
    return synthetic_trace(3, 2, pdl=True, graphs=True)


def test_idle_gaps_cover_all_idle_time_and_name_their_cause(eager: Trace, graphs: Trace) -> None:
    gaps = A.gpu_idle_gaps(eager)
    work = eager.events[eager.events["row"].str.startswith("Stream ")]
    busy = merged_intervals(work["start_ns"].to_numpy(), work["end_ns"].to_numpy())
    idle = (busy[1:, 0] - busy[:-1, 1]).sum()
    assert gaps["gap_us"].sum() * 1e3 == pytest.approx(idle)
    causes = set(gaps["cause"])
    # per-copy syncs, host work between tokens and eager launches slower than the kernels
    assert {"host sync", "token boundary", "launch overhead"} <= causes
    assert set(gaps.loc[gaps["cause"] == "token boundary", "after"]) == {"inp_tokens"}
    summary = A.idle_summary(gaps)
    assert summary["share"].sum() == pytest.approx(1.0)
    assert summary["idle_us"].sum() == pytest.approx(gaps["gap_us"].sum())
    # a graph launch issues a token's kernels at once: no launch overhead inside a token
    assert "launch overhead" not in set(A.gpu_idle_gaps(graphs)["cause"])
    fig = A.idle_figure(gaps)
    assert {t.name for t in fig.data} == causes


def test_sync_calls_per_token(eager: Trace, graphs: Trace) -> None:
    s = A.sync_calls_per_token(eager)
    assert s["token"].tolist() == [0, 1, 2]
    assert (s["sync_calls"] == 4).all() and (s["memcpy_calls"] == 4).all()   # 3 H2D + 1 D2H, each synced
    assert (s["launch_calls"] == 2 * 16 + 2).all()
    syncs = eager.events[eager.events["kind"] == "sync"]
    assert s["sync_us"].sum() == pytest.approx((syncs["end_ns"] - syncs["start_ns"]).sum() / 1e3)
    assert (s["sync_us"] >= 4 * SYNC_NS / 1e3).all()
    g = A.sync_calls_per_token(graphs)
    assert (g["launch_calls"] == 1).all()


def test_launch_overhead(eager: Trace, graphs: Trace) -> None:
    s = A.launch_overhead(eager).set_index("api")
    assert s.loc["cudaLaunchKernel", "launches"] == 3 * 34
    assert s.loc["cudaLaunchKernel", "call_us_mean"] == pytest.approx(LAUNCH_NS / 1e3)
    assert s.loc["cudaLaunchKernel", "delay_us_p50"] == pytest.approx(LATENCY_NS / 1e3)
    per = A.launch_overhead(eager, summary=False)
    assert (per["delay_us"] >= LATENCY_NS / 1e3 - 1e-9).all()
    g = A.launch_overhead(graphs).set_index("api")
    assert g.index.tolist() == ["cudaGraphLaunch"] and g.loc["cudaGraphLaunch", "launches"] == 3


def test_kernel_overlap_per_stream() -> None:
    pdl = A.kernel_overlap(synthetic_trace(2, 2, pdl=True)).set_index("stream")
    plain = A.kernel_overlap(synthetic_trace(2, 2, pdl=False)).set_index("stream")
    assert pdl.loc[7, "pdl_overlap_us"] > 0 and pdl.loc[7, "overlapped_kernels"] > 0
    assert (plain["pdl_overlap_us"] == 0).all() and (plain["overlapped_kernels"] == 0).all()
    assert plain.loc[13, "concurrent_us"] > 0 and plain.loc[14, "concurrent_us"] > 0   # K and V beside Q
    assert (pdl["busy_us"] <= pdl["kernel_us"] + 1e-9).all()
    assert plain.loc[13, "kernels"] == 2 * 2


@pytest.mark.parametrize("graph_mode", [False, True])
def test_critical_path_shares_add_up_to_each_token(graph_mode: bool) -> None:
    tr = synthetic_trace(3, 2, pdl=True, graphs=graph_mode)
    path = A.critical_path(tr)
    ev = tr.events[tr.events["kind"] != "marker"]
    span = ev.groupby("token").apply(lambda g: g["end_ns"].max() - g["start_ns"].min(), include_groups=False)
    total = path.groupby("token")["share_ns"].sum()
    pd.testing.assert_series_equal(total, span, check_names=False)
    last = path.sort_values("step").groupby("token").tail(1)
    assert (last["name"] == "cudaStreamSynchronize").all() and (last["edge"] == "sync").all()
    s = A.critical_path_summary(path).set_index("token")
    if graph_mode:
        assert (s["kernel_us"] > s["host_us"]).all()           # the GPU sets the pace
        assert "launch" in set(path["edge"])
    else:
        assert (s["host_us"] > s["kernel_us"]).all()          # eager launches set the pace
        assert {"host", "launch", "stream", "sync"} <= set(path["edge"])


def test_kernel_summary_by_family(eager: Trace) -> None:
    s = A.kernel_summary(eager)
    k = eager.events[eager.events["kind"] == "kernel"]
    assert s["kernels"].sum() == len(k)
    assert s["total_us"].sum() == pytest.approx((k["end_ns"] - k["start_ns"]).sum() / 1e3)
    assert s["share"].sum() == pytest.approx(1.0)
    assert s.iloc[0]["family"] == "mul_mat"
    assert set(s["family"]) == {"mul_mat", "norm", "rope", "set_rows", "attn", "elementwise"}
    with_col = Trace(eager.events.assign(family="custom"))
    assert A.kernel_summary(with_col)["family"].tolist() == ["custom"]


@pytest.mark.parametrize("name,family", [
    ("mul_mat_vec_q", "mul_mat"), ("MUL_MAT", "mul_mat"), ("ampere_sgemm_128x64_nn", "mul_mat"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(Params)", "mul_mat"),
    ("nvjet_tst_64x8_64x16_2x1_v_bz_TNT", "mul_mat"), ("flash_fwd_kernel", "attn"),
    ("flash_attn_ext_vec_f16<128, 4>", "attn"), ("rms_norm_f32<1024>", "norm"), ("rope_neox_f32", "rope"),
    ("soft_max_f32", "softmax"), ("k_set_rows", "set_rows"), ("k_get_rows_float", "get_rows"),
    ("cpy_f32_f16", "copy"), ("k_bin_bcast<op_mul>", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("gated_delta_net_f32", "gdn"), ("mystery_kernel", "other"),
])
def test_family_of_kernel_names(name: str, family: str) -> None:
    assert A.family_of(name) == family


def test_speedup_table_in_compare_llama_bench_format(eager: Trace, graphs: Trace) -> None:
    res = A.bench_results({"eager": eager, "graphs": graphs}, "llama 2L")
    assert res["test"].tolist() == ["tg3", "tg3"]
    assert res["t/s"].iloc[0] == pytest.approx(summarize(eager)["tokens_per_s"])
    tab = A.speedup_table(res, "eager")
    assert list(tab.columns) == ["Model", "Test", "t/s eager", "t/s graphs", "Speedup"]
    assert tab["Speedup"].iloc[0] == pytest.approx(res["t/s"].iloc[1] / res["t/s"].iloc[0])
    md = A.to_markdown(tab).splitlines()
    assert md[0].startswith("| Model") and md[1].startswith("|:") and md[1].endswith(":|")
    assert md[2].split("|")[-2].strip() == f"{tab['Speedup'].iloc[0]:.2f}"
    three = pd.concat([res, res.assign(config="graphs+pdl", **{"t/s": res["t/s"] * 2})])
    wide = A.speedup_table(three, "eager")
    assert {"Speedup graphs", "Speedup graphs+pdl"} <= set(wide.columns)
    with pytest.raises(ValueError, match="baseline 'cuda'"):
        A.speedup_table(res, "cuda")
    with pytest.raises(ValueError, match="missing"):
        A.speedup_table(res.drop(columns="t/s"), "eager")
    assert [t.name for t in A.speedup_figure(tab).data] == ["eager", "graphs"]


def test_analyses_of_a_simulated_run() -> None:
    import workbench
    from workbench.models import preset
    from workbench.strategy import Strategy

    runs = {name: workbench.run(preset("llama-tiny"), s, tokens=3, backend="sim", gpu="h100").trace for name, s in {
        "baseline": Strategy(), "graphs+pdl+qkv": Strategy(graphs=True, pdl=True, streams="qkv", sync="boundary")
    }.items()}
    for tr in runs.values():
        s = A.trace_summary(tr)
        assert s["linked_kernels"] == s["kernels"] > 0 and s["tokens"] == 3
        path = A.critical_path(tr, tokens=[1])
        ev = tr.events[(tr.events["token"] == 1) & (tr.events["kind"] != "marker")]
        assert path["share_ns"].sum() == ev["end_ns"].max() - ev["start_ns"].min()
        assert A.kernel_summary(tr).set_index("family").loc["mul_mat", "kernels"] > 0
        assert not A.gpu_idle_gaps(tr).empty
    opt = A.kernel_overlap(runs["graphs+pdl+qkv"])
    assert set(opt["stream"]) == {0, 1, 2} and opt["pdl_overlap_us"].max() > 0
    tab = A.speedup_table(A.bench_results(runs, "llama-tiny"), "baseline")
    assert tab["Speedup"].iloc[0] > 1.0
    assert np.isfinite(tab.iloc[0, 2:]).all()
