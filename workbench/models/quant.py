"""ggml's block quantisation in NumPy, bit-exact: q8_0, q4_0, q4_k, mxfp4 weights and the q8_1
activation blocks llama.cpp's CUDA mat-vec (mmvq) multiplies them with; q6_k is dequantised
only (it is read from GGUF files, never written).

A quantised tensor is stored as ggml stores it: each row of ``n`` values becomes ``n / block``
blocks of ``type_size`` bytes, so a ``[rows, n]`` tensor is a ``[rows, n / block * type_size]``
uint8 array (``workbench.graph.tensor.BLOCK_TYPES`` has the sizes). Quantisation follows the
``quantize_row_*_ref`` functions of ``ggml-quants.c`` (what ``llama-quantize`` and the GGUF
converter run without an importance matrix) and CUDA's ``quantize_q8_1``; ``tests/test_quant.py``
checks them against the ``gguf`` package and ggml itself.
"""

from __future__ import annotations

import numpy as np

from ..graph.tensor import BLOCK_TYPES

#: mxfp4's e2m1 code points, doubled (ggml's ``kvalues_mxfp4``); the scale is halved to match.
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


#: blocks quantised at a time (a 2^16-block chunk's temporaries stay in the tens of MiB)
CHUNK_BLOCKS = 1 << 16


class QuantError(ValueError):
    """A tensor that cannot be stored in a block type (its rows are not whole blocks)."""


def row_bytes(n: int, qtype: str) -> int:
    """Bytes of one row of ``n`` values (ggml_row_size)."""
    block, size = BLOCK_TYPES[qtype]
    if n % block:
        raise QuantError(f"a row of {n} values is not a whole number of {qtype} blocks ({block} values each)")
    return n // block * size


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """float array ``[..., n]`` -> uint8 blocks ``[..., row_bytes(n)]``."""
    x = np.ascontiguousarray(x, np.float32)
    if qtype not in _QUANTIZE:
        raise QuantError(f"{qtype} is read from GGUF files only; the workbench does not quantise to it")
    block, size = BLOCK_TYPES[qtype]
    nbytes = row_bytes(x.shape[-1], qtype)
    blocks = x.reshape(-1, block)
    out = np.empty((blocks.shape[0], size), np.uint8)
    for lo in range(0, blocks.shape[0], CHUNK_BLOCKS):  # bounded temporaries for large tensors
        out[lo:lo + CHUNK_BLOCKS] = _QUANTIZE[qtype](blocks[lo:lo + CHUNK_BLOCKS])
    return out.reshape(*x.shape[:-1], nbytes)


def dequantize(q: np.ndarray, qtype: str) -> np.ndarray:
    """uint8 blocks ``[..., bytes]`` -> float32 ``[..., n]`` (ggml's ``dequantize_row_*``)."""
    block, size = BLOCK_TYPES[qtype]
    q = np.ascontiguousarray(q, np.uint8)
    if q.shape[-1] % size:
        raise QuantError(f"{q.shape[-1]} bytes per row is not a whole number of {qtype} blocks ({size} B each)")
    out = _DEQUANTIZE[qtype](q.reshape(-1, size))
    return out.reshape(*q.shape[:-1], q.shape[-1] // size * block)


# ------------------------------------------------------------------------------------------ helpers

def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even in float32 (the 1.5 * 2^23 trick)."""
    return np.rint(x.astype(np.float32)).astype(np.int32)


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    return np.asarray(d, np.float32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 32] values 0..15 -> [n, 16] bytes: value j in the low nibble, j + 16 in the high one."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << 4)


def _unpack_nibbles(b: np.ndarray) -> np.ndarray:
    return np.concatenate([b & 0x0F, b >> 4], axis=1)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


# ------------------------------------------------------------------------------------------ q8_0

def _quantize_q8_0(x: np.ndarray) -> np.ndarray:
    d = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    qs = _roundf(x * _inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_f16_bytes(d), qs], axis=1)


def _dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


# ------------------------------------------------------------------------------------------ q8_1

def _quantize_q8_1(x: np.ndarray) -> np.ndarray:
    """CUDA's ``quantize_q8_1``: ``q = roundf(x / d)``, ``d = amax / 127``; the half2 ``ds``
    holds ``d`` and the block's float sum (which q4_0/q4_k dot products use for their offset)."""
    amax = np.abs(x).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(amax == 0, np.float32(0), _roundf(x / d))
    s = x.sum(axis=1, dtype=np.float32, keepdims=True)
    return np.concatenate([_f16_bytes(d), _f16_bytes(s), q.astype(np.int8).view(np.uint8)], axis=1)


def _dequantize_q8_1(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * b[:, 4:].view(np.int8).astype(np.float32)


# ------------------------------------------------------------------------------------------ q4_0

def _quantize_q4_0(x: np.ndarray) -> np.ndarray:
    i = np.abs(x).argmax(axis=1)[:, None]  # the first value of the largest magnitude, signed
    d = (np.take_along_axis(x, i, axis=1) / np.float32(-8)).astype(np.float32)
    q = np.minimum(15, np.trunc(x * _inverse(d) + np.float32(8.5))).astype(np.uint8)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q)], axis=1)


