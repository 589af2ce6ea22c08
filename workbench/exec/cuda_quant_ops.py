"""Kernel launches of the ops that touch ggml block types (``kernels/mmvq.cu``): llama.cpp's
mmvq path. ``QUANTIZE_Q8_1`` writes the activation as q8_1 blocks, MUL_MAT / MUL_MAT_ID of a
q8_0 / q4_0 / q4_k / mxfp4 weight read those blocks in integer dot products (MUL_MAT_ADD,
MUL_MAT_GLU and MUL_MAT_ID_GLU, llama.cpp's mmvq fusions, in the same kernels' epilogues),
GET_ROWS of a quantised table dequantises the rows, and RMS_NORM_MUL_Q8_1 (the workbench's
norm-mat-vec before quantised mat-vecs) writes a normed row as q8_1 (kernels/norm.cu).
``cuda_ops.bind`` hands every node with a block-typed view here.
"""

from __future__ import annotations

from math import ceil

from ..graph import Node, View
from ..graph.tensor import BLOCK_TYPES
from .cuda_ops import (
    EW_THREADS,
    Addr,
    BindError,
    KernelCall,
    Workspace,
    _ew_grid,
    arg,
    broadcast,
    f32,
    i32,
    like,
    norm_threads,
    rows_first,
)

#: weight block types with a mat-vec and a get-rows kernel in kernels/mmvq.cu
MMVQ_TYPES = ("q8_0", "q4_0", "q4_k", "mxfp4")
#: warps per block of the mat-vec kernels (kernels/mmvq.cu MMVQ_WARPS)
MMVQ_WARPS = 4
MMVQ_THREADS = 32 * MMVQ_WARPS
#: outputs below which 4 warps split each row's blocks (mmvq_split)
MMVQ_SPLIT_BELOW = 1024
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


def mmvq_split(rows: int, K: int) -> tuple[int, int]:
    """(output rows per warp, warps per row) of a mat-vec with ``rows`` outputs in all (rows x
    activation rows or selected experts, x 2 matrices for a GLU) over ``K`` inputs. With the
    weights cold in L2, as in a decode step (benchmarks/mmvq_sweep.py,
    data/bench/mmvq_sweep_h200.json): a short matrix splits each row's blocks over 4 warps
    (split-K), a middling one gives each row a warp (2 over a long K), a tall one 2 rows a warp,
    and an lm_head 4, which keeps the most blocks in flight per lane."""
    if rows < MMVQ_SPLIT_BELOW:
        return 1, 4
    if rows < 4096:
        return 1, 2 if K >= 4096 else 1
    return (2 if rows < 65536 else 4), 1


def _grid(N: int, K: int, cols: int, matrices: int = 1) -> tuple[tuple[int, int], int, int]:
    """(grid, rows per warp, warps per row) of ``cols`` x ``N`` outputs over ``K`` inputs; a GLU's
    warps stream ``matrices`` = 2 rows per output (the kernel takes at most 2 rows per warp there)."""
    rpw, wpr = mmvq_split(N * cols * matrices, K)
    if matrices > 1:
        rpw = min(rpw, 2)
    return (ceil(N * wpr / (MMVQ_WARPS * rpw)), cols), rpw, wpr


def _glu_pair(node: Node, wg: View, wu: View) -> None:
    if wu.shape != wg.shape or wu.dtype != wg.dtype or wu.strides != wg.strides:
        raise BindError(f"{node.name}: gate {wg.describe()} and up {wu.describe()} differ in shape or layout")
    if node.params.get("glu", "swiglu") != "swiglu":
        raise BindError(f"{node.name}: the fused gate/up mat-vec computes swiglu only")
    _blocks(node, wu, "up weight")


def _mul_mat(node: Node, addr: Addr) -> KernelCall:
    """MUL_MAT, MUL_MAT_ADD (mul-mat-add: + the addend, aligned to the result, in the epilogue)
    and MUL_MAT_GLU (mul-mat-glu: gate and up rows, swiglu in the epilogue): warps split as
    ``mmvq_split`` says, grid.y the activation rows."""
    glu = node.op == "MUL_MAT_GLU"
    ws, x = node.srcs[:2 if glu else 1], node.srcs[2 if glu else 1]
    w = ws[0]
    d = node.dst
    qtype = _weight_type(node, w)
    K = w.shape[-1]
    N = w.numel // K
    _blocks(node, w, "weight")
    if glu:
        _glu_pair(node, *ws)
    _q8_1_input(node, x, K)
    M = x.numel // K
    if d.numel != M * N:
        raise BindError(f"{node.name}: [{M}, {K}] x [{N}, {K}]^T does not fill {d.shape}")
    grid, rpw, wpr = _grid(N, K, M, len(ws))
    args = (arg(d, addr, *like(d, (M, N), node.name)), *(arg(v, addr) for v in ws), arg(x, addr), i32(rpw),
            i32(wpr))
    sfx = "_glu" if glu else ""
    if node.op == "MUL_MAT_ADD":
        y = node.srcs[2]
        args, sfx = (*args, arg(y, addr, *like(y, (M, N), node.name))), "_add"
    return KernelCall("mmvq", f"k_mul_mat_vec_q_{qtype}{sfx}", grid, (MMVQ_THREADS,), args, None, node.outs)


