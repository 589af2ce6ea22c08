"""How fast the simulator is: 1000 tokens of ``llama-3.1-8b`` with every knob on (target:
<= 5 s on one core of the CI machine, peak memory <= 1 GB), stage by stage.

    python benchmarks/sim_speed.py [--model llama-3.1-8b] [--tokens 1000] [--gpu h100] [--no-memo]

"Every knob on": implicit sync, CUDA graphs, PDL, qkv streams, every fusion, stream-aware
allocation. The process pins itself to one CPU and its numeric libraries to one thread. Time is
the whole sim backend run (building and compiling the Plans for each KV length, simulating, building
the trace table, the statistics); memory is the process's peak resident set. It prints the
simulated events per second (rows of the trace: API calls, kernels, copies) and exits 1 if a
limit is exceeded.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

LIMIT_S = 5.0
LIMIT_BYTES = 1 << 30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--gpu", default="h100")
    p.add_argument("--no-memo", action="store_true", help="simulate every replay in full (slow; for comparison)")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    from workbench.exec.calibration import load_calibration
    from workbench.exec.sim import simulate
    from workbench.models import preset
    from workbench.strategy import ALL_ON
    from workbench.strategy.steps import plans_for_steps
    from workbench.trace.stats import summarize

    cal = load_calibration(args.gpu)
    context = max(512, -(-args.tokens // 256) * 256)
    cfg = preset(args.model, context=context)
    t0 = time.perf_counter()
    plans = plans_for_steps(cfg, ALL_ON, args.tokens, 0, cal.compute_capability)
    t1 = time.perf_counter()
    trace = simulate(plans, cal, memo=not args.no_memo)
    t2 = time.perf_counter()
    stats = summarize(trace)
    t3 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    total = t3 - t0
    events = len(trace)
    out = {
        "model": args.model, "tokens": args.tokens, "context": context, "strategy": ALL_ON.label(), "gpu": args.gpu,
        "memo": not args.no_memo, "distinct_plans": len({id(p) for p in plans}),
        "compile_s": round(t1 - t0, 3), "simulate_s": round(t2 - t1, 3), "stats_s": round(t3 - t2, 3),
        "total_s": round(total, 3), "events": events, "device_heap_events": trace.meta["device_events"],
        "events_per_s": round(events / (t2 - t1)), "events_per_s_total": round(events / total),
        "peak_rss_MiB": round(peak / 2**20, 1), "simulated_us_per_token": round(stats["us_per_token"], 1),
        "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
    }
    print(json.dumps(out, indent=1))
    ok = total <= LIMIT_S and peak <= LIMIT_BYTES
    print(f"{events} events in {total:.2f} s total ({out['events_per_s']:,} simulated events/s in the simulator), "
          f"peak memory {out['peak_rss_MiB']} MiB: {'OK' if ok else 'OVER LIMIT'} "
          f"(limits {LIMIT_S} s, {LIMIT_BYTES >> 20} MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
