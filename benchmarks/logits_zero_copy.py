"""``--logits zero-copy`` against ``copy`` on the cuda backend, side by side: full-size models under
``peer_best`` (graphs + PDL's launch signal after the main loop + Q/K/V streams + implicit sync +
every fusion: what ``llamacpp_peer.py`` measures as ours), interleaved copy / zero-copy rounds
in one process, ``--runs`` runs of 64 tokens each a round; with the simulator's prediction of the
same two Strategies. Writes JSON (every run) and a markdown table (median [min..max]).

Usage (GPU machine)::

    python benchmarks/logits_zero_copy.py --models llama-3.2-1b,llama-3.1-8b --rounds 3 --runs 3 \\
        --json $OUT/logits_zero_copy.json --md $OUT/logits_zero_copy.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import workbench  # noqa: E402
from workbench.models import preset  # noqa: E402
from workbench.strategy import ALL_ON_OURS  # noqa: E402

PEER_BEST = ALL_ON_OURS.with_(pdl_trigger="after-main-loop")
MODES = ("copy", "zero-copy")


def measure(spec: str, rounds: int, runs: int, gpu: str) -> dict:
    name, _, layers = spec.partition(":")
    cfg = preset(name, layers=int(layers) if layers else None, context=512)
    us: dict[str, list[float]] = {m: [] for m in MODES}
    for m in MODES:  # warm-up: weights, modules, graph captures
        workbench.run(cfg, PEER_BEST.with_(logits=m), tokens=4, start_pos=448, backend="cuda", quiet=True)
    for _ in range(rounds):
        for m in MODES:
            for _ in range(runs):
                us[m].append(float(workbench.run(cfg, PEER_BEST.with_(logits=m), tokens=64, start_pos=448,
                                                 backend="cuda", quiet=True).stats["us_per_token"]))
    sim = {m: float(workbench.run(cfg, PEER_BEST.with_(logits=m), tokens=16, start_pos=448, backend="sim", gpu=gpu,
                                  quiet=True).stats["us_per_token"]) for m in MODES}
    return {"model": spec, "us": us, "sim": sim}


def markdown(res: dict) -> str:
    lines = [f"# --logits zero-copy against copy ({res['gpu']}, driver {res['driver']}, {res['date']})", "",
             f"`python benchmarks/logits_zero_copy.py`: `peer_best` ({PEER_BEST.label()}), {res['rounds']} "
             f"interleaved rounds x {res['runs']} runs of 64 tokens from position 448 (512-row context); us/token, "
             f"median [min..max] over the runs; sim: the simulator with `{res['calibration']}.json`.", "",
             "| model | copy | zero-copy | zero-copy / copy | saved us/token | sim copy | sim zero-copy | sim saved |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["models"]:
        c, z = (np.asarray(r["us"][m]) for m in MODES)
        mc, mz = float(np.median(c)), float(np.median(z))
        sc, sz = r["sim"]["copy"], r["sim"]["zero-copy"]
        lines.append(f"| {r['model']} | {mc:.1f} [{c.min():.1f}..{c.max():.1f}] | {mz:.1f} "
                     f"[{z.min():.1f}..{z.max():.1f}] | {mz / mc:.3f} | {mc - mz:.1f} | {sc:.1f} | {sz:.1f} | "
                     f"{sc - sz:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b", help="comma list of preset[:layers]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default="out/logits_zero_copy.json")
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    from llamacpp_peer import gpu_calibration, gpu_info

    info = gpu_info()
    gpu = gpu_calibration(info["gpu"])
    res = {"gpu": info["gpu"], "driver": info["driver"], "date": time.strftime("%Y-%m-%d", time.gmtime()),
           "rounds": args.rounds, "runs": args.runs, "calibration": gpu,
           "models": [measure(m, args.rounds, args.runs, gpu) for m in args.models.split(",")]}
    Path(args.json).write_text(json.dumps(res, indent=1))
    md = markdown(res)
    if args.md:
        Path(args.md).write_text(md)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
