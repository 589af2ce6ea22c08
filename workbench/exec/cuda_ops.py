"""Each graph op as a kernel launch: which kernel of ``kernels/*.cu`` (or of
``kernels/numba_kernels.py``), its grid and block, and its arguments.

A binding reads only the node's views (through ``addr``, the executor's device address of a
view) so every offset and stride the Plan's graph carries (arena placement, copy-eliminated
destinations, strided q/k/v splits, stride-0 broadcasts) reaches the kernel unchanged. Pure
Python: the CPU tests check the bindings of every family's graph without a GPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from math import ceil, prod

import numpy as np

from ..graph import Node, View, is_quantized
from .kernels import Arg

#: threads per block of the one-thread-per-element kernels
EW_THREADS = 256
#: warps per block of the mat-vec kernels (kernels/mul_mat.cu MMV_WARPS)
MMV_WARPS = 8
#: output rows from which MUL_MAT takes the row-streaming mat-vec kernel: it was 1.16-1.27x the
#: block kernel at N = 2880 and 4096 and 0.84-0.97x at N = 2048 (benchmarks/kernel_bench.py,
#: data/bench/kernels_h200.md)
MMV_ROWS_MIN = 2880
#: rows x columns below which the block mat-vec gives each row 2 warps (_mmv_splits)
MMV_SPLIT_BELOW = 8192
#: (rows, K) of mat-vecs at or past MMV_ROWS_MIN rows that take the block kernel all the same:
#: llama-3.1-8b's down projection, faster there in whole decode steps where Qwen3-8B's (K = 12288)
#: is slower (benchmarks/grid_ab.py --variants rows / head on an H200,
#: data/bench/grid_ab_rows_h200.md). Measured per shape, so a table and not a rule.
MMV_BLOCK_SHAPES = frozenset({(4096, 14336)})
#: (rows, K) of the lm_heads whose fused norm kernel keeps MMV_HEAD_UNROLL loads in flight a lane
#: (k_mul_mat_vec_rows_deep_*_norm) instead of MMV_ROWS_UNROLL (k_mul_mat_vec_rows_*_norm): the
#: Llama 3 vocabulary, faster in whole decode steps at both widths measured, where the same depth
#: slows Qwen3's 151936-row lm_heads (same file). Only what was measured to win is listed.
HEAD_DEEP_RING = frozenset({(128256, 2048), (128256, 4096)})
#: attention: blocks of 128 threads, head_dim limit, target blocks (2 per SM of a 132-SM GPU)
FA_THREADS, FA_MAXD, FA_TARGET_BLOCKS = 128, 256, 264
#: the vectorized decode kernel (kernels/attn.cu): most warps of one block, warps of a split block,
#: most steps a round; split blocks of a head's keys, at most (4 a SM of a 132-SM GPU)
FAV_MAXW, FAV_WARPS, FAV_STEPS, FA_SPLIT_BLOCKS = 16, 4, 8, 528
#: most split blocks of a head launched as one thread-block cluster, their partials merged through
#: distributed shared memory (kernels/attn.cu FA_CLUSTER_MAX; the portable cluster size); 0 or 1:
#: never a cluster (every split merged by the ticket)
FA_CLUSTER_MAX = 8
#: warps of each block of a cluster-merged head (attn_vec_launch): more warps a block, fewer blocks
#: (and cluster members) a head; 8 and 16 were slower alone and no faster in whole steps
#: (data/bench/attn_diet_h100.md)
FAV_CLUSTER_WARPS = 4
#: decode attention where the vector kernel applies: "vec" (a block per query head and key chunk)
#: or "gqa" (a block per KV head and key chunk, its query heads sharing each K/V load:
#: k_flash_attn_ext_gqa_*). "vec" until benchmarks/kernel_bench.py measures "gqa" faster.
FA_VARIANT = "vec"
#: query elements and heads of one KV group the gqa kernel stages (kernels/attn.cu FAG_MAXQ, FAG_MAXG)
FAG_MAXQ, FAG_MAXG = 2048, 64
#: MUL_MAT_ID with K of at most this many elements that is not a multiple of 32 16-byte vectors
#: takes the segmented kernel, MMV_SEG_LANES lanes per row (k_mul_mat_id_seg_*): 8 lanes ran
#: gpt-oss-20b's expert mat-vecs (K = 2880) 1.02-1.12x the whole-warp kernel (kernel_bench.py,
#: data/bench/kernels_h200.md); 0: never
MMV_SEG_K_MAX = 4096
MMV_SEG_LANES = 8
#: MUL_MAT takes the segmented kernel too (k_mul_mat_vec_seg_*): off, it was slower than the
#: block or row-streaming kernel on every measured shape
MMV_SEG_MUL_MAT = False
#: row kernels: elements per thread staged in registers (kernels/norm.cu NORM_MAXPER)
NORM_MAXPER = 8
#: Numba norm kernels' fixed block (kernels/numba_kernels.py NORM_THREADS)
NUMBA_NORM_THREADS = 128
#: the least threads a norm's block takes over a row of 1024 elements or more (norm_threads)
NORM_WIDE_THREADS = 512

Addr = Callable[[View], int]
Workspace = Callable[[str, int], int]


class BindError(ValueError):
    """A node whose views the kernels cannot take; names the node and the limit."""


@dataclass(frozen=True)
class KernelCall:
    """One launch: ``source``/``name`` of the CUDA C kernel, grid, block and arguments; and,
    for ops with a Numba twin, its kernel name with its own grid and block."""

    source: str
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple
    numba: tuple[str, tuple[int, ...], tuple[int, ...]] | None = None
    writes: tuple[View, ...] = field(default=(), compare=False)
    #: thread-block cluster dimensions (sm_90 and later; the kernel works without one too)
    cluster: tuple[int, int, int] | None = None


def i32(v: int) -> ctypes.c_int:
    return ctypes.c_int(int(v))


def f32(v: float) -> ctypes.c_float:
    return ctypes.c_float(float(v))


def ptr(v: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(v))


# -------------------------------------------------------------------------------------------
# geometry
# -------------------------------------------------------------------------------------------
def pad4(shape: tuple[int, ...], strides: tuple[int, ...], what: str = "view") -> tuple[tuple, tuple]:
    """Left-pad to 4 axes; drop size-1 axes (but the last) when there are more than 4."""
    shape, strides = tuple(int(s) for s in shape), tuple(int(s) for s in strides)
    if len(shape) > 4:
        keep = [i for i, n in enumerate(shape) if n != 1 or i == len(shape) - 1]
        shape, strides = tuple(shape[i] for i in keep), tuple(strides[i] for i in keep)
    if len(shape) > 4:
        raise BindError(f"{what}: {len(shape)}-d view {shape}; kernels take at most 4 axes")
    pad = 4 - len(shape)
    return (1,) * pad + shape, (0,) * pad + strides


def arg(v: View, addr: Addr, shape: tuple[int, ...] | None = None, strides: tuple[int, ...] | None = None) -> Arg:
    """The view as a kernel argument (optionally with another shape / strides over its bytes)."""
    s, st = pad4(shape if shape is not None else v.shape, strides if strides is not None else v.strides,
                 v.describe())
    return Arg(addr(v), s, st, v.dtype)


def broadcast(v: View, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NumPy broadcasting of ``v`` to ``shape``: stride 0 on broadcast axes."""
    vs, vt = v.shape, v.strides
    if len(vs) > len(shape):
        if prod(vs[: len(vs) - len(shape)]) != 1:
            raise BindError(f"cannot broadcast {v.describe()} to {shape}")
        vs, vt = vs[len(vs) - len(shape):], vt[len(vt) - len(shape):]
    vs = (1,) * (len(shape) - len(vs)) + tuple(vs)
    vt = (0,) * (len(shape) - len(vt)) + tuple(vt)
    out = []
    for n, m, s in zip(shape, vs, vt):
        if m == n:
            out.append(s)
        elif m == 1:
            out.append(0)
        else:
            raise BindError(f"cannot broadcast {v.describe()} to {shape}")
    return tuple(shape), tuple(out)


