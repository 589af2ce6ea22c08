"""llama.cpp's fusion set as Strategy fusions (strategy/fusion_chains.py): each fusion alone, on
every tiny preset where it applies, rewrites the expected number of nodes, keeps the reference
logits, binds to its kernels and is race-free; a seeded broken schedule of each is flagged.

Logit tolerance: exact equality. Each fused op's NumPy twin does the float32 operations of the
nodes it replaces in the same order (the mat-vec, then the add; silu(gate) * up; the rotation,
then the row store; a left-to-right sum), so a fused Plan must reproduce the unfused logits bit
for bit; any difference is a wrong operand, order or index.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fusion_ours import CASES as OURS_CASES  # noqa: E402  (tests/ is on sys.path)

from workbench.exec import cuda_ops
from workbench.exec.calibration import load_calibration
from workbench.exec.cost import FUSED_BASE, KERNEL_NAMES, WORKBENCH_ONLY_KERNELS, kernel_cost
from workbench.exec.reference import run_reference
from workbench.graph import GraphBuilder
from workbench.graph.ops import OPS
from workbench.models import TINY_PRESETS, build_graph, preset
from workbench.models.weights import random_weights
from workbench.strategy import FUSIONS, WORKBENCH_FUSIONS, Strategy
from workbench.strategy.compile import compile_plan
from workbench.strategy.fusion import PASSES, apply_fusions
from workbench.strategy.fusion_chains import FUSED_OPS, MAX_ADD_OPERANDS
from workbench.verify import verify
from workbench.verify.seeded import SEEDED_BUGS
from workbench.verify.seeded_fusions import FUSION_GRAPHS, fused_plan, fusion_of
from workbench.verify.sweep import fusion_sets

NEW = ("mul-mat-add", "mul-mat-glu", "rope-set-rows", "add-chain", "topk-moe", "rms-norm-mul-rope",
       "moe-weighted-reduction")
OPS_OF = {f: {op for op, g in FUSED_OPS.items() if g == f} for f in set(FUSED_OPS.values())}

#: preset -> fusion -> nodes removed. Two layers each (qwen3-next-tiny: 3 gated-delta-net layers
#: and 1 attention layer, every FFN an MoE with a shared expert).
#: mul-mat-glu: gate and up of each SwiGLU FFN, dense (MUL_MAT) or MoE experts (MUL_MAT_ID; not
#: gpt-oss's, whose expert biases and swiglu_oai sit between);
#: mul-mat-add: attn_out and ffn_out into their residual ADDs, plus every projection bias (gpt-oss:
#: q, k, v, o and the router per layer; its o bias then feeds the residual, which add-chain takes);
#: rope-set-rows: K's ROPE of every attention layer (Q's goes to the attention, V has none);
#: add-chain: gpt-oss's (attn_out + bias) + residual, qwen3-next's routed + shared expert + residual;
#: topk-moe: per MoE layer SOFT_MAX, ARGSORT_TOP_K, GET_ROWS, SUM_ROWS (+ the DIV kept) with
#: Qwen3's gating, ARGSORT_TOP_K, GET_ROWS (+ the SOFT_MAX kept) with gpt-oss's;
#: rms-norm-mul-rope: RMS_NORM and MUL of the Q and K head norms of each Qwen3 attention layer;
#: moe-weighted-reduction: the MUL of the weighted experts of each MoE layer.
EXPECTED = {
    "llama-tiny": {"mul-mat-glu": 4, "mul-mat-add": 4, "rope-set-rows": 2, "add-chain": 0, "topk-moe": 0,
                   "rms-norm-mul-rope": 0, "moe-weighted-reduction": 0},
    "qwen3-tiny": {"mul-mat-glu": 4, "mul-mat-add": 4, "rope-set-rows": 2, "add-chain": 0, "topk-moe": 0,
                   "rms-norm-mul-rope": 8, "moe-weighted-reduction": 0},
    "qwen3-moe-tiny": {"mul-mat-glu": 4, "mul-mat-add": 2, "rope-set-rows": 2, "add-chain": 0, "topk-moe": 8,
                       "rms-norm-mul-rope": 8, "moe-weighted-reduction": 2},
    "gpt-oss-tiny": {"mul-mat-glu": 0, "mul-mat-add": 10, "rope-set-rows": 2, "add-chain": 2, "topk-moe": 4,
                     "rms-norm-mul-rope": 0, "moe-weighted-reduction": 2},
    "qwen3-next-tiny": {"mul-mat-glu": 16, "mul-mat-add": 4, "rope-set-rows": 1, "add-chain": 4, "topk-moe": 16,
                        "rms-norm-mul-rope": 4, "moe-weighted-reduction": 4},
}
#: nodes one fused node replaces (removed per fused node)
REMOVED_PER_FUSED = {"mul-mat-glu": 2, "mul-mat-add": 1, "rope-set-rows": 1, "rms-norm-mul-rope": 2,
                     "moe-weighted-reduction": 1}
#: topk-moe: removed per router chain by gating
ROUTER_REMOVED = {"softmax": 4, "softmax_weight": 2}

CASES = [(m, f) for m in TINY_PRESETS for f in NEW if EXPECTED[m][f]]


def test_every_fusion_is_a_knob_with_a_pass_and_a_fused_op():
    assert set(NEW) <= set(FUSIONS) and set(FUSIONS) == set(PASSES)
    assert set(FUSED_OPS.values()) == {*NEW, "rms-norm-mul", *WORKBENCH_FUSIONS}  # ours: test_fusion_ours.py
    for op in FUSED_OPS:
        assert op in OPS and (op in KERNEL_NAMES or op in WORKBENCH_ONLY_KERNELS) and op in FUSED_BASE
        assert op in cuda_ops.SUPPORTED_OPS
    assert set(EXPECTED) == set(TINY_PRESETS)


@pytest.mark.parametrize("model", TINY_PRESETS)
@pytest.mark.parametrize("fusion", NEW)
def test_rewrite_count(model, fusion):
    g = build_graph(preset(model))
    fused, removed = apply_fusions(g, {fusion})
    assert len(removed) == EXPECTED[model][fusion]
    assert len(fused.nodes) == len(g.nodes) - len(removed)
    new = [n for n in fused.nodes if FUSED_OPS.get(n.op) == fusion]
    if fusion == "add-chain":  # each chain: operands - 1 ADDs, one of them kept
        assert sum(len(n.srcs) - 2 for n in new) == len(removed)
        assert all(3 <= len(n.srcs) <= MAX_ADD_OPERANDS for n in new)
    elif fusion == "topk-moe":
        assert sum(ROUTER_REMOVED[n.params["gating"]] for n in new) == len(removed)
        assert all(n.params["norm"] == (n.params["gating"] == "softmax") for n in new)
    else:
        assert len(new) * REMOVED_PER_FUSED[fusion] == len(removed)
    kept = {n.name for n in g.nodes} - set(removed)
    assert {n.name for n in fused.nodes} == kept  # names survive, fused nodes take the last node's
    again, more = apply_fusions(fused, {fusion})
    assert more == [] and len(again.nodes) == len(fused.nodes)  # a fixed point


def test_full_set_combines_the_fusions():
    """With every fusion on, the passes share nodes without conflict: each node is removed once
    and every fused op is still one of the declared ones."""
    for model in TINY_PRESETS:
        g = build_graph(preset(model))
        fused, removed = apply_fusions(g, FUSIONS)
        assert len(removed) == len(set(removed)) and len(fused.nodes) == len(g.nodes) - len(removed)
        assert all(n.op in OPS for n in fused.nodes)


@pytest.mark.parametrize("model,fusion", CASES + OURS_CASES)
def test_fusion_alone_keeps_the_reference_logits(model, fusion):
    """Each fusion alone, llama.cpp's and ours (test_fusion_ours.CASES), keeps the logits exactly."""
    cfg = preset(model, context=16)
    weights = random_weights(build_graph(cfg), 0)
    tokens = [3, 17, 250, 9]
    base = run_reference(cfg, weights, tokens).logits
    s = Strategy(fusion=frozenset({fusion}))
    got = run_reference(cfg, weights, tokens,
                        graph_for=lambda pos: compile_plan(build_graph(cfg, pos=pos), s).graph).logits
    np.testing.assert_array_equal(got, base)


