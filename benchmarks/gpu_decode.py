"""GPU decode benchmark of the cuda backend, one run, results to data/bench/.

1. ``llama-3.2-1b`` f16, all layers, context 512 (steps 448..511 attend over 512 KV rows): time
   per token of each strategy against the bandwidth floor = bytes the step must read (weights
   and KV, from the ops' cost model) / device-to-device copy bandwidth measured in this run
   (bytes read + written, as the MEMCPY rate is usually quoted), and the lm_head mat-vec alone.
2. Each knob's speedup alone (on llama.cpp's defaults) and stacked (graphs, + PDL, + qkv
   streams, + implicit sync, + fusions with copy-elim, + llama.cpp's whole fusion set, + the
   workbench's own norm-mat-vec and qkv-rope-store over it) on llama-3.2-1b and on
   ``qwen3-next-80b-a3b --layers 8`` (where copy-elim has copies to remove), each the median of
   ``--runs`` runs of ``--tokens`` tokens with its spread, beside the seeds' reported ranges.
3. The peer ``torch``: the same decode step with the same weights in PyTorch (fp16, static KV
   cache of the same length), eager, and ``torch.compile``d (``--torch-mode``, by default
   ``max-autotune-no-cudagraphs``) then captured in one ``torch.cuda.CUDAGraph`` replayed per
   token; per token including the logits' copy to the host, as ours, with the compile time, the
   compiled-vs-eager logits error and the replay's device time (CUDA events) beside it.

Usage: ``python benchmarks/gpu_decode.py [--models llama-3.2-1b,llama-3.1-8b] [--peers torch]
[--ours stack|best] [--runs 10] [--tokens 64] [--out data/bench/gpu_decode.json]``.
``--ours best --skip next,alone,kernels`` times only our three best stacked strategies (llama.cpp's
fusion set, with the workbench's own fusions on top, and with PDL's launch signal moved after the
main loop) beside the
peers (the quick comparison). Weights are drawn on the GPU (``CudaExecutor(weights="device")``),
PyTorch reads the very same device buffers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.device import device_info as gpu_info  # noqa: E402
from workbench.exec.kernels import graph_replay_seconds  # noqa: E402
from workbench.models import build_graph, preset  # noqa: E402
from workbench.models.tokens import token_ids  # noqa: E402
from workbench.strategy import FUSIONS, WORKBENCH_FUSIONS, Strategy  # noqa: E402

#: seeds' reported token-generation gains (DESIGN.md)
SEED_RANGES = {
    "graphs": "(llama.cpp's CUDA graphs; no seed number)",
    "pdl": "4-13 % (llama.cpp's PDL change (b9254))",
    "qkv": "1-9 % (PR #16991)",
    "implicit": "1-2 % Linux, up to 8-9 % Windows (llama.cpp PR #17795)",
    "boundary": "part of PR #17795's 1-2 %",
    "copy-elim": "3-4 % (PR #23940)",
    "rms-norm-mul": "(ggml's classic fusion; no seed number)",
}
FUSED = frozenset({"copy-elim", "rms-norm-mul"})


def stack() -> list[tuple[str, Strategy]]:
    s0 = Strategy()
    s1 = s0.with_(graphs=True)
    s2 = s1.with_(pdl=True)
    s3 = s2.with_(streams="qkv", allocator="stream-aware")
    s4 = s3.with_(sync="implicit")
    s5 = s4.with_(fusion=FUSED)
    s6 = s4.with_(fusion=frozenset(FUSIONS) - frozenset(WORKBENCH_FUSIONS))
    s7 = s4.with_(fusion=frozenset(FUSIONS))
    s8 = s7.with_(pdl_trigger="after-main-loop")  # data/bench/pdl_placement_h200.md
    return [("default", s0), ("graphs", s1), ("+pdl", s2), ("+qkv", s3), ("+implicit", s4), ("+fusions", s5),
            ("+llama.cpp fusions", s6), ("+ours", s7), ("+PDL signal after the main loop", s8)]


def alone() -> list[tuple[str, Strategy]]:
    s0 = Strategy()
    return [("pdl", s0.with_(pdl=True)), ("qkv", s0.with_(streams="qkv", allocator="stream-aware")),
            ("boundary", s0.with_(sync="boundary")), ("implicit", s0.with_(sync="implicit")),
            ("rms-norm-mul", s0.with_(fusion=frozenset({"rms-norm-mul"}))),
            ("copy-elim", s0.with_(fusion=frozenset({"copy-elim"}))),
            *((f, s0.with_(fusion=frozenset({f}))) for f in WORKBENCH_FUSIONS)]


def device_info(cp) -> dict:
    out = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "python": platform.python_version()}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        out["nvidia_smi"] = q
    except Exception as e:  # pragma: no cover - informational
        out["nvidia_smi"] = f"unavailable: {e}"
    info = gpu_info(0)
    out["gpu"] = info.name
    out["sms"] = info.sm_count
    out["cuda_driver"] = info.driver_version
    out["cuda_runtime"] = info.runtime_version
    for mod in ("cupy", "numba", "numba_cuda", "cuda.bindings", "torch", "numpy"):
        try:
            m = __import__(mod, fromlist=["x"])
            out[mod] = getattr(m, "__version__", "?")
        except Exception:
            out[mod] = None
    return out


def copy_bandwidth(cp, nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy: (bytes read + bytes written) / time, median of ``reps``, B/s."""
    a = cp.empty(nbytes, cp.uint8)
    b = cp.empty(nbytes, cp.uint8)
    a.fill(1)
    s = cp.cuda.Stream(non_blocking=True)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for i in range(reps + 3):
        e0.record(s)
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, 3, s.ptr)
        e1.record(s)
        e1.synchronize()
        if i >= 3:
            ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    del a, b
    return 2 * nbytes / float(np.median(ts))


