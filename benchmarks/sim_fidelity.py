"""Simulator vs GPU: predicted and measured us/token for a matrix of (model, strategy), and each
knob's predicted vs measured effect; the held-out model families (never seen by
``workbench calibrate``) are reported apart.

    # on the GPU: measure (untraced runs of the cuda executor), write JSON lines
    python benchmarks/sim_fidelity.py measure --out fidelity_measured.jsonl
    # anywhere: simulate the same matrix with a calibration and write the report to data/bench/
    python benchmarks/sim_fidelity.py report fidelity_measured.jsonl [--calibration data/calibration/h100.json]
    # against llama.cpp: measured = llamacpp_peer.py --jsonl, the fit = llamacpp_capture.py's traces
    python benchmarks/sim_fidelity.py report --target llamacpp peer.jsonl --traces DIR [--hold-out gpt-oss-20b]

With ``--target llamacpp`` the matrix is ``llamacpp_peer.py``'s models and CONFIGS, each knob
alone and stacked (its STEPS); the calibration is fitted from the traces of every model but the
held-out ones (``workbench calibrate --target llamacpp``'s fit), and the report
(``sim_fidelity_llamacpp_<gpu>.md``) says which cells meet the acceptance target (10 % us/token,
2 points per knob effect), held-out family included.

The GPU stage ``fidelity`` of ``benchmarks/gpu_fidelity_run.sh`` measures this matrix and the
eager knob cells in one run (``benchmarks/decode_matrix.py``); ``report`` reads that file too
(cells of strategies outside this matrix are left out), and the older JSON of ``measure``.

Measured (``workbench.exec.calibrate.decode_matrix``): the cuda executor at full size (qwen3-next,
qwen3-30b-a3b and gpt-oss-20b: 8 layers), weights drawn on the GPU, one warmed-up executor per
strategy, ``--repeats`` interleaved rounds of ``--tokens`` decode steps; a run's us/token is the
mean host time of its steady tokens (all but the first), the cell's value the median over runs
(spread: min-max). Predicted: the
simulator on the same Plans, start position and token count. A knob's effect is the change in
us/token it makes, ``t(with) / t(without) - 1`` (``decode_matrix.effect_pct``, as the issues state
effects: negative is faster); measured, the median of the rounds' own effects, with their min-max
as its spread (``decode_matrix.knob_effect``: a round times both cells within the same minutes).
Each knob's miss is also given in the speedup convention ``t(without) / t(with) - 1`` that the
reports used before 2026-11-29 (``diff_pp_as_speedup``), which inflates large effects.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.exec.calibrate.decode_matrix import effect_as_speedup, effect_pct, knob_effect, round_pairs
from workbench.exec.calibrate.llamacpp_fit import KNOB_BOUND_PP
from workbench.exec.calibrate.specs import ModelSpec
from workbench.strategy import FUSIONS, Strategy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # llamacpp_peer's CONFIGS and STEPS (--target llamacpp)

#: (spec, family (HF model_type), held out from calibration?): full size, but qwen3-next at 16 of
#: its 48 layers (a third: the whole model is 160 GB in f16); ``workbench calibrate`` measures llama, qwen3_moe
#: and qwen3_next shapes, qwen3 dense and gpt-oss never. A measured file's cells keep their own
#: layers (files before 2026-11-25 hold the MoE models at 8 layers)
MODELS: tuple[tuple[ModelSpec, str, bool], ...] = (
    (ModelSpec("llama-3.2-1b", None, 512, 448), "llama", False),
    (ModelSpec("qwen3-next-80b-a3b", 16, 512, 448), "qwen3_next", False),  # 48 layers: 160 GB in f16
    (ModelSpec("llama-3.1-8b", None, 1024, 600), "llama", False),
    (ModelSpec("qwen3-8b", None, 512, 448), "qwen3", True),
    (ModelSpec("qwen3-30b-a3b", None, 512, 448), "qwen3_moe", False),
    (ModelSpec("gpt-oss-20b", None, 512, 448), "gpt_oss", True),
)
ALL_FUSIONS = frozenset(FUSIONS)
#: the Strategy ``best`` stands for: every knob at its fastest on an H200 (data/bench/pdl_placement_h200.md)
BEST = Strategy(graphs=True, pdl=True, pdl_trigger="after-main-loop", streams="qkv", sync="implicit",
                allocator="stream-aware", fusion=ALL_FUSIONS)

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
    "graphs+fusion": Strategy(graphs=True, fusion=ALL_FUSIONS),
    "graphs+fusion+pdl": Strategy(graphs=True, pdl=True, fusion=ALL_FUSIONS),
    "graphs+fusion+pdl(after-main-loop)": Strategy(graphs=True, pdl=True, pdl_trigger="after-main-loop",
                                                   fusion=ALL_FUSIONS),
    "best": BEST,
}
#: a measured cell's ``strategy`` (``Strategy.label()``) -> its name here
BY_LABEL = {st.label(): name for name, st in STRATEGIES.items()}
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
    "fusion (graphs)": ("graphs", "graphs+fusion"),
    "pdl, signal at start (fused)": ("graphs+fusion", "graphs+fusion+pdl"),
    "pdl, signal after main loop (fused)": ("graphs+fusion", "graphs+fusion+pdl(after-main-loop)"),
    "best (vs eager)": ("eager", "best"),
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
def predict(rows: pd.DataFrame | Mapping[str, Any], cal) -> pd.DataFrame:
    """The measured cells of this report's strategies, each with the simulator's us/token.
    ``rows``: one row per cell (``read_matrix``'s frame), or the parsed JSON of an older measured
    file (``{"environment", "tokens", "repeats", "rows"}``, as notebook 05 reads it)."""
    import workbench

    if isinstance(rows, Mapping):
        if "rows" not in rows:
            raise ValueError("sim_fidelity.predict: a measured dict needs its 'rows' (the older JSON of `measure`); "
                             "for JSON lines of benchmarks/decode_matrix.py pass read_matrix(path)[1]")
        rows = pd.DataFrame(rows["rows"])
    df = rows.assign(strategy=rows["strategy"].map(lambda label: BY_LABEL.get(label, label)))
    df = df[df["strategy"].isin(list(STRATEGIES))].reset_index(drop=True)
    # the split follows MODELS (which families `workbench calibrate` measured), not the flag
    # recorded when the matrix was measured
    held = {fam: h for _, fam, h in MODELS}
    df["held_out"] = df["family"].map(held).fillna(True).astype(bool)
    pred, kernels = [], []
    for r in df.itertuples():
        spec = ModelSpec(r.model, None if pd.isna(r.layers) else int(r.layers),
                         None if pd.isna(r.context) else int(r.context), int(r.pos))
        run = workbench.run(spec.config(), STRATEGIES[r.strategy], tokens=int(r.tokens), backend="sim",
                            start_pos=spec.pos, calibration=cal)
        pred.append(run.stats["us_per_token"])
        kernels.append(run.stats["kernels_per_token"])
    df["predicted_us"] = pred
    df["kernels_per_token"] = kernels
    df["error_pct"] = 100 * (df["predicted_us"] / df["us_per_token"] - 1)
    return df


#: issue 17's bounds: a cell's us/token error (%) and a knob effect's miss (percentage points)
CELL_BOUND_PCT = 10.0  # the knob bound, KNOB_BOUND_PP, is the llama.cpp fit's (its grid fits aim at it)


def judge(df: pd.DataFrame, kn: pd.DataFrame) -> str:
    """Issue 17's acceptance on one report: marks ``pass`` on the cells (within 10 % us/token) and
    the knob effects (within 2 points), and ``in_spread`` on the knobs (the prediction inside the
    measured effect's own min-max spread: a miss there is below what the measurement resolved);
    returns the verdict sentence both reports open with."""
    df["pass"] = df["error_pct"].abs() <= CELL_BOUND_PCT
    kn["pass"] = kn["diff_pp"].abs() <= KNOB_BOUND_PP
    kn["in_spread"] = (kn["predicted_pct"] >= kn["measured_lo"]) & (kn["predicted_pct"] <= kn["measured_hi"])
    ok_cells, ok_knobs = int(df["pass"].sum()), int(kn["pass"].sum())
    verdict = "meets" if ok_cells == len(df) and ok_knobs == len(kn) else "does NOT meet"
    return (f"**Acceptance** (every cell within {CELL_BOUND_PCT:g} % us/token, every knob effect within "
            f"{KNOB_BOUND_PP:g} points, held-out "
            f"family included): the simulator {verdict} it: {ok_cells} of {len(df)} cells and {ok_knobs} of "
            f"{len(kn)} knob effects pass ({int((~kn['pass'] & kn['in_spread']).sum())} of the "
            f"{int((~kn['pass']).sum())} knob misses lie inside the measured effect's spread, `in_spread`).")


def knob_table(df: pd.DataFrame, knobs: dict[str, tuple[str, str]] = KNOBS) -> pd.DataFrame:
    rows = []
    for (label, fam, held), g in df.groupby(["label", "family", "held_out"], sort=False):
        by = g.set_index("strategy")
        for knob, (a, b) in knobs.items():
            if a not in by.index or b not in by.index:
                continue
            m, lo, hi = knob_effect(by.loc[a], by.loc[b])
            p = effect_pct(by.at[a, "predicted_us"], by.at[b, "predicted_us"])
            row = {"model": label, "family": fam, "held_out": held, "knob": knob, "measured_pct": m,
                   "measured_lo": lo, "measured_hi": hi, "predicted_pct": p, "diff_pp": p - m,
                   "diff_pp_as_speedup": effect_as_speedup(p) - effect_as_speedup(m)}
            if "leases" in by.columns:  # no lease-to-lease drift in the effect: its rounds pair processes of one
                # lease each (round_pairs), or both cells come from one lease
                row["same_lease"] = bool(round_pairs(by.loc[a], by.loc[b])) or (
                    by.at[a, "leases"] == by.at[b, "leases"] and "," not in str(by.at[a, "leases"]))
            rows.append(row)
    return pd.DataFrame(rows)


#: the knobs that change no kernel, only when each one may start: their effect per kernel
PDL_KNOBS = ("pdl", "pdl, signal at start (fused)", "pdl, signal after main loop (fused)")


def per_kernel_table(df: pd.DataFrame, knobs: tuple[str, ...] = PDL_KNOBS) -> pd.DataFrame:
    """What a PDL knob saves per kernel launched (ns), measured and predicted: the knob keeps the
    kernel list, so the step's saving over its kernel count is the gap the early launch hides,
    and a miss reads as the simulator's hidden gap being too short or too long."""
    rows = []
    for (label, held), g in df.groupby(["label", "held_out"], sort=False):
        by = g.set_index("strategy")
        for knob in knobs:
            a, b = KNOBS[knob]
            if a not in by.index or b not in by.index:
                continue
            n = float(by.at[a, "kernels_per_token"])
            m = 1e3 * (by.at[a, "us_per_token"] - by.at[b, "us_per_token"]) / n
            p = 1e3 * (by.at[a, "predicted_us"] - by.at[b, "predicted_us"]) / n
            rows.append({"model": label, "held_out": held, "knob": knob, "kernels_per_token": n,
                         "measured_ns_per_kernel": m, "predicted_ns_per_kernel": p, "diff_ns": p - m})
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame, kn: pd.DataFrame) -> pd.DataFrame:
    out = []
    for held, name in ((False, "calibration families"), (True, "held-out families")):
        a, k = df[df["held_out"] == held], kn[kn["held_out"] == held]
        if a.empty:
            continue
        out.append({"set": name, "cells": len(a), "mean_abs_error_pct": a["error_pct"].abs().mean(),
                    "max_abs_error_pct": a["error_pct"].abs().max(),
                    "cells_within_10pct": int((a["error_pct"].abs() <= CELL_BOUND_PCT).sum()),
                    "knobs": len(k), "mean_abs_diff_pp": k["diff_pp"].abs().mean() if len(k) else np.nan,
                    "knobs_within_2pp": int((k["diff_pp"].abs() <= KNOB_BOUND_PP).sum()),
                    "knobs_within_2pp_as_speedup": int((k["diff_pp_as_speedup"].abs() <= KNOB_BOUND_PP).sum())
                    if len(k) else 0})
        if "same_lease" in k.columns:
            same = k[k["same_lease"].astype(bool)]
            out[-1].update({"same_lease_knobs": len(same),
                            "same_lease_within_2pp": int((same["diff_pp"].abs() <= KNOB_BOUND_PP).sum())})
    return pd.DataFrame(out)


def _md(df: pd.DataFrame, cols: list[str], digits: int = 1) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    lines = []
    for r in df[cols].itertuples(index=False):
        cells_ = [f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells_) + " |")
    return head + "\n".join(lines) + "\n"


