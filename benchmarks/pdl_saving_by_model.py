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

It is a lead for the simulator, not a fit. Output: ``data/bench/pdl_saving_by_model_h200.md``.

Usage::

    python benchmarks/pdl_saving_by_model.py [--matrix data/bench/decode_matrix_h200_s28.jsonl] \\
        [--predicted data/bench/sim_fidelity_h200.csv] [--md data/bench/pdl_saving_by_model_h200.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec import cuda_ops  # noqa: E402
from workbench.exec.calibrate.decode_matrix import read_matrix  # noqa: E402
from workbench.models import build_graph, preset  # noqa: E402
from workbench.strategy import Strategy, compile_plan  # noqa: E402
from workbench.trace.analysis import to_markdown  # noqa: E402

PAIR = ("graphs", "graphs+pdl")


def grid_blocks(model: str, layers: int | None, context: int, pos: int) -> np.ndarray:
    """Blocks of every kernel of the cuda backend's ``graphs+pdl`` Plan, bound without a GPU."""
    cfg = preset(model, layers=layers, context=context)
    plan = compile_plan(build_graph(cfg, cfg.kv_len(pos)), Strategy(graphs=True, pdl=True))
    return np.array([int(np.prod(cuda_ops.bind(la.node, lambda v: 1 << 20, lambda key, n: 0).grid))
                     for la in plan.launches])


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


def markdown(df: pd.DataFrame, matrix: str, predicted: str) -> str:
    return (f"# PDL's saving per kernel under graphs, by model (`{PAIR[0]}` -> `{PAIR[1]}`)\n\n"
            f"Measured: `{matrix}`; predicted: `{predicted}` (the simulator with that report's calibration); "
            "grids: the cuda backend's kernels for the same Plan, bound on the CPU by today's code (the matrix ran "
            "the kernels of its own date). Written by `benchmarks/pdl_saving_by_model.py`.\n\n"
            + to_markdown(df, digits=3) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=str(ROOT / "data/bench/decode_matrix_h200_s28.jsonl"))
    ap.add_argument("--predicted", default=str(ROOT / "data/bench/sim_fidelity_h200.csv"))
    ap.add_argument("--wave-blocks", type=int, default=4 * 132)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    df = table(Path(args.matrix), Path(args.predicted), args.wave_blocks)
    text = markdown(df, Path(args.matrix).name, Path(args.predicted).name)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