def like(v: View, shape: tuple[int, ...], what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``v`` seen with ``shape`` (same elements, row-major): itself, or a contiguous reshape."""
    if tuple(v.shape) == tuple(shape):
        return tuple(v.shape), tuple(v.strides)
    if v.numel == prod(shape) and v.is_contiguous:
        r = v.reshape(tuple(shape))
        return r.shape, r.strides
    if v.numel == prod(shape):  # equal up to leading size-1 axes
        a = tuple(n for n in v.shape)
        while a and a[0] == 1 and len(a) > len(shape):
            a = a[1:]
        if a == tuple(shape):
            return tuple(shape), tuple(v.strides[len(v.shape) - len(a):])
    raise BindError(f"{what}: {v.describe()} cannot be read as shape {shape}")


def rows_first(v: View, addr: Addr) -> Arg:
    """A table or cache with its row axis on TV axis 0 and a row's elements on axes 1..3."""
    rest, rest_st = v.shape[1:], v.strides[1:]
    if len(rest) > 3:
        keep = [i for i, n in enumerate(rest) if n != 1]
        rest, rest_st = tuple(rest[i] for i in keep), tuple(rest_st[i] for i in keep)
    if len(rest) > 3:
        raise BindError(f"{v.describe()}: rows of more than 3 axes")
    pad = 3 - len(rest)
    return Arg(addr(v), (int(v.shape[0]), *(1,) * pad, *map(int, rest)),
               (int(v.strides[0]), *(0,) * pad, *map(int, rest_st)), v.dtype)


def _ew_grid(n: int) -> tuple[int, ...]:
    return (max(1, ceil(n / EW_THREADS)),)


def _row_threads(length: int, per_thread: int = NORM_MAXPER, what: str = "row") -> int:
    need = ceil(length / per_thread)
    if need > 1024:
        raise BindError(f"{what}: rows of {length} elements exceed {per_thread * 1024}")
    return min(1024, max(32, -(-need // 32) * 32))


def norm_threads(length: int, what: str = "row") -> int:
    """Threads of a norm kernel's block per row: a row of 1024 elements or more takes at least
    NORM_WIDE_THREADS (fewer values per thread, shorter serial loads; benchmarks/launch_policy.py,
    data/bench/launch_policy_h200.md), a shorter one a thread per NORM_MAXPER elements."""
    return max(_row_threads(length, what=what), NORM_WIDE_THREADS if length >= 1024 else 0)


def _all_f32(*views: View) -> bool:
    return all(v.dtype == "f32" for v in views)


# -------------------------------------------------------------------------------------------
# bindings per op
# -------------------------------------------------------------------------------------------
BINARY = {"ADD": "add", "MUL": "mul", "DIV": "div"}
UNARY = {"SIGMOID": "sigmoid", "SOFTPLUS": "softplus", "SILU": "silu", "CPY": "cpy"}
NORMS = {"RMS_NORM": "rms_norm", "L2_NORM": "l2_norm"}


def bind(node: Node, addr: Addr, workspace: Workspace) -> KernelCall:
    """The kernel launch of ``node``; a BindError names a layout no kernel takes."""
    if any(is_quantized(v.dtype) for v in (*node.srcs, *node.outs)):
        return _quantized(node, addr, workspace)
    fn = _BINDERS.get(node.op)
    if fn is None:
        raise BindError(f"{node.name}: no CUDA kernel for op {node.op}")
    return fn(node, addr, workspace)


def _binary(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    a, b = node.srcs
    d = node.dst
    shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    if prod(shape) != d.numel:
        raise BindError(f"{node.name}: {a.shape} {node.op} {b.shape} has {prod(shape)} elements, dst {d.numel}")
    sa, ta = broadcast(a, shape)
    sb, tb = broadcast(b, shape)
    args: tuple = (arg(d, addr), arg(a, addr, sa, ta), arg(b, addr, sb, tb))
    if node.op == "GLU":
        kind = node.params.get("glu", "swiglu")
        if kind == "swiglu_oai":
            args += (f32(node.params["alpha"]), f32(node.params["limit"]))
        elif kind != "swiglu":
            raise BindError(f"{node.name}: unknown GLU kind {kind!r}")
        name = kind
    else:
        name = BINARY[node.op]
    numba = (name, _ew_grid(d.numel), (EW_THREADS,)) if _all_f32(a, b, d) else None
    return KernelCall("elementwise", f"k_{name}", _ew_grid(d.numel), (EW_THREADS,), args, numba, node.outs)


def _unary(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    a, d = node.srcs[0], node.dst
    if a.numel != d.numel:
        raise BindError(f"{node.name}: {a.numel} elements in, {d.numel} out")
    args: tuple = (arg(d, addr), arg(a, addr))
    if node.op == "SCALE":
        name = "scale"
        args += (f32(node.params["s"]),)
    else:
        name = UNARY[node.op]
    numba = (name, _ew_grid(d.numel), (EW_THREADS,)) if _all_f32(a, d) and node.op != "CPY" else None
    return KernelCall("elementwise", f"k_{name}", _ew_grid(d.numel), (EW_THREADS,), args, numba, node.outs)


def _norm(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    x, d = node.srcs[0], node.dst
    L = x.shape[-1]
    rows = x.numel // L
    ds, dt = like(d, x.shape, node.name)
    args: list = [arg(d, addr, ds, dt), arg(x, addr)]
    views = [x, d]
    if node.op == "RMS_NORM_MUL":
        name = "rms_norm_mul"
        w = node.srcs[1]
        args.append(arg(w, addr, *broadcast(w, x.shape)))
        views.append(w)
    elif node.op == "RMS_NORM_MUL_ADD":  # rms-norm-mul's + add: the addend read like NORM_GATED's gate
        name = "rms_norm_mul_add"
        w, y = node.srcs[1], node.srcs[2]
        args += [arg(w, addr, *broadcast(w, x.shape)), arg(y, addr, *like(y, x.shape, node.name))]
        views += [w, y]
    elif node.op == "NORM_GATED":
        name = "norm_gated"
        w, z = node.srcs[1], node.srcs[2]
        args += [arg(w, addr, *broadcast(w, x.shape)), arg(z, addr, *like(z, x.shape, node.name))]
        views += [w, z]
    else:
        name = NORMS[node.op]
    args.append(f32(node.params["eps"]))
    numba = (name, (rows,), (NUMBA_NORM_THREADS,)) if _all_f32(*views) else None
    return KernelCall("norm", f"k_{name}", (rows,), (norm_threads(L, node.name),), tuple(args), numba, node.outs)


def _soft_max(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    x, d = node.srcs[0], node.dst
    L = x.shape[-1]
    return KernelCall("norm", "k_soft_max", (x.numel // L,), (_row_threads(L, what=node.name),),
                      (arg(d, addr, *like(d, x.shape, node.name)), arg(x, addr)), None, node.outs)


def _sum_rows(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    x, d = node.srcs[0], node.dst
    L = x.shape[-1]
    rows = x.numel // L
    if d.numel != rows:
        raise BindError(f"{node.name}: {rows} rows summed into {d.numel} elements")
    return KernelCall("norm", "k_sum_rows", (rows,), (min(256, max(32, -(-L // 32) * 32)),),
                      (arg(d, addr), arg(x, addr)), None, node.outs)


def _top_k(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    x, d = node.srcs[0], node.dst
    n = x.shape[-1]
    if x.numel != n or n > 4096:
        raise BindError(f"{node.name}: top-k over one row of at most 4096 values, got {x.shape}")
    k = int(node.params["k"])
    if d.numel != k:
        raise BindError(f"{node.name}: k={k} but dst has {d.numel} elements")
    return KernelCall("topk", "k_argsort_top_k", (1,), (32,), (arg(d, addr), arg(x, addr), i32(k)), None, node.outs)


#: experts the fused router kernel chooses at most (kernels/topk.cu k_topk_moe's shared arrays)
TOPK_MOE_MAXK = 64


def _topk_moe(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """TOPK_MOE (topk-moe): the router chain in one warp; outs = (weights, ids)."""
    x = node.srcs[0]
    w, ids = node.outs
    n, k = x.shape[-1], int(node.params["k"])
    if x.numel != n or n > 4096 or k > TOPK_MOE_MAXK or w.numel != k or ids.numel != k:
        raise BindError(f"{node.name}: top-{k} (at most {TOPK_MOE_MAXK}) of one row of at most 4096 router "
                        f"logits, got {x.shape} -> {w.shape}, {ids.shape}")
    args = (arg(w, addr), arg(ids, addr), arg(x, addr), i32(k), i32(node.params["gating"] == "softmax"),
            i32(bool(node.params["norm"])))
    reg = x.dtype == "f32" and x.strides[-1] == 4  # the register kernels read the logits as plain floats
    name = next((k for top, k in TOPK_REG_KERNELS if n <= top and reg), "k_topk_moe_wide")
    return KernelCall("topk", name, (1,), (32,), args, None, node.outs)


#: (router logits at most, kernel): the register kernels (kernels/topk.cu, 32 lanes x 4 or 16 slots)
TOPK_REG_KERNELS = ((128, "k_topk_moe"), (512, "k_topk_moe_512"))


def _rms_norm_mul_rope(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """RMS_NORM_MUL_ROPE (rms-norm-mul-rope): a block per row, a thread per pair of its elements,
    normalises, scales and rotates it, writing the rows aligned to x's shape, or (with the row
    index, source 4) into the cache as k_rope_set_rows stores."""
    from ..strategy.fusion_chains import NORM_ROPE_MAX_HEAD

    x, w, pos, freqs = node.srcs[:4]
    d = node.dst
    hd = x.shape[-1]
    if {x.dtype, w.dtype, freqs.dtype} != {"f32"} or x.strides[-1] != 4 or hd > NORM_ROPE_MAX_HEAD or hd % 2 or \
            node.params["n_rot"] % 2 or d.dtype not in ("f32", "f16", "bf16"):
        raise BindError(f"{node.name}: k_rms_norm_mul_rope takes f32 rows of an even length up to "
                        f"{NORM_ROPE_MAX_HEAD}, contiguous, an even n_rot, an f32 weight and f32 frequencies into "
                        f"f32 / f16 / bf16, got {x.describe()}, {w.describe()}, {freqs.describe()} -> {d.describe()}")
    rows = x.numel // hd
    store = len(node.srcs) == 5
    if store:
        idx = node.srcs[4]
        if x.numel != idx.numel * (d.numel // d.shape[0]):
            raise BindError(f"{node.name}: {x.numel} rotated elements do not fill {idx.numel} rows of {d.shape}")
        out, ia = rows_first(d, addr), arg(idx, addr)
    else:
        out, ia = arg(d, addr, *like(d, x.shape, node.name)), arg(pos, addr)
    args = (out, arg(x, addr), arg(w, addr, (hd,), (w.strides[-1],)), arg(pos, addr), arg(freqs, addr), ia,
            f32(node.params["eps"]), i32(node.params["n_rot"]), f32(node.params.get("attn_factor", 1.0)), i32(store))
    return KernelCall("norm", "k_rms_norm_mul_rope", (rows,), (32 * ceil(hd / 64),), args, None, node.outs)


def _mul_sum_rows(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """MUL_SUM_ROWS (moe-weighted-reduction): a thread per output element sums its k weighted
    expert values."""
    e, w = node.srcs
    d = node.dst
    k, n = e.shape
    if d.numel != n:
        raise BindError(f"{node.name}: {k} experts' rows of {n} summed into {d.numel} elements")
    args = (arg(d, addr), arg(e, addr), arg(w, addr, (k, 1), (w.itemsize, 0)))  # w: contiguous (the pass)
    return KernelCall("norm", "k_sum_rows_mul", _ew_grid(n), (EW_THREADS,), args, None, node.outs)


def _rope(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    x, pos, freqs = node.srcs
    d = node.dst
    args = (arg(d, addr, *like(d, x.shape, node.name)), arg(x, addr), arg(pos, addr), arg(freqs, addr),
            i32(node.params["n_rot"]), f32(node.params.get("attn_factor", 1.0)))
    return KernelCall("rope", "k_rope", _ew_grid(x.numel), (EW_THREADS,), args, None, node.outs)


def _mul_mat_id_glu(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """MUL_MAT_ID_GLU (mul-mat-glu of MoE experts): both experts' rows per selected expert,
    swiglu in the epilogue; the scalar warp-per-output kernel for other layouts."""
    wg, wu, x, ids = node.srcs
    d = node.dst
    if len(wg.shape) != 3 or wu.shape != wg.shape or wu.dtype != wg.dtype:
        raise BindError(f"{node.name}: expert weights must be two [experts, out, in] of one layout, got "
                        f"{wg.describe()}, {wu.describe()}")
    if node.params.get("glu", "swiglu") != "swiglu":
        raise BindError(f"{node.name}: the fused gate/up mat-vec computes swiglu only")
    _, N, K = wg.shape
    ga, ua, ia = arg(wg, addr), arg(wu, addr), arg(ids, addr)
    xa = arg(x, addr, *_x_rows(x, K, node))
    n_ids = ids.numel
    if d.numel != n_ids * N:
        raise BindError(f"{node.name}: {n_ids} experts x {N} outputs do not fill {d.shape}")
    vec = _vector_loads(K, x, xa, ((wg, ga), (wu, ua)))
    if vec:
        splits = _mmv_splits(N, n_ids, K // vec)
        return KernelCall("mul_mat", f"k_mul_mat_id_{wg.dtype}_glu", (ceil(N / (MMV_WARPS // splits)), n_ids),
                          (32 * MMV_WARPS,), (arg(d, addr), ga, ua, xa, ia, i32(splits)), None, node.outs)
    return KernelCall("mul_mat", "k_mul_mat_id_glu_generic", (ceil(n_ids * N / 8),), (256,),
                      (arg(d, addr), ga, ua, xa, ia), None, node.outs)


def _rope_set_rows(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """ROPE_SET_ROWS (rope-set-rows): k_rope's rotation stored as k_set_rows stores rows."""
    x, pos, freqs, idx = node.srcs
    cache = node.dst
    row = cache.numel // cache.shape[0]
    if x.numel != idx.numel * row:
        raise BindError(f"{node.name}: {x.numel} rotated elements do not fill {idx.numel} rows of {cache.shape}")
    args = (rows_first(cache, addr), arg(x, addr), arg(pos, addr), arg(freqs, addr), arg(idx, addr),
            i32(node.params["n_rot"]), f32(node.params.get("attn_factor", 1.0)))
    return KernelCall("rope", "k_rope_set_rows", _ew_grid(x.numel), (EW_THREADS,), args, None, node.outs)


def _add_chain(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """ADD_CHAIN (add-chain): 3 or 4 operands aligned to the result's shape, summed in order."""
    d = node.dst
    if not 3 <= len(node.srcs) <= 4:
        raise BindError(f"{node.name}: k_add_chain sums 3 or 4 operands, got {len(node.srcs)}")
    ops = [arg(s, addr, *broadcast(s, d.shape)) for s in node.srcs]
    args = (arg(d, addr), *ops, *(ops[-1:] if len(ops) == 3 else ()), i32(len(ops)))
    numba = ("add_chain", _ew_grid(d.numel), (EW_THREADS,)) if _all_f32(d, *node.srcs) else None
    return KernelCall("elementwise", "k_add_chain", _ew_grid(d.numel), (EW_THREADS,), args, numba, node.outs)


def _get_rows(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    table, ids = node.srcs
    d = node.dst
    if d.numel != ids.numel * (table.numel // table.shape[0]):
        raise BindError(f"{node.name}: {ids.numel} rows of {table.shape} do not fill {d.shape}")
    return KernelCall("elementwise", "k_get_rows", _ew_grid(d.numel), (EW_THREADS,),
                      (arg(d, addr), rows_first(table, addr), arg(ids, addr)), None, node.outs)


def _set_rows(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    rows, idx = node.srcs
    cache = node.dst
    return KernelCall("elementwise", "k_set_rows", _ew_grid(rows.numel), (EW_THREADS,),
                      (rows_first(cache, addr), arg(rows, addr), arg(idx, addr)), None, node.outs)


def _add_id(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    x, bias, ids = node.srcs
    d = node.dst
    if len(bias.shape) != 2:
        raise BindError(f"{node.name}: expert bias must be [experts, out], got {bias.shape}")
    return KernelCall("elementwise", "k_add_id", _ew_grid(d.numel), (EW_THREADS,),
                      (arg(d, addr), arg(x, addr), arg(bias, addr), arg(ids, addr), i32(bias.shape[-1])),
                      None, node.outs)


def _vec_width(dtype: str) -> int | None:
    return {"f16": 8, "bf16": 8, "f32": 4}.get(dtype)


def _vector_loads(K: int, x: View, xa: Arg, weights: tuple[tuple[View, Arg], ...]) -> int | None:
    """Elements per 16-byte load when the vector mat-vec kernels can read these operands (one
    weight dtype with rows of whole 16-byte pieces, an f32 activation, all 16-byte aligned), else
    None: the generic kernels take them."""
    vec = _vec_width(weights[0][0].dtype)
    if (vec and K % vec == 0 and x.dtype == "f32" and _aligned16(xa, 4)
            and all(_aligned16(a, w.itemsize) for w, a in weights)):
        return vec
    return None


def _aligned16(a: Arg, last_contiguous_itemsize: int) -> bool:
    """16-byte aligned base and rows, unit inner stride."""
    if a.ptr % 16 or a.strides[3] != last_contiguous_itemsize:
        return False
    return all(s % 16 == 0 for n, s in zip(a.shape[:3], a.strides[:3]) if n > 1)


def _mmv_splits(rows: int, cols: int, nvec: int) -> int:
    """Warps per row of the block mat-vec: 2 for matrices of fewer than 8192 output rows (the K,
    V, Q and O projections, the FFN down projection), else 1; at least 4 vectors per lane.
    Measured on an H200 by benchmarks/matvec_sweep.py (data/bench/matvec_sweep.json)."""
    return 2 if rows * cols < MMV_SPLIT_BELOW and nvec >= 2 * 32 * 4 else 1


def _rows_per_warp(rows: int) -> int:
    """Rows each warp of the row-streaming mat-vec owns: about 4096 warps (one resident wave of a
    132-SM GPU at 6 blocks per SM), 2 rows at N = 8192, 4 from N = 16384 (lm_head)."""
    return max(1, min(4, rows // 4096))


def _x_rows(x: View, K: int, node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if x.shape[-1] == K:
        return tuple(x.shape), tuple(x.strides)
    return like(x, (x.numel // K, K), node.name)


def _seg_lanes(K: int, vec: int) -> int | None:
    """Lanes per row of the segmented mat-vec for rows of K elements (``vec`` per 16 bytes), or
    None where the whole-warp kernels take the row (MMV_SEG_K_MAX off, K too long, or a whole
    number of 32-vector rounds)."""
    if not MMV_SEG_K_MAX or K > MMV_SEG_K_MAX or (K // vec) % 32 == 0:
        return None
    return MMV_SEG_LANES


def _seg_grid(N: int, cols: int, lanes: int) -> tuple[int, int]:
    return ceil(N / (MMV_WARPS * (32 // lanes))), cols


def _mul_mat(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """MUL_MAT, and MUL_MAT_ADD (mul-mat-add: the same kernels with the addend, aligned to the
    result's flat index, added in the epilogue: the ``_add`` variants)."""
    w, x = node.srcs[0], node.srcs[1]
    d = node.dst
    extra: tuple = ()
    sfx = ""
    if node.op == "MUL_MAT_ADD":
        y = node.srcs[2]
        extra, sfx = (arg(y, addr, *like(y, d.shape, node.name)),), "_add"
    K = w.shape[-1]
    N = w.numel // K
    wa = arg(w, addr)
    xa = arg(x, addr, *_x_rows(x, K, node))
    M = x.numel // K
    if d.numel != M * N:
        raise BindError(f"{node.name}: [{M}, {K}] x [{N}, {K}]^T does not fill {d.shape}")
    vec = _vector_loads(K, x, xa, ((w, wa),))
    if vec:
        lanes = _seg_lanes(K, vec)
        if lanes and MMV_SEG_MUL_MAT and not sfx and N < MMV_ROWS_MIN:
            return KernelCall("mul_mat", f"k_mul_mat_vec_seg_{w.dtype}", _seg_grid(N, M, lanes), (32 * MMV_WARPS,),
                              (arg(d, addr), wa, xa, i32(lanes)), None, node.outs)
        if N >= MMV_ROWS_MIN and (N, K) not in MMV_BLOCK_SHAPES:
            rpw = _rows_per_warp(N)
            return KernelCall("mul_mat", f"k_mul_mat_vec_rows_{w.dtype}{sfx}", (ceil(ceil(N / rpw) / MMV_WARPS), M),
                              (32 * MMV_WARPS,), (arg(d, addr), wa, xa, i32(rpw), *extra), None, node.outs)
        splits = _mmv_splits(N, M, K // vec)
        grid = (ceil(N / (MMV_WARPS // splits)), M)
        return KernelCall("mul_mat", f"k_mul_mat_vec_{w.dtype}{sfx}", grid, (32 * MMV_WARPS,),
                          (arg(d, addr), wa, xa, i32(splits), *extra), None, node.outs)
    return _mul_mat_fallback(node, addr, d, wa, xa, xa, M * N, has_ids=False, extra=extra, sfx=sfx)


def _mul_mat_fallback(node: Node, addr: Addr, d: View, wa: Arg, xa: Arg, ids: Arg, outputs: int,
                      has_ids: bool, extra: tuple = (), sfx: str = "") -> KernelCall:
    args = (arg(d, addr), wa, xa, ids, i32(int(has_ids)), *extra)
    itemsize = node.srcs[0].itemsize
    if wa.strides[3] != itemsize:  # K is the strided axis (input-major storage): thread per output
        return KernelCall("mul_mat", f"k_mul_mat_cols{sfx}", (ceil(outputs / 128),), (128,), args, None, node.outs)
    return KernelCall("mul_mat", f"k_mul_mat_generic{sfx}", (ceil(outputs / 8),), (256,), args, None, node.outs)


def _mul_mat_glu(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """MUL_MAT_GLU (mul-mat-glu): the block mat-vec over the gate and the up rows, swiglu in the
    epilogue; the scalar warp-per-output kernel for layouts the vector loads cannot take."""
    wg, wu, x = node.srcs
    d = node.dst
    K = wg.shape[-1]
    N = wg.numel // K
    if wu.shape != wg.shape or wu.dtype != wg.dtype:
        raise BindError(f"{node.name}: gate {wg.describe()} and up {wu.describe()} differ")
    if node.params.get("glu", "swiglu") != "swiglu":
        raise BindError(f"{node.name}: the fused gate/up mat-vec computes swiglu only")
    ga, ua = arg(wg, addr), arg(wu, addr)
    xa = arg(x, addr, *_x_rows(x, K, node))
    M = x.numel // K
    if d.numel != M * N:
        raise BindError(f"{node.name}: [{M}, {K}] x [{N}, {K}]^T does not fill {d.shape}")
    vec = _vector_loads(K, x, xa, ((wg, ga), (wu, ua)))
    if vec:
        splits = _mmv_splits(N, M, K // vec)
        return KernelCall("mul_mat", f"k_mul_mat_vec_{wg.dtype}_glu", (ceil(N / (MMV_WARPS // splits)), M),
                          (32 * MMV_WARPS,), (arg(d, addr), ga, ua, xa, i32(splits)), None, node.outs)
    return KernelCall("mul_mat", "k_mul_mat_glu_generic", (ceil(M * N / 8),), (256,),
                      (arg(d, addr), ga, ua, xa), None, node.outs)


#: blocks of the fused mat-vecs at most (kernels/fused_mat_vec.cu): FMV_MIN_BLOCKS = 4 resident per
#: SM of a 132-SM GPU; their blocks stride over the rows, paying the staging prologue once each
FMV_MAX_BLOCKS = 4 * 132


#: vectors of one row a lane of a fused mat-vec should hold (loads it keeps in flight): fewer
#: warps a row while a lane's share stays within it (``fused_splits``)
FMV_LANE_VECTORS = 8


def fused_splits(items: int, nvec: int) -> int:
    """Warps per item (a row, or a row pair of the GLU kernel) of a fused mat-vec: the fewest of
    1, 2 and 4 whose lanes hold at most FMV_LANE_VECTORS 16-byte vectors of a row (``nvec`` a
    row), else 4. More warps shorten each lane's load chain but add a block reduction; in whole
    decode steps under PDL on an H200 (``data/bench/grid_ab_h200.md``) the rule's choices were the
    fastest measured: llama-3.2-1b's gate/up and Qwen3-30B-A3B's K, V and router rows (256
    vectors) at one warp, llama-3.1-8b's and Qwen3-8B's gate/up (512) at two. The load-chain rule
    before it (rounds of the grid times a lane's vectors, fewer warps on a tie) gave Qwen3-8B's
    gate/up one warp and the 256-vector norm-mat-vecs four."""
    return next((s for s in (1, 2) if ceil(nvec / (32 * s)) <= FMV_LANE_VECTORS), 4)


def qkv_splits(pairs: int, nvec: int) -> int:
    """Warps per rotation pair of the Q/K/V kernel: the most of 1, 2 and 4 whose grid (pairs over
    MMV_WARPS / splits pairs a block) fits one round of FMV_MAX_BLOCKS blocks (its epilogue, RoPE
    and three stores, does not pay for a second round); one where even that takes more. In whole
    decode steps under PDL on an H200 (``data/bench/grid_ab_h200.md``): two warps at
    llama-3.2-1b's 1536 pairs (384 blocks), one at gpt-oss-20b's 2560 and llama-3.1-8b's 3072,
    where two would need 640 and 768 blocks."""
    return max((s for s in (1, 2, 4) if ceil(pairs * s / MMV_WARPS) <= FMV_MAX_BLOCKS), default=1)


def _fused_operands(node: Node, addr: Addr, mats: tuple[View, ...], x: View, items: int,
                    splits_rule: Callable[[int, int], int]) -> tuple[tuple[Arg, ...], Arg, int]:
    """Weight args, the activation arg and splits (``splits_rule(items, vectors a row)``) of a
    fused mat-vec (kernels/fused_mat_vec.cu) of ``items`` rows (row pairs), whose layout the
    rewrite (strategy/fusion_ours.py) promised: rows of 16-byte vectors of one dtype and K, one
    contiguous f32 row x of K <= FUSED_MAX_K."""
    from ..strategy.fusion_ours import FUSED_MAX_K

    K = mats[0].shape[-1]
    ws = tuple(arg(w, addr) for w in mats)
    xa = arg(x, addr, (1, K), (K * 4, 4)) if x.numel == K and x.is_contiguous else None
    vec = _vec_width(mats[0].dtype)
    if (xa is None or x.dtype != "f32" or K > FUSED_MAX_K or not vec or K % vec
            or any(w.dtype != mats[0].dtype or w.shape[-1] != K for w in mats)
            or not all(_aligned16(a, w.itemsize) for a, w in zip(ws, mats)) or not _aligned16(xa, 4)):
        raise BindError(f"{node.name}: {node.op} takes 16-byte-aligned f16/bf16/f32 weight rows of one K "
                        f"(<= {FUSED_MAX_K}) and one contiguous f32 row x; got "
                        f"{', '.join(w.describe() for w in mats)} and {x.describe()}")
    return ws, xa, splits_rule(items, K // vec)


def _fused_grid(items: int, splits: int) -> tuple[int]:
    return (max(1, min(FMV_MAX_BLOCKS, ceil(items / (MMV_WARPS // splits)))),)


def _norm_weight(node: Node, addr: Addr, K: int) -> Arg:
    w = node.srcs[-1]
    a = arg(w, addr, (K,), (4,)) if w.numel == K else None
    if a is None or w.dtype != "f32" or not w.is_contiguous or a.ptr % 16:
        raise BindError(f"{node.name}: the norm weight must be {K} contiguous, 16-byte aligned f32 values, got "
                        f"{w.describe()}")
    return a


def _rms_norm_mul_mat(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """RMS_NORM_MUL_MAT and RMS_NORM_MUL_MAT_GLU (norm-mat-vec): the block mat-vec over the
    staged x * w_norm, scaled by the norm in the epilogue (swiglu of gate and up for _GLU); a
    tall RMS_NORM_MUL_MAT (the lm_head) streams rows as k_mul_mat_vec_rows_* does."""
    glu = node.op == "RMS_NORM_MUL_MAT_GLU"
    mats, x = node.srcs[: 2 if glu else 1], node.srcs[-2]
    d = node.dst
    K, N = mats[0].shape[-1], mats[0].numel // mats[0].shape[-1]
    ws, xa, splits = _fused_operands(node, addr, mats, x, N, fused_splits)
    if d.numel != N or (glu and (mats[1].shape != mats[0].shape or node.params.get("glu", "swiglu") != "swiglu")):
        raise BindError(f"{node.name}: {node.op} of {[w.shape for w in mats]} does not fill {d.shape}")
    args = (arg(d, addr), *ws, xa, _norm_weight(node, addr, K), f32(node.params["eps"]))
    if not glu and N >= MMV_ROWS_MIN:  # tall (the lm_head): the row-streaming loop, as k_mul_mat_vec_rows_*
        rpw = max(_rows_per_warp(N), ceil(N / (FMV_MAX_BLOCKS * MMV_WARPS)))  # one staging per resident block
        deep = "deep_" if (N, K) in HEAD_DEEP_RING else ""
        return KernelCall("fused_mat_vec", f"k_mul_mat_vec_rows_{deep}{mats[0].dtype}_norm",
                          (ceil(ceil(N / rpw) / MMV_WARPS),), (32 * MMV_WARPS,), (*args, i32(rpw)), None, node.outs)
    args += (i32(splits),)
    return KernelCall("fused_mat_vec", f"k_mul_mat_vec_{mats[0].dtype}{'_glu' if glu else ''}_norm",
                      _fused_grid(N, splits), (32 * MMV_WARPS,), args, None, node.outs)


def _qkv_rope_set_rows(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    """QKV_ROPE_SET_ROWS (qkv-rope-store, normed with norm-mat-vec): one grid over the rotation
    pairs of the Q, K and V rows (+ their biases); q to its output, k and v into their cache rows."""
    wq, wk, wv, x, pos, freqs, idx = node.srcs[:7]
    q, kc, vc = node.outs
    hd, n_rot = int(node.params["head_dim"]), int(node.params["n_rot"])
    K = wq.shape[-1]
    nq, nk, nv = (w.numel // K for w in (wq, wk, wv))
    ws, xa, splits = _fused_operands(node, addr, (wq, wk, wv), x, (nq + nk + nv) // 2, qkv_splits)
    if (hd % 2 or n_rot % 2 or not 0 < n_rot <= hd or nq % hd or nk % hd or nv % hd or q.numel != nq
            or idx.numel != 1 or any(c.numel // c.shape[0] != n for c, n in ((kc, nk), (vc, nv)))):
        raise BindError(f"{node.name}: heads of {hd} (n_rot {n_rot}) over q {nq}, k {nk}, v {nv} rows into "
                        f"{q.describe()} and one row of {kc.describe()}, {vc.describe()}")
    has_norm, has_bias = "eps" in node.params, bool(node.params.get("bias"))
    nw = _norm_weight(node, addr, K) if has_norm else xa
    biases = [xa] * 3
    if has_bias:
        biases = [arg(b, addr, (n,), (4,)) for b, n in zip(node.srcs[7:10], (nq, nk, nv))]
        if any(b.numel != n or b.dtype != "f32" or not b.is_contiguous for b, n in zip(node.srcs[7:10], (nq, nk, nv))):
            raise BindError(f"{node.name}: q/k/v biases must be {nq}, {nk}, {nv} contiguous f32 values")
    args = (arg(q, addr, (nq // hd, hd), (q.strides[-2] if len(q.shape) > 1 else hd * q.itemsize, q.strides[-1])),
            rows_first(kc, addr), rows_first(vc, addr), *ws, xa, arg(pos, addr), arg(freqs, addr), arg(idx, addr),
            nw, *biases, i32(n_rot), f32(node.params.get("attn_factor", 1.0)), f32(node.params.get("eps", 0.0)),
            i32(has_norm), i32(has_bias), i32(splits))
    return KernelCall("fused_mat_vec", f"k_mul_mat_vec_{wq.dtype}_qkv_rope", _fused_grid((nq + nk + nv) // 2, splits),
                      (32 * MMV_WARPS,), args, None, node.outs)


def _mul_mat_id(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    w, x, ids = node.srcs
    d = node.dst
    if len(w.shape) != 3:
        raise BindError(f"{node.name}: expert weights must be [experts, out, in], got {w.shape}")
    E, N, K = w.shape
    wa = arg(w, addr)
    xa = arg(x, addr, *_x_rows(x, K, node))
    ia = arg(ids, addr)
    n_ids = ids.numel
    if d.numel != n_ids * N:
        raise BindError(f"{node.name}: {n_ids} experts x {N} outputs do not fill {d.shape}")
    vec = _vector_loads(K, x, xa, ((w, wa),))
    if vec:
        lanes = _seg_lanes(K, vec)
        if lanes:
            return KernelCall("mul_mat", f"k_mul_mat_id_seg_{w.dtype}", _seg_grid(N, n_ids, lanes),
                              (32 * MMV_WARPS,), (arg(d, addr), wa, xa, ia, i32(lanes)), None, node.outs)
        splits = _mmv_splits(N, n_ids, K // vec)
        grid = (ceil(N / (MMV_WARPS // splits)), n_ids)
        return KernelCall("mul_mat", f"k_mul_mat_id_{w.dtype}", grid, (32 * MMV_WARPS,),
                          (arg(d, addr), wa, xa, ia, i32(splits)), None, node.outs)
    return _mul_mat_fallback(node, addr, d, wa, xa, ia, n_ids * N, has_ids=True)


def attn_splits(n_head: int, n_kv: int) -> int:
    """Context chunks per head of the generic kernel: about FA_TARGET_BLOCKS blocks, chunks of at
    least 32 keys."""
    return max(1, min(ceil(FA_TARGET_BLOCKS / n_head), max(1, n_kv // 32)))


def attn_vec_pieces(head_dim: int, itemsize: int) -> int | None:
    """16-byte pieces of one K/V row for the vectorized kernels, or None when a row is not a power
    of two of them up to 32 (kernels/attn.cu FAV_*)."""
    if (head_dim * itemsize) % 16:
        return None
    pieces = head_dim * itemsize // 16
    return None if pieces > 32 or pieces & (pieces - 1) else pieces


def attn_vec_launch(head_dim: int, itemsize: int, n_kv: int, n_head: int,
                    solo: bool = True) -> tuple[int, int, int, int] | None:
    """(warps, steps, rounds, splits) of the vectorized kernel k_flash_attn_ext_vec_*, or None
    where it does not apply. A round is ``steps`` steps of ``warps * 32 / pieces`` keys, every load
    issued before any is used; a block takes ``rounds`` rounds; ``splits`` blocks share a head.
    Keys that fit 2..FA_CLUSTER_MAX blocks of FAV_CLUSTER_WARPS warps in one round take that many, one
    thread-block cluster a head (``attn_cluster``: the partials merged through distributed shared
    memory, no ticket); keys that fit one block's round take one block of up to FAV_MAXW warps,
    which writes the output itself; longer contexts are split over blocks of FAV_WARPS warps
    (their partials merged by the head's last block), at most about FA_SPLIT_BLOCKS blocks, further
    keys taken in rounds: in isolation on an H200 (``data/bench/attn_policy_h200.md``) one block of
    16 warps beat 4 to 8 ticket-merged split blocks at 512 keys of head dim 64, many small blocks
    beat two rounds or two big blocks at head dim 128, and rounds beat ever more splits past a
    wave; clusters beat both (``data/bench/attn_cluster_h200.md``). ``solo=False``: split blocks
    merged by the ticket (the launch before clusters and one-block heads, for A/B runs)."""
    pieces = attn_vec_pieces(head_dim, itemsize)
    if pieces is None:
        return None
    kpw = 32 // pieces  # keys a warp reads per step
    per_step = FAV_CLUSTER_WARPS * kpw
    S = ceil(n_kv / (per_step * FAV_STEPS))
    if solo and 1 < S <= FA_CLUSTER_MAX:
        return FAV_CLUSTER_WARPS, ceil(n_kv / (S * per_step)), 1, S
    if solo and n_kv <= FAV_MAXW * kpw * FAV_STEPS:
        warps = max(1, min(FAV_MAXW, ceil(n_kv / kpw)))
        return warps, max(1, min(FAV_STEPS, ceil(n_kv / (warps * kpw)))), 1, 1
    chunks = ceil(n_kv / (FAV_WARPS * kpw * FAV_STEPS))
    rounds = ceil(chunks / attn_vec_max_splits(n_head))
    return FAV_WARPS, FAV_STEPS, rounds, ceil(chunks / rounds)


def attn_cluster(splits: int) -> tuple[int, int, int] | None:
    """The cluster of a head's ``splits`` blocks (grid (H, splits)), or None: the ticket merges."""
    return (1, splits, 1) if 1 < splits <= FA_CLUSTER_MAX else None


def attn_vec_max_splits(n_head: int) -> int:
    """The most blocks per head attn_vec_launch asks for (the workspace's partials)."""
    return max(1, ceil(FA_SPLIT_BLOCKS / n_head))


def attn_gqa_chunk(head_dim: int, itemsize: int, n_kv: int, n_kv_heads: int) -> tuple[int, int] | None:
    """(steps, keys per block) of the GQA-shared kernel (FAV_WARPS warps a block): steps chosen so
    that its n_kv_heads * S blocks fill about FA_TARGET_BLOCKS."""
    pieces = attn_vec_pieces(head_dim, itemsize)
    if pieces is None:
        return None
    per_step = FAV_WARPS * (32 // pieces)
    steps = max(1, min(FAV_STEPS, ceil(n_kv * n_kv_heads / (FA_TARGET_BLOCKS * per_step))))
    return steps, per_step * steps


def _rows16(v: View, a: Arg) -> bool:
    return a.ptr % 16 == 0 and v.strides[-1] == v.itemsize and all(s % 16 == 0 for s in v.strides[:-1])


def _attn(node: Node, addr: Addr, workspace: Workspace) -> KernelCall:
    q, k, v, mask = node.srcs[:4]
    sinks = node.srcs[4] if len(node.srcs) > 4 else None
    d = node.dst
    H, D = q.shape[-2], q.shape[-1]
    if q.numel != H * D or len(k.shape) != 3 or len(v.shape) != 3:
        raise BindError(f"{node.name}: expected q [H, D] and k/v [n_kv, H_kv, D], got {q.shape}, {k.shape}")
    n_kv, Hkv = k.shape[0], k.shape[1]
    if D > FA_MAXD or H % Hkv or k.dtype != v.dtype:
        raise BindError(f"{node.name}: head_dim {D} (max {FA_MAXD}), {H} heads over {Hkv} KV heads, "
                        f"K {k.dtype} / V {v.dtype}")
    if d.shape[-1] % D:  # kernels/attn.cu fa_block_out: a head's outputs lie on the innermost axis
        raise BindError(f"{node.name}: output {d.shape} does not hold whole heads of {D} on its last axis")
    ka, va = arg(k, addr), arg(v, addr)
    rows_max = max(n_kv, k.buffer.nbytes // max(1, k.strides[0]))  # the cache's context
    vec = attn_vec_launch(D, k.itemsize, n_kv, H)
    grid_x, block = H, FA_THREADS
    if (FA_VARIANT == "gqa" and vec is not None and (H // Hkv) * D <= FAG_MAXQ and H // Hkv <= FAG_MAXG
            and _rows16(k, ka) and _rows16(v, va)):
        steps, chunk = attn_gqa_chunk(D, k.itemsize, n_kv, Hkv)
        S, name, extra, grid_x = ceil(n_kv / chunk), f"k_flash_attn_ext_gqa_{k.dtype}", (i32(steps),), Hkv
        # S over every KV length up to the cache's: at most ceil(FA_TARGET_BLOCKS / Hkv) + 1 while
        # steps < 8, else growing with the length
        s_max = max(ceil(FA_TARGET_BLOCKS / Hkv) + 1, ceil(rows_max / attn_gqa_chunk(D, k.itemsize, rows_max, Hkv)[1]))
    elif vec is not None and _rows16(k, ka) and _rows16(v, va) and mask.dtype == "f32":
        warps, steps, rounds, S = vec
        s_max, name, extra, block = attn_vec_max_splits(H), f"k_flash_attn_ext_vec_{k.dtype}", \
            (i32(steps), i32(rounds)), 32 * warps
    else:
        S, s_max, name, extra = attn_splits(H, n_kv), ceil(FA_TARGET_BLOCKS / H), f"k_flash_attn_ext_{k.dtype}", ()
    nbytes = H * max(S, s_max) * (D + 2) * 4 + H * 4  # partials of the largest split + one ticket per head
    base = workspace(node.name, nbytes)
    args = (arg(d, addr), arg(q, addr, (H, D), q.strides[-2:]), ka, va, arg(mask, addr),
            arg(sinks, addr) if sinks is not None else arg(mask, addr), f32(node.params["scale"]),
            i32(sinks is not None), ptr(base), ptr(base + nbytes - H * 4), *extra)
    cluster = attn_cluster(S) if name.startswith("k_flash_attn_ext_vec_") else None
    return KernelCall("attn", name, (grid_x, S), (block,), args, None, node.outs, cluster)


def _ssm_conv(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    state, x, kern = node.srcs
    out, new_state = node.outs
    C, K = kern.shape[-2], kern.shape[-1]
    if K > 8 or state.shape[-1] != K - 1:
        raise BindError(f"{node.name}: conv kernel of {K} taps (max 8) over a state of {state.shape}")
    return KernelCall("gdn", "k_ssm_conv", (ceil(C / 128),), (128,),
                      (arg(out, addr), arg(new_state, addr), arg(state, addr), arg(x, addr), arg(kern, addr)),
                      None, node.outs)


def _gdn(node: Node, addr: Addr, _: Workspace) -> KernelCall:
    q, k, v, g, beta, state = node.srcs
    out, new_state = node.outs
    H, DK, DV = state.shape
    if DK > GDN_MAXK or state.dtype != "f32" or new_state.dtype != "f32":
        raise BindError(f"{node.name}: k_gated_delta_net takes an f32 state of key head dim <= {GDN_MAXK}, got "
                        f"{state.dtype} {state.shape} -> {new_state.dtype}")
    args = (arg(out, addr), arg(new_state, addr), arg(q, addr), arg(k, addr), arg(v, addr), arg(g, addr),
            arg(beta, addr), arg(state, addr), f32(node.params["scale"]))
    return KernelCall("gdn", "k_gated_delta_net", (H, ceil(DV / 32)), (32 * ceil(DK / GDN_MAXR),), args, None,
                      node.outs)


#: kernels/gdn.cu: the key head dim at most, and the state rows a thread holds in registers
GDN_MAXK, GDN_MAXR = 256, 32


def _quantized(node: Node, addr: Addr, workspace: Workspace) -> KernelCall:
    """Nodes with a block-typed view (QUANTIZE_Q8_1, RMS_NORM_MUL_Q8_1, quantised MUL_MAT /
    MUL_MAT_ID / GET_ROWS):
    ``cuda_quant_ops`` (kernels/mmvq.cu), imported here as it builds on this module's helpers."""
    from .cuda_quant_ops import bind_quantized

    return bind_quantized(node, addr, workspace)


_BINDERS: dict[str, Callable[[Node, Addr, Workspace], KernelCall]] = {
    **{op: _binary for op in (*BINARY, "GLU")},
    **{op: _unary for op in (*UNARY, "SCALE")},
    **{op: _norm for op in (*NORMS, "RMS_NORM_MUL", "RMS_NORM_MUL_ADD", "NORM_GATED")},
    "SOFT_MAX": _soft_max,
    "SUM_ROWS": _sum_rows,
    "ARGSORT_TOP_K": _top_k,
    "ROPE": _rope,
    "GET_ROWS": _get_rows,
    "SET_ROWS": _set_rows,
    "ADD_ID": _add_id,
    "MUL_MAT": _mul_mat,
    "MUL_MAT_ADD": _mul_mat,
    "MUL_MAT_GLU": _mul_mat_glu,
    "MUL_MAT_ID_GLU": _mul_mat_id_glu,
    "ROPE_SET_ROWS": _rope_set_rows,
    "ADD_CHAIN": _add_chain,
    "TOPK_MOE": _topk_moe,
    "RMS_NORM_MUL_ROPE": _rms_norm_mul_rope,
    "MUL_SUM_ROWS": _mul_sum_rows,
    "MUL_MAT_ID": _mul_mat_id,
    "RMS_NORM_MUL_MAT": _rms_norm_mul_mat,
    "RMS_NORM_MUL_MAT_GLU": _rms_norm_mul_mat,
    "QKV_ROPE_SET_ROWS": _qkv_rope_set_rows,
    "FLASH_ATTN_EXT": _attn,
    "SSM_CONV": _ssm_conv,
    "GATED_DELTA_NET": _gdn,
    "QUANTIZE_Q8_1": _quantized,
    "RMS_NORM_MUL_Q8_1": _quantized,
}

#: ops with a kernel here (the CPU tests check this covers every op a model graph uses)
SUPPORTED_OPS = frozenset(_BINDERS)