def test_full_set_keeps_the_reference_logits():
    for model in TINY_PRESETS:
        cfg = preset(model, context=16)
        weights = random_weights(build_graph(cfg), 0)
        base = run_reference(cfg, weights, [5, 8, 13]).logits
        s = Strategy(fusion=frozenset(FUSIONS))
        got = run_reference(cfg, weights, [5, 8, 13],
                            graph_for=lambda pos, s=s, cfg=cfg: compile_plan(build_graph(cfg, pos=pos), s).graph)
        np.testing.assert_array_equal(got.logits, base, err_msg=model)


@pytest.mark.parametrize("model,fusion", CASES)
def test_fused_plan_is_race_free_and_binds(model, fusion):
    g = build_graph(preset(model))
    for s in (Strategy(fusion=frozenset({fusion})),
              Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware", sync="implicit",
                       fusion=frozenset({fusion})),
              Strategy(streams="auto", max_streams=4, allocator="stream-aware", pdl=True,
                       pdl_trigger="after-main-loop", fusion=frozenset({fusion}))):
        plan = compile_plan(g, s)
        report = verify(plan)
        assert report.race_free, f"{s.label()}:\n{report.text(limit=3)}"
    for n in plan.graph.nodes:
        if FUSED_OPS.get(n.op) == fusion:
            call = cuda_ops.bind(n, lambda v: v.offset, lambda key, size: 0)
            assert call.name.startswith("k_") and call.writes == n.outs


