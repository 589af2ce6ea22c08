"""The ``cuda`` backend: the Plans of a run on a real GPU (``CudaExecutor``), timed per token
and traced with CUPTI when asked."""

from __future__ import annotations

import importlib.util
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..graph import is_quantized
from ..trace import MARKER_ROW, Trace
from .backend import BackendError, RunRequest
from .cuda import KERNEL_SETS
from .run import Run


@dataclass(frozen=True)
class CudaOptions:
    """``kernels``: ``cupy`` (CUDA C through NVRTC) or ``numba`` (Numba kernels for the
    elementwise and normalisation ops); ``node_tokens``: with graphs and a trace, the last N
    tokens are traced kernel by kernel and the others as one span per graph launch (like
    ``nsys --cuda-graph-trace=graph``; None = every token per kernel, whose cost is measured in
    data/bench/trace_overhead_h200.md); ``weights``: ``"device"`` (default: drawn on the GPU in
    seconds, kept for the process and shared by every strategy of the model; a config read from
    a checkpoint folder loads its safetensors instead), ``"host"`` (the reference's
    ``model_weights``: the checkpoint's, else ``random_weights(seed)``, so logits compare with
    ``backend="reference"``) or
    HF-named storage arrays; ``executor``: run on this ``CudaExecutor`` (benchmarks that manage
    their own) instead of the backend's cached one."""

    kernels: str = "cupy"
    node_tokens: int | None = 2
    weights: Any = "device"
    executor: Any = None

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_SETS:
            raise ValueError(f"--kernels {self.kernels!r} is not one of {', '.join(KERNEL_SETS)}")
        if self.node_tokens is not None and self.node_tokens < 0:
            raise ValueError(f"--node-tokens {self.node_tokens}: must be >= 0 (0 = graph-level spans only) or 'all'")


def cuda_available() -> tuple[bool, str]:
    """(usable, reason): CuPy importable and at least one CUDA device visible."""
    if importlib.util.find_spec("cupy") is None:
        return False, "CuPy is not installed (pip install -e '.[gpu]')"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver, no device, broken install: all mean "no GPU"
        return False, f"no CUDA GPU is usable ({type(e).__name__}: {e})"
    return (n > 0, f"{n} CUDA device(s)") if n > 0 else (False, "no CUDA GPU found")


def present_gpu_name() -> str | None:
    """Name of CUDA device 0 when one is usable, else None."""
    if not cuda_available()[0]:
        return None
    from .device import device_info

    return device_info().name


def graph_trace_mode(node_tokens: int | None, n_tokens: int) -> tuple[str, tuple[int, ...]]:
    """(graph_trace, node_tokens) for the CUPTI capture: ``node`` = every kernel of every token,
    ``graph`` = one span per graph launch except the last ``node_tokens`` tokens."""
    if node_tokens is None or node_tokens >= n_tokens:
        return "node", ()
    return "graph", tuple(range(n_tokens - node_tokens, n_tokens))


def _host_trace(start_ns: Sequence[int], end_ns: Sequence[int], **meta: Any) -> Trace:
    """A coarse trace when no CUPTI capture was asked for: one marker per token (host time)."""
    rows = [dict(row=MARKER_ROW, kind="marker", name=f"token {i}", start_ns=s, end_ns=e, token=i)
            for i, (s, e) in enumerate(zip(start_ns, end_ns))]
    if not rows:
        return Trace(pd.DataFrame({"row": [], "kind": [], "name": [], "start_ns": [], "end_ns": []}), meta)
    return Trace.from_records(rows, **meta)