def kernel_check(cal, bench_md: Path, models=MODELS) -> pd.DataFrame:
    """The simulator's duration of each kernel that ``benchmarks/kernel_bench.py`` timed alone at
    the matrix's shapes (its markdown table, the ``default`` variant: the kernel the executor
    binds now, whichever variant the table names it), beside the measured one: whether a cell's
    miss is in the kernels' own time (the kernel-selection defaults changed after the table and
    the calibration: the op fits' extrapolation) or between them."""
    import workbench
    from workbench.exec.cuda_ops import BindError, bind

    def bound(node) -> tuple[str, str] | None:
        """(kernel, grid) the executor launches for ``node`` (buffers at aligned bases, as
        ``cost.executor_kernel`` binds it); the grid tells variants of one kernel apart (seg8/seg16)."""
        try:
            k = bind(node, lambda v: v.offset, lambda key, n: 0)
        except BindError:
            return None
        return k.name, str(tuple(k.grid))

    bench = []
    for line in bench_md.read_text().splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(c) >= 8 and c[7].replace(".", "", 1).isdigit():
            bench.append({"model": c[0], "node": c[1], "op": c[2], "shape": c[3], "variant": c[4],
                          "kernel": c[5].strip("`"), "grid": c[6], "bench_us": float(c[7])})
    bt = pd.DataFrame(bench)
    rows = []
    for spec, _, _ in models:
        b = bt[bt["model"] == spec.model] if len(bt) else bt
        if b.empty:
            continue
        run = workbench.run(spec.config(), Strategy(graphs=True), tokens=2, backend="sim", start_pos=spec.pos,
                            calibration=cal, quiet=True)
        ev = run.trace.events
        k = ev[(ev["kind"] == "kernel") & (ev["token"] == ev["token"].max())]
        dur = dict(zip(k["node"], (k["end_ns"] - k["start_ns"]) / 1e3))
        binds = {la.node.name: bound(la.node) for la in run.plan.launches}
        for r in b.itertuples():
            if r.node in dur and binds.get(r.node) == (r.kernel, r.grid):
                rows.append({"model": spec.label, "node": r.node, "op": r.op, "shape": r.shape, "kernel": r.kernel,
                             "bench_variant": r.variant, "measured_us": r.bench_us, "simulated_us": dur[r.node],
                             "error_pct": 100 * (dur[r.node] / r.bench_us - 1)})
    return pd.DataFrame(rows)


