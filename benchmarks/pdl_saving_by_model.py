"""What PDL saves a kernel under graphs, model by model: the measured matrix against the simulator,
beside the launch grids of the cuda backend's kernels (CPU only: committed data).

Some of the simulator's largest knob misses on an H200 are PDL's (``sim_fidelity_h200.md``). Its
saving per kernel boundary varies little by model (700-800 ns with the calibration of 2026-11-29,
about 535 ns with the one before), while the GPU's differs by model (515-879 ns on the
2026-11-29 matrix). This script prints, per model of a measured decode matrix (``graphs`` ->
``graphs+pdl``):

* the measured and the predicted saving per kernel (us/token saved / kernels a token);
* the cuda backend's real grid sizes for that Plan (``cuda_ops.bind`` without a GPU): mean blocks,
  and the share of kernels with more blocks than ``--wave-blocks`` (one resident wave at 4 blocks
  an SM of a 132-SM GPU by default).

and, from CUPTI timelines of the same models (``kernel_fidelity.py record``), what PDL saves each
kernel's end-to-end step (its end after the previous kernel's end): small kernels as one class,
the large ones (``LARGE_NS`` or longer under graphs) by node with their grids, where the
models differ.

It is a lead for the simulator, not a fit. Output: ``data/bench/pdl_saving_by_model_h200.md``.

Usage::

    python benchmarks/pdl_saving_by_model.py [--matrix data/bench/decode_matrix_h200_s31b.jsonl] \\
        [--predicted data/bench/sim_fidelity_h200.csv] [--timelines data/bench/kernel_timelines_h200_s29.csv.gz] \\
        [--md data/bench/pdl_saving_by_model_h200.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from workbench.exec import cuda_ops  # noqa: E402
from workbench.exec.calibrate.decode_matrix import read_matrix  # noqa: E402
from workbench.models import build_graph, preset  # noqa: E402
from workbench.strategy import Strategy, compile_plan  # noqa: E402
from workbench.trace.analysis import to_markdown  # noqa: E402

PAIR = ("graphs", "graphs+pdl")
#: a kernel at least this long under graphs (ns) is listed by node in the timeline table
LARGE_NS = 4000


def node_blocks(model: str, layers: int | None, context: int, pos: int) -> dict[str, int]:
    """Blocks of every kernel of the cuda backend's ``graphs+pdl`` Plan by node, bound without a GPU."""
    cfg = preset(model, layers=layers, context=context)
    plan = compile_plan(build_graph(cfg, cfg.kv_len(pos)), Strategy(graphs=True, pdl=True))
    return {la.node.name: int(np.prod(cuda_ops.bind(la.node, lambda v: 1 << 20, lambda key, n: 0).grid))
            for la in plan.launches}


def grid_blocks(model: str, layers: int | None, context: int, pos: int) -> np.ndarray:
    """Blocks of every kernel of the cuda backend's ``graphs+pdl`` Plan, bound without a GPU."""
    return np.array(list(node_blocks(model, layers, context, pos).values()))


def table(matrix: Path, predicted: Path, wave_blocks: int) -> pd.DataFrame:
    _, cells = read_matrix(matrix)
    measured = {(c["label"], c["strategy"]): c for c in cells.to_dict("records")}
    pred = pd.read_csv(predicted)
    predicted_us = {(r.label, r.strategy): r.predicted_us for r in pred.itertuples()}
    rows = []
    for label in dict.fromkeys(cells["label"]):
        if not all((label, s) in measured and (label, s) in predicted_us for s in PAIR):
            continue
        c = measured[(label, PAIR[0])]
        layers = None if pd.isna(c["layers"]) else int(c["layers"])  # the table holds "all layers" as NaN
        blocks = grid_blocks(c["model"], layers, int(c["context"]), int(c["pos"]))
        n = len(blocks)
        saved = measured[(label, PAIR[0])]["us_per_token"] - measured[(label, PAIR[1])]["us_per_token"]
        sim_saved = predicted_us[(label, PAIR[0])] - predicted_us[(label, PAIR[1])]
        rows.append({"model": label, "kernels": n, "measured_ns_per_kernel": round(1e3 * saved / n),
                     "predicted_ns_per_kernel": round(1e3 * sim_saved / n),
                     "mean_blocks": round(float(blocks.mean())),
                     f"share_over_{wave_blocks}_blocks": round(float(np.mean(blocks > wave_blocks)), 3)})
    return pd.DataFrame(rows).sort_values("measured_ns_per_kernel")