class CudaBackend:
    """Decode steps on the GPU, one ``CudaExecutor`` per (model, strategy)."""

    name = "cuda"
    Options = CudaOptions

    def available(self) -> tuple[bool, str]:
        return cuda_available()

    def compute_capability(self, options: CudaOptions) -> tuple[int, int] | None:
        if not cuda_available()[0]:
            return None
        from .device import device_info

        return device_info().compute_capability

    def __init__(self) -> None:
        #: (model, seed, weights) -> the executor that owns those device weights
        self._owners: dict[tuple, Any] = {}
        #: (model, seed, weights, strategy, kernels) -> executor, most recently used last
        self._executors: OrderedDict[tuple, Any] = OrderedDict()

    #: executors kept per model (each holds its scratch arena, streams and captured graphs)
    KEEP = 8

    def executor(self, req: RunRequest) -> Any:
        """The executor of the request: reused across runs of the same model, seed, weights,
        strategy and kernel set; a new strategy shares the model's device weights; switching
        model frees the previous one's device memory. Caches are zeroed (a fresh sequence)."""
        from ..models.weights import has_checkpoint
        from ..strategy.steps import config_key
        from .cuda import CudaExecutor

        opts: CudaOptions = req.options
        if opts.executor is not None:
            return opts.executor
        if isinstance(opts.weights, str) and opts.weights not in ("device", "host"):
            raise ValueError(f"weights={opts.weights!r}: use 'device', 'host' or a dict of arrays")
        wkey = (config_key(req.cfg), req.seed, opts.weights if isinstance(opts.weights, str) else id(opts.weights))
        key = (*wkey, req.strategy, opts.kernels)
        ex = self._executors.get(key)
        if ex is not None:
            self._executors.move_to_end(key)
            ex.reset()
            return ex
        if self._owners and wkey not in self._owners:
            self.release()
        owner = self._owners.get(wkey)
        req.report("weights")
        if owner is None:
            # "host", or "device" for a config read from a checkpoint folder: its safetensors
            checkpoint = opts.weights == "device" and has_checkpoint(req.cfg)
            weights = None if opts.weights == "host" or checkpoint else opts.weights
            ex = CudaExecutor(req.cfg, req.strategy, weights, req.seed, opts.kernels)
            self._owners[wkey] = ex
        else:
            ex = CudaExecutor(req.cfg, req.strategy, kernels=opts.kernels, share=owner)
        self._executors[key] = ex
        while len(self._executors) > self.KEEP:
            _, old = self._executors.popitem(last=False)
            if all(old is not o for o in self._owners.values()):
                old.release()
        return ex

    def held_bytes(self, options: CudaOptions) -> int:
        """GPU memory a run with ``options`` may count beside the free memory: a given executor's
        (its weights and arena are the run's), else every cached executor's (a run of the same
        model reuses their weights, another model's frees them first; ``executor``)."""
        exs = [options.executor] if options.executor is not None else [*self._owners.values(),
                                                                       *self._executors.values()]
        weights = {id(ex._persistent_mem): ex.persistent_bytes for ex in exs if ex._persistent_mem is not None}
        return int(sum(weights.values()) + sum(ex._arena_bytes for ex in {id(e): e for e in exs}.values()))

    def release(self) -> None:
        """Free every cached executor and the device weights they share."""
        for ex in self._executors.values():
            ex.release()
        for ex in self._owners.values():
            ex.release()
        self._executors.clear()
        self._owners.clear()
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()

    def run(self, req: RunRequest) -> Run:
        from .cuda_quant_ops import MMVQ_TYPES

        qtypes = sorted({v.dtype for v in req.plans[0].graph.weights.values()
                         if is_quantized(v.dtype) and v.dtype not in MMVQ_TYPES})
        if qtypes:
            raise BackendError(f"{req.cfg.name}: {'/'.join(qtypes)} weights have no cuda kernel (kernels/mmvq.cu "
                               f"takes {', '.join(MMVQ_TYPES)}); re-quantise to one of those, or use --backend "
                               "reference (logits) or sim (timing)")
        ok, why = cuda_available()
        if not ok:
            raise BackendError(f"--backend cuda needs CuPy and a CUDA GPU: {why}. "
                               "Use --backend sim to simulate the run on a calibrated H100/H200.")
        return decode(self.executor(req), req)


def decode(ex: Any, req: RunRequest) -> Run:
    """Decode the request's tokens one step at a time on executor ``ex`` (its Plans are the
    request's: they are bound by KV length, and ``plan_for`` returns the same objects)."""
    from ..trace.stats import summarize

    cfg, strategy, opts = req.cfg, req.strategy, req.options
    ids = [int(t) for t in req.token_ids]
    for plan in {id(p): p for p in req.plans}.values():
        ex.bind_plan(plan)
    capture = None
    if req.trace:
        from ..trace.cupti import open_capture
        from ..trace.cupti_records import copies_from_plan, sites_from_plan

        graph_trace, node_tokens = graph_trace_mode(opts.node_tokens, len(ids))
        first = ex.prepare(req.start_pos)
        capture = open_capture(sites_from_plan(first.plan, ex.kernel_of), copies_from_plan(first.plan),
                               stream=ex._stream(0), model=cfg.name, strategy=strategy.label(), backend="cuda",
                               device=ex.device, graph_trace=graph_trace if strategy.graphs else "node",
                               node_tokens=node_tokens).start()
        if getattr(capture, "needs_fresh_graphs", False):
            ex.drop_graphs()
    logits = []
    n0 = len(ex.times.start_ns)
    for i, tok in enumerate(ids):
        pos = req.start_pos + i
        if capture is not None and getattr(capture, "before_token", None) and capture.before_token(i):
            ex.drop_graphs()  # graph spans back on: no graph captured under node detail may be launched
        ex.prepare(pos)
        if capture is not None:
            capture.mark_token(i)
        logits.append(ex.step(tok, pos))
        req.report("tokens", i + 1, len(ids))
    start_ns, end_ns = ex.times.start_ns[n0:], ex.times.end_ns[n0:]
    tr = capture.stop() if capture is not None else _host_trace(start_ns, end_ns, source="host", model=cfg.name,
                                                                  strategy=strategy.label(), backend="cuda")
    last = ex.bound(cfg.kv_len(req.start_pos + len(ids) - 1))
    stats = summarize(tr)
    us = (np.asarray(end_ns) - np.asarray(start_ns)) / 1e3
    steady = us[1:] if len(us) > 1 else us
    program = last.plan.host_program
    stats.update({
        "tokens": len(ids),
        "us_per_token": float(np.mean(steady)),
        "us_per_token_median": float(np.median(steady)),
        "tokens_per_s": float(1e6 / np.mean(steady)),
        "kernels_per_token": len(last.plan.launches),
        "launches_per_token": sum(op.kind in ("launch", "graph_launch") for op in program),
        "syncs_per_token": sum(op.kind == "stream_sync" for op in program),
        "memory_bytes": ex.persistent_bytes + ex._arena_bytes,
        "captures": ex.captures,
    })
    if capture is not None:
        stats["graph_trace"] = getattr(capture, "graph_trace", "events")
        if stats["graph_trace"] == "graph":  # tokens traced at graph level only (cheap), for overhead checks
            nodes = set(getattr(capture, "node_tokens", ()))
            rest = [u for i, u in enumerate(us) if i > 0 and i not in nodes]
            stats["node_tokens"] = sorted(nodes)
            stats["us_per_token_graph_level"] = float(np.mean(rest)) if rest else float("nan")
    return Run("cuda", ex.device, last.plan, np.stack(logits), tr, stats,
               {"kernels": opts.kernels, "token_us": us.tolist(), "start_pos": req.start_pos, "executor": ex,
                "plans": list(req.plans)})
