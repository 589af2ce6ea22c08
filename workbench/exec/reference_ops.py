"""NumPy twins of every op (float32 compute): the numerical truth the kernels are tested against.

Each function takes the node and the Memory and writes the node's outputs, reading sources
through their views, so strided, aliased and redirected (copy-eliminated) views behave exactly
as the graph says.
"""

from __future__ import annotations

import numpy as np

from ..graph import Node, View
from . import (
    reference_fused,  # noqa: F401  (registers the fused ops of the Strategy fusions)
    reference_gdn,  # noqa: F401  (registers the gated-delta-net ops in NUMPY_OPS)
)
from .memory import Memory, decode
from .reference_base import NUMPY_OPS, _out, _src, numpy_op, rms_norm, sigmoid, silu, softmax

__all__ = ["NUMPY_OPS", "attend", "rms_norm", "rope", "sigmoid", "silu", "softmax"]


@numpy_op("GET_ROWS")
def get_rows(node: Node, mem: Memory) -> None:
    table, ids = node.srcs
    idx = mem.read(ids).astype(np.int64).reshape(-1)
    _out(node, mem, decode(mem.raw(table)[idx], table.dtype))


@numpy_op("RMS_NORM")
def op_rms_norm(node: Node, mem: Memory) -> None:
    _out(node, mem, rms_norm(_src(node, mem, 0), node.params["eps"]))


@numpy_op("RMS_NORM_MUL")
def op_rms_norm_mul(node: Node, mem: Memory) -> None:
    _out(node, mem, rms_norm(_src(node, mem, 0), node.params["eps"]) * _src(node, mem, 1))


@numpy_op("MUL")
def op_mul(node: Node, mem: Memory) -> None:
    _out(node, mem, _src(node, mem, 0) * _src(node, mem, 1))


@numpy_op("ADD")
def op_add(node: Node, mem: Memory) -> None:
    _out(node, mem, _src(node, mem, 0) + _src(node, mem, 1))


@numpy_op("DIV")
def op_div(node: Node, mem: Memory) -> None:
    _out(node, mem, _src(node, mem, 0) / _src(node, mem, 1))


@numpy_op("SCALE")
def op_scale(node: Node, mem: Memory) -> None:
    _out(node, mem, _src(node, mem, 0) * np.float32(node.params["s"]))


@numpy_op("SIGMOID")
def op_sigmoid(node: Node, mem: Memory) -> None:
    _out(node, mem, sigmoid(_src(node, mem, 0)))


@numpy_op("SOFTPLUS")
def op_softplus(node: Node, mem: Memory) -> None:
    x = _src(node, mem, 0)
    _out(node, mem, np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))))


@numpy_op("SUM_ROWS")
def op_sum_rows(node: Node, mem: Memory) -> None:
    _out(node, mem, _src(node, mem, 0).sum(axis=-1))


@numpy_op("ADD_ID")
def op_add_id(node: Node, mem: Memory) -> None:
    x, bias = _src(node, mem, 0), _src(node, mem, 1)
    ids = mem.read(node.srcs[2]).astype(np.int64).reshape(-1)
    _out(node, mem, x + bias[ids])


@numpy_op("GLU")
def op_glu(node: Node, mem: Memory) -> None:
    g, u = _src(node, mem, 0), _src(node, mem, 1)
    kind = node.params.get("glu", "swiglu")
    if kind == "swiglu":
        out = silu(g) * u
    elif kind == "swiglu_oai":
        alpha, limit = node.params["alpha"], node.params["limit"]
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
        out = (u + 1.0) * (g * sigmoid(g * alpha))
    else:
        raise ValueError(f"{node.name}: unknown GLU kind {kind!r}")
    _out(node, mem, out)


@numpy_op("SOFT_MAX")
def op_soft_max(node: Node, mem: Memory) -> None:
    _out(node, mem, softmax(_src(node, mem, 0)))


@numpy_op("ARGSORT_TOP_K")
def op_top_k(node: Node, mem: Memory) -> None:
    x = _src(node, mem, 0).reshape(-1)
    k = node.params["k"]
    order = np.argsort(-x, kind="stable")[:k]
    _out(node, mem, order.astype(np.int32))


