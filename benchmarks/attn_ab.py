"""Decode attention A/B: ``kernels/attn.cu`` at a git revision (``--rev``, default HEAD) against the
working tree's, the same bound launches (``cuda_ops.bind`` of one FLASH_ATTN_EXT node) on the same
buffers, for the vec and gqa variants at Llama-3.2-1B / 3.1-8B and gpt-oss-20b shapes over 512 to
32768 KV rows: device time of 20 launches in one CUDA graph (median of 7 replays) and the largest
relative difference of the two outputs. Usage (GPU machine): ``python3 benchmarks/attn_ab.py``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import workbench.exec.cuda_ops as cuda_ops  # noqa: E402
from workbench.exec.cuda_ops import bind  # noqa: E402
from workbench.exec.device import device_info  # noqa: E402
from workbench.exec.kernels import LaunchHandle, compile_options, graph_replay_seconds, kernel_source  # noqa: E402
from workbench.graph import GraphBuilder  # noqa: E402

#: (query heads, KV heads, head dim, KV rows)
SHAPES = [(32, 8, 64, 512), (32, 8, 128, 512), (64, 8, 64, 4096), (64, 8, 64, 32768)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="git revision of kernels/attn.cu to compare with")
    args = ap.parse_args(argv)
    import cupy as cp

    cc = device_info().compute_capability
    old = subprocess.run(["git", "show", f"{args.rev}:kernels/attn.cu"], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    old = old.replace('#include "common.cuh"', (ROOT / "kernels" / "common.cuh").read_text())
    mods = {args.rev: cp.RawModule(code=old, options=compile_options("none", "none", cc)),
            "tree": cp.RawModule(code=kernel_source("attn"), options=compile_options("none", "none", cc))}
    s = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    for H, Hkv, D, n_kv in SHAPES:
        for variant in ("vec", "gqa"):
            cuda_ops.FA_VARIANT = variant
            b = GraphBuilder("fa")
            q = b.input("q", (H, D), "f32")
            k = b.input("k", (n_kv, Hkv, D), "f16")
            v = b.input("v", (n_kv, Hkv, D), "f16")
            m = b.input("mask", (n_kv,), "f32")
            b.op("FLASH_ATTN_EXT", "out", [q, k, v, m], (H * D,), scale=1.0 / np.sqrt(D))
            g = b.build()
            dev = {n: cp.zeros(buf.nbytes, cp.uint8) for n, buf in g.buffers().items()}
            dev["q"][:] = cp.asarray(rng.standard_normal(H * D).astype(np.float32).view(np.uint8))
            for name in ("k", "v"):
                dev[name][:] = cp.asarray(rng.standard_normal(n_kv * Hkv * D).astype(np.float16).view(np.uint8))
            keep = []

            def workspace(key, n, keep=keep):
                a = cp.zeros(n, cp.uint8)
                keep.append(a)
                return int(a.data.ptr)

            cp.cuda.Device().synchronize()
            call = bind(g.nodes[0], lambda x, dev=dev: int(dev[x.buffer.name].data.ptr) + x.offset, workspace)
            outs = {}
            for name, mod in mods.items():
                h = LaunchHandle(call.name, mod.get_function(call.name), call.grid, call.block, s.ptr, call.args,
                                 pdl=False, cluster=call.cluster)
                h()
                s.synchronize()
                outs[name] = cp.asnumpy(dev["out"]).view(np.float32).copy()
                t = graph_replay_seconds(cp, s, h, 20)
                print(f"H={H} Hkv={Hkv} D={D} kv={n_kv:6d} {variant} {call.name:28s} grid {call.grid} {name}: "
                      f"{t * 1e6:7.2f} us", flush=True)
            a, b2 = outs.values()
            print(f"   max relative difference {float(np.abs(a - b2).max() / np.abs(a).max()):.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
