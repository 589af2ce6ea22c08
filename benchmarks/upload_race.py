"""Does a kernel launched on a non-blocking stream right after a pageable ``cudaMemcpy`` read its
inputs before the copy's DMA lands? (tests/gpu/test_cuda_fused.py's harness did, which made
``norm-mat-vec-glu-rounds`` fail now and then; data/bench/gpu_tests_s15.md.)

Each trial: the case's bytes uploaded as the harness does (into a pool block poisoned with NaN),
the fused kernel launched at once on a non-blocking stream (the old harness) or a blocking one (the
fix); prints how many trials' output is non-finite or off the reference. Run from the repository
root on a GPU: ``python benchmarks/upload_race.py --trials 60``. The race shows most on a machine
whose memory an earlier program churned (after llama.cpp's benchmark: 14-30 of 60)."""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=30, help="trials per stream mode")
    p.add_argument("--case", default="norm-mat-vec-glu-rounds", help="a case of tests/gpu/test_cuda_fused.py")
    args = p.parse_args()
    import cupy as cp

    sys.path.insert(0, "tests/gpu")
    import test_cuda_fused as t

    from workbench.exec import cuda_ops
    from workbench.exec.kernels import LaunchHandle, module_cache
    from workbench.exec.reference_ops import NUMPY_OPS
    from workbench.strategy.fusion import PASSES
    from workbench.strategy.fusion_chains import FUSED_OPS

    fusion, build, _ = t.CASES[args.case]
    graph, _ = PASSES[fusion](build())
    node = next(n for n in graph.nodes if n.op in FUSED_OPS)
    cc = cp.cuda.Device().compute_capability
    for mode in ("non_blocking", "blocking", "non_blocking", "blocking"):
        bad = 0
        for _ in range(args.trials):
            space = t.DeviceSpace(graph, cp)
            t._fill(graph, space.mem)
            space.upload()
            call = cuda_ops.bind(node, space.addr, lambda key, n: 0)
            stream = cp.cuda.Stream(non_blocking=(mode == "non_blocking"))
            fn = module_cache((int(cc[0]), int(cc[1]))).function(call.source, call.name)
            LaunchHandle(call.name, fn, call.grid, call.block, stream.ptr, call.args, pdl=False)()
            stream.synchronize()
            NUMPY_OPS[node.op](node, space.mem)
            gpu = space.device_memory()
            out = node.outs[0]
            ref, got = space.mem.read(out).astype(np.float64), gpu.read(out).astype(np.float64)
            err = float(np.abs(got - ref).max() / np.abs(ref).max()) if np.isfinite(got).all() else float("inf")
            bad += not err <= t.TOL
            del space
        print(f"upload race: {mode:13s} {bad} bad of {args.trials}", flush=True)


if __name__ == "__main__":
    main()
