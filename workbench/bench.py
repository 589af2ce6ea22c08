"""``workbench run``: decode steps of a model under a strategy, on the simulator, a GPU or NumPy.

Also the model + strategy flags every command shares (``add_model_args``, ``config_from_args``,
``strategy_from_args``). Without ``--backend`` the command uses ``cuda`` when a CUDA GPU and
CuPy are present and the calibrated simulator otherwise, and says which on stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import sys
from pathlib import Path
from typing import Any

from .exec.calibration import known_gpus
from .models import ModelConfig, load_config
from .strategy import ALLOCATORS, PDL_TRIGGERS, PDL_WAITS, STREAM_MODES, SYNC_MODES, Strategy
from .trace.io import SAVE_SUFFIXES, save_format, save_trace

BACKENDS = ("sim", "cuda", "reference")
TRACE_SUFFIXES = SAVE_SUFFIXES


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``/``--layers``/``--context`` and every Strategy knob (run, verify, ...)."""
    p.add_argument("--model", required=True, help="preset name, config.json path or .gguf path")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--context", type=int, help="KV cache length (default 512)")
    p.add_argument("--sync", default="per-copy", choices=SYNC_MODES)
    p.add_argument("--graphs", action="store_true", help="capture a CUDA graph once, replay per token")
    p.add_argument("--streams", default="single", choices=STREAM_MODES)
    p.add_argument("--max-streams", type=int, default=4)
    p.add_argument("--pdl", action="store_true", help="Programmatic Dependent Launch (Hopper+)")
    p.add_argument("--pdl-wait", default="first-read", choices=PDL_WAITS)
    p.add_argument("--pdl-trigger", default="start", choices=PDL_TRIGGERS)
    p.add_argument("--fusion", default="", help="comma-separated: copy-elim,rms-norm-mul")
    p.add_argument("--allocator", default="serial-reuse", choices=ALLOCATORS)


def config_from_args(args: argparse.Namespace) -> ModelConfig:
    return load_config(args.model, layers=args.layers, context=args.context)


def strategy_from_args(args: argparse.Namespace) -> Strategy:
    fusion = frozenset(f.strip() for f in (args.fusion or "").split(",") if f.strip())
    return Strategy(sync=args.sync, graphs=args.graphs, streams=args.streams, max_streams=args.max_streams,
                    pdl=args.pdl, pdl_wait=args.pdl_wait, pdl_trigger=args.pdl_trigger, fusion=fusion,
                    allocator=args.allocator)


