"""llama.cpp CUDA kernel names -> ggml ops (CPU: names as CUPTI reports them, mangled, and as
Nsight Systems shows them, demangled)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workbench.llamacpp.build import BuildError, find_source
from workbench.llamacpp.kernels import KERNEL_OPS, kernel_op, op_family


@pytest.mark.parametrize("name, op", [
    ("_Z13mul_mat_vec_fI6__halfLi1ELi128ELb0EEvPKT_PKfPKiPfiiiiiiiiiiiii", "MUL_MAT"),
    ("mul_mat_vec_q<(ggml_type)8, 1, false>(void const*, void const*, int const*, float*)", "MUL_MAT"),
    ("_Z12rms_norm_f32ILi256ELb0ELb0ELb0EEvPKfPfilllf", "RMS_NORM"),
    ("_Z12rms_norm_f32ILi256ELb1ELb0ELb0EEvPKfPfilllfS1_lll", "RMS_NORM+MUL"),
    ("rms_norm_f32<1024, true, true, false>(float const*, float*, int)", "RMS_NORM+MUL+ADD"),
    ("_Z18flash_attn_ext_vecILi64ELi1EL9ggml_type1ELS0_1ELb0EEvPKcS2_S2_S2_S2_PKiPfP6float2ffffffjfiiiiiiiiiiiliiliiiiil",
     "FLASH_ATTN_EXT"),
    ("_Z9rope_neoxILb1ELb0EfEvPKT1_PS0_iiiiiiiPKiffff14rope_corr_dimsfPKfPKll", "ROPE"),
    ("rope_norm<true, false, float>(float const*, float*)", "ROPE"),
    ("_Z10k_get_rowsI6__halffEvPKvPKiPT0_lllmmmmmmmmm", "GET_ROWS"),
    ("_Z10k_set_rowsIf6__halfEvPKT_PKlPT0_lllllllmmmmmmmmmmm", "SET_ROWS"),
    ("_Z11k_bin_bcastIXadL_ZL6op_addffEEfffJEEvPKT0_PKT1_PT2_iiiiiiiiiiiiiiiiiiiDpT3_", "ADD"),
    ("k_bin_bcast<&op_mul, float, float, float>(float const*, float const*, float*)", "MUL"),
    ("_Z15unary_op_kernelIXadL_ZL7op_siluffEEfEvPKT0_PS0_i", "SILU"),
    ("_Z21unary_gated_op_kernelIXadL_ZL7op_siluffEEfEvPKT0_S2_PS0_lllll", "GLU"),
    ("_Z12soft_max_f32ILb1ELi0ELi0EfEvPKfPKT2_S1_Pf15soft_max_params", "SOFT_MAX"),
    ("_Z13topk_moe_cudaILm8ELb1ELb0EEvPKfPfPiiiif", "SOFT_MAX+ARGSORT_TOP_K+GET_ROWS"),
    ("_Z20gated_delta_net_cudaILi128ELb0EEvPKfS1_S1_S1_S1_S1_Pfllll", "GATED_DELTA_NET"),
    ("_Z12ssm_conv_f32ILm4EEvPKfS1_iiiiPfiiil", "SSM_CONV"),
    ("_Z13add_id_kernelPKfS0_PKiPfllmmmmmmmm", "ADD_ID"),
    ("_Z17swiglu_oai_kernelIfEvPKT_S2_PS0_lllllff", "GLU"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "MUL_MAT"),
    ("_Z10cpy_scalarIXadL_ZL13cpy_1_scalarIffEvPKcPcEEEvS2_S3_illllllllllllll", "CPY"),
    ("some_kernel_we_do_not_know", ""),
])
def test_kernel_names_map_to_ggml_ops(name, op):
    assert kernel_op(name) == op


def test_families_follow_the_first_op():
    assert op_family("RMS_NORM+MUL") == "norm"
    assert op_family("MUL_MAT") == "mul_mat"
    assert op_family("FLASH_ATTN_EXT") == "attn"
    assert op_family("") == "other"


def test_every_mapped_kernel_exists_in_the_peer_tree():
    """The table names kernels of the llama.cpp it describes (no invented names)."""
    try:
        src = find_source()
    except BuildError as e:
        pytest.skip(str(e))
    text = "\n".join(p.read_text(errors="replace") for p in (src / "ggml" / "src" / "ggml-cuda").glob("*.cu*"))
    missing = sorted(k for k in KERNEL_OPS if not re.search(rf"__global__[^;{{}}]*?\b{k}\s*\(", text))
    assert not missing, f"kernels not defined in {Path(src, 'ggml/src/ggml-cuda')}: {missing}"


def test_worker_trace_names_kernels_by_op_and_marks_tokens():
    """The worker's post-processing of a CUPTI capture (CPU: records shaped as CUPTI gives them
    for two replays of one llama.cpp CUDA graph)."""
    from workbench.llamacpp.worker import finish_trace
    from workbench.trace.cupti import records_to_trace

    kernels = ["_Z12rms_norm_f32ILi256ELb1ELb0ELb0EEvPKfPfilllfS1_lll",
               "_Z13mul_mat_vec_fI6__halfLi1ELi128ELb0EEvPKT_PKfPKiPfiiiiiiiiiiiii",
               "_Z18flash_attn_ext_vecILi64ELi1EL9ggml_type1ELS0_1ELb0EEvPKcS2_S2_S2_S2_PKiPfP6float2ffffffjfiiiiii",
               "mystery_kernel"]
    recs, marks = [], []
    for tok in range(2):
        t0 = 1_000_000 * (tok + 1)
        marks.append((tok, t0))
        recs.append(dict(src="runtime", name="cudaGraphLaunch_v10000", start=t0 + 10, end=t0 + 40, corr=100 + tok,
                         tid=1, pid=1))
        recs.append(dict(src="runtime", name="cudaStreamSynchronize", start=t0 + 50, end=t0 + 900, corr=200 + tok,
                         tid=1, pid=1))
        for i, name in enumerate(kernels):
            recs.append(dict(src="kernel", name=name, start=t0 + 60 + 100 * i, end=t0 + 150 + 100 * i,
                             corr=100 + tok, stream=14, graph_id=3, graph_node_id=i, device=0))

    class Capture:  # what CuptiCapture holds after a run
        def __init__(self):
            self.marks, self.end_mark = marks, 3_000_000

        def stop(self):
            return records_to_trace(recs, self.marks, end_mark=self.end_mark, backend="llamacpp")

    tr = finish_trace(Capture(), 2)
    ev = tr.events
    k = ev[ev["kind"] == "kernel"]
    assert list(k[k["token"] == 1]["op"]) == ["RMS_NORM+MUL", "MUL_MAT", "FLASH_ATTN_EXT", ""]
    assert list(k[k["token"] == 1]["family"]) == ["norm", "mul_mat", "attn", "other"]
    assert (k["row"] == "Stream 14").all()
    m = ev[ev["kind"] == "marker"].sort_values("token")
    assert list(m["name"]) == ["token 0", "token 1"] and list(m["end_ns"]) == [2_000_000, 3_000_000]
    assert tr.meta["backend"] == "llamacpp" and tr.meta["source"] == "cupti"
    assert set(ev.loc[ev["kind"] == "sync", "token"]) == {0, 1}
