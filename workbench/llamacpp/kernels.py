"""llama.cpp's CUDA kernel names -> the ggml ops they compute.

llama.cpp's kernels carry no workbench graph node, so a CUPTI timeline of llama.cpp names each
kernel by the ggml op it implements (``GGML_OP_*`` without the prefix, the workbench's op
names). Kernels that implement a fusion name every op they fuse, joined by ``+``
(``RMS_NORM+MUL`` for ``rms_norm_f32<256, true>``, ``SOFT_MAX+ARGSORT_TOP_K+GET_ROWS`` for
``topk_moe_cuda``). The table follows ``ggml/src/ggml-cuda/*.cu`` of the peer tree (0c1e570):
the ``__global__`` function names, and for the kernels templated on a device function
(``k_bin_bcast<op_add>``, ``unary_op_kernel<op_silu>``) the function's name. Library kernels
(cuBLAS GEMMs, CUB sorts) are matched by the patterns Nsight Systems users know them by.

Works on CUPTI's mangled names (``_Z12rms_norm_f32ILi256ELb1ELb0ELb0EEvPKfPfi...``) and on
demangled ones (``rms_norm_f32<256, true, false, false>(...)``).
"""

from __future__ import annotations

import re

try:  # the CUPTI vocabulary has its own module in newer trees
    from ..trace.cupti_names import kernel_base_name
except ImportError:  # pragma: no cover - older layout
    from ..trace.cupti import kernel_base_name

#: kernel function name -> ggml op (exact base names from ggml-cuda)
KERNEL_OPS: dict[str, str] = {
    # matrix products
    "mul_mat_vec_f": "MUL_MAT", "mul_mat_vec_q": "MUL_MAT", "mul_mat_f": "MUL_MAT", "mul_mat_q": "MUL_MAT",
    "mul_mat_q_stream_k_fixup": "MUL_MAT", "quantize_q8_1": "MUL_MAT", "quantize_mmq_q8_1": "MUL_MAT",
    "quantize_mmq_mxfp4": "MUL_MAT", "quantize_mmq_nvfp4": "MUL_MAT", "k_compute_batched_ptrs": "MUL_MAT",
    "mul_mat_vec_q_moe": "MUL_MAT_ID", "mul_mat_f_ids": "MUL_MAT_ID", "mm_ids_helper": "MUL_MAT_ID",
    # norms
    "rms_norm_f32": "RMS_NORM", "norm_f32": "NORM", "l2_norm_f32": "L2_NORM", "group_norm_f32": "GROUP_NORM",
    "rms_norm_mul_rope_f32": "RMS_NORM+MUL+ROPE",
    # attention
    "flash_attn_ext_vec": "FLASH_ATTN_EXT", "flash_attn_ext_f16": "FLASH_ATTN_EXT",
    "flash_attn_tile": "FLASH_ATTN_EXT", "flash_attn_combine_results": "FLASH_ATTN_EXT",
    "flash_attn_stream_k_fixup_general": "FLASH_ATTN_EXT", "flash_attn_stream_k_fixup_uniform": "FLASH_ATTN_EXT",
    "flash_attn_mask_to_KV_max": "FLASH_ATTN_EXT",
    "rope_norm": "ROPE", "rope_neox": "ROPE", "rope_multi": "ROPE", "rope_vision": "ROPE",
    "soft_max_f32": "SOFT_MAX", "soft_max_f32_parallelize_cols": "SOFT_MAX",
    # rows and copies
    "k_get_rows": "GET_ROWS", "k_get_rows_float": "GET_ROWS", "k_get_rows_float_vec": "GET_ROWS",
    "k_get_rows_kq": "GET_ROWS",
    "k_set_rows": "SET_ROWS", "k_set_rows_quant": "SET_ROWS",
    "cpy_scalar": "CPY", "cpy_scalar_contiguous": "CPY", "cpy_scalar_transpose": "CPY", "cpy_f32_q": "CPY",
    "cpy_q_f32": "CPY", "convert_unary": "CPY", "convert_unary_cont_vec4": "CPY", "concat_cont": "CONCAT",
    # elementwise
    "scale_f32": "SCALE", "add_id_kernel": "ADD_ID", "swiglu_oai_kernel": "GLU", "swiglu_clamp_kernel": "GLU",
    "op_clamp_kernel": "CLAMP", "fill_kernel": "FILL", "reduce_rows_f32": "SUM_ROWS",
    "reduce_rows_f32_strided": "SUM_ROWS", "moe_weighted_reduction_f32": "MUL+SUM_ROWS", "argmax_f32": "ARGMAX",
    "cumsum_kernel": "CUMSUM", "cumsum_cub_kernel": "CUMSUM", "pad_f32": "PAD", "arange_f32": "ARANGE",
    # MoE routing
    "k_argsort_f32_i32": "ARGSORT_TOP_K", "init_indices": "ARGSORT_TOP_K", "init_offsets": "ARGSORT_TOP_K",
    "top_k_radix_gather": "ARGSORT_TOP_K", "top_k_radix_histogram": "ARGSORT_TOP_K",
    "top_k_radix_init": "ARGSORT_TOP_K", "top_k_radix_reset_counters": "ARGSORT_TOP_K",
    "top_k_radix_select": "ARGSORT_TOP_K",
    "topk_moe_cuda": "SOFT_MAX+ARGSORT_TOP_K+GET_ROWS",
    # gated delta net (Qwen3-Next)
    "ssm_conv_f32": "SSM_CONV", "ssm_conv_long_token_f32": "SSM_CONV", "gated_delta_net_cuda": "GATED_DELTA_NET",
    "gated_linear_attn_f32": "GATED_LINEAR_ATTN", "solve_tri_f32_fast": "SOLVE_TRI", "tri_kernel": "TRI",
}

