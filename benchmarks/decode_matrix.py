"""The GPU stage behind the fidelity report and the eager knob report: one interleaved run of the
cuda executor over the union of both matrices (``benchmarks/sim_fidelity.py``'s strategies and
``benchmarks/eager_knobs.py``'s eager knobs, alone and stacked) on the fidelity report's model
shapes (full size; qwen3-next, qwen3-30b-a3b and gpt-oss-20b at 8 layers), written as JSON lines.

    # on the GPU, first on a fresh machine (a host busy from an earlier run shows in every eager
    # cell): the whole matrix (64 tokens x 9 rounds: about 4 min on an H200), then more runs
    python benchmarks/decode_matrix.py --out $OUT/decode_matrix_h200.jsonl --tokens 64 --repeats 9 --budget 420
    python benchmarks/decode_matrix.py --out $OUT/decode_matrix_h200_eager.jsonl --repeats 7 \\
        --models llama-3.2-1b,qwen3-next-80b-a3b --eager-only
    # anywhere, from the files (several runs of the eager cells are pooled: read_matrices)
    python benchmarks/sim_fidelity.py report data/bench/decode_matrix_h200.jsonl
    python benchmarks/eager_knobs.py report --measured data/bench/decode_matrix_h200.jsonl \\
        data/bench/decode_matrix_h200_run2.jsonl data/bench/decode_matrix_h200_eager.jsonl
    python -m workbench.exec.fit_eager --measured data/bench/decode_matrix_h200.jsonl \\
        data/bench/decode_matrix_h200_run2.jsonl data/bench/decode_matrix_h200_eager.jsonl \\
        --calibration data/calibration/h200.json [--write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import eager_knobs
import sim_fidelity

from workbench.exec.calibrate.decode_matrix import MatrixModel, measure_matrix
from workbench.strategy import Strategy


def matrix(models: set[str] | None = None, eager_only: bool = False) -> list[MatrixModel]:
    """Each fidelity model shape with its fidelity strategies and every eager knob (by label,
    each once); ``models``: only these presets; ``eager_only``: only ``eager`` and the eager knobs
    (more rounds of the cells the eager report holds to 2 pp, in the same time)."""
    out = []
    for m in sim_fidelity.matrix():
        if models and m.spec.model not in models:
            continue
        fidelity = () if eager_only else m.strategies
        sts = {st.label(): st for st in (*fidelity, Strategy(), *eager_knobs.KNOBS.values())}
        out.append(MatrixModel(m.spec, tuple(sts.values())))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per model")
    p.add_argument("--budget", type=float, default=270.0, help="start no model after this many seconds")
    p.add_argument("--models", help="comma-separated presets (default: every model of the fidelity matrix)")
    p.add_argument("--eager-only", action="store_true", help="only eager and the eager knobs")
    a = p.parse_args()
    models = set(a.models.split(",")) if a.models else None
    n = measure_matrix(matrix(models, a.eager_only), Path(a.out), a.tokens, a.repeats, budget_s=a.budget)
    print(f"wrote {n} cells to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
