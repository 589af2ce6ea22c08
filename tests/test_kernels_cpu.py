"""The GPU kernels' CPU-checkable parts: every op of every family binds to a kernel, the Numba
kernels match the NumPy reference ops under Numba's CUDA simulator, the split-context attention
algorithm matches the reference, and the CUDA sources put their PDL hooks where the placement
says (PTX from ``nvcc``, when it is installed)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.exec import cuda_ops
from workbench.exec.kernels import KERNEL_DIR, SOURCES, CudaBackendError, require_cupy
from workbench.exec.memory import Memory
from workbench.exec.reference import load_static
from workbench.exec.reference_ops import NUMPY_OPS, attend
from workbench.graph.tensor import View
from workbench.models import build_graph, preset
from workbench.models.blocks import step_input_values
from workbench.models.weights import random_weights
from workbench.strategy import FUSIONS, Strategy
from workbench.strategy.compile import compile_plan

TINY = ("llama-tiny", "qwen3-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "qwen3-next-tiny")
ALL_ON = Strategy(fusion=frozenset(FUSIONS), allocator="stream-aware", streams="qkv")


class HostSpace:
    """Every buffer of a plan's graph at an offset of one host byte array: ``addr`` gives the
    'device address' a kernel argument would carry, ``mem`` the reference Memory over the same bytes."""

    def __init__(self, graph) -> None:
        bufs = list(graph.buffers().values())
        self.base, top = {}, 256
        for b in bufs:
            self.base[b.name] = top
            top += -(-b.nbytes // 256) * 256
        self.space = np.zeros(top, np.uint8)
        self.mem = Memory()
        for b in bufs:
            self.mem.arrays[b.name] = self.space[self.base[b.name]: self.base[b.name] + b.nbytes]

    def addr(self, v) -> int:
        return self.base[v.buffer.name] + v.offset

    def array(self, a):
        from workbench.graph import DTYPES

        return np.ndarray(a.shape, DTYPES[a.dtype][1], buffer=self.space, offset=a.ptr, strides=a.strides)


def _plan(name: str, strategy: Strategy, n_kv: int = 256):
    cfg = preset(name)
    return cfg, compile_plan(build_graph(cfg, n_kv), strategy)


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("strategy", [Strategy(), ALL_ON], ids=["default", "all-fusions"])
def test_every_node_binds(name, strategy):
    cfg, plan = _plan(name, strategy)
    space = HostSpace(plan.graph)
    kernels = set()
    for la in plan.launches:
        call = cuda_ops.bind(la.node, space.addr, lambda key, n: 0)
        assert call.source in SOURCES, call
        assert all(g >= 1 for g in call.grid) and 32 <= call.block[0] <= 1024
        kernels.add(call.name)
    src = {s: (KERNEL_DIR / f"{s}.cu").read_text() for s in SOURCES}
    for k in kernels:
        assert any(re.search(rf"\b{k}\(", text) for text in src.values()), f"{k} is not defined in kernels/"


def _bound_calls(cfg, strategy: Strategy, ops: tuple[str, ...], n_kv: int = 512) -> dict:
    """Node name -> bound KernelCall for the launches of ``ops`` in the Plan of ``cfg``, every buffer
    at a 256-byte aligned offset of a notional device (no memory is allocated: full sizes bind)."""
    plan = compile_plan(build_graph(cfg, n_kv), strategy)
    addr = _notional_addr(plan.graph)
    return {la.node.name: cuda_ops.bind(la.node, addr, lambda k, n: 0) for la in plan.launches if la.node.op in ops}


def _notional_addr(graph):
    """A view's address with every buffer of ``graph`` at a 256-byte aligned offset of a notional
    device (nothing allocated)."""
    space_addr, top = {}, 0
    for b in graph.buffers().values():
        space_addr[b.name] = top
        top += -(-b.nbytes // 256) * 256
    return lambda v: space_addr[v.buffer.name] + v.offset


def _bound_kernels(cfg, strategy: Strategy, ops: tuple[str, ...], n_kv: int = 512) -> dict[str, str]:
    """Node name -> bound kernel name (``_bound_calls``)."""
    return {k: c.name for k, c in _bound_calls(cfg, strategy, ops, n_kv).items()}


@pytest.mark.parametrize("model,n_kv,splits", [("llama-3.2-1b", 512, 4), ("llama-3.1-8b", 512, 8),
                                               ("llama-3.1-8b", 256, 4), ("llama-3.1-8b", 2048, None)])
def test_short_context_attention_is_one_cluster_a_head(model, n_kv, splits):
    """Decode attention over a short context: a head's split blocks are launched as one
    thread-block cluster (their partials merged in distributed shared memory); a context past
    FA_CLUSTER_MAX blocks keeps the ticket's merge (no cluster)."""
    call = _bound_calls(preset(model, layers=1, context=n_kv), Strategy(), ("FLASH_ATTN_EXT",), n_kv)["kqv_out-0"]
    assert call.name == "k_flash_attn_ext_vec_f16"
    if splits is None:
        assert call.cluster is None and call.grid[1] > cuda_ops.FA_CLUSTER_MAX
    else:
        assert call.grid == (32, splits) and call.cluster == (1, splits, 1)
        assert call.block == (32 * cuda_ops.FAV_CLUSTER_WARPS,)