def _dequantize_q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * (_unpack_nibbles(b[:, 2:]).astype(np.float32) - 8)


# ------------------------------------------------------------------------------------------ mxfp4

def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32 (denormal for e < 2)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    return bits.view(np.float32)


def _quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    amax = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    d = _e8m0_half(e)
    err = np.abs(MXFP4_VALUES[None, None, :] * d[:, :, None] - x[:, :, None])
    q = err.argmin(axis=2)  # the first code of the smallest error, as best_index_mxfp4
    return np.concatenate([e, _pack_nibbles(q)], axis=1)


def _dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    return _e8m0_half(b[:, :1]) * MXFP4_VALUES[_unpack_nibbles(b[:, 1:])]


# ------------------------------------------------------------------------------------------ q4_k

def _make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int = 15, rmin: float = -1.0, rdelta: float = 0.1,
                      nstep: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` over many 32-value groups at once ([g, 32]): an asymmetric
    4-bit grid whose scale and min are refitted by weighted least squares for 21 candidate
    scales. Sums run in element order in float32, as the C loops do. Returns (L, scale, -min)."""
    f32 = np.float32
    n = x.shape[1]
    mn = mn0 = np.minimum(x.min(axis=1), f32(0))
    mx = x.max(axis=1)
    sum_w, sum_x = w[:, 0].copy(), w[:, 0] * x[:, 0]
    for i in range(1, n):
        sum_w = sum_w + w[:, i]
        sum_x = sum_x + w[:, i] * x[:, i]
    flat = mx == mn
    rng = np.where(flat, f32(1), mx - mn)
    iscale = (f32(nmax) / rng).astype(f32)
    scale = (f32(1) / iscale).astype(f32)
    L = np.clip(_nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    best = np.zeros_like(sum_w)
    for i in range(n):
        diff = scale * L[:, i].astype(f32) + mn - x[:, i]
        best = best + w[:, i] * (diff * diff)
    for step in range(nstep + 1):
        rng = np.where(flat, f32(1), mx - mn)  # the C code divides by the current (refitted) min
        iscale = ((f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / rng).astype(f32)
        La = np.clip(_nearest_int(iscale[:, None] * (x - mn[:, None])), 0, nmax)
        Lf = La.astype(f32)
        sum_l = np.zeros_like(sum_w)
        sum_l2 = np.zeros_like(sum_w)
        sum_xl = np.zeros_like(sum_w)
        for i in range(n):
            wl = w[:, i] * Lf[:, i]
            sum_l = sum_l + wl
            sum_l2 = sum_l2 + wl * Lf[:, i]
            sum_xl = sum_xl + wl * x[:, i]
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Dsafe = np.where(ok, D, f32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Dsafe
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Dsafe
        pos = this_min > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale).astype(f32)
        this_min = np.where(pos, f32(0), this_min).astype(f32)
        cur = np.zeros_like(sum_w)
        for i in range(n):
            diff = this_scale * Lf[:, i] + this_min - x[:, i]
            cur = cur + w[:, i] * (diff * diff)
        take = ok & (cur < best)
        L = np.where(take[:, None], La, L)
        best = np.where(take, cur, best)
        scale = np.where(take, this_scale, scale)
        mn = np.where(take, this_min, mn)
    scale = np.where(flat, f32(0), scale)
    L = np.where(flat[:, None], 0, L)
    return L, scale.astype(f32), (-np.where(flat, mn0, mn)).astype(f32)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_K_ref``: 8 groups of 32 with 6-bit scales and mins under f16 ``d``,
    ``dmin``; values re-rounded against the quantised scales."""
    f32 = np.float32
    nb = x.shape[0]
    g = x.reshape(nb * 8, 32)
    sum_x2 = np.zeros(g.shape[0], f32)
    for i in range(32):
        sum_x2 = sum_x2 + g[:, i] * g[:, i]
    av_x = np.sqrt(sum_x2 / f32(32)).astype(f32)
    L, scales, mins = _make_qkx2_quants(g, (av_x[:, None] + np.abs(g)).astype(f32))
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=1), f32(0))
    max_min = np.maximum(mins.max(axis=1), f32(0))
    inv_scale = np.where(max_scale > 0, f32(63) / np.where(max_scale > 0, max_scale, f32(1)), f32(0)).astype(f32)
    inv_min = np.where(max_min > 0, f32(63) / np.where(max_min > 0, max_min, f32(1)), f32(0)).astype(f32)
    ls = np.minimum(63, _nearest_int(inv_scale[:, None] * scales).astype(np.uint8))
    lm = np.minimum(63, _nearest_int(inv_min[:, None] * mins).astype(np.uint8))
    packed = np.zeros((nb, 12), np.uint8)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    d = (max_scale / f32(63)).astype(np.float16)
    dmin = (max_min / f32(63)).astype(np.float16)
    sc, m = _scale_min_k4(packed)
    dd = (d.astype(f32)[:, None] * sc).reshape(-1)
    dm = (dmin.astype(f32)[:, None] * m).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(_nearest_int((g + dm[:, None]) / dd[:, None]), 0, 15)
    L = np.where((dd != 0)[:, None], requant, L).reshape(nb, 4, 2, 32)
    qs = (L[:, :, 0] | (L[:, :, 1] << 4)).astype(np.uint8).reshape(nb, 128)
    return np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), packed, qs], axis=1)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``get_scale_min_k4`` for all 8 groups: the 6-bit scales and mins as float32."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), m.astype(np.float32)


def _dequantize_q4_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    q = b[:, 16:].reshape(nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (q & 0x0F).reshape(nb, 8, 32).astype(np.float32)
    return ((d * sc)[:, :, None] * q - (dmin * m)[:, :, None]).reshape(nb, 256)


# ------------------------------------------------------------------------------------------ q6_k

def _dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """``dequantize_row_q6_K``: per 128-value half, 4 low bits from ``ql`` and 2 high bits from
    ``qh`` minus 32, times ``d * scale`` of its 16-value group (int8 scales, f16 d)."""
    nb = b.shape[0]
    ql = b[:, :128].reshape(nb, 2, 64)
    qh = b[:, 128:192].reshape(nb, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32).reshape(nb, 2, 8)
    d = _f16(b[:, 208:210]).reshape(nb, 1, 1)
    lo = np.stack([ql[:, :, :32] & 0xF, ql[:, :, 32:] & 0xF, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
    hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)
    q = (lo | (hi << 4)).astype(np.float32) - 32  # [nb, half, 4 quarters, 32]
    scale = sc.reshape(nb, 2, 4, 2)  # group of 16: is + 2 * quarter, is = l // 16
    out = d[..., None] * np.repeat(scale, 16, axis=3) * q
    return out.reshape(nb, 256)


_QUANTIZE = {"q8_0": _quantize_q8_0, "q8_1": _quantize_q8_1, "q4_0": _quantize_q4_0,
             "mxfp4": _quantize_mxfp4, "q4_k": _quantize_q4_k}
_DEQUANTIZE = {"q8_0": _dequantize_q8_0, "q8_1": _dequantize_q8_1, "q4_0": _dequantize_q4_0,
               "mxfp4": _dequantize_mxfp4, "q4_k": _dequantize_q4_k, "q6_k": _dequantize_q6_k}
