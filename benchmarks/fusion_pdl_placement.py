"""llama.cpp's fusion set's effect on the ``cuda`` backend under each PDL placement (issue 15).

Our kernels issue their first weight loads before their PDL wait (``first-read``) and signal the
next kernel at their start by default; llama.cpp's wait first thing and its mat-vecs signal after
their main loop. The fusions remove kernels whose launch PDL partly hides already, so the
fusion effect depends on the placement: this measures it for each (wait, signal) pair, fusion on
against off (``llamacpp_peer.CONFIGS``' ``no_fusion`` / ``default`` Strategies, placement
replaced), PDL off beside them. One interleaved run (``decode_matrix.measure_model``): the effect
is the median of the rounds' own effects (``decode_matrix.knob_effect``), spread their min-max.
The same runs give what a wait at the kernel's start costs against one at first-read, per kernel:
the H200 calibration's ``pdl_first_read_setup_ns`` (data/bench/pdl_placement_fusion_h200_s32.md).

    python3 benchmarks/fusion_pdl_placement.py measure --out $OUT/pdl_fusion_grid.jsonl \\
        [--models llama-3.2-1b,llama-3.1-8b]                                          # GPU
    python3 benchmarks/fusion_pdl_placement.py report data/bench/pdl_fusion_grid_1b_h200_s32.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from llamacpp_peer import CONFIGS  # noqa: E402

from workbench.exec.calibrate.decode_matrix import MatrixModel, effect_pct, knob_effect, read_matrix  # noqa: E402
from workbench.exec.calibrate.specs import ModelSpec  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402

#: (wait, signal) pairs measured; ("start", "after-main-loop") is llama.cpp's mat-vec placement
PLACEMENTS = (("first-read", "start"), ("first-read", "after-main-loop"), ("start", "after-main-loop"),
              ("start", "start"))


def pairs() -> list[tuple[str, Strategy, Strategy]]:
    """(placement, fusion off, fusion on): PDL off first, then each of PLACEMENTS."""
    off, on = CONFIGS["no_fusion"][0], CONFIGS["default"][0]
    out = [("PDL off", CONFIGS["graphs"][0], CONFIGS["pdl0"][0])]
    for wait, trig in PLACEMENTS:
        out.append((f"{wait}, {trig}", off.with_(pdl_wait=wait, pdl_trigger=trig),
                    on.with_(pdl_wait=wait, pdl_trigger=trig)))
    return out


def measure(out: Path, specs: list[ModelSpec], tokens: int, rounds: int, budget_s: float | None = None) -> None:
    """Each model's cells, one interleaved run a model (``decode_matrix.measure_matrix``)."""
    from workbench.exec.calibrate.decode_matrix import measure_matrix

    sts = tuple(st for _, a, b in pairs() for st in (a, b))
    measure_matrix([MatrixModel(spec, sts) for spec in specs], out, tokens, rounds, budget_s=budget_s)


def report(path: Path, cal=None) -> str:
    """The table per model; with ``cal`` (a Calibration), the simulator's us/token of each cell
    and its fusion effect beside the measured ones."""
    env, df = read_matrix(path)
    lines = [f"{env['gpu_name']}, driver {env.get('driver_version', '?')}, {str(env.get('date', ''))[:10]}, "
             f"{env['repeats']} rounds of {env['tokens']} tokens (`{path.name}`)"]
    for label, g in df.groupby("label", sort=False):
        by = g.set_index("strategy")
        spec = ModelSpec(g["model"].iloc[0], None if g["layers"].isna().iloc[0] else int(g["layers"].iloc[0]),
                         int(g["context"].iloc[0]), int(g["pos"].iloc[0]))
        sim = cal is not None
        lines += ["", f"**{label}**", "",
                  "| our PDL placement (wait, signal) | fusion off | llama.cpp's fusion set "
                  "| fusion effect [rounds' min..max] |" + (" simulated: off / on / effect |" if sim else ""),
                  "|---|---:|---:|---:|" + ("---:|" if sim else "")]
        for name, a, b in pairs():
            if a.label() not in by.index or b.label() not in by.index:
                continue
            m, lo, hi = knob_effect(by.loc[a.label()], by.loc[b.label()])
            row = (f"| {name} | {by.at[a.label(), 'us_per_token']:.1f} | {by.at[b.label(), 'us_per_token']:.1f} "
                   f"| {m:+.1f} % [{lo:+.1f}..{hi:+.1f}] |")
            if sim:
                pa, pb = (simulated_us(spec, st, int(g["tokens"].iloc[0]), cal) for st in (a, b))
                row += f" {pa:.1f} / {pb:.1f} / {effect_pct(pa, pb):+.1f} % |"
            lines.append(row)
    return "\n".join(lines) + "\n"


def simulated_us(spec: ModelSpec, strategy: Strategy, tokens: int, cal) -> float:
    import workbench

    return float(workbench.run(spec.config(), strategy, tokens=tokens, backend="sim", start_pos=spec.pos,
                               calibration=cal, quiet=True).stats["us_per_token"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--models", default="llama-3.2-1b", help="comma-separated presets (full size, context 512)")
    m.add_argument("--tokens", type=int, default=64)
    m.add_argument("--rounds", type=int, default=7)
    m.add_argument("--budget", type=float, default=None, help="start no model after this many seconds")
    r = sub.add_parser("report")
    r.add_argument("path", type=Path)
    r.add_argument("--gpu", help="also simulate each cell with this GPU's calibration (h200, h100)")
    a = p.parse_args()
    if a.cmd == "measure":
        measure(a.out, [ModelSpec(m, None, 512, 448) for m in a.models.split(",")], a.tokens, a.rounds, a.budget)
    else:
        from workbench.exec.calibration import load_calibration

        print(report(a.path, load_calibration(a.gpu) if a.gpu else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