def node_savings(timelines: Path) -> pd.DataFrame:
    """One row per kernel of each model's traced token (but its first): what PDL saves its end-to-end
    step, its duration under graphs and its grid's blocks."""
    from kernel_fidelity import steps
    from sim_fidelity import MODELS

    specs = {spec.label: spec for spec, _, _ in MODELS}
    d = pd.read_csv(timelines)
    rows = []
    for label, g in d.groupby("model", sort=False):
        spec = specs[label]
        blocks = node_blocks(spec.model, spec.layers, spec.context, spec.pos)
        a = steps(g[g["strategy"] == PAIR[0]])
        b = steps(g[g["strategy"] == PAIR[1]]).loc[a.index]
        rows.append(pd.DataFrame({"model": label, "node": a.index.str.replace(r"-\d+$", "", regex=True),
                                  "kernel": a["name"].to_numpy(), "blocks": a.index.map(blocks),
                                  "duration_ns": a["dur"].to_numpy(),
                                  "saved_ns": (a["step"] - b["step"]).to_numpy()}).dropna(subset=["saved_ns"]))
    return pd.concat(rows, ignore_index=True)


def timeline_tables(timelines: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per model: small kernels' and large kernels' saving; per large node: its saving and grid)."""
    k = node_savings(timelines)
    large = k["duration_ns"] >= LARGE_NS
    by_model = pd.DataFrame({
        "small_kernels": k[~large].groupby("model", sort=False).size(),
        "small_median_saved_ns": k[~large].groupby("model", sort=False)["saved_ns"].median(),
        "large_kernels": k[large].groupby("model", sort=False).size(),
        "large_saved_us": k[large].groupby("model", sort=False)["saved_ns"].sum() / 1e3,
    }).reset_index()
    by_node = (k[large].groupby(["model", "node", "kernel"], sort=False)
               .agg(n=("saved_ns", "size"), blocks=("blocks", "first"), median_duration_ns=("duration_ns", "median"),
                    median_saved_ns=("saved_ns", "median")).reset_index())
    return by_model, by_node


def markdown(df: pd.DataFrame, matrix: str, predicted: str,
             timelines: tuple[str, pd.DataFrame, pd.DataFrame] | None = None) -> str:
    text = (f"# PDL's saving per kernel under graphs, by model (`{PAIR[0]}` -> `{PAIR[1]}`)\n\n"
            f"Measured: `{matrix}`; predicted: `{predicted}` (the simulator with that report's calibration); "
            "grids: the cuda backend's kernels for the same Plan, bound on the CPU by today's code (the matrix ran "
            "the kernels of its own date). Written by `benchmarks/pdl_saving_by_model.py`.\n\n"
            + to_markdown(df, digits=3) + "\n")
    if timelines is None:
        return text
    name, by_model, by_node = timelines
    return (text + f"\n## Kernel by kernel (`{name}`)\n\n"
            "CUPTI timelines of one token (the settled launch state, `launch_state_h200.md`): what PDL saves each "
            "kernel's end-to-end step (its end after the previous kernel's end, graphs less graphs+pdl; CUPTI "
            f"adds to every kernel, so these run above the wall-clock savings). Kernels shorter than {LARGE_NS} ns "
            "under graphs as one class, the longer ones by node:\n\n"
            + to_markdown(by_model, digits=1) + "\n\n" + to_markdown(by_node, digits=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(ROOT / "data/bench/decode_matrix_h200_s31b.jsonl"))
    ap.add_argument("--predicted", default=str(ROOT / "data/bench/sim_fidelity_h200.csv"))
    ap.add_argument("--timelines", default=str(ROOT / "data/bench/kernel_timelines_h200_s29.csv.gz"),
                    help="CUPTI timelines of the same models (kernel_fidelity.py record); '' for none")
    ap.add_argument("--wave-blocks", type=int, default=4 * 132)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    df = table(Path(args.matrix), Path(args.predicted), args.wave_blocks)
    tl = (Path(args.timelines).name, *timeline_tables(Path(args.timelines))) if args.timelines else None
    text = markdown(df, Path(args.matrix).name, Path(args.predicted).name, tl)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
