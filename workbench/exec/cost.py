"""Roofline cost of one kernel: what the simulator needs to time a node on a calibrated GPU.

A kernel costs a fixed part (block launch, ramp-down, grid completion: ``kernel_fixed_ns``,
measured) plus its work: ``max(bytes / bandwidth, flops / rate)``. A small grid cannot use the
whole GPU: by Little's law a kernel keeps ``threads x bytes_in_flight_per_thread`` bytes in flight,
so it reaches at most that divided by ``bandwidth x latency`` of the DRAM bandwidth (approached
smoothly where the calibration measured how the latency rises under load, ``bandwidth_share``), and its
compute rate is limited to the share of SMs it occupies. That fraction is the kernel's ``cap``;
concurrent kernels share the GPU (at most 1.0 in total) without exceeding their caps. A
measured calibration replaces the fixed part and scales the work per ggml op, or per kernel
family for ops it did not measure (``measured_fit``), plus, where the fit has one, a cost per
mat-vec row (``FamilyCost.row_ns``: each row's reduction tail, work at the kernel's cap). A scale
below 1 is taken off the fixed part instead, so the work that kernels share is never shorter than
their bytes at the calibrated bandwidth (the floor that ``workbench.exec.floor`` checks).

Launch geometry (blocks x threads per block) is the grid of the kernel the calibration's executor
launches (``kernel_geometry``): the cuda executor's own (``cuda_ops.bind``) for a ``cuda``
calibration fitted under it; otherwise that of llama.cpp's CUDA kernels for a decode step
(``launch_geometry``): one block per output row for mat-vec, one block per row for norms and
softmax, 256-thread blocks over the elements for element-wise ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod
from typing import TYPE_CHECKING

from ..graph import Node, is_quantized
from .calibration import Calibration, FamilyCost

if TYPE_CHECKING:
    from .cuda_ops import KernelCall

#: ggml op -> CUDA kernel name as Nsight Systems shows it for llama.cpp's CUDA backend.
KERNEL_NAMES = {
    "GET_ROWS": "k_get_rows_float",
    "RMS_NORM": "rms_norm_f32",
    "RMS_NORM_MUL": "rms_norm_f32<mul>",
    "RMS_NORM_MUL_ADD": "rms_norm_f32<mul,add>",
    "L2_NORM": "l2_norm_f32",
    "NORM_GATED": "rms_norm_f32<mul,silu>",
    "MUL": "k_bin_bcast<op_mul>",
    "ADD": "k_bin_bcast<op_add>",
    "DIV": "k_bin_bcast<op_div>",
    "ADD_ID": "add_id_kernel",
    "SCALE": "scale_f32",
    "SIGMOID": "unary_op_kernel<op_sigmoid>",
    "SOFTPLUS": "unary_op_kernel<op_softplus>",
    "SILU": "unary_op_kernel<op_silu>",
    "SUM_ROWS": "k_sum_rows_f32",
    "GLU": "swiglu_kernel",
    "SOFT_MAX": "soft_max_f32",
    "ARGSORT_TOP_K": "k_argsort_f32_i32",
    "ROPE": "rope_f32",
    "MUL_MAT": "mul_mat_vec_f",
    "MUL_MAT_ID": "mul_mat_f<ids>",  # float weights on NVIDIA (ggml_cuda_mul_mat_id: mmf, not mmvf)
    "MUL_MAT_ADD": "mul_mat_vec_f<bias>",
    "MUL_MAT_GLU": "mul_mat_vec_f<gate,glu>",
    "MUL_MAT_ID_GLU": "mul_mat_vec_f<ids,gate,glu>",
    "ROPE_SET_ROWS": "rope_neox<set_rows>",
    "ADD_CHAIN": "k_bin_bcast<op_add,op_add>",
    "TOPK_MOE": "topk_moe_cuda",
    "RMS_NORM_MUL_ROPE": "rms_norm_mul_rope_f32",
    "MUL_SUM_ROWS": "moe_weighted_reduction_f32",
    "SET_ROWS": "k_set_rows",
    "QUANTIZE_Q8_1": "quantize_q8_1",
    "FLASH_ATTN_EXT": "flash_attn_ext_vec",
    "CPY": "cpy_flt",
    "SSM_CONV": "ssm_conv_f32",
    "GATED_DELTA_NET": "gated_delta_net_f32",
}

#: ops of the workbench's own fusions (strategy/fusion_ours.py), which llama.cpp has no kernel for:
#: the simulator names the workbench's ``cuda`` kernel instead (its name without the weight
#: dtype). tests/test_architecture.py checks that this table and KERNEL_NAMES split the ops.
WORKBENCH_ONLY_KERNELS = {
    "RMS_NORM_MUL_MAT": "k_mul_mat_vec_norm",
    "RMS_NORM_MUL_MAT_GLU": "k_mul_mat_vec_glu_norm",
    "QKV_ROPE_SET_ROWS": "k_mul_mat_vec_qkv_rope",
    "RMS_NORM_MUL_Q8_1": "k_rms_norm_mul_q8_1",
}

#: fused op -> (the op whose kernel it extends, the suffix of its ``cuda`` kernel's name): the
#: fused kernel runs the base kernel's main loop with a longer prologue or epilogue, so the base
#: op's measured correction applies to it, over the fused node's own bytes and flops
FUSED_BASE = {"RMS_NORM_MUL_ADD": ("RMS_NORM", "_mul_add"),
              "MUL_MAT_ADD": ("MUL_MAT", "_add"), "MUL_MAT_GLU": ("MUL_MAT", "_glu"),
              "MUL_MAT_ID_GLU": ("MUL_MAT_ID", "_glu"),
              "ROPE_SET_ROWS": ("ROPE", "_set_rows"), "ADD_CHAIN": ("ADD", "_chain"),
              "TOPK_MOE": ("ARGSORT_TOP_K", ""),
              "RMS_NORM_MUL_ROPE": ("RMS_NORM", "_mul_rope"), "MUL_SUM_ROWS": ("SUM_ROWS", "_mul"),
              # the workbench's own: the block mat-vec's main loop after a prologue that stages
              # the (normed) activation in shared memory (kernels/fused_mat_vec.cu)
              "RMS_NORM_MUL_MAT": ("MUL_MAT", "_norm"), "RMS_NORM_MUL_MAT_GLU": ("MUL_MAT", "_glu_norm"),
              "QKV_ROPE_SET_ROWS": ("MUL_MAT", "_qkv_rope"),
              # the norm kernel storing q8_1 blocks (kernels/norm.cu NORM_RMS_MUL_Q8_1)
              "RMS_NORM_MUL_Q8_1": ("RMS_NORM", "_mul_q8_1")}
#: fused ops whose kernel stages the activation row in a prologue before the main loop
#: (``prologue_ns``): every block reads the row (and the norm weight, and reduces sum(x^2))
STAGED_OPS = ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_GLU", "QKV_ROPE_SET_ROWS")

_ELEMENTWISE_BLOCK = 256   # CUDA_*_BLOCK_SIZE of ggml's element-wise, copy, rope and set_rows kernels
_FATTN_KQ_STRIDE = 256     # ggml's FATTN_KQ_STRIDE: KV rows one flash-attention block handles per pass
#: add_id_kernel's threads per block: min(columns, 768), whose lanes loop over the rest of the row
ADD_ID_MAX_BLOCK = 768


@dataclass(frozen=True)
class KernelCost:
    """Timing inputs of one kernel on one GPU.

    ``work_ns``: the work at the whole GPU's rate (max of memory and compute time);
    ``cap``: the largest share of the GPU the grid can use (so alone it runs ``work_ns / cap``);
    ``occupancy``: share of the GPU's resident-thread slots its blocks hold (admission of
    concurrent / PDL-early kernels); ``write_fraction``: share of the work that is the epilogue
    writing the result (where an ``after-main-loop`` PDL trigger fires); ``early_ns`` and
    ``early_scale``: its work becomes ``early_ns x cap + early_scale x work`` when PDL launches
    it while its predecessor's main loop still runs (a predecessor that signals at its start):
    its blocks are then placed on SMs as the predecessor's retire, unevenly
    (``FamilyCost.early_ns`` / ``early_scale``, measured by ``workbench calibrate``);
    ``pdl_prologue_ns``: the part of ``fixed_ns`` it runs before its PDL wait, overlapping its
    predecessor (its fit's own, else the device's: ``FamilyCost.prologue_ns``).
    """

    name: str
    blocks: int
    threads: int
    bytes: float
    flops: float
    work_ns: float
    cap: float
    occupancy: float
    write_fraction: float
    fixed_ns: float
    early_scale: float = 1.0
    early_ns: float = 0.0
    pdl_prologue_ns: float = 0.0

    @property
    def duration_ns(self) -> float:
        """Duration alone on an idle GPU."""
        return self.fixed_ns + (self.work_ns / self.cap if self.work_ns > 0 else 0.0)


#: the kernels llama.cpp runs on block-quantised weights (mmvq: q8_1 activations; get_rows dequantises)
QUANTIZED_KERNEL_NAMES = {"MUL_MAT": "mul_mat_vec_q", "MUL_MAT_ID": "mul_mat_vec_q<ids>", "GET_ROWS": "k_get_rows",
                          "MUL_MAT_ADD": "mul_mat_vec_q<bias>", "MUL_MAT_GLU": "mul_mat_vec_q<gate,glu>",
                          "MUL_MAT_ID_GLU": "mul_mat_vec_q<ids,gate,glu>"}


def quantized_weight(node: Node) -> bool:
    """``node`` runs one of llama.cpp's block-type kernels (QUANTIZED_KERNEL_NAMES)."""
    return node.op in QUANTIZED_KERNEL_NAMES and is_quantized(node.srcs[0].dtype)


