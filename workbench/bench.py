"""``workbench run``: model + strategy flags shared by every command, and running a model.

(The simulator backend and stats are added by issue 3; until then ``run`` uses the reference.)
"""

from __future__ import annotations

import argparse
import json

from .models import ModelConfig, load_config
from .strategy import PDL_TRIGGERS, PDL_WAITS, Strategy


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``/``--layers``/``--context`` and every Strategy knob (run, verify, ...)."""
    p.add_argument("--model", required=True, help="preset name, config.json path or .gguf path")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--context", type=int, help="KV cache length (default 512)")
    p.add_argument("--sync", default="per-copy", choices=["per-copy", "boundary", "implicit"])
    p.add_argument("--graphs", action="store_true", help="capture a CUDA graph once, replay per token")
    p.add_argument("--streams", default="single", choices=["single", "qkv", "auto"])
    p.add_argument("--max-streams", type=int, default=4)
    p.add_argument("--pdl", action="store_true", help="Programmatic Dependent Launch (Hopper+)")
    p.add_argument("--pdl-wait", default="first-read", choices=PDL_WAITS)
    p.add_argument("--pdl-trigger", default="start", choices=PDL_TRIGGERS)
    p.add_argument("--fusion", default="", help="comma-separated: copy-elim,rms-norm-mul")
    p.add_argument("--allocator", default="serial-reuse", choices=["serial-reuse", "stream-aware", "no-reuse"])


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    return load_config(args.model, layers=args.layers, context=args.context)


def strategy_from_args(args: argparse.Namespace) -> Strategy:
    fusion = frozenset(f.strip() for f in (args.fusion or "").split(",") if f.strip())
    return Strategy(sync=args.sync, graphs=args.graphs, streams=args.streams, max_streams=args.max_streams,
                    pdl=args.pdl, pdl_wait=args.pdl_wait, pdl_trigger=args.pdl_trigger, fusion=fusion,
                    allocator=args.allocator)


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=["reference"], default="reference")
    p.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from .exec.reference import run_reference
    from .models import build_graph
    from .models.weights import random_weights

    cfg = config_from_args(args)
    strategy_from_args(args)
    weights = random_weights(build_graph(cfg), args.seed)
    tokens = list(np.random.default_rng(args.seed).integers(0, cfg.get("vocab_size"), args.tokens))
    run = run_reference(cfg, weights, tokens)
    out = {"model": cfg.name, "backend": "reference", "tokens": len(tokens),
           "logits_finite": bool(np.isfinite(run.logits).all())}
    print(json.dumps(out))
    return 0
