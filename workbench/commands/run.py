"""``workbench run``: decode steps of a model under a strategy, on the simulator, a GPU, NumPy
or llama.cpp, through ``workbench.run``. Without ``--backend`` it uses ``cuda`` when a CUDA GPU
and CuPy are present and the calibrated simulator otherwise, and says which on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from .. import preflight
from ..api import run
from ..exec.backend import backends
from ..exec.calibration import known_gpus
from ..models import ModelConfig
from ..progress import ProgressBar
from ..strategy import Strategy
from ..trace.io import SAVE_SUFFIXES, save_trace
from ..validate import node_tokens_arg
from .flags import add_model_strategy_args, config_from_args, strategy_from_args

TRACE_SUFFIXES = SAVE_SUFFIXES


def configure(p: argparse.ArgumentParser) -> None:
    add_model_strategy_args(p)
    p.add_argument("--tokens", type=int, default=8, help="decode steps to run (default 8)")
    p.add_argument("--start-pos", type=int, default=0, help="position of the first step (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and token ids")
    p.add_argument("--backend", choices=backends(),
                   help="sim (calibrated simulator), cuda (CuPy on a GPU), reference (NumPy) or llamacpp; "
                        "default: cuda when a CUDA GPU and CuPy are present, else sim")
    p.add_argument("--kernels", choices=("cupy", "numba"), default=None,
                   help="cuda backend: CUDA C kernels (cupy, default) or Numba kernels for the elementwise/norm ops")
    p.add_argument("--gpu", "--calibration", dest="gpu", default=None,
                   help=f"simulator calibration: {', '.join(known_gpus())} (default: the GPU present, else the "
                        "measured h200 file; <gpu>-llamacpp simulates llama.cpp)")
    p.add_argument("--host-profile", help="simulator host profile (default: the calibration's, 'python'); "
                                          "e.g. llama.cpp, llama.cpp-windows")
    p.add_argument("--llamacpp", metavar="DIR", help="llamacpp backend: the llama.cpp build to load (a folder with "
                                                      "libllama.so and libggml*.so; default $WORKBENCH_LLAMACPP)")
    p.add_argument("--trace", metavar="FILE",
                   help="write the trace: FILE.parquet (the native file: small, loads in well under a second; use "
                        f"it for anything big), or {', '.join(s for s in TRACE_SUFFIXES if s != '.parquet')}")
    p.add_argument("--node-tokens", default=None, metavar="N|all",
                   help="cuda backend with --graphs: trace the last N tokens kernel by kernel and the others as "
                        "one span per graph launch (like nsys --cuda-graph-trace=graph); 'all' traces every "
                        "token per kernel, at a cost measured in data/bench/trace_overhead_h200.md. Default 2")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    preflight.add_args(p)


#: backend options of this command: flag dest -> (backend, option name, parse)
BACKEND_FLAGS = {
    "gpu": ("sim", "gpu", str),
    "host_profile": ("sim", "host", str),
    "kernels": ("cuda", "kernels", str),
    "node_tokens": ("cuda", "node_tokens", node_tokens_arg),
    "llamacpp": ("llamacpp", "build", str),
}


def backend_options(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The options of ``backend`` from the flags (the others get a notice: ``validate.inert_options``)."""
    return {name: parse(getattr(args, dest)) for dest, (owner, name, parse) in BACKEND_FLAGS.items()
            if owner == backend and getattr(args, dest, None) is not None}


def result(cfg: ModelConfig, strategy: Strategy, run, args: argparse.Namespace) -> dict[str, Any]:
    """The ``--json`` object."""
    s = run.stats
    out: dict[str, Any] = {
        "model": cfg.name, "layers": cfg.n_layer, "context": cfg.context, "backend": run.backend,
        "device": run.device, "strategy": strategy.to_dict(), "strategy_label": strategy.label(),
        "tokens": s.get("tokens", 0), "start_pos": args.start_pos,
    }
    for key in ("us_per_token", "tokens_per_s", "kernels_per_token", "launches_per_token", "syncs_per_token",
                "gpu_busy_fraction", "host_gap_us_per_token", "floor_us_per_token", "floor_fraction"):
        out[key] = s.get(key)
    out["memory_bytes"] = s.get("memory_bytes", run.plan.memory_bytes if run.plan else None)
    if run.backend == "sim":
        cal = run.meta["calibration"]
        out["gpu"], out["host_profile"] = cal.gpu, cal.host_profile
    out["largest_host_gaps"] = s.get("largest_host_gaps", [])
    for key in ("logits_finite", "memory_fits_gpu", "gpu_memory_bytes"):
        if key in s:
            out[key] = s[key]
    out["weight_dtype"] = cfg.weight_dtype
    if run.logits is not None and np.size(run.logits):
        # the greedy token of each step, to compare with llama.cpp's greedy output on the same GGUF
        out["argmax_tokens"] = [int(t) for t in np.asarray(run.logits).reshape(-1, run.logits.shape[-1]).argmax(-1)]
    if args.trace:
        out["trace"] = str(args.trace)
        for key in ("graph_trace", "node_tokens", "us_per_token_graph_level"):
            if key in s:
                out[key] = s[key]
    return _finite(out)


