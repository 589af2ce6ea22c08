"""The calibration's executor runs on the GPU: each (model, strategy) run prepared and timed
untraced with the host clock first, then traced with CUPTI."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...models.tokens import token_ids
from ...strategy import Strategy
from ...trace import Trace
from ...trace.cupti import CuptiCapture
from ...trace.cupti_records import copies_from_plan, sites_from_plan
from .specs import ModelSpec
from .tables import trace_tables


@dataclass
class PreparedRun:
    """One calibration run's executor, warmed up (kernels compiled, graph captured) before CUPTI
    was ever enabled in the process, with its untraced timings."""

    spec: ModelSpec
    strategy: Strategy
    ex: Any
    ids: np.ndarray
    host_ops: list[dict[str, Any]]
    untraced_us_per_token: float
    hooked_us_per_token: float  # the pass whose host ops were timed (the timing's own cost in it)


def _steady_us(ex: Any, a: int, b: int | None) -> float:
    """Median host time of the steady tokens (all but the first): a one-off host stall (a
    garbage collection, a module loaded lazily: 50 ms in one token of a 2026-11-25 H200
    calibration run) must not move a calibration run's us/token."""
    us = (np.asarray(ex.times.end_ns[a:b]) - np.asarray(ex.times.start_ns[a:b])) / 1e3
    return float(np.median(us[1:])) if len(us) > 1 else float(us[0])


def prepare_untraced(spec: ModelSpec, strategy: Strategy, tokens: int, seed: int = 0,
                     share: Any = None) -> PreparedRun:
    """Build and warm up the executor, then time ``tokens`` steps untraced with the host clock:
    once with every host op timed (``host_ops``), then once as a user's run goes, whose
    us/token is the run's (the difference is what timing each op costs, taken off in the fit).

    Must run before CUPTI is first enabled in the process: a CUDA graph instantiated once CUPTI
    has been active stays instrumented (its launches keep paying CUPTI's per-node cost)."""
    from ..cuda import CudaExecutor

    cfg = spec.config()
    ex = CudaExecutor(cfg, strategy, "device", seed, share=share)
    ids = token_ids(cfg, tokens, seed)
    p0 = spec.pos
    if any(cfg.kv_len(p0 + i) != cfg.kv_len(p0) for i in range(tokens)):
        raise ValueError(f"{spec.label}: {tokens} tokens cross a KV-length step; use fewer tokens or another pos")
    ex.prepare(p0)  # compile kernels and capture outside the measurement
    ex.step(int(ids[0]), p0)
    n1 = len(ex.times.start_ns)
    host_ops = time_host_ops(ex, ids, p0)
    n2 = len(ex.times.start_ns)
    for i, tok in enumerate(ids):
        ex.prepare(p0 + i)
        ex.step(int(tok), p0 + i)
    return PreparedRun(spec, strategy, ex, ids, host_ops, _steady_us(ex, n2, None), _steady_us(ex, n1, n2))


def trace_executor(pr: PreparedRun) -> tuple[Trace, dict[str, Any]]:
    """A CUPTI trace of the prepared run's decode steps, graph capture included (in token -1)."""
    ex, p0, cfg = pr.ex, pr.spec.pos, pr.spec.config()
    b = ex.prepare(p0)
    sites = sites_from_plan(b.plan, ex.kernel_of)
    b.graph = None  # captured again below, inside the trace
    cap = CuptiCapture(sites, copies_from_plan(b.plan), model=cfg.name, strategy=pr.strategy.label(),
                       backend="cuda", device=ex.device).start()
    try:
        ex.prepare(p0)
        n0 = len(ex.times.start_ns)
        for i, tok in enumerate(pr.ids):
            ex.prepare(p0 + i)
            cap.mark_token(i)
            ex.step(int(tok), p0 + i)
    finally:
        tr = cap.stop()
    return tr, {"host_us_per_token": _steady_us(ex, n0, None), "untraced_us_per_token": pr.untraced_us_per_token,
                "hooked_us_per_token": pr.hooked_us_per_token,
                "host_ops": pr.host_ops, "nodes": len(b.plan.launches), "device": ex.device,
                "device_name": ex.device_name}


def time_host_ops(ex: Any, ids: Sequence[int], p0: int) -> list[dict[str, Any]]:
    """The executor's host program timed with the host clock, untraced: each host op's start
    and end (ns) per token, its kind, API, whether it is a PDL launch, and for syncs whether
    device work was pending (issued since the stream was last drained)."""
    out: list[dict[str, Any]] = []
    state = {"token": -1, "i": 0, "pending": False}

    def timed(b: Any, op: Any, call: Any) -> None:
        pdl = op.kind == "launch" and b.plan.launches[op.launch].pdl
        waits = op.kind == "stream_sync" and state["pending"]
        t0 = time.perf_counter_ns()
        call()
        t1 = time.perf_counter_ns()
        out.append({"token": state["token"], "i": state["i"], "kind": op.kind, "api": op.api, "pdl": bool(pdl),
                    "blocking": bool(op.blocking), "waits": bool(waits), "start_ns": t0, "end_ns": t1})
        state["i"] += 1
        if op.kind == "stream_sync" or (op.kind.startswith("memcpy") and op.blocking):
            state["pending"] = False
        elif op.kind != "stream_sync":
            state["pending"] = True

    ex.host_op_hook = timed
    try:
        for i, tok in enumerate(ids):
            ex.prepare(p0 + i)
            state.update(token=i, i=0)
            ex.step(int(tok), p0 + i)
    finally:
        ex.host_op_hook = None
    return out


def prepare_models(specs: Iterable[ModelSpec], strategies: Mapping[str, Strategy], tokens: int = 12,
                   seed: int = 0, log: Callable[[str], None] = print) -> list[tuple[str, PreparedRun]]:
    """The untraced half: every calibration run prepared and timed before CUPTI is enabled."""
    out = []
    for spec in specs:
        first = None
        for label, st in strategies.items():
            pr = prepare_untraced(spec, st, tokens, seed, share=first)
            first = first or pr.ex
            out.append((label, pr))
            log(f"  {spec.label:32s} {label:22s} {pr.untraced_us_per_token:9.1f} us/token untraced")
    return out


def measure_models(prepared: Sequence[tuple[str, PreparedRun]], log: Callable[[str], None] = print,
                   keep: Callable[[str, Trace], None] | None = None) -> dict[str, Any]:
    """The traced half: a CUPTI trace of each prepared run -> the tables the fit reads."""
    runs: list[tuple[ModelSpec, str, Trace, dict[str, Any]]] = []
    for label, pr in prepared:
        t0 = time.perf_counter()
        tr, info = trace_executor(pr)
        runs.append((pr.spec, label, tr, info))
        if keep is not None:
            keep(f"{pr.spec.label}/{label}", tr)
        log(f"  {pr.spec.label:32s} {label:22s} {info['host_us_per_token']:9.1f} us/token traced  "
            f"{len(tr)} events  {time.perf_counter() - t0:.1f} s")
    return trace_tables(runs)
