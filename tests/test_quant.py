"""ggml's block types in NumPy (workbench.models.quant): bit-exact against the ``gguf`` package's
quantize/dequantize and against ggml's own ``ggml_quantize_chunk`` (the cached CPU build)."""

from __future__ import annotations

import ctypes

import gguf
import gguf.quants as gq
import numpy as np
import pytest

from workbench.graph import BLOCK_TYPES
from workbench.models import quant

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_k": gguf.GGMLQuantizationType.Q4_K, "mxfp4": gguf.GGMLQuantizationType.MXFP4}


def sample(rows: int = 48, cols: int = 512, scale: float = 0.05, seed: int = 0) -> np.ndarray:
    """Gaussian rows plus the edge cases the C code branches on: an all-zero block, a constant
    block, an all-positive row, one outlier."""
    x = np.random.default_rng(seed).normal(0, scale, (rows, cols)).astype(np.float32)
    x[0, :256] = 0
    x[1, :256] = 0.5
    x[2] = np.abs(x[2])
    x[3, 7] = 40 * scale
    return x


@pytest.mark.parametrize("qtype", sorted(GGML))
def test_block_sizes_are_ggml_s(qtype):
    assert BLOCK_TYPES[qtype] == gguf.GGML_QUANT_SIZES[GGML[qtype]]


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "mxfp4"])
@pytest.mark.parametrize("scale", [0.02, 1.0, 300.0])
def test_quantize_matches_gguf(qtype, scale):
    x = sample(scale=scale)
    assert np.array_equal(quant.quantize(x, qtype), gq.quantize(x, GGML[qtype]))


@pytest.mark.parametrize("qtype", sorted(GGML))
def test_dequantize_matches_gguf(qtype):
    q = quant.quantize(sample(), qtype)
    got = quant.dequantize(q, qtype)
    assert got.shape == (48, 512)
    assert np.array_equal(got, gq.dequantize(q, GGML[qtype]))


def test_random_bytes_dequantize_as_gguf_does():
    """Every bit pattern of the scale and value fields decodes as gguf does (not only the ones
    our quantiser writes); scales that overflow float32 (f16 inf/nan, e8m0 > 2^127) are left out."""
    rng = np.random.default_rng(3)
    for qtype in GGML:
        block, size = BLOCK_TYPES[qtype]
        q = rng.integers(0, 256, (64, size * 2), dtype=np.uint8)
        if qtype == "mxfp4":
            q.reshape(64, 2, size)[:, :, 0] &= 0x7F  # scales up to 2^-1: no float32 overflow
        else:
            q.reshape(64, 2, size)[:, :, 1] &= 0x3B  # f16 d (and dmin) finite
            if qtype == "q4_k":
                q.reshape(64, 2, size)[:, :, 3] &= 0x3B
        assert np.array_equal(quant.dequantize(q, qtype), gq.dequantize(q, GGML[qtype])), qtype


def test_q6_k_is_read_only_and_dequantizes_as_gguf_does():
    """q6_k (the output of a Q4_K_M file): any bytes with a finite f16 d decode as gguf does."""
    q = np.random.default_rng(4).integers(0, 256, (64, 420), dtype=np.uint8)
    q.reshape(64, 2, 210)[:, :, 209] &= 0x3B
    assert np.array_equal(quant.dequantize(q, "q6_k"), gq.dequantize(q, gguf.GGMLQuantizationType.Q6_K))
    with pytest.raises(quant.QuantError, match="q6_k is read from GGUF files only"):
        quant.quantize(np.zeros((1, 256)), "q6_k")


def test_q8_1_is_cuda_quantize_q8_1():
    """d = amax / 127 (f16), q = roundf(x / d), s = the block's float sum (f16)."""
    x = sample(rows=4, cols=64)[2:]
    q = quant.quantize(x, "q8_1").reshape(2, 2, 36)
    d = q[..., :2].copy().view(np.float16).astype(np.float32)[..., 0]
    s = q[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
    blocks = x.reshape(2, 2, 32)
    assert np.array_equal(d, (np.abs(blocks).max(-1) / 127).astype(np.float16).astype(np.float32))
    assert np.allclose(s, blocks.sum(-1), rtol=1e-3, atol=1e-3)
    back = quant.dequantize(q.reshape(2, 72), "q8_1")
    assert np.abs(back - x).max() <= np.abs(x).max() / 127 / 2 * 1.01
    assert np.all(quant.dequantize(quant.quantize(np.zeros((1, 32)), "q8_1"), "q8_1") == 0)


def test_rows_must_be_whole_blocks():
    with pytest.raises(quant.QuantError, match="not a whole number of q4_k blocks"):
        quant.quantize(np.zeros((2, 64)), "q4_k")


@pytest.fixture(scope="module")
def ggml_quantize(llamacpp_lib):
    """ggml's ``ggml_quantize_chunk`` from the cached CPU build of the peer llama.cpp."""
    from pathlib import Path

    lib = ctypes.CDLL(str(next(Path(llamacpp_lib).glob("libggml-base.so*"))))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_void_p]

    def run(x: np.ndarray, qtype: str) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        out = np.zeros((x.shape[0], quant.row_bytes(x.shape[1], qtype)), np.uint8)
        fn(int(GGML[qtype]), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None)
        return out
    return run


@pytest.mark.slow
@pytest.mark.parametrize("qtype", sorted(GGML))
@pytest.mark.parametrize("scale", [0.02, 1.0, 300.0])
def test_quantize_matches_ggml(ggml_quantize, qtype, scale):
    """q4_k's quantiser (make_qkx2_quants' 21-candidate weighted refit) has no gguf twin: ggml
    itself is the check, byte for byte."""
    x = sample(rows=64, cols=1024, scale=scale, seed=int(scale * 10))
    assert np.array_equal(quant.quantize(x, qtype), ggml_quantize(x, qtype))


@pytest.mark.parametrize("model", ["llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny"])
def test_fusions_leave_quantised_logits_unchanged(model):
    """Every fusion on, with q8_0 weights: the reference gives the unfused logits exactly (the
    mat-vec fusions skip quantised weights, whose fused twins do not exist yet)."""
    import workbench
    from workbench.models import preset
    from workbench.strategy import ALL_ON, Strategy

    cfg = preset(model, weight_dtype="q8_0")
    plain = workbench.run(cfg, Strategy(), tokens=3, backend="reference", quiet=True).logits
    fused = workbench.run(cfg, ALL_ON, tokens=3, backend="reference", quiet=True).logits
    assert np.array_equal(plain, fused)