def test_qkv_streams_still_fork_with_biased_projections():
    """gpt-oss's q/k/v projections become MUL_MAT_ADD: the norm still forks three branches."""
    g = build_graph(preset("gpt-oss-tiny"))
    plan = compile_plan(g, Strategy(streams="qkv", allocator="stream-aware", fusion=frozenset({"mul-mat-add"})))
    assert plan.n_streams == 3


@pytest.mark.parametrize("label", list(FUSION_GRAPHS))
def test_seeded_stale_events_flagged_and_fixed(label):
    """The fused node without its first node's wait races with ``side``; with it, race-free."""
    bug = next(b for b in SEEDED_BUGS if b.name == f"{label}-stale-events")
    report = verify(bug.plan())
    found = {(r.cause, r.first.node, r.second.node) for r in report.races}
    assert bug.expect in found, found
    race = next(r for r in report.races if (r.cause, r.first.node, r.second.node) == bug.expect)
    fusion = fusion_of(label)
    assert fusion in race.text() and any(op in race.text() for op in OPS_OF[fusion])
    assert verify(fused_plan(label, waits=True)).race_free


def test_sweep_covers_every_fusion_without_subsets():
    sets = fusion_sets()
    assert frozenset() in sets and frozenset(FUSIONS) in sets
    assert all(frozenset({f}) in sets for f in FUSIONS)
    assert len(sets) == len(FUSIONS) + 2


def test_fused_kernels_cost_less_than_their_parts():
    """The simulator's cost of each fused node is below the sum of the nodes it replaced (one
    fixed launch part instead of two or three, the intermediate never written and re-read)."""
    cal = load_calibration("h200")
    for model in ("llama-tiny", "gpt-oss-tiny", "qwen3-next-tiny"):
        g = build_graph(preset(model))
        by_name = {n.name: n for n in g.nodes}
        for fusion in NEW:
            fused, removed = apply_fusions(g, {fusion})
            if not removed:
                continue
            new = [n for n in fused.nodes if FUSED_OPS.get(n.op) == fusion]
            before = sum(kernel_cost(by_name[r], cal).duration_ns for r in removed)
            before += sum(kernel_cost(by_name[n.name], cal).duration_ns for n in new)
            after = sum(kernel_cost(n, cal).duration_ns for n in new)
            assert after < before, (model, fusion)
            assert sum(n.bytes for n in new) < sum(by_name[r].bytes for r in removed) + \
                sum(by_name[n.name].bytes for n in new), (model, fusion)


