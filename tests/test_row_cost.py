"""The per-row mat-vec term of a kernel fit (``FamilyCost.row_ns``): ``fit_row_kernels``
recovers it, and a fit without it costs what ``fixed + scale x roofline`` always did."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from workbench.exec.calibrate.kernel_fit import fit_groups, fit_row_kernels
from workbench.exec.calibrate.llamacpp_traces import device_calibration
from workbench.exec.calibration import CALIBRATION_DIR, FamilyCost, load_calibration
from workbench.exec.cost import kernel_cost, mat_vec_rows
from workbench.models import preset
from workbench.strategy import Strategy
from workbench.strategy.steps import plan_for

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "traces" / "llamacpp"


def test_fit_recovers_a_synthetic_row_term():
    """Mat-vecs of three row widths: rows and bytes are not proportional, so both slopes show."""
    rng = np.random.default_rng(0)
    rows = np.repeat([512, 2048, 4096, 8192, 128256], 20).astype(float)
    width = np.tile([2048, 4096, 14336, 2048, 4096], 20)[: len(rows)]
    roofline = rows * width * 2 / 4800.0                   # bf16 bytes at 4.8 TB/s, in ns
    d = 2000.0 + 0.9 * rows + 0.6 * roofline
    f = fit_row_kernels(d * (1 + 0.001 * rng.standard_normal(len(d))), roofline, rows, min_fixed=1000.0)
    assert f.row_ns == pytest.approx(0.9, rel=0.02)
    assert f.work_scale == pytest.approx(0.6, rel=0.02)
    assert f.fixed_ns == pytest.approx(2000.0, rel=0.05)


def test_no_row_term_where_rows_and_bytes_are_proportional():
    """One row width: the row term cannot be told from the roofline's, so none is fitted."""
    import pandas as pd

    rows = np.array([512, 2048, 4096, 8192], float)
    roofline = rows * 2048 * 2 / 4800.0
    kern = pd.DataFrame({"op": "MUL_MAT", "rows": rows, "roofline_ns": roofline, "duration_ns": 1500 + 1.2 * roofline})
    fits, _ = fit_groups(kern, "op", "op", 3, 0.0, "synthetic")
    assert "row_ns" not in fits["MUL_MAT"][0]


def _mat_vec():
    cfg = preset("llama-3.2-1b", layers=1, context=512)
    plan = plan_for(cfg, Strategy(), cfg.kv_len(100))
    return next(la.node for la in plan.launches if la.node.op == "MUL_MAT")


def test_absent_row_term_is_the_old_cost_and_a_present_one_adds_per_row():
    node = _mat_vec()
    cal = device_calibration(load_calibration("h200-llamacpp"))
    plain = kernel_cost(node, cal)
    roof = plain.work_ns / plain.cap
    old = dataclasses.replace(cal, ops={"MUL_MAT": FamilyCost(fixed_ns=3000.0, work_scale=1.2)})
    c = kernel_cost(node, old)
    assert c.fixed_ns + c.work_ns / c.cap == pytest.approx(3000.0 + 1.2 * roof)
    assert c.fixed_ns == pytest.approx(3000.0)                        # all of it fixed, as before
    rows = mat_vec_rows(node, cal.sm_count)
    assert rows > 0
    new = dataclasses.replace(cal, ops={"MUL_MAT": FamilyCost(fixed_ns=3000.0, work_scale=0.7, row_ns=0.8)})
    c = kernel_cost(node, new)
    assert c.duration_ns == pytest.approx(3000.0 + 0.8 * rows + 0.7 * roof)
    assert c.cap == pytest.approx(plain.cap)                           # the row tails work at the kernel's cap


def _node(model: str, name: str):
    cfg = preset(model, context=512)
    plan = plan_for(cfg, Strategy(), cfg.kv_len(448))
    return next(la.node for la in plan.launches if la.node.name == name)