def kernel_times(cp, ex, pos: int, names: list[str], reps: int = 20) -> list[dict]:
    """Device time of each named node's kernel: ``reps`` back-to-back launches captured in one
    CUDA graph, replayed between events (no host launch cost inside the interval)."""
    b = ex.bound(ex.cfg.kv_len(pos))
    out = []
    for name in names:
        i = next((la.index for la in b.plan.launches if la.node.name == name), None)
        if i is None:
            continue
        node = b.plan.launches[i].node
        s = ex._stream(b.plan.launches[i].stream)
        t = graph_replay_seconds(cp, s, b.handles[i], reps)
        out.append({"node": name, "op": node.op, "kernel": b.calls[i].name, "grid": list(b.calls[i].grid),
                    "us": t * 1e6, "bytes": node.bytes, "GBps": node.bytes / t / 1e9})
    return out


LLAMA_LAYER_NODES = ["attn_norm-0_rms", "attn_norm-0", "Qcur-0", "Kcur-0", "Vcur-0", "Qcur_rope-0", "Kcur_rope-0",
                     "k_cache_store-0", "v_cache_store-0", "kqv_out-0", "attn_out-0", "ffn_inp-0", "ffn_norm-0_rms",
                     "ffn_norm-0", "ffn_gate-0", "ffn_up-0", "ffn_swiglu-0", "ffn_out-0", "l_out-0"]
HEAD_NODES = ["inp_embd", "result_norm_rms", "result_norm", "result_output"]


def summary(name: str, per_run_us, runs: int, tokens: int) -> dict:
    """One row: median, min, max and IQR over runs of the mean time per token (us)."""
    a = np.asarray(per_run_us, dtype=float)
    return {"strategy": name, "us_per_token_median": float(np.median(a)), "us_min": float(a.min()),
            "us_max": float(a.max()), "us_iqr": float(np.percentile(a, 75) - np.percentile(a, 25)),
            "runs": runs, "tokens": tokens}


