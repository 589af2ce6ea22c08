"""The op vocabulary (ggml op names) with what each op costs.

An op's reads are its source views and its write is its destination view, so byte ranges come
from the views. Cost is declared here once (flops and bytes moved) and used by the simulator's
roofline model, the bandwidth floor of the benchmarks and the model summaries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .graph import Node
    from .tensor import View


@dataclass(frozen=True)
class OpInfo:
    """Static facts about an op: its kernel family (PDL placement and calibration are per
    family) and its cost functions."""

    name: str
    family: str
    flops: Callable[[Node], float]
    bytes: Callable[[Node], float]


def _io_bytes(node: Node) -> float:
    return float(sum(s.nbytes for s in node.srcs) + node.dst.nbytes)


def _elementwise_flops(k: float) -> Callable[[Node], float]:
    return lambda n: k * n.dst.numel


def _mul_mat_flops(n: Node) -> float:
    w = n.srcs[0]
    return 2.0 * w.numel * max(1, n.srcs[1].numel // w.shape[-1])


def _mul_mat_id_fraction(n: Node) -> float:
    experts = n.srcs[0].shape[0]
    used = n.srcs[2].numel
    return min(1.0, used / experts)


def _mul_mat_id_flops(n: Node) -> float:
    w = n.srcs[0]
    return 2.0 * (w.numel // w.shape[0]) * n.srcs[2].numel


def _mul_mat_id_bytes(n: Node) -> float:
    return n.srcs[0].nbytes * _mul_mat_id_fraction(n) + n.srcs[1].nbytes + n.dst.nbytes


def _add_id_bytes(n: Node) -> float:
    return n.srcs[0].nbytes + n.srcs[1].nbytes * _mul_mat_id_fraction_bias(n) + n.dst.nbytes


def _mul_mat_id_fraction_bias(n: Node) -> float:
    return min(1.0, n.srcs[2].numel / n.srcs[1].shape[0])


def _get_rows_bytes(n: Node) -> float:
    # reads only the selected rows of the table (in its storage type) and writes them as f32
    table = n.srcs[0]
    return n.dst.nbytes * table.nbytes / (table.numel * 4) + n.dst.nbytes + n.srcs[1].nbytes


def _set_rows_bytes(n: Node) -> float:
    # srcs = (rows, row indices): reads the rows, writes one cache row per index
    return n.srcs[0].nbytes + n.srcs[0].numel * n.dst.itemsize + n.srcs[1].nbytes


def _mul_mat_add_flops(n: Node) -> float:
    # srcs = (w, x, addend): the mat-vec plus one add per output
    return _mul_mat_flops(n) + n.dst.numel


def _mul_mat_glu_flops(n: Node) -> float:
    # srcs = (w_gate, w_up, x): two mat-vecs, then silu(gate) * up per output (as GLU)
    w = n.srcs[0]
    rows = max(1, n.srcs[2].numel // w.shape[-1])
    return 2.0 * 2.0 * w.numel * rows + 6.0 * n.dst.numel


def _mul_mat_id_glu_flops(n: Node) -> float:
    # srcs = (w_gate, w_up, x, ids): two expert mat-vecs per selected expert, then the GLU
    w = n.srcs[0]
    return 2.0 * 2.0 * (w.numel // w.shape[0]) * n.srcs[3].numel + 6.0 * n.dst.numel


def _mul_mat_id_glu_bytes(n: Node) -> float:
    # the selected experts' rows of both weights, the activation, the ids and the result
    used = min(1.0, n.srcs[3].numel / n.srcs[0].shape[0])
    return (n.srcs[0].nbytes + n.srcs[1].nbytes) * used + n.srcs[2].nbytes + n.srcs[3].nbytes + n.dst.nbytes


def _rope_set_rows_bytes(n: Node) -> float:
    # srcs = (x, pos, freqs, row indices): reads x, writes x's elements as cache rows
    x = n.srcs[0]
    return float(sum(s.nbytes for s in n.srcs) + x.numel * n.dst.itemsize)


def _norm_rope_bytes(n: Node) -> float:
    # srcs = (x, w, pos, freqs[, row indices]): every source once, x's elements written (as cache
    # rows in the cache's type when the node stores them)
    return float(sum(s.nbytes for s in n.srcs) + n.srcs[0].numel * n.dst.itemsize)


def _mul_sum_rows_bytes(n: Node) -> float:
    # srcs = (experts [k, d], weights [k, 1]): both read once, the weighted sum [1, d] written
    return float(n.srcs[0].nbytes + _unique_bytes(n.srcs[1]) + n.dst.nbytes)


def _norm_mat_vec_flops(n: Node) -> float:
    # srcs = (w..., x, w_norm): the mat-vec(s) plus sum(x^2), the scale and the weight per element
    # of x, recomputed by every block of the fused kernel (counted once here: the DRAM-side view)
    mats = n.srcs[:-2]
    return sum(2.0 * w.numel for w in mats) + 4.0 * n.srcs[-2].numel + (6.0 * n.dst.numel if len(mats) == 2 else 0.0)


def _qkv_flops(n: Node) -> float:
    # srcs = (wq, wk, wv, x, pos, freqs, idx[, w_norm]): three mat-vecs, the rotation of q and k
    # (6 per element, as ROPE), the folded norm (4 per element of x)
    wq, wk, wv = n.srcs[:3]
    norm = 4.0 * n.srcs[3].numel if len(n.srcs) > 7 else 0.0
    return 2.0 * (wq.numel + wk.numel + wv.numel) + 6.0 * (n.outs[0].numel + wk.numel // wk.shape[-1]) + norm


def _qkv_bytes(n: Node) -> float:
    # every source once, q written, and one cache row each of k and v (their elements, in the cache's type)
    wk, wv = n.srcs[1], n.srcs[2]
    rows = (wk.numel // wk.shape[-1]) * n.outs[1].itemsize + (wv.numel // wv.shape[-1]) * n.outs[2].itemsize
    return float(sum(s.nbytes for s in n.srcs) + n.outs[0].nbytes + rows)


def _attn_flops(n: Node) -> float:
    if len(n.srcs) == 1:  # llama.cpp's merge pass of a split attention (cost.ATTN_COMBINE_PASS)
        return 4.0 * n.srcs[0].numel  # rescale each split's partial row by its max and sum, and add
    q, k = n.srcs[0], n.srcs[1]
    n_head, hd = q.shape[-2], q.shape[-1]
    return 4.0 * n_head * hd * k.shape[0]


def _unique_bytes(v: View) -> int:
    """Bytes a view really covers (a stride-0 broadcast view reads its bytes once)."""
    return sum(hi - lo for lo, hi in v.intervals())


def _multi_out_bytes(n: Node) -> float:
    """Sources read once plus every output (the GDN ops also write a state snapshot)."""
    return float(sum(_unique_bytes(s) for s in n.srcs) + sum(o.nbytes for o in n.outs))


def _gdn_flops(n: Node) -> float:
    # srcs = (q, k, v, g, beta, state [H_v, d_k, d_v]): per state element decay (1),
    # S^T k (2), rank-1 update (2) and S^T q (2)
    state = n.srcs[5]
    return 7.0 * state.numel


def _conv_flops(n: Node) -> float:
    # srcs = (conv state, x, kernel [channels, d_conv]): one multiply-add per kernel tap
    return 2.0 * n.srcs[2].numel


OPS: dict[str, OpInfo] = {}


def _op(name: str, family: str, flops: Callable[[Node], float], nbytes: Callable[[Node], float] = _io_bytes):
    OPS[name] = OpInfo(name, family, flops, nbytes)


_op("GET_ROWS", "get_rows", lambda n: 0.0, _get_rows_bytes)
_op("RMS_NORM", "norm", _elementwise_flops(3))
_op("RMS_NORM_MUL", "norm", _elementwise_flops(4))  # fused rms_norm + mul (rms-norm-mul rewrite)
_op("RMS_NORM_MUL_ADD", "norm", _elementwise_flops(5))  # + the residual add (rms-norm-mul rewrite)
_op("L2_NORM", "norm", _elementwise_flops(3))
_op("NORM_GATED", "norm", _elementwise_flops(8))  # rms_norm(x) * w * silu(z) of the GDN output
_op("MUL", "elementwise", _elementwise_flops(1))
_op("ADD", "elementwise", _elementwise_flops(1))
_op("ADD_ID", "elementwise", _elementwise_flops(1), _add_id_bytes)
_op("DIV", "elementwise", _elementwise_flops(1))
_op("SCALE", "elementwise", _elementwise_flops(1))
_op("SIGMOID", "elementwise", _elementwise_flops(4))
_op("SOFTPLUS", "elementwise", _elementwise_flops(4))
_op("SUM_ROWS", "elementwise", lambda n: float(n.srcs[0].numel))
_op("GLU", "elementwise", _elementwise_flops(6))
_op("SOFT_MAX", "softmax", _elementwise_flops(5))
_op("ARGSORT_TOP_K", "softmax", lambda n: float(n.srcs[0].numel * 8))
_op("ROPE", "rope", _elementwise_flops(6))
_op("MUL_MAT", "mul_mat", _mul_mat_flops)
_op("MUL_MAT_ID", "mul_mat", _mul_mat_id_flops, _mul_mat_id_bytes)
_op("SET_ROWS", "set_rows", lambda n: 0.0, _set_rows_bytes)
# fused ops of the Strategy fusions (workbench/strategy/fusion.py), named after llama.cpp's
_op("MUL_MAT_ADD", "mul_mat", _mul_mat_add_flops)          # mul-mat-add: mat-vec + bias / residual
_op("MUL_MAT_GLU", "mul_mat", _mul_mat_glu_flops)          # mul-mat-glu: gate and up mat-vecs + swiglu
_op("MUL_MAT_ID_GLU", "mul_mat", _mul_mat_id_glu_flops, _mul_mat_id_glu_bytes)  # mul-mat-glu of MoE experts
_op("ROPE_SET_ROWS", "rope", lambda n: 6.0 * n.srcs[0].numel, _rope_set_rows_bytes)  # rope-set-rows: into the cache
_op("TOPK_MOE", "softmax", lambda n: float(n.srcs[0].numel * 13), _multi_out_bytes)  # topk-moe fusion
_op("ADD_CHAIN", "elementwise", lambda n: float(n.dst.numel * (len(n.srcs) - 1)))  # add-chain: a + b + c ...
_op("RMS_NORM_MUL_ROPE", "norm", lambda n: 10.0 * n.srcs[0].numel, _norm_rope_bytes)  # rms-norm-mul-rope (+ set_rows)
_op("MUL_SUM_ROWS", "elementwise", lambda n: 2.0 * n.srcs[0].numel, _mul_sum_rows_bytes)  # moe-weighted-reduction
# the workbench's own fusions (workbench/strategy/fusion_ours.py): llama.cpp has no kernel for them
_op("RMS_NORM_MUL_MAT", "mul_mat", _norm_mat_vec_flops)      # norm-mat-vec: the norm in the mat-vec
_op("RMS_NORM_MUL_MAT_GLU", "mul_mat", _norm_mat_vec_flops)  # norm-mat-vec of a gate/up mat-vec
_op("QKV_ROPE_SET_ROWS", "mul_mat", _qkv_flops, _qkv_bytes)  # qkv-rope-store: Q/K/V + RoPE + cache rows
_op("RMS_NORM_MUL_Q8_1", "norm", _elementwise_flops(7))      # norm-mat-vec of quantised mat-vecs: one q8_1 copy
_op("QUANTIZE_Q8_1", "elementwise", _elementwise_flops(3))  # |x| max, scale, round per value
_op("FLASH_ATTN_EXT", "attn", _attn_flops)
_op("CPY", "copy", lambda n: 0.0)
_op("SILU", "elementwise", _elementwise_flops(4))
_op("SSM_CONV", "gdn", _conv_flops, _multi_out_bytes)
_op("GATED_DELTA_NET", "gdn", _gdn_flops, _multi_out_bytes)

KERNEL_FAMILIES: tuple[str, ...] = tuple(sorted({o.family for o in OPS.values()}))


def op_info(name: str) -> OpInfo:
    """Facts for a ggml op name; a clear error for an unknown one."""
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") from None


def numel(shape: tuple[int, ...]) -> int:
    return prod(shape)
