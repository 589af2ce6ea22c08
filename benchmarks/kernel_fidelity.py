"""Kernel by kernel: the cuda backend's CUPTI timeline of one token at full size against the
simulator's, for the fidelity report's models (``sim_fidelity.MODELS``) under ``graphs``,
``graphs+pdl`` and ``graphs+fusion``. Where ``sim_fidelity.py`` says a cell or a knob is off,
this says which kernels make it so: per model and strategy the token's GPU span, then per kernel
name the summed step (each kernel's end after the previous end on its stream: what it adds to the
token) and the median duration, measured and simulated, and what PDL saves each kernel
(``graphs`` -> ``graphs+pdl``, step without less step with).

    # GPU machine (about 1 min on an H200): the last traced token's kernels of each run
    python3 benchmarks/kernel_fidelity.py record --out data/bench/kernel_timelines_h200_s29.csv.gz
    # anywhere: against the simulator with a calibration (default: the GPU's shipped file)
    python benchmarks/kernel_fidelity.py report data/bench/kernel_timelines_h200_s29.csv.gz \\
        [--calibration FILE] --md data/bench/kernel_fidelity_h200.md

CUPTI traces every kernel of a graph replay here, which adds a little to each (``cupti_kernel_ns``
in the calibration's sources); spans and durations are the traced ones.

``report`` also reads session 28's llama-3.2-1b trace of llama.cpp's fusion set on the cuda
backend (``fusion_trace_1b_h200_s28.csv.gz``: graphs, implicit sync, PDL off / on, fusion none /
llama.cpp's set), where the simulator's fused kernels of that set can be checked one by one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_fidelity import MODELS, STRATEGIES  # noqa: E402

import workbench  # noqa: E402
from workbench.llamacpp.switches import LLAMACPP_FUSION  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402
from workbench.trace import rebased  # noqa: E402
from workbench.trace.analysis import to_markdown  # noqa: E402

#: the strategies compared: graph replay alone, with PDL, with every fusion
RUNS = ("graphs", "graphs+pdl", "graphs+fusion")
COLUMNS = ["model", "strategy", "node", "name", "start_ns", "end_ns", "stream"]


#: the runs of a fusion trace (columns ``fusion``, ``pdl``), keyed by those columns' values
FUSION_TRACE_RUNS: dict[tuple[str, bool], tuple[str, Strategy]] = {
    (fusion, pdl): ("graphs" + ("+pdl" if pdl else "") + ("+llamacpp-fusion" if fusion != "none" else ""),
                    Strategy(graphs=True, pdl=pdl, sync="implicit",
                             fusion=LLAMACPP_FUSION if fusion != "none" else frozenset()))
    for fusion in ("none", "llamacpp-set") for pdl in (False, True)}
FUSION_TRACE_MODEL = "llama-3.2-1b/ctx512/pos448"


def from_fusion_trace(d: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Strategy]]:
    """A fusion trace's last token of each run as ``compare`` reads a ``record`` CSV, and the
    Strategies its runs name."""
    out = []
    for (fusion, pdl), g in d.groupby(["fusion", "pdl"], sort=False):
        name, _ = FUSION_TRACE_RUNS[(fusion, bool(pdl))]
        out.append(g[g["token"] == g["token"].max()].assign(model=FUSION_TRACE_MODEL, strategy=name))
    return pd.concat(out, ignore_index=True)[COLUMNS], dict(FUSION_TRACE_RUNS.values())


def last_token_kernels(events: pd.DataFrame) -> pd.DataFrame:
    """The kernels of a timeline's last token, in start order."""
    k = events[(events["kind"] == "kernel") & (events["token"] == events["token"].max())]
    return k.sort_values("start_ns", kind="stable")


def record(out: Path, tokens: int = 8, budget_s: float = 300.0) -> None:
    """Trace each model under each strategy on the cuda backend (GPU) and write the last token's
    kernels; no model starts after ``budget_s``."""
    rows, t0 = [], time.time()
    for spec, _, _ in MODELS:
        if time.time() - t0 > budget_s:
            break
        for name in RUNS:
            r = workbench.run(spec.config(), STRATEGIES[name], tokens=tokens, start_pos=spec.pos, backend="cuda",
                              trace=True, quiet=True)
            k = last_token_kernels(r.trace.events).assign(model=spec.label, strategy=name)
            rows.append(k[COLUMNS])
            print(f"{spec.label} {name}: {len(k)} kernels, span {(k.end_ns.max() - k.start_ns.min()) / 1e3:.1f} us "
                  f"[{time.time() - t0:.0f} s]", flush=True)
        pd.concat(rows).to_csv(out, index=False)


def steps(k: pd.DataFrame) -> pd.DataFrame:
    """Per node: kernel name, duration and step (end after the previous end on its stream)."""
    k = rebased(k).sort_values("start_ns", kind="stable")
    end = k["end_ns"]
    return pd.DataFrame({"node": k["node"].to_numpy(), "name": k["name"].to_numpy(),
                         "dur": (k["end_ns"] - k["start_ns"]).to_numpy(),
                         "step": (end - end.groupby(k["stream"]).shift(1)).to_numpy()}).set_index("node")


