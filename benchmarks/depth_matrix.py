"""One model at several depths, graphs and graphs + PDL, untraced and interleaved (GPU): does a
deeper token (more bytes read) make each kernel slower, and does PDL hide it?

CUPTI says the gap between a graph's kernels rises from 256 to 416 ns once a token reads about
2.9 GB (`data/bench/calibration_h200_s37_fullsize.md`). If the untraced GPU paid it too, the
untraced time per layer would rise by that much a kernel above the threshold, and PDL's saving a
kernel would rise with it if PDL hides it. The simulator's prediction of each cell is printed
beside it (the shipped calibration, which has no such step).

Usage (GPU, then anywhere)::

    python benchmarks/depth_matrix.py measure --out data/bench/depth_matrix_8b_h200.jsonl
    python benchmarks/depth_matrix.py report data/bench/depth_matrix_8b_h200.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.calibrate.decode_matrix import MatrixModel, measure_matrix  # noqa: E402
from workbench.exec.calibrate.specs import ModelSpec  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402

PAIR = (Strategy(graphs=True), Strategy(graphs=True, pdl=True))


def report(path: Path) -> str:
    """Markdown: measured and simulated us/token of each depth and PDL's saving a kernel."""
    import workbench
    from workbench.exec.calibration import load_calibration
    from workbench.models import build_graph

    cal = load_calibration("h200")
    cells = [json.loads(line) for line in path.read_text().splitlines() if '"kind": "cell"' in line]
    by: dict[tuple[str, int, int, int], dict[str, float]] = {}
    for c in cells:
        by.setdefault((c["model"], c["layers"], c["context"], c["pos"]), {})[c["strategy"]] = c["us_per_token"]
    out = ["| model | layers | GB a token | kernels | graphs | graphs+pdl | saving a kernel (ns) | sim graphs | "
           "sim graphs+pdl | sim saving a kernel (ns) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (model, layers, context, pos), v in sorted(by.items()):
        spec = ModelSpec(model, layers, context, pos)
        sim = [workbench.run(spec.config(), st, tokens=64, backend="sim", start_pos=pos, calibration=cal, quiet=True)
               for st in PAIR]
        k = sim[0].stats["kernels_per_token"]
        cfg = spec.config()
        gb = sum(n.bytes for n in build_graph(cfg, cfg.kv_len(pos)).nodes) / 1e9
        g, p = (v[st.label()] for st in PAIR)
        sg, sp = (r.stats["us_per_token"] for r in sim)
        out.append(f"| {model} | {layers} | {gb:.2f} | {k:.0f} | {g:.1f} | {p:.1f} | {1e3 * (g - p) / k:.0f} | "
                   f"{sg:.1f} | {sp:.1f} | {1e3 * (sg - sp) / k:.0f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--model", default="llama-3.1-8b")
    m.add_argument("--layers", default="2,3,4,6,8,12")
    m.add_argument("--context", type=int, default=1024)
    m.add_argument("--pos", type=int, default=600)
    m.add_argument("--tokens", type=int, default=64)
    m.add_argument("--repeats", type=int, default=9)
    r = sub.add_parser("report")
    r.add_argument("measured", type=Path)
    a = p.parse_args()
    if a.cmd == "measure":
        models = [MatrixModel(ModelSpec(a.model, int(L), a.context, a.pos), PAIR) for L in a.layers.split(",")]
        measure_matrix(models, a.out, a.tokens, a.repeats, budget_s=400)
    else:
        print(report(a.measured), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
