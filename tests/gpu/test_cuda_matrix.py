"""The acceptance matrix: every knob combination on every family's tiny preset and on
llama-3.2-1b with 2 layers, CuPy and Numba kernels, matches the reference executor (logits,
tolerance explained in gpu_cases), and graph replays are bit-identical."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from gpu_cases import MODELS, N_TOKENS, START, TOL, executor, model_case, record, rel_err

import workbench
from workbench.strategy import FUSIONS, WORKBENCH_FUSIONS, Strategy

SYNC = ("per-copy", "boundary", "implicit")
GRAPHS = (False, True)
STREAMS = ("single", "qkv", "auto")
PDL = ("off", "start", "first-read")
#: none, llama.cpp's set, every fusion (llama.cpp's set + the workbench's norm-mat-vec, qkv-rope-store)
FUSION = ("none", "llamacpp", "fused")
ALLOCATOR = ("stream-aware", "no-reuse")
COMBOS = list(itertools.product(SYNC, GRAPHS, STREAMS, PDL, FUSION, ALLOCATOR))
REPLAYS = 10


def strategy_of(sync, graphs, streams, pdl, fusion, allocator) -> Strategy:
    return Strategy(sync=sync, graphs=graphs, streams=streams, pdl=pdl != "off",
                    pdl_wait=pdl if pdl != "off" else "first-read", pdl_trigger="start",
                    fusion={"none": frozenset(), "llamacpp": frozenset(FUSIONS) - frozenset(WORKBENCH_FUSIONS),
                            "fused": frozenset(FUSIONS)}[fusion],
                    allocator=allocator)


def _id(combo) -> str:
    sync, graphs, streams, pdl, fusion, alloc = combo
    return "-".join([sync, "graphs" if graphs else "eager", streams, f"pdl_{pdl}", fusion, alloc])


@pytest.mark.parametrize("kernels", ["cupy", "numba"])
@pytest.mark.parametrize("combo", COMBOS, ids=[_id(c) for c in COMBOS])
@pytest.mark.parametrize("model", list(MODELS))
def test_knob_matrix(model, combo, kernels):
    case = model_case(model)
    strategy = strategy_of(*combo)
    ex = executor(case, strategy, kernels)
    run = workbench.run(case.cfg, strategy, tokens=case.tokens[:N_TOKENS], backend="cuda", start_pos=START,
                        kernels=kernels, executor=ex)
    err = rel_err(run.logits, case.ref)
    identical = None
    if strategy.graphs:
        assert ex.captures == 2  # one per KV length (256, then 512 rows)
        snap = ex.snapshot()
        outs = []
        for _ in range(REPLAYS):
            ex.restore(snap)
            outs.append(ex.step(case.tokens[N_TOKENS], START + N_TOKENS))
        identical = all(np.array_equal(o, outs[0]) for o in outs)
    record(test="matrix", model=model, strategy=strategy.label(), kernels=kernels, rel_err=err,
           replays_identical=identical, us_per_token=run.stats["us_per_token"])
    assert err <= TOL, f"{strategy.label()}: logits rel err {err:.3g} > {TOL}"
    assert identical in (None, True), "graph replays differ"


#: --logits zero-copy over the host programs (sync x graphs) with no fusion and with every fusion
ZERO_COPY = list(itertools.product(SYNC, GRAPHS, ("none", "fused")))


@pytest.mark.parametrize("combo", ZERO_COPY,
                         ids=["-".join([s, "graphs" if g else "eager", f]) for s, g, f in ZERO_COPY])
@pytest.mark.parametrize("model", list(MODELS))
def test_zero_copy_logits(model, combo):
    """--logits zero-copy: the host program has no D2H copy, the kernel that writes the logits
    stores them into the executor's pinned staging (mapped by UVA), and they match the reference."""
    sync, graphs, fusion = combo
    case = model_case(model)
    strategy = strategy_of(sync, graphs, "qkv", "first-read", fusion, "stream-aware").with_(logits="zero-copy")
    ex = executor(case, strategy, "cupy")
    run = workbench.run(case.cfg, strategy, tokens=case.tokens[:N_TOKENS], backend="cuda", start_pos=START,
                        executor=ex)
    assert not any(op.kind == "memcpy_d2h" for op in run.plan.host_program)
    staging = int(ex._staging["logits"].pinned.ctypes.data)
    for b in ex._plans.values():
        out = b.plan.graph.outputs["logits"].buffer.name
        writers = [c for la, c in zip(b.plan.launches, b.calls) if any(v.buffer.name == out for v in la.node.outs)]
        assert writers and all(any(getattr(a, "ptr", None) == staging for a in c.args) for c in writers), writers
    err = rel_err(run.logits, case.ref)
    record(test="zero-copy", model=model, strategy=strategy.label(), kernels="cupy", rel_err=err,
           us_per_token=run.stats["us_per_token"])
    assert err <= TOL, f"{strategy.label()}: logits rel err {err:.3g} > {TOL}"
