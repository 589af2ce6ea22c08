"""The CUPTI gap between a graph replay's kernels against a model's depth (GPU): llama-3.1-8b under
CUDA graphs at 2 to 32 layers, untraced us/token first, then one CUPTI trace each.

Why: `workbench calibrate` reads its kernel-to-kernel gap (``dependency_gap_ns``) off CUPTI traces
of models cut to 2-4 layers, where it is 256 ns. At full size the same traces give 416 ns
(`data/bench/calibration_h200_s37_fullsize.md`). This sweep finds the depth where the gap
changes and sets it beside the untraced time, whose slope per layer would show a real change.
`benchmarks/graph_step_probe.py` rules out the node count alone.

Usage (GPU)::

    python benchmarks/cupti_gap_by_layers.py --out data/bench/cupti_gap_by_layers_8b_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import workbench  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402

MODEL, CONTEXT, POS = "llama-3.1-8b", 1024, 600


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", default="2,4,8,12,16,24,32")
    p.add_argument("--tokens", type=int, default=48, help="untraced tokens a run (3 runs a depth)")
    args = p.parse_args()
    depths = [int(x) for x in args.layers.split(",")]
    st = Strategy(graphs=True)
    res: dict[int, dict] = {}
    for L in depths:  # untraced first: CUPTI, once enabled, stays attached to the process
        us = [workbench.run(MODEL, st, tokens=args.tokens, backend="cuda", layers=L, context=CONTEXT,
                            start_pos=POS, quiet=True) for _ in range(3)]
        res[L] = {"untraced_us": float(np.median([r.stats["us_per_token"] for r in us])),
                  "runs": [r.stats["us_per_token"] for r in us], "kernels": us[-1].stats["kernels_per_token"]}
        print(L, res[L], flush=True)
    for L in depths:
        r = workbench.run(MODEL, st, tokens=8, backend="cuda", layers=L, context=CONTEXT, start_pos=POS, quiet=True,
                          trace=True)
        ev = r.trace.events
        k = ev[(ev.kind == "kernel") & (ev.token == ev.token.max())].sort_values("start_ns")
        gap = k.start_ns.values[1:] - k.end_ns.values[:-1]
        res[L].update(traced_us=r.stats["us_per_token"], gap_median=float(np.median(gap)),
                      gap_mean=float(np.mean(gap)), span_us=float((k.end_ns.max() - k.start_ns.min()) / 1e3),
                      dur_sum_us=float((k.end_ns - k.start_ns).sum() / 1e3))
        print(L, res[L], flush=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