def test_numba_rms_norm_mul_add_matches_reference():
    """The Numba RMS_NORM_MUL_ADD kernel (the norm family's Numba variant) under the simulator."""
    from test_kernels_cpu import HostSpace, _numba_sim

    from workbench.exec.reference_ops import NUMPY_OPS

    nk, cuda = _numba_sim()
    g, _ = apply_fusions(post_norm_graph(), {"rms-norm-mul"})
    space = HostSpace(g)
    rng = np.random.default_rng(5)
    for v in (*g.inputs.values(), *g.weights.values()):
        space.mem.write(v, rng.standard_normal(v.shape).astype(np.float32))
    node = g.node("l_out")
    NUMPY_OPS["SCALE"](g.node("h"), space.mem)
    call = cuda_ops.bind(node, space.addr, lambda key, n: 0)
    NUMPY_OPS[node.op](node, space.mem)
    kname, grid, block = call.numba
    dev = [cuda.to_device(np.ascontiguousarray(space.array(a))) if isinstance(a, cuda_ops.Arg) else a.value
           for a in call.args]
    nk.KERNELS[kname][grid, block](*dev)
    np.testing.assert_allclose(dev[0].copy_to_host().reshape(-1), space.mem.read(node.dst).reshape(-1),
                               rtol=2e-6, atol=2e-6)


def test_numba_add_chain_matches_reference():
    """The Numba ADD_CHAIN kernel (the elementwise family's Numba variant) on qwen3-next-tiny's
    fused chains, under Numba's CUDA simulator."""
    from test_kernels_cpu import HostSpace, _numba_sim

    from workbench.exec.reference import load_static
    from workbench.exec.reference_ops import NUMPY_OPS
    from workbench.models.blocks import step_input_values

    nk, cuda = _numba_sim()
    cfg = preset("qwen3-next-tiny", context=256)
    graph = build_graph(cfg, 256)
    plan = compile_plan(graph, Strategy(fusion=frozenset({"add-chain"})))
    g = plan.graph
    space = HostSpace(g)
    load_static(g, space.mem, random_weights(graph, 0))
    for k, v in step_input_values(g, 7, 3).items():
        space.mem.write(g.inputs[k], v)
    checked = 0
    for node in g.nodes:
        if node.op != "ADD_CHAIN":
            NUMPY_OPS[node.op](node, space.mem)
            continue
        call = cuda_ops.bind(node, space.addr, lambda key, n: 0)
        NUMPY_OPS[node.op](node, space.mem)
        want = space.mem.read(node.dst)
        kname, grid, block = call.numba
        dev = [cuda.to_device(np.ascontiguousarray(space.array(a))) if isinstance(a, cuda_ops.Arg) else a.value
               for a in call.args]
        nk.KERNELS[kname][grid, block](*dev)
        got = dev[0].copy_to_host().reshape(-1)
        np.testing.assert_array_equal(got, want.reshape(-1))
        checked += 1
    assert checked == sum(n.op == "ADD_CHAIN" for n in g.nodes) > 0


def test_race_on_a_fused_nodes_own_operand_is_a_missing_event():
    """Only a source the fused node inherited from a node it absorbed makes a race the fusion's:
    the ADD's own operand (the residual) racing is a plain missing event, as it was unfused."""
    from workbench.verify.seeded import hand_plan

    b = GraphBuilder("own-operand")
    x = b.op("SCALE", "x_in", [b.input("inp_x", (1, 64), "f32")], (1, 64), s=1.0)
    side = b.op("SCALE", "side", [x], (1, 64), s=0.5)
    h = b.op("MUL_MAT", "proj", [b.weight("w", (64, 64), "f16"), x], (1, 64))
    y = b.op("ADD", "proj_res", [h, side], (1, 64))
    b.output("logits", b.op("SCALE", "result_output", [y], (1, 64), kind="output", s=1.0))
    graph, removed = PASSES["mul-mat-add"](b.build())
    assert removed == ["proj"] and graph.node("proj_res").params["inherited"] == (0, 1)
    placed = [(0, (), (0,)), (1, (0,), (1,)), (0, (), ()), (0, (1,), ())]
    report = verify(hand_plan(graph, placed, Strategy(streams="auto", allocator="no-reuse")))
    assert {(r.cause, r.first.node, r.second.node) for r in report.races} == {("missing-event", "side", "proj_res")}


