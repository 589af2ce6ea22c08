"""Warps per row (pair) of the fused mat-vecs (kernels/fused_mat_vec.cu): the kernel_bench run of
the norm-mat-vec / qkv-rope-store / mul-mat-glu kernels with ``cuda_ops.fused_splits`` and
``cuda_ops.qkv_splits`` forced to 1, 2 and 4 warps, after the default, on the given models.
Each kernel alone; results in ``data/bench/fused_splits_h200.md``. The rules in
``workbench.exec.cuda_ops`` are picked in whole decode steps (``benchmarks/grid_ab.py``), where
PDL changes the answer.
Usage (GPU): ``python3 benchmarks/fused_splits.py [--models llama-3.1-8b,llama-3.2-1b]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_bench  # noqa: E402

from workbench.exec import cuda_ops  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.1-8b,llama-3.2-1b")
    ap.add_argument("--samples", default="5")
    args = ap.parse_args(argv)
    rules = cuda_ops.fused_splits, cuda_ops.qkv_splits
    rc = 0
    try:
        for forced in ("default", 1, 2, 4):
            if forced != "default":
                cuda_ops.fused_splits = cuda_ops.qkv_splits = lambda items, nvec, f=forced: f
            print(f"=== splits {forced}", flush=True)
            rc |= kernel_bench.main(["--models", args.models, "--samples", args.samples,
                                     "--fusions", "norm-mat-vec,qkv-rope-store,mul-mat-glu"])
    finally:
        cuda_ops.fused_splits, cuda_ops.qkv_splits = rules
    return rc


if __name__ == "__main__":
    sys.exit(main())