def report(measured_path: Path, cal_path: Path | None, gpu: str | None, out_dir: Path,
           baselines: list[Path] | None = None, baseline_labels: list[str] | None = None) -> dict[str, Any]:
    from workbench.exec.calibrate.decode_matrix import cold_run_note, read_matrix
    from workbench.exec.calibration import load_calibration

    env, measured = read_matrix(measured_path)
    gpu = gpu or _gpu_key(env["gpu_name"])
    cal = load_calibration(gpu, path=cal_path)
    df = predict(measured, cal)
    kn = knob_table(df)
    sm = summary(df, kn)
    verdict = judge(df, kn)
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
            f"{env['tokens']} tokens per cell (median, spread min-max). A knob's effect is the change in us/token "
            "it makes, `t(with) / t(without) - 1` (negative: faster), as the issues state effects; measured, the "
            "median of the rounds' own effects, its spread their min-max. `diff_pp_as_speedup`: the miss in "
            "the speedup convention `t(without) / t(with) - 1` of the reports before 2026-11-29. "
            f"{cold_run_note(env)}"
            "Predicted by the simulator with "
            f"`{cal_path or f'data/calibration/{gpu}.json'}` ({cal.name}). Held-out families were never measured "
            "by `workbench calibrate`. Generated by `benchmarks/sim_fidelity.py report`.\n\n",
            f"{verdict}\n\n", "## Summary\n\n", _md(sm, list(sm.columns))]
    for b in base:
        text += ["\nThe same matrix predicted with another calibration:\n\n", _md(b, list(b.columns))]
    for held, name in ((False, "Calibration families"), (True, "Held-out families")):
        d, k = df[df["held_out"] == held], kn[kn["held_out"] == held]
        if d.empty:
            continue
        text += [f"\n## {name}: us/token\n\n",
                 _md(d, ["label", "strategy", "us_per_token", "us_min", "us_max", "predicted_us", "error_pct"]),
                 f"\n## {name}: knob effects (% change in us/token)\n\n",
                 _md(k, ["model", "knob", "measured_pct", "measured_lo", "measured_hi", "predicted_pct", "diff_pp",
                         "pass", "in_spread", "diff_pp_as_speedup"])]
    pk = per_kernel_table(df)
    if not pk.empty:
        text += ["\n## PDL knobs per kernel (ns)\n\n",
                 "A PDL knob keeps the kernel list and changes only when each kernel may start, so its saving "
                 "over the kernels launched per token is the gap an early launch hides (`per_kernel_table`; "
                 "kernels per token from the simulator's Plan of the knob's `from` strategy):\n\n",
                 _md(pk, list(pk.columns), digits=0)]
    bench_md = ROOT / "data" / "bench" / f"kernels_{gpu}.md"
    kc = kernel_check(cal, bench_md) if bench_md.exists() else pd.DataFrame()
    if not kc.empty:
        text += [f"\n## Kernels alone: simulated vs `{bench_md.name}`\n\n",
                 "The measured file holds us/token only, no kernel times; `benchmarks/kernel_bench.py` timed the "
                 "kernels the executor binds at these shapes alone (CUDA graph replay, operands not L2-resident). "
                 "The simulator's duration of the same node (graphs, the cell's position):\n\n",
                 _md(kc, list(kc.columns))]
    (out_dir / f"{stem}.md").write_text("".join(text))
    print("".join(text))
    return {"rows": df, "knobs": kn, "summary": sm, "kernels": kc}


