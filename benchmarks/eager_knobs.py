"""Eager knob effects, GPU vs simulator: each knob alone on top of ``eager`` (no CUDA graph), its
measured speedup on the ``cuda`` backend beside the simulator's (issue 20).

    # on the GPU: measure (untraced runs of the cuda executor), write JSON
    python benchmarks/eager_knobs.py measure --out $OUT/eager_knobs_h200.json
    # anywhere: simulate the same cells with the shipped calibration, write the report
    python benchmarks/eager_knobs.py report [--measured data/bench/eager_knobs_h200.json]

The report also reads the eager cells already committed: ``gpu_decode.json`` (llama-3.2-1b, all
layers, and qwen3-next-80b-a3b --layers 8; steps 448.. of context 512, median of 10 runs of 64
tokens) and the calibration runs of ``workbench calibrate`` (``calibration_raw_h200.json.gz``).
A knob's speedup is ``t(eager) / t(eager + knob) - 1``, as in the fidelity report. Cells marked
*fitted* are the ones ``python -m workbench.exec.fit_eager`` fitted ``eager_pdl_release_ns`` and
``eager_channel_switch_ns`` to; the others are held out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
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

    @property
    def label(self) -> str:
        return self.model + (f" --layers {self.layers}" if self.layers else "")


# ------------------------------------------------------------------------------------------
# measure (GPU)
# ------------------------------------------------------------------------------------------
def measure(tokens: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    import workbench
    from workbench.exec.calibrate.environment import environment, warm_gpu
    from workbench.exec.cuda import CudaExecutor
    from workbench.models import load_config

    env = environment()
    warm_gpu()
    rows = []
    for model, layers, context, pos in MODELS:
        cfg = load_config(model, layers=layers, context=context)
        first = None  # the model's first executor: the others reuse its weights on the GPU
        for knob, st in {"eager": Strategy(), **KNOBS}.items():
            t0 = time.perf_counter()
            ex = CudaExecutor(cfg, st, "device", seed, share=first)
            first = first or ex
            workbench.run(cfg, st, tokens=4, backend="cuda", seed=seed, start_pos=pos, executor=ex)  # warm-up
            us = [workbench.run(cfg, st, tokens=tokens, backend="cuda", seed=seed, start_pos=pos,
                                executor=ex).stats["us_per_token"] for _ in range(repeats)]
            rows.append({"model": model, "layers": layers, "context": context, "pos": pos, "strategy": knob,
                         "tokens": tokens, "us_per_token": float(np.median(us)), "us_min": float(np.min(us)),
                         "us_max": float(np.max(us)), "runs_us": us})
            print(f"{model:20s} L{layers} {knob:18s} {np.median(us):9.1f} us/token [{np.min(us):.1f}-{np.max(us):.1f}]"
                  f"  {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        del first, ex
    return {"environment": env, "tokens": tokens, "repeats": repeats, "rows": rows}


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


def measured_cells(path: Path, sim_tokens: int = 16) -> list[Cell]:
    data = json.loads(path.read_text())
    df = pd.DataFrame(data["rows"])
    cells = []
    for (model, layers), g in df.groupby(["model", df["layers"].fillna(0)], sort=False):
        us = dict(zip(g["strategy"], g["us_per_token"]))
        r = g.iloc[0]
        for knob in KNOBS:
            if knob in us and "eager" in us:
                cells.append(Cell(f"eager_knobs ({data['environment'].get('date', '')[:10]})", model,
                                  int(layers) or None, int(r["context"]), int(r["pos"]), sim_tokens, knob,
                                  us["eager"], us[knob]))
    return cells


def predict(cells: list[Cell], gpu: str = "h200") -> pd.DataFrame:
    import workbench
    from workbench.exec.calibration import load_calibration
    from workbench.models import load_config

    cal = load_calibration(gpu)
    memo: dict[tuple, float] = {}

    def sim(c: Cell, st: Strategy) -> float:
        key = (c.model, c.layers, c.context, c.pos, c.tokens, st)
        if key not in memo:
            cfg = load_config(c.model, layers=c.layers, context=c.context)
            run = workbench.run(cfg, st, tokens=c.tokens, backend="sim", start_pos=c.pos, calibration=cal)
            memo[key] = run.stats["us_per_token"]
        return memo[key]

    rows = []
    for c in cells:
        e, k = sim(c, Strategy()), sim(c, KNOBS[c.knob])
        meas, pred = 100 * (c.eager_us / c.knob_us - 1), 100 * (e / k - 1)
        rows.append({"source": c.source, "model": c.label, "knob": c.knob,
                     "fitted": (c.source, c.knob) in FITTED,
                     "eager_us": c.eager_us, "knob_us": c.knob_us, "sim_eager_us": e, "sim_knob_us": k,
                     "measured_pct": meas, "simulated_pct": pred, "diff_pp": pred - meas})
    return pd.DataFrame(rows)


def _md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        out.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(out) + "\n"


def report(measured: Path | None, out_dir: Path, gpu: str = "h200", before: Path | None = None) -> pd.DataFrame:
    cells = committed_cells() + (measured_cells(measured) if measured else [])
    df = predict(cells, gpu)
    cols = ["source", "model", "knob", "fitted", "eager_us", "knob_us", "sim_eager_us", "sim_knob_us",
            "measured_pct", "simulated_pct", "diff_pp"]
    if before is not None:  # another simulator's report of the same cells (e.g. before issue 20)
        b = pd.read_csv(before)[["source", "model", "knob", "diff_pp"]].rename(columns={"diff_pp": "before_pp"})
        df = df.merge(b, on=["source", "model", "knob"], how="left")
        cols.append("before_pp")
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / f"eager_knobs_{gpu}.csv", index=False)
    within = (df["diff_pp"].abs() <= 2).sum()
    text = [f"# Eager knob effects: GPU vs simulator ({gpu})\n\n",
            "Generated by `python benchmarks/eager_knobs.py report`"
            + (f" with `{measured}`" if measured else "") + f", simulated with `data/calibration/{gpu}.json`. "
            "Measured: the `cuda` backend on an H200 (Python host, untraced): `gpu_decode.json` "
            "(2026-11-21, median of 10 runs of 64 tokens, steps 448..511), the calibration runs of "
            "`calibration_raw_h200.json.gz` (2026-11-21, 12 tokens from step 0)"
            + (", and the measured file above" if measured else "") + ". Speedup = t(eager) / t(eager + knob) - 1. "
            + (f"`before_pp`: diff_pp of the simulator in `{before}`. " if before is not None else "") +
            "*fitted*: the cells `python -m workbench.exec.fit_eager` fitted `eager_pdl_release_ns` and "
            "`eager_channel_switch_ns` to (the others are held out).\n\n",
            f"{within} of {len(df)} knob effects within 2 pp.\n\n",
            _md(df[cols])]
    (out_dir / f"eager_knobs_{gpu}.md").write_text("".join(text))
    print("".join(text))
    return df


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the eager knobs on this GPU (untraced) and write JSON")
    m.add_argument("--out", required=True)
    m.add_argument("--tokens", type=int, default=32)
    m.add_argument("--repeats", type=int, default=5)
    r = sub.add_parser("report", help="simulate the cells and write the report to data/bench/")
    r.add_argument("--measured", type=Path, help="JSON of `measure` (more cells)")
    r.add_argument("--gpu", default="h200")
    r.add_argument("--before", type=Path, help="CSV of another report of the same cells: its diff_pp beside")
    r.add_argument("--out-dir", type=Path, default=BENCH)
    args = p.parse_args()
    if args.cmd == "measure":
        Path(args.out).write_text(json.dumps(measure(args.tokens, args.repeats), indent=1))
        return 0
    report(args.measured, args.out_dir, args.gpu, args.before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
