"""Eager knob effects, GPU vs simulator: each knob alone on top of ``eager`` (no CUDA graph), its
measured effect on the ``cuda`` backend beside the simulator's (issue 20).

    # on the GPU: measure (untraced runs of the cuda executor, interleaved), write JSON lines
    python benchmarks/eager_knobs.py measure --out $OUT/eager_knobs_h200.jsonl
    # anywhere: simulate the same cells with the shipped calibration, write the report
    python benchmarks/eager_knobs.py report [--measured data/bench/decode_matrix_h200.jsonl]

With ``--measured`` (this script's ``measure`` or ``benchmarks/decode_matrix.py``'s, which also
holds the fidelity matrix: one interleaved run, so every knob is compared with an ``eager`` run
of the same minutes) the report reads that file alone. Without it, it reads the eager cells
already committed: ``gpu_decode.json`` (llama-3.2-1b, all layers, and qwen3-next-80b-a3b
--layers 8; steps 448.. of context 512, median of 10 runs of 64 tokens) and the calibration runs
of ``workbench calibrate`` (``calibration_raw_h200.json.gz``), taken at different times.
A knob's effect is the change in us/token, ``t(eager + knob) / t(eager) - 1`` (negative: faster;
``decode_matrix.effect_pct``), as in the fidelity report. Cells marked
*fitted* are the ones ``python -m workbench.exec.fit_eager`` fitted ``eager_pdl_release_ns`` and
``eager_channel_switch_ns`` to; the others are held out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.strategy import Strategy

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "data" / "bench"

#: knob -> the strategy ``eager`` + that knob
KNOBS: dict[str, Strategy] = {
    "pdl": Strategy(pdl=True),
    "qkv+stream-aware": Strategy(streams="qkv", allocator="stream-aware"),
    "qkv+boundary": Strategy(streams="qkv", sync="boundary"),
    "boundary": Strategy(sync="boundary"),
    "implicit": Strategy(sync="implicit"),
    "copy-elim": Strategy(fusion=frozenset({"copy-elim"})),
    "pdl+qkv+implicit": Strategy(pdl=True, streams="qkv", sync="implicit", allocator="stream-aware"),
}
#: (model, layers, context, first step): the shapes of the issue's acceptance
MODELS = (("llama-3.2-1b", None, 512, 448), ("qwen3-next-80b-a3b", 8, 512, 448))
#: gpu_decode.json's rows (``benchmarks/gpu_decode.py``'s ``alone()``) -> knob
DECODE_ROWS = {"pdl": "pdl", "qkv": "qkv+stream-aware", "boundary": "boundary", "implicit": "implicit",
               "copy-elim": "copy-elim"}
#: calibration strategies -> knob
CALIBRATION_ROWS = {"eager+pdl": "pdl", "eager+qkv+boundary": "qkv+boundary"}
FITTED = {("calibrate", "pdl"), ("calibrate", "qkv+boundary"), ("gpu_decode", "pdl"),
          ("gpu_decode", "qkv+stream-aware")}
#: in a measured file (``fit_eager --measured``): the knobs whose cells the fit uses
FITTED_KNOBS = {"pdl", "qkv+boundary", "qkv+stream-aware"}


@dataclass(frozen=True)
class Cell:
    source: str
    model: str
    layers: int | None
    context: int | None
    pos: int
    tokens: int
    knob: str
    eager_us: float
    knob_us: float
    #: the measured effect's spread (%), where the file has it (``decode_matrix.knob_effect``)
    lo: float = float("nan")
    hi: float = float("nan")
    #: the measured effect (%) where it is not knob_us / eager_us - 1: the median of the rounds'
    #: own effects (``decode_matrix.knob_effect``)
    effect: float = float("nan")

    @property
    def label(self) -> str:
        return self.model + (f" --layers {self.layers}" if self.layers else "")


# ------------------------------------------------------------------------------------------
# measure (GPU)
# ------------------------------------------------------------------------------------------
def matrix(models=MODELS) -> list:
    """The measured cells: ``eager`` and each knob on top of it, per model shape."""
    from workbench.exec.calibrate.decode_matrix import MatrixModel
    from workbench.exec.calibrate.specs import ModelSpec

    return [MatrixModel(ModelSpec(*m), (Strategy(), *KNOBS.values())) for m in models]


# ------------------------------------------------------------------------------------------
# report (CPU)
# ------------------------------------------------------------------------------------------
def committed_cells(sim_tokens: int = 16) -> list[Cell]:
    """The eager cells of gpu_decode.json and of the H200 calibration runs."""
    cells = []
    decode = json.loads((BENCH / "gpu_decode.json").read_text())
    for key, rows in decode.items():
        if not isinstance(rows, dict) or "default" not in rows:
            continue
        model, _, layers = key.partition("-L")
        for row, knob in DECODE_ROWS.items():
            if row in rows and rows[row]["strategy"].startswith("eager"):
                cells.append(Cell("gpu_decode", model, int(layers) if layers.isdigit() else None, 512, 448, sim_tokens,
                                  knob, rows["default"]["us_per_token_median"], rows[row]["us_per_token_median"]))
    with gzip.open(BENCH / "calibration_raw_h200.json.gz", "rt") as f:
        raw = json.load(f)
    runs = {(r["model"], r["strategy"]): r for r in raw["runs"]}
    for (m, strategy), r in runs.items():
        if strategy in CALIBRATION_ROWS and (m, "eager") in runs:
            cells.append(Cell("calibrate", r["spec_model"], r["spec_layers"], r["spec_context"], r["spec_pos"],
                              r["tokens"], CALIBRATION_ROWS[strategy], runs[(m, "eager")]["untraced_us_per_token"],
                              r["untraced_us_per_token"]))
    return cells


def measured_cells(paths: Sequence[Path], sim_tokens: int = 16) -> list[Cell]:
    """Each knob's cell on each model shape of a measured file that holds it beside ``eager``
    (several files: pooled, ``decode_matrix.read_matrices``)."""
    from workbench.exec.calibrate.decode_matrix import knob_effect, read_matrices, runs_label

    env, df = read_matrices(paths)
    source = runs_label(paths)
    by_label = {st.label(): knob for knob, st in KNOBS.items()}
    df["knob"] = df["strategy"].map(lambda x: by_label.get(x, x))  # older files: the knob's name
    cells = []
    for (model, layers), g in df.groupby(["model", df["layers"].fillna(0)], sort=False):
        by = g.set_index("knob")
        r = g.iloc[0]
        for knob in KNOBS:
            if knob in by.index and "eager" in by.index:
                e, k = by.loc["eager"], by.loc[knob]
                effect = knob_effect(e, k) if "us_min" in by else (float("nan"),) * 3
                cells.append(Cell(f"{source} ({str(env.get('date', ''))[:10]})", model,
                                  int(layers) or None, int(r["context"]), int(r["pos"]), sim_tokens, knob,
                                  float(e["us_per_token"]), float(k["us_per_token"]), effect[1], effect[2],
                                  effect[0]))
    return cells


def predict(cells: list[Cell], gpu: str = "h200") -> pd.DataFrame:
    import workbench
    from workbench.exec.calibrate.decode_matrix import effect_pct
    from workbench.exec.calibration import load_calibration
    from workbench.models import load_config

    cal = load_calibration(gpu)
    memo: dict[tuple, dict] = {}

    def sim(c: Cell, st: Strategy) -> dict:
        key = (c.model, c.layers, c.context, c.pos, c.tokens, st)
        if key not in memo:
            cfg = load_config(c.model, layers=c.layers, context=c.context)
            run = workbench.run(cfg, st, tokens=c.tokens, backend="sim", start_pos=c.pos, calibration=cal)
            memo[key] = run.stats
        return memo[key]

    rows = []
    for c in cells:
        se = sim(c, Strategy())
        e, k = se["us_per_token"], sim(c, KNOBS[c.knob])["us_per_token"]
        meas = c.effect if c.effect == c.effect else effect_pct(c.eager_us, c.knob_us)
        pred = effect_pct(e, k)
        fitted = (c.source, c.knob) in FITTED or (c.source not in ("calibrate", "gpu_decode")
                                                   and c.knob in FITTED_KNOBS)
        rows.append({"source": c.source, "model": c.label, "knob": c.knob, "fitted": fitted,
                     "eager_us": c.eager_us, "knob_us": c.knob_us, "sim_eager_us": e, "sim_knob_us": k,
                     "launches": se["launches_per_token"], "host_launch_ns": cal.host.launch_ns,
                     "host_pdl_saving_ns": cal.host.launch_ns - cal.host.launch_pdl_ns,
                     "measured_pct": meas, "measured_lo": c.lo, "measured_hi": c.hi, "simulated_pct": pred,
                     "diff_pp": pred - meas})
    return pd.DataFrame(rows)


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        out.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(out) + "\n"


def report(measured: Path | Sequence[Path] | None, out_dir: Path, gpu: str = "h200",
           before: Path | None = None) -> pd.DataFrame:
    from workbench.exec.calibrate.decode_matrix import cold_run_note, read_matrices

    if isinstance(measured, (str, Path)):
        measured = [Path(measured)]

    cells = measured_cells(measured) if measured else committed_cells()
    df = predict(cells, gpu)
    cols = ["source", "model", "knob", "fitted", "eager_us", "knob_us", "sim_eager_us", "sim_knob_us",
            "measured_pct", *(["measured_lo", "measured_hi"] if measured else []), "simulated_pct", "diff_pp"]
    if before is not None:  # another simulator's report of the same cells (e.g. before issue 20)
        b = pd.read_csv(before)[["source", "model", "knob", "diff_pp"]].rename(columns={"diff_pp": "before_pp"})
        df = df.merge(b, on=["source", "model", "knob"], how="left")
        cols.append("before_pp")
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / f"eager_knobs_{gpu}.csv", index=False)
    within = (df["diff_pp"].abs() <= 2).sum()
    noop = df[df["sim_eager_us"] == df["sim_knob_us"]]  # the knob leaves the Plan's timing unchanged
    control = ("Control: knobs that leave this model's simulated time unchanged (0.0 %) measured "
               + ", ".join(f"{r.model} {r.knob} {r.measured_pct:+.1f} %" for r in noop.itertuples())
               + ": the drift between the runs compared, which the 2 pp target sits on.\n\n") if len(noop) else ""
    text = [f"# Eager knob effects: GPU vs simulator ({gpu})\n\n",
            "Generated by `python benchmarks/eager_knobs.py report`"
            + (f" --measured {' '.join(map(str, measured))}" if measured else "")
            + f", simulated with `data/calibration/{gpu}.json`. "
            "Measured: the `cuda` backend on an H200 (Python host, untraced): "
            + (_measured_note(measured) if measured else
               "`gpu_decode.json` (2026-11-21, median of 10 runs of 64 tokens, steps 448..511), the calibration "
               "runs of `calibration_raw_h200.json.gz` (2026-11-21, 12 tokens from step 0)")
            + ". " + (cold_run_note(read_matrices(measured)[0]) if measured else "")
            + "Effect = t(eager + knob) / t(eager) - 1 (negative: faster). "
            + (f"`before_pp`: diff_pp of the simulator in `{before}`. " if before is not None else "") +
            "*fitted*: the cells `python -m workbench.exec.fit_eager` fitted `eager_pdl_release_ns` and "
            "`eager_channel_switch_ns` to (the others are held out)"
            + (" when the calibration was fitted with `--measured` on these files; `measured_pct`: the median "
               "of the rounds' own effects (each round times eager and the knob back to back), `measured_lo`/"
               "`measured_hi`: their min-max" + (" (pooled: the runs')" if len(measured) > 1 else "")
               + " (`decode_matrix.knob_effect`)" if measured else "") + ".\n\n",
            f"{within} of {len(df)} knob effects within 2 pp.\n\n", control,
            _md(df[cols]), _host_table(df)]
    (out_dir / f"eager_knobs_{gpu}.md").write_text("".join(text))
    print("".join(text))
    return df


def _measured_note(paths: Sequence[Path]) -> str:
    """What the measured columns are: one interleaved run, or several pooled."""
    if len(paths) == 1:
        return f"`{paths[0]}` (one interleaved run, median over rounds)"
    return (f"{len(paths)} interleaved runs of the same session ("
            + ", ".join(f"`{p}`" for p in paths) + "), pooled per cell: `eager_us` is eager's median over the "
            "runs and a knob's effect the median of its per-run effects (`decode_matrix.read_matrices`)")


def _host_table(df: pd.DataFrame) -> str:
    """Per model: eager us/token per kernel launch, measured and simulated, beside the calibrated
    host's cost of one launch. Where the measured value sits at the host's issue rate on every
    small model alike, the host, not the GPU, set the eager cells of that run."""
    e = df.drop_duplicates("model").set_index("model")
    pdl = df[df["knob"] == "pdl"].set_index("model")["knob_us"].reindex(e.index)
    t = pd.DataFrame({"model": e.index, "launches per token": e["launches"],
                      "measured eager ns/launch": 1e3 * e["eager_us"] / e["launches"],
                      "simulated eager ns/launch": 1e3 * e["sim_eager_us"] / e["launches"],
                      "calibrated host launch_ns": e["host_launch_ns"],
                      "measured eager - eager+pdl ns/launch": 1e3 * (e["eager_us"] - pdl) / e["launches"],
                      "calibrated launch_ns - launch_pdl_ns": e["host_pdl_saving_ns"]})
    return ("\nEager us/token per kernel launch (the host issues one launch per kernel), beside the calibrated "
            "host profile's cost of one launch and what a PDL launch saves the host; a host-bound model's "
            "eager+pdl saves the host's difference per launch, a device-bound one the GPU's gap:\n\n" + _md(t))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the eager knobs on this GPU (untraced) and write JSON lines")
    m.add_argument("--out", required=True)
    m.add_argument("--tokens", type=int, default=32)
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--budget", type=float, help="start no model after this many seconds")
    r = sub.add_parser("report", help="simulate the cells and write the report to data/bench/")
    r.add_argument("--measured", type=Path, nargs="+",
                   help="JSON lines of `measure` or benchmarks/decode_matrix.py; several runs are pooled")
    r.add_argument("--gpu", default="h200")
    r.add_argument("--before", type=Path, help="CSV of another report of the same cells: its diff_pp beside")
    r.add_argument("--out-dir", type=Path, default=BENCH)
    args = p.parse_args()
    if args.cmd == "measure":
        from workbench.exec.calibrate.decode_matrix import measure_matrix

        measure_matrix(matrix(), Path(args.out), args.tokens, args.repeats, budget_s=args.budget)
        return 0
    report(args.measured, args.out_dir, args.gpu, args.before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