# ------------------------------------------------------------------------------------------
# --target llamacpp (CPU): llama.cpp measured by llamacpp_peer.py, predicted under a fit of its traces
# ------------------------------------------------------------------------------------------
#: model preset -> family (the held-out split is by family)
LLAMACPP_FAMILIES = {"llama-3.2-1b": "llama", "llama-3.1-8b": "llama", "qwen3-30b-a3b": "qwen3_moe",
                     "qwen3-next-80b-a3b": "qwen3_next", "gpt-oss-20b": "gpt_oss"}


def predict_llamacpp(measured: pd.DataFrame, cal, held_out: set[str], tokens: int, start_pos: int,
                     context: int) -> pd.DataFrame:
    """The peer benchmark's cells predicted by the simulator under ``cal`` (a llama.cpp
    calibration), each in its record's decode window (context, start position, tokens; the
    arguments where a record lacks them). A cell off the default window is its own row
    (``<model> (<n> layers) @ <start>``), so knob effects pair cells of one window."""
    from llamacpp_peer import CONFIGS

    import workbench
    from workbench.models import preset

    df = measured[measured["config"].isin(list(CONFIGS))].copy()
    for col, default in (("context", context), ("start_pos", start_pos), ("tokens", tokens)):
        df[col] = [int(v) if v > 0 else default for v in df[col]]
    df["family"] = df["model"].map(LLAMACPP_FAMILIES).fillna(df["model"])
    df["held_out"] = df["model"].isin(held_out)
    df["label"] = [f"{m} ({n} layers)" + ("" if (c, s) == (context, start_pos) else f" @ {s}")
                   for m, n, c, s in zip(df["model"], df["layers"], df["context"], df["start_pos"])]
    df["strategy"] = df["config"]
    pred = []
    for r in df.itertuples():
        cfg = preset(r.model, layers=int(r.layers), context=int(r.context))
        run = workbench.run(cfg, CONFIGS[r.config][0], tokens=int(r.tokens), backend="sim", start_pos=int(r.start_pos),
                            calibration=cal, quiet=True)
        pred.append(run.stats["us_per_token"])
    df["predicted_us"] = pred
    df["error_pct"] = 100 * (df["predicted_us"] / df["us_per_token"] - 1)
    return df.reset_index(drop=True)