def _finite(x: Any) -> Any:
    """NaN/inf become null so the output is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return _finite(x.item())
    return x


def describe(out: dict[str, Any]) -> str:
    """Human-readable summary of the ``--json`` object."""
    lines = [f"{out['model']} ({out['layers']} layers, context {out['context']}) on {out['device']}",
             f"strategy {out['strategy_label']}: " + " ".join(
                 f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in out["strategy"].items()
                 if k != "pdl_families" or v)]
    if out.get("us_per_token") is not None:
        parts = [f"{out['tokens']} tokens: {out['us_per_token']:.1f} us/token ({out['tokens_per_s']:.1f} tokens/s)"]
        per = [f"{out[k]:.0f} {word}" for k, word in (("kernels_per_token", "kernels"),
                                                      ("launches_per_token", "launches"),
                                                      ("syncs_per_token", "syncs")) if out.get(k) is not None]
        if per:
            parts.append("per token " + ", ".join(per))
        if out.get("gpu_busy_fraction") is not None:
            parts.append(f"GPU busy {100 * out['gpu_busy_fraction']:.1f}%")
        if out.get("host_gap_us_per_token") is not None:
            parts.append(f"host-caused GPU idle {out['host_gap_us_per_token']:.1f} us/token")
        lines.append("; ".join(parts))
    else:
        lines.append(f"{out['tokens']} tokens (no timing from the {out['backend']} backend)")
    if out.get("floor_fraction") is not None:
        lines.append(f"memory floor {out['floor_us_per_token']:.1f} us/token (bytes / the calibrated bandwidth): "
                     f"this run is at {100 * out['floor_fraction']:.1f}% of floor speed")
    if out.get("memory_bytes") is not None:
        lines.append(f"memory {out['memory_bytes'] / 2**20:.1f} MiB "
                     "(weights, caches, inputs/outputs and scratch arena)")
    for g in out.get("largest_host_gaps") or []:
        lines.append(f"  host gap {g['gap_us']:.1f} us in token {g['token']}: {g['before']} -> {g['after']} "
                     f"(waiting for {g['api']}; host: {g['host_calls']})")
    if "logits_finite" in out:
        lines.append(f"logits finite: {out['logits_finite']}")
    if out.get("argmax_tokens") is not None:
        lines.append(f"greedy (argmax) tokens: {' '.join(map(str, out['argmax_tokens']))}")
    if out.get("trace"):
        lines.append(f"trace written to {out['trace']}")
        if out.get("graph_trace") == "graph":
            lines.append(f"  graph replays traced as one span per launch, kernel by kernel in tokens "
                         f"{out.get('node_tokens') or 'none'} (--node-tokens); graph-level tokens: "
                         f"{out.get('us_per_token_graph_level') or float('nan'):.1f} us/token")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    strategy = strategy_from_args(args, "workbench run")
    preflight.run_options(cfg, vars(args), TRACE_SUFFIXES)
    emit = preflight.stderr("run")
    backend = args.backend
    if backend is None:
        from ..api import default_backend

        backend, why = default_backend()
        emit(f"backend {backend} ({why}; choose with --backend)")
    preflight.backend_notices(strategy, backend, vars(args), emit)
    with ProgressBar() as progress:
        result_run = run(cfg, strategy, tokens=args.tokens, backend=backend, start_pos=args.start_pos,
                         seed=args.seed, trace=bool(args.trace), progress=progress, max_seconds=args.max_seconds,
                         notice=emit, **backend_options(args, backend))
    if args.trace:
        save_trace(result_run.trace, args.trace)
    out = result(cfg, strategy, result_run, args)
    print(json.dumps(out) if args.json else describe(out))
    return 0
