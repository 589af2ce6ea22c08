"""The workbench's own fusions (strategy/fusion_ours.py), norm-mat-vec and qkv-rope-store, each
alone and with the rest: the nodes each removes per tiny preset, exact reference logits against
the plain Plan, kernels bound for every fused node, race-free Plans, a seeded broken schedule of
each flagged (tests/test_fusion_set.py runs the seeded bugs of every fusion), and the simulator's
cost of the fused kernels against the nodes they replace.

Logit tolerance: exact equality, as for llama.cpp's set: the NumPy twins compute rms_norm then
the weight product then the mat-vec, and the rotation then the row store, as the nodes they
replace did (the cuda kernels' own tolerance is in tests/gpu/test_cuda_fused.py).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from workbench.exec import cuda_ops
from workbench.exec.calibration import load_calibration
from workbench.exec.cost import FUSED_BASE, STAGED_OPS, WORKBENCH_ONLY_KERNELS, kernel_cost, kernel_name, measured_fit
from workbench.exec.reference import run_reference
from workbench.models import TINY_PRESETS, build_graph, preset
from workbench.models.weights import random_weights
from workbench.strategy import ALL_ON, ALL_ON_OURS, FUSIONS, WORKBENCH_FUSIONS, Strategy
from workbench.strategy.compile import compile_plan
from workbench.strategy.fusion import apply_fusions
from workbench.strategy.fusion_chains import FUSED_OPS
from workbench.verify import verify

OURS = ("norm-mat-vec", "qkv-rope-store")
#: preset -> fusion -> nodes removed, alone. Two layers each (qwen3-next-tiny: 1 attention layer).
#: norm-mat-vec: RMS_NORM + MUL of every norm whose readers are all plain mat-vecs: attn_norm (Q, K,
#: V), ffn_norm (gate, up) of dense FFNs and result_norm (lm_head); an MoE FFN's norm also feeds
#: MUL_MAT_IDs and qwen3-next's linear-attention norm its fused q/k/v/z tensors (still MUL_MATs);
#: gpt-oss's biased projections read their norm through ADDs (not folded: only the lm_head's).
#: qkv-rope-store: per attention layer Q, K, V, RoPE(Q), RoPE(K), the K store (the V store keeps
#: the name) = 6, only where nothing sits between a projection and its RoPE/store (llama);
#: Qwen3's q/k norm (qwen3-next's gated q with it) keeps it off; gpt-oss's biased projections fuse
#: once mul-mat-add has made them MUL_MAT_ADD (test_gpt_oss_biased_projections_fuse_with_mul_mat_add).
EXPECTED = {
    "llama-tiny": {"norm-mat-vec": 10, "qkv-rope-store": 12},
    "qwen3-tiny": {"norm-mat-vec": 10, "qkv-rope-store": 0},
    "qwen3-moe-tiny": {"norm-mat-vec": 6, "qkv-rope-store": 0},
    "gpt-oss-tiny": {"norm-mat-vec": 6, "qkv-rope-store": 0},
    "qwen3-next-tiny": {"norm-mat-vec": 10, "qkv-rope-store": 0},
}
CASES = [(m, f) for m in TINY_PRESETS for f in OURS if EXPECTED[m][f]]
OURS_OPS = ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_GLU", "QKV_ROPE_SET_ROWS")
#: norm-mat-vec's form before quantised mat-vecs: the norm kernel writing q8_1
OURS_Q8_1_OPS = ("RMS_NORM_MUL_Q8_1",)


def test_declared_once_everywhere():
    assert tuple(WORKBENCH_FUSIONS) == OURS and set(OURS) <= set(FUSIONS)
    assert not set(OURS) & ALL_ON.fusion and ALL_ON_OURS.fusion == frozenset(FUSIONS)
    ours = {op for op, f in FUSED_OPS.items() if f in OURS}
    assert ours == {*OURS_OPS, *OURS_Q8_1_OPS} == set(WORKBENCH_ONLY_KERNELS)
    assert all(FUSED_BASE[op][0] == "MUL_MAT" for op in OURS_OPS) and set(STAGED_OPS) == set(OURS_OPS)
    assert all(FUSED_BASE[op][0] == "RMS_NORM" for op in OURS_Q8_1_OPS)


@pytest.mark.parametrize("model", TINY_PRESETS)
@pytest.mark.parametrize("fusion", OURS)
def test_rewrite_count(model, fusion):
    g = build_graph(preset(model))
    fused, removed = apply_fusions(g, {fusion})
    assert len(removed) == EXPECTED[model][fusion]
    assert len(fused.nodes) == len(g.nodes) - len(removed)
    assert {n.name for n in fused.nodes} == {n.name for n in g.nodes} - set(removed)
    again, more = apply_fusions(fused, {fusion})
    assert more == [] and len(again.nodes) == len(fused.nodes)


def test_llama_layer_is_five_kernels_with_everything_on():
    """[norm + QKV + rope + store], attention, o + add, [norm + gate/up GLU], down + add."""
    g = build_graph(preset("llama-tiny"))
    fused, _ = apply_fusions(g, FUSIONS)
    layer = [n.op for n in fused.nodes if n.name.endswith("-0")]
    assert layer == ["QKV_ROPE_SET_ROWS", "FLASH_ATTN_EXT", "MUL_MAT_ADD", "RMS_NORM_MUL_MAT_GLU", "MUL_MAT_ADD"]
    qkv = fused.node("v_cache_store-0")
    assert len(qkv.srcs) == 8 and "eps" in qkv.params  # the attention norm folded in too
    assert fused.node("result_output").op == "RMS_NORM_MUL_MAT"


def test_gpt_oss_biased_projections_fuse_with_mul_mat_add():
    """gpt-oss's q/k/v carry biases: after mul-mat-add (MUL_MAT_ADD of the bias) the Q/K/V kernel
    takes them as sources 7..9 and adds them before the rotation; logits stay exact."""
    cfg = preset("gpt-oss-tiny", context=16)
    g = build_graph(cfg)
    base_fused, base_removed = apply_fusions(g, {"mul-mat-add"})
    fused, removed = apply_fusions(g, {"mul-mat-add", "qkv-rope-store"})
    assert len(removed) - len(base_removed) == 12  # per layer Q, K, V, RoPE(Q), RoPE(K), the K store
    qkv = [n for n in fused.nodes if n.op == "QKV_ROPE_SET_ROWS"]
    assert len(qkv) == 2 and all(n.params["bias"] and len(n.srcs) == 10 for n in qkv)
    assert all(s.buffer.kind == "weight" and s.buffer.name.endswith("_proj.bias") for s in qkv[0].srcs[7:10])
    weights = random_weights(g, 0)
    base = run_reference(cfg, weights, [5, 8, 13]).logits
    for fusions in ({"mul-mat-add", "qkv-rope-store"}, set(FUSIONS)):
        s = Strategy(fusion=frozenset(fusions))
        got = run_reference(cfg, weights, [5, 8, 13],
                            graph_for=lambda pos, s=s: compile_plan(build_graph(cfg, pos=pos), s).graph).logits
        np.testing.assert_array_equal(got, base, err_msg=str(sorted(fusions)))
    normed = next(n for n in apply_fusions(g, FUSIONS)[0].nodes if n.op == "QKV_ROPE_SET_ROWS")
    assert len(normed.srcs) == 11 and "eps" in normed.params  # + the attention norm, last


@pytest.mark.parametrize("model", TINY_PRESETS)
def test_quantised_mat_vecs_share_one_normed_q8_1_copy(model):
    """Before quantised mat-vecs norm-mat-vec folds the norm into their q8_1 copy: each norm read
    only by QUANTIZE_Q8_1 nodes becomes one RMS_NORM_MUL_Q8_1 whose blocks every one of those
    mat-vecs reads (the Q/K/V norm: 1 kernel for 4); qkv-rope-store leaves them alone. The
    logits stay bit for bit (the reference quantises the same float32 values) and --streams
    qkv still forks after the fused norm."""
    cfg = preset(model, context=16, weight_dtype="q8_0")
    g = build_graph(cfg)
    assert apply_fusions(g, {"qkv-rope-store"})[1] == []
    fused, removed = apply_fusions(g, {"norm-mat-vec"})
    norms = [n for n in fused.nodes if n.op == "RMS_NORM_MUL_Q8_1"]
    attn_q = [n for n in g.nodes if n.op == "FLASH_ATTN_EXT"]
    assert len(norms) >= len(attn_q) + 1  # every attention norm and the output norm at least
    for n in norms:
        readers = [r for r in fused.nodes if any(s.overlaps(n.dst) for s in r.srcs)]
        assert readers and all(r.op in ("MUL_MAT", "MUL_MAT_ID") and r.srcs[0].dtype == "q8_0" for r in readers)
    qkv = [n for n in norms if sum(any(s.overlaps(n.dst) for s in r.srcs) for r in fused.nodes) == 3]
    assert qkv, "no Q/K/V norm shares its copy"
    gone = sum(n.op == "QUANTIZE_Q8_1" for n in g.nodes) - sum(n.op == "QUANTIZE_Q8_1" for n in fused.nodes)
    assert gone == len(removed) - sum(len(n.params["fused"]) for n in norms) + len(norms)
    weights = random_weights(g, 0)
    base = run_reference(cfg, weights, [3, 17]).logits
    s = Strategy(fusion=frozenset({"norm-mat-vec"}), streams="qkv", allocator="stream-aware")
    got = run_reference(cfg, weights, [3, 17],
                        graph_for=lambda pos: compile_plan(build_graph(cfg, pos=pos), s).graph).logits
    np.testing.assert_array_equal(got, base)
    plan = compile_plan(g, s)
    assert plan.n_streams == 3 and verify(plan).race_free


@pytest.mark.parametrize("model", TINY_PRESETS)
def test_both_with_llamacpps_set_keep_the_reference_logits(model):
    cfg = preset(model, context=16)
    weights = random_weights(build_graph(cfg), 0)
    base = run_reference(cfg, weights, [5, 8, 13]).logits
    for fusions in (frozenset(OURS), frozenset(FUSIONS)):
        s = Strategy(fusion=fusions)
        got = run_reference(cfg, weights, [5, 8, 13],
                            graph_for=lambda pos, s=s: compile_plan(build_graph(cfg, pos=pos), s).graph).logits
        np.testing.assert_array_equal(got, base, err_msg=f"{model} {sorted(fusions)}")


@pytest.mark.parametrize("model", TINY_PRESETS)
def test_fused_plans_are_race_free_and_bind(model):
    g = build_graph(preset(model))
    for fusions in (*(frozenset({f}) for f in OURS), frozenset(FUSIONS)):
        for s in (Strategy(fusion=fusions),
                  Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware", sync="implicit",
                           fusion=fusions),
                  Strategy(streams="auto", max_streams=4, allocator="stream-aware", pdl=True,
                           pdl_trigger="after-main-loop", fusion=fusions)):
            plan = compile_plan(g, s)
            report = verify(plan)
            assert report.race_free, f"{model} {s.label()}:\n{report.text(limit=3)}"
            for n in plan.graph.nodes:
                if n.op in OURS_OPS:
                    call = cuda_ops.bind(n, lambda v: v.offset, lambda key, size: 0)
                    assert call.source == "fused_mat_vec" and call.writes == n.outs
                    assert call.name.removesuffix(FUSED_BASE[n.op][1]).startswith("k_mul_mat_vec_")


def test_qkv_streams_still_fork_on_the_folded_norm():
    """norm-mat-vec removes the norm after which --streams qkv forked: the Q, K and V mat-vecs
    now fork off the norm's input, each recomputing the norm."""
    g = build_graph(preset("qwen3-tiny"))
    plan = compile_plan(g, Strategy(streams="qkv", allocator="stream-aware", fusion=frozenset({"norm-mat-vec"})))
    streams = {la.node.name: la.stream for la in plan.launches}
    assert plan.n_streams == 3 and len({streams[f"{r}cur-0"] for r in "QKV"}) == 3
    assert verify(plan).race_free