#: ``params["pass"]`` of a FLASH_ATTN_EXT node that is llama.cpp's second pass of a decode
#: attention, not the attention itself: ``launch_fattn`` splits each head's keys over several
#: blocks and launches ``flash_attn_combine_results`` (``flash_attn_stream_k_fixup_*`` after the
#: mma kernel) to merge their partial results, a kernel of its own on the timeline. Only the
#: llama.cpp schedule has such nodes (``llamacpp_schedule.attention_passes``)
ATTN_COMBINE_PASS = "combine"
#: the name the simulator and the fit give the second pass's kernel
ATTN_COMBINE_KERNEL = "flash_attn_combine_results"


def is_attn_combine(node: Node) -> bool:
    """``node`` is llama.cpp's merge pass of a split decode attention (``ATTN_COMBINE_PASS``)."""
    return node.op == "FLASH_ATTN_EXT" and node.params.get("pass") == ATTN_COMBINE_PASS


def kernel_name(node: Node) -> str:
    if is_attn_combine(node):
        return ATTN_COMBINE_KERNEL
    if quantized_weight(node):
        return QUANTIZED_KERNEL_NAMES[node.op]
    return KERNEL_NAMES.get(node.op) or WORKBENCH_ONLY_KERNELS.get(node.op, node.op.lower())