def test_top_k_steps_charge_the_cuda_executors_selection_only():
    """A router's top-k on the cuda executor is one warp's serial chain: k rounds of n / 32
    entries a lane and 5 shuffles, the units its fit's per-unit term charges (Qwen3-30B-A3B: 8 of
    128 experts, 8 x (4 + 5)); on llama.cpp the same op is its bitonic argsort, charged per sort
    stage (``bitonic_stages``: 7 x 8 / 2 for 128 columns)."""
    from workbench.exec.cost import serial_units, top_k_steps

    node = _node("qwen3-30b-a3b", "ffn_moe_topk-0")
    assert node.op == "ARGSORT_TOP_K" and top_k_steps(node) == 8 * (4 + 5)
    cal = load_calibration("h200")
    assert serial_units(node, cal) == 72
    assert serial_units(node, dataclasses.replace(cal, executor="llamacpp")) == 28
    mv = _node("qwen3-30b-a3b", "ffn_moe_down-0")
    assert serial_units(mv, cal) == mat_vec_rows(mv, cal.sm_count) > 0
    # the per-step term is what separates a 4-of-32 router from a 10-of-512 one
    fc = cal.ops["ARGSORT_TOP_K"]
    assert fc.row_ns > 0 and kernel_cost(node, cal).duration_ns > fc.fixed_ns + 60 * fc.row_ns


def test_bitonic_stages_follow_the_padded_row():
    """32, 128 and 512 experts (gpt-oss-20b, Qwen3-30B-A3B, Qwen3-Next): 15, 28 and 45 stages; a
    row that is not a power of two sorts padded to the next one."""
    from workbench.exec.cost import bitonic_stages

    for model, stages in (("gpt-oss-20b", 15), ("qwen3-30b-a3b", 28), ("qwen3-next-80b-a3b", 45)):
        node = _node(model, "ffn_moe_topk-0")
        assert node.op == "ARGSORT_TOP_K" and bitonic_stages(node) == stages, model
    node = _node("qwen3-30b-a3b", "ffn_moe_topk-0")
    odd = dataclasses.replace(node, srcs=(dataclasses.replace(node.srcs[0], shape=(*node.srcs[0].shape[:-1], 100)),
                                          *node.srcs[1:]))
    assert bitonic_stages(odd) == 28


def test_a_serial_fit_of_one_step_count_scales_with_the_steps():
    """Sort kernels of one width: a serial fit is proportional to the stages above the fixed
    floor (another width costs its stages), a mat-vec's fit of one row count keeps no row term."""
    d = np.full(8, 8200.0)
    f = fit_row_kernels(d, np.zeros(8), np.full(8, 28.0), min_fixed=500.0, serial=True)
    assert f.fixed_ns == 500.0 and f.row_ns == pytest.approx(7700.0 / 28)
    assert f.fixed_ns + 45 * f.row_ns == pytest.approx(500 + 7700 * 45 / 28)
    assert fit_row_kernels(d, np.zeros(8), np.full(8, 28.0), min_fixed=500.0).row_ns == 0.0


def test_llamacpp_argsort_extrapolates_to_qwen3_next_experts():
    """The shipped H100 llama.cpp fit sees llama.cpp's argsort at one width (gpt-oss-20b's 32
    experts, its no-PDL captures); charged per sort stage it predicts Qwen3-Next's 512-expert
    argsort, which it never saw, within 10 % of the H100 capture's median (14.2 us), where a
    fit by bytes charges the 32-expert time (5.5 us)."""
    from pathlib import Path

    from workbench.exec.calibrate.llamacpp_traces import read_traces

    root = Path(__file__).resolve().parents[1] / "data" / "traces" / "llamacpp" / "h100_captures"
    (t,) = [t for t in read_traces(root) if t.name == "qwen3-next-80b-a3b-L8_no_fusion"]
    k = t.trace.events
    k = k[(k["kind"] == "kernel") & (k["token"] >= 1) & k["name"].str.contains("argsort")]
    measured = float((k["end_ns"] - k["start_ns"]).median())
    cal = load_calibration("h100-llamacpp")
    node = _node("qwen3-next-80b-a3b", "ffn_moe_topk-0")
    assert kernel_cost(node, cal).duration_ns == pytest.approx(measured, rel=0.10)


