"""The GPU stage behind the fidelity report and the eager knob report: one interleaved run of the
cuda executor over the union of both matrices (``benchmarks/sim_fidelity.py``'s strategies and
``benchmarks/eager_knobs.py``'s eager knobs, alone and stacked) on the fidelity report's model
shapes (full size; qwen3-next, qwen3-30b-a3b and gpt-oss-20b at 8 layers), written as JSON lines.

    # on the GPU (stage `fidelity` of benchmarks/gpu_fidelity_run.sh)
    python benchmarks/decode_matrix.py --out $OUT/decode_matrix_h200.jsonl --budget 270
    # anywhere, from the file
    python benchmarks/sim_fidelity.py report data/bench/decode_matrix_h200.jsonl
    python benchmarks/eager_knobs.py report --measured data/bench/decode_matrix_h200.jsonl
    python -m workbench.exec.fit_eager --measured data/bench/decode_matrix_h200.jsonl \\
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


def matrix() -> list[MatrixModel]:
    """Each fidelity model shape with its fidelity strategies and every eager knob (by label,
    each once)."""
    out = []
    for m in sim_fidelity.matrix():
        sts = {st.label(): st for st in (*m.strategies, Strategy(), *eager_knobs.KNOBS.values())}
        out.append(MatrixModel(m.spec, tuple(sts.values())))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per model")
    p.add_argument("--budget", type=float, default=270.0, help="start no model after this many seconds")
    a = p.parse_args()
    n = measure_matrix(matrix(), Path(a.out), a.tokens, a.repeats, budget_s=a.budget)
    print(f"wrote {n} cells to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
