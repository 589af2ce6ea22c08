"""``workbench`` command line."""

from __future__ import annotations

import argparse
import json
import sys


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from .exec.reference import run_reference
    from .models import build_graph, load_config
    from .models.weights import random_weights

    cfg = load_config(args.model, layers=args.layers, context=args.context)
    weights = random_weights(build_graph(cfg), args.seed)
    tokens = list(np.random.default_rng(args.seed).integers(0, cfg.get("vocab_size"), args.tokens))
    run = run_reference(cfg, weights, tokens)
    out = {"model": cfg.name, "backend": "reference", "tokens": len(tokens),
           "logits_finite": bool(np.isfinite(run.logits).all())}
    print(json.dumps(out) if args.json else out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run decode steps of a model under a strategy")
    r.add_argument("--model", required=True)
    r.add_argument("--layers", type=int)
    r.add_argument("--context", type=int)
    r.add_argument("--tokens", type=int, default=8)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=_run)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"workbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
