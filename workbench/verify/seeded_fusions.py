"""Seeded bugs of the chain fusions: a fused kernel scheduled with the events of the last node it
replaced (as a fusion applied after stream assignment would be, llama.cpp fuses at graph
evaluation), not with its own.

Each small graph has a ``side`` node on stream 1 (forked after ``x_in``) writing the input of
the pattern's *first* node. Unfused, that first node waited for the event after ``side``; the nodes after it were
ordered by stream order alone. The real fusion pass (``fusion_chains``) then replaces the
pattern by one node at the last node's position, reading that input itself: placed with the last
node's (empty) waits it is unordered with ``side``. The same graph with the fused node waiting
for the event is race-free (tests/test_fusion_set.py checks both).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..graph import Graph, GraphBuilder, View
from ..models.blocks import mat_input, rms_norm
from ..strategy.fusion import PASSES
from ..strategy.plan import Plan
from ..strategy.strategy import Strategy

D = 64


def _start(name: str) -> tuple[GraphBuilder, View, View]:
    """``x_in`` on stream 0 (the fork), ``side`` of it on stream 1."""
    b = GraphBuilder(name)
    x = b.op("SCALE", "x_in", [b.input("inp_x", (1, D), "f32")], (1, D), s=1.0)
    side = b.op("SCALE", "side", [x], (1, D), s=0.5)
    return b, x, side


def _rope_inputs(b: GraphBuilder) -> tuple[View, View, View]:
    """The position, KV row index and RoPE frequency table a rope-and-store graph reads."""
    pos = b.input("inp_pos", (1,), "i32")
    idx = b.input("inp_kv_idx", (1,), "i64")
    freqs = b.const("rope_freqs", (8,), "f32")
    b.meta["consts"] = {"rope_freqs": (1e4 ** -(np.arange(8) / 8)).astype(np.float32)}
    return pos, idx, freqs


def mul_mat_add_graph() -> Graph:
    b, x, side = _start("mul-mat-add-bug")
    h = b.op("MUL_MAT", "proj", [b.weight("w", (D, D), "f16"), side], (1, D))
    y = b.op("ADD", "proj_res", [h, x], (1, D))
    b.output("logits", b.op("SCALE", "result_output", [y], (1, D), kind="output", s=1.0))
    return b.build()


def mul_mat_glu_graph() -> Graph:
    b, x, side = _start("mul-mat-glu-bug")
    g = b.op("MUL_MAT", "ffn_gate", [b.weight("wg", (D, D), "f16"), side], (1, D))
    u = b.op("MUL_MAT", "ffn_up", [b.weight("wu", (D, D), "f16"), side], (1, D))
    act = b.op("GLU", "ffn_act", [g, u], (1, D), glu="swiglu")
    b.output("logits", b.op("SCALE", "result_output", [act], (1, D), kind="output", s=1.0))
    return b.build()


def rope_set_rows_graph() -> Graph:
    b, x, side = _start("rope-set-rows-bug")
    pos, idx, freqs = _rope_inputs(b)
    cache = b.cache("cache_k", (4, D), "f16")
    k = b.op("ROPE", "k_rope", [side.reshape((4, 16)), pos, freqs], (4, 16), n_rot=16)
    b.node("SET_ROWS", "k_store", [k.reshape((1, D)), idx], [cache])
    b.output("logits", b.op("SCALE", "result_output", [x], (1, D), kind="output", s=1.0))
    return b.build()


def add_chain_graph() -> Graph:
    b, x, side = _start("add-chain-bug")
    s0 = b.op("ADD", "sum_0", [side, x], (1, D))
    s1 = b.op("ADD", "sum_1", [s0, x], (1, D))
    b.output("logits", b.op("SCALE", "result_output", [s1], (1, D), kind="output", s=1.0))
    return b.build()


def topk_moe_graph() -> Graph:
    b, x, side = _start("topk-moe-bug")
    probs = b.op("SOFT_MAX", "probs", [side], (1, D))
    ids = b.op("ARGSORT_TOP_K", "topk", [probs], (1, 4), dtype="i32", k=4)
    w = b.op("GET_ROWS", "weights", [probs.reshape((D, 1)), ids], (4, 1))
    b.output("logits", b.op("SCALE", "result_output", [w], (4, 1), kind="output", s=1.0))
    return b.build()


def rms_norm_mul_rope_graph() -> Graph:
    """Qwen3's K head norm: rms_norm * w, rotated and stored into the cache."""
    b, x, side = _start("rms-norm-mul-rope-bug")
    pos, idx, freqs = _rope_inputs(b)
    k = rms_norm(b, side.reshape((4, 16)), b.weight("k_norm", (16,), "f32"), 1e-6, "k_normed")
    k = b.op("ROPE", "k_rope", [k, pos, freqs], (4, 16), n_rot=16)
    b.node("SET_ROWS", "k_store", [k.reshape((1, D)), idx], [b.cache("cache_k", (4, D), "f16")])
    b.output("logits", b.op("SCALE", "result_output", [x], (1, D), kind="output", s=1.0))
    return b.build()


