"""Quantised weights on the GPU (kernels/mmvq.cu): each kernel against the NumPy reference op at
full-size shapes, then every family's tiny preset per weight type through ``workbench.run``
against the reference backend.

Why the tolerances hold. ``k_quantize_q8_1`` computes ``d = amax / 127`` and ``roundf(x / d)``
in IEEE float32 as ``quant._quantize_q8_1`` does, so its ``d`` and quants are bit-identical;
only the block sum ``s`` is summed in another order (one f16 ulp at most, and no mat-vec here
reads it). The mat-vecs compute exactly the products of the dequantised blocks, as the
reference does (q4_0's "- 8" from ``sum(q8)``), in integers per word and float32 per block, so
they differ from the reference only by float32 summation order: relative ~1e-6 over K <= 14336
terms, checked at ``KERNEL_TOL`` = 1e-4 of the largest output. Whole models then differ by that
order of summation, by the fp16 KV-cache roundings ``gpu_cases`` explains, and where an
activation lies within an ulp of a q8_1 rounding boundary, by one quant step (1/254 of its
block's largest value) of that element, propagated through the layers: the CPU parity run
(data/bench/quant_cpu_parity.md) saw such flips move logits by up to 1.3e-2 of the largest, so
whole models are held to ``MODEL_TOL`` = 3e-2, which still fails a wrong block index, scale or
stride (errors of order 1). Node by node (each output against the reference op's, both chains
from the same inputs) ``NODE_TOL`` = 1e-2 of the output's largest value admits one such flipped
q8_1 step (at most 1/127 of a block's largest value).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_cases import TINY, record, rel_err

import workbench
from workbench.exec.cuda_ops import bind
from workbench.exec.memory import Memory
from workbench.exec.reference import load_static
from workbench.exec.reference_ops import NUMPY_OPS
from workbench.graph import GraphBuilder
from workbench.models import build_graph, preset
from workbench.models.blocks import step_input_values
from workbench.models.quant import quantize
from workbench.models.weights import random_weights
from workbench.strategy import FUSIONS, Strategy

KERNEL_TOL = 1e-4
MODEL_TOL = 3e-2
NODE_TOL = 1e-2
QTYPES = ("q8_0", "q4_0", "q4_k", "mxfp4")
#: (type, N, K): Llama-3.2-1B / 3.1-8B projections, gpt-oss's 2880, q4_k on whole super-blocks; N = 1003
#: leaves the last block of MMVQ_ROWS_PER_BLOCK rows partial
MATVEC = [(q, n, k) for q in ("q8_0", "q4_0", "mxfp4") for n, k in ((2048, 2048), (1024, 4096), (2880, 2880),
                                                                      (4096, 14336), (1003, 2048))] \
    + [("q4_k", n, k) for n, k in ((2048, 2048), (1024, 4096), (512, 14336), (1003, 2048))]


def _run_graph(graph, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> tuple[Memory, Memory]:
    """Every node of ``graph`` launched in order on the GPU (one device allocation per buffer)
    and run by its NumPy twin; returns (gpu, reference) Memories over the same buffers."""
    import cupy as cp

    from workbench.exec.device import device_info
    from workbench.exec.kernels import LaunchHandle, module_cache

    ref = Memory()
    for name, v in graph.weights.items():
        ref.load(v, weights[name])
    for name, value in inputs.items():
        ref.write(graph.inputs[name], value)
    dev = {}
    for b in graph.buffers().values():
        dev[b.name] = cp.asarray(ref.buffer(b))
    modules = module_cache(device_info().compute_capability)
    stream = cp.cuda.get_current_stream()
    for node in graph.nodes:
        call = bind(node, lambda v: int(dev[v.buffer.name].data.ptr) + v.offset, lambda key, n: 0)
        fn = modules.function(call.source, call.name)
        LaunchHandle(call.name, fn, call.grid, call.block, stream.ptr, call.args, pdl=False)()
        NUMPY_OPS[node.op](node, ref)
    stream.synchronize()
    gpu = Memory()
    for name, a in dev.items():
        gpu.arrays[name] = cp.asnumpy(a)
    return gpu, ref


def _weights(rng, shape: tuple[int, ...], qtype: str) -> np.ndarray:
    return quantize((rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32), qtype)


def _tiled_weights(rng, shape: tuple[int, ...], qtype: str, tile: int = 64) -> np.ndarray:
    """``tile`` quantised rows repeated over ``shape`` (q4_k's NumPy quantiser is slow on whole
    expert stacks; the kernels' indexing sees distinct rows within each tile)."""
    rows = int(np.prod(shape[:-1]))
    blocks = _weights(rng, (tile, shape[-1]), qtype)
    return np.tile(blocks.reshape(tile, -1), (-(-rows // tile), 1))[:rows].reshape(*shape[:-1], -1)


def _close(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("qtype,N,K", MATVEC, ids=[f"{q}-{n}x{k}" for q, n, k in MATVEC])
def test_quantize_q8_1_and_mul_mat_vec_q(qtype, N, K):
    rng = np.random.default_rng(N + K)
    b = GraphBuilder("mmvq")
    w = b.weight("w", (N, K), qtype)
    x = b.input("x", (1, K), "f32")
    xq = b.op("QUANTIZE_Q8_1", "x_q8_1", [x], (1, K), dtype="q8_1")
    b.op("MUL_MAT", "out", [w, xq], (1, N))
    g = b.build()
    gpu, ref = _run_graph(g, {"w": _weights(rng, (N, K), qtype)}, {"x": rng.standard_normal((1, K))})
    qg, qr = gpu.raw(xq).reshape(-1, 36), ref.raw(xq).reshape(-1, 36)
    np.testing.assert_array_equal(qg[:, 4:], qr[:, 4:])  # quants
    np.testing.assert_array_equal(qg[:, :2], qr[:, :2])  # d
    sg, sr = (np.ascontiguousarray(a[:, 2:4]).view("<f2")[:, 0].astype(np.float32) for a in (qg, qr))
    assert np.all(np.abs(sg - sr) <= np.abs(np.spacing(sr.astype(np.float16))).astype(np.float32) + 1e-7)
    out = g.nodes[-1].dst
    err = _close(gpu.read(out), ref.read(out).astype(np.float64))
    record(test="quant_matvec", qtype=qtype, N=N, K=K, rel_err=err)
    assert err <= KERNEL_TOL, f"{qtype} {N}x{K}: rel err {err:.3g}"


@pytest.mark.parametrize("x_rows", [1, 4])
@pytest.mark.parametrize("qtype,N,K", [("q8_0", 768, 2048), ("q4_0", 768, 2048), ("mxfp4", 2880, 2880),
                                       ("q4_k", 512, 2048), ("q4_0", 1003, 2048)])
def test_mul_mat_vec_q_id(qtype, N, K, x_rows):
    """Experts [8, N, K] picked by ids (one repeated); the activation one row for all or one per expert."""
    rng = np.random.default_rng(7)
    E, ids = 8, np.array([5, 0, 7, 5], np.int32)
    b = GraphBuilder("mmvq_id")
    w = b.weight("w", (E, N, K), qtype)
    x = b.input("x", (x_rows, K), "f32")
    i = b.input("ids", (len(ids),), "i32")
    xq = b.op("QUANTIZE_Q8_1", "x_q8_1", [x], (x_rows, K), dtype="q8_1")
    b.op("MUL_MAT_ID", "out", [w, xq, i], (len(ids), N))
    g = b.build()
    gpu, ref = _run_graph(g, {"w": _weights(rng, (E, N, K), qtype)},
                          {"x": rng.standard_normal((x_rows, K)), "ids": ids})
    out = g.nodes[-1].dst
    err = _close(gpu.read(out), ref.read(out).astype(np.float64))
    record(test="quant_matvec_id", qtype=qtype, N=N, K=K, x_rows=x_rows, rel_err=err)
    assert err <= KERNEL_TOL, f"{qtype} ids {N}x{K}: rel err {err:.3g}"


#: (op, type, N, K, experts stored, selected): llama.cpp's mmvq fusions at full width (Llama-3.2-1B
#: gate/up and down, Qwen3-30B-A3B's experts, gpt-oss's 2880; fewer experts stored than the models
#: have, as the host quantises them all, and q4_k, whose NumPy quantiser is slow, on fewer rows);
#: N = 1003 leaves a row group partial
FAST_QTYPES = ("q8_0", "q4_0", "mxfp4")
FUSED = [("MUL_MAT_GLU", q, 8192, 2048, 0, 0) for q in FAST_QTYPES] + [("MUL_MAT_GLU", "mxfp4", 2880, 2880, 0, 0)] \
    + [("MUL_MAT_ADD", q, n, k, 0, 0) for q in FAST_QTYPES for n, k in ((2048, 8192), (1003, 2048))] \
    + [("MUL_MAT_ID_GLU", q, 768, 2048, 16, 8) for q in FAST_QTYPES] + [("MUL_MAT_ID_GLU", "mxfp4", 2880, 2880, 8, 4)] \
    + [("MUL_MAT_GLU", "q4_k", 1024, 2048, 0, 0), ("MUL_MAT_ADD", "q4_k", 1003, 2048, 0, 0),
       ("MUL_MAT_ID_GLU", "q4_k", 768, 2048, 4, 2)]


@pytest.mark.parametrize("op,qtype,N,K,E,n_ids", FUSED, ids=[f"{o}-{q}-{n}x{k}" for o, q, n, k, _, _ in FUSED])
def test_fused_mul_mat_vec_q(op, qtype, N, K, E, n_ids):
    """The mmvq epilogues (mul-mat-add's addend, mul-mat-glu's swiglu of a gate and an up row,
    per selected expert for MUL_MAT_ID_GLU) against the reference's fused ops."""
    rng = np.random.default_rng(N + K + E)
    b = GraphBuilder("mmvq_fused")
    shape = (E, N, K) if E else (N, K)
    ws = [b.weight(f"w{i}", shape, qtype) for i in range(1 if op == "MUL_MAT_ADD" else 2)]
    x = b.input("x", (1, K), "f32")
    xq = b.op("QUANTIZE_Q8_1", "x_q8_1", [x], (1, K), dtype="q8_1")
    inputs = {"x": rng.standard_normal((1, K))}
    if op == "MUL_MAT_ADD":
        y = b.input("y", (1, N), "f32")
        inputs["y"] = rng.standard_normal((1, N))
        b.op(op, "out", [ws[0], xq, y], (1, N))
    elif E:
        ids = b.input("ids", (n_ids,), "i32")
        inputs["ids"] = rng.choice(E, n_ids, replace=False).astype(np.int32)
        b.op(op, "out", [*ws, xq, ids], (n_ids, N), glu="swiglu")
    else:
        b.op(op, "out", [*ws, xq], (1, N), glu="swiglu")
    g = b.build()
    gpu, ref = _run_graph(g, {f"w{i}": _weights(rng, shape, qtype) for i in range(len(ws))}, inputs)
    out = g.nodes[-1].dst
    err = _close(gpu.read(out), ref.read(out).astype(np.float64))
    record(test="quant_fused", op=op, qtype=qtype, N=N, K=K, rel_err=err)
    assert err <= KERNEL_TOL, f"{op} {qtype} {N}x{K}: rel err {err:.3g}"


#: (rows per warp, warps per row) the mmvq kernels take (cuda_quant_ops.mmvq_split picks one by size)
SPLITS = [(1, 1), (2, 1), (4, 1), (1, 2), (1, 4)]


@pytest.mark.parametrize("split", SPLITS, ids=[f"r{r}w{w}" for r, w in SPLITS])
@pytest.mark.parametrize("qtype", QTYPES)
def test_every_work_split_matches(qtype, split, monkeypatch):
    """Every work split of the mmvq kernels, forced on one shape with a partial last row group:
    the plain, GLU and expert-GLU forms against the reference (the binder picks splits by output
    count, so the full-size tests above reach only some of them)."""
    from workbench.exec import cuda_quant_ops

    monkeypatch.setattr(cuda_quant_ops, "mmvq_split", lambda rows, K: split)
    rng = np.random.default_rng(7)
    N, K, E, n_ids = 1003, 2048, 4, 2
    b = GraphBuilder("mmvq_split")
    w = [b.weight(f"w{i}", (N, K), qtype) for i in range(2)]
    we = [b.weight(f"we{i}", (E, N, K), qtype) for i in range(2)]
    x = b.input("x", (1, K), "f32")
    ids = b.input("ids", (n_ids,), "i32")
    xq = b.op("QUANTIZE_Q8_1", "x_q8_1", [x], (1, K), dtype="q8_1")
    outs = [b.op("MUL_MAT", "plain", [w[0], xq], (1, N)), b.op("MUL_MAT_GLU", "glu", [*w, xq], (1, N), glu="swiglu"),
            b.op("MUL_MAT_ID_GLU", "id_glu", [*we, xq, ids], (n_ids, N), glu="swiglu")]
    g = b.build()
    weights = {**{f"w{i}": _tiled_weights(rng, (N, K), qtype) for i in range(2)},
               **{f"we{i}": _tiled_weights(rng, (E, N, K), qtype) for i in range(2)}}
    gpu, ref = _run_graph(g, weights, {"x": rng.standard_normal((1, K)), "ids": np.array([3, 1], np.int32)})
    for out in outs:
        err = _close(gpu.read(out), ref.read(out).astype(np.float64))
        assert err <= KERNEL_TOL, f"{qtype} {split} {out.buffer.name}: rel err {err:.3g}"


@pytest.mark.parametrize("K", [2048, 2880, 4096])
def test_rms_norm_mul_q8_1(K):
    """norm-mat-vec's normed q8_1 copy (k_rms_norm_mul_q8_1) against RMS_NORM, MUL and
    QUANTIZE_Q8_1 of the reference: the same blocks, but for the norm's sum of squares, whose
    summation order differs, so a value within an ulp of a rounding boundary may flip by one
    quant step (d) and d itself by an f16 ulp."""
    rng = np.random.default_rng(K)
    b = GraphBuilder("norm_q8_1")
    x = b.input("x", (1, K), "f32")
    nw = b.weight("w_norm", (K,), "f32")
    y = b.op("RMS_NORM_MUL_Q8_1", "normed_q8_1", [x, nw], (1, K), dtype="q8_1", eps=1e-6)
    g = b.build()
    gpu, ref = _run_graph(g, {"w_norm": (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)},
                          {"x": 3 * rng.standard_normal((1, K))})
    qg, qr = gpu.raw(y).reshape(-1, 36), ref.raw(y).reshape(-1, 36)
    dg, dr = (np.ascontiguousarray(a[:, :2]).view("<f2")[:, 0].astype(np.float32) for a in (qg, qr))
    assert np.all(np.abs(dg - dr) <= np.abs(np.spacing(dr.astype(np.float16))).astype(np.float32))
    flips = np.abs(qg[:, 4:].view(np.int8).astype(int) - qr[:, 4:].view(np.int8).astype(int))
    assert flips.max() <= 1 and flips.mean() < 1e-2, (flips.max(), flips.mean())
    record(test="rms_norm_mul_q8_1", K=K, flipped=int(flips.sum()))


@pytest.mark.parametrize("qtype", QTYPES)
def test_get_rows_of_a_quantised_table(qtype):
    """Token embeddings stored quantised: the rows dequantise exactly as the reference's."""
    rng = np.random.default_rng(3)
    V, K = 1000, 2048
    b = GraphBuilder("get_rows")
    t = b.weight("t", (V, K), qtype)
    i = b.input("ids", (3,), "i32")
    b.op("GET_ROWS", "rows", [t, i], (3, K))
    g = b.build()
    gpu, ref = _run_graph(g, {"t": _weights(rng, (V, K), qtype)}, {"ids": np.array([999, 0, 321], np.int32)})
    out = g.nodes[-1].dst
    np.testing.assert_array_equal(gpu.read(out), ref.read(out))


#: default llama.cpp behaviour, and every knob on (mul-mat-add and mul-mat-glu take the quantised
#: mat-vecs; PDL waits and graph capture see the QUANTIZE_Q8_1 nodes)
STRATEGIES = {"default": Strategy(),
              "all-on": Strategy(fusion=frozenset(FUSIONS), streams="qkv", graphs=True, pdl=True,
                                 pdl_wait="first-read", pdl_trigger="start", allocator="stream-aware")}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("model", TINY)
def test_tiny_presets_match_reference(model, qtype, strategy):
    """Whole decode steps (q4_k: the tiny presets' rows are not whole super-blocks, so their
    matrices fall back to f16 and this checks that mix); weights="host" uploads the reference's
    own blocks."""
    cfg = preset(model, weight_dtype=qtype, context=512)
    tokens = [3, 17, 5, 42]
    want = workbench.run(cfg, STRATEGIES[strategy], tokens=tokens, backend="reference", quiet=True).logits
    got = workbench.run(cfg, STRATEGIES[strategy], tokens=tokens, backend="cuda", weights="host", quiet=True)
    err = rel_err(got.logits, want)
    record(test="quant_model", model=model, qtype=qtype, strategy=strategy, rel_err=err)
    assert err <= MODEL_TOL, f"{model} {qtype} {strategy}: logits rel err {err:.3g} > {MODEL_TOL}"


#: the fusions that take quantised mat-vecs (llama.cpp's mmvq epilogues, the workbench's
#: norm-mat-vec into one q8_1 copy), and their neighbours
MMVQ_FUSIONS = frozenset({"mul-mat-add", "mul-mat-glu", "rms-norm-mul", "add-chain", "norm-mat-vec"})


@pytest.mark.parametrize("fusion", ["none", "mmvq"])
@pytest.mark.parametrize("qtype", ("q8_0", "q4_0", "mxfp4"))
@pytest.mark.parametrize("model", TINY)
def test_every_quantised_node_matches_reference(model, qtype, fusion):
    """One decode step node by node (no-reuse allocation keeps every output), unfused and with
    the fusions that take quantised mat-vecs: names the first nodes whose kernel
    disagrees with its NumPy twin, which is where a bug would be."""
    from test_cuda_nodes import _gpu_memory

    from workbench.exec.cuda import CudaExecutor

    cfg = preset(model, weight_dtype=qtype, context=512)
    weights = random_weights(build_graph(cfg), 0)
    fusions = MMVQ_FUSIONS if fusion == "mmvq" else frozenset()
    ex = CudaExecutor(cfg, Strategy(allocator="no-reuse", fusion=fusions), weights)
    pos, tok = 5, 11
    ex.step(tok, pos)
    b = ex.bound(cfg.kv_len(pos))
    plan = b.plan
    gpu = _gpu_memory(ex, plan)
    ref = Memory()
    load_static(plan.graph, ref, weights)
    for name, value in step_input_values(plan.graph, tok, pos).items():
        ref.write(plan.graph.inputs[name], value)
    bad, worst = [], 0.0
    for la, node in zip(plan.launches, plan.graph.nodes):
        NUMPY_OPS[node.op](node, ref)
        for k, out in enumerate(node.outs):
            r, g = ref.read(out).astype(np.float64), gpu.read(out).astype(np.float64)
            err = _close(g, r) if np.isfinite(g).all() else float("inf")
            worst = max(worst, err)
            if not err <= NODE_TOL:
                bad.append(f"{node.name} ({node.op} -> {b.calls[la.index].name}, out {k} {out.describe()}): "
                           f"rel err {err:.3g}")
    ex.release()
    record(test="quant_nodes", model=model, qtype=qtype, fusion=fusion, worst_node_rel_err=worst, bad=len(bad))
    assert not bad, "first mismatching nodes:\n" + "\n".join(bad[:12])