def time_strategy(cfg, strategy, base, tokens: int, runs: int, start: int) -> dict:
    """Median and spread over ``runs`` of the mean time per token of ``tokens`` steps from ``start``."""
    from workbench.exec.cuda import CudaExecutor

    ex = CudaExecutor(cfg, strategy, share=base)
    ids = token_ids(cfg, tokens, 0)
    ex.prepare(start)
    snap = ex.snapshot()
    for t in ids[:4]:  # warm-up: compile, capture, caches
        ex.step(t, start)
    per_run = []
    for _ in range(runs):
        ex.restore(snap)
        n0 = len(ex.times.start_ns)
        for i, t in enumerate(ids):
            ex.step(t, start + i)
        us = (np.asarray(ex.times.end_ns[n0:]) - np.asarray(ex.times.start_ns[n0:])) / 1e3
        per_run.append(float(us.mean()))
    plan = ex.bound(cfg.kv_len(start)).plan
    out = {**summary(strategy.label(), per_run, runs, tokens), "kernels_per_token": len(plan.launches),
           "bytes_per_token": float(sum(n.bytes for n in plan.graph.nodes))}
    del ex
    return out


# -------------------------------------------------------------------------------------------
# PyTorch: the same Llama decode step with the same (device) weights
# -------------------------------------------------------------------------------------------
class TorchLlama:
    """gpt-fast-style fp16 Llama decode step over a static KV cache, reading the workbench's
    weight buffers (zero copy for the fp16 matrices)."""

    def __init__(self, cfg, ex) -> None:
        import torch

        from workbench.models.rope import rope_params

        self.torch = torch
        self.cfg = cfg
        g = ex.full

        def w(name: str):
            v = g.weights[name]
            arr = ex.cp.ndarray(v.shape, {"f16": ex.cp.float16, "f32": ex.cp.float32}[v.dtype],
                                ex._persistent_mem.data + (ex._offsets[v.buffer.name] + v.offset))
            t = torch.as_tensor(arr, device="cuda")
            return t.half() if t.dtype != torch.float16 else t

        self.w = w
        c = cfg.get
        self.d, self.H, self.Hkv, self.hd = c("hidden_size"), c("num_attention_heads"), c("num_key_value_heads"), \
            cfg.head_dim
        self.eps, self.L, self.ctx = c("rms_norm_eps"), cfg.n_layer, cfg.context
        self.embed = w("model.embed_tokens.weight")
        self.lm = self.embed if c("tie_word_embeddings", False) else w("lm_head.weight")
        self.norm = w("model.norm.weight")
        self.layers = []
        for il in range(self.L):
            p = f"model.layers.{il}"
            self.layers.append({k: w(f"{p}.{n}.weight") for k, n in (
                ("an", "input_layernorm"), ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"),
                ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"), ("fn", "post_attention_layernorm"),
                ("g", "mlp.gate_proj"), ("u", "mlp.up_proj"), ("dn", "mlp.down_proj"))})
        inv, factor = rope_params(cfg)
        ang = torch.arange(self.ctx, device="cuda", dtype=torch.float32)[:, None] * \
            torch.as_tensor(inv, device="cuda")[None, :]
        self.cos = (torch.cos(ang) * factor).half()
        self.sin = (torch.sin(ang) * factor).half()
        self.kc = torch.zeros(self.L, 1, self.Hkv, self.ctx, self.hd, device="cuda", dtype=torch.float16)
        self.vc = torch.zeros_like(self.kc)
        self.ar = torch.arange(self.ctx, device="cuda")
        self.tok = torch.zeros(1, dtype=torch.long, device="cuda")
        self.pos = torch.zeros(1, dtype=torch.long, device="cuda")
        self.host = torch.empty(c("vocab_size"), dtype=torch.float16, pin_memory=True)

    def _rms(self, x, w):
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).half() * w

    def _rope(self, x):
        half = x.shape[-1] // 2
        cos, sin = self.cos[self.pos], self.sin[self.pos]  # [1, half]
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def step(self):
        torch, F = self.torch, self.torch.nn.functional
        x = self.embed[self.tok]  # [1, d]
        mask = torch.where(self.ar <= self.pos, 0.0, float("-inf")).half()[None, None, None, :]
        for il, p in enumerate(self.layers):
            h = self._rms(x, p["an"])
            q = F.linear(h, p["q"]).view(1, self.H, 1, self.hd)
            k = F.linear(h, p["k"]).view(1, self.Hkv, 1, self.hd)
            v = F.linear(h, p["v"]).view(1, self.Hkv, 1, self.hd)
            q, k = self._rope(q), self._rope(k)
            self.kc[il].index_copy_(2, self.pos, k)
            self.vc[il].index_copy_(2, self.pos, v)
            a = F.scaled_dot_product_attention(q, self.kc[il], self.vc[il], attn_mask=mask, enable_gqa=True)
            x = x + F.linear(a.reshape(1, self.H * self.hd), p["o"])
            h = self._rms(x, p["fn"])
            x = x + F.linear(F.silu(F.linear(h, p["g"])) * F.linear(h, p["u"]), p["dn"])
        return F.linear(self._rms(x, self.norm), self.lm)

    def run_tokens(self, ids, start: int, replay=None) -> np.ndarray:
        """Per-token host wall time (us): inputs in, step (or graph replay), logits to pinned host, sync."""
        torch = self.torch
        out = []
        for i, t in enumerate(ids):
            t0 = time.perf_counter_ns()
            self.tok.fill_(int(t))
            self.pos.fill_(start + i)
            logits = replay() if replay is not None else self.step()
            self.host.copy_(logits.view(-1), non_blocking=True)
            torch.cuda.synchronize()
            out.append((time.perf_counter_ns() - t0) / 1e3)
        return np.asarray(out)