def report_llamacpp(measured_path: Path, traces: Path | None, cal_path: Path | None, held_out: set[str],
                    out_dir: Path, tokens: int, start_pos: int, context: int) -> dict[str, Any]:
    """Fit (or load) the llama.cpp calibration without the held-out models, predict the peer
    matrix, write ``sim_fidelity_llamacpp_<gpu>.md`` (+ csv) with the acceptance verdicts."""
    from llamacpp_peer import STEPS

    from workbench.exec.calibrate.llamacpp_fit import fit_folder, measured_table
    from workbench.exec.calibrate.llamacpp_traces import read_traces
    from workbench.exec.calibration import CALIBRATION_DIR, load_calibration, parse_calibration

    measured = measured_table(measured_path)
    if measured.empty:
        raise SystemExit(f"{measured_path}: no llamacpp / llama-bench record with us/token; give the jsonl of "
                         "benchmarks/llamacpp_peer.py --jsonl")
    if cal_path is not None:
        cal = load_calibration(path=cal_path)
        gpu, cal_text = cal.gpu, f"`{cal_path}`"
        fitted_on = "(a given calibration: which models it saw is its own)"
    elif traces is not None:
        gpu = _gpu_key(str(read_traces(traces)[0].trace.meta.get("gpu_name", ""))) or "h200"
        base = json.loads((CALIBRATION_DIR / f"{gpu}.json").read_text())
        data = fit_folder(traces, base, measured_path, held_out, log=lambda t: print(t, file=sys.stderr))
        cal = parse_calibration(data, "llama.cpp fit")
        cal_text = f"fitted now from the traces in `{traces.name}` (`workbench calibrate --target llamacpp`)"
        fitted_on = f"traces of {', '.join(data['measured']['models'])}"
    else:
        raise SystemExit("--target llamacpp needs --traces DIR (to fit) or --calibration FILE")
    df = predict_llamacpp(measured, cal, held_out, tokens, start_pos, context)
    kn = knob_table(df, {name: (a, b) for name, a, b in STEPS})
    sm = summary(df, kn)
    verdict = judge(df, kn)
    # the committed report holds out the default (gpt-oss-20b); another hold-out writes beside it
    other = held_out and held_out != {"gpt-oss-20b"}
    stem = f"sim_fidelity_llamacpp_{gpu}" + ("_holdout_" + "_".join(sorted(held_out)) if other else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / f"{stem}.csv", index=False)
    kn.to_csv(out_dir / f"{stem}_knobs.csv", index=False)
    text = [f"# Simulator vs llama.cpp fidelity ({gpu})\n\n",
            f"Measured: llama.cpp's us/token from `{measured_path.name}` (`benchmarks/llamacpp_peer.py --jsonl`; "
            "the llamacpp backend's repetitions, llama-bench's where it has none; median, spread min-max). "
            f"Predicted: the simulator under the llama.cpp calibration {cal_text}, fitted on {fitted_on}; "
            f"held out of the fit: {', '.join(sorted(held_out)) or 'none'}. {tokens} tokens from position "
            f"{start_pos} of a {context}-row context (a row labelled `@ <start>`: its record's own window, here "
            "the 32k-context gpt-oss cells). A knob's effect is the change in us/token, `t(to) / t(from) - 1` "
            "(negative: faster; llamacpp_peer.py's STEPS); `diff_pp_as_speedup`: the miss in the speedup "
            "convention `t(from) / t(to) - 1` of the reports before 2026-11-29. "
            "Generated by `benchmarks/sim_fidelity.py report --target llamacpp`.\n\n",
            f"{verdict} {_lease_note(kn)}\n\n",
            "## Summary\n\n", _md(sm, list(sm.columns))]
    for held, name in ((False, "Fitted families"), (True, "Held-out families")):
        d, k = df[df["held_out"] == held], kn[kn["held_out"] == held]
        if d.empty:
            continue
        text += [f"\n## {name}: us/token\n\n",
                 _md(d, ["label", "strategy", "tool", "us_per_token", "us_min", "us_max", "predicted_us", "error_pct",
                         "pass"]),
                 f"\n## {name}: knob effects (% change in us/token)\n\n",
                 _md(k, ["model", "knob", "measured_pct", "measured_lo", "measured_hi", "predicted_pct", "diff_pp",
                         "pass", "in_spread", *(["same_lease"] if "same_lease" in k.columns else []),
                         "diff_pp_as_speedup"])]
    if traces is not None:
        text += ["\n## Where the misses come from\n\n", LLAMACPP_CAUSES]
        ops = op_time_table(traces, cal, held_out)
        ops.to_csv(out_dir / f"{stem}_op_times.csv", index=False)
        big = ops[(ops["diff_us"].abs() >= 20) | ((ops["diff_us"].abs() >= 5) & (ops["diff_pct"].abs() >= 25))]
        text += ["\n## Kernel time per op and token: llama.cpp's captures vs the calibration\n\n",
                 "Matched kernels of token 1 of each capture of a fitted model (traced durations: a kernel's time "
                 "on its stream) beside the simulator's kernel cost under the calibration above, summed per op; "
                 f"rows off by at least 20 us, or 5 us and 25 % (`{stem}_op_times.csv` has all). A family whose "
                 "kernel count differs from the schedule's is not in it (next section).\n\n",
                 _md(big, ["trace", "op", "kernels", "captured_us", "predicted_us", "diff_us", "diff_pct"])]
        counts = kernel_count_table(traces)
        counts.to_csv(out_dir / f"{stem}_kernel_counts.csv", index=False)
        diff = counts[counts["captured"] != counts["simulated"]]
        text += ["\n## Kernels per token: llama.cpp's captures vs the simulated schedule\n\n",
                 f"Every capture's token 1, per kernel family (`{stem}_kernel_counts.csv` has every family): "
                 f"{len(diff)} of {len(counts)} (capture, family) pairs differ"]
        if len(diff):
            text += ["; those below. The fit leaves a differing family unmatched in that capture (its kernels "
                     "keep the other captures' or the base calibration's fits), and the simulator runs the "
                     "workbench's kernels for it.\n\n",
                     _md(diff, ["trace", "family", "captured", "simulated", "captured_ops", "simulated_ops"])]
        else:
            text.append(".\n")
    (out_dir / f"{stem}.md").write_text("".join(text))
    print("".join(text))
    return {"rows": df, "knobs": kn, "summary": sm, "calibration": cal}


