"""Does a CUDA graph's kernel-to-kernel step grow with its nodes when each node carries a large
parameter block? (GPU)

A decode layer grows with depth untraced (`data/bench/calibration_h200_s37_fullsize.md` section 5)
though a chain of identical small-parameter kernels does not (`graph_step_probe.py`), nor does the
weights' footprint (`footprint_probe.py`). The executor's kernels carry views (pointers, shapes,
strides) as parameters; a graph of many such nodes holds more launch state per replay. This probe
times graph replays (``kernels.graph_replay_samples``, CUDA events) of chains of one empty kernel
(132 blocks of 128 threads) whose by-value parameter is 4 B to 4 KiB, every node with its own
values, from 32 to 2048 nodes: the step a node per parameter size and node count.

Usage (GPU)::

    python benchmarks/param_size_probe.py --out data/bench/param_size_probe_h200.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graph_step_probe import probe_environment  # noqa: E402

NODES = (32, 128, 512, 1024, 2048)
#: floats in the by-value parameter block (4 B, 256 B, 1 KiB, 4000 B: under the 4 KiB classic limit)
PARAM_FLOATS = (1, 64, 256, 1000)


def kernel_source(n: int) -> str:
    return (f"struct P {{ float v[{n}]; }};\n"
            f"extern \"C\" __global__ void k_param(P p, float* out) {{\n"
            f"    if (threadIdx.x == 0 && p.v[0] == -1.0f) out[blockIdx.x] = p.v[{n - 1}];\n}}\n")


def measure(cp: Any, reps: int) -> list[dict[str, Any]]:
    from cuda.bindings import driver as cu

    from workbench.exec.kernels import graph_replay_samples

    out = cp.zeros(1024, cp.float32)
    out_ptr = ctypes.c_void_p(out.data.ptr)
    s = cp.cuda.Stream(non_blocking=True)
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 132, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 128, 1, 1
    cfg.sharedMemBytes = 0
    cfg.hStream = cu.CUstream(s.ptr)
    cfg.numAttrs = 0
    rows = []
    for n in PARAM_FLOATS:
        fn = cp.RawModule(code=kernel_source(n)).get_function("k_param")
        func = cu.CUfunction(fn.kernel.ptr)
        for nodes in NODES:
            blocks = [(ctypes.c_float * n)(*([float(i)] * n)) for i in range(nodes)]  # a parameter block a node
            ptrs = [(ctypes.c_void_p * 2)(ctypes.addressof(b), ctypes.addressof(out_ptr)) for b in blocks]
            nxt = iter(range(nodes)).__next__

            def launch(i: Any = nxt, ptrs: Any = ptrs, func: Any = func) -> None:
                err, = cu.cuLaunchKernelEx(cfg, func, ctypes.addressof(ptrs[i()]), 0)
                if err != cu.CUresult.CUDA_SUCCESS:
                    raise RuntimeError(f"cuLaunchKernelEx: {err}")

            with s:
                t = np.asarray(graph_replay_samples(cp, s, launch, nodes, reps + 3, 3))
            rows.append({"param_bytes": 4 * n, "nodes": nodes, "step_ns": float(np.median(t)) * 1e9,
                         "step_ns_min": float(t.min()) * 1e9})
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    from workbench.exec.kernels import require_cupy

    cp, _ = require_cupy()
    rows = measure(cp, args.reps)
    data = {"environment": probe_environment(cp), "reps": args.reps, "rows": rows}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