def post_norm_graph():
    """A post-norm residual (Gemma's ``post_attention_norm``): ``l_out = res + rms_norm(h) * w``,
    the pattern of llama.cpp's rms_norm + mul + add (no preset family has it)."""
    from workbench.models.blocks import rms_norm

    b = GraphBuilder("post-norm")
    h = b.op("SCALE", "h", [b.input("inp_h", (1, 64), "f32")], (1, 64), s=1.0)
    res = b.input("inp_res", (1, 64), "f32")
    normed = rms_norm(b, h, b.weight("w_norm", (64,), "f32"), 1e-6, "post_norm")
    out = b.op("ADD", "l_out", [normed, res], (1, 64))
    b.output("logits", b.op("SCALE", "result_output", [out], (1, 64), kind="output", s=1.0))
    return b.build()


def test_rms_norm_mul_add_fuses_the_post_norm_residual():
    from workbench.exec.memory import Memory
    from workbench.exec.reference import execute_graph

    g = post_norm_graph()
    fused, removed = apply_fusions(g, {"rms-norm-mul"})
    assert removed == ["post_norm_rms", "post_norm"]
    node = fused.node("l_out")
    assert node.op == "RMS_NORM_MUL_ADD" and node.params["fused"] == ("post_norm",)
    values = {n: np.random.default_rng(3).standard_normal(v.shape).astype(np.float32)
              for n, v in {**g.inputs, **g.weights}.items()}
    outs = []
    for graph in (g, fused):
        mem = Memory()
        for n, v in {**graph.inputs, **graph.weights}.items():
            mem.write(v, values[n])
        execute_graph(graph, mem)
        outs.append(mem.read(graph.outputs["logits"]))
    np.testing.assert_array_equal(outs[0], outs[1])
    for s in (Strategy(fusion=frozenset({"rms-norm-mul"})),
              Strategy(graphs=True, pdl=True, streams="auto", allocator="stream-aware", fusion=frozenset(FUSIONS))):
        assert verify(compile_plan(g, s)).race_free
    call = cuda_ops.bind(node, lambda v: v.offset, lambda key, size: 0)
    assert call.name == "k_rms_norm_mul_add" and call.numba[0] == "rms_norm_mul_add"


def test_norm_rope_kernel_takes_every_head_the_pass_fuses():
    """The pass fuses even heads up to NORM_ROPE_MAX_HEAD; the binder gives each a block of a
    thread per element pair (rounded up to a warp) and no larger than 128 threads."""
    from workbench.models.blocks import rms_norm
    from workbench.strategy.fusion_chains import NORM_ROPE_MAX_HEAD, fuse_norm_mul_rope

    for hd, n_rot, fused in ((NORM_ROPE_MAX_HEAD, 64, True), (96, 96, True), (NORM_ROPE_MAX_HEAD + 2, 64, False),
                             (6, 3, False)):
        b = GraphBuilder("norm-rope")
        x = b.input("x", (1, 4 * hd), "f32").reshape((4, hd))
        pos = b.input("inp_pos", (1,), "i32")
        freqs = b.const("rope_freqs", (n_rot // 2,), "f32")
        normed = rms_norm(b, x, b.weight("w_norm", (hd,), "f32"), 1e-6, "q_normed")
        r = b.op("ROPE", "q_rope", [normed, pos, freqs], (4, hd), n_rot=n_rot, attn_factor=1.0)
        b.output("logits", b.op("SCALE", "result_output", [r], (4, hd), kind="output", s=1.0))
        graph, removed = fuse_norm_mul_rope(b.build())
        assert bool(removed) == fused, (hd, n_rot)
        if fused:
            call = cuda_ops.bind(graph.node("q_rope"), lambda v: v.offset, lambda key, size: 0)
            assert call.name == "k_rms_norm_mul_rope" and call.grid == (4,)
            assert 2 * call.block[0] >= hd and call.block[0] % 32 == 0 and call.block[0] <= 128
