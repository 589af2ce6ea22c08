"""``workbench lab``: open JupyterLab on the notebooks (the tour first).

JupyterLab runs in its own process (``python -m jupyterlab``) rooted at ``notebooks/`` of the
checkout, with this interpreter, so the notebooks import the same ``workbench`` the command came
from. ``--dry-run`` prints the command instead of starting it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

from ..view.lab import FIRST, NOTEBOOKS


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=NOTEBOOKS, help=f"folder to open (default {NOTEBOOKS})")
    p.add_argument("--notebook", default=FIRST, help=f"notebook to open first (default {FIRST})")
    p.add_argument("--port", type=int, default=8888)
    p.add_argument("--ip", default="localhost")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser (remote machines)")
    p.add_argument("--dry-run", action="store_true", help="print the JupyterLab command and exit")


def command(args: argparse.Namespace) -> list[str]:
    """The JupyterLab command line for ``args``; clear errors when it cannot work."""
    root = Path(args.dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"notebook folder {root} does not exist; run `workbench lab` from a checkout "
                                "installed with `pip install -e .[lab]`, or pass --dir")
    if not (root / args.notebook).exists():
        raise FileNotFoundError(f"{args.notebook} is not in {root}; pick one of "
                                f"{', '.join(sorted(p.name for p in root.glob('*.ipynb'))) or '(none)'}")
    if importlib.util.find_spec("jupyterlab") is None:
        raise RuntimeError("JupyterLab is not installed: pip install -e '.[lab]' (or bash scripts/setup.sh)")
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}", f"--port={args.port}",
           f"--ip={args.ip}", f"--LabApp.default_url=/lab/tree/{args.notebook}"]
    if args.no_browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI machines run as root; JupyterLab refuses otherwise
    return cmd


def main(args: argparse.Namespace) -> int:
    cmd = command(args)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    print(f"workbench lab: JupyterLab on {Path(args.dir).resolve()} (Ctrl-C to stop)", flush=True)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