def test_kernel_geometry_follows_the_grids_a_file_was_fitted_on():
    """A calibration fitted on the executor's grids prices a kernel on cuda_ops.bind's grid
    (decode attention: 32 heads x 8 blocks a head in clusters), one fitted before it on
    llama.cpp's (launch_geometry), and a llama.cpp calibration always on llama.cpp's: its
    attention split as launch_fattn splits it (fattn_vec_geometry: 4 blocks a head at 512 keys)."""
    from math import prod

    from workbench.exec.cost import executor_call, fattn_vec_geometry, kernel_geometry, launch_geometry

    node = _node("llama-3.1-8b", "kqv_out-0")
    cal = load_calibration("h200")
    assert cal.grids == "executor"
    call = executor_call(node)
    assert kernel_geometry(node, cal) == (prod(call.grid), prod(call.block)) == (32 * 8, 128)
    older = dataclasses.replace(cal, grids="llamacpp")
    assert kernel_geometry(node, older) == launch_geometry(node, cal.sm_count) != kernel_geometry(node, cal)
    llamacpp = dataclasses.replace(cal, executor="llamacpp")
    assert kernel_geometry(node, llamacpp) == fattn_vec_geometry(node, cal.sm_count)[:2] == (32 * 4, 128)
    mat_vec = _node("llama-3.1-8b", "ffn_up-0")
    assert kernel_geometry(mat_vec, llamacpp) == launch_geometry(mat_vec, cal.sm_count) == (14336, 256)
    assert load_calibration("h100").grids == "llamacpp"  # fitted 2026-11-27, before the executor's grids


def test_add_id_takes_ggmls_grid():
    """gpt-oss's expert bias (ADD_ID) runs add_id_kernel: a block per selected expert's row of
    min(columns, 768) threads (ggml-cuda/add-id.cu), 4 blocks of 768 at one token, not the
    element-wise kernels' 256-thread blocks over every element. Its 3072 lanes loop over the row,
    so by Little's law it reaches about a quarter of the bandwidth share the 11520 lanes of an
    element-wise grid would."""
    from workbench.exec.cost import kernel_geometry, launch_geometry

    node = _node("gpt-oss-20b", "ffn_moe_down_biased-0")
    cal = load_calibration("h200")
    assert launch_geometry(node, cal.sm_count) == (4, 768)
    llamacpp = dataclasses.replace(cal, executor="llamacpp")
    assert kernel_geometry(node, llamacpp) == (4, 768)
    element_wise = dataclasses.replace(node, op="ADD")  # the same bytes over ggml's element-wise grid
    assert launch_geometry(element_wise, cal.sm_count) == (45, 256)
    assert kernel_cost(node, llamacpp).cap < 0.5 * kernel_cost(element_wise, llamacpp).cap


def test_an_unknown_grids_value_is_refused():
    import json

    from workbench.exec.calibration import CALIBRATION_DIR, CalibrationError, parse_calibration

    data = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    data["grids"] = "warp"
    with pytest.raises(CalibrationError, match="unknown grids 'warp'"):
        parse_calibration(data, "h200.json")


