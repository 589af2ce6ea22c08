"""Kernel launches of the ops that touch ggml block types (``kernels/mmvq.cu``): llama.cpp's
mmvq path. ``QUANTIZE_Q8_1`` writes the activation as q8_1 blocks, MUL_MAT / MUL_MAT_ID of a
q8_0 / q4_0 / q4_k / mxfp4 weight read those blocks in integer dot products, and GET_ROWS of a
quantised table dequantises the rows. ``cuda_ops.bind`` hands every node with a block-typed view
here. The fused ops never see block types: the fusion passes leave quantised mat-vecs alone
(``strategy/fusion_chains.py``), as they have no fused twin.
"""

from __future__ import annotations

from ..graph import Node, View
from ..graph.tensor import BLOCK_TYPES
from .cuda_ops import EW_THREADS, Addr, BindError, KernelCall, Workspace, _ew_grid, arg, like, rows_first

#: weight block types with a mat-vec and a get-rows kernel in kernels/mmvq.cu
MMVQ_TYPES = ("q8_0", "q4_0", "q4_k", "mxfp4")
#: threads per block of the mat-vec kernels (kernels/mmvq.cu MMVQ_WARPS warps, one output row each)
MMVQ_THREADS = 128
#: byte alignment the kernels' 32-bit loads of a block type's quants need (its blocks' alignment)
LOAD_ALIGN = {"q8_0": 2, "q4_0": 2, "mxfp4": 1, "q4_k": 4, "q8_1": 4}


def bind_quantized(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """The kernel launch of a node with a block-typed view; a BindError names what is missing."""
    fn = _BINDERS.get(node.op)
    if fn is None:
        kinds = sorted({v.dtype for v in (*node.srcs, *node.outs) if v.dtype in BLOCK_TYPES})
        raise BindError(f"{node.name}: {node.op} on {'/'.join(kinds)} blocks has no cuda kernel (the quantised ops "
                        f"are {', '.join(sorted(_BINDERS))}); run it with --backend reference or sim")
    return fn(node, addr)


def _weight_type(node: Node, w: View) -> str:
    if w.dtype not in MMVQ_TYPES:
        raise BindError(f"{node.name}: {w.dtype} weights have no cuda mat-vec (kernels/mmvq.cu has "
                        f"{', '.join(MMVQ_TYPES)}); re-quantise the model or run --backend reference")
    return w.dtype


def _blocks(node: Node, v: View, what: str) -> None:
    """``v``'s blocks lie back to back along its rows and as aligned as the kernel's loads need."""
    align = LOAD_ALIGN[v.dtype]
    if v.strides[-1] != v.itemsize or v.offset % align or any(s % align for s in v.strides[:-1]):
        raise BindError(f"{node.name}: {what} {v.describe()} needs contiguous {v.dtype} blocks along its rows, "
                        f"{align}-byte aligned (strides {v.strides}, offset {v.offset})")


def _q8_1_input(node: Node, x: View, K: int) -> None:
    if x.dtype != "q8_1" or x.shape[-1] != K:
        raise BindError(f"{node.name}: the activation must be q8_1 rows of {K} values (a QUANTIZE_Q8_1 node's "
                        f"output), got {x.describe()}")
    _blocks(node, x, "activation")


def _mul_mat(node: Node, addr: Addr) -> KernelCall:
    """MUL_MAT: one block per (output row, activation row)."""
    w, x = node.srcs[0], node.srcs[1]
    d = node.dst
    qtype = _weight_type(node, w)
    K = w.shape[-1]
    N = w.numel // K
    _blocks(node, w, "weight")
    _q8_1_input(node, x, K)
    M = x.numel // K
    if d.numel != M * N:
        raise BindError(f"{node.name}: [{M}, {K}] x [{N}, {K}]^T does not fill {d.shape}")
    return KernelCall("mmvq", f"k_mul_mat_vec_q_{qtype}", (N, M), (MMVQ_THREADS,),
                      (arg(d, addr, *like(d, (M, N), node.name)), arg(w, addr), arg(x, addr)), None, node.outs)


def _mul_mat_id(node: Node, addr: Addr) -> KernelCall:
    """MUL_MAT_ID: one block per (output row, selected expert)."""
    w, x, ids = node.srcs
    d = node.dst
    qtype = _weight_type(node, w)
    if len(w.shape) != 3:
        raise BindError(f"{node.name}: expert weights must be [experts, out, in], got {w.shape}")
    _, N, K = w.shape
    _blocks(node, w, "expert weights")
    _q8_1_input(node, x, K)
    n_ids = ids.numel
    if d.numel != n_ids * N or x.numel // K not in (1, n_ids):
        raise BindError(f"{node.name}: {n_ids} experts x {N} outputs of {x.numel // K} activation rows do not "
                        f"fill {d.shape}")
    return KernelCall("mmvq", f"k_mul_mat_vec_q_id_{qtype}", (N, n_ids), (MMVQ_THREADS,),
                      (arg(d, addr, *like(d, (n_ids, N), node.name)), arg(w, addr), arg(x, addr), arg(ids, addr)),
                      None, node.outs)


def _quantize_q8_1(node: Node, addr: Addr) -> KernelCall:
    """QUANTIZE_Q8_1: one thread per value, a warp per q8_1 block."""
    x, y = node.srcs[0], node.dst
    K = x.shape[-1]
    if y.dtype != "q8_1" or y.shape[-1] != K or y.numel != x.numel or K % BLOCK_TYPES["q8_1"][0]:
        raise BindError(f"{node.name}: quantises rows of 32-value blocks into q8_1 of the same shape, got "
                        f"{x.describe()} -> {y.describe()}")
    _blocks(node, y, "q8_1 output")
    return KernelCall("mmvq", "k_quantize_q8_1", _ew_grid(x.numel), (EW_THREADS,),
                      (arg(y, addr, *like(y, x.shape, node.name)), arg(x, addr)), None, node.outs)


def _get_rows(node: Node, addr: Addr) -> KernelCall:
    """GET_ROWS of a quantised [rows, K] table (token embeddings): one thread per value."""
    table, ids = node.srcs
    d = node.dst
    qtype = _weight_type(node, table)
    if len(table.shape) != 2:
        raise BindError(f"{node.name}: a quantised table must be [rows, values], got {table.shape}")
    _blocks(node, table, "table")
    K = table.shape[-1]
    if d.numel != ids.numel * K:
        raise BindError(f"{node.name}: {ids.numel} rows of {table.shape} do not fill {d.shape}")
    return KernelCall("mmvq", f"k_get_rows_{qtype}", _ew_grid(d.numel), (EW_THREADS,),
                      (arg(d, addr), rows_first(table, addr), arg(ids, addr)), None, node.outs)


_BINDERS = {"MUL_MAT": _mul_mat, "MUL_MAT_ID": _mul_mat_id, "QUANTIZE_Q8_1": _quantize_q8_1, "GET_ROWS": _get_rows}
#: ops with a kernel for block-typed views
QUANTIZED_OPS = frozenset(_BINDERS)
