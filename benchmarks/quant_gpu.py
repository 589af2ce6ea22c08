"""Quantised weights on the GPU: the mmvq kernels against the memory bandwidth, and whole decode
steps of quantised models, written as a markdown table (``--md``) and JSON (``--json``).

1. Kernels: ``k_quantize_q8_1`` + ``k_mul_mat_vec_q_<type>`` (q8_0, q4_0, q4_k, mxfp4) and the
   f16 mat-vec the binder picks, on the projections of Llama-3.2-1B and Llama-3.1-8B. Device
   time per launch: ``--reps`` back-to-back launches captured in one CUDA graph, replayed between
   CUDA events (``graph_replay_samples``: 2 warm-up replays, then ``--rounds``), median with
   min..max. GB/s = bytes the kernel must move (weight blocks + q8_1 activation + f32 output) /
   time, and its share of the device-to-device copy bandwidth measured in the same run. The
   weights are a few quantised rows tiled over the matrix (the values do not change the time;
   the bytes do), so q4_k's slow NumPy quantiser stays out of the run.
2. Models: ``workbench.run`` on llama-3.2-1b (all layers) and qwen3-30b-a3b (``--layers 8``) with
   f16, q8_0 and q4_0 weights under ``BEST`` (every knob on, as gpu_decode's last stack step
   with every fusion; the fusions leave quantised mat-vecs alone), context 512: median time per
   token over ``--tokens`` steps after a warm-up run (min..max), tokens/s, and the bandwidth
   floor (the step's bytes from the cost model / the copy bandwidth).

Usage (on the GPU machine): ``python3 benchmarks/quant_gpu.py --md $OUT/quant_gpu.md
[--json $OUT/quant_gpu.json] [--reps 20] [--rounds 9] [--tokens 64] [--skip-models | --skip-kernels]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_decode import copy_bandwidth  # noqa: E402
from benchmarks.gpu_decode import device_info as run_info  # noqa: E402
from workbench.exec.cuda_ops import bind  # noqa: E402
from workbench.exec.device import device_info  # noqa: E402
from workbench.exec.kernels import LaunchHandle, graph_replay_samples, module_cache  # noqa: E402
from workbench.graph import GraphBuilder, is_quantized  # noqa: E402
from workbench.models.quant import quantize  # noqa: E402
from workbench.strategy import FUSIONS, Strategy  # noqa: E402

#: model -> its mat-vec shapes (name, N outputs, K inputs)
SHAPES = {
    "llama-3.2-1b": [("q/o", 2048, 2048), ("k/v", 512, 2048), ("gate/up", 8192, 2048), ("down", 2048, 8192),
                     ("lm_head", 128256, 2048)],
    "llama-3.1-8b": [("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336),
                     ("lm_head", 128256, 4096)],
}
DTYPES = ("f16", "q8_0", "q4_0", "q4_k", "mxfp4")
#: rows quantised on the host and tiled over the matrix
TILE_ROWS = 64
BEST = Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware", sync="implicit",
                fusion=frozenset(FUSIONS))
#: (preset, layers or None for all) -> weight types run
MODELS = [("llama-3.2-1b", None), ("qwen3-30b-a3b", 8)]
MODEL_DTYPES = ("f16", "q8_0", "q4_0")


def matvec_launches(cp, stream, modules, dtype: str, N: int, K: int,
                    rng) -> tuple[list[tuple[str, object, float]], list]:
    """The launches of one mat-vec (QUANTIZE_Q8_1 + mul_mat_vec_q, or the f16 mat-vec), each with
    the bytes it must move; plus the device arrays that keep them alive."""
    b = GraphBuilder("bench")
    w = b.weight("w", (N, K), dtype)
    x = b.input("x", (1, K), "f32")
    xin = b.op("QUANTIZE_Q8_1", "x_q8_1", [x], (1, K), dtype="q8_1") if is_quantized(dtype) else x
    b.op("MUL_MAT", "out", [w, xin], (1, N))
    g = b.build()
    dev = {name: cp.zeros(buf.nbytes, cp.uint8) for name, buf in g.buffers().items()}
    rows = (rng.standard_normal((TILE_ROWS, K)) / np.sqrt(K)).astype(np.float32)
    tile = quantize(rows, dtype) if is_quantized(dtype) else rows.astype(np.float16).view(np.uint8)
    dev["w"][:] = cp.tile(cp.asarray(tile.reshape(-1)), -(-N // TILE_ROWS))[: w.nbytes]
    dev["x"][:] = cp.asarray(rng.standard_normal(K).astype(np.float32).view(np.uint8))
    out = []
    for node in g.nodes:
        call = bind(node, lambda v: int(dev[v.buffer.name].data.ptr) + v.offset, lambda key, n: 0)
        h = LaunchHandle(call.name, modules.function(call.source, call.name), call.grid, call.block, stream.ptr,
                         call.args, pdl=False)
        out.append((call.name, h, float(node.bytes)))
    return out, list(dev.values())


def time_kernels(cp, reps: int, rounds: int, bw: float) -> list[dict]:
    stream = cp.cuda.Stream(non_blocking=True)
    modules = module_cache(device_info().compute_capability)
    rng = np.random.default_rng(0)
    rows = []
    for model, shapes in SHAPES.items():
        for what, N, K in shapes:
            for dtype in DTYPES:
                launches, keep = matvec_launches(cp, stream, modules, dtype, N, K, rng)
                for name, h, nbytes in launches:
                    h()  # compile and load outside the capture
                    stream.synchronize()
                    t = np.asarray(graph_replay_samples(cp, stream, h, reps, rounds + 2, 2))
                    med = float(np.median(t))
                    rows.append({"model": model, "matrix": what, "N": N, "K": K, "dtype": dtype, "kernel": name,
                                 "us": med * 1e6, "us_min": float(t.min()) * 1e6, "us_max": float(t.max()) * 1e6,
                                 "bytes": nbytes, "GBps": nbytes / med / 1e9, "of_copy_bw": nbytes / med / bw})
                    print(f"  {model:12s} {what:8s} {N:6d}x{K:<5d} {dtype:5s} {name:28s} {med * 1e6:8.2f} us "
                          f"{nbytes / med / 1e9:7.0f} GB/s ({100 * nbytes / med / bw:4.0f} %)", flush=True)
                del keep
    return rows


def run_models(tokens: int, bw: float) -> list[dict]:
    import workbench
    from workbench.models import preset

    rows = []
    for name, layers in MODELS:
        for dtype in MODEL_DTYPES:
            cfg = preset(name, layers=layers, context=512, weight_dtype=dtype)
            t0 = time.time()
            workbench.run(cfg, BEST, tokens=4, backend="cuda", quiet=True)  # weights, compile, capture
            setup = time.time() - t0
            run = workbench.run(cfg, BEST, tokens=tokens, backend="cuda", quiet=True)
            us = np.asarray(run.meta["token_us"][1:])
            nbytes = float(sum(n.bytes for n in run.plan.graph.nodes))
            med = float(np.median(us))
            rows.append({"model": name, "layers": layers or cfg.n_layer, "dtype": dtype, "strategy": BEST.label(),
                         "us_per_token": med, "us_min": float(us.min()), "us_max": float(us.max()),
                         "tokens_per_s": 1e6 / med, "bytes_per_token": nbytes, "floor_us": nbytes / bw * 1e6,
                         "of_floor": nbytes / bw * 1e6 / med, "kernels_per_token": run.stats["kernels_per_token"],
                         "setup_s": setup})
            print(f"  {name:14s} L{layers or cfg.n_layer:<3d} {dtype:5s} {med:8.1f} us/token "
                  f"[{us.min():.1f}, {us.max():.1f}] floor {nbytes / bw * 1e6:.1f} us (setup {setup:.0f} s)",
                  flush=True)
    return rows


def markdown(info: dict, bw: float, kernels: list[dict], models: list[dict], args) -> str:
    out = [f"# Quantised weights on the GPU ({info.get('nvidia_smi', 'GPU')})", "",
           f"Generated by `python3 benchmarks/quant_gpu.py` on {info['date']}; device-to-device copy bandwidth "
           f"{bw / 1e9:.0f} GB/s (read + written). Kernels: median of {args.rounds} CUDA-graph replays of "
           f"{args.reps} launches each (after 2 warm-up replays), min..max beside it.", ""]
    if kernels:
        out += ["## Mat-vec kernels", "",
                "| model | matrix | N x K | weights | kernel | us (min..max) | GB/s | of copy bw |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['matrix']} | {r['N']} x {r['K']} | {r['dtype']} | `{r['kernel']}` | "
                f"{r['us']:.2f} ({r['us_min']:.2f}..{r['us_max']:.2f}) | {r['GBps']:.0f} | "
                f"{100 * r['of_copy_bw']:.0f} % |"
                for r in kernels]
        out.append("")
    if models:
        out += ["## Decode steps", "", f"Strategy `{BEST.label()}`, context 512, {args.tokens} tokens after a "
                "warm-up run; floor = the step's bytes (cost model) / copy bandwidth.", "",
                "| model | layers | weights | us/token (min..max) | tokens/s | floor us | of floor | kernels |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['model']} | {r['layers']} | {r['dtype']} | {r['us_per_token']:.1f} "
                f"({r['us_min']:.1f}..{r['us_max']:.1f}) | {r['tokens_per_s']:.0f} | {r['floor_us']:.1f} | "
                f"{100 * r['of_floor']:.0f} % | {r['kernels_per_token']} |" for r in models]
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--md", required=True, help="markdown table to write")
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-models", action="store_true", help="kernels only")
    ap.add_argument("--skip-kernels", action="store_true", help="decode steps only")
    args = ap.parse_args(argv)
    import cupy as cp

    info = run_info(cp)
    bw = copy_bandwidth(cp)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    kernels = [] if args.skip_kernels else time_kernels(cp, args.reps, args.rounds, bw)
    models = [] if args.skip_models else run_models(args.tokens, bw)
    Path(args.md).write_text(markdown(info, bw, kernels, models, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": info, "copy_GBps": bw / 1e9, "kernels": kernels,
                                               "models": models}, indent=1))
    print(f"wrote {args.md}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
