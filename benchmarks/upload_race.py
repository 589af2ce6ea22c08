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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=30, help="trials per stream mode")
    p.add_argument("--case", default="norm-mat-vec-glu-rounds", help="a case of tests/gpu/test_cuda_fused.py")
    args = p.parse_args()
    sys.path.insert(0, "tests/gpu")
    import test_cuda_fused as t

    for mode in ("non_blocking", "blocking", "non_blocking", "blocking"):
        bad = 0
        for _ in range(args.trials):
            node, _, ref, gpu = t.launch_case(args.case, non_blocking=mode == "non_blocking")
            bad += not all(t.out_err(ref, gpu, out) <= t.TOL for out in node.outs)
        print(f"upload race: {mode:13s} {bad} bad of {args.trials}", flush=True)


if __name__ == "__main__":
    main()
