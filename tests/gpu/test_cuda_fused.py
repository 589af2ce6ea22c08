"""Each fused kernel of the Strategy fusions (mul-mat-add, mul-mat-glu, rope-set-rows, add-chain,
topk-moe, rms-norm-mul's + add, rms-norm-mul-rope (rows out, or stored into f16 / bf16 / f32 caches,
full and partial rotation), moe-weighted-reduction, and the workbench's own norm-mat-vec and qkv-rope-store: the norm
folded into the block, row-streaming and gate/up mat-vecs, Q/K/V + RoPE (full and partial) + the
cache stores, alone, normed and with gpt-oss's biases) node by node against its NumPy twin, in every kernel variant its
binding can pick: the block (two warps per row at K = 2048) and row-streaming mat-vecs and both
fallbacks with the addend, the gate/up mat-vec per weight dtype and its fallback (dense and MoE
experts), the rope into f16 / bf16 / f32 caches with partial rotation, 3- and 4-operand add
chains with a broadcast operand, the MoE router chain with either gating (expert ids compared
exactly), the post-norm residual (CUDA C kernels, and the Numba twins of the elementwise and
norm families).

Small graphs are built in the unfused form, the real fusion pass rewrites them, and the fused
node runs alone on the GPU over a copy of the same bytes the reference op reads. Tolerance:
relative to the largest reference value, 5e-3 as tests/gpu/test_cuda_nodes.py (fp32 compute on
both sides, different summation order; f16 / bf16 storage of a cache row may round the other
way by half an ulp: 2^-8 relative for bf16).
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.exec import cuda_ops
from workbench.exec.memory import Memory
from workbench.exec.reference_ops import NUMPY_OPS
from workbench.graph import GraphBuilder, View
from workbench.strategy.fusion import PASSES
from workbench.strategy.fusion_chains import FUSED_OPS

TOL = 5e-3
RNG = np.random.default_rng(7)


def _mul_mat_add(wdt: str, n: int, k: int, input_major: bool = False):
    b = GraphBuilder("mma")
    x = b.input("x", (1, k), "f32")
    res = b.input("res", (1, n), "f32")
    if input_major:  # gpt-oss-style [in, out] storage read through a transposed view
        w = b.weight("w", (k, n), wdt).permute(1, 0)
    else:
        w = b.weight("w", (n, k), wdt)
    h = b.op("MUL_MAT", "proj", [w, x], (1, n))
    b.output("logits", b.op("ADD", "proj_res", [h, res], (1, n), kind="output"))
    return b.build()


def _mul_mat_glu(wdt: str, n: int, k: int):
    b = GraphBuilder("glu")
    x = b.input("x", (1, k), "f32")
    g = b.op("MUL_MAT", "ffn_gate", [b.weight("wg", (n, k), wdt), x], (1, n))
    u = b.op("MUL_MAT", "ffn_up", [b.weight("wu", (n, k), wdt), x], (1, n))
    b.output("logits", b.op("GLU", "ffn_act", [g, u], (1, n), kind="output", glu="swiglu"))
    return b.build()


def _mul_mat_id_glu(wdt: str, n: int, k: int, experts: int = 8, used: int = 2):
    b = GraphBuilder("glu-id")
    x = b.input("x", (1, k), "f32")
    ids = b.input("ids", (1, used), "i32")
    up = b.op("MUL_MAT_ID", "ffn_moe_up", [b.weight("wu", (experts, n, k), wdt), x, ids], (used, n))
    gate = b.op("MUL_MAT_ID", "ffn_moe_gate", [b.weight("wg", (experts, n, k), wdt), x, ids], (used, n))
    b.output("logits", b.op("GLU", "ffn_moe_swiglu", [gate, up], (used, n), kind="output", glu="swiglu"))
    return b.build()


def _rope_set_rows(cdt: str, n_rot: int):
    b = GraphBuilder("rsr")
    heads, hd = 4, 32
    x = b.input("x", (heads, hd), "f32")
    pos = b.input("inp_pos", (1,), "i32")
    idx = b.input("inp_kv_idx", (1,), "i64")
    freqs = b.const("rope_freqs", (n_rot // 2,), "f32")
    cache = b.cache("cache_k", (8, heads * hd), cdt)
    k = b.op("ROPE", "k_rope", [x, pos, freqs], (heads, hd), n_rot=n_rot, attn_factor=1.0)
    b.node("SET_ROWS", "k_store", [k.reshape((1, heads * hd)), idx], [cache])
    b.output("logits", b.op("SCALE", "result_output", [x], (heads, hd), kind="output", s=1.0))
    return b.build()


def _add_chain(operands: int):
    b = GraphBuilder("chain")
    xs = [b.input(f"x{i}", (2, 64), "f32") for i in range(operands - 1)]
    bias = b.input("bias", (64,), "f32")
    s = b.op("ADD", "sum_0", [xs[0], bias], (2, 64))
    for i in range(1, operands - 1):
        s = b.op("ADD", f"sum_{i}", [s, xs[i]], (2, 64))
    b.output("logits", b.op("SCALE", "result_output", [s], (2, 64), kind="output", s=1.0))
    return b.build()


def _topk_moe(n: int, k: int, gating: str):
    """llama.cpp's build_moe_ffn router: Qwen3's (softmax, top-k, gather, renormalise) or
    gpt-oss's (top-k of the logits, gather, softmax of the chosen)."""
    b = GraphBuilder("router")
    logits = b.input("x", (1, n), "f32")
    probs = b.op("SOFT_MAX", "probs", [logits], (1, n)) if gating == "softmax" else logits
    ids = b.op("ARGSORT_TOP_K", "topk", [probs], (1, k), dtype="i32", k=k)
    w = b.op("GET_ROWS", "weights", [probs.reshape((n, 1)), ids], (k, 1))
    if gating == "softmax":
        row = w.reshape((1, k))
        total = b.op("SUM_ROWS", "weights_sum", [row], (1, 1))
        w = b.op("DIV", "weights_norm", [row, total], (1, k))
    else:
        w = b.op("SOFT_MAX", "weights_softmax", [w.reshape((1, k))], (1, k))
    b.output("logits", b.op("SCALE", "result_output", [w], (1, k), kind="output", s=1.0))
    return b.build()