def test_full_size_llama_binds_the_fused_kernels():
    """llama-3.2-1b (f16) at full size: every fused node binds to its vector kernel; the grid is
    at most FMV_MAX_BLOCKS, and covers every row (pair) once per round."""
    g = build_graph(preset("llama-3.2-1b", layers=1), 512)
    fused, _ = apply_fusions(g, FUSIONS)
    names = {}
    for n in fused.nodes:
        if n.op in OURS_OPS:
            call = cuda_ops.bind(n, lambda v: v.offset, lambda key, size: 0)
            names[n.name] = call.name
            assert 1 <= call.grid[0] <= cuda_ops.FMV_MAX_BLOCKS
    assert names == {"v_cache_store-0": "k_mul_mat_vec_f16_qkv_rope", "ffn_swiglu-0": "k_mul_mat_vec_f16_glu_norm",
                     "result_output": "k_mul_mat_vec_rows_deep_f16_norm"}  # cuda_ops.HEAD_DEEP_RING


def test_fused_splits_follow_the_whole_step_measurements():
    """Warps per item of the fused mat-vecs (data/bench/grid_ab_h200.md): a lane holds at most 8
    vectors of a row with the fewest warps, so gate/up rows of 256 vectors (llama-3.2-1b) and
    Qwen3-30B-A3B's 256-vector K/V/router rows take one warp, rows of 512 (llama-3.1-8b, Qwen3-8B)
    two, longer rows four. Q/K/V rotation pairs take the most warps whose grid fits one round:
    two at llama-3.2-1b's 1536 pairs, one at gpt-oss-20b's 2560 and llama-3.1-8b's 3072."""
    assert cuda_ops.fused_splits(8192, 256) == cuda_ops.fused_splits(512, 256) == 1
    assert cuda_ops.fused_splits(14336, 512) == cuda_ops.fused_splits(12288, 512) == 2
    assert cuda_ops.fused_splits(1024, 2048) == 4 and cuda_ops.fused_splits(1, 8) == 1
    assert cuda_ops.qkv_splits(1536, 256) == 2
    assert cuda_ops.qkv_splits(2560, 360) == cuda_ops.qkv_splits(3072, 512) == 1
    one_round = cuda_ops.FMV_MAX_BLOCKS * cuda_ops.MMV_WARPS
    assert cuda_ops.qkv_splits(one_round // 4, 64) == 4 and cuda_ops.qkv_splits(4 * one_round, 512) == 1


@pytest.mark.parametrize("own_fits", [True, False], ids=["fused-kernels-measured", "base-kernel-fits"])
def test_simulator_costs_the_fused_kernels_below_their_parts(own_fits: bool):
    """Each fused node takes its own kernel's fit where the calibration measured it (its fused
    run), else the block mat-vec's (its kernel without the fusion's suffix) plus the staging
    prologue; either way it costs less than the nodes it replaced: one fixed part instead of up
    to seven, the intermediates never written and re-read."""
    cal = load_calibration("h200")
    if not own_fits:
        # the base fits at scale >= 1: a fit that scales the roofline down gives back a saving
        # that grows with the kernel's bytes (the conservation rule, tested in test_physics),
        # which would hide the staging prologue compared below
        cal = replace(cal, ops={k: replace(v, work_scale=max(1.0, v.work_scale)) for k, v in cal.ops.items()
                                if k.split("/")[0] not in FUSED_BASE})
    g = build_graph(preset("llama-3.2-1b", layers=1), 512)
    by_name = {n.name: n for n in g.nodes}
    for fusions in ({"norm-mat-vec"}, {"qkv-rope-store"}, set(OURS)):
        fused, removed = apply_fusions(g, fusions)
        new = [n for n in fused.nodes if n.op in OURS_OPS]
        assert new and all(kernel_name(n) == WORKBENCH_ONLY_KERNELS[n.op] for n in new)
        # measured on its own kernel, or MUL_MAT/k_mul_mat_vec_f16
        assert all(measured_fit(n, cal)[0] == ("fused op" if own_fits else "op/kernel") for n in new)
        before = sum(kernel_cost(by_name[r], cal).duration_ns for r in removed)
        before += sum(kernel_cost(by_name[n.name], cal).duration_ns for n in new)
        after = sum(kernel_cost(n, cal).duration_ns for n in new)
        assert after < before, fusions
        for n in new:
            c = kernel_cost(n, cal)
            plain = kernel_cost(by_name[n.name], cal) if n.op == "RMS_NORM_MUL_MAT" else None
            if plain is not None and not own_fits:  # the same mat-vec, its norm folded: the prologue more
                assert c.fixed_ns - plain.fixed_ns == pytest.approx(cal.dram_latency_ns, abs=1.0)