def time_torch(cfg, ex, tokens: int, runs: int, start: int, mode: str) -> tuple[dict, dict]:
    """Rows ``torch-eager`` and ``torch-compile+graph`` (``torch.compile(mode=mode)`` of the step,
    captured in one CUDA graph), and what the compile cost: (rows, info)."""
    import torch

    m = TorchLlama(cfg, ex)
    ids = token_ids(cfg, tokens, 0)
    info: dict = {"torch": torch.__version__, "mode": mode}
    with torch.inference_mode():
        m.run_tokens(ids[:4], start)
        eager = [float(m.run_tokens(ids, start).mean()) for _ in range(runs)]
        compiled = torch.compile(m.step, mode=mode, dynamic=False)
        m.tok.fill_(int(ids[0]))
        m.pos.fill_(start)
        t0 = time.perf_counter()
        first = compiled().float()
        torch.cuda.synchronize()
        info["compile_s"] = time.perf_counter() - t0
        ref = m.step().float()
        info["compiled_vs_eager_max_rel_err"] = float((first - ref).abs().max() / ref.abs().max())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                compiled()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(g):
            static_out = compiled()
        info["capture_s"] = time.perf_counter() - t0

        def replay():
            g.replay()
            return static_out

        m.run_tokens(ids[:4], start, replay)
        graph, events = [], []
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(runs):
            e0.record()
            graph.append(float(m.run_tokens(ids, start, replay).mean()))
            e1.record()
            e1.synchronize()
            events.append(e0.elapsed_time(e1) * 1e3 / len(ids))
        reps = 20
        e0.record()
        for _ in range(reps):
            g.replay()
        e1.record()
        e1.synchronize()
        info["graph_replay_device_us"] = e0.elapsed_time(e1) * 1e3 / reps
    rows = {"torch-eager": summary("torch-eager", eager, runs, tokens),
            "torch-compile+graph": {**summary("torch-compile+graph", graph, runs, tokens),
                                    "us_per_token_events_median": float(np.median(events))}}
    return rows, info


