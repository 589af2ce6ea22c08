"""compile_plan: every knob combination compiles, keeps the numerics, and has the seeds' shape."""

from __future__ import annotations

import re
import time
import warnings
from itertools import product

import numpy as np
import pytest
from test_allocate import launch_clocks, tiny_graph

from workbench.exec.reference import run_reference
from workbench.models import TINY_PRESETS, build_graph, preset
from workbench.models.weights import random_weights
from workbench.strategy import (
    ALL_ON,
    ALLOCATORS,
    FUSIONS,
    PDL_TRIGGERS,
    PDL_WAITS,
    STREAM_MODES,
    SYNC_MODES,
    Plan,
    Strategy,
    StrategyError,
    UnsafeStrategyWarning,
    compile_plan,
)
from workbench.strategy.host import pattern

FUSION_SETS = [frozenset(), frozenset({"copy-elim"}), frozenset({"rms-norm-mul"}), frozenset(FUSIONS)]
#: llama.cpp PR #17795's host patterns (g: the kernels, d: logits back, s: the final sync)
PATTERNS = {"per-copy": "s c s c s c s c g d s", "boundary": "s a a a a s g d s", "implicit": "a a a a g d s"}


def check_plan(plan: Plan) -> None:
    """Structural invariants every executor and the verifier rely on."""
    s = plan.strategy
    assert [la.index for la in plan.launches] == list(range(len(plan.launches)))
    assert [la.node for la in plan.launches] == plan.graph.nodes
    assert all(0 <= la.stream < plan.n_streams for la in plan.launches)
    recorded = [e for la in plan.launches for e in la.record_events]
    assert sorted(recorded) == list(range(plan.n_events))  # each event recorded once per token
    clocks = launch_clocks(plan)  # asserts every wait follows its record
    last = len(plan.launches) - 1
    assert plan.launches[-1].stream == 0
    assert all(clocks[last][la.stream] >= la.index for la in plan.launches), "a stream does not rejoin stream 0"
    first_on_stream = {}
    for la in plan.launches:
        first_on_stream.setdefault(la.stream, la.index)
        if not s.pdl:
            assert (la.pdl, la.wait, la.trigger) == (False, "start", "none")
        else:
            assert la.pdl == (first_on_stream[la.stream] != la.index)
            assert la.trigger == s.placement(la.node.family)[1]
    names = {n.name for n in plan.graph.nodes}
    assert names == {n.name for n in plan.source.nodes} - set(plan.removed)
    kinds = [op.kind for op in plan.host_program]
    assert kinds.count("graph_launch") == (1 if s.graphs else 0)
    assert kinds.count("launch") == (0 if s.graphs else len(plan.launches))
    assert plan.memory_bytes == plan.allocation.arena_bytes + plan.allocation.persistent_bytes > 0


@pytest.mark.parametrize("name", TINY_PRESETS)
@pytest.mark.parametrize("graphs", [False, True])
def test_every_knob_combination_compiles(name, graphs):
    g = tiny_graph(name)
    n = 0
    for sync, streams, pdl, fusion, alloc in product(SYNC_MODES, STREAM_MODES, (False, True), FUSION_SETS, ALLOCATORS):
        s = Strategy(sync=sync, graphs=graphs, streams=streams, pdl=pdl, fusion=fusion, allocator=alloc)
        plan = compile_plan(g, s, device_cc=(9, 0))
        check_plan(plan)
        n += 1
    assert n == 3 * 3 * 2 * 4 * 3


@pytest.mark.parametrize("wait,trigger", list(product(PDL_WAITS, PDL_TRIGGERS)))
def test_pdl_placements_compile(wait, trigger):
    g = tiny_graph("qwen3-tiny")
    s = ALL_ON.with_(pdl_wait=wait, pdl_trigger=trigger, pdl_families=(("mul_mat", "start", "end"),))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = compile_plan(g, s)
    check_plan(plan)
    late = [w for w in caught if issubclass(w.category, UnsafeStrategyWarning)]
    assert bool(late) == (wait == "late") and bool(plan.warnings) == (wait == "late")
    for la in plan.launches:
        if la.pdl:
            assert (la.wait, la.trigger) == (("start", "end") if la.node.family == "mul_mat" else (wait, trigger))


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_plan_graph_keeps_the_reference_logits(name):
    tiny_graph(name)  # skips while the family's builder is missing
    cfg = preset(name, context=16)
    weights = random_weights(build_graph(cfg), 0)
    tokens = [3, 17, 250, 9]
    base = run_reference(cfg, weights, tokens).logits
    for fusion, alloc, streams in product(FUSION_SETS, ALLOCATORS, ("single", "qkv")):
        s = Strategy(fusion=fusion, allocator=alloc, streams=streams)
        got = run_reference(cfg, weights, tokens,
                            graph_for=lambda pos, s=s: compile_plan(build_graph(cfg, pos=pos), s).graph).logits
        assert np.max(np.abs(got - base)) <= 1e-5, (sorted(fusion), alloc, streams)


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_qkv_forks_after_attn_norm_and_joins_at_attention(name):
    g = tiny_graph(name)
    plan = compile_plan(g, Strategy(streams="qkv", graphs=True))
    assert plan.n_streams == 3
    by_name = {la.node.name: la for la in plan.launches}
    layers = [int(m.group(1)) for n in by_name if (m := re.match(r"kqv_out-(\d+)$", n))]
    assert layers
    for il in layers:
        fork = by_name[f"attn_norm-{il}"]
        assert fork.stream == 0 and len(fork.record_events) == 1
        ev = fork.record_events[0]
        q = by_name.get(f"Qcur-{il}") or by_name[f"Qcur_full-{il}"]
        k, v = by_name[f"Kcur-{il}"], by_name[f"Vcur-{il}"]
        assert (q.stream, k.stream, v.stream) == (0, 1, 2)
        assert k.wait_events == (ev,) and v.wait_events == (ev,)
        assert by_name[f"Kcur_rope-{il}"].stream == 1 and by_name[f"Qcur_rope-{il}"].stream == 0
        ks, vs = by_name[f"k_cache_store-{il}"], by_name[f"v_cache_store-{il}"]
        assert (ks.stream, vs.stream) == (1, 2)
        join = by_name[f"kqv_out-{il}"]
        assert join.stream == 0 and set(join.wait_events) == {*ks.record_events, *vs.record_events}
        assert len(join.wait_events) == 2
    assert plan.n_events == 3 * len(layers)