def configure(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--tokens", type=int, default=8, help="decode steps to run (default 8)")
    p.add_argument("--start-pos", type=int, default=0, help="position of the first step (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and token ids")
    p.add_argument("--backend", choices=BACKENDS,
                   help="sim (calibrated simulator), cuda (CuPy on a GPU) or reference (NumPy); "
                        "default: cuda when a CUDA GPU and CuPy are present, else sim")
    p.add_argument("--kernels", choices=("cupy", "numba"), default="cupy",
                   help="cuda backend: CUDA C kernels (cupy) or Numba kernels for the elementwise/norm ops")
    p.add_argument("--gpu", default="h100", help=f"simulator calibration: {', '.join(known_gpus())} (default h100)")
    p.add_argument("--host-profile", help="simulator host profile (default: the calibration's, 'python'); "
                                          "e.g. llama.cpp, llama.cpp-windows")
    p.add_argument("--trace", metavar="FILE",
                   help="write the trace: FILE.parquet (the native file: small, loads in well under a second; use "
                        f"it for anything big), or {', '.join(s for s in TRACE_SUFFIXES if s != '.parquet')}")
    p.add_argument("--node-tokens", default="2", metavar="N|all",
                   help="cuda backend with --graphs: trace the last N tokens kernel by kernel and the others as "
                        "one span per graph launch (like nsys --cuda-graph-trace=graph); 'all' traces every "
                        "token per kernel, which costs +15-21 %% us/token instead of about +3 %% (H200, "
                        "data/bench/trace_overhead_h200.md). Default 2")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def graph_trace_from_arg(text: str, tokens: int) -> tuple[str, tuple[int, ...]]:
    """``--node-tokens`` -> (graph_trace, node_tokens) for ``run_cuda``: ``all`` = node-level
    tracing of every token, ``N`` = graph-level tracing with node detail for the last N tokens."""
    if str(text).strip().lower() == "all":
        return "node", ()
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--node-tokens {text!r}: give a number of tokens (e.g. 2) or 'all'") from None
    if n < 0:
        raise ValueError(f"--node-tokens {n}: must be >= 0 (0 = graph-level spans only) or 'all'")
    if n >= tokens:
        return "node", ()
    return "graph", tuple(range(tokens - n, tokens))


def cuda_available() -> tuple[bool, str]:
    """(usable, reason): CuPy importable and at least one CUDA device visible."""
    if importlib.util.find_spec("cupy") is None:
        return False, "CuPy is not installed (pip install -e '.[gpu]')"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device, broken install
        return False, f"no CUDA GPU is usable ({type(e).__name__}: {e})"
    return (n > 0, f"{n} CUDA device(s)") if n > 0 else (False, "no CUDA GPU found")


def choose_backend(requested: str | None) -> str:
    if requested:
        return requested
    ok, why = cuda_available()
    backend = "cuda" if ok else "sim"
    print(f"workbench run: backend {backend} ({why}; choose with --backend)", file=sys.stderr)
    return backend


def run_backend(backend: str, cfg: ModelConfig, strategy: Strategy, tokens: list[int], args: argparse.Namespace):
    """Dispatch to the backend; returns a ``workbench.exec.run.Run``."""
    if backend == "sim":
        from .exec.sim import run_sim

        return run_sim(cfg, strategy, tokens, start_pos=args.start_pos, gpu=args.gpu, host=args.host_profile)
    if backend == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise RuntimeError(f"--backend cuda needs CuPy and a CUDA GPU: {why}. "
                               "Use --backend sim to simulate the run on a calibrated H100/H200.")
        from .exec.cuda import run_cuda

        graph_trace, node_tokens = graph_trace_from_arg(getattr(args, "node_tokens", "all"), len(tokens))
        wanted = {"tokens": tokens, "seed": args.seed, "start_pos": args.start_pos, "trace": bool(args.trace),
                  "kernels": getattr(args, "kernels", "cupy"), "graph_trace": graph_trace,
                  "node_tokens": node_tokens}
        params = inspect.signature(run_cuda).parameters
        accepts_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        kw = {k: v for k, v in wanted.items() if accepts_any or k in params}
        return run_cuda(cfg, strategy, **kw)
    if backend == "reference":
        return run_reference_plans(cfg, strategy, tokens, start_pos=args.start_pos, seed=args.seed)
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def run_reference_plans(cfg: ModelConfig, strategy: Strategy, tokens: list[int], start_pos: int = 0, seed: int = 0):
    """NumPy truth over the Plans' graphs (fusions and allocation applied): logits, no timing."""
    import numpy as np
    import pandas as pd

    from .exec.reference import run_reference
    from .exec.run import Run
    from .exec.sim import plans_for_steps
    from .models import build_graph
    from .models.weights import random_weights
    from .trace import COLUMNS, Trace

    plans = plans_for_steps(cfg, strategy, len(tokens), start_pos)
    weights = random_weights(build_graph(cfg), seed)
    ref = run_reference(cfg, weights, tokens, start_pos=start_pos,
                        graph_for=lambda pos: plans[pos - start_pos].graph)
    stats = {"tokens": len(tokens), "memory_bytes": max(p.memory_bytes for p in plans),
             "logits_finite": bool(np.isfinite(ref.logits).all())}
    empty = Trace(pd.DataFrame({c: [] for c in COLUMNS}), {"source": "reference"})
    return Run("reference", "CPU (NumPy reference executor)", plans[-1], ref.logits, empty, stats)


def write_trace(trace, path: str | Path) -> Path:
    """Write a trace by suffix (``TRACE_SUFFIXES``; ``workbench.trace.io.save_trace``)."""
    return save_trace(trace, path)


def result(cfg: ModelConfig, strategy: Strategy, run, args: argparse.Namespace) -> dict[str, Any]:
    """The ``--json`` object."""
    s = run.stats
    out: dict[str, Any] = {
        "model": cfg.name, "layers": cfg.n_layer, "context": cfg.context, "backend": run.backend,
        "device": run.device, "strategy": strategy.to_dict(), "strategy_label": strategy.label(),
        "tokens": s.get("tokens", 0), "start_pos": args.start_pos,
    }
    for key in ("us_per_token", "tokens_per_s", "kernels_per_token", "launches_per_token", "syncs_per_token",
                "gpu_busy_fraction", "host_gap_us_per_token"):
        out[key] = s.get(key)
    out["memory_bytes"] = s.get("memory_bytes", run.plan.memory_bytes if run.plan else None)
    if run.backend == "sim":
        cal = run.meta["calibration"]
        out["gpu"], out["host_profile"] = cal.gpu, cal.host_profile
    out["largest_host_gaps"] = s.get("largest_host_gaps", [])
    if "logits_finite" in s:
        out["logits_finite"] = s["logits_finite"]
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
        lines.append(f"{out['tokens']} tokens: {out['us_per_token']:.1f} us/token "
                     f"({out['tokens_per_s']:.1f} tokens/s); per token {out['kernels_per_token']:.0f} kernels, "
                     f"{out['launches_per_token']:.0f} launches, "
                     f"{out['syncs_per_token']:.0f} syncs; GPU busy {100 * out['gpu_busy_fraction']:.1f}%; "
                     f"host-caused GPU idle {out['host_gap_us_per_token']:.1f} us/token")
    else:
        lines.append(f"{out['tokens']} tokens (no timing from the {out['backend']} backend)")
    if out.get("memory_bytes") is not None:
        lines.append(f"memory {out['memory_bytes'] / 2**20:.1f} MiB "
                     "(weights, caches, inputs/outputs and scratch arena)")
    for g in out.get("largest_host_gaps") or []:
        lines.append(f"  host gap {g['gap_us']:.1f} us in token {g['token']}: {g['before']} -> {g['after']} "
                     f"(waiting for {g['api']}; host: {g['host_calls']})")
    if "logits_finite" in out:
        lines.append(f"logits finite: {out['logits_finite']}")
    if out.get("trace"):
        lines.append(f"trace written to {out['trace']}")
        if out.get("graph_trace") == "graph":
            lines.append(f"  graph replays traced as one span per launch, kernel by kernel in tokens "
                         f"{out.get('node_tokens') or 'none'} (--node-tokens); graph-level tokens: "
                         f"{out.get('us_per_token_graph_level') or float('nan'):.1f} us/token")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import numpy as np

    cfg = config_from_args(args)
    strategy = strategy_from_args(args)
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
    if args.trace:
        save_format(args.trace)   # a wrong suffix fails before the run, not after it
    backend = choose_backend(args.backend)
    tokens = [int(t) for t in np.random.default_rng(args.seed).integers(0, cfg.get("vocab_size"), args.tokens)]
    run = run_backend(backend, cfg, strategy, tokens, args)
    if args.trace:
        write_trace(run.trace, args.trace)
    out = result(cfg, strategy, run, args)
    print(json.dumps(out) if args.json else describe(out))
    return 0
