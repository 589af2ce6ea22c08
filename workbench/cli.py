"""``workbench`` command line. Each subcommand is a module of ``workbench.commands`` with
``configure(parser)`` and ``main(args) -> exit code``; commands call the library
(``workbench.run``, ``verify``, the views), never each other."""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

#: subcommand -> (module, one-line help)
COMMANDS = {
    "run": ("workbench.commands.run", "run decode steps of a model under a strategy (sim, cuda or reference)"),
    "verify": ("workbench.commands.verify", "prove a Plan race-free (happens-before analysis)"),
    "view": ("workbench.commands.view", "draw, summarise or convert a trace file"),
    "calibrate": ("workbench.commands.calibrate", "measure the simulator's cost model on this GPU"),
    "lab": ("workbench.commands.lab", "open JupyterLab on the notebooks"),
    "gguf": ("workbench.commands.gguf", "write a model with seeded random weights as a GGUF llama.cpp loads"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="workbench", description="GPU scheduling workbench for LLM decode steps")
    sub = p.add_subparsers(dest="cmd", required=True)
    modules = {}
    for name, (mod_name, help_) in COMMANDS.items():
        mod = modules[name] = import_module(mod_name)  # a broken command fails loudly, never vanishes
        mod.configure(sub.add_parser(name, help=help_, description=help_))
    args = p.parse_args(argv)
    try:
        return int(modules[args.cmd].main(args) or 0)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"workbench {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