def _norm_rope(heads: int, hd: int, n_rot: int, cdt: str | None):
    """Qwen3's per-head Q norm (``cdt`` None: rotated rows out) or K norm (rotated and stored into
    a ``cdt`` cache by rope-set-rows first): RMS_NORM + MUL + ROPE (+ SET_ROWS)."""
    from workbench.models.blocks import rms_norm

    b = GraphBuilder("norm-rope")
    x = b.input("x", (1, heads * hd), "f32").reshape((heads, hd))
    pos = b.input("inp_pos", (1,), "i32")
    freqs = b.const("rope_freqs", (n_rot // 2,), "f32")
    normed = rms_norm(b, x, b.weight("w_norm", (hd,), "f32"), 1e-6, "Kcur_normed")
    r = b.op("ROPE", "Kcur_rope", [normed, pos, freqs], (heads, hd), n_rot=n_rot, attn_factor=1.0)
    if cdt is None:
        b.output("logits", b.op("SCALE", "result_output", [r], (heads, hd), kind="output", s=1.0))
        return b.build()
    idx = b.input("inp_kv_idx", (1,), "i64")
    b.node("SET_ROWS", "k_store", [r.reshape((1, heads * hd)), idx], [b.cache("cache_k", (8, heads * hd), cdt)])
    b.output("logits", b.op("SCALE", "result_output", [x], (heads, hd), kind="output", s=1.0))
    return PASSES["rope-set-rows"](b.build())[0]


def _moe_weighted(k: int, n: int):
    """The experts' outputs [k, n] weighted by the router and summed over the experts."""
    b = GraphBuilder("moe-weighted")
    experts = b.input("experts", (k, n), "f32")
    w = b.input("weights", (k, 1), "f32")
    weighted = b.op("MUL", "ffn_moe_weighted", [experts, w], (k, n))
    out = b.op("SUM_ROWS", "ffn_moe_out", [weighted.permute(1, 0)], (1, n))
    b.output("logits", b.op("SCALE", "result_output", [out], (1, n), kind="output", s=1.0))
    return b.build()


def _post_norm(cols: int):
    """llama.cpp's rms_norm + mul + add: a post-norm added to the residual."""
    from workbench.models.blocks import rms_norm

    b = GraphBuilder("post-norm")
    h = b.input("h", (2, cols), "f32")
    normed = rms_norm(b, h, b.weight("w_norm", (cols,), "f32"), 1e-6, "post_norm")
    b.output("logits", b.op("ADD", "l_out", [normed, b.input("res", (2, cols), "f32")], (2, cols), kind="output"))
    return b.build()


def _norm_mat_vec(wdt: str, n: int, k: int, glu: bool = False):
    """norm-mat-vec: attn_norm / ffn_norm (RMS_NORM + MUL) read by one mat-vec, or by gate and
    up already fused by mul-mat-glu (so the case's pass folds the norm into MUL_MAT_GLU)."""
    from workbench.models.blocks import rms_norm

    b = GraphBuilder("norm-mat-vec")
    x = rms_norm(b, b.input("x", (1, k), "f32"), b.weight("w_norm", (k,), "f32"), 1e-5, "attn_norm")
    if glu:
        g = b.op("MUL_MAT", "ffn_gate", [b.weight("wg", (n, k), wdt), x], (1, n))
        u = b.op("MUL_MAT", "ffn_up", [b.weight("wu", (n, k), wdt), x], (1, n))
        b.output("logits", b.op("GLU", "ffn_act", [g, u], (1, n), kind="output", glu="swiglu"))
        return PASSES["mul-mat-glu"](b.build())[0]
    b.output("logits", b.op("MUL_MAT", "proj", [b.weight("w", (n, k), wdt), x], (1, n), kind="output"))
    return b.build()


def _qkv(wdt: str, n_rot: int, cdt: str = "f16", norm: bool = False, bias: bool = False):
    """qkv-rope-store: a llama attention block's Q, K, V mat-vecs (8 query heads, 2 KV heads of
    64), RoPE of q and k, the k / v rows stored at idx; with ``norm`` the attention norm is
    folded in too (the case's pass is norm-mat-vec over the already fused graph)."""
    from workbench.models.blocks import rms_norm

    b = GraphBuilder("qkv")
    k_, hd, hq, hk = 2048, 64, 8, 2
    x = b.input("x", (1, k_), "f32")
    if norm:
        x = rms_norm(b, x, b.weight("w_norm", (k_,), "f32"), 1e-5, "attn_norm")
    pos = b.input("inp_pos", (1,), "i32")
    idx = b.input("inp_kv_idx", (1,), "i64")
    freqs = b.const("rope_freqs", (n_rot // 2,), "f32")
    proj = {r: b.op("MUL_MAT", f"{r}cur", [b.weight(f"w{r.lower()}", (h * hd, k_), wdt), x], (1, h * hd))
            for r, h in (("Q", hq), ("K", hk), ("V", hk))}
    if bias:  # gpt-oss: each projection's bias added (then mul-mat-add makes them MUL_MAT_ADD)
        proj = {r: b.op("ADD", f"{r}cur_b", [p, b.weight(f"b{r.lower()}", (1, p.numel), "f32")], p.shape)
                for r, p in proj.items()}
    q = b.op("ROPE", "q_rope", [proj["Q"].reshape((hq, hd)), pos, freqs], (hq, hd), n_rot=n_rot, attn_factor=1.0)
    k = b.op("ROPE", "k_rope", [proj["K"].reshape((hk, hd)), pos, freqs], (hk, hd), n_rot=n_rot, attn_factor=1.0)
    b.node("SET_ROWS", "k_store", [k.reshape((1, hk * hd)), idx], [b.cache("cache_k", (8, hk * hd), cdt)])
    b.node("SET_ROWS", "v_store", [proj["V"], idx], [b.cache("cache_v", (8, hk * hd), cdt)])
    b.output("logits", b.op("SCALE", "result_output", [q], (hq, hd), kind="output", s=1.0))
    g = b.build()
    if bias:
        g = PASSES["mul-mat-add"](g)[0]
    return PASSES["qkv-rope-store"](g)[0] if norm else g


#: case id -> (fusion, graph, the kernel its binding must pick)
CASES = {
    **{f"mma-block-{dt}": ("mul-mat-add", lambda dt=dt: _mul_mat_add(dt, 256, 2048), f"k_mul_mat_vec_{dt}_add")
       for dt in ("f16", "bf16", "f32")},
    "mma-rows-f16": ("mul-mat-add", lambda: _mul_mat_add("f16", 8192, 256), "k_mul_mat_vec_rows_f16_add"),
    # 8196 rows: the row-streaming loop's grouped stores end on a partial step of 4 rows
    "mma-rows-f16-partial-step": ("mul-mat-add", lambda: _mul_mat_add("f16", 8196, 256),
                                  "k_mul_mat_vec_rows_f16_add"),
    # llama-3.1-8b's down projection: row-streaming rows, on the block kernel (cuda_ops.MMV_BLOCK_SHAPES)
    "mma-block-8b-down": ("mul-mat-add", lambda: _mul_mat_add("f16", 4096, 14336), "k_mul_mat_vec_f16_add"),
    "mma-generic": ("mul-mat-add", lambda: _mul_mat_add("f16", 96, 100), "k_mul_mat_generic_add"),
    "mma-cols": ("mul-mat-add", lambda: _mul_mat_add("f16", 96, 128, input_major=True), "k_mul_mat_cols_add"),
    **{f"glu-{dt}": ("mul-mat-glu", lambda dt=dt: _mul_mat_glu(dt, 384, 2048), f"k_mul_mat_vec_{dt}_glu")
       for dt in ("f16", "bf16", "f32")},
    "glu-tall-f16": ("mul-mat-glu", lambda: _mul_mat_glu("f16", 8192, 256), "k_mul_mat_vec_f16_glu"),
    "glu-generic": ("mul-mat-glu", lambda: _mul_mat_glu("f16", 96, 100), "k_mul_mat_glu_generic"),
    **{f"glu-id-{dt}": ("mul-mat-glu", lambda dt=dt: _mul_mat_id_glu(dt, 256, 2048), f"k_mul_mat_id_{dt}_glu")
       for dt in ("f16", "bf16", "f32")},
    "glu-id-generic": ("mul-mat-glu", lambda: _mul_mat_id_glu("f16", 96, 100), "k_mul_mat_id_glu_generic"),
    **{f"rope-set-rows-{dt}": ("rope-set-rows", lambda dt=dt: _rope_set_rows(dt, 32), "k_rope_set_rows")
       for dt in ("f16", "bf16", "f32")},
    "rope-set-rows-partial": ("rope-set-rows", lambda: _rope_set_rows("f16", 16), "k_rope_set_rows"),
    "topk-moe-softmax": ("topk-moe", lambda: _topk_moe(128, 8, "softmax"), "k_topk_moe"),
    "topk-moe-softmax-wide": ("topk-moe", lambda: _topk_moe(512, 10, "softmax"), "k_topk_moe_512"),
    "topk-moe-softmax-200": ("topk-moe", lambda: _topk_moe(200, 8, "softmax"), "k_topk_moe_512"),
    "topk-moe-softmax-weight": ("topk-moe", lambda: _topk_moe(32, 4, "softmax_weight"), "k_topk_moe"),
    "topk-moe-softmax-1024": ("topk-moe", lambda: _topk_moe(1024, 8, "softmax"), "k_topk_moe_wide"),
    "topk-moe-softmax-weight-40": ("topk-moe", lambda: _topk_moe(40, 4, "softmax_weight"), "k_topk_moe"),
    "rms-norm-mul-rope-q": ("rms-norm-mul-rope", lambda: _norm_rope(32, 128, 128, None), "k_rms_norm_mul_rope"),
    "rms-norm-mul-rope-partial": ("rms-norm-mul-rope", lambda: _norm_rope(6, 256, 64, None), "k_rms_norm_mul_rope"),
    "rms-norm-mul-rope-store-partial": ("rms-norm-mul-rope", lambda: _norm_rope(2, 256, 64, "f16"),
                                        "k_rms_norm_mul_rope"),
    "rms-norm-mul-rope-odd": ("rms-norm-mul-rope", lambda: _norm_rope(5, 96, 96, None), "k_rms_norm_mul_rope"),
    **{f"rms-norm-mul-rope-store-{dt}": ("rms-norm-mul-rope", lambda dt=dt: _norm_rope(4, 128, 128, dt),
                                         "k_rms_norm_mul_rope") for dt in ("f16", "bf16", "f32")},
    "moe-weighted-reduction": ("moe-weighted-reduction", lambda: _moe_weighted(8, 2048), "k_sum_rows_mul"),
    "moe-weighted-reduction-odd": ("moe-weighted-reduction", lambda: _moe_weighted(15, 2880), "k_sum_rows_mul"),
    "rms-norm-mul-add": ("rms-norm-mul", lambda: _post_norm(2048), "k_rms_norm_mul_add"),
    "rms-norm-mul-add-short": ("rms-norm-mul", lambda: _post_norm(96), "k_rms_norm_mul_add"),
    "add-chain-3": ("add-chain", lambda: _add_chain(3), "k_add_chain"),
    "add-chain-4": ("add-chain", lambda: _add_chain(4), "k_add_chain"),
    # the workbench's own (kernels/fused_mat_vec.cu)
    **{f"norm-mat-vec-{dt}": ("norm-mat-vec", lambda dt=dt: _norm_mat_vec(dt, 512, 2048), f"k_mul_mat_vec_{dt}_norm")
       for dt in ("f16", "bf16", "f32")},
    "norm-mat-vec-k4096": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 384, 4096), "k_mul_mat_vec_f16_norm"),
    "norm-mat-vec-tall": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 8192, 256), "k_mul_mat_vec_rows_f16_norm"),
    "norm-mat-vec-tall-partial-step": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 8196, 256),
                                       "k_mul_mat_vec_rows_f16_norm"),
    # a Llama 3 lm_head: the deep ring (cuda_ops.HEAD_DEEP_RING)
    "norm-mat-vec-llama3-head": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 128256, 2048),
                                 "k_mul_mat_vec_rows_deep_f16_norm"),
    "norm-mat-vec-glu": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 384, 2048, glu=True),
                         "k_mul_mat_vec_f16_glu_norm"),
    "norm-mat-vec-glu-tall": ("norm-mat-vec", lambda: _norm_mat_vec("bf16", 8192, 512, glu=True),
                              "k_mul_mat_vec_bf16_glu_norm"),
    # 2 warps a row over 3 rounds (cuda_ops.fused_splits); K = 2880 (gpt-oss): rows of 360 vectors,
    # a lane's last vector of a row past K
    "norm-mat-vec-glu-rounds": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 6000, 1024, glu=True),
                                "k_mul_mat_vec_f16_glu_norm"),
    "norm-mat-vec-glu-k2880": ("norm-mat-vec", lambda: _norm_mat_vec("f16", 384, 2880, glu=True),
                               "k_mul_mat_vec_f16_glu_norm"),
    **{f"qkv-rope-store-{dt}": ("qkv-rope-store", lambda dt=dt: _qkv(dt, 64), f"k_mul_mat_vec_{dt}_qkv_rope")
       for dt in ("f16", "bf16", "f32")},
    "qkv-rope-store-partial-bf16-cache": ("qkv-rope-store", lambda: _qkv("f16", 32, "bf16"),
                                          "k_mul_mat_vec_f16_qkv_rope"),
    "qkv-rope-store-normed": ("norm-mat-vec", lambda: _qkv("f16", 64, norm=True), "k_mul_mat_vec_f16_qkv_rope"),
    "qkv-rope-store-bias": ("qkv-rope-store", lambda: _qkv("f16", 64, bias=True), "k_mul_mat_vec_f16_qkv_rope"),
    "qkv-rope-store-bias-normed": ("norm-mat-vec", lambda: _qkv("bf16", 32, norm=True, bias=True),
                                   "k_mul_mat_vec_bf16_qkv_rope"),
}