def speedups(rows: dict, base: str) -> None:
    for r in rows.values():
        r["speedup_vs_" + base] = rows[base]["us_per_token_median"] / r["us_per_token_median"]


#: peers a run can time beside ours (``--peers``)
PEERS = ("torch",)
#: parts ``--skip`` can leave out
PARTS = ("llama", "alone", "kernels", "next")


def bench_llama(cp, name: str, args, skip: set[str], peers: set[str], bw: float, result: dict, save) -> None:
    """Our strategies on the llama-family preset ``name`` (f16, context 512), its bandwidth floor,
    the per-kernel device times, and the peers' rows beside them in ``result[name]``."""
    from workbench.exec.cuda import CudaExecutor

    cfg = preset(name, context=512)
    start = 512 - args.tokens  # steps start..511 attend over 512 KV rows
    t0 = time.time()
    base = CudaExecutor(cfg, Strategy(), weights="device")
    print(f"{cfg.name} weights on the GPU in {time.time() - t0:.1f} s", flush=True)
    ours = stack() if args.ours == "stack" else stack()[-3:]
    rows: dict = result.setdefault(cfg.name, {})
    info: dict = result.setdefault("per_model", {}).setdefault(cfg.name, {})
    for label, st in ours + ([] if "alone" in skip or args.ours != "stack" else alone()):
        rows[label] = time_strategy(cfg, st, base, args.tokens, args.runs, start)
        print(f"  {label:20s} {rows[label]['us_per_token_median']:8.1f} us/token "
              f"[{rows[label]['us_min']:.1f}, {rows[label]['us_max']:.1f}]", flush=True)
        save()
    nbytes = float(sum(n.bytes for n in build_graph(cfg, 512).nodes))
    best_name = min(rows, key=lambda k: rows[k]["us_per_token_median"])
    best = rows[best_name]["us_per_token_median"]
    floor_us = nbytes / bw * 1e6
    info["floor"] = {"bytes_per_token": nbytes, "floor_us": floor_us, "best": best_name, "best_us": best,
                     "fraction_of_floor": floor_us / best}
    print(f"  floor {floor_us:.1f} us/token ({nbytes / 1e9:.3f} GB at {bw / 1e9:.0f} GB/s); best {best_name} "
          f"{best:.1f} us = {100 * floor_us / best:.1f} % of the floor", flush=True)
    if "kernels" not in skip:
        pre = CudaExecutor(cfg, Strategy(), share=base)
        kt = kernel_times(cp, pre, start, LLAMA_LAYER_NODES + HEAD_NODES)
        layer_us = sum(k["us"] for k in kt if k["node"] in LLAMA_LAYER_NODES)
        head_us = sum(k["us"] for k in kt if k["node"] in HEAD_NODES)
        info["kernels"] = kt
        info["kernel_sum_us"] = {"layer": layer_us, "head": head_us, "token": layer_us * cfg.n_layer + head_us}
        del pre
        for k in kt:
            print(f"  kernel {k['node']:16s} {k['kernel']:26s} {k['us']:8.2f} us {k['GBps']:7.0f} GB/s", flush=True)
        print(f"  kernels alone: {layer_us:.1f} us per layer, {head_us:.1f} us head, "
              f"{layer_us * cfg.n_layer + head_us:.1f} us per token", flush=True)
    save()
    if "torch" in peers:
        try:
            tr, tinfo = time_torch(cfg, base, args.tokens, args.runs, start, args.torch_mode)
            rows.update(tr)
            info["torch"] = {**tinfo, "ours_best_over_torch": best / tr["torch-compile+graph"]["us_per_token_median"]}
            for k, r in tr.items():
                print(f"  {k:20s} {r['us_per_token_median']:8.1f} us/token [{r['us_min']:.1f}, {r['us_max']:.1f}]",
                      flush=True)
            print(f"  torch.compile({args.torch_mode}) {tinfo['compile_s']:.1f} s, capture {tinfo['capture_s']:.2f} s, "
                  f"compiled vs eager logits {tinfo['compiled_vs_eager_max_rel_err']:.2e}, graph replay "
                  f"{tinfo['graph_replay_device_us']:.1f} us device; ours best ({best_name}) / torch = "
                  f"{info['torch']['ours_best_over_torch']:.3f}", flush=True)
        except Exception as e:  # report, keep the rest
            info["torch_error"] = f"{type(e).__name__}: {e}"
            print("torch part failed:", info["torch_error"], flush=True)
        import torch

        torch.cuda.empty_cache()
    speedups(rows, next(iter(rows)))
    save()
    del base
    cp.get_default_memory_pool().free_all_blocks()


