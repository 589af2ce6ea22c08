"""``workbench verify``: compile a model under the knobs of ``workbench run`` and prove the Plan
race-free over consecutive tokens. Exit 0 when race-free, 1 with the report otherwise."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .. import preflight
from .flags import add_model_strategy_args, config_from_args, strategy_from_args


def configure(p: argparse.ArgumentParser) -> None:
    add_model_strategy_args(p)
    p.add_argument("--tokens", type=int, default=2, help="consecutive tokens to unroll (default 2)")
    p.add_argument("--limit", type=int, default=20, help="races printed in full (the rest are summarised)")
    p.add_argument("--json", action="store_true", help="print one JSON object with races and checked_pairs")
    preflight.add_args(p)


def main(args: argparse.Namespace) -> int:
    from ..strategy.steps import plan_for
    from ..strategy.strategy import UnsafeStrategyWarning
    from ..verify import verify

    cfg = config_from_args(args)
    strategy = strategy_from_args(args, "workbench verify")
    est = preflight.verify_checks(cfg, strategy, vars(args), preflight.stderr("verify"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsafeStrategyWarning)  # the Plan records it: printed below
        plan = plan_for(cfg, strategy)
    for note in plan.warnings:
        print(f"workbench verify: warning: {note}", file=sys.stderr)
    with preflight.progress(est, preflight.stderr("verify")):
        report = verify(plan, tokens=args.tokens, label=f"{cfg.name} {strategy.label()}")
    try:
        if args.json:
            print(json.dumps({"model": cfg.name, "strategy": strategy.to_dict(), **report.to_dict()}))
        else:
            print(report.text(limit=args.limit))
    except BrokenPipeError:  # `workbench verify ... | head`
        sys.stderr.close()
    return 0 if report.race_free else 1
