"""Registers, static shared memory and resident blocks per SM of every kernel the ``cuda`` executor
binds for a decode step (graphs + PDL, full-width shapes, 2 layers), and the share of one resident
wave each grid fills: whether a kernel's blocks all fit at once, beside its predecessor's, is what
PDL's early launch depends on (data/bench/pdl_early_grids_h200_s32.md).

    python3 benchmarks/kernel_occupancy.py --csv $OUT/occupancy.csv    # GPU (about 15 s on an H200)
"""

from __future__ import annotations

import argparse
import csv
from math import prod
from pathlib import Path

MODELS = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-8b", "gpt-oss-20b", "qwen3-30b-a3b")


def resident_blocks(function, threads: int) -> int:
    """Blocks of ``function`` (a CuPy kernel) of ``threads`` threads an SM holds at once: the
    driver's occupancy calculator (registers, shared memory, the carveout the executor set)."""
    from cuda.bindings import driver as cu

    err, n = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(cu.CUfunction(function.kernel.ptr), threads, 0)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: {err}")
    return int(n)


def measure(models: tuple[str, ...]) -> list[dict]:
    from workbench.exec.cuda import CudaExecutor
    from workbench.models import load_config
    from workbench.strategy import Strategy

    rows = []
    for model in models:
        cfg = load_config(model, layers=2, context=512)
        ex = CudaExecutor(cfg, Strategy(graphs=True, pdl=True), "device", 0)
        try:
            b = ex.bound(cfg.kv_len(448))
            sms = ex.cp.cuda.Device().attributes["MultiProcessorCount"]
            for la, call in zip(b.plan.launches, b.calls):
                fn = ex.modules.function(call.source, call.name, *ex._placement(la))
                regs, smem, threads = int(fn.num_regs), int(fn.attributes["shared_size_bytes"]), int(prod(call.block))
                bps = resident_blocks(fn, threads)
                rows.append({"model": model, "node": la.node.name, "op": la.node.op, "kernel": call.name,
                             "blocks": int(prod(call.grid)), "threads": threads, "regs": regs, "smem": smem,
                             "blocks_per_sm": bps, "waves": round(prod(call.grid) / (bps * sms), 3)})
        finally:
            ex.release()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", type=Path, required=True)
    p.add_argument("--models", default=",".join(MODELS))
    a = p.parse_args()
    rows = measure(tuple(a.models.split(",")))
    with a.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