def rope(x: np.ndarray, pos: int, inv_freq: np.ndarray, n_rot: int, attn_factor: float) -> np.ndarray:
    """NeoX-style rotation (HF ``rotate_half``) of the first ``n_rot`` dims of each head."""
    ang = np.float32(pos) * inv_freq.astype(np.float32)
    cos = (np.cos(ang) * attn_factor).astype(np.float32)
    sin = (np.sin(ang) * attn_factor).astype(np.float32)
    half = n_rot // 2
    out = x.copy()
    x1, x2 = x[..., :half], x[..., half:n_rot]
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:n_rot] = x2 * cos + x1 * sin
    return out


@numpy_op("ROPE")
def op_rope(node: Node, mem: Memory) -> None:
    x = _src(node, mem, 0)
    pos = int(mem.read(node.srcs[1]).reshape(-1)[0])
    inv = _src(node, mem, 2)
    _out(node, mem, rope(x, pos, inv, node.params["n_rot"], node.params.get("attn_factor", 1.0)))


@numpy_op("MUL_MAT")
def op_mul_mat(node: Node, mem: Memory) -> None:
    w, x = _src(node, mem, 0), _src(node, mem, 1)
    # an N-d weight view (rows picked out of a fused HF tensor) flattens to [out, in]
    _out(node, mem, x @ w.reshape(-1, w.shape[-1]).T)


@numpy_op("MUL_MAT_ID")
def op_mul_mat_id(node: Node, mem: Memory) -> None:
    wv = node.srcs[0]
    ids = mem.read(node.srcs[2]).astype(np.int64).reshape(-1)
    x = _src(node, mem, 1).reshape(-1, wv.shape[-1])
    out = np.empty((len(ids), wv.shape[1]), np.float32)
    raw = mem.raw(wv)
    for i, e in enumerate(ids):
        w = decode(raw[e], wv.dtype)
        out[i] = w @ x[i if x.shape[0] > 1 else 0]
    _out(node, mem, out)


@numpy_op("QUANTIZE_Q8_1")
def op_quantize_q8_1(node: Node, mem: Memory) -> None:
    """The activation as q8_1 blocks (Memory.write quantises as CUDA's quantize_q8_1); the
    mat-mul reading them sees ``q * d``, the values llama.cpp's integer dot products multiply."""
    _out(node, mem, _src(node, mem, 0))


def store_rows(mem: Memory, cache: View, idx_view: View, rows: np.ndarray) -> None:
    """Row ``k`` of ``rows`` (flattened to one row per index) into row ``idx[k]`` of ``cache``."""
    idx = mem.read(idx_view).astype(np.int64).reshape(-1)
    for r, i in zip(rows.reshape(len(idx), -1), idx):
        mem.write(cache.slice(0, int(i), int(i) + 1), r.reshape(1, -1))


@numpy_op("SET_ROWS")
def op_set_rows(node: Node, mem: Memory) -> None:
    store_rows(mem, node.outs[0], node.srcs[1], _src(node, mem, 0))


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
           sinks: np.ndarray | None = None) -> np.ndarray:
    """Decode attention of q [H, d] over k/v [n_kv, H_kv, d] with an additive mask [n_kv]."""
    n_head, hd = q.shape
    rep = n_head // k.shape[1]
    kk = np.repeat(k, rep, axis=1).transpose(1, 0, 2)  # [H, n_kv, d]
    vv = np.repeat(v, rep, axis=1).transpose(1, 0, 2)
    s = np.einsum("hd,hnd->hn", q, kk) * np.float32(scale) + mask[None, :]
    if sinks is not None:
        s = np.concatenate([s, sinks.reshape(n_head, 1)], axis=1)
    p = softmax(s)
    if sinks is not None:
        p = p[:, :-1]
    return np.einsum("hn,hnd->hd", p, vv)


@numpy_op("FLASH_ATTN_EXT")
def op_attn(node: Node, mem: Memory) -> None:
    q, k, v, mask = (_src(node, mem, i) for i in range(4))
    sinks = _src(node, mem, 4) if len(node.srcs) > 4 else None
    _out(node, mem, attend(q, k, v, mask, node.params["scale"], sinks))


@numpy_op("CPY")
def op_cpy(node: Node, mem: Memory) -> None:
    _out(node, mem, _src(node, mem, 0))