def _lease_note(kn: pd.DataFrame) -> str:
    """The verdict's sentence on knob effects whose two cells come from different machine leases."""
    if "same_lease" not in kn.columns:
        return ""
    same = kn[kn["same_lease"].astype(bool)]
    cross = kn[~kn["same_lease"].astype(bool)]
    if cross.empty:
        return "Every knob effect pairs cells measured on one machine lease (`same_lease`)."
    return (f"{len(cross)} knob effects pair cells measured on different machine leases (`same_lease` False): "
            "each side of a lease-to-lease comparison moves 1-2 % (`speed_h200.md`, session 16), so such an "
            f"effect carries that drift; of the {len(same)} same-lease effects, {int(same['pass'].sum())} pass, "
            f"of the cross-lease ones {int(cross['pass'].sum())}.")


#: what the two tables below the report's verdicts show, read off the 2026-11-25 H200 captures
#: (the tables are regenerated with the report; this reading is not)
LLAMACPP_CAUSES = """\
Read off the tables below and the captures (H200, 2026-11-25, 2026-11-27 and 2026-11-29; the fit's sources are in the
calibration file):

* **Host time per token**: the schedule copies llama.cpp's split inputs, not the workbench graph's
  (`llamacpp_schedule.llamacpp_inputs`: the CPU-gathered embedding row, position, K and V row indices,
  mask(s), output-row and recurrent-state indices; 6 copies a token on llama and qwen3-30b-a3b, 7 on
  qwen3-next, 9 on gpt-oss, as every capture shows). Upstream, each is a sync of the main stream and
  ggml's blocking `set_tensor` (an async copy on its copy stream and a sync of it); the `sync_boundary` /
  `sync_implicit` captures show the patch's `s a..a s` and `a..a`, the host programs the simulator runs.
  The blocking copy's cost (`memcpy_blocking_ns`) is fitted on the measured sync knob pairs; the traced
  median is its upper bound. `token_overhead_ns` is what the untraced us/token leave over: on the H200 it
  comes out 0 (with the graph launch lowered), because the simulated device span is 1-3 % longer than the
  captured one on llama and qwen3-30b-a3b (next item), and the fit takes that out of the host's time.
* **Mat-vec cost per row**: the mat-vec fits (`MUL_MAT`, `MUL_MAT_ADD`, `MUL_MAT_GLU`, `MUL_MAT_ID_GLU`)
  are `fixed + row_ns x rows + scale x roofline` (`kernel_fit.fit_row_kernels`): llama.cpp's mat-vec
  runs a block per output row that ends in a reduction, so at the same bytes 2048-wide rows
  (llama-3.2-1b, the qwen3 MoEs) take longer than 4096- and 14336-wide ones (llama-3.1-8b). One line per
  kernel still misses single shapes: the lm_head mat-vec is predicted 6-13 % slow on llama and
  qwen3-30b-a3b, the 512- and 1024-row K/V projections 6-7 % fast (`_op_times.csv`). How many bytes a
  lane keeps in flight follows `mul_mat_vec_f`'s unrolled column loop (`cost.mmvf_rounds`: 16 B at
  2048, 4096 and 14336 columns, 7.5 B at gpt-oss-20b's 2880), which takes held-out gpt-oss-20b's Q
  projection and lm_head from 19-20 % fast to 13 % fast; qwen3-8b's rows, in no fit
  (`data/traces/llamacpp/h200_widths`), come out within 8 % under the shipped file, but its lm_head
  (+11.5 %).
* **Expert mat-mul**: llama.cpp runs an unfused f16 `MUL_MAT_ID` (gate, up; down always) as the
  tensor-core `mul_mat_f` over every expert's 32-row blocks, not the selected experts' rows; the
  blocks of unused experts exit (`cost.mmf_ids_geometry`). Its time follows the expert count beside
  the bytes (H200: Qwen3-30B-A3B's gate and down 14.4 and 17.3 us with 128 experts, Qwen3-Next's
  19.4 and 25.0 with 512 and fewer bytes), so its fit is charged per wave of that grid over the SMs;
  a fit per selected row had Qwen3-Next's gate 33 % fast. It still misses Qwen3-Next's gate by 14 %,
  and which experts a token picks moves one kernel by up to 3 us (the last used expert's blocks start
  after the earlier experts' exits). For held-out gpt-oss-20b the per-row fit's expert mat-mul was
  28 % slow and offset its mat-vecs' miss above; priced per wave it is 12 % slow, and its cells
  (not the 32k ones) come out -4.8..+0.6 % (session 34: 0.1-7.3 % fast).
* **Expert bias**: gpt-oss-20b's `ADD_ID` is ggml's `add_id_kernel`, a block per selected expert's
  row of min(columns, 768) threads (4 blocks of 768 at one token), whose lanes loop over the row
  (its PTX: each pass loads, adds and stores before the next); priced on the element-wise kernels'
  256-thread blocks over every element it was 1.4 us against 2.7-3.2 captured (-52 %), on its own
  grid (`cost.launch_geometry`) 2.4 us, held out.
* **Q/K/V streams**: llama.cpp's fork (`ggml_cuda_concurrent_event`) puts every branch on a stream
  of its own, the Q projection included, and the forking stream waits for all three at the
  attention, so the norm -> Q and branch -> attention edges are events, not PDL launches (the
  graph_opt captures: four streams); the workbench's own `qkv` keeps Q on the forking stream. On
  Qwen3-Next llama.cpp reorders the branches but runs one stream (its `is_valid` check drops the
  forks; both GPUs' captures show one), and so does the schedule, which moved the H100's two
  Qwen3-Next Q/K/V knobs within 2 points.
* **Q/K/V streams and fusion on gpt-oss-20b**: with session 37's llama-bench rounds (8-9 more
  processes a cell at 8 layers, 4-5 at 24, `llamacpp_bench_rounds_h200_s37.jsonl`), GRAPH_OPT buys
  gpt-oss-20b nothing at 24 layers (+0.1 %, `default` -> `graph_opt`) and fusion on top of the streams
  costs time (+1.0 %, `graphs_pdl_qkv` -> `graph_opt`), where the simulator predicts -3.4 and -2.9 %.
  The 8-layer captures show it per layer (one attention's start to the next, H200): the streams save
  9.5 us a layer unfused (147.8 -> 138.3 us; simulated 149.1 -> 142.5) but 2.0 fused (141.3 -> 139.3;
  simulated 143.9 -> 137.6). In the fused `graph_opt` capture most kernels after the join start
  0.3-0.4 us later after their predecessor's start than in `default` (their early PDL launch comes
  later), about 3.5 us a layer that the simulator does not model; llama-3.1-8b's captures show no
  such shift, and why gpt-oss-20b's do is open. The shift sits on the kernels llama.cpp launches
  plainly (`launched_plainly`: argsort, soft_max, `mul_mat_f`, add_id, swiglu_oai): after the join
  they start 0.29-0.45 us after their predecessor's end, against 0.00-0.13 in `default`, while
  qwen3-30b-a3b's plainly launched MoE kernels start 0.10 us after theirs in both (medians over
  layers 1-6 of tokens 1-3).
* **Argsort**: llama.cpp's router argsort (`k_argsort_f32_i32`) is a one-block bitonic sort whose
  time follows its `s (s + 1) / 2` stages for `2^s` padded columns (5.5, 8.2 and 14.2 us at 32, 128
  and 512 experts on both GPUs), so its fit is charged per stage (`cost.bitonic_stages`); a fit that
  sees one width scales with the stages (`llamacpp_knob_noise_h200_s33.md`).
* **PDL**: llama.cpp launches some kernels plainly (`<<<...>>>`, not `ggml_cuda_kernel_launch`), so they
  take no early launch: soft_max, argsort, the f16 MoE expert mat-vec `mul_mat_f`, the MUL+SUM_ROWS
  reduction, add_id, swiglu_oai, clamp and llama's `rope_norm` (`llamacpp_schedule.launched_plainly`).
  In the captures with PDL on, those start before their predecessor ends at 7-25 % of their boundaries
  (timestamp jitter), the kernels launched through `ggml_cuda_kernel_launch` at 44-100 %. This is why
  PDL buys gpt-oss-20b little (measured -2.7 % at 8 layers,
  -3.1 % at 24).
* **FLASH_ATTN_EXT**: llama.cpp splits each head's keys over `parallel_blocks` blocks
  (`cost.fattn_vec_parallel`) and each block walks its keys tile by tile, so the fit charges the keys
  a block walks (`serial_units`) beside the bytes. The split's partials are merged by a second kernel
  (`flash_attn_combine_results`; the stream-k fixup after qwen3-next's mma kernel), which every
  attention of every capture runs: since session 38 the schedule launches it as a node of its own
  (`llamacpp_schedule.attention_passes`), where before its time was folded into the attention's and
  its launch and gap were missing. Its time follows the partial values a block merges
  (`cost.fattn_combine_values`: splits x head size; 1.6 us at 512 keys, 1.8-2.1 at 32k), fitted on
  its own (H200: 1157 ns + 0.37 ns a value). Launched one by one that is a host launch and an eager
  gap more per layer: llama-3.1-8b's `CUDA graphs (PDL off)` went from 2.2 to 1.5 points off, and
  llama-3.2-1b's host-bound eager cell rose by 60 us (+2.0 to +5.1 % against v6's processes).
  The long-context captures (llama-3.2-1b at 8k and
  32k keys, llama-3.1-8b at 32k) fit within 1 % and took gpt-oss-20b's 32k cells from -18.0 and
  -18.9 % to -9.0 and -12.2 % (session 35; the host's mask, below, takes them further). One fit
  spans head sizes 64, 128 and 256, whose 512-key kernels it misses
  by up to 38 % (qwen3-next's, 13.2 us, predicted fast; gpt-oss-20b's 21 % fast).
* **Host time at long context**: llama.cpp fills its KQ mask(s) on the CPU before every step, a cell
  per cached KV row, so a token's host time before its first CUDA call grows with the context
  (llama-3.2-1b: 53, 93 and 243 us at 512, 8192 and 32768 rows). The fit prices it per byte of f16
  mask from those captures (`llamacpp_fit.mask_fill_cost`, 3.0 ns a byte on the H200), and the
  simulator charges it per token (`mask_fill_ns_per_byte`); with it held-out gpt-oss-20b's 32k cells
  moved from -9.0 and -12.2 % to +0.3 and -5.1 % (session 37). The traced `cudaGraphLaunch` grows
  with the context too (293, 324 and 606 us), which the simulator does not model: CUPTI's
  node-level records inflate a traced graph launch, so how much of it untraced llama.cpp pays is
  not measured. The H100 has no long-context captures, so its file has no mask term.
* **Eager cells** (`eager`, `no_graphs_pdl0`) carry the host's noise: qwen3-30b-a3b's eager cell differs
  by 23 % between the backend and llama-bench in the same lease (`llamacpp_peer_f16_h200_s19a.md`), so
  the knobs measured from eager (`CUDA graphs (PDL off)`, `stack: + graphs`) miss on the MoE models.
  The host differs between leases too: llama-bench's median eager us/token of qwen3-next-80b-a3b was
  2963 in session 33's lease and 2404 in session 34's (both 2026-11-29), of qwen3-30b-a3b 2016 and
  1872, where the CUDA-graph cells of the four models moved -4.2..+2.3 % (`llamacpp_knob_noise_h200_s33.md`).
  A pooled eager cell is therefore a mix of hosts; its knob effects pair processes within a lease.
* **Run-to-run spread**: one process of llama.cpp differs from the next by 1-5 % in the same lease, as
  large as the 2-point bound, while the repetitions inside a process agree within 0.5 % (2026-11-29,
  `llamacpp_bench_rounds_h200_s33.jsonl`: 4-12 llama-bench processes a cell, standard deviation of
  the process medians 1.6 % at the median cell). A knob's effect therefore pairs its two cells'
  processes round by round (`decode_matrix.knob_effect` on `measured_table`'s `runs`) and takes the
  median of the rounds' effects; with 4 rounds that median still carries about 1.4 points of noise.
  v5 (`llamacpp_peer_v5_h200.jsonl`) adds a second lease's rounds of the 8 configs of the stacked
  knobs and the fusion, graphs and PDL steps (session 34, `llamacpp_bench_rounds_h200_s34.jsonl`);
  v6 (`llamacpp_peer_v6_h200.jsonl`) adds session 37's rounds of the same 8 configs of gpt-oss-20b at
  8 and 24 layers. At 24 layers they outnumber v3's two backend processes a cell, so that shape's
  cells are llama-bench's (`llamacpp_fit.measured_table`: a model shape takes the tool that timed it
  in more processes, the backend on a tie, as on the H100). v7 (`llamacpp_peer_v7_h200.jsonl`) adds
  session 38's rounds (`llamacpp_bench_rounds_h200_s38.jsonl`, 8-10 processes a cell): qwen3-next's
  `no_graphs` and `no_graphs_pdl0`, whose `no_graphs` cell had 4 processes spanning 1428-1965 us,
  and the `eager` / `graphs` pairs of llama-3.2-1b and qwen3-30b-a3b (`stack: + graphs`).
* **Cross-lease effects** (`same_lease` False, counted in the verdict): the two cells were measured on
  different machine leases, so the effect carries the two leases' drift as well as the knob.
"""