#: the device function a templated kernel applies -> ggml op
BINARY_OPS = {"op_add": "ADD", "op_sub": "SUB", "op_mul": "MUL", "op_div": "DIV", "op_repeat": "REPEAT"}
UNARY_OPS = {"op_silu": "SILU", "op_gelu": "GELU", "op_gelu_erf": "GELU_ERF", "op_gelu_quick": "GELU_QUICK",
             "op_sigmoid": "SIGMOID", "op_softplus": "SOFTPLUS", "op_exp": "EXP", "op_relu": "RELU",
             "op_tanh": "TANH", "op_neg": "NEG", "op_sqr": "SQR", "op_sqrt": "SQRT", "op_abs": "ABS",
             "op_log": "LOG", "op_sin": "SIN", "op_cos": "COS", "op_elu": "ELU", "op_step": "STEP",
             "op_sgn": "SGN", "op_hardsigmoid": "HARDSIGMOID", "op_hardswish": "HARDSWISH", "op_expm1": "EXPM1"}

#: library kernels (cuBLAS, CUTLASS, CUB), by the patterns their names follow
LIBRARY_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.IGNORECASE), op) for p, op in (
    (r"gemm|gemv|xmma|cutlass|nvjet|cublas|sm\d\d_.*_(tn|nt|nn|tt)", "MUL_MAT"),
    (r"cub::|DeviceRadixSort|DeviceSegmentedSort|RadixSort", "ARGSORT_TOP_K"),
))

_BOOL_MANGLED = re.compile(r"Lb([01])E")
_BOOL_DEMANGLED = re.compile(r"\b(true|false)\b")


def _device_fn(name: str, table: dict[str, str]) -> str | None:
    """The first ``op_*`` device function named in a templated kernel's name that ``table`` knows."""
    for m in re.finditer(r"op_[a-z_]+", name):
        cand = m.group(0)
        # a mangled name runs the next length prefix or type code into the match: try prefixes
        for end in range(len(cand), 3, -1):
            if cand[:end] in table:
                return table[cand[:end]]
    return None


def _template_bools(name: str) -> list[bool]:
    """The ``bool`` template arguments of a kernel name, in order (mangled or demangled)."""
    found = _BOOL_MANGLED.findall(name) if name.startswith("_Z") else _BOOL_DEMANGLED.findall(name)
    return [b in ("1", "true") for b in found]


def kernel_op(name: str) -> str:
    """The ggml op (``+``-joined for a fused kernel) a llama.cpp CUDA kernel computes, or ""
    for a kernel this table does not know."""
    base = kernel_base_name(name)
    if base == "k_bin_bcast" or base == "k_bin_bcast_unravel":
        return _device_fn(name, BINARY_OPS) or "ADD"
    if base == "unary_op_kernel":
        return _device_fn(name, UNARY_OPS) or ""
    if base == "unary_gated_op_kernel":  # GLU: act(gate) * up (swiglu, geglu, ...)
        return "GLU"
    if base == "rms_norm_f32":  # template <block_size, do_multiply, do_add, do_scale>
        flags = _template_bools(name)
        fused = [op for op, on in zip(("MUL", "ADD", "SCALE"), flags) if on]
        return "+".join(["RMS_NORM", *fused])
    op = KERNEL_OPS.get(base)
    if op is not None:
        return op
    for pat, lib_op in LIBRARY_PATTERNS:
        if pat.search(name):
            return lib_op
    return ""


def op_family(op: str) -> str:
    """The workbench kernel family of an op (its first op for a fusion), as ``kernel_summary``
    and the simulator group kernels; "other" for ops the workbench does not model."""
    from ..graph.ops import OPS

    first = op.split("+", 1)[0]
    if first in OPS:
        return OPS[first].family
    return {"NORM": "norm", "GROUP_NORM": "norm", "SUB": "elementwise", "REPEAT": "copy", "CONCAT": "copy",
            "GELU": "elementwise", "CLAMP": "elementwise", "FILL": "elementwise"}.get(first, "other")
