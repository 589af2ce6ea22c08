"""Footprint of each allocator for every preset, beside the verifier's verdict:
``stream-aware`` must make ``qkv`` and ``auto`` streams race-free while still reusing memory.

    python benchmarks/allocator_footprints.py [--out data/bench/allocator_footprints]

For each preset (default context 512) and each streams x allocator combination (CUDA graphs
on, no fusions), the scratch arena the Plan allocates, the persistent bytes (weights, KV and
recurrent caches, inputs, logits), the arena relative to ``no-reuse``, and the number of races
the 2-token analysis reports. Writes ``<out>.csv`` and ``<out>.json``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import itertools
import json
import subprocess
from pathlib import Path

from workbench.models import PRESETS, build_graph, preset
from workbench.strategy import ALLOCATORS, STREAM_MODES, Strategy
from workbench.strategy.compile import compile_plan
from workbench.verify import verify


def rows(model: str, context: int | None) -> list[dict]:
    graph = build_graph(preset(model, context=context))
    out = []
    for streams, allocator in itertools.product(STREAM_MODES, ALLOCATORS):
        plan = compile_plan(graph, Strategy(graphs=True, streams=streams, allocator=allocator))
        report = verify(plan)
        out.append({"model": model, "streams": streams, "allocator": allocator,
                    "arena_bytes": plan.allocation.arena_bytes, "persistent_bytes": plan.allocation.persistent_bytes,
                    "scratch_buffers": len(plan.allocation.offsets), "races": len(report.races)})
    base = {r["streams"]: r["arena_bytes"] for r in out if r["allocator"] == "no-reuse"}
    for r in out:
        r["arena_vs_no_reuse"] = round(r["arena_bytes"] / base[r["streams"]], 4) if base[r["streams"]] else 1.0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(PRESETS))
    p.add_argument("--context", type=int, help="KV cache length (default: the preset's 512)")
    p.add_argument("--out", type=Path, help="write <out>.csv and <out>.json")
    args = p.parse_args()
    table = []
    print(f"{'model':20s} {'streams':7s} {'allocator':13s} {'arena KiB':>10s} {'vs no-reuse':>11s} "
          f"{'persistent MiB':>14s} {'races':>6s}")
    for model in args.models:
        for r in rows(model, args.context):
            table.append(r)
            print(f"{model:20s} {r['streams']:7s} {r['allocator']:13s} {r['arena_bytes'] / 1024:10.1f} "
                  f"{r['arena_vs_no_reuse']:11.3f} {r['persistent_bytes'] / 2**20:14.1f} {r['races']:6d}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out.with_suffix(".csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        meta = {"date": datetime.date.today().isoformat(), "commit": commit,
                "context": args.context or 512, "graphs": True, "fusion": [], "tokens_verified": 2,
                "arena_bytes": "scratch arena of the Plan (Allocation.arena_bytes)",
                "persistent_bytes": "weights, caches, inputs and outputs (Allocation.persistent_bytes)",
                "races": "races reported by workbench.verify over 2 tokens", "rows": table}
        args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
