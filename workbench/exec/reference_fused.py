"""NumPy twins of the fused ops of the Strategy fusions (``strategy/fusion_chains.py``).

Each computes exactly what the nodes it replaces computed, in the same order of float32
operations, so a fused Plan's reference logits equal the unfused ones (the tests compare them).
"""

from __future__ import annotations

import numpy as np

from ..graph import Node
from .memory import Memory, decode
from .reference_base import _out, _src, numpy_op, rms_norm, silu, softmax


def _mat_vec(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    # as MUL_MAT's twin: an N-d weight view flattens to [out, in]
    return x @ w.reshape(-1, w.shape[-1]).T


@numpy_op("RMS_NORM_MUL_ADD")
def op_rms_norm_mul_add(node: Node, mem: Memory) -> None:
    _out(node, mem, rms_norm(_src(node, mem, 0), node.params["eps"]) * _src(node, mem, 1) + _src(node, mem, 2))


@numpy_op("MUL_MAT_ADD")
def op_mul_mat_add(node: Node, mem: Memory) -> None:
    w, x, y = (_src(node, mem, i) for i in range(3))
    _out(node, mem, _mat_vec(w, x).reshape(y.shape) + y)


@numpy_op("MUL_MAT_GLU")
def op_mul_mat_glu(node: Node, mem: Memory) -> None:
    wg, wu, x = (_src(node, mem, i) for i in range(3))
    kind = node.params.get("glu", "swiglu")
    if kind != "swiglu":
        raise ValueError(f"{node.name}: MUL_MAT_GLU computes swiglu, not {kind!r}")
    _out(node, mem, silu(_mat_vec(wg, x)) * _mat_vec(wu, x))


@numpy_op("MUL_MAT_ID_GLU")
def op_mul_mat_id_glu(node: Node, mem: Memory) -> None:
    """silu(gate) * up per selected expert, each product as MUL_MAT_ID's twin computes it."""
    wg, wu = node.srcs[:2]
    ids = mem.read(node.srcs[3]).astype(np.int64).reshape(-1)
    x = _src(node, mem, 2).reshape(-1, wg.shape[-1])
    gate = np.empty((len(ids), wg.shape[1]), np.float32)
    up = np.empty_like(gate)
    rg, ru = mem.raw(wg), mem.raw(wu)
    for i, e in enumerate(ids):
        xi = x[i if x.shape[0] > 1 else 0]
        gate[i] = decode(rg[e], wg.dtype) @ xi
        up[i] = decode(ru[e], wu.dtype) @ xi
    _out(node, mem, silu(gate) * up)


@numpy_op("ROPE_SET_ROWS")
def op_rope_set_rows(node: Node, mem: Memory) -> None:
    from .reference_ops import rope, store_rows

    x = _src(node, mem, 0)
    pos = int(mem.read(node.srcs[1]).reshape(-1)[0])
    rot = rope(x, pos, _src(node, mem, 2), node.params["n_rot"], node.params.get("attn_factor", 1.0))
    store_rows(mem, node.outs[0], node.srcs[3], rot)


@numpy_op("RMS_NORM_MUL_ROPE")
def op_rms_norm_mul_rope(node: Node, mem: Memory) -> None:
    """RMS_NORM then MUL then ROPE of each row, stored as SET_ROWS stores when the node has the
    row index (source 4)."""
    from .reference_ops import rope, store_rows

    normed = rms_norm(_src(node, mem, 0), node.params["eps"]) * _src(node, mem, 1)
    pos = int(mem.read(node.srcs[2]).reshape(-1)[0])
    rot = rope(normed, pos, _src(node, mem, 3), node.params["n_rot"], node.params.get("attn_factor", 1.0))
    if len(node.srcs) == 5:
        store_rows(mem, node.outs[0], node.srcs[4], rot)
    else:
        _out(node, mem, rot)


@numpy_op("MUL_SUM_ROWS")
def op_mul_sum_rows(node: Node, mem: Memory) -> None:
    """MUL of the experts' rows by their weights, then SUM_ROWS of the transposed product."""
    _out(node, mem, (_src(node, mem, 0) * _src(node, mem, 1)).T.sum(axis=-1))


def _normed(node: Node, mem: Memory, slot: int) -> np.ndarray:
    """Source ``slot`` (x) as the folded ``rms_norm(x) * w`` of norm-mat-vec (w the last source),
    computed as RMS_NORM then MUL did; x itself where no norm was folded in."""
    x = _src(node, mem, slot)
    if "eps" not in node.params:
        return x
    return rms_norm(x, node.params["eps"]) * _src(node, mem, len(node.srcs) - 1)


@numpy_op("RMS_NORM_MUL_Q8_1")
def op_rms_norm_mul_q8_1(node: Node, mem: Memory) -> None:
    """RMS_NORM then MUL, stored as q8_1 as QUANTIZE_Q8_1 stores (Memory.write quantises)."""
    _out(node, mem, rms_norm(_src(node, mem, 0), node.params["eps"]) * _src(node, mem, 1))


@numpy_op("RMS_NORM_MUL_MAT")
def op_rms_norm_mul_mat(node: Node, mem: Memory) -> None:
    _out(node, mem, _mat_vec(_src(node, mem, 0), _normed(node, mem, 1)))


@numpy_op("RMS_NORM_MUL_MAT_GLU")
def op_rms_norm_mul_mat_glu(node: Node, mem: Memory) -> None:
    wg, wu = _src(node, mem, 0), _src(node, mem, 1)
    x = _normed(node, mem, 2)
    _out(node, mem, silu(_mat_vec(wg, x)) * _mat_vec(wu, x))


@numpy_op("QKV_ROPE_SET_ROWS")
def op_qkv_rope_set_rows(node: Node, mem: Memory) -> None:
    """outs = (q rotated, k cache, v cache): the three mat-vecs of one (normed) x (+ their biases,
    sources 7..9, as MUL_MAT_ADD adds them), q and k rotated per head of ``head_dim`` as ROPE does,
    k and v stored as SET_ROWS does."""
    from .reference_ops import rope, store_rows

    x = _normed(node, mem, 3)
    pos = int(mem.read(node.srcs[4]).reshape(-1)[0])
    freqs, hd = _src(node, mem, 5), node.params["head_dim"]
    n_rot, factor = node.params["n_rot"], node.params.get("attn_factor", 1.0)
    q, k, v = (_mat_vec(_src(node, mem, i), x) for i in range(3))
    if node.params.get("bias"):
        q, k, v = (p.reshape(b.shape) + b for p, b in zip((q, k, v), (_src(node, mem, 7 + i) for i in range(3))))
    _out(node, mem, rope(q.reshape(-1, hd), pos, freqs, n_rot, factor), 0)
    store_rows(mem, node.outs[1], node.srcs[6], rope(k.reshape(-1, hd), pos, freqs, n_rot, factor))
    store_rows(mem, node.outs[2], node.srcs[6], v)


@numpy_op("ADD_CHAIN")
def op_add_chain(node: Node, mem: Memory) -> None:
    total = _src(node, mem, 0) + _src(node, mem, 1)
    for i in range(2, len(node.srcs)):
        total = total + _src(node, mem, i)
    _out(node, mem, total)


@numpy_op("TOPK_MOE")
def op_topk_moe(node: Node, mem: Memory) -> None:
    """outs = (weights, ids): the router chain's float32 steps in order (softmax, stable top-k,
    gather, softmax of the chosen for ``softmax_weight``, renormalisation for ``norm``)."""
    k = node.params["k"]
    x = _src(node, mem, 0)
    probs = softmax(x) if node.params["gating"] == "softmax" else x
    flat = probs.reshape(-1)
    ids = np.argsort(-flat, kind="stable")[:k]
    w = flat[ids].reshape(1, k)
    if node.params["gating"] == "softmax_weight":
        w = softmax(w)
    if node.params["norm"]:
        w = w / w.sum(axis=-1)
    _out(node, mem, w, 0)
    _out(node, mem, ids.astype(np.int32), 1)
