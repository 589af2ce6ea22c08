"""Simulator vs GPU: predicted and measured us/token for a matrix of (model, strategy), and each
knob's predicted vs measured speedup; the held-out model families (never seen by
``workbench calibrate``) are reported apart.

    # on the GPU: measure (untraced runs of the cuda executor), write JSON lines
    python benchmarks/sim_fidelity.py measure --out fidelity_measured.jsonl
    # anywhere: simulate the same matrix with a calibration and write the report to data/bench/
    python benchmarks/sim_fidelity.py report fidelity_measured.jsonl [--calibration data/calibration/h100.json]

The GPU stage ``fidelity`` of ``benchmarks/gpu_fidelity_run.sh`` measures this matrix and the
eager knob cells in one run (``benchmarks/decode_matrix.py``); ``report`` reads that file too
(cells of strategies outside this matrix are left out), and the older JSON of ``measure``.

Measured (``workbench.exec.calibrate.decode_matrix``): the cuda executor at full size (qwen3-next,
qwen3-30b-a3b and gpt-oss-20b: 8 layers), weights drawn on the GPU, one warmed-up executor per
strategy, ``--repeats`` interleaved rounds of ``--tokens`` decode steps; a run's us/token is the
mean host time of its steady tokens (all but the first), the cell's value the median over runs
(spread: min-max). Predicted: the
simulator on the same Plans, start position and token count. A knob's speedup is
``t(without) / t(with) - 1``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.exec.calibrate.specs import ModelSpec
from workbench.strategy import Strategy

ROOT = Path(__file__).resolve().parents[1]

#: (spec, family (HF model_type), held out from calibration?): full size, or 8 layers where the
#: whole model would not fit the stage's time (``workbench calibrate`` measured llama, qwen3_moe
#: and qwen3_next shapes; qwen3 dense and gpt-oss never)
MODELS: tuple[tuple[ModelSpec, str, bool], ...] = (
    (ModelSpec("llama-3.2-1b", None, 512, 448), "llama", False),
    (ModelSpec("qwen3-next-80b-a3b", 8, 512, 448), "qwen3_next", False),
    (ModelSpec("llama-3.1-8b", None, 1024, 600), "llama", False),
    (ModelSpec("qwen3-8b", None, 512, 448), "qwen3", True),
    (ModelSpec("qwen3-30b-a3b", 8, 512, 448), "qwen3_moe", False),
    (ModelSpec("gpt-oss-20b", 8, 512, 448), "gpt_oss", True),
)

STRATEGIES: dict[str, Strategy] = {
    "eager": Strategy(),
    "eager+implicit": Strategy(sync="implicit"),
    "graphs": Strategy(graphs=True),
    "graphs+boundary": Strategy(graphs=True, sync="boundary"),
    "graphs+implicit": Strategy(graphs=True, sync="implicit"),
    "graphs+pdl": Strategy(graphs=True, pdl=True),
    "graphs+qkv": Strategy(graphs=True, streams="qkv"),
    "graphs+pdl+qkv+implicit": Strategy(graphs=True, pdl=True, streams="qkv", sync="implicit"),
    "graphs+implicit+copy-elim": Strategy(graphs=True, sync="implicit", fusion=frozenset({"copy-elim"})),
}
#: models where a strategy changes nothing measurable are skipped (copy-elim only rewrites the
#: GDN state copies of qwen3-next)
ONLY = {"graphs+implicit+copy-elim": {"qwen3-next-80b-a3b"}}

#: knob -> (strategy without, strategy with)
KNOBS: dict[str, tuple[str, str]] = {
    "graphs": ("eager", "graphs"),
    "sync implicit (eager)": ("eager", "eager+implicit"),
    "sync boundary (graphs)": ("graphs", "graphs+boundary"),
    "sync implicit (graphs)": ("graphs", "graphs+implicit"),
    "pdl": ("graphs", "graphs+pdl"),
    "qkv streams": ("graphs", "graphs+qkv"),
    "copy-elim": ("graphs+implicit", "graphs+implicit+copy-elim"),
    "all four (vs eager)": ("eager", "graphs+pdl+qkv+implicit"),
}


# ------------------------------------------------------------------------------------------
# measure (GPU)
# ------------------------------------------------------------------------------------------
def matrix(models=MODELS) -> list:
    """The measured matrix: every strategy of ``STRATEGIES`` on each model it changes."""
    from workbench.exec.calibrate.decode_matrix import MatrixModel

    return [MatrixModel(spec, tuple(st for label, st in STRATEGIES.items()
                                    if label not in ONLY or spec.model in ONLY[label]))
            for spec, _, _ in models]


# ------------------------------------------------------------------------------------------
# report (CPU)
# ------------------------------------------------------------------------------------------
def predict(rows: pd.DataFrame, cal) -> pd.DataFrame:
    """The measured cells of this report's strategies, each with the simulator's us/token."""
    import workbench

    df = rows[rows["strategy"].isin(list(STRATEGIES))].reset_index(drop=True)
    # the split follows MODELS (which families `workbench calibrate` measured), not the flag
    # recorded when the matrix was measured
    held = {fam: h for _, fam, h in MODELS}
    df["held_out"] = df["family"].map(held).fillna(True).astype(bool)
    pred = []
    for r in df.itertuples():
        spec = ModelSpec(r.model, None if pd.isna(r.layers) else int(r.layers),
                         None if pd.isna(r.context) else int(r.context), int(r.pos))
        run = workbench.run(spec.config(), STRATEGIES[r.strategy], tokens=int(r.tokens), backend="sim",
                            start_pos=spec.pos, calibration=cal)
        pred.append(run.stats["us_per_token"])
    df["predicted_us"] = pred
    df["error_pct"] = 100 * (df["predicted_us"] / df["us_per_token"] - 1)
    return df


def knob_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (label, fam, held), g in df.groupby(["label", "family", "held_out"], sort=False):
        by = g.set_index("strategy")
        for knob, (a, b) in KNOBS.items():
            if a not in by.index or b not in by.index:
                continue
            m = 100 * (by.at[a, "us_per_token"] / by.at[b, "us_per_token"] - 1)
            p = 100 * (by.at[a, "predicted_us"] / by.at[b, "predicted_us"] - 1)
            # spread of the measured speedup from the runs' min-max
            lo = 100 * (by.at[a, "us_min"] / by.at[b, "us_max"] - 1)
            hi = 100 * (by.at[a, "us_max"] / by.at[b, "us_min"] - 1)
            rows.append({"model": label, "family": fam, "held_out": held, "knob": knob, "measured_pct": m,
                         "measured_lo": lo, "measured_hi": hi, "predicted_pct": p, "diff_pp": p - m})
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame, kn: pd.DataFrame) -> pd.DataFrame:
    out = []
    for held, name in ((False, "calibration families"), (True, "held-out families")):
        a, k = df[df["held_out"] == held], kn[kn["held_out"] == held]
        if a.empty:
            continue
        out.append({"set": name, "cells": len(a), "mean_abs_error_pct": a["error_pct"].abs().mean(),
                    "max_abs_error_pct": a["error_pct"].abs().max(),
                    "cells_within_10pct": int((a["error_pct"].abs() <= 10).sum()),
                    "knobs": len(k), "mean_abs_diff_pp": k["diff_pp"].abs().mean() if len(k) else np.nan,
                    "knobs_within_2pp": int((k["diff_pp"].abs() <= 2).sum())})
    return pd.DataFrame(out)


def _md(df: pd.DataFrame, cols: list[str], digits: int = 1) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    lines = []
    for r in df[cols].itertuples(index=False):
        cells_ = [f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells_) + " |")
    return head + "\n".join(lines) + "\n"


def report(measured_path: Path, cal_path: Path | None, gpu: str | None, out_dir: Path,
           baselines: list[Path] | None = None, baseline_labels: list[str] | None = None) -> dict[str, Any]:
    from workbench.exec.calibrate.decode_matrix import read_matrix
    from workbench.exec.calibration import load_calibration

    env, measured = read_matrix(measured_path)
    gpu = gpu or _gpu_key(env["gpu_name"])
    cal = load_calibration(gpu, path=cal_path)
    df = predict(measured, cal)
    kn = knob_table(df)
    sm = summary(df, kn)
    base = []
    for i, path in enumerate(baselines or []):
        label = (baseline_labels or [])[i] if i < len(baseline_labels or []) else str(path)
        b = predict(measured, load_calibration(gpu, path=path))
        base.append(summary(b, knob_table(b)).assign(calibration=label))
    stem = f"sim_fidelity_{gpu}"
    out_dir.mkdir(parents=True, exist_ok=True)
    df.drop(columns=["runs_us"]).to_csv(out_dir / f"{stem}.csv", index=False)
    kn.to_csv(out_dir / f"{stem}_knobs.csv", index=False)
    text = [f"# Simulator vs GPU fidelity ({env['gpu_name']})\n\n",
            f"Measured {env['date'][:10]} on {env['gpu_name']}, driver {env.get('driver_version', '')}, CUDA runtime "
            f"{env.get('cuda_runtime', '')}, CuPy {env.get('cupy', '')} (`{measured_path.name}`); "
            f"{env['repeats']} runs of "
            f"{env['tokens']} tokens per cell (median, spread min-max). Predicted by the simulator with "
            f"`{cal_path or f'data/calibration/{gpu}.json'}` ({cal.name}). Held-out families were never measured "
            "by `workbench calibrate`. Generated by `benchmarks/sim_fidelity.py report`.\n\n",
            "## Summary\n\n", _md(sm, list(sm.columns))]
    for b in base:
        text += ["\nThe same matrix predicted with another calibration:\n\n", _md(b, list(b.columns))]
    for held, name in ((False, "Calibration families"), (True, "Held-out families")):
        d, k = df[df["held_out"] == held], kn[kn["held_out"] == held]
        if d.empty:
            continue
        text += [f"\n## {name}: us/token\n\n",
                 _md(d, ["label", "strategy", "us_per_token", "us_min", "us_max", "predicted_us", "error_pct"]),
                 f"\n## {name}: knob speedups (%)\n\n",
                 _md(k, ["model", "knob", "measured_pct", "measured_lo", "measured_hi", "predicted_pct", "diff_pp"])]
    (out_dir / f"{stem}.md").write_text("".join(text))
    print("".join(text))
    return {"rows": df, "knobs": kn, "summary": sm}


def _gpu_key(name: str) -> str:
    from workbench.exec.calibration import gpu_key

    return gpu_key(name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the matrix on this GPU (untraced) and write JSON lines")
    m.add_argument("--out", required=True)
    m.add_argument("--tokens", type=int, default=32)
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--budget", type=float, help="start no model after this many seconds")
    r = sub.add_parser("report", help="simulate the matrix and write the tables to data/bench/")
    r.add_argument("measured")
    r.add_argument("--calibration", type=Path, help="calibration file (default data/calibration/<gpu>.json)")
    r.add_argument("--baseline-calibration", type=Path, action="append",
                   help="also summarise the matrix under another calibration (repeatable)")
    r.add_argument("--baseline-label", action="append", help="how the report names each baseline calibration")
    r.add_argument("--gpu", help="calibration GPU key (default: from the measured GPU's name)")
    r.add_argument("--out-dir", type=Path, default=ROOT / "data" / "bench")
    args = p.parse_args()
    if args.cmd == "measure":
        from workbench.exec.calibrate.decode_matrix import measure_matrix

        measure_matrix(matrix(), Path(args.out), args.tokens, args.repeats, budget_s=args.budget)
        return 0
    report(Path(args.measured), args.calibration, args.gpu, args.out_dir, args.baseline_calibration,
           args.baseline_label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