def launch_geometry(node: Node, sm_count: int) -> tuple[int, int]:
    """(blocks, threads per block) of ``node``'s kernel as llama.cpp launches it for one token."""
    op, dst = node.op, node.dst
    if op != "GET_ROWS" and quantized_weight(node):
        return max(1, dst.numel), 128                      # mul_mat_vec_q: 4 warps per row (calc_nwarps)
    if op == "QKV_ROPE_SET_ROWS":                          # ours: modelled as the mat-vec whose fit it takes
        return max(1, sum(w.numel // w.shape[-1] for w in node.srcs[:3])), 256   # a block per Q, K, V row
    if op in ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_GLU"):  # ours: modelled as a block per output row
        return max(1, dst.numel), 256
    if op in MMVF_OPS:
        return max(1, dst.numel), mmvf_block(node.srcs[0].shape[-1])   # mul_mat_vec_f: a block per output row
    if op == "MUL_MAT_ID":  # the rows of every selected expert (llama.cpp's own: mmf_ids_geometry)
        return max(1, dst.numel), 256
    if op in ("RMS_NORM", "RMS_NORM_MUL", "RMS_NORM_MUL_ADD", "RMS_NORM_MUL_Q8_1", "L2_NORM", "NORM_GATED",
              "SOFT_MAX", "ARGSORT_TOP_K", "SUM_ROWS", "TOPK_MOE"):
        src = node.srcs[0]
        ncols = src.shape[-1] if src.shape else 1
        nrows = max(1, src.numel // max(1, ncols))
        if op in ("SOFT_MAX", "ARGSORT_TOP_K", "TOPK_MOE"):
            return nrows, min(1024, 1 << max(5, (ncols - 1).bit_length()))
        return nrows, (1024 if ncols >= 1024 else 32)      # ggml: a warp per row below 1024 columns
    if op == "RMS_NORM_MUL_ROPE":                          # rms_norm_mul_rope_f32<256>: a block per row
        x = node.srcs[0]
        return max(1, x.numel // x.shape[-1]), 256
    if op in ("ROPE", "ROPE_SET_ROWS"):
        x = node.srcs[0]                                   # the rotated rows (a cache is the fused dst)
        ne0 = x.shape[-1]
        return max(1, x.numel // ne0) * ceil(ne0 / (2 * _ELEMENTWISE_BLOCK)), _ELEMENTWISE_BLOCK
    if is_attn_combine(node):  # flash_attn_combine_results: a block per head, a thread per value of it
        hd = int(node.params["head_dim"])
        return max(1, node.dst.numel // hd), hd
    if op == "FLASH_ATTN_EXT":  # the cuda-executor files' approximation; llama.cpp's: fattn_vec_geometry
        q, k = node.srcs[0], node.srcs[1]
        n_head, n_kv = q.shape[-2], k.shape[0]
        parallel = max(1, min(ceil(n_kv / _FATTN_KQ_STRIDE), ceil(2 * sm_count / n_head)))
        return n_head * parallel, 128
    if op == "ADD_ID":  # add_id_kernel (ggml-cuda/add-id.cu): a block per selected expert's row
        x = node.srcs[0]
        ncols = x.shape[-1]
        return max(1, x.numel // ncols), min(ncols, ADD_ID_MAX_BLOCK)
    if op == "GATED_DELTA_NET":
        h_v, _, d_v = node.srcs[5].shape
        return h_v * ceil(d_v / 32), 128                   # a warp per 32 state columns, per head
    if op == "SSM_CONV":
        return ceil(node.srcs[2].shape[0] / 128), 128      # a thread per channel
    n = max(1, sum(o.numel for o in node.outs[:1]))
    return ceil(n / _ELEMENTWISE_BLOCK), _ELEMENTWISE_BLOCK


#: llama.cpp's mul_mat_vec_f (ggml-cuda/mmvf.cu): its largest block and the unroll nvcc gives its
#: column loop (the SASS of the sm_90 build: the trip count's remainder first, one half2 load at a
#: time, then groups of 4 loads issued together)
MMVF_MAX_BLOCK, MMVF_UNROLL = 256, 4
#: the ops llama.cpp runs as mul_mat_vec_f on float weights (an unfused MUL_MAT_ID: mmf_ids_geometry)
MMVF_OPS = ("MUL_MAT", "MUL_MAT_ADD", "MUL_MAT_GLU", "MUL_MAT_ID_GLU")


def mmvf_block(cols: int, max_block: int = MMVF_MAX_BLOCK) -> int:
    """Threads per block of llama.cpp's ``mul_mat_vec_f`` for rows of ``cols`` float weights, as
    ``launch_mul_mat_vec_f_cuda`` picks them: the fewest iterations over the row's columns, two a
    lane, from one warp to ``max_block`` threads (the first block size that reaches them).
    ``mul_mat_f_cuda`` picks its warps a block by the same rule (``mmf_ids_geometry``)."""
    warp = 32
    best, best_iter = warp, ceil(cols / (2 * warp))
    for bs in range(2 * warp, max_block + 1, warp):
        it = ceil(cols / (2 * bs))
        if it < best_iter:
            best, best_iter = bs, it
    return best


def mmvf_rounds(cols: int, threads: int) -> int:
    """The DRAM round trips one ``mul_mat_vec_f`` block waits for in turn over a row of ``cols``
    columns: a lane with ``t`` iterations (a half2 each) runs ``t % 4`` of them one load at a time,
    then ``t // 4`` groups of 4 loads in flight; the block retires with its slowest lane. 2048,
    4096 and 14336 columns give 1, 2 and 7 full rounds; 2880 gives 3 (6 iterations: 2 single, then
    a group), so its lanes keep half the bytes in flight (``bytes_in_flight``)."""
    pairs = cols // 2
    hi, lo = ceil(pairs / threads), pairs // threads
    return max(1, *(t % MMVF_UNROLL + t // MMVF_UNROLL for t in (hi, lo)))


def mmvf_kernel(node: Node) -> bool:
    """``node`` runs llama.cpp's ``mul_mat_vec_f`` (a float-weight mat-vec; an unfused expert
    mat-mul runs ``mul_mat_f``: ``mmf_ids_geometry``)."""
    return node.op in MMVF_OPS and not quantized_weight(node) and bool(node.srcs[0].shape)


def bytes_in_flight(node: Node, cal: Calibration, blocks: int, threads: int) -> float:
    """Bytes a lane of ``node``'s kernel keeps in flight (Little's law: ``kernel_cost``'s cap): the
    device's (the read probe's depth), except llama.cpp's ``mul_mat_vec_f``, whose lanes keep its
    bytes over its blocks' serial rounds (``mmvf_rounds``): 16 B where a lane's iterations are a
    multiple of 4, 7.5 B at gpt-oss-20b's 2880 columns, whose rows stream about a third slower per
    byte than llama-3.1-8b's 4096 (the captures in data/traces/llamacpp/h200_captures)."""
    if cal.executor != "llamacpp" or not mmvf_kernel(node):
        return cal.bytes_in_flight_per_thread
    rounds = mmvf_rounds(node.srcs[0].shape[-1], threads)
    return min(cal.bytes_in_flight_per_thread, node.bytes / (blocks * threads * rounds))


def fattn_combine_values(node: Node, sm_count: int) -> int:
    """The partial values one block of llama.cpp's merge pass (``is_attn_combine``) reads: the
    attention's ``parallel_blocks`` splits (``fattn_vec_parallel``) of ``head_dim`` values. A block
    merges one head, the heads' blocks run side by side, so this, not the bytes of all heads, sets
    its time (the captures at 512 and 32768 keys: data/bench/llamacpp_knob_noise_h200_s33.md,
    session 38)."""
    p = node.params
    hd = int(p["head_dim"])
    return fattn_vec_parallel(int(p["heads"]), int(p["keys"]), hd, sm_count) * hd


#: llama.cpp's decode attention (``flash_attn_ext_vec``, one query column): 128 threads a block, and
#: the blocks an SM holds by head size, from its registers in the sm_90 build (cuobjdump
#: -res-usage: 125, 168 and 202 a thread at D = 64, 128 and 256, of 65536 an SM)
FATTN_VEC_THREADS = 128
FATTN_VEC_BLOCKS_PER_SM = {64: 4, 128: 3, 256: 2}


def fattn_vec_blocks_per_sm(head_dim: int) -> int:
    """The ``flash_attn_ext_vec`` blocks of head size ``head_dim`` an SM holds (``FATTN_VEC_BLOCKS_PER_SM``)."""
    return FATTN_VEC_BLOCKS_PER_SM.get(head_dim, 4 if head_dim <= 64 else 3 if head_dim <= 128 else 2)


def fattn_vec_parallel(n_head: int, n_kv: int, head_dim: int, sm_count: int) -> int:
    """The blocks llama.cpp splits each query head's keys over (``launch_fattn``'s
    ``parallel_blocks``): the blocks an SM holds, at most one per tile of ``head_dim`` keys, then
    raised while that fills the last wave better, until a wave is 95 % full."""
    per_sm = fattn_vec_blocks_per_sm(head_dim)
    tiles = max(1, ceil(n_kv / head_dim))
    per_wave = sm_count * per_sm
    best = par = min(per_sm, tiles)
    best_eff, best_waves = 0, 0
    for p in range(par, tiles + 1):
        waves = ceil(n_head * p / per_wave)
        eff = 100 * n_head * p // (waves * per_wave)
        if best_eff >= 95 and waves > best_waves:
            break
        if eff > best_eff:
            best, best_eff, best_waves = p, eff, waves
    return best


def fattn_vec_geometry(node: Node, sm_count: int) -> tuple[int, int, int]:
    """(blocks, threads per block, keys each block walks) of llama.cpp's ``flash_attn_ext_vec`` for
    a decode FLASH_ATTN_EXT: a block per query head and split. A block walks its tiles of
    ``head_dim`` keys one after another (load K, dot, softmax, load V), so past a few thousand keys
    the keys a block walks set its time as much as the bytes do."""
    q, k = node.srcs[0], node.srcs[1]
    n_head, n_kv, d = q.shape[-2], k.shape[0], q.shape[-1]
    par = fattn_vec_parallel(n_head, n_kv, d, sm_count)
    return n_head * par, FATTN_VEC_THREADS, ceil(ceil(n_kv / d) / par) * d


#: ops whose kernel is a mat-vec with one block per output row (``launch_geometry``)
MAT_VEC_OPS = ("MUL_MAT", "MUL_MAT_ADD", "MUL_MAT_GLU", "RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_GLU", "MUL_MAT_ID",
               "MUL_MAT_ID_GLU", "QKV_ROPE_SET_ROWS")


def mat_vec_rows(node: Node, sm_count: int) -> int:
    """Output rows of a mat-vec (its blocks, one per row: ``launch_geometry``), the count a fit's
    ``row_ns`` charges; 0 for any other kernel."""
    return launch_geometry(node, sm_count)[0] if node.op in MAT_VEC_OPS else 0


#: ops whose kernel is a router's top-k selection (the cuda executor's kernels/topk.cu
#: ``warp_top_k``, llama.cpp's bitonic argsort): a chain of serial steps (``serial_units``), not a
#: grid that streams bytes, so a fit that sees one step count scales with the steps
TOP_K_OPS = ("ARGSORT_TOP_K", "TOPK_MOE")


def top_k_steps(node: Node) -> int:
    """The serial steps of a router's top-k selection on the cuda executor, per row of n expert
    logits: k rounds of a warp arg-max, each a scan of n / 32 entries per lane and 5 shuffle
    steps (kernels/topk.cu ``warp_top_k``). Its time grows with these steps, not with its bytes:
    3.1, 5.9 and 13.4 us for gpt-oss-20b's 4 of 32, Qwen3-30B-A3B's 8 of 128 and Qwen3-Next's 10
    of 512 on an H200 (data/bench/calibration_h200_s27.md)."""
    x = node.srcs[0]
    cols = x.shape[-1]
    k = node.outs[-1].shape[-1]  # the chosen ids: ARGSORT_TOP_K's dst, TOPK_MOE's second output
    return x.numel // cols * k * (ceil(cols / 32) + 5)


def bitonic_stages(node: Node) -> int:
    """The serial stages of llama.cpp's argsort (``k_argsort_f32_i32``): one block a row sorts
    the row padded to a power of two, ``s (s + 1) / 2`` compare-exchange stages for ``2^s``
    columns, each behind a ``__syncthreads``. Its time grows with these, not with its bytes:
    5.5, 8.2 and 14.2 us for gpt-oss-20b's 32, Qwen3-30B-A3B's 128 and Qwen3-Next's 512 experts,
    the same on an H100 and an H200, whose SMs run at one clock (the captures in
    data/traces/llamacpp/, data/bench/llamacpp_knob_noise_h200_s33.md)."""
    x = node.srcs[0]
    cols = x.shape[-1]
    s = max(0, cols - 1).bit_length()
    return x.numel // cols * s * (s + 1) // 2


#: mul_mat_f's rows per block on NVIDIA (ggml-cuda/mmf.cuh MMF_ROWS_PER_BLOCK) and its largest block
MMF_ROWS_PER_BLOCK, MMF_MAX_BLOCK = 32, 256


def mmf_ids_geometry(node: Node) -> tuple[int, int] | None:
    """(blocks, threads per block) of llama.cpp's ``mul_mat_f`` for an unfused MUL_MAT_ID of float
    weights (ggml_cuda_mul_mat_id on NVIDIA, one token: mmvf serves only AMD there), else None.
    Its grid covers every expert, not the selected ones: ``rows / 32`` row blocks per expert,
    ``nwarps`` warps a block as mul_mat_f_cuda picks them (``mmvf_block``: the fewest iterations
    over a row's columns, two per lane, at most 256 threads). A block of an expert no token chose finds that in
    the ids and exits, so the grid's size sets the kernel's time beside its bytes: 14.5 and 17.4 us
    for Qwen3-30B-A3B's gate and down (128 experts), 19.5 and 25.1 us for Qwen3-Next's (512) on an
    H200, fewer bytes (the captures in data/traces/llamacpp/h200_captures)."""
    if node.op != "MUL_MAT_ID" or quantized_weight(node) or len(node.srcs[0].shape) != 3:
        return None
    n_expert, rows, cols = node.srcs[0].shape
    return n_expert * max(1, rows // MMF_ROWS_PER_BLOCK), mmvf_block(cols, MMF_MAX_BLOCK)


def serial_units(node: Node, cal: Calibration) -> int:
    """What a fit's ``row_ns`` charges ``node`` for: a mat-vec's output rows (each row's reduction
    tail, ``mat_vec_rows``), a router's top-k selection's serial steps on the cuda executor
    (``top_k_steps``), llama.cpp's argsort's sort stages (``bitonic_stages``) and its expert
    mat-mul's waves of blocks over the SMs (``mmf_ids_geometry``: most find their expert unused
    and exit, one wave after another), the keys each block of its decode attention walks
    (``fattn_vec_geometry``) and the partial values a block of its merge pass reads
    (``fattn_combine_values``); 0 for any other kernel."""
    if cal.executor == "llamacpp" and (mmf := mmf_ids_geometry(node)) is not None:
        return ceil(mmf[0] / cal.sm_count)
    if cal.executor == "llamacpp" and is_attn_combine(node):
        return fattn_combine_values(node, cal.sm_count)
    if cal.executor == "llamacpp" and node.op == "FLASH_ATTN_EXT":
        return fattn_vec_geometry(node, cal.sm_count)[2]
    if node.op in MAT_VEC_OPS:
        return mat_vec_rows(node, cal.sm_count)
    if cal.executor == "cuda" and node.op in TOP_K_OPS:
        return top_k_steps(node)
    if node.op == "ARGSORT_TOP_K":
        return bitonic_stages(node)
    return 0


def executor_call(node: Node) -> KernelCall | None:
    """The launch the workbench's ``cuda`` executor makes for ``node`` (``None`` where no kernel
    takes its views): ``cuda_ops.bind`` with every buffer at an aligned base, as the executor
    allocates them, so the alignment-dependent choices come out the same."""
    from .cuda_ops import BindError, bind

    try:
        return bind(node, lambda v: v.offset, lambda key, n: 0)
    except BindError:
        return None


def executor_kernel(node: Node) -> str | None:
    """The CUDA kernel the workbench's ``cuda`` executor launches for ``node`` (``executor_call``),
    and for decode attention how its split blocks merge, which sets its cost more than its bytes
    do (``<cluster>``: through distributed shared memory; ``<split>``: the last block of a head
    merges from a global workspace behind a ticket; neither: one block a head): 5.6-6.7 us in a
    cluster, 10.7-15.5 us by ticket at 512-1024 keys on an H200
    (data/bench/calibration_h200_s27.md)."""
    call = executor_call(node)
    if call is None:
        return None
    if call.cluster:
        return f"{call.name}<cluster>"
    if call.name.startswith("k_flash_attn") and len(call.grid) > 1 and call.grid[1] > 1:
        return f"{call.name}<split>"
    return call.name


def kernel_geometry(node: Node, cal: Calibration) -> tuple[int, int]:
    """(blocks, threads per block) of the kernel that ``cal``'s executor launches for ``node``:
    the cuda executor's own grid (``executor_call``) for a ``cuda`` calibration fitted under it
    (``Calibration.grids``), else llama.cpp's (``launch_geometry``: llama.cpp calibrations, files
    fitted before, and nodes no executor kernel binds). The grids differ where it matters to the
    cost: the executor's attention splits a head's keys over up to 8 blocks of a cluster where
    llama.cpp launches 2-3, and its mat-vecs stream several rows a warp (512-598 blocks at
    llama-3.1-8b's FFN) where llama.cpp launches a block a row."""
    if cal.executor == "cuda" and cal.grids == "executor":
        call = executor_call(node)
        if call is not None:
            return int(prod(call.grid)), int(prod(call.block))
    if cal.executor == "llamacpp" and (mmf := mmf_ids_geometry(node)) is not None:
        return mmf
    if cal.executor == "llamacpp" and node.op == "FLASH_ATTN_EXT" and not is_attn_combine(node):
        return fattn_vec_geometry(node, cal.sm_count)[:2]
    return launch_geometry(node, cal.sm_count)


def prologue_ns(node: Node, cal: Calibration) -> float:
    """What the staging prologue of a ``STAGED_OPS`` kernel (kernels/fused_mat_vec.cu stage_x)
    adds to the block mat-vec whose measured fit it takes: the base kernel reads x after its PDL
    wait too, one vector ahead of each dot, while the staged kernel's first dot waits for the
    whole row in shared memory (a barrier after one round of independent float4 loads; the
    folded norm's block reduction follows from shared memory). Charged as one round trip at the
    calibrated DRAM latency (an upper bound: x was just written, so it is in L2), once per
    kernel (the blocks stage concurrently, their weight loads already in flight)."""
    return cal.dram_latency_ns if node.op in STAGED_OPS else 0.0


def measured_fit(node: Node, cal: Calibration) -> tuple[str, FamilyCost | None]:
    """The measured correction ``node``'s kernel gets and where it comes from, most specific
    first: its ggml op on the kernel the ``cuda`` executor binds for it (``op/kernel``: where one
    op has kernels of different speed, e.g. MUL_MAT's per-row and row-streaming mat-vecs), its
    ggml op (``op``), its kernel family (``family``), else none (``device``: plain roofline plus
    ``kernel_fixed_ns``). Ops come before families because a family lumps kernels of very
    different cost (SOFT_MAX and ARGSORT_TOP_K, MUL_MAT and MUL_MAT_ID). A fused op of
    ``FUSED_BASE`` takes its base op's fit: its kernel is the base kernel with a longer epilogue.
    A fused op that the calibration measured on its own kernel (``how`` = ``fused op``) takes that
    fit first. A block-typed weight's kernel (mmvq, quantised get-rows) takes only a fit measured on that
    kernel (``MUL_MAT/k_mul_mat_vec_q_q4_0``, say), else the plain roofline of its blocks' bytes:
    the op's and the family's fits were measured on the float kernels, whose inner loops differ.

    A llama.cpp calibration (``cal.executor == "llamacpp"``) keys its fits by llama.cpp's
    kernels (``kernel_name``) and measures the fused kernels llama.cpp runs under their own op:
    ``op/kernel`` and ``op`` of the node, then its base op's, then the family."""
    how, key = fit_key(node, cal)
    if key is None:
        return how, None
    return how, (cal.families if how == "family" else cal.ops)[key]


#: executor kernels that differ from another only in the loads a lane keeps in flight
#: (cuda_ops.HEAD_DEEP_RING): without a fit of their own they take that kernel's
RING_VARIANTS = (("_rows_deep_", "_rows_"),)


def _fit_kernels(kernel: str | None) -> list[str | None]:
    """``kernel``, then the kernel whose fit a ring variant of it falls back to."""
    out = [kernel]
    for variant, base in RING_VARIANTS:
        if kernel and variant in kernel:
            out.append(kernel.replace(variant, base))
    return out


def fit_key(node: Node, cal: Calibration) -> tuple[str, str | None]:
    """``measured_fit``'s source and the key of its fit in ``cal.ops`` (``cal.families`` for a
    ``family`` fit; None for ``device``)."""
    if cal.executor == "llamacpp":
        base = FUSED_BASE.get(node.op, (node.op, ""))[0]
        for key, how in ((f"{node.op}/{kernel_name(node)}", "op/kernel"), (node.op, "op"), (base, "op")):
            if key in cal.ops:
                return how, key
            if quantized_weight(node):  # only the block kernel's own fit applies (see above)
                return "device", None
        return ("family", node.family) if node.family in cal.families else ("device", None)
    op, sfx = FUSED_BASE.get(node.op, (node.op, ""))
    if op != node.op:  # a fused op measured on its own kernel (the calibration's fused run) first
        for key in (*(f"{node.op}/{k}" for k in _fit_kernels(executor_kernel(node))), node.op):
            if key in cal.ops:
                return "fused op", key
    if any(k.startswith(f"{op}/") for k in cal.ops):
        for kernel in _fit_kernels(executor_kernel(node)):
            key = f"{op}/{kernel.removesuffix(sfx) if kernel else kernel}"
            if key in cal.ops:
                return "op/kernel", key
    if quantized_weight(node):
        return "device", None
    if op in cal.ops:
        return "op", op
    if node.family in cal.families:
        return "family", node.family
    return "device", None


def bandwidth_share(x: float, knee: float = 0.0) -> float:
    """The share of the peak DRAM bandwidth a grid reaches with ``x`` = its bytes in flight over
    bandwidth x idle latency (Little's law). ``knee`` 0: ``min(1, x)``; else the smooth
    ``x / (1 + x^knee)^(1/knee)``: near the peak the latency grows with the load, so a grid that
    keeps exactly one latency's worth of bytes in flight reaches 2^(-1/knee) of the peak, not all
    of it (the streaming-read probe: 88 % at x = 1.14 on an H200, ``Calibration.dram_knee``)."""
    if knee <= 0:
        return min(1.0, x)
    return x / (1.0 + x ** knee) ** (1.0 / knee)


def kernel_cost(node: Node, cal: Calibration) -> KernelCost:
    """Roofline cost of ``node`` on the GPU of ``cal``."""
    blocks, threads = kernel_geometry(node, cal)
    nbytes, flops = float(node.bytes), float(node.flops)
    how, fam = measured_fit(node, cal)  # measured correction (workbench calibrate)
    scale = fam.work_scale if fam else 1.0
    fixed = fam.fixed_ns if fam else cal.kernel_fixed_ns
    prologue = fam.prologue_ns(cal.pdl_prologue_ns) if fam else cal.pdl_prologue_ns
    # a fit's per-row term (``FamilyCost.row_ns``): charged with the fixed part through the
    # conservation below, then moved into the work (see the end)
    rows_ns = fam.row_ns * serial_units(node, cal) if fam else 0.0
    fixed += rows_ns
    slots = cal.sm_count * cal.max_threads_per_sm
    resident = min(blocks * threads, slots)
    mem_cap = bandwidth_share(resident * bytes_in_flight(node, cal, blocks, threads)
                              / (cal.dram_Bpns * cal.dram_latency_ns), cal.dram_knee)
    sm_cap = min(1.0, min(blocks, cal.sm_count) / cal.sm_count)
    mem_ns, cmp_ns = nbytes / cal.dram_Bpns, flops / cal.fp32_flops_per_ns
    if scale < 1.0:
        # conservation: a fit may scale the roofline down, but no kernel moves its bytes faster
        # than the calibrated bandwidth (nor does its flops faster than the peak rate): the work
        # that shares the GPU stays the plain roofline and the fit's saving comes off the fixed
        # part, so the kernel alone takes what the fit says (down to the PDL-overlapped prologue)
        fitted = max(mem_ns * scale / mem_cap, cmp_ns * scale / sm_cap)
        plain = max(mem_ns / mem_cap, cmp_ns / sm_cap)
        fixed = max(prologue + cal.pdl_first_read_setup_ns, fixed - (plain - fitted))
    else:
        mem_ns, cmp_ns = mem_ns * scale, cmp_ns * scale
    work = max(mem_ns, cmp_ns)
    alone = max(mem_ns / mem_cap, cmp_ns / sm_cap)
    cap = work / alone if alone > 0 else 1.0
    # the rows' reduction tails keep SMs busy (each row's block holds its slot until it reduces and
    # writes): work that concurrent kernels share at this kernel's cap, not a latency they overlap;
    # what the conservation left of the fixed part above the PDL-overlapped prologue moves there
    tail = min(rows_ns, fixed - prologue - cal.pdl_first_read_setup_ns)
    if tail > 0:
        fixed, work = fixed - tail, work + tail * cap
    written = float(sum(o.nbytes for o in node.outs))
    return KernelCost(
        name=kernel_name(node), blocks=blocks, threads=threads, bytes=nbytes, flops=flops,
        work_ns=work, cap=cap, occupancy=min(1.0, blocks * threads / slots),
        write_fraction=min(1.0, written / nbytes) if nbytes > 0 else 0.0,
        fixed_ns=fixed + (prologue_ns(node, cal) if how != "fused op" else 0.0),  # a fused fit has its prologue
        early_scale=fam.early_scale if fam else 1.0, early_ns=fam.early_ns if fam else 0.0,
        pdl_prologue_ns=prologue,
    )


def memcpy_ns(nbytes: int, cal: Calibration) -> float:
    """Device time of one host<->device copy on a copy engine."""
    return cal.memcpy_latency_ns + nbytes / cal.pcie_GBps
