"""Whole decode steps under two versions of the CUDA kernels: ``kernels/`` of a git revision against
the working tree's, interleaved A B A B in fresh processes (each compiles its own modules), on one
model and weight type. A kernel edit that wins in isolation can lose in a step (code size, index
math before the first load, neighbours sharing L2); this measures the step.

Each process runs the model's best Strategy (graphs + PDL + Q/K/V streams + every fusion), the same
with PDL's launch signal after the main loop and the implicit sync (``peer_best``: what
``llamacpp_peer.py`` measures as ours against llama.cpp) and llama.cpp's default (graphs + PDL +
llama.cpp's fusions), warmed up, ``--runs`` times 64 tokens;
one JSON line per process (us/token of each run, sorted) to ``--out``.

Usage on the GPU machine::

    python benchmarks/kernel_ab.py --rev HEAD~1 --model llama-3.2-1b --weight-dtype q4_0 --rounds 2 \\
        --out $OUT/kernel_ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def export_kernels(rev: str, dest: Path) -> Path:
    """``kernels/`` as of ``rev`` into ``dest`` (sources and headers)."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "kernels/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{name}"], check=True, capture_output=True)
        (dest / Path(name).name).write_bytes(blob.stdout)
    return dest


def measure(kernel_dir: str | None, model: str, weight_dtype: str, runs: int) -> dict[str, list[float]]:
    """us/token of each run of both Strategies, with the kernels of ``kernel_dir`` (None: the tree's)."""
    from fusion_effects import model_config

    import workbench
    import workbench.exec.kernels as kernels
    from workbench.llamacpp.switches import LLAMACPP_FUSION
    from workbench.strategy import WORKBENCH_FUSIONS, Strategy

    if kernel_dir:
        kernels.KERNEL_DIR = Path(kernel_dir)
    cfg = model_config(model, weight_dtype)
    own = frozenset(LLAMACPP_FUSION) | frozenset(WORKBENCH_FUSIONS)
    best = Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware", fusion=own)
    strategies = {"best": best, "peer_best": best.with_(pdl_trigger="after-main-loop", sync="implicit"),
                  "llamacpp_default": Strategy(graphs=True, pdl=True, fusion=frozenset(LLAMACPP_FUSION))}
    out = {}
    for label, s in strategies.items():
        workbench.run(cfg, s, tokens=4, start_pos=448, backend="cuda", quiet=True)
        out[label] = sorted(workbench.run(cfg, s, tokens=64, start_pos=448, backend="cuda", quiet=True)
                            .stats["us_per_token"] for _ in range(runs))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="HEAD", help="git revision of the A side's kernels (B: the working tree), "
                   "or a folder holding them (a copy of the tree without .git, as on the GPU machine)")
    p.add_argument("--model", default="llama-3.2-1b", help="preset[:layers]")
    p.add_argument("--weight-dtype", default="q4_0")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runs", type=int, default=3, help="64-token runs per Strategy and process")
    p.add_argument("--out", default="out/kernel_ab.jsonl")
    p.add_argument("--child", nargs=2, metavar=("SIDE", "KERNEL_DIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        side, kdir = args.child
        rec = {"side": side, "model": args.model, "weight_dtype": args.weight_dtype,
               **measure(kdir or None, args.model, args.weight_dtype, args.runs)}
        print(json.dumps(rec), flush=True)
        return 0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        a_dir = args.rev if Path(args.rev).is_dir() else str(export_kernels(args.rev, Path(tmp)))
        sides = {f"A {args.rev}": a_dir, "B tree": ""}
        for _ in range(args.rounds):
            for side, kdir in sides.items():
                common = ["--model", args.model, "--weight-dtype", args.weight_dtype, "--runs", str(args.runs)]
                run = subprocess.run([sys.executable, __file__, "--child", side, kdir, *common], capture_output=True,
                                     text=True)
                line = next((ln for ln in run.stdout.splitlines() if ln.startswith("{")), None)
                if line is None:
                    print(f"{side}: failed\n{run.stderr[-2000:]}", flush=True)
                    continue
                print(line, flush=True)
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
