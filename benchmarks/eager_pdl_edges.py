"""Where eager PDL's gain comes from, kernel by kernel: for each kernel of the calibration
models, how much earlier it ends after its predecessor with ``eager+pdl`` than with ``eager``
(``(gap + duration)`` of ``eager`` minus that of ``eager+pdl``, medians over tokens), measured
(the CUPTI-traced calibration runs in a raw file of ``workbench calibrate --raw``) beside the
simulator's (same shapes, same Plans), grouped by the kernel's grid in waves of the GPU's
resident-thread slots. A flat simulated saving beside a measured one that falls with the grid
says the per-edge model, not a scalar, is what misses.

    python benchmarks/eager_pdl_edges.py data/bench/calibration_raw_h200.json.gz [--gpu h200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.exec.calibrate.raw import read_json
from workbench.exec.calibration import load_calibration
from workbench.exec.cost import kernel_cost
from workbench.exec.sim import simulate_steps
from workbench.models import load_config
from workbench.strategy import Strategy
from workbench.strategy.steps import plans_for_steps

STRATEGIES = {"eager": Strategy(), "eager+pdl": Strategy(pdl=True)}
WAVES = [0, 0.05, 0.25, 1, 2, 8, np.inf]


def _sim_increments(cfg, st: Strategy, cal, pos: int, tokens: int) -> pd.Series:
    """Per node: median of (start - previous kernel's end) + duration over the steady tokens."""
    ev = simulate_steps(cfg, st, tokens, cal, pos).events
    k = ev[(ev["kind"] == "kernel") & (ev["token"] >= 1)].sort_values("start_ns")
    inc = k["end_ns"] - k["end_ns"].shift(1)
    return inc[k["token"] == k["token"].shift(1)].groupby(k["node"]).median()


def edges(raw: dict, gpu: str) -> pd.DataFrame:
    cal = load_calibration(gpu)
    kt = pd.DataFrame(raw["kernels"])
    slots = cal.sm_count * cal.max_threads_per_sm
    out = []
    for model, g in kt[kt["strategy"].isin(list(STRATEGIES))].groupby("model"):
        r = g.iloc[0]
        layers = None if r["spec_layers"] != r["spec_layers"] else int(r["spec_layers"])
        cfg = load_config(r["spec_model"], layers=layers, context=int(r["spec_context"]))
        pos, tokens = int(r["spec_pos"]), int(r["n"]) + 1
        meas = {s: (x["gap_ns"] + x["duration_ns"]) for s, x in
                ((s, g[g["strategy"] == s].set_index("node")) for s in STRATEGIES)}
        sim = {s: _sim_increments(cfg, st, cal, pos, tokens) for s, st in STRATEGIES.items()}
        plan = plans_for_steps(cfg, STRATEGIES["eager+pdl"], 1, pos, cal.compute_capability)[0]
        waves = {la.node.name: (lambda c: c.blocks * c.threads / slots)(kernel_cost(la.node, cal))
                 for la in plan.launches}
        d = pd.DataFrame({"measured_ns": meas["eager"] - meas["eager+pdl"],
                          "simulated_ns": sim["eager"] - sim["eager+pdl"]}).dropna()
        d["waves"] = d.index.map(waves)
        d["model"] = model
        out.append(d)
    return pd.concat(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path)
    p.add_argument("--gpu", default="h200")
    a = p.parse_args()
    d = edges(read_json(a.raw), a.gpu)
    d["grid (waves)"] = pd.cut(d["waves"], WAVES)
    by = d.groupby("grid (waves)", observed=True).agg(kernels=("measured_ns", "size"),
                                                      measured_ns=("measured_ns", "median"),
                                                      simulated_ns=("simulated_ns", "median"))
    tot = d.groupby("model")[["measured_ns", "simulated_ns"]].sum().div(1e3).rename(
        columns=lambda c: c.replace("_ns", "_us_per_token"))
    print("Median per-kernel saving of eager+pdl over eager (ns), by grid size:\n")
    print(by.round(0).to_string())
    print("\nSum over a token's kernels (us):\n")
    print(tot.round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
