"""``workbench gguf``: write a preset (or config.json) as a GGUF with seeded random weights.

The file is the one ``--backend llamacpp`` runs for the same model and seed, and the weights are
those every workbench backend uses, so llama.cpp and ``workbench run --model FILE`` compute
the same logits (``workbench.models.gguf_write``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..models import load_config
from ..models.gguf_write import FILLS, QTYPES, write_gguf


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name or config.json path")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--qtype", default="f16", help=f"storage of the weight matrices: {', '.join(QTYPES)} (default f16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0, as workbench run)")
    p.add_argument("--fill", default="exact", choices=FILLS,
                   help="exact: the seeded weights every backend runs (default); tiled: large tensors repeat a "
                        "seeded pool of rows, written at disk speed, for timing runs only (logits differ from "
                        "the preset's; run the file itself on both sides)")
    p.add_argument("--out", required=True, help="the .gguf file to write")


def main(args: argparse.Namespace) -> int:
    if str(args.model).endswith(".gguf"):
        raise ValueError("--model is already a GGUF file; pass a preset name or a config.json")
    cfg = load_config(args.model, layers=args.layers)
    t0 = time.perf_counter()
    path = write_gguf(cfg, Path(args.out), seed=args.seed, qtype=args.qtype, fill=args.fill)
    size = path.stat().st_size
    dt = time.perf_counter() - t0
    print(f"wrote {path}: {cfg.name} ({cfg.model_type}, {cfg.n_layer} layers, {args.qtype}, {args.fill} fill), "
          f"{size / 2**20:.1f} MiB in {dt:.1f} s ({size / 2**20 / max(dt, 1e-9):.0f} MiB/s)", file=sys.stderr)
    return 0