def test_auto_runs_independent_branches_concurrently():
    plan = compile_plan(tiny_graph("llama-tiny"), Strategy(streams="auto", max_streams=4))
    st = {la.node.name: la.stream for la in plan.launches}
    assert len({st["Qcur-0"], st["Kcur-0"], st["Vcur-0"]}) == 3
    assert st["ffn_gate-0"] != st["ffn_up-0"]
    assert 2 <= plan.n_streams <= 4
    capped = compile_plan(tiny_graph("llama-tiny"), Strategy(streams="auto", max_streams=2))
    assert capped.n_streams == 2


@pytest.mark.parametrize("sync", SYNC_MODES)
@pytest.mark.parametrize("graphs", [False, True])
def test_host_program_matches_seed_000(sync, graphs):
    plan = compile_plan(tiny_graph("llama-tiny"), Strategy(sync=sync, graphs=graphs, streams="qkv"))
    assert pattern(plan.host_program) == PATTERNS[sync]
    h2d = [op for op in plan.host_program if op.kind == "memcpy_h2d"]
    assert [op.tensor for op in h2d] == ["inp_tokens", "inp_pos", "inp_kv_idx", "kq_mask"]
    assert all(op.blocking == (sync == "per-copy") for op in h2d)
    assert {op.host_buffer for op in h2d} == {"pageable" if sync == "per-copy" else "pinned"}
    events = [op for op in plan.host_program if op.kind in ("event_record", "stream_wait_event")]
    assert len(events) == (0 if graphs else plan.n_events + 4 * 2)  # per layer: fork waited twice, 2 joins
    assert plan.host_program[-1].kind == "stream_sync" and plan.host_program[-2].kind == "memcpy_d2h"


def test_sliding_window_mask_is_copied_too():
    plan = compile_plan(tiny_graph("gpt-oss-tiny"), Strategy(sync="implicit"))
    assert pattern(plan.host_program) == "a a a a a g d s"


def test_impossible_combinations_name_the_knob():
    g = tiny_graph("llama-tiny")
    with pytest.raises(StrategyError, match="--pdl.*9.0"):
        compile_plan(g, Strategy(pdl=True), device_cc=(8, 9))
    compile_plan(g, Strategy(pdl=False), device_cc=(8, 9))  # without PDL an Ada GPU is fine
    with pytest.raises(StrategyError, match="pdl_families.*'matmul'"):
        compile_plan(g, Strategy(pdl=True, pdl_families=(("matmul", "start", "end"),)))
    with pytest.raises(StrategyError, match="--max-streams 2"):
        Strategy(streams="qkv", max_streams=2)


def test_compile_llama_8b_everything_on_is_fast():
    g = build_graph(preset("llama-3.1-8b"))
    t = time.perf_counter()
    plan = compile_plan(g, ALL_ON)
    dt = time.perf_counter() - t
    assert dt < 1.0, f"compile took {dt:.2f} s"
    # per layer: 2 RMS_NORMs (rms-norm-mul), gate and up (mul-mat-glu), attn_out and ffn_out
    # (mul-mat-add into the residual ADDs), K's ROPE (rope-set-rows); plus result_norm's RMS_NORM
    assert plan.n_streams == 3 and len(plan.removed) == (2 + 2 + 2 + 1) * 32 + 1


def test_qkv_fork_is_found_from_the_graph_structure_not_the_node_name():
    """A norm whose output feeds exactly three mat-muls forks, whatever it is called."""
    from dataclasses import replace

    from workbench.models import build_graph, preset
    from workbench.strategy.deps import hazards
    from workbench.strategy.streams import fork_points

    g = build_graph(preset("llama-tiny"))
    renamed = [replace(n, name=n.name.replace("attn_norm", "input_layernorm")) for n in g.nodes]
    forks = fork_points(renamed, hazards(renamed))
    assert [renamed[i].name for i in forks] == ["input_layernorm-0", "input_layernorm-1"]
    # the ffn norm feeds two mat-muls (gate, up): no fork there
    assert all(not renamed[i].name.startswith("ffn_norm") for i in forks)