def _list(text: str, allowed: tuple[str, ...], flag: str) -> set[str]:
    items = set(filter(None, text.split(",")))
    bad = sorted(items - set(allowed))
    if bad:
        raise SystemExit(f"{flag}: unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "gpu_decode.json"))
    ap.add_argument("--models", default="llama-3.2-1b",
                    help="comma list of llama-family presets to time (ours and the peers)")
    ap.add_argument("--peers", default="torch", help=f"comma list of peers to time beside ours: {', '.join(PEERS)}")
    ap.add_argument("--ours", choices=("stack", "best"), default="stack",
                    help="our strategies: every stacked knob (and each alone), or only the best three stacked")
    ap.add_argument("--torch-mode", default="max-autotune-no-cudagraphs",
                    help="torch.compile mode of the peer (then captured in one CUDA graph by hand)")
    ap.add_argument("--next-layers", type=int, default=8)
    ap.add_argument("--skip", default="", help=f"comma list of parts to skip: {', '.join(PARTS)}")
    ap.add_argument("--next", default="qwen3-next-80b-a3b", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    skip = _list(args.skip, PARTS + PEERS, "--skip")
    peers = _list(args.peers, PEERS, "--peers") - skip
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if preset(m).family != "llama":
            raise SystemExit(f"--models {m}: the PyTorch peer and the kernel table model llama-family presets "
                             "(llama-3.2-1b, llama-3.1-8b); pass those")

    import cupy as cp

    from workbench.exec.cuda import CudaExecutor

    result: dict = {"device": device_info(cp), "runs": args.runs, "tokens": args.tokens}
    bw = copy_bandwidth(cp)
    result["copy_bandwidth_GBps"] = bw / 1e9
    print(f"device {result['device']['gpu']}  D2D copy {bw / 1e9:.0f} GB/s (read + write)", flush=True)
    start = 512 - args.tokens  # steps start..511 attend over 512 KV rows

    def save() -> None:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))

    if "llama" not in skip:
        for name in models:
            bench_llama(cp, name, args, skip, peers, bw, result, save)

    if "next" not in skip:
        cfg = preset(args.next, layers=args.next_layers, context=512)
        t0 = time.time()
        base = CudaExecutor(cfg, Strategy(), weights="device")
        print(f"{cfg.name} --layers {args.next_layers} weights on the GPU in {time.time() - t0:.1f} s",
              flush=True)
        rows = {}
        extra = [("copy-elim", Strategy(fusion=frozenset({"copy-elim"})))]
        for name, st in stack() + extra:
            rows[name] = time_strategy(cfg, st, base, args.tokens, args.runs, start)
            print(f"  {name:14s} {rows[name]['us_per_token_median']:8.1f} us/token "
                  f"[{rows[name]['us_min']:.1f}, {rows[name]['us_max']:.1f}]", flush=True)
            result[f"{cfg.name}-L{args.next_layers}"] = rows
            save()
        speedups(rows, "default")
        save()
        del base
    result["seed_ranges"] = SEED_RANGES
    save()
    print("wrote", args.out, flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
