"""Verify every valid knob combination (``workbench.verify.sweep.valid_strategies``) on every
family's tiny preset and on ``llama-3.2-1b``: each must be race-free (the
test suite runs a covering sample of the same space).

    python benchmarks/verify_sweep.py [--models ...] [--out data/bench/verify_sweep.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from workbench.models import TINY_PRESETS, build_graph, preset
from workbench.strategy.compile import compile_plan
from workbench.verify import verify
from workbench.verify.sweep import valid_strategies


def sweep(model: str) -> dict:
    graph = build_graph(preset(model))
    t0 = time.perf_counter()
    plans = racy = pairs = 0
    failures = []
    for strategy in valid_strategies():
        report = verify(compile_plan(graph, strategy))
        plans += 1
        pairs += report.checked_pairs
        if not report.race_free:
            racy += 1
            failures.append({"strategy": strategy.to_dict(), "races": len(report.races),
                             "first": report.races[0].text()})
    return {"model": model, "plans": plans, "race_free": plans - racy, "racy": racy,
            "checked_pairs": pairs, "seconds": round(time.perf_counter() - t0, 1), "failures": failures[:5]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=[*TINY_PRESETS, "llama-3.2-1b"])
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args()
    results = []
    for model in args.models:
        r = sweep(model)
        results.append(r)
        print(f"{model:16s} {r['plans']:5d} valid knob combinations, {r['race_free']:5d} race-free, "
              f"{r['racy']} with races, {r['checked_pairs']} conflicting pairs checked, {r['seconds']} s", flush=True)
        for f in r["failures"]:
            print("   ", f["first"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tokens": 2, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
