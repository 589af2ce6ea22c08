"""Which kernels PDL's launch signal slows, per kernel: CUPTI traces of the `cuda` backend under
CUDA graphs and every fusion (benchmarks/pdl_placement.py's Strategy), PDL off and with its signal
at `start`, `after-main-loop` and `end`; each kernel's step (its end after the previous kernel's
end on its stream: what it adds to the token, whether or not PDL started it early), median over
the traced tokens, per (model, node family, kernel). Untraced us/token of 3 runs beside it.
The measurement behind ``FamilyCost.early_ns`` / ``early_scale`` (data/bench/calibration_h200_s13.md).

    python3 benchmarks/pdl_early_launch.py --models llama-3.1-8b:8,llama-3.2-1b:8,gpt-oss-20b:6 \\
        --csv data/bench/pdl_early_launch_h200.csv      # GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pdl_placement import BASE  # noqa: E402

from workbench.trace import rebased  # noqa: E402

TRIGGERS = ("start", "after-main-loop", "end")


def steps(events: pd.DataFrame, first_token: int) -> pd.DataFrame:
    """Median step (us) per (node family, kernel) over the tokens from ``first_token``."""
    k = rebased(events)  # CUPTI's ~1.8e18 ns stamps would step in 256 ns once the shift makes them float
    k = k[(k["kind"] == "kernel") & (k["token"] >= first_token)].sort_values("start_ns")
    k = k.assign(step=(k["end_ns"] - k.groupby(["token", "stream"])["end_ns"].shift(1)) / 1e3,
                 fam=k["node"].str.replace(r"-\d+(_\w+)?$", "", regex=True))
    return k.groupby(["fam", "name"])["step"].median().reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.1-8b:8,llama-3.2-1b:8")
    ap.add_argument("--tokens", type=int, default=12, help="traced tokens (the first half is warm-up)")
    ap.add_argument("--csv", required=True)
    args = ap.parse_args(argv)
    import workbench
    from workbench.models import preset

    rows = []
    for spec in filter(None, args.models.split(",")):
        name, _, layers = spec.partition(":")
        cfg = preset(name, context=512, weight_dtype="f16", **({"layers": int(layers)} if layers else {}))
        workbench.run(cfg, BASE, tokens=4, start_pos=448, backend="cuda", quiet=True)  # compile, warm up
        for label, s in {"off": BASE, **{t: BASE.with_(pdl=True, pdl_trigger=t) for t in TRIGGERS}}.items():
            us = [workbench.run(cfg, s, tokens=64, start_pos=448, backend="cuda", quiet=True).stats["us_per_token"]
                  for _ in range(3)]
            tr = workbench.run(cfg, s, tokens=args.tokens, start_pos=448, backend="cuda", trace=True, quiet=True)
            st = steps(tr.trace.events, args.tokens // 2)
            rows.append(st.assign(model=spec, pdl=label, untraced_us_per_token=statistics.median(us)))
            print(f"{spec} pdl {label}: {statistics.median(us):.1f} us/token", flush=True)
    d = pd.concat(rows)
    t = d.pivot_table(index=["model", "fam", "name"], columns="pdl", values="step").reset_index()
    t = t[["model", "fam", "name", "off", *TRIGGERS]].sort_values(["model", "off"], ascending=[True, False])
    t.round(2).to_csv(args.csv, index=False)
    print(t[t["off"] >= 5].round(1).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
