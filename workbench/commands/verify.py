"""``workbench verify``: compile a model under the knobs of ``workbench run`` and prove the Plan
race-free over consecutive tokens. Exit 0 when race-free, 1 with the report otherwise."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .flags import add_model_strategy_args, config_from_args, strategy_from_args


def configure(p: argparse.ArgumentParser) -> None:
    add_model_strategy_args(p)
    p.add_argument("--tokens", type=int, default=2, help="consecutive tokens to unroll (default 2)")
    p.add_argument("--limit", type=int, default=20, help="races printed in full (the rest are summarised)")
    p.add_argument("--json", action="store_true", help="print one JSON object with races and checked_pairs")


def main(args: argparse.Namespace) -> int:
    from ..strategy.steps import plan_for
    from ..strategy.strategy import UnsafeStrategyWarning
    from ..verify import verify

    cfg = config_from_args(args)
    strategy = strategy_from_args(args, "workbench verify")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnsafeStrategyWarning)
        plan = plan_for(cfg, strategy)
    for w in caught:
        print(f"workbench verify: warning: {w.message}", file=sys.stderr)
    report = verify(plan, tokens=args.tokens, label=f"{cfg.name} {strategy.label()}")
    try:
        if args.json:
            print(json.dumps({"model": cfg.name, "strategy": strategy.to_dict(), **report.to_dict()}))
        else:
            print(report.text(limit=args.limit))
    except BrokenPipeError:  # `workbench verify ... | head`
        sys.stderr.close()
    return 0 if report.race_free else 1
