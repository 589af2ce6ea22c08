"""Graph rewrites: generic copy elimination (PR #23940's review) and rms-norm-mul."""

from __future__ import annotations

import numpy as np
import pytest
from test_allocate import tiny_graph

from workbench.exec.memory import Memory
from workbench.exec.reference import execute_graph
from workbench.graph import GraphBuilder, View
from workbench.strategy.fusion import apply_fusions, eliminate_copies, fuse_rms_norm_mul

RNG = np.random.default_rng(0)


def column(cache: View, j: int) -> View:
    """Column ``j`` of a [rows, cols] cache as a strided [1, rows] view (not contiguous)."""
    return View(cache.buffer, cache.offset + j * cache.itemsize, (1, cache.shape[0]), (0, cache.strides[0]),
                cache.dtype)


def small_graph(variant: str = "plain"):
    """``y = W x`` copied into a column of a cache, then read back through the cache."""
    b = GraphBuilder(f"copy-{variant}")
    x = b.input("x", (1, 8), "f32")
    w = b.weight("w", (6, 8), "f32")
    cache = b.cache("cache", (6, 4), "f16" if variant == "dtype" else "f32")
    dst = column(cache, 2)
    y = b.op("MUL_MAT", "y", [w, x], (1, 6))
    if variant == "between":
        b.op("SCALE", "early_read", [dst], (1, 6), s=1.0)
    if variant == "twice":
        b.op("SCALE", "second_use", [y], (1, 6), s=3.0)
    b.node("CPY", "y_cpy", [y], [dst])
    z = b.op("SCALE", "z", [dst], (1, 6), s=2.0)
    out = b.op("ADD", "out", [z, x.slice(1, 0, 6)], (1, 6), kind="output")
    b.output("logits", out)
    return b.build()


def run(graph, values):
    mem = Memory()
    for name, v in graph.weights.items():
        mem.write(v, values[name])
    for name, v in graph.inputs.items():
        mem.write(v, values[name])
    for name, v in graph.caches.items():
        mem.write(v, values[name])
    execute_graph(graph, mem)
    return mem.read(graph.outputs["logits"]), {n: mem.read(v) for n, v in graph.caches.items()}


def values_for(graph):
    tables = {**graph.weights, **graph.inputs, **graph.caches}
    return {n: RNG.standard_normal(v.shape).astype(np.float32) for n, v in tables.items()}


def test_copy_elim_redirects_any_op_into_a_strided_view():
    g = small_graph()
    fused, removed = eliminate_copies(g)
    assert removed == ["y_cpy"]
    assert [n.name for n in fused.nodes] == ["y", "z", "out"]
    y = fused.node("y")
    assert y.dst == column(g.caches["cache"], 2) and not y.dst.is_contiguous
    assert y.params["cpy_eliminated"] == ("y_cpy",) and "inplace" not in y.params
    vals = values_for(g)
    (a, ca), (b, cb) = run(g, vals), run(fused, vals)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ca["cache"], cb["cache"])


@pytest.mark.parametrize("variant", ["twice", "between", "dtype"])
def test_copy_elim_keeps_unsafe_copies(variant):
    """Output read twice; the destination read before the CPY; a converting copy."""
    g = small_graph(variant)
    fused, removed = eliminate_copies(g)
    assert removed == [] and len(fused.nodes) == len(g.nodes)


def test_copy_elim_in_place_update_of_the_source_view():
    """An op that reads a cache view and whose result is copied back into exactly that view
    updates it in place (the recurrent-state pattern); a partial overlap is refused."""
    for shift, expect in ((0, ["upd_cpy"]), (1, [])):
        b = GraphBuilder("inplace")
        state = b.cache("state", (4, 8), "f32")
        x = b.input("x", (2, 8), "f32")
        src = state.slice(0, 0, 2)
        upd = b.op("ADD", "upd", [src, x], (2, 8))
        b.node("CPY", "upd_cpy", [upd], [state.slice(0, shift, shift + 2)])
        out = b.op("SCALE", "out", [state.slice(0, 0, 2)], (2, 8), kind="output", s=1.0)
        b.output("logits", out)
        g = b.build()
        fused, removed = eliminate_copies(g)
        assert removed == expect
        if expect:
            assert fused.node("upd").params["inplace"] == ((0, 0),)
            vals = values_for(g)
            (a, ca), (c, cc) = run(g, vals), run(fused, vals)
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(ca["state"], cc["state"])


def test_copy_elim_removes_exactly_the_gdn_state_copies():
    g = tiny_graph("qwen3-next-tiny")
    cpys = [n.name for n in g.nodes if n.op == "CPY"]
    assert cpys, "the GDN pattern should be present in the source graph"
    fused, removed = apply_fusions(g, {"copy-elim"})
    assert sorted(removed) == sorted(cpys)
    assert not any(n.op == "CPY" for n in fused.nodes)
    for n in fused.nodes:
        if n.op in ("GATED_DELTA_NET", "SSM_CONV"):
            # the state snapshot now lands in the recurrent cache the op reads (in place)
            assert n.outs[1].buffer.kind == "cache"
            (src, out), = n.params["inplace"]
            assert n.srcs[src] == n.outs[out] and out == 1
    assert {n.name for n in fused.nodes} == {n.name for n in g.nodes} - set(cpys)


def test_rms_norm_mul_fuses_every_norm_and_keeps_names():
    g = tiny_graph("llama-tiny")
    fused, removed = fuse_rms_norm_mul(g)
    norms = [n for n in g.nodes if n.op == "RMS_NORM"]
    assert sorted(removed) == sorted(n.name for n in norms)
    assert not any(n.op == "RMS_NORM" for n in fused.nodes)
    fused_names = [n.name for n in fused.nodes if n.op == "RMS_NORM_MUL"]
    assert len(fused_names) == len(norms) and "attn_norm-0" in fused_names and "result_norm" in fused_names


def test_rms_norm_mul_skips_a_norm_with_two_readers():
    b = GraphBuilder("norm")
    x = b.input("x", (1, 8), "f32")
    w = b.weight("w", (8,), "f32")
    r = b.op("RMS_NORM", "n_rms", [x], (1, 8), eps=1e-6)
    m = b.op("MUL", "n", [r, w], (1, 8))
    out = b.op("ADD", "out", [m, r], (1, 8), kind="output")
    b.output("logits", out)
    fused, removed = fuse_rms_norm_mul(b.build())
    assert removed == [] and [n.op for n in fused.nodes] == ["RMS_NORM", "MUL", "ADD"]
