"""What CUPTI tracing costs: traced vs untraced us/token of the cuda executor, per tracing mode
(target: <= 5 % under graph replay).

    python benchmarks/trace_overhead.py [--model llama-3.2-1b] [--tokens 32] [--rounds 5]
        [--modes node,graph,...|all] [--kinds-sweep] [--out FILE]

Each tracing mode runs in its own process: once CUPTI has been enabled in a process, graph
launches stay slower even untraced, so modes measured one after another in one process would
contaminate each other's baselines. In a mode's process one executor per strategy is warmed up
(kernels compiled, graph captured) before CUPTI is first enabled; then, per strategy,
``--rounds`` untraced runs of ``--tokens`` decode steps, ``--rounds`` traced runs (after one
discarded traced run that initialises CUPTI) and ``--rounds`` untraced runs again. A run's
us/token is the mean host time of its steady tokens; the overhead is median(traced) /
median(untraced before) - 1, so both sides are measured side by side in one process.

Modes (``MODES``): ``node`` records every kernel, copy and memset of each graph replay (CUPTI
CONCURRENT_KERNEL, MEMCPY, MEMSET plus RUNTIME, DRIVER, SYNCHRONIZATION); ``graph`` records one
GRAPH_TRACE span per graph launch instead of the kernels (Nsight Systems'
``--cuda-graph-trace=graph``); ``graph+node-window`` is ``graph`` with node detail for the last
2 of the 32 tokens (what ``workbench run --trace`` does by default), reported inside and
outside the window too; ``node+recapture`` traces graphs instantiated while CUPTI records.
Tried and dropped (first calls of 2026-11-21 on an H200): CUPTI's buffer pre-allocation
attributes (``cuptiActivitySetAttribute`` answers ERROR_NOT_SUPPORTED), GRAPH_TRACE kept on in
node tokens (no kernel records then), and ``cuptiFinalize`` after each capture (restores
untraced speed, but re-attaching costs +25 % and a later graph-level capture hits illegal
addresses).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.exec.calibrate.specs import ModelSpec
from workbench.strategy import Strategy

STRATEGIES = {
    "graphs": Strategy(graphs=True),
    "graphs+pdl+qkv+implicit": Strategy(graphs=True, pdl=True, streams="qkv", sync="implicit"),
    "eager": Strategy(),
}

WINDOW = range(30, 32)  # node-detail tokens of the windowed mode (the last 2 of the default 32)

#: mode -> options: graph_trace / node_tokens (CuptiCapture), recapture (graphs instantiated again
#: while a capture is active, then traced)
MODES: dict[str, dict[str, Any]] = {
    "node": {},
    "graph": {"graph_trace": "graph"},
    "graph+node-window": {"graph_trace": "graph", "node_tokens": list(WINDOW)},
    "node+recapture": {"recapture": True},
}


def _trace_summary(trace: Any) -> dict[str, Any]:
    ev = trace.events
    kinds = {str(k): int(n) for k, n in ev["kind"].value_counts().items()}
    k = ev[ev["kind"] == "kernel"]
    return {"events": len(ev), "kinds": kinds, "kernels_with_node": int((k["node"] != "").sum()),
            "kernel_tokens": sorted(int(t) for t in k["token"].unique() if t >= 0),
            "graph_tokens": sorted(int(t) for t in ev.loc[ev["kind"] == "graph", "token"].unique() if t >= 0)}


def measure_mode(spec: ModelSpec, mode: str, tokens: int, rounds: int, strategies: list[str],
                 seed: int = 0) -> dict[str, Any]:
    """Traced vs untraced us/token of each strategy under one tracing mode (one process)."""
    import workbench
    from workbench.exec.cuda import CudaExecutor
    from workbench.trace.cupti import CuptiCapture, cupti_available

    if not cupti_available():
        raise RuntimeError("trace_overhead measures CUPTI tracing: install cupti-python")
    opts = MODES[mode]
    window = opts.get("node_tokens", ())
    if window and list(window) != list(range(tokens - len(window), tokens)):
        raise ValueError(f"mode {mode}: node tokens {window} must be the last {len(window)} of {tokens}")
    node_tokens = None if opts.get("graph_trace", "node") == "node" else len(window)
    cfg = spec.config()
    executors: dict[str, CudaExecutor] = {}
    first = None
    for label in strategies:  # every graph captured before CUPTI is enabled
        ex = executors[label] = CudaExecutor(cfg, STRATEGIES[label], "device", seed, share=first)
        first = first or ex
        workbench.run(cfg, STRATEGIES[label], tokens=4, backend="cuda", seed=seed, start_pos=spec.pos, executor=ex)
    notes: list[str] = []

    def once(label: str, ex: CudaExecutor, trace: bool) -> tuple[float, list[float], Any]:
        r = workbench.run(cfg, STRATEGIES[label], tokens=tokens, backend="cuda", seed=seed, start_pos=spec.pos,
                          executor=ex, trace=trace, node_tokens=node_tokens)
        return float(r.stats["us_per_token"]), list(r.meta["token_us"]), r.trace

    plain = {label: [once(label, executors[label], False)[0] for _ in range(rounds)] for label in strategies}
    traced_ex = dict(executors)
    if opts.get("recapture"):  # graphs instantiated while CUPTI records
        cap = CuptiCapture().start()
        for label in strategies:
            ex = traced_ex[label] = CudaExecutor(cfg, STRATEGIES[label], "device", seed, share=first)
            workbench.run(cfg, STRATEGIES[label], tokens=4, backend="cuda", seed=seed, start_pos=spec.pos, executor=ex)
        cap.stop()
        notes.append("traced executors built and captured while a CUPTI capture was active")
    rows = []
    for label in strategies:
        runs = [once(label, traced_ex[label], True) for _ in range(rounds + 1)][1:]
        after = [once(label, traced_ex[label], False)[0] for _ in range(rounds)]
        t_us = [u for u, _, _ in runs]
        base = float(np.median(plain[label]))
        row = {"strategy": label, "untraced_us": base, "traced_us": float(np.median(t_us)),
               "overhead_pct": float(100 * (np.median(t_us) / base - 1)),
               "untraced_after_us": float(np.median(after)), "untraced_runs": plain[label], "traced_runs": t_us,
               "untraced_after_runs": after, "trace": _trace_summary(runs[-1][2])}
        window = opts.get("node_tokens")
        if window:  # per-token cost inside and outside the node-detail window
            tok = np.array([u for _, us, _ in runs for u in us[1:]])
            idx = np.array([i for _, us, _ in runs for i in range(1, len(us))])
            inside = np.isin(idx, window)
            row["node_window_us"] = float(np.median(tok[inside]))
            row["graph_tokens_us"] = float(np.median(tok[~inside]))
            row["node_window_overhead_pct"] = float(100 * (row["node_window_us"] / base - 1))
            row["graph_tokens_overhead_pct"] = float(100 * (row["graph_tokens_us"] / base - 1))
        rows.append(row)
        print(f"[{mode}] {spec.label} {label:26s} untraced {base:8.1f}  traced {np.median(t_us):8.1f}"
              f"  after {np.median(after):8.1f} us/token  overhead {row['overhead_pct']:+.2f}%"
              + (f"  (window {row['node_window_overhead_pct']:+.1f}%, rest {row['graph_tokens_overhead_pct']:+.1f}%)"
                 if window else "") + f"  {row['trace']['kinds']}", file=sys.stderr, flush=True)
    return {"mode": mode, "options": opts, "notes": notes, "rows": rows}


def kinds_sweep(spec: ModelSpec, tokens: int, rounds: int, seed: int = 0) -> list[dict]:
    """Where the overhead under graph replay comes from: runs of the ``graphs`` executor (graph
    captured before CUPTI was enabled) with CUPTI recording one group of activity kinds at a time
    (not GRAPH_TRACE: it crashes on a graph captured before it was enabled, see the ``graph`` mode)."""
    import workbench
    from workbench.exec.cuda import CudaExecutor
    from workbench.trace.cupti import CuptiCapture

    groups = {"none": (), "CONCURRENT_KERNEL": ("CONCURRENT_KERNEL",), "RUNTIME+DRIVER": ("RUNTIME", "DRIVER"),
              "MEMCPY": ("MEMCPY",), "MEMSET": ("MEMSET",), "SYNCHRONIZATION": ("SYNCHRONIZATION",),
              "all": CuptiCapture.KINDS,
              "KERNEL (serialized, for comparison)": ("KERNEL",)}
    cfg, st = spec.config(), STRATEGIES["graphs"]
    ex = CudaExecutor(cfg, st, "device", seed)
    workbench.run(cfg, st, tokens=4, backend="cuda", seed=seed, start_pos=spec.pos, executor=ex)
    out = []
    for name, kinds in groups.items():
        us = []
        for _ in range(rounds):
            cap = CuptiCapture(kinds=kinds).start() if kinds else None
            run = workbench.run(cfg, st, tokens=tokens, backend="cuda", seed=seed, start_pos=spec.pos, executor=ex)
            us.append(float(run.stats["us_per_token"]))
            if cap is not None:
                cap.stop()
        out.append({"kinds": name, "us_per_token": float(np.median(us)), "runs": us})
        print(f"{spec.label} graphs, CUPTI kinds {name:36s} {np.median(us):8.1f} us/token", file=sys.stderr, flush=True)
    return out


def _child(args: argparse.Namespace, flags: list[str], label: str) -> dict[str, Any]:
    """Run this script with ``flags`` (a mode or the sweep) in a fresh process (see the module
    docstring) and read its JSON back."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, __file__, "--model", args.model, "--tokens", str(args.tokens), "--rounds",
               str(args.rounds), *flags, "--out", str(out)]
        if args.layers:
            cmd += ["--layers", str(args.layers)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, text=True)
        if proc.returncode != 0 or not out.exists():
            return {"mode": label, "error": f"exit {proc.returncode}", "seconds": time.perf_counter() - t0}
        res = json.loads(out.read_text())
        res["seconds"] = time.perf_counter() - t0
        return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--layers", type=int)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--modes", default="all", help=f"comma-separated, or all: {', '.join(MODES)}")
    p.add_argument("--strategies", default="graphs,graphs+pdl+qkv+implicit",
                   help=f"comma-separated: {', '.join(STRATEGIES)}")
    p.add_argument("--out", type=Path)
    p.add_argument("--kinds-sweep", action="store_true", help="also time graph replay with each group of CUPTI "
                                                              "activity kinds enabled alone (own process)")
    p.add_argument("--_mode", help=argparse.SUPPRESS)
    p.add_argument("--_sweep", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    spec = ModelSpec(args.model, args.layers)
    strategies = [s for s in args.strategies.split(",") if s]
    if args._mode or args._sweep:  # child process
        res = (measure_mode(spec, args._mode, args.tokens, args.rounds, strategies) if args._mode
               else {"kinds_sweep": kinds_sweep(spec, args.tokens, args.rounds)})
        args.out.write_text(json.dumps(res, indent=1))
        return 0
    from workbench.exec.calibrate.environment import environment

    modes = list(MODES) if args.modes == "all" else [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        p.error(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    res: dict[str, Any] = {"environment": environment(), "model": spec.to_dict(), "label": spec.label,
                           "tokens": args.tokens, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d"),
                           "modes": []}
    for mode in modes:
        res["modes"].append(_child(args, ["--strategies", ",".join(strategies), "--_mode", mode], mode))
        if args.out:
            args.out.write_text(json.dumps(res, indent=1))
    if args.kinds_sweep:
        sweep = _child(args, ["--_sweep"], "kinds sweep")
        res["kinds_sweep"] = sweep.get("kinds_sweep", sweep)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
