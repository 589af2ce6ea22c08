"""How close the simulator comes to the memory floor: for every full-size preset (``--layers``
of them) and both shipped GPUs, the strategies most likely to shrink a step (every overlap knob,
the racy late PDL wait included) and the best safe one; prints the floor (bytes / calibrated
bandwidth) and the fraction of it each run reaches (must stay <= 1.0, issue 20).

    python benchmarks/floor_sweep.py [--layers 8] [--tokens 3]
"""

from __future__ import annotations

import argparse
import warnings

import workbench
from workbench.exec.calibration import load_calibration
from workbench.models import load_config
from workbench.models.presets import PRESETS, TINY_PRESETS
from workbench.strategy import Strategy
from workbench.strategy.strategy import FUSIONS

STRATEGIES = {
    "graphs+pdl(late,start)": Strategy(graphs=True, pdl=True, pdl_wait="late", pdl_trigger="start"),
    "all on, late wait": Strategy(graphs=True, pdl=True, pdl_wait="late", pdl_trigger="start", streams="auto",
                                  sync="implicit", fusion=frozenset(FUSIONS), allocator="stream-aware"),
    "eager+pdl(late,start)+qkv": Strategy(pdl=True, pdl_wait="late", pdl_trigger="start", streams="qkv"),
    "all on (safe)": Strategy(graphs=True, pdl=True, streams="auto", sync="implicit", fusion=frozenset(FUSIONS),
                              allocator="stream-aware"),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tokens", type=int, default=3)
    a = p.parse_args()
    worst = 0.0
    print(f"{'model':22s} {'gpu':5s} {'strategy':28s} {'us/token':>9s} {'floor':>8s} fraction")
    for model in [m for m in PRESETS if m not in TINY_PRESETS]:
        cfg = load_config(model, layers=a.layers)
        for gpu in ("h100", "h200"):
            cal = load_calibration(gpu)
            for label, st in STRATEGIES.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the late wait is a deliberate race
                    s = workbench.run(cfg, st, tokens=a.tokens, backend="sim", calibration=cal).stats
                worst = max(worst, s["floor_fraction"])
                print(f"{model:22s} {gpu:5s} {label:28s} {s['us_per_token']:9.1f} {s['floor_us_per_token']:8.1f} "
                      f"{s['floor_fraction']:.3f}")
    print(f"largest fraction of the floor: {worst:.3f} ({'OK' if worst <= 1.0 else 'FASTER THAN PHYSICS'})")
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