def op_time_table(traces: Path, cal, held_out: set[str]) -> pd.DataFrame:
    """Per capture of a fitted model and ggml op, token 1's matched kernel time against the
    simulator's kernel cost under ``cal`` (``llamacpp_traces.matched_kernels``)."""
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.exec.calibrate.llamacpp_traces import matched_kernels, read_traces
    from workbench.exec.cost import kernel_cost

    rows = []
    for t in read_traces(traces):
        if t.model in held_out:
            continue
        m, _ = matched_kernels(t, cal)
        if m.empty:
            continue
        m = m[m["token"] == 1]
        cfg = t.config()
        plan = llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos + 1))
        pred = {la.node.name: kernel_cost(la.node, cal).duration_ns for la in plan.launches}
        for op, g in m.groupby("op"):
            c, p = g["exposed_ns"].sum() / 1e3, sum(pred[n] for n in g["node"]) / 1e3
            rows.append({"trace": t.name, "op": op, "kernels": len(g), "captured_us": c, "predicted_us": p,
                         "diff_us": p - c, "diff_pct": 100 * (p / c - 1) if c else np.nan})
    return pd.DataFrame(rows)


def kernel_count_table(traces: Path) -> pd.DataFrame:
    """``llamacpp_traces.kernel_counts`` of every capture in ``traces``."""
    from workbench.exec.calibrate.llamacpp_traces import kernel_counts, read_traces

    return pd.concat([kernel_counts(t) for t in read_traces(traces)], ignore_index=True)


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
    r.add_argument("measured", help="the measured matrix: sim_fidelity.py measure's JSON, or with --target llamacpp "
                                    "the jsonl of benchmarks/llamacpp_peer.py --jsonl")
    r.add_argument("--target", choices=("cuda", "llamacpp"), default="cuda",
                   help="whose measurements: the workbench's cuda executor (default) or llama.cpp")
    r.add_argument("--traces", type=Path, help="--target llamacpp: the folder of llama.cpp timelines to fit "
                                               "(benchmarks/llamacpp_capture.py)")
    r.add_argument("--hold-out", default="gpt-oss-20b",
                   help="--target llamacpp: comma-separated models left out of the fit (default gpt-oss-20b)")
    r.add_argument("--tokens", type=int, default=64, help="--target llamacpp: tokens per cell (llamacpp_peer.py's)")
    r.add_argument("--start-pos", type=int, default=448)
    r.add_argument("--context", type=int, default=512)
    r.add_argument("--calibration", type=Path, help="calibration file (default data/calibration/<gpu>.json; with "
                                                    "--target llamacpp: instead of fitting --traces)")
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
    if args.target == "llamacpp":
        report_llamacpp(Path(args.measured), args.traces, args.calibration,
                        {m.strip() for m in args.hold_out.split(",") if m.strip()}, args.out_dir, args.tokens,
                        args.start_pos, args.context)
        return 0
    report(Path(args.measured), args.calibration, args.gpu, args.out_dir, args.baseline_calibration,
           args.baseline_label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
