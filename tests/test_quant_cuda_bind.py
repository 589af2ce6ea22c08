"""The cuda backend's quantised path, CPU-checkable parts: every node of every family's tiny
preset in each weight type binds to a kernel of ``kernels/mmvq.cu`` (or the plain kernels), and
a NumPy emulation of the mmvq kernels' integer dot products (word for word as the CUDA source
reads the blocks) run over the bound arguments matches the reference ops."""

from __future__ import annotations

import re

import numpy as np
import pytest

from workbench.exec import cuda_ops
from workbench.exec.cuda_quant_ops import MMVQ_TYPES, QUANTIZED_OPS
from workbench.exec.kernels import KERNEL_DIR, SOURCES
from workbench.graph import is_quantized
from workbench.models import build_graph, preset
from workbench.strategy import FUSIONS, Strategy
from workbench.strategy.compile import compile_plan

TINY = ("llama-tiny", "qwen3-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "qwen3-next-tiny")
ALL_ON = Strategy(fusion=frozenset(FUSIONS), allocator="stream-aware", streams="qkv")


def _addr(v) -> int:
    return 256 + v.offset  # every buffer at an aligned base, as the executor allocates them


@pytest.mark.parametrize("qtype", MMVQ_TYPES)
@pytest.mark.parametrize("name", TINY)
def test_every_quantised_node_binds(name, qtype):
    cfg = preset(name, weight_dtype=qtype)
    plan = compile_plan(build_graph(cfg, 64), ALL_ON)
    src = {s: (KERNEL_DIR / f"{s}.cu").read_text() for s in SOURCES}
    quantised = 0
    for la in plan.launches:
        node = la.node
        call = cuda_ops.bind(node, _addr, lambda key, n: 0)
        assert call.source in SOURCES and all(g >= 1 for g in call.grid), call
        assert any(re.search(rf"\b{call.name}\(", text) for text in src.values()), call.name
        if any(is_quantized(v.dtype) for v in (*node.srcs, *node.outs)):
            # the mmvq kernels, and the norm kernel that writes a q8_1 copy (norm-mat-vec)
            assert node.op in QUANTIZED_OPS and call.source in ("mmvq", "norm"), (node.name, call.name)
            quantised += 1
    # q4_k's 256-value blocks do not divide the tiny presets' rows: everything falls back to f16
    assert quantised > 0 or qtype == "q4_k"


def test_unsupported_block_type_names_the_fix():
    from workbench.exec.cuda_ops import BindError

    cfg = preset("llama-tiny", weight_dtype="q8_0")
    g = build_graph(cfg, 64)
    node = next(n for n in g.nodes if n.op == "MUL_MAT" and is_quantized(n.srcs[0].dtype))
    w = node.srcs[0]
    from dataclasses import replace

    bad = replace(node, srcs=(replace(w, dtype="q6_k", strides=(w.shape[-1] // 256 * 210, 210)), *node.srcs[1:]))
    with pytest.raises(BindError, match="q6_k weights have no cuda mat-vec"):
        cuda_ops.bind(bad, _addr, lambda key, n: 0)


# -------------------------------------------------------------------------------------------
# kernels/mmvq.cu's integer dot products, emulated word for word in NumPy (one thread's words
# at a time, over all blocks of a row at once): checks the block indexing of the CUDA source
# against the reference's dequantise-and-multiply.
# -------------------------------------------------------------------------------------------
def _word(b: np.ndarray, off) -> np.ndarray:
    """ld_b1/b2/b4: the little-endian 32-bit word at byte ``off`` of each block ([nb, bytes])."""
    off = np.broadcast_to(np.asarray(off), (b.shape[0],))
    idx = off[:, None] + np.arange(4)[None, :]
    return np.ascontiguousarray(np.take_along_axis(b, idx, axis=1)).view("<i4")[:, 0]


def _dp4a(a: np.ndarray, b: np.ndarray, c) -> np.ndarray:
    pa = np.ascontiguousarray(a.astype("<i4")).view(np.int8).reshape(-1, 4).astype(np.int64)
    pb = np.ascontiguousarray(b.astype("<i4")).view(np.int8).reshape(-1, 4).astype(np.int64)
    return (c + (pa * pb).sum(axis=1)).astype(np.int32)


def _half(b: np.ndarray, off) -> np.ndarray:
    off = np.broadcast_to(np.asarray(off), (b.shape[0],))
    idx = off[:, None] + np.arange(2)[None, :]
    return np.ascontiguousarray(np.take_along_axis(b, idx, axis=1)).view("<f2")[:, 0].astype(np.float32)


def _byte_perm(a, b, s) -> np.ndarray:
    """prmt.b32 with the selector's fourth bits cleared (mmvq.cu byte_perm, CUDA's __byte_perm)."""
    src = np.stack([np.asarray(a, np.uint32), np.asarray(b, np.uint32)], axis=-1)
    src = np.ascontiguousarray(np.broadcast_to(src, np.broadcast_shapes(src.shape, (np.asarray(s).size, 2))))
    bytes8 = src.view(np.uint8).reshape(-1, 8)
    s = np.broadcast_to(np.asarray(s, np.uint32), (bytes8.shape[0],))
    sel = np.stack([(s >> (4 * n)) & 7 for n in range(4)], axis=1).astype(np.int64)
    return np.ascontiguousarray(np.take_along_axis(bytes8, sel, axis=1)).view("<u4")[:, 0]


#: mmvq.cu's KV0..KV3: kvalues_mxfp4 as four words
KV = [0x03020100, 0x0C080604, 0xFDFEFF00, 0xF4F8FAFC]


def _mxfp4_lookup(q4: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = q4.astype("<i4").view(np.uint32)
    sel = np.uint32(0x32103210) | ((q & np.uint32(0x88888888)) >> np.uint32(1))
    t = [_byte_perm(_byte_perm(KV[0], KV[1], q >> sh), _byte_perm(KV[2], KV[3], q >> sh), sel >> sh)
         for sh in (np.uint32(0), np.uint32(16))]
    return _byte_perm(t[0], t[1], 0x6420).view("<i4"), _byte_perm(t[0], t[1], 0x7531).view("<i4")


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    e = e.astype(np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32).view(np.float32)


def _vec_dot(qtype: str, b: np.ndarray, y: np.ndarray, iqs: int) -> np.ndarray:
    """vec_dot<T>(block b, q8_1 blocks y, iqs) of kernels/mmvq.cu for every block of a row."""
    if qtype == "q8_0":
        s = 0
        for i in range(2):
            s = _dp4a(_word(b, 2 + 4 * (iqs + i)), _word(y, 4 + 4 * (iqs + i)), s)
        return _half(b, 0) * _half(y, 0) * s.astype(np.float32)
    if qtype in ("q4_0", "mxfp4"):
        s = sq = 0
        for i in range(2):
            u0, u1 = _word(y, 4 + 4 * (iqs + i)), _word(y, 4 + 4 * (iqs + i + 4))
            if qtype == "q4_0":
                v = _word(b, 2 + 4 * (iqs + i))
                lo, hi = v & 0x0F0F0F0F, (v >> 4) & 0x0F0F0F0F
                ones = np.full_like(u0, 0x01010101)
                sq = sq + _dp4a(ones, u1, _dp4a(ones, u0, 0))
            else:
                lo, hi = _mxfp4_lookup(_word(b, 1 + 4 * (iqs + i)))
            s = _dp4a(hi, u1, _dp4a(lo, u0, s))
        if qtype == "q4_0":
            return _half(b, 0) * _half(y, 0) * (s - 8 * sq).astype(np.float32)
        return _e8m0_half(b[:, 0]) * _half(y, 0) * s.astype(np.float32)
    # q4_k: y holds the 8 q8_1 blocks of each super-block side by side ([nb, 8 * 36])
    bq8, r = 2 * ((iqs // 2) // 4), (iqs // 2) % 4
    v0, v1 = _word(b, 16 + 16 * bq8 + 4 * r), _word(b, 16 + 16 * bq8 + 4 * r + 16)
    sc16 = np.ascontiguousarray(b[:, 4:16]).view("<u2").astype(np.uint32)
    j = bq8 // 2
    jm = j & 1
    s0, s2, s4 = sc16[:, jm], sc16[:, jm + 2], sc16[:, jm + 4]
    hi = np.uint32(0xFFFFFFFF if j >= 2 else 0)
    a0 = ((s0 & 0x3F3F) & ~hi) | ((((s4 >> 0) & 0x0F0F) | ((s0 & 0xC0C0) >> 2)) & hi)
    a1 = ((s2 & 0x3F3F) & ~hi) | ((((s4 >> 4) & 0x0F0F) | ((s2 & 0xC0C0) >> 2)) & hi)
    sum_d = sum_m = np.float32(0)
    for i in range(2):
        o = 36 * (bq8 + i)
        d8 = _half(y, o)
        u0, u1 = _word(y, o + 4 + 4 * r), _word(y, o + 4 + 4 * (r + 4))
        w0, w1 = (v0 >> (4 * i)) & 0x0F0F0F0F, (v1 >> (4 * i)) & 0x0F0F0F0F
        dot1 = _dp4a(w1, u1, _dp4a(w0, u0, 0))
        dot2 = _dp4a(np.full_like(u1, 0x01010101), u1, _dp4a(np.full_like(u0, 0x01010101), u0, 0))
        sc, m = ((a0 >> (8 * i)) & 0xFF).astype(np.int32), ((a1 >> (8 * i)) & 0xFF).astype(np.int32)
        sum_d = sum_d + d8 * (dot1 * sc).astype(np.float32)
        sum_m = sum_m + d8 * (dot2 * m).astype(np.float32)
    return _half(b, 0) * sum_d - _half(b, 2) * sum_m


#: 32-bit words of quants per block as ggml counts them (mmvq.cu QTraits::QI); VDR is 2 for all
QI = {"q8_0": 8, "q4_0": 4, "mxfp4": 4, "q4_k": 32}


def mmvq_emulated(qtype: str, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d[n] = the mmvq kernel's row n: uint8 weight blocks [N, K/QK*bytes], q8_1 blocks [K/32*36]."""
    from workbench.graph.tensor import BLOCK_TYPES

    size = BLOCK_TYPES[qtype][1]
    out = []
    for row in w:
        b = row.reshape(-1, size)
        yb = y.reshape(b.shape[0], -1)  # the q8_1 blocks of each weight block
        out.append(sum(_vec_dot(qtype, b, yb, iqs).astype(np.float64).sum() for iqs in range(0, QI[qtype], 2)))
    return np.array(out, np.float32)


@pytest.mark.parametrize("qtype,K", [("q8_0", 2880), ("q4_0", 2048), ("mxfp4", 2880), ("q4_k", 1024)])
def test_mmvq_integer_dot_products_match_dequantised_products(qtype, K):
    """The word-for-word emulation equals dequantise(w) @ dequantise(q8_1(x)), the reference's
    product, up to float summation order (q4_0 too: its "- 8" comes from sum(q8), not from
    llama.cpp's block float sum)."""
    from workbench.models.quant import dequantize, quantize

    rng = np.random.default_rng(1)
    w = quantize(rng.standard_normal((6, K)).astype(np.float32) / np.sqrt(K), qtype)
    y = quantize(rng.standard_normal(K).astype(np.float32), "q8_1")
    got = mmvq_emulated(qtype, w, y)
    want = dequantize(w, qtype).astype(np.float64) @ dequantize(y, "q8_1").astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("qtype", MMVQ_TYPES)
def test_get_rows_dequantisation_matches_quant(qtype):
    """k_get_rows_<type>'s per-value decoding (dequant<T> of mmvq.cu) equals quant.dequantize."""
    from workbench.graph.tensor import BLOCK_TYPES
    from workbench.models.quant import dequantize, quantize

    qk = BLOCK_TYPES[qtype][0]
    b = quantize(np.random.default_rng(2).standard_normal((64, qk)).astype(np.float32), qtype)
    j = np.arange(qk)
    if qtype == "q8_0":
        got = _half(b, 0)[:, None] * b[:, 2:].view(np.int8).astype(np.float32)
    elif qtype in ("q4_0", "mxfp4"):
        o = 2 if qtype == "q4_0" else 1
        q = np.where(j < 16, b[:, o + (j % 16)] & 15, b[:, o + (j % 16)] >> 4).astype(np.int64)
        if qtype == "q4_0":
            got = _half(b, 0)[:, None] * (q - 8).astype(np.float32)
        else:
            word = np.array(KV, np.uint32)[q // 4]
            val = ((word >> (8 * (q & 3)).astype(np.uint32)) & 0xFF).astype(np.uint8).view(np.int8)
            got = _e8m0_half(b[:, 0])[:, None] * val.astype(np.float32)
    else:
        c, w = j // 64, j % 64
        g = 2 * c + (w >= 32)
        byte = b[:, 16 + 32 * c + (w % 32)]
        q = np.where(w < 32, byte & 15, byte >> 4).astype(np.float32)
        s, g4 = b[:, 4:16].astype(np.int64), g % 4  # get_scale_min_k4 (g >= 4: s[g + 4] = s[g4 + 8])
        sc = np.where(g < 4, s[:, g4] & 63, (s[:, g4 + 8] & 0xF) | ((s[:, g4] >> 6) << 4))
        m = np.where(g < 4, s[:, g4 + 4] & 63, (s[:, g4 + 8] >> 4) | ((s[:, g4 + 4] >> 6) << 4))
        got = _half(b, 0)[:, None] * sc.astype(np.float32) * q - _half(b, 2)[:, None] * m.astype(np.float32)
    np.testing.assert_array_equal(got, dequantize(b, qtype))


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_quantised_kernels_cost_their_blocks_at_the_calibrated_bandwidth(gpu):
    """The simulator's op fits were measured on the float kernels: a quantised mat-vec takes a fit
    of its own mmvq kernel when the calibration has one (both shipped GPUs have, from their cold-L2
    sweeps: benchmarks/mmvq_sweep.py --fit), else the plain roofline of its bytes."""
    from dataclasses import replace

    from workbench.exec.calibration import FamilyCost, load_calibration
    from workbench.exec.cost import kernel_cost, measured_fit

    cal = load_calibration(gpu)
    g = build_graph(preset("llama-3.2-1b", layers=1, weight_dtype="q4_0"), 256)
    mm = next(n for n in g.nodes if n.op == "MUL_MAT" and n.srcs[0].dtype == "q4_0")
    assert measured_fit(mm, cal)[0] == "op/kernel"
    plain = replace(cal, ops={k: v for k, v in cal.ops.items() if "/k_mul_mat_vec_q_" not in k})
    assert measured_fit(mm, plain) == ("device", None)
    cost = kernel_cost(mm, plain)
    assert cost.threads == 128 and cost.work_ns == pytest.approx(mm.bytes / cal.dram_Bpns)
    own = replace(plain, ops={**plain.ops, "MUL_MAT/k_mul_mat_vec_q_q4_0": FamilyCost(1000.0, 1.1)})
    assert measured_fit(mm, own)[0] == "op/kernel"


def test_mmvq_first_read_placement_prefetches_weights_only(tmp_path):
    """Under ``first-read`` the quantised mat-vec sends its first weight blocks to L2 before the
    wait and reads the q8_1 activation after it; the expert variant waits before any load."""
    from test_kernels_cpu import _entries, _ptx

    entries = _entries(_ptx("mmvq", "first-read", "start", tmp_path))
    for qtype in MMVQ_TYPES:
        before, after = entries[f"k_mul_mat_vec_q_{qtype}"].split("griddepcontrol.wait")
        assert "prefetch.global.L2" in before and "ld.global" not in before and "ld.volatile" not in before, qtype
        assert "ld.global" not in entries[f"k_mul_mat_vec_q_id_{qtype}"].split("griddepcontrol.wait")[0], qtype


def test_device_draw_uploads_every_row_of_blocks(monkeypatch):
    """``weights="device"``: a block-typed weight is drawn in chunks of rows, quantised on the host
    and uploaded in row order (CuPy stood in for by NumPy over one host byte array)."""
    import ctypes
    import types

    from workbench.exec import device_weights
    from workbench.graph import GraphBuilder
    from workbench.models.quant import quantize

    monkeypatch.setattr(device_weights, "CHUNK", 1000)  # 10 rows of 96 values per chunk: 8 chunks
    space = np.zeros(20000, np.uint8)
    rt = types.SimpleNamespace(memcpy=lambda dst, src, n, kind: ctypes.memmove(dst, src, n))
    cp = types.SimpleNamespace(asnumpy=np.asarray, float32=np.float32, cuda=types.SimpleNamespace(runtime=rt))

    class Draws:
        def __init__(self) -> None:
            self.rng = np.random.default_rng(0)

        def standard_normal(self, n, dtype):
            return self.rng.standard_normal(n).astype(dtype)

    b = GraphBuilder("g")
    w = b.weight("w", (77, 96), "q4_0")
    device_weights._fill_quantized(cp, Draws(), w, space.ctypes.data + 64, 0.1)
    again = Draws()
    want = np.concatenate([again.standard_normal(min(10, 77 - r0) * 96, np.float32).reshape(-1, 96) * np.float32(0.1)
                           for r0 in range(0, 77, 10)])
    np.testing.assert_array_equal(space[64:64 + w.nbytes], quantize(want, "q4_0").reshape(-1))
    assert not space[:64].any() and not space[64 + w.nbytes:].any()