class DeviceSpace:
    """Every buffer of a graph at a 256-byte aligned offset of one host byte array and of its
    device copy: ``mem`` is the reference Memory over the host bytes, ``addr`` the device address."""

    def __init__(self, graph, cp) -> None:
        self.base, top = {}, 0
        bufs = list(graph.buffers().values())
        for buf in bufs:
            self.base[buf.name] = top
            top += -(-buf.nbytes // 256) * 256
        self.host = np.zeros(top, np.uint8)
        self.mem = Memory()
        for buf in bufs:
            self.mem.arrays[buf.name] = self.host[self.base[buf.name]: self.base[buf.name] + buf.nbytes]
        self.cp = cp
        self.dev = None

    def upload(self) -> None:
        """Copy the host bytes to the device, into memory first filled with NaN (a block freed back
        to CuPy's pool, which the copy's allocation reuses), so that a kernel reading anything the
        copy has not yet written sees non-finite values rather than a finite leftover.

        The copy is a blocking ``cudaMemcpy`` from pageable memory: it returns once the bytes are
        staged, while its DMA may still be running on the legacy default stream. The kernels run on
        a stream that orders after it (``cp.cuda.Stream()``, blocking, as the executor's stream 0),
        not a non-blocking one: a non-blocking stream let ``norm-mat-vec-glu-rounds`` (the largest
        case, 24 MB of weights) read weights before they landed, intermittently (sessions 12, 14)."""
        poison = self.cp.full(self.host.size // 4 + 1, np.nan, self.cp.float32)
        del poison
        self.dev = self.cp.asarray(self.host)

    def addr(self, v: View) -> int:
        return int(self.dev.data.ptr) + self.base[v.buffer.name] + v.offset

    def device_memory(self) -> Memory:
        m = Memory()
        back = self.cp.asnumpy(self.dev)
        for name, start in self.base.items():
            m.arrays[name] = back[start: start + self.mem.arrays[name].size]
        return m


def _fill(graph, mem: Memory) -> None:
    for name, v in {**graph.inputs, **graph.weights, **graph.consts, **graph.caches}.items():
        if name == "ids":  # distinct experts
            mem.write(v, (np.arange(v.numel) * 3 + 1).reshape(v.shape))
        elif v.dtype in ("i32", "i64"):
            mem.write(v, np.array([5 if "pos" in name else 3]).reshape(v.shape))
        elif name == "rope_freqs":
            mem.write(v, (1e4 ** -(np.arange(v.numel) / v.numel)).astype(np.float32))
        else:
            # the full bytes of the buffer (a transposed weight view covers them all)
            full = View.of(v.buffer, (v.buffer.nbytes // v.itemsize,), v.dtype)
            mem.write(full, RNG.standard_normal(full.shape).astype(np.float32) * 0.5)


#: (case, kernel set): every case on the CUDA C kernels, the Numba twins where the family has one
NUMBA = ("add-chain", "rms-norm-mul")
RUNS = [(c, "cupy") for c in CASES] + [(c, "numba") for c, (f, _, _) in CASES.items() if f in NUMBA]


def launch_case(case: str, kernels: str = "cupy", non_blocking: bool = False):
    """Case ``case`` fused by its pass, its one fused node bound over a device copy of its filled
    buffers and launched alone (``non_blocking``: on a non-blocking stream, the harness's old race;
    benchmarks/upload_race.py), then the node's NumPy twin over the host bytes: (node, call, host
    Memory with the reference outputs, device Memory read back)."""
    import cupy as cp

    from workbench.exec.kernels import LaunchHandle, NumbaLaunch, module_cache, numba_module

    fusion, build, want_kernel = CASES[case]
    graph, removed = PASSES[fusion](build())
    assert removed, f"{case}: {fusion} did not fuse"
    node = next(n for n in graph.nodes if n.op in FUSED_OPS)  # the one fused node of the case
    space = DeviceSpace(graph, cp)
    _fill(graph, space.mem)
    space.upload()
    call = cuda_ops.bind(node, space.addr, lambda key, n: 0)
    assert call.name == want_kernel, (case, call.name)
    assert (call.numba is not None) == (fusion in NUMBA), call
    # blocking by default: orders after upload()'s copy (see DeviceSpace.upload)
    stream = cp.cuda.Stream(non_blocking=non_blocking)
    if kernels == "numba":
        name, grid, block = call.numba
        NumbaLaunch(name, numba_module().KERNELS[name], grid, block, stream.ptr, call.args)()
    else:
        cc = cp.cuda.Device().compute_capability
        fn = module_cache((int(cc[0]), int(cc[1]))).function(call.source, call.name)
        LaunchHandle(call.name, fn, call.grid, call.block, stream.ptr, call.args, pdl=False)()
    stream.synchronize()
    NUMPY_OPS[node.op](node, space.mem)
    return node, call, space.mem, space.device_memory()


def out_err(ref_mem: Memory, gpu: Memory, out: View) -> float:
    """Max |gpu - ref| over the largest |ref| of output ``out`` (inf when anything is not finite)."""
    ref, got = ref_mem.read(out).astype(np.float64), gpu.read(out).astype(np.float64)
    scale = max(np.abs(ref).max(), 1e-6)
    return float(np.abs(got - ref).max() / scale) if np.isfinite(got).all() else float("inf")


@pytest.mark.parametrize("case,kernels", RUNS, ids=[f"{c}-{k}" for c, k in RUNS])
def test_fused_kernel_matches_reference(case, kernels):
    node, call, ref, gpu = launch_case(case, kernels)
    for out in node.outs:
        if out.dtype in ("i32", "i64"):  # expert ids: exact
            np.testing.assert_array_equal(gpu.read(out), ref.read(out), err_msg=f"{case} ({call.name})")
            continue
        err = out_err(ref, gpu, out)
        assert err <= TOL, f"{case} ({call.name}): rel err {err:.3g}"