def moe_weighted_reduction_graph() -> Graph:
    """The experts' outputs [4, D] (``side``) weighted by the router and summed."""
    b, x, side = _start("moe-weighted-reduction-bug")
    w = b.op("SCALE", "router_w", [b.input("inp_w", (4, 1), "f32")], (4, 1), s=1.0)
    experts = side.reshape((4, D // 4))
    weighted = b.op("MUL", "ffn_moe_weighted", [experts, w], experts.shape)
    out = b.op("SUM_ROWS", "ffn_moe_out", [weighted.permute(1, 0)], (1, D // 4))
    b.output("logits", b.op("SCALE", "result_output", [out], (1, D // 4), kind="output", s=1.0))
    return b.build()


def norm_mat_vec_graph() -> Graph:
    b, x, side = _start("norm-mat-vec-bug")
    normed = rms_norm(b, side, b.weight("w_norm", (D,), "f32"), 1e-6, "proj_norm")
    h = b.op("MUL_MAT", "proj", [b.weight("w", (D, D), "f16"), normed], (1, D))
    b.output("logits", b.op("SCALE", "result_output", [h], (1, D), kind="output", s=1.0))
    return b.build()


def norm_mat_vec_q8_1_graph() -> Graph:
    """norm-mat-vec before a quantised mat-vec: the norm folds into its q8_1 copy."""
    b, x, side = _start("norm-mat-vec-q8_1-bug")
    normed = rms_norm(b, side, b.weight("w_norm", (D,), "f32"), 1e-6, "proj_norm")
    w = b.weight("w", (D, D), "q4_0")
    h = b.op("MUL_MAT", "proj", [w, mat_input(b, w, normed, "proj")], (1, D))
    b.output("logits", b.op("SCALE", "result_output", [h], (1, D), kind="output", s=1.0))
    return b.build()


def qkv_rope_store_graph() -> Graph:
    b, x, side = _start("qkv-rope-store-bug")
    pos, idx, freqs = _rope_inputs(b)
    proj = {r: b.op("MUL_MAT", f"{r}cur", [b.weight(f"w{r.lower()}", (D, D), "f16"), side], (1, D)) for r in "QKV"}
    q = b.op("ROPE", "q_rope", [proj["Q"].reshape((4, 16)), pos, freqs], (4, 16), n_rot=16)
    k = b.op("ROPE", "k_rope", [proj["K"].reshape((4, 16)), pos, freqs], (4, 16), n_rot=16)
    b.node("SET_ROWS", "k_store", [k.reshape((1, D)), idx], [b.cache("cache_k", (4, D), "f16")])
    b.node("SET_ROWS", "v_store", [proj["V"], idx], [b.cache("cache_v", (4, D), "f16")])
    b.output("logits", b.op("SCALE", "result_output", [q.reshape((1, D))], (1, D), kind="output", s=1.0))
    return b.build()


#: bug graph label (a fusion's name, or SEEDED_FUSION's key) -> (graph builder, name of the fused node)
FUSION_GRAPHS: dict[str, tuple[Callable[[], Graph], str]] = {
    "mul-mat-add": (mul_mat_add_graph, "proj_res"),
    "mul-mat-glu": (mul_mat_glu_graph, "ffn_act"),
    "rope-set-rows": (rope_set_rows_graph, "k_store"),
    "add-chain": (add_chain_graph, "sum_1"),
    "topk-moe": (topk_moe_graph, "weights"),
    "rms-norm-mul-rope": (rms_norm_mul_rope_graph, "k_rope"),
    "moe-weighted-reduction": (moe_weighted_reduction_graph, "ffn_moe_out"),
    "norm-mat-vec": (norm_mat_vec_graph, "proj"),
    "norm-mat-vec-q8_1": (norm_mat_vec_q8_1_graph, "proj_q8_1"),
    "qkv-rope-store": (qkv_rope_store_graph, "v_store"),
}


#: bug graphs of a second form of one fusion -> that fusion
SEEDED_FUSION = {"norm-mat-vec-q8_1": "norm-mat-vec"}


def fusion_of(label: str) -> str:
    """The Strategy fusion whose pass fuses the bug graph ``label``."""
    return SEEDED_FUSION.get(label, label)


def fused_plan(label: str, waits: bool) -> Plan:
    """The fused graph of bug graph ``label`` on two streams: ``x_in`` on stream 0 recording
    the fork event 0, ``side`` on stream 1 waiting for it and recording event 1, everything else
    on stream 0, ``result_output`` joining stream 1; the fused node waits for event 1 only when
    ``waits`` (the correct schedule)."""
    from .seeded import hand_plan

    build, fused = FUSION_GRAPHS[label]
    fusion = fusion_of(label)
    graph, removed = PASSES[fusion](build())
    if not removed or graph.node(fused).op == build().node(fused).op:
        raise AssertionError(f"{fusion}: the pass did not fuse its bug graph")
    placed = []
    for n in graph.nodes:
        if n.name == "x_in":
            placed.append((0, (), (0,)))
        elif n.name == "side":
            placed.append((1, (0,), (1,)))
        elif n.name == "result_output" or (waits and n.name == fused):
            placed.append((0, (1,), ()))
        else:
            placed.append((0, (), ()))
    return hand_plan(graph, placed, Strategy(streams="auto", allocator="no-reuse", fusion=frozenset({fusion})))


def stale_events(label: str) -> Callable[[], Plan]:
    """The seeded bug of bug graph ``label``: its fused node placed without the wait its first
    node had."""
    return lambda: fused_plan(label, waits=False)
