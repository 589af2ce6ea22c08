"""Node by node: one decode step on the GPU against the NumPy reference ops over the same Plan
graph (no-reuse allocation, so every node's output is still in the arena afterwards). A failure
names the first node whose kernel disagrees, which is where the bug is."""

from __future__ import annotations

import numpy as np
import pytest
from gpu_cases import MODELS, executor, model_case, record

from workbench.exec.memory import Memory
from workbench.exec.reference import load_static
from workbench.exec.reference_ops import NUMPY_OPS
from workbench.models.blocks import step_input_values
from workbench.strategy import FUSIONS as ALL_FUSIONS
from workbench.strategy import Strategy

#: per node: relative to the largest reference value of that output (fp32 compute on both sides;
#: fp16/bf16 storage of a cache entry may round the other way: 2^-8 for bf16)
NODE_TOL = 5e-3
#: "fused": every Strategy fusion, so each fused kernel of llama.cpp's set is checked node by node
#: on every model it applies to (tests/gpu/test_cuda_fused.py covers each kernel variant)
FUSIONS = {"none": frozenset(), "fused": frozenset(ALL_FUSIONS)}


def _gpu_memory(ex, plan) -> Memory:
    mem = Memory()
    mem.arrays[plan.allocation.arena] = ex.arena_bytes()
    for name in ex.persistent:
        mem.arrays[name] = ex.persistent_array(name)
    return mem


@pytest.mark.parametrize("fusion", FUSIONS)
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("kernels", ["cupy", "numba"])
def test_every_node_matches_reference(model, fusion, kernels):
    case = model_case(model)
    strategy = Strategy(allocator="no-reuse", fusion=FUSIONS[fusion])
    ex = executor(case, strategy, kernels)
    pos, tok = 5, case.tokens[0]
    ex.step(tok, pos)
    plan = ex.bound(case.cfg.kv_len(pos)).plan
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
                call = ex.bound(case.cfg.kv_len(pos)).calls[la.index]
                bad.append(f"{node.name} ({node.op} -> {call.name}, out {k} {out.describe()}): rel err {err:.3g}")
    record(test="nodes", model=model, fusion=fusion, kernels=kernels, worst_node_rel_err=worst, bad=len(bad))
    assert not bad, "first mismatching nodes:\n" + "\n".join(bad[:12])