def _mul_mat_id(node: Node, addr: Addr) -> KernelCall:
    """MUL_MAT_ID and MUL_MAT_ID_GLU (mul-mat-glu of MoE experts: both experts' rows, swiglu in
    the epilogue): warps split as ``mmvq_split`` says, grid.y the selected experts."""
    glu = node.op == "MUL_MAT_ID_GLU"
    ws, (x, ids) = node.srcs[:2 if glu else 1], node.srcs[2 if glu else 1:]
    w = ws[0]
    d = node.dst
    qtype = _weight_type(node, w)
    if len(w.shape) != 3:
        raise BindError(f"{node.name}: expert weights must be [experts, out, in], got {w.shape}")
    _, N, K = w.shape
    _blocks(node, w, "expert weights")
    if glu:
        _glu_pair(node, *ws)
    _q8_1_input(node, x, K)
    n_ids = ids.numel
    if d.numel != n_ids * N or x.numel // K not in (1, n_ids):
        raise BindError(f"{node.name}: {n_ids} experts x {N} outputs of {x.numel // K} activation rows do not "
                        f"fill {d.shape}")
    grid, rpw, wpr = _grid(N, K, n_ids, len(ws))
    return KernelCall("mmvq", f"k_mul_mat_vec_q_id_{qtype}{'_glu' if glu else ''}", grid, (MMVQ_THREADS,),
                      (arg(d, addr, *like(d, (n_ids, N), node.name)), *(arg(v, addr) for v in ws), arg(x, addr),
                       arg(ids, addr), i32(rpw), i32(wpr)), None, node.outs)


def _q8_1_output(node: Node, x: View, y: View) -> None:
    """``y`` holds ``x``'s rows as q8_1 blocks: the same values per row, whole 32-value blocks."""
    K = x.shape[-1]
    if y.dtype != "q8_1" or y.shape[-1] != K or y.numel != x.numel or K % BLOCK_TYPES["q8_1"][0]:
        raise BindError(f"{node.name}: quantises rows of 32-value blocks into q8_1 of the same shape, got "
                        f"{x.describe()} -> {y.describe()}")
    _blocks(node, y, "q8_1 output")


def _quantize_q8_1(node: Node, addr: Addr) -> KernelCall:
    """QUANTIZE_Q8_1: one thread per value, a warp per q8_1 block."""
    x, y = node.srcs[0], node.dst
    _q8_1_output(node, x, y)
    return KernelCall("mmvq", "k_quantize_q8_1", _ew_grid(x.numel), (EW_THREADS,),
                      (arg(y, addr, *like(y, x.shape, node.name)), arg(x, addr)), None, node.outs)


def _rms_norm_mul_q8_1(node: Node, addr: Addr) -> KernelCall:
    """RMS_NORM_MUL_Q8_1 (norm-mat-vec before quantised mat-vecs): the norm kernel's block per
    row, its result stored as q8_1 blocks (kernels/norm.cu NORM_RMS_MUL_Q8_1)."""
    x, w = node.srcs
    y = node.dst
    _q8_1_output(node, x, y)
    K = x.shape[-1]
    args = (arg(y, addr, *like(y, x.shape, node.name)), arg(x, addr), arg(w, addr, *broadcast(w, x.shape)),
            f32(node.params["eps"]))
    return KernelCall("norm", "k_rms_norm_mul_q8_1", (x.numel // K,), (norm_threads(K, node.name),), args, None,
                      node.outs)


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


_BINDERS = {"MUL_MAT": _mul_mat, "MUL_MAT_ADD": _mul_mat, "MUL_MAT_GLU": _mul_mat, "MUL_MAT_ID": _mul_mat_id,
            "MUL_MAT_ID_GLU": _mul_mat_id, "QUANTIZE_Q8_1": _quantize_q8_1, "GET_ROWS": _get_rows,
            "RMS_NORM_MUL_Q8_1": _rms_norm_mul_q8_1}
#: ops with a kernel for block-typed views
QUANTIZED_OPS = frozenset(_BINDERS)
