"""Flags shared by the commands that take a model and a strategy (``run``, ``verify``): the
model flags, and one flag per Strategy knob generated from ``strategy.knobs.KNOBS``."""

from __future__ import annotations

import argparse
import sys

from ..models import ModelConfig
from ..preflight import load_model
from ..strategy import Strategy
from ..strategy.knobs import KNOBS, inert_settings, parse_family_placements, parse_fusions


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="preset name, config.json path or .gguf path")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--context", type=int, help="KV cache length (default 512)")
    p.add_argument("--weight-dtype", choices=("f16", "bf16", "f32", "q8_0", "q4_0", "q4_k", "mxfp4"),
                   help="weight storage (default f16; a bf16 checkpoint stays bf16 with bf16; q8_0, q4_0, "
                        "q4_k, mxfp4: ggml's block types, random weights quantised as a GGUF stores them)")
    p.add_argument("--swa-full", action="store_true", default=None,
                   help="sliding-window layers keep a full-context KV cache (llama.cpp's --swa-full) "
                        "instead of the iSWA ring of window + n_ubatch rows")


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    """One flag per knob; defaults are None so the knobs the user set are known (``given``)."""
    for k in KNOBS:
        dest = k.field
        if k.kind == "flag":
            p.add_argument(k.flag, dest=dest, action="store_true", default=None, help=k.help)
        elif k.kind == "choice":
            p.add_argument(k.flag, dest=dest, choices=k.values, default=None, help=k.help)
        elif k.kind == "int":
            p.add_argument(k.flag, dest=dest, type=int, default=None, help=k.help)
        elif k.kind == "set":
            p.add_argument(k.flag, dest=dest, default=None, help=f"{k.help}: {', '.join(k.values)}")
        elif k.kind == "families":
            p.add_argument(k.flag, dest=dest, action="append", default=None, metavar="FAMILY=WAIT[/TRIGGER]",
                           help=f"{k.help}; families: {', '.join(k.values)}")
        else:  # pragma: no cover - a new kind must be handled here
            raise TypeError(f"knob {k.field}: no CLI form for kind {k.kind!r}")


def add_model_strategy_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_strategy_args(p)


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    """The model of ``--model`` with ``--layers``/``--context`` (range-checked first),
    ``--weight-dtype`` and ``--swa-full``."""
    return load_model(vars(args))


def given_knobs(args: argparse.Namespace) -> list[str]:
    return [k.field for k in KNOBS if getattr(args, k.field, None) is not None]


def strategy_from_args(args: argparse.Namespace, command: str = "workbench") -> Strategy:
    """The Strategy of the knob flags; a one-line notice on stderr for each flag that has no
    effect under the others (e.g. ``--pdl-wait`` without ``--pdl``)."""
    values = {}
    for k in KNOBS:
        v = getattr(args, k.field, None)
        if v is None:
            continue
        if k.kind == "set":
            v = parse_fusions(v)
        elif k.kind == "families":
            v = parse_family_placements(v)
        values[k.field] = v
    strategy = Strategy(**values)
    notes = inert_settings(strategy, given_knobs(args))
    if args.fusion is not None and args.fusion.strip() and not values["fusion"]:
        notes.append(f"--fusion {args.fusion!r} names no fusion and has no effect")
    for note in notes:
        print(f"{command}: notice: {note}", file=sys.stderr)
    return strategy
