"""The checks each command runs before any work: option ranges, output paths, resources, and
notices for options that have no effect. One function per command (``run``, ``verify``,
``view``) over the options as a mapping, so that the CLI, the panel and ``workbench.run``
reject the same inputs with the same messages.

Order matters: cheap checks that name a typed option come first, the resource estimate (which
compiles a few layers) last, and nothing here writes a file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from . import validate
from .models import PRESETS, ConfigError, ModelConfig, load_config
from .models.validate import InvalidField
from .progress import heartbeat
from .resources import MAX_SECONDS, Estimate, check, estimate
from .strategy import Strategy
from .trace.io import DRAWN_SUFFIXES, SAVE_SUFFIXES

Emit = Callable[[str], None]


def add_args(p: argparse.ArgumentParser) -> None:
    """``--max-seconds`` for commands that do work proportional to the model and the tokens."""
    p.add_argument("--max-seconds", type=float, default=MAX_SECONDS, metavar="S",
                   help=f"refuse to start a run estimated to take longer than S seconds (default {MAX_SECONDS:g})")


def stderr(command: str) -> Emit:
    """Print a notice as ``workbench <command>: <notice>`` on stderr."""
    return lambda text: print(f"workbench {command}: {text}", file=sys.stderr)


def load_model(opts: Mapping[str, Any]) -> ModelConfig:
    """``--model`` with its ``--layers`` / ``--context`` overrides, checked before loading (a
    huge layer count would be expanded into per-layer tables) and validated after; a bad field
    of a config file is reported against the path the user gave."""
    validate.check_model_options(opts.get("layers"), opts.get("context"))
    spec = opts["model"]
    try:
        return load_config(spec, layers=opts.get("layers"), context=opts.get("context"),
                           weight_dtype=opts.get("weight_dtype"), swa_full=opts.get("swa_full"))
    except InvalidField as e:
        if spec in PRESETS:
            raise
        raise InvalidField(spec, e.detail) from None
    except ConfigError as e:
        if spec in PRESETS or str(spec) in str(e):
            raise
        raise ConfigError(f"{spec}: {e}") from None


def _max_seconds(opts: Mapping[str, Any]) -> float:
    s = opts.get("max_seconds", MAX_SECONDS)
    if s is None or not s > 0 or s != s:
        raise validate.OptionError(f"--max-seconds {s!r} is out of range: must be a number of seconds > 0")
    return float(s)


def run_options(cfg: ModelConfig, opts: Mapping[str, Any], trace_suffixes: tuple[str, ...] = ()) -> None:
    """``workbench run`` (and ``workbench.run``): the options that need no backend, checked
    before one is chosen; ``trace_suffixes``: the formats ``--trace`` can write."""
    validate.check_steps(cfg.context, opts.get("tokens", 8), opts.get("start_pos", 0))
    validate.check_seed(opts.get("seed", 0))
    if opts.get("node_tokens") is not None:
        validate.node_tokens_arg(opts["node_tokens"])
    if opts.get("trace") is not None and trace_suffixes:
        validate.check_output("--trace", opts["trace"], trace_suffixes)
    _max_seconds(opts)


def backend_notices(strategy: Strategy, backend: str, opts: Mapping[str, Any], emit: Emit) -> None:
    """Notices for the options ``backend`` ignores (``validate.inert_options``)."""
    for note in validate.inert_options(opts, strategy, backend):
        emit(f"notice: {note}")


#: backends whose cost ``resources.estimate`` models
ESTIMATED = ("sim", "cuda", "reference")


def resource_checks(cfg: ModelConfig, strategy: Strategy, backend: str, tokens: int, start_pos: int,
                    max_seconds: float, emit: Emit, gpu: str | None = None,
                    held_device_bytes: float = 0.0) -> Estimate | None:
    """The resource estimate of a run (refused past the machine, the GPU or ``max_seconds``;
    warnings and a long run's announcement go to ``emit``); None for a backend it does not model.
    ``held_device_bytes``: see ``resources.estimate``."""
    if backend not in ESTIMATED:
        return None
    est = estimate(cfg, strategy, backend, tokens, start_pos, gpu=gpu, held_device_bytes=held_device_bytes)
    for note in check(est, _max_seconds({"max_seconds": max_seconds}), "run"):
        emit(note)
    return est


def progress(est: Estimate, emit: Emit) -> AbstractContextManager[None]:
    """A heartbeat on ``emit`` while the run works, for runs estimated to be long."""
    return heartbeat(emit, est.seconds, "happens-before analysis" if est.backend == "verify" else
                     f"{est.backend} backend")


def result_flags(est: Estimate | None) -> dict[str, Any]:
    """Keys for the ``--json`` object: whether the model fits the (simulated) GPU's memory."""
    if est is None or est.device_capacity is None:
        return {}
    return {"memory_fits_gpu": est.fits_device, "gpu_memory_bytes": int(est.device_capacity)}


def verify_checks(cfg: ModelConfig, strategy: Strategy, opts: Mapping[str, Any], emit: Emit) -> Estimate:
    """``workbench verify``: tokens within the context, ``--limit`` >= 0, the happens-before
    analysis within the machine's memory and ``--max-seconds``."""
    tokens = opts.get("tokens", 2)
    validate.check_steps(cfg.context, tokens)
    validate.check_range("--limit", opts.get("limit", 20), 0, hint="races printed in full")
    limit = _max_seconds(opts)
    notes = validate.inert_options(opts, strategy, None)
    if opts.get("json") and opts.get("limit", 20) != 20:
        notes.append(f"--limit {opts['limit']} has no effect with --json (the JSON object lists every race)")
    for note in notes:
        emit(f"notice: {note}")
    est = estimate(cfg, strategy, "verify", tokens)
    for note in check(est, limit, "verify"):
        emit(note)
    return est




def view_checks(trace: str | Path, out: str | None, opts: Mapping[str, Any], emit: Emit) -> list[str]:
    """``workbench view``: the output path and format before the (slow) drawing, distinct runs
    to compare; returns the labels of the runs (the trace, then each ``--compare`` file)."""
    compare = list(opts.get("compare") or [])
    if opts.get("out") == "":
        raise validate.OptionError("--out '': give a file name (.html, .png, .svg, .pdf or .json)")
    for other in compare:
        if not Path(other).is_file():
            raise validate.OptionError(f"--compare {other}: no such trace file")
    if out is not None:
        why = " (--compare draws a figure)" if compare else ""
        suffixes = DRAWN_SUFFIXES if compare else SAVE_SUFFIXES
        validate.check_output("--out", out, suffixes, why)
        if Path(out).resolve() in {Path(p).resolve() for p in [trace, *compare]}:
            raise validate.OptionError(f"--out {out}: is one of the traces being read; write to another file")
    labels = validate.run_labels([trace, *compare]) if compare else [Path(trace).name]
    if out is None:
        given = [f for f in ("compare", "align_token", "title") if opts.get(f) not in (None, [], "")]
        for f in given:
            emit(f"notice: --{f.replace('_', '-')} has no effect without --out (only --summary/--analysis "
                 "were asked for, which draw nothing)")
    else:
        if opts.get("align_token") is not None and not compare:
            emit("notice: --align-token has no effect without --compare")
        if opts.get("title") and Path(out).suffix.lower() == ".json":
            emit("notice: --title has no effect on a Perfetto .json export")
    return labels


def calibrate_checks(opts: Mapping[str, Any]) -> None:
    """``workbench calibrate``: the files it will write and the models it will measure, before
    minutes of GPU measurement (a bad ``--out`` used to fail only when writing the result)."""
    if opts.get("from_raw") is not None and not Path(opts["from_raw"]).is_file():
        raise validate.OptionError(f"--from-raw {opts['from_raw']}: no such file")
    if opts.get("out") is not None:
        validate.check_output("--out", opts["out"], (".json",))
    if opts.get("raw") is not None:
        validate.check_output("--raw", opts["raw"], (".json", ".gz"), " (.json or .json.gz)")
    validate.check_range("--tokens", opts.get("tokens", 12), 1)
    text = opts.get("models")
    for part in text.split(",") if text is not None else []:
        name, *sizes = part.strip().split(":")
        if not name:
            raise validate.OptionError(f"--models {text!r}: an empty entry; give preset[:layers[:context[:pos]]],...")
        if name not in PRESETS:
            raise validate.OptionError(f"--models: unknown preset {name!r}; known: {', '.join(PRESETS)}")
        if len(sizes) > 3:
            raise validate.OptionError(f"--models {part.strip()}: too many ':' fields; give "
                                       "preset[:layers[:context[:pos]]]")
        for flag, size in zip(("layers", "context", "pos"), sizes):
            if size and not size.isdigit():
                raise validate.OptionError(f"--models {part.strip()}: {flag} {size!r} is not a number")


def lab_checks(opts: Mapping[str, Any]) -> None:
    """``workbench lab``: a port JupyterLab can listen on."""
    validate.check_range("--port", opts.get("port", 8888), 1, 65535)
