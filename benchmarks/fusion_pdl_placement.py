"""llama.cpp's fusion set's effect on the ``cuda`` backend under each PDL placement (issue 15).

Our kernels issue their first weight loads before their PDL wait (``first-read``) and signal the
next kernel at their start by default; llama.cpp's wait first thing and its mat-vecs signal after
their main loop. The fusions remove kernels whose launch PDL partly hides already, so the
fusion effect depends on the placement: this measures it for each (wait, signal) pair, fusion on
against off (``llamacpp_peer.CONFIGS``' ``no_fusion`` / ``default`` Strategies, placement
replaced), PDL off beside them. One interleaved run (``decode_matrix.measure_model``): the effect
is the median of the rounds' own effects (``decode_matrix.knob_effect``), spread their min-max.

    python3 benchmarks/fusion_pdl_placement.py measure --out $OUT/pdl_fusion_grid.jsonl   # GPU
    python3 benchmarks/fusion_pdl_placement.py report data/bench/pdl_fusion_grid_1b_h200_s32.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from llamacpp_peer import CONFIGS  # noqa: E402

from workbench.exec.calibrate.decode_matrix import MatrixModel, knob_effect, read_matrix  # noqa: E402
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


def measure(out: Path, spec: ModelSpec, tokens: int, rounds: int) -> None:
    from workbench.exec.calibrate.decode_matrix import measure_model
    from workbench.exec.calibrate.environment import environment, warm_gpu

    m = MatrixModel(spec, tuple(st for _, a, b in pairs() for st in (a, b)))
    with out.open("w") as f:
        f.write(json.dumps({"kind": "environment", **environment(), "tokens": tokens, "repeats": rounds,
                            "settle_run": True}) + "\n")
        warm_gpu()
        for row in measure_model(m, tokens, rounds):
            f.write(json.dumps(row) + "\n")


def report(path: Path) -> str:
    env, df = read_matrix(path)
    by = df.set_index("strategy")
    lines = [f"{env['gpu_name']}, driver {env.get('driver_version', '?')}, {str(env.get('date', ''))[:10]}, "
             f"{env['repeats']} rounds of {env['tokens']} tokens (`{path.name}`)", "",
             "| our PDL placement (wait, signal) | fusion off | llama.cpp's fusion set "
             "| fusion effect [rounds' min..max] |",
             "|---|---:|---:|---:|"]
    for name, a, b in pairs():
        if a.label() in by.index and b.label() in by.index:
            m, lo, hi = knob_effect(by.loc[a.label()], by.loc[b.label()])
            lines.append(f"| {name} | {by.at[a.label(), 'us_per_token']:.1f} | {by.at[b.label(), 'us_per_token']:.1f} "
                         f"| {m:+.1f} % [{lo:+.1f}..{hi:+.1f}] |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--model", default="llama-3.2-1b")
    m.add_argument("--tokens", type=int, default=64)
    m.add_argument("--rounds", type=int, default=7)
    r = sub.add_parser("report")
    r.add_argument("path", type=Path)
    a = p.parse_args()
    if a.cmd == "measure":
        measure(a.out, ModelSpec(a.model, None, 512, 448), a.tokens, a.rounds)
    else:
        print(report(a.path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
