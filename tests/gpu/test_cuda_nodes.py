"""Node by node: one decode step on the GPU against the NumPy reference ops over the same Plan
graph (no-reuse allocation, so every node's output is still in the arena afterwards). A failure
names the first node whose kernel disagrees, which is where the bug is."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_cases import MODELS, TINY, executor, model_case, record

from workbench.exec import cuda_ops
from workbench.exec.memory import Memory
from workbench.exec.reference import load_static
from workbench.exec.reference_ops import NUMPY_OPS
from workbench.models.blocks import step_input_values
from workbench.strategy import FUSIONS as ALL_FUSIONS
from workbench.strategy import WORKBENCH_FUSIONS, Strategy

#: per node: relative to the largest reference value of that output (fp32 compute on both sides;
#: fp16/bf16 storage of a cache entry may round the other way: 2^-8 for bf16)
NODE_TOL = 5e-3
#: "llamacpp": llama.cpp's fusion set, so each of its fused kernels is checked node by node on every
#: model it applies to; "ours": the workbench's own (norm-mat-vec, qkv-rope-store) alone; "fused":
#: every Strategy fusion (ours over llama.cpp's: the norm folded into MUL_MAT_GLU, the Q/K/V kernel
#: over the K store of rope-set-rows). tests/gpu/test_cuda_fused.py covers each kernel variant.
FUSIONS = {"none": frozenset(), "llamacpp": frozenset(ALL_FUSIONS) - frozenset(WORKBENCH_FUSIONS),
           "ours": frozenset(WORKBENCH_FUSIONS), "fused": frozenset(ALL_FUSIONS)}


def _gpu_memory(ex, plan) -> Memory:
    mem = Memory()
    mem.arrays[plan.allocation.arena] = ex.arena_bytes()
    for name in ex.persistent:
        mem.arrays[name] = ex.persistent_array(name)
    return mem


def _node_errors(model: str, strategy: Strategy, kernels: str) -> tuple[list[str], float, set[str]]:
    """One step of ``model`` on the GPU against the reference ops node by node: (mismatching
    nodes, the worst relative error, the kernels bound)."""
    case = model_case(model)
    ex = executor(case, strategy, kernels)
    pos, tok = 5, case.tokens[0]
    ex.step(tok, pos)
    bound = ex.bound(case.cfg.kv_len(pos))
    plan = bound.plan
    gpu = _gpu_memory(ex, plan)
    ref = Memory()
    load_static(plan.graph, ref, case.weights)
    for name, value in step_input_values(plan.graph, tok, pos).items():
        ref.write(plan.graph.inputs[name], value)
    bad = []
    worst = 0.0
    for la, node in zip(plan.launches, plan.graph.nodes):
        NUMPY_OPS[node.op](node, ref)
        for k, out in enumerate(node.outs):
            r, g = ref.read(out).astype(np.float64), gpu.read(out).astype(np.float64)
            scale = max(np.abs(r).max(), 1e-6)
            err = float(np.abs(g - r).max() / scale) if np.isfinite(g).all() else float("inf")
            worst = max(worst, err)
            if not err <= NODE_TOL:
                call = bound.calls[la.index]
                bad.append(f"{node.name} ({node.op} -> {call.name}, out {k} {out.describe()}): rel err {err:.3g}")
    return bad, worst, {c.name for c in bound.calls}


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("kernels", ["cupy", "numba"])
def test_every_node_matches_reference(model, fusion, kernels):
    bad, worst, _ = _node_errors(model, Strategy(allocator="no-reuse", fusion=FUSIONS[fusion]), kernels)
    record(test="nodes", model=model, fusion=fusion, kernels=kernels, worst_node_rel_err=worst, bad=len(bad))
    assert not bad, "first mismatching nodes:\n" + "\n".join(bad[:12])


def _attn_one_warp(split: bool):
    """Decode attention in blocks of one warp and one step: a few keys per round, so even the
    tiny models' short contexts take several rounds of one block (``split=False``) or several
    blocks whose partials are merged (``split=True``)."""
    launch = cuda_ops.attn_vec_launch

    def policy(head_dim: int, itemsize: int, n_kv: int, n_head: int):
        if launch(head_dim, itemsize, n_kv, n_head) is None:
            return None
        chunks = -(-n_kv // (32 // (head_dim * itemsize // 16)))
        return (1, 1, 1, chunks) if split else (1, 1, chunks, 1)
    return policy


#: kernel variants behind cuda_ops' selection constants (off by default until
#: benchmarks/kernel_bench.py measures them faster) or launch policies: what turns each on, and
#: the kernel name part it must bind on the tiny models
VARIANTS = {
    "attn-gqa": ({"FA_VARIANT": "gqa"}, "k_flash_attn_ext_gqa_"),
    "attn-rounds": ({"attn_vec_launch": _attn_one_warp(split=False)}, "k_flash_attn_ext_vec_"),
    "attn-split": ({"attn_vec_launch": _attn_one_warp(split=True)}, "k_flash_attn_ext_vec_"),
    "attn-ticket": ({"FA_CLUSTER_MAX": 0}, "k_flash_attn_ext_vec_"),
    "mmv-seg-16": ({"MMV_SEG_K_MAX": 1 << 16, "MMV_SEG_LANES": 16, "MMV_SEG_MUL_MAT": True}, "_seg_"),
    "mmv-seg-8": ({"MMV_SEG_K_MAX": 1 << 16, "MMV_SEG_LANES": 8, "MMV_SEG_MUL_MAT": True}, "_seg_"),
}


def test_short_context_attention_launches_as_clusters():
    """llama-3.2-1b's attention over 256 keys: each head's 2 split blocks launched as one
    thread-block cluster on a Hopper GPU (the merge in distributed shared memory; the node check
    above holds its result to the reference), not silently dropped to the ticket's merge."""
    case = model_case("llama-3.2-1b-L2")
    ex = executor(case, Strategy(allocator="no-reuse"), "cupy")
    ex.step(case.tokens[0], 5)
    b = ex.bound(case.cfg.kv_len(5))
    attn = [h for h, c in zip(b.handles, b.calls) if c.name.startswith("k_flash_attn_ext_vec_")]
    assert attn, sorted({c.name for c in b.calls})
    want = (1, 2, 1) if ex.cc >= (9, 0) else None
    assert all(h.cluster == want for h in attn), [h.cluster for h in attn]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model", list(MODELS))
def test_kernel_variants_match_reference(model, variant, monkeypatch):
    """Each variant kernel, switched on, node by node against the reference on every model
    (with llama.cpp's fusions, so the segmented kernels also meet the fused graphs' views; the
    workbench's own fusions would fold every plain mat-vec of the tiny models into theirs)."""
    knobs, part = VARIANTS[variant]
    for k, v in knobs.items():
        monkeypatch.setattr(cuda_ops, k, v)
    bad, worst, kernels = _node_errors(model, Strategy(allocator="no-reuse", fusion=FUSIONS["llamacpp"]), "cupy")
    record(test="variants", model=model, variant=variant, worst_node_rel_err=worst, bad=len(bad))
    assert not bad, "first mismatching nodes:\n" + "\n".join(bad[:12])
    if model in TINY:
        assert any(part in k for k in kernels), sorted(kernels)
