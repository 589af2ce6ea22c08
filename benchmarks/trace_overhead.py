"""What CUPTI tracing costs: traced vs untraced us/token of the cuda executor in one process
(issue 6 target: <= 5 % under graph replay).

    python benchmarks/trace_overhead.py [--model llama-3.2-1b] [--tokens 32] [--rounds 5] [--kinds-sweep] [--out FILE]

One executor per strategy, warmed up (kernels compiled, graph captured) before CUPTI is first
enabled in the process: a CUDA graph instantiated once CUPTI has been active stays instrumented
and keeps paying for it untraced. Then, per strategy, ``--rounds`` untraced runs of ``--tokens``
decode steps, ``--rounds`` traced runs, and ``--rounds`` untraced runs again (what remains
after a capture). A run's us/token is the mean host time of its steady tokens; the overhead is
median(traced) / median(untraced before) - 1. ``--kinds-sweep`` then times the ``graphs``
executor with one group of CUPTI activity kinds enabled at a time.
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


def measure(spec: ModelSpec, tokens: int, rounds: int, seed: int = 0) -> tuple[dict, dict]:
    from workbench.exec.calibrate import environment
    from workbench.exec.cuda import CudaExecutor, run_cuda
    from workbench.trace.cupti import cupti_available

    if not cupti_available():
        raise RuntimeError("trace_overhead measures CUPTI tracing: install cupti-python")
    cfg = spec.config()
    executors: dict[str, CudaExecutor] = {}
    first = None
    for label, st in STRATEGIES.items():  # every graph captured before CUPTI is enabled
        ex = executors[label] = CudaExecutor(cfg, st, "device", seed, share=first)
        first = first or ex
        run_cuda(cfg, st, 4, seed=seed, start_pos=spec.pos, executor=ex)

    def once(label: str, trace: bool) -> tuple[float, int]:
        r = run_cuda(cfg, STRATEGIES[label], tokens, seed=seed, start_pos=spec.pos, executor=executors[label],
                     trace=trace)
        return float(r.stats["us_per_token"]), len(r.trace)

    plain = {label: [once(label, False)[0] for _ in range(rounds)] for label in STRATEGIES}
    rows = []
    for label in STRATEGIES:
        traced = [once(label, True) for _ in range(rounds + 1)][1:]  # the first traced run initialises CUPTI
        after = [once(label, False)[0] for _ in range(rounds)]
        t_us = [u for u, _ in traced]
        over = 100 * (np.median(t_us) / np.median(plain[label]) - 1)
        rows.append({"strategy": label, "untraced_us": float(np.median(plain[label])),
                     "traced_us": float(np.median(t_us)), "overhead_pct": float(over),
                     "untraced_after_us": float(np.median(after)), "untraced_runs": plain[label],
                     "traced_runs": t_us, "untraced_after_runs": after, "events_per_traced_run": traced[-1][1]})
        print(f"{spec.label} {label:26s} untraced {np.median(plain[label]):8.1f}  traced {np.median(t_us):8.1f}"
              f"  untraced after {np.median(after):8.1f} us/token  overhead {over:+.2f}%  ({traced[-1][1]} events)",
              file=sys.stderr, flush=True)
    res = {"environment": environment(), "model": spec.to_dict(), "label": spec.label, "tokens": tokens,
           "rounds": rounds, "rows": rows, "date": time.strftime("%Y-%m-%d")}
    return res, executors


def kinds_sweep(spec: ModelSpec, ex, tokens: int, rounds: int, seed: int = 0) -> list[dict]:
    """Where the overhead under graph replay comes from: runs of the ``graphs`` executor (graph
    captured before CUPTI was enabled) with CUPTI recording one group of activity kinds at a time."""
    from workbench.exec.cuda import run_cuda
    from workbench.trace.cupti import CuptiCapture

    groups = {"none": (), "CONCURRENT_KERNEL": ("CONCURRENT_KERNEL",), "RUNTIME+DRIVER": ("RUNTIME", "DRIVER"),
              "MEMCPY": ("MEMCPY",), "MEMSET": ("MEMSET",), "SYNCHRONIZATION": ("SYNCHRONIZATION",),
              "all": CuptiCapture.KINDS, "KERNEL (serialized, for comparison)": ("KERNEL",)}
    cfg, st = spec.config(), STRATEGIES["graphs"]
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
        print(f"{spec.label} graphs, CUPTI kinds {name:36s} {np.median(us):8.1f} us/token", file=sys.stderr, flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path)
    p.add_argument("--kinds-sweep", action="store_true", help="also time graph replay with each group of CUPTI "
                                                              "activity kinds enabled alone")
    args = p.parse_args()
    spec = ModelSpec(args.model, args.layers)
    res, executors = measure(spec, args.tokens, args.rounds)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    if args.kinds_sweep:
        res["kinds_sweep"] = kinds_sweep(spec, executors["graphs"], args.tokens, args.rounds)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