def test_llamacpp_expert_matmul_runs_a_block_per_expert_and_row_block():
    """llama.cpp runs an unfused float MUL_MAT_ID as ``mul_mat_f`` over every expert's 32-row
    blocks (the unused experts' blocks exit), with the warps mul_mat_f_cuda picks for the row's
    columns; its fit charges the grid's waves over the SMs. A quantized expert matrix stays a
    mat-vec, and the cuda executor's mat-vec keeps its rows."""
    from workbench.exec.cost import kernel_geometry, kernel_name, mmf_ids_geometry, serial_units

    cal = load_calibration("h200")
    lcal = load_calibration("h200-llamacpp")
    for model, name, grid in (("qwen3-next-80b-a3b", "ffn_moe_gate-0", (512 * 16, 256)),   # 512 x 2048 -> 512
                              ("qwen3-next-80b-a3b", "ffn_moe_down-0", (512 * 64, 256)),   # 8 warps, 1 pass of 512
                              ("qwen3-30b-a3b", "ffn_moe_down-0", (128 * 64, 192)),        # 768 columns: 6 warps
                              ("gpt-oss-20b", "ffn_moe_up-0", (32 * 90, 256))):
        node = _node(model, name)
        assert node.op == "MUL_MAT_ID" and kernel_name(node) == "mul_mat_f<ids>"
        assert mmf_ids_geometry(node) == grid == kernel_geometry(node, lcal), (model, name)
        assert serial_units(node, lcal) == -(-grid[0] // lcal.sm_count)
        assert serial_units(node, cal) == mat_vec_rows(node, cal.sm_count)
    assert mmf_ids_geometry(_node("qwen3-30b-a3b", "ffn_moe_topk-0")) is None


def test_llamacpp_expert_matmul_follows_its_expert_count():
    """On the H200 captures Qwen3-Next's expert mat-muls (512 experts) take longer than
    Qwen3-30B-A3B's (128) though they move fewer bytes. The shipped fit, charged per wave of the
    grid, orders them so (a fit per selected row, before, priced Qwen3-30B-A3B's the slower) and
    predicts each model's gate and down medians (graphs, no PDL) within 15 %: Qwen3-Next's gate is
    its worst, about 14 % fast, where which experts a token picks moves a kernel by 3 us."""
    from workbench.exec.calibrate.llamacpp_traces import read_traces

    root = CAPTURES / "h200_captures"
    cal = load_calibration("h200-llamacpp")
    cupti = json.loads((CALIBRATION_DIR / "h200-llamacpp.json").read_text())["measured"]["cupti_kernel_ns"]
    got, pred = {}, {}
    for t in read_traces(root):
        if t.name not in ("qwen3-30b-a3b-L8_graphs", "qwen3-next-80b-a3b-L8_graphs"):
            continue
        k = t.trace.events
        k = k[(k["kind"] == "kernel") & (k["token"] >= 1) & k["name"].str.contains("mul_mat_f")].sort_values("start_ns")
        d = (k["end_ns"] - k["start_ns"]).to_numpy().reshape(-1, 3)  # gate, up, down per layer
        for i, name in ((0, "ffn_moe_gate-0"), (2, "ffn_moe_down-0")):
            measured = float(np.median(d[:, i])) - cupti
            got[(t.model, name)] = measured
            pred[(t.model, name)] = kernel_cost(_node(t.model, name), cal).duration_ns
            assert pred[(t.model, name)] == pytest.approx(measured, rel=0.15), (t.model, name)
    for d in (got, pred):
        assert d[("qwen3-next-80b-a3b", "ffn_moe_gate-0")] > d[("qwen3-30b-a3b", "ffn_moe_gate-0")]
        assert d[("qwen3-next-80b-a3b", "ffn_moe_down-0")] > d[("qwen3-30b-a3b", "ffn_moe_down-0")]


def test_mul_mat_vec_f_rounds_follow_its_unrolled_column_loop():
    """ggml's mul_mat_vec_f picks 256 threads for these rows (the fewest iterations, two columns
    a lane) and nvcc unrolls the column loop by 4 after a one-load-at-a-time remainder (its SASS
    in the sm_90 build): a lane of a 2880-wide row waits 3 round trips, of a 4096-wide row 2."""
    from workbench.exec.cost import mmvf_block, mmvf_rounds

    assert [mmvf_block(c) for c in (512, 768, 2048, 2880, 14336)] == [256, 192, 256, 256, 256]
    assert {c: mmvf_rounds(c, 256) for c in (1024, 2048, 2880, 4096, 14336)} == \
        {1024: 2, 2048: 1, 2880: 3, 4096: 2, 14336: 7}


def test_llamacpp_mat_vec_keeps_fewer_bytes_in_flight_on_2880_wide_rows():
    """Little's law with the lanes' own depth: gpt-oss-20b's Q projection (4096 rows of 2880)
    keeps 7.5 B a lane in flight where llama-3.1-8b's (4096 of 4096) keeps 16, so a llama.cpp
    calibration caps its bandwidth lower; a cuda calibration keeps the device's probe depth."""
    from workbench.exec.cost import bytes_in_flight, kernel_cost, kernel_geometry

    lc, cuda = load_calibration("h200-llamacpp"), load_calibration("h200")
    q_oss, q_8b = _node("gpt-oss-20b", "Qcur-0"), _node("llama-3.1-8b", "Qcur-0")
    got = {m: bytes_in_flight(n, lc, *kernel_geometry(n, lc)) for m, n in (("oss", q_oss), ("8b", q_8b))}
    assert got["8b"] == pytest.approx(16.0, rel=0.01) and got["oss"] == pytest.approx(7.5, rel=0.01)
    assert bytes_in_flight(q_oss, cuda, 4096, 256) == cuda.bytes_in_flight_per_thread
    assert kernel_cost(q_oss, lc).cap < kernel_cost(q_8b, lc).cap


def test_llamacpp_attention_splits_keys_as_launch_fattn_does():
    """launch_fattn's parallel_blocks: the vec kernel's blocks an SM holds (4 at head size 64),
    raised until a wave is 95 % full; past that each block walks more key tiles in turn."""
    from workbench.exec.cost import fattn_vec_parallel

    assert fattn_vec_parallel(32, 512, 64, 132) == 8        # llama-3.2-1b: 256 blocks, a tile each
    assert fattn_vec_parallel(32, 32768, 64, 132) == 16     # 512 blocks (97 % of a wave), 32 tiles each
    assert fattn_vec_parallel(64, 32768, 64, 132) == 8      # gpt-oss-20b: 512 blocks, 64 tiles each
    assert fattn_vec_parallel(32, 32768, 128, 132) == 12    # llama-3.1-8b: 384 blocks (3 an SM)


@pytest.mark.parametrize("folder,model,op,bound", [
    # long-context captures (kernel fits only): attention over 8k and 32k keys
    ("h200_captures", "llama-3.2-1b", "FLASH_ATTN_EXT", 0.08),
    ("h200_captures", "llama-3.1-8b", "FLASH_ATTN_EXT", 0.08),
    # never fitted: Qwen3-8B's 4096- and 12288-wide rows (2 and 6 rounds a lane)
    ("h200_widths", "qwen3-8b", "MUL_MAT", 0.12),  # its lm_head +11.5 %, the rest within 8 %
])
def test_shipped_llamacpp_file_prices_captured_kernels(folder, model, op, bound):
    """Per kernel of a layer (Qcur, ffn_up, the attention's merge pass ...: every layer's and
    token's), the median captured time less CUPTI's per-kernel cost against the median the shipped
    H200 llama.cpp calibration prices: within ``bound``. The widths folder's captures (2026-11-29)
    stay out of every fit: a check of the mat-vec's load rounds on unseen rows."""
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.exec.calibrate.llamacpp_traces import matched_kernels, read_traces
    from workbench.exec.cost import kernel_cost

    cal = load_calibration("h200-llamacpp")
    cupti = json.loads((CALIBRATION_DIR / "h200-llamacpp.json").read_text())["measured"]["cupti_kernel_ns"]
    seen = 0
    for t in read_traces(CAPTURES / folder):
        if t.model != model or t.config_label != "graphs" or (folder == "h200_captures" and t.context == 512):
            continue
        m, _ = matched_kernels(t, cal)
        m = m[m["op"] == op]
        cfg = t.config()
        pred = {(tok, la.node.name): kernel_cost(la.node, cal).duration_ns for tok in m["token"].unique()
                for la in llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos + int(tok))).launches}
        m = m.assign(pred=[pred[k] for k in zip(m["token"], m["node"])],
                     kind=m["node"].str.replace(r"-\d+(?=$|_)", "", regex=True))  # kqv_out-3_combine: kqv_out_combine
        for kind, g in m.groupby("kind"):
            assert float(g["pred"].median()) == pytest.approx(float(g["exposed_ns"].median()) - cupti, rel=bound), \
                (t.name, kind)
            seen += 1
    assert seen
