"""Mat-vec variants on the shapes of a Llama-3.2-1B decode step: which kernel, warps per row
(``splits``), rows per warp and unroll depth reach the memory bandwidth (device time of 20
back-to-back launches in one CUDA graph; GB/s = weight bytes / time). Picks the binder's
heuristics in ``workbench.exec.cuda_ops``. Usage: ``python benchmarks/matvec_sweep.py [--out F]
[--shapes 4096x4096,4096x14336]`` (N x K). The block kernel's depth is ``MMV_UNROLL``, the
row-streaming kernel's ``MMV_ROWS_UNROLL`` (``uN`` in a variant's name is the one its kernel reads).
"""

from __future__ import annotations

import argparse
import json
import sys
from math import ceil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.device import device_info  # noqa: E402
from workbench.exec.kernels import (  # noqa: E402
    Arg,
    LaunchHandle,
    compile_options,
    graph_replay_seconds,
    kernel_source,
)

SHAPES = [(8192, 2048), (2048, 8192), (2048, 2048), (512, 2048), (128256, 2048)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "matvec_sweep.json"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", help="N x K pairs, comma-separated (default: llama-3.2-1b's)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    import cupy as cp

    cc = device_info().compute_capability

    def module(define: str) -> object:
        return cp.RawModule(code=kernel_source("mul_mat"), options=compile_options("none", "none", cc) + (define,))

    mods = {u: module(f"-DMMV_UNROLL={u}") for u in (2, 4, 8)}
    rows_mods = {u: module(f"-DMMV_ROWS_UNROLL={u}") for u in (1, 2, 3, 4, 6, 8)}
    s = cp.cuda.Stream(non_blocking=True)
    rows = []
    for N, K in shapes:
        w = (cp.random.standard_normal((N, K), dtype=cp.float32) * 0.02).astype(cp.float16)
        x = cp.random.standard_normal(K, dtype=cp.float32)
        d = cp.empty(N, cp.float32)
        wa = Arg(w.data.ptr, (1, 1, N, K), (0, 0, 2 * K, 2), "f16")
        xa = Arg(x.data.ptr, (1, 1, 1, K), (0, 0, 4 * K, 4), "f32")
        da = Arg(d.data.ptr, (1, 1, 1, N), (0, 0, 4 * N, 4), "f32")
        ref = (w.astype(cp.float32) @ x).get()
        variants = []
        for u, mod in mods.items():
            for sp in (1, 2, 4, 8):
                variants.append((f"vec u{u} splits{sp}", mod.get_function("k_mul_mat_vec_f16"),
                                 (ceil(N / (8 // sp)), 1), sp))
        for u, mod in rows_mods.items():
            for rpw in (1, 2, 4, 8, 16, 32):
                if rpw > 1 and N / rpw < 512:
                    continue
                warps = ceil(N / rpw)
                variants.append((f"rows u{u} rpw{rpw}", mod.get_function("k_mul_mat_vec_rows_f16"),
                                 (ceil(warps / 8), 1), rpw))
        for name, fn, grid, p in variants:
            h = LaunchHandle(name, fn, grid, (256,), s.ptr, (da, wa, xa, __import__("ctypes").c_int(p)), pdl=False)
            d.fill(np.nan)
            h()
            s.synchronize()
            err = float(np.abs(d.get() - ref).max() / np.abs(ref).max())
            t = graph_replay_seconds(cp, s, h, args.reps)
            rows.append({"N": N, "K": K, "variant": name, "us": t * 1e6, "GBps": N * K * 2 / t / 1e9, "rel_err": err})
        best = sorted((r for r in rows if r["N"] == N and r["K"] == K), key=lambda r: r["us"])[:4]
        print(f"{N:6d} x {K:5d}: " + " | ".join(f"{r['variant']} {r['us']:.2f} us {r['GBps']:.0f} GB/s"
                                               for r in best), flush=True)
        bad = [r for r in rows if r["N"] == N and not r["rel_err"] < 1e-3]
        if bad:
            print("  WRONG:", [(r["variant"], r["rel_err"]) for r in bad], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
