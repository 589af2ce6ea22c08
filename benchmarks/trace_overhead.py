"""What CUPTI tracing costs: traced vs untraced us/token of the cuda executor in one process
(issue 6 target: <= 5 % under graph replay).

    python benchmarks/trace_overhead.py [--model llama-3.2-1b] [--tokens 32] [--rounds 6] [--out FILE]

One executor per strategy; after a warm-up of each kind, untraced and traced runs of
``--tokens`` decode steps alternate for ``--rounds`` rounds (so drift hits both alike). A run's
us/token is the mean host time of its steady tokens; the overhead is
median(traced) / median(untraced) - 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from workbench.exec.calibrate import ModelSpec
from workbench.strategy import Strategy

STRATEGIES = {
    "graphs": Strategy(graphs=True),
    "graphs+pdl+qkv+implicit": Strategy(graphs=True, pdl=True, streams="qkv", sync="implicit"),
    "eager": Strategy(),
}


def measure(spec: ModelSpec, tokens: int, rounds: int, seed: int = 0) -> dict:
    from workbench.exec.calibrate import environment
    from workbench.exec.cuda import CudaExecutor, run_cuda
    from workbench.trace.cupti import cupti_available

    if not cupti_available():
        raise RuntimeError("trace_overhead measures CUPTI tracing: install cupti-python")
    cfg = spec.config()
    rows = []
    first = None
    for label, st in STRATEGIES.items():
        ex = CudaExecutor(cfg, st, "device", seed, share=first)
        first = first or ex

        def once(trace: bool, st: Strategy = st, ex: CudaExecutor = ex) -> tuple[float, int]:
            r = run_cuda(cfg, st, tokens, seed=seed, start_pos=spec.pos, executor=ex, trace=trace)
            return float(r.stats["us_per_token"]), len(r.trace)

        once(False)
        once(True)
        plain, traced, events = [], [], 0
        for _ in range(rounds):
            plain.append(once(False)[0])
            us, events = once(True)
            traced.append(us)
        over = 100 * (np.median(traced) / np.median(plain) - 1)
        rows.append({"strategy": label, "untraced_us": float(np.median(plain)), "traced_us": float(np.median(traced)),
                     "overhead_pct": float(over), "untraced_runs": plain, "traced_runs": traced,
                     "events_per_traced_run": events})
        print(f"{spec.label} {label:26s} untraced {np.median(plain):8.1f}  traced {np.median(traced):8.1f} us/token"
              f"  overhead {over:+.2f}%  ({events} events per run)", file=sys.stderr, flush=True)
    return {"environment": environment(), "model": spec.to_dict(), "label": spec.label, "tokens": tokens,
            "rounds": rounds, "rows": rows, "date": time.strftime("%Y-%m-%d")}


def kinds_sweep(spec: ModelSpec, tokens: int, rounds: int, seed: int = 0) -> list[dict]:
    """Where the overhead under graph replay comes from: the same untraced runs of ``graphs``
    with CUPTI recording one group of activity kinds at a time."""
    from workbench.exec.cuda import CudaExecutor, run_cuda
    from workbench.trace.cupti import CuptiCapture

    groups = {"none": (), "CONCURRENT_KERNEL": ("CONCURRENT_KERNEL",), "RUNTIME+DRIVER": ("RUNTIME", "DRIVER"),
              "MEMCPY+MEMSET+SYNC": ("MEMCPY", "MEMSET", "SYNCHRONIZATION"), "all": CuptiCapture.KINDS,
              "KERNEL (serialized, for comparison)": ("KERNEL",)}
    cfg, st = spec.config(), STRATEGIES["graphs"]
    ex = CudaExecutor(cfg, st, "device", seed)
    run_cuda(cfg, st, 4, seed=seed, start_pos=spec.pos, executor=ex)
    out = []
    for name, kinds in groups.items():
        us = []
        for _ in range(rounds):
            cap = CuptiCapture(kinds=kinds).start() if kinds else None
            run = run_cuda(cfg, st, tokens, seed=seed, start_pos=spec.pos, executor=ex)
            us.append(float(run.stats["us_per_token"]))
            if cap is not None:
                cap.stop()
        out.append({"kinds": name, "us_per_token": float(np.median(us)), "runs": us})
        print(f"{spec.label} graphs, CUPTI kinds {name:20s} {np.median(us):8.1f} us/token", file=sys.stderr, flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out", type=Path)
    p.add_argument("--kinds-sweep", action="store_true", help="also time graph replay with each group of CUPTI "
                                                              "activity kinds enabled alone")
    args = p.parse_args()
    res = measure(ModelSpec(args.model, args.layers), args.tokens, args.rounds)
    if args.kinds_sweep:
        res["kinds_sweep"] = kinds_sweep(ModelSpec(args.model, args.layers), args.tokens, args.rounds)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