def compare(measured: pd.DataFrame, calibration: str | None, gpu: str,
            strategies: dict[str, Strategy] | None = None) -> pd.DataFrame:
    """Per model, strategy and node: measured and simulated duration and step (ns); strategies
    by name from ``strategies`` (default: the fidelity report's)."""
    specs = {spec.label: spec for spec, _, _ in MODELS}
    out = []
    for (label, name), g in measured.groupby(["model", "strategy"], sort=False):
        spec = specs[label]
        r = workbench.run(spec.config(), (strategies or STRATEGIES)[name], tokens=3, start_pos=spec.pos, backend="sim",
                          trace=True, quiet=True, **({"calibration": calibration} if calibration else {"gpu": gpu}))
        sim = last_token_kernels(r.trace.events)
        j = steps(g).join(steps(sim).drop(columns="name").add_suffix("_sim"), how="inner")
        span = (g["end_ns"].max() - g["start_ns"].min(), sim["end_ns"].max() - sim["start_ns"].min())
        out.append(j.reset_index().assign(model=label, strategy=name, span=span[0], span_sim=span[1]))
    return pd.concat(out, ignore_index=True)


def tables(cmp: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The report's tables: spans, kernels per model and strategy, PDL's saving per kernel."""
    spans = cmp.groupby(["model", "strategy"], sort=False).agg(
        kernels=("node", "size"), span_us=("span", "first"), span_sim_us=("span_sim", "first")).reset_index()
    spans[["span_us", "span_sim_us"]] /= 1e3
    spans["error_pct"] = 100 * (spans["span_sim_us"] / spans["span_us"] - 1)
    per = cmp.groupby(["model", "strategy", "name"], sort=False).agg(
        n=("node", "size"), step_us=("step", "sum"), step_sim_us=("step_sim", "sum"),
        median_dur_ns=("dur", "median"), median_dur_sim_ns=("dur_sim", "median")).reset_index()
    per[["step_us", "step_sim_us"]] /= 1e3
    per["diff_us"] = per["step_sim_us"] - per["step_us"]
    key = ["model", "node"]
    plain = cmp[cmp["strategy"] == "graphs"].set_index(key)
    pdl = cmp[cmp["strategy"] == "graphs+pdl"].set_index(key)
    both = plain[["name", "step", "step_sim"]].join(pdl[["step", "step_sim"]].add_suffix("_pdl"), how="inner")
    both = both.assign(saving=both["step"] - both["step_pdl"], saving_sim=both["step_sim"] - both["step_sim_pdl"])
    pdl_t = both.reset_index().groupby(["model", "name"], sort=False).agg(
        n=("node", "size"), median_saving_ns=("saving", "median"), median_saving_sim_ns=("saving_sim", "median"),
        saving_us=("saving", "sum"), saving_sim_us=("saving_sim", "sum")).reset_index()
    pdl_t[["saving_us", "saving_sim_us"]] /= 1e3
    return {"spans": spans, "kernels": per, "pdl": pdl_t}


def markdown(t: dict[str, pd.DataFrame], source: str, calibration: str) -> str:
    big = t["kernels"][t["kernels"]["diff_us"].abs() >= 10].sort_values(["model", "strategy", "diff_us"])
    pdl = t["pdl"][(t["pdl"]["saving_us"] - t["pdl"]["saving_sim_us"]).abs() >= 10]
    return "\n".join([
        "# Kernel by kernel: the cuda backend's timeline against the simulator's", "",
        f"Measured: `{source}` (CUPTI, the last traced token of each run, full-size models); "
        f"simulated: {calibration}. Written by `benchmarks/kernel_fidelity.py report`.", "",
        "## One token's GPU span", "", to_markdown(t["spans"].round(1)), "",
        "## Kernels whose summed step differs by 10 us or more (simulated - measured)", "",
        to_markdown(big.round(1)), "",
        "## What PDL saves a kernel (`graphs` -> `graphs+pdl`), where measured and simulated totals differ by 10 us or "
        "more", "", to_markdown(pdl.round(1)), ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="trace the runs on the cuda backend (GPU)")
    r.add_argument("--out", required=True, help="CSV (.csv.gz) of the last token's kernels")
    r.add_argument("--budget", type=float, default=300.0, help="start no model after this many seconds")
    p = sub.add_parser("report", help="compare with the simulator (CPU)")
    p.add_argument("measured", help="the CSV of `record` (or a fusion trace)")
    p.add_argument("--calibration", help="calibration file (default: --gpu's shipped one)")
    p.add_argument("--gpu", default="h200")
    p.add_argument("--md", help="write the report here (default: print it)")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        record(Path(a.out), budget_s=a.budget)
        return 0
    measured, strategies = pd.read_csv(a.measured), None
    if "fusion" in measured.columns:
        measured, strategies = from_fusion_trace(measured)
    cmp = compare(measured, a.calibration, a.gpu, strategies)
    cal = f"`{Path(a.calibration).name}`" if a.calibration else f"`data/calibration/{a.gpu}.json`"
    md = markdown(tables(cmp), Path(a.measured).name, cal)
    if a.md:
        Path(a.md).write_text(md)
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