def _bind_attn(**views):
    """llama-3.2-1b's decode attention node, some of its views replaced (q, k, v, mask, dst), bound."""
    plan = compile_plan(build_graph(preset("llama-3.2-1b", layers=1, context=512), 512), Strategy())
    node = next(la.node for la in plan.launches if la.node.op == "FLASH_ATTN_EXT")
    srcs = list(node.srcs)
    for i, key in enumerate(("q", "k", "v", "mask")):
        if key in views:
            srcs[i] = views[key](srcs[i])
    outs = (views["dst"](node.dst), *node.outs[1:]) if "dst" in views else node.outs
    return cuda_ops.bind(dataclasses.replace(node, srcs=tuple(srcs), outs=outs), _notional_addr(plan.graph),
                         lambda k, n: 0)


def test_attention_vector_kernel_needs_an_f32_mask():
    """kernels/attn.cu's vector kernel reads the mask as f32 (one load a key, no dtype branch): an
    f16 mask binds the generic kernel, which converts any dtype."""
    assert _bind_attn().name == "k_flash_attn_ext_vec_f16"
    assert _bind_attn(mask=lambda m: View.of(m.buffer, m.shape, "f16")).name == "k_flash_attn_ext_f16"


def test_attention_output_must_hold_whole_heads_on_its_last_axis():
    """fa_block_out writes a head's D outputs d.s[3] apart from one offset: an output whose last
    axis splits heads is a BindError naming the shape, not a wrong write."""
    with pytest.raises(cuda_ops.BindError, match="whole heads"):
        _bind_attn(dst=lambda d: View.of(d.buffer, (d.numel // 32, 32), d.dtype))  # D = 64


def test_full_size_hot_kernels_are_the_vector_ones():
    """llama-3.2-1b's projections and attention are the hot path: 16-byte aligned rows, the vector kernels."""
    names = _bound_kernels(preset("llama-3.2-1b", layers=1), Strategy(), ("MUL_MAT", "FLASH_ATTN_EXT"))
    assert set(names.values()) == {"k_mul_mat_vec_f16", "k_mul_mat_vec_rows_f16", "k_flash_attn_ext_vec_f16"}, names
    assert names["ffn_gate-0"] == "k_mul_mat_vec_rows_f16" and names["Kcur-0"] == "k_mul_mat_vec_f16"


def test_measured_shape_tables_pick_their_kernels():
    """llama-3.1-8b's down projection (4096 x 14336) takes the block mat-vec though it has the
    row-streaming kernel's rows, its o_proj (4096 x 4096) keeps the row-streaming one; a Llama 3
    lm_head (128256 rows) fused with its norm streams with the deep ring, a Qwen3 one (151936
    rows) with the shallow one (cuda_ops.MMV_BLOCK_SHAPES, HEAD_DEEP_RING)."""
    s = Strategy(fusion=frozenset({"norm-mat-vec"}))
    calls = _bound_kernels(preset("llama-3.1-8b", layers=1), s, ("MUL_MAT", "RMS_NORM_MUL_MAT"))
    assert calls["ffn_out-0"] == "k_mul_mat_vec_f16" and calls["attn_out-0"] == "k_mul_mat_vec_rows_f16"
    assert calls["result_output"] == "k_mul_mat_vec_rows_deep_f16_norm"
    qwen = _bound_kernels(preset("qwen3-8b", layers=1), s, ("RMS_NORM_MUL_MAT",))["result_output"]
    assert qwen == "k_mul_mat_vec_rows_f16_norm"


#: kernel variants behind cuda_ops' selection constants (off by default; benchmarks/kernel_bench.py
#: times them): the constants that turn each on, the kernel name part it binds
VARIANTS = {"attn-gqa": ({"FA_VARIANT": "gqa"}, "k_flash_attn_ext_gqa_"),
            "mmv-seg": ({"MMV_SEG_K_MAX": 1 << 16, "MMV_SEG_MUL_MAT": True}, "_seg_")}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", TINY)
def test_variant_kernels_bind(name, variant, monkeypatch):
    """With a variant on, every node of each tiny model still binds to a kernel defined in
    kernels/, and the variant's kernel is among them."""
    knobs, part = VARIANTS[variant]
    for k, v in knobs.items():
        monkeypatch.setattr(cuda_ops, k, v)
    cfg, plan = _plan(name, Strategy())
    space = HostSpace(plan.graph)
    names = {cuda_ops.bind(la.node, space.addr, lambda key, n: 0).name for la in plan.launches}
    src = "".join((KERNEL_DIR / f"{s}.cu").read_text() for s in SOURCES)
    assert all(re.search(rf"\b{k}\(", src) for k in names), names
    assert any(part in k for k in names), names


def test_full_size_gpt_oss_variants_bind_its_short_rows():
    """gpt-oss-20b's K = 2880 rows (360 vectors) take the segmented kernels and its attention
    (64 heads over 8 KV heads) the GQA-shared one when switched on."""
    knobs = {"FA_VARIANT": "gqa", "MMV_SEG_K_MAX": 4096, "MMV_SEG_MUL_MAT": True, "MMV_ROWS_MIN": 8192}
    old = {k: getattr(cuda_ops, k) for k in knobs}
    try:
        for k, v in knobs.items():
            setattr(cuda_ops, k, v)
        names = _bound_kernels(preset("gpt-oss-20b", layers=2), Strategy(), ("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT"))
    finally:
        for k, v in old.items():
            setattr(cuda_ops, k, v)
    assert names["ffn_moe_gate-0"] == names["ffn_moe_down-1"] == "k_mul_mat_id_seg_f16"
    assert names["Qcur-0"] == "k_mul_mat_vec_seg_f16"
    assert names["kqv_out-0"] == "k_flash_attn_ext_gqa_f16"


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("strategy", [Strategy(), ALL_ON], ids=["default", "all-fusions"])
def test_full_size_expert_mat_vecs_are_the_vector_ones(name, strategy):
    """Every MUL_MAT_ID (and fused MUL_MAT_ID_GLU) of the full-size MoE models binds the vector
    expert kernels (whole-warp or segmented): gpt-oss's experts are stored output-major, gate/up every other row (row
    stride 2*d), never the thread-per-output k_mul_mat_cols or a generic kernel."""
    names = _bound_kernels(preset(name, layers=2), strategy, ("MUL_MAT_ID", "MUL_MAT_ID_GLU"))
    assert names, "no expert mat-vecs"
    bad = {n: k for n, k in names.items() if not re.fullmatch(r"k_mul_mat_id_(seg_)?f16(_glu)?", k)}
    assert not bad, bad


def test_attention_split_algorithm_matches_reference():
    """NumPy twin of k_flash_attn_ext: per-chunk online softmax partials merged with the sink."""
    rng = np.random.default_rng(0)
    H, Hkv, D, n_kv, pos = 4, 2, 16, 96, 70
    q = rng.standard_normal((H, D)).astype(np.float32)
    k = rng.standard_normal((n_kv, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((n_kv, Hkv, D)).astype(np.float32)
    mask = np.where(np.arange(n_kv) <= pos, 0.0, -np.inf).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    gqa_chunk = cuda_ops.attn_gqa_chunk(D, 2, n_kv, Hkv)[1]
    for sk, chunk in ((None, -(-n_kv // cuda_ops.attn_splits(H, n_kv))), (sinks, 32), (None, 7),
                      (sinks, gqa_chunk)):
        S = -(-n_kv // chunk)
        assert S > 1
        out = np.zeros((H, D), np.float32)
        for h in range(H):
            g = h // (H // Hkv)
            parts = []
            for s in range(S):
                m, l, acc = -np.inf, 0.0, np.zeros(D, np.float32)
                for t in range(s * chunk, min(n_kv, (s + 1) * chunk)):
                    if mask[t] == -np.inf:
                        continue
                    sc = float(q[h] @ k[t, g]) * D ** -0.5 + mask[t]
                    mn = max(m, sc)
                    corr, e = np.exp(m - mn), np.exp(sc - mn)
                    l, acc, m = l * corr + e, acc * corr + e * v[t, g], mn
                parts.append((m, l, acc))
            M = max([p[0] for p in parts] + ([sk[h]] if sk is not None else []))
            L = (np.exp(sk[h] - M) if sk is not None else 0.0) + sum(p[1] * np.exp(p[0] - M) for p in parts
                                                                      if p[0] != -np.inf)
            out[h] = sum(p[2] * np.exp(p[0] - M) for p in parts if p[0] != -np.inf) / L
        ref = attend(q, k, v, mask, D ** -0.5, sk)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("D,H,n_kv", [(64, 32, 512), (128, 32, 512), (64, 64, 512), (128, 32, 6), (64, 64, 4096),
                                       (64, 64, 32768), (256, 8, 1000), (80, 40, 512)])
def test_attention_vec_launch_covers_every_key_in_few_blocks(D, H, n_kv):
    """The vectorized decode kernel's launch: every key in some block's rounds, no block wholly
    past the keys, a head that 2..FA_CLUSTER_MAX small blocks cover in one round split over that
    many blocks of one cluster, else one that one round of the widest block covers in that block
    (no split partials to merge), and never more splits than the workspace holds."""
    got = cuda_ops.attn_vec_launch(D, 2, n_kv, H)
    if D == 80:  # 10 pieces a row: not a power of two, the generic kernel's
        assert got is None
        return
    warps, steps, rounds, S = got
    keys_per_round = warps * (32 // (D * 2 // 16)) * steps
    assert 1 <= warps <= cuda_ops.FAV_MAXW and 1 <= steps <= cuda_ops.FAV_STEPS
    assert S * rounds * keys_per_round >= n_kv > (S - 1) * rounds * keys_per_round
    assert S <= cuda_ops.attn_vec_max_splits(H)
    kpw = 32 // (D * 2 // 16)
    one_round = cuda_ops.FAV_MAXW * kpw * cuda_ops.FAV_STEPS
    clustered = 1 < -(-n_kv // (cuda_ops.FAV_WARPS * kpw * cuda_ops.FAV_STEPS)) <= cuda_ops.FA_CLUSTER_MAX
    if clustered:
        assert warps == cuda_ops.FAV_WARPS and rounds == 1 and cuda_ops.attn_cluster(S) == (1, S, 1)
    else:
        assert (S == 1 and rounds == 1) == (n_kv <= one_round)
    warps, steps, rounds, S = cuda_ops.attn_vec_launch(D, 2, n_kv, H, solo=False)  # always split blocks
    keys_per_round = warps * (32 // (D * 2 // 16)) * steps
    assert warps == cuda_ops.FAV_WARPS and S <= cuda_ops.attn_vec_max_splits(H)
    assert S * rounds * keys_per_round >= n_kv > (S - 1) * rounds * keys_per_round


def test_cuda_backend_without_cupy_says_use_sim():
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(CudaBackendError, match="--backend sim"):
            require_cupy()
    else:
        pytest.skip("CuPy is installed here")


# -------------------------------------------------------------------------------------------
# Numba kernels under the CUDA simulator
# -------------------------------------------------------------------------------------------
def _numba_sim():
    """The Numba kernels module, run on Numba's CUDA simulator (skip if Numba's CUDA target was
    already imported for a real GPU in this process)."""
    if "numba.cuda" not in sys.modules:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        import numba

        numba.config.reload_config()
    from numba import cuda

    if not getattr(cuda, "simulator_enabled", False) and not os.environ.get("NUMBA_ENABLE_CUDASIM"):
        pytest.skip("numba.cuda is already bound to a real GPU in this process")
    from workbench.exec.kernels import numba_module

    return numba_module(), cuda


@pytest.mark.parametrize("name", ["llama-tiny", "qwen3-tiny", "gpt-oss-tiny", "qwen3-next-tiny"])
def test_numba_kernels_match_reference_ops(name):
    """Step one token through a plan's graph with the reference ops; every node with a Numba
    kernel is also run by it (same views, same bytes) and must match the NumPy op."""
    nk, cuda = _numba_sim()
    cfg = preset(name, context=256, layers=1)
    graph = build_graph(cfg, 256)
    plan = compile_plan(graph, Strategy(fusion=frozenset({"rms-norm-mul", "copy-elim"})))
    g = plan.graph
    space = HostSpace(g)
    load_static(g, space.mem, random_weights(graph, 0))
    for k, v in step_input_values(g, 7, 3).items():
        space.mem.write(g.inputs[k], v)
    checked = set()
    for la in plan.launches:
        node = la.node
        call = cuda_ops.bind(node, space.addr, lambda key, n: 0)
        before = space.space.copy()
        NUMPY_OPS[node.op](node, space.mem)
        if call.numba is None:
            continue
        want = [space.mem.read(o) for o in node.outs]
        after = space.space.copy()
        space.space[:] = before
        kname, grid, block = call.numba
        dev = [cuda.to_device(np.ascontiguousarray(space.array(a))) if isinstance(a, cuda_ops.Arg) else a.value
               for a in call.args]
        nk.KERNELS[kname][grid, block](*dev)
        out = space.array(call.args[0])
        out[...] = dev[0].copy_to_host()
        got = space.mem.read(node.outs[0])
        np.testing.assert_allclose(got, want[0], rtol=2e-5, atol=2e-5, err_msg=f"{node.name} ({kname})")
        space.space[:] = after
        checked.add(kname)
    assert checked >= {"rms_norm_mul", "add"}, checked


# -------------------------------------------------------------------------------------------
# PDL hooks in the CUDA sources
# -------------------------------------------------------------------------------------------
def _ptx(source: str, wait: str, trigger: str, tmp_path: Path) -> str:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from workbench.exec.kernels import PLACEMENTS, kernel_source

    src = tmp_path / f"{source}.cu"
    src.write_text(kernel_source(source))
    out = tmp_path / f"{source}.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "--ptx", "-o", str(out), str(src), f"-DPDL_WAIT_AT={PLACEMENTS[wait]}",
                    f"-DPDL_TRIGGER_AT={PLACEMENTS[trigger]}"], check=True, capture_output=True)
    return out.read_text()


def _entries(ptx: str) -> dict[str, str]:
    parts = re.split(r"\.visible \.entry (\w+)\(", ptx)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("source", SOURCES)
def test_late_placement_reads_before_waiting(source, tmp_path):
    """Under ``late`` every kernel issues a (volatile) global load before griddepcontrol.wait,
    and triggers once; without PDL no griddepcontrol instruction is emitted at all."""
    for name, body in _entries(_ptx(source, "late", "after-main-loop", tmp_path)).items():
        assert body.count("griddepcontrol.wait") == 1, name
        assert body.count("griddepcontrol.launch_dependents") == 1, name
        before = body.split("griddepcontrol.wait")[0]
        assert re.search(r"ld\.volatile\.global|ld\.global", before), f"{name}: no read before the wait"
    plain = _ptx(source, "none", "none", tmp_path)
    assert "griddepcontrol" not in plain


@pytest.mark.parametrize("source", SOURCES)
def test_only_the_late_placement_reads_volatile(source, tmp_path):
    """A volatile (system-scope) first read is what ``late`` studies; every other placement reads
    its input with plain loads, so no kernel pays for it in the builds users run."""
    for wait, trigger in (("none", "none"), ("start", "end"), ("first-read", "after-main-loop")):
        assert "ld.volatile" not in _ptx(source, wait, trigger, tmp_path), (source, wait)

def test_first_read_placement_prefetches_weights_only(tmp_path):
    """Under ``first-read`` the mat-vec issues its first 16-byte weight loads before the wait and
    reads the activation after it (a plain load: only ``late`` makes it volatile); kernels without
    independent data wait before any load."""
    entries = _entries(_ptx("mul_mat", "first-read", "start", tmp_path))
    for dt in ("f16", "bf16", "f32"):
        for name in (f"k_mul_mat_vec_{dt}", f"k_mul_mat_vec_{dt}_add", f"k_mul_mat_vec_{dt}_glu"):  # + fused
            before, after = entries[name].split("griddepcontrol.wait")
            assert "ld.global.nc.L1::no_allocate.v4.u32" in before, name
            assert "ld.volatile" not in before and "ld.global.f32" in after, name
        for name in (f"k_mul_mat_id_{dt}", f"k_mul_mat_id_{dt}_glu"):
            before_id = entries[name].split("griddepcontrol.wait")[0]
            assert "ld.global" not in before_id, name  # the expert is only known after reading ids
    fused = _entries(_ptx("fused_mat_vec", "first-read", "start", tmp_path))
    for dt in ("f16", "bf16", "f32"):  # the workbench's fused mat-vecs: weights first, x after the wait
        for name in (f"k_mul_mat_vec_{dt}_norm", f"k_mul_mat_vec_{dt}_glu_norm", f"k_mul_mat_vec_{dt}_qkv_rope"):
            before, after = fused[name].split("griddepcontrol.wait")
            assert "ld.global.nc.L1::no_allocate.v4.u32" in before, name
            assert "ld.volatile" not in before and "ld.global.f32" in after, name


def test_prefetch_compiles_missing_modules_side_by_side(monkeypatch):
    """``ModuleCache.prefetch`` compiles each missing (source, wait, trigger) module once, on
    threads that overlap, keeps what is compiled, and a compile error reaches the caller."""
    import sys
    import threading
    import time
    import types

    from workbench.exec.kernels import ModuleCache

    active, peak, compiled = [0], [0], []
    lock = threading.Lock()

    class RawModule:
        def __init__(self, code, options):
            self.options = options

        def compile(self):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.05)
            with lock:
                active[0] -= 1
                compiled.append(self.options)
            if "-DPDL_WAIT_AT=PDL_AT_late" in self.options:
                raise RuntimeError("nvrtc: error")

    class Device:
        id = 0

        def __init__(self, i=0):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    fake = types.SimpleNamespace(RawModule=RawModule, cuda=types.SimpleNamespace(Device=Device))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    mc = ModuleCache((9, 0))
    keys = {(s, "first-read", "start") for s in ("norm", "rope", "mul_mat", "attn")}
    mc.prefetch(keys)
    assert mc.compiled == 4 and len(compiled) == 4 and peak[0] > 1
    mc.prefetch(keys | {("elementwise", "none", "none")})  # one left: compiled on first lookup instead
    assert mc.compiled == 4 and len(compiled) == 4
    with pytest.raises(RuntimeError, match="nvrtc"):
        mc.prefetch({("norm", "late", "end"), ("rope", "late", "end")})
