"""The memory floor of a decode step and the simulator's conservation check against it.

A token cannot take less than its bytes over the GPU's DRAM bandwidth, nor less than its flops
over the peak rate, whatever PDL, streams or a race overlap: every kernel still moves its bytes.
``floor_ns`` is that bound for one Plan on a calibrated GPU; ``check_conservation`` checks a
simulated trace against it (vectorised: the GPU's busy time must hold the work of every kernel
that ran), and ``floor_stats`` gives ``workbench run`` the floor and the fraction of it a run
reaches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from ..strategy import Plan
from ..trace import Trace
from .calibration import Calibration
from .cost import KernelCost


def floor_ns(plan: Plan, cal: Calibration) -> float:
    """Lower bound of one token of ``plan``: max(bytes / bandwidth, flops / peak rate) over all its
    kernels (the DRAM and the SMs each serve every kernel at most at their full rate)."""
    nbytes = sum(float(la.node.bytes) for la in plan.launches)
    flops = sum(float(la.node.flops) for la in plan.launches)
    return max(nbytes / cal.dram_Bpns, flops / cal.fp32_flops_per_ns)


def floor_of(costs: Iterable[KernelCost], cal: Calibration) -> float:
    """``floor_ns`` from a Plan's kernel costs (the simulator has them already)."""
    nbytes = flops = 0.0
    for c in costs:
        nbytes += c.bytes
        flops += c.flops
    return max(nbytes / cal.dram_Bpns, flops / cal.fp32_flops_per_ns)


def _floors(plans: Sequence[Plan], cal: Calibration) -> dict[int, float]:
    """Floor of each distinct Plan (a run repeats one Plan while the KV length keeps its shape)."""
    return {id(p): floor_ns(p, cal) for p in {id(p): p for p in plans}.values()}


def floor_stats(plans: Sequence[Plan], cal: Calibration, us_per_token: float) -> dict[str, float]:
    """``floor_us_per_token`` (mean over the run's tokens) and ``floor_fraction`` (floor / achieved:
    1.0 would be a step that only streams its bytes)."""
    floors = _floors(plans, cal)
    per = [floors[id(p)] for p in plans]
    floor_us = float(np.mean(per)) / 1e3 if per else float("nan")
    frac = floor_us / us_per_token if us_per_token and us_per_token == us_per_token else float("nan")
    return {"floor_us_per_token": floor_us, "floor_fraction": frac}


def check_conservation(trace: Trace, plans: Sequence[Plan], cal: Calibration,
                       floors: dict[int, float] | None = None) -> None:
    """Raise if the simulated kernels did less work than their Plans need: the union of the
    intervals in which any kernel ran must hold the floor of every token (each kernel's own
    segments are checked as they end, in the engine; this checks the whole run at once).
    ``floors``: each Plan's floor by ``id``, where the caller has them."""
    ev = trace.events
    k = (ev["kind"] == "kernel").to_numpy()
    if not k.any():
        return
    start, end = ev["start_ns"].to_numpy()[k].astype(np.float64), ev["end_ns"].to_numpy()[k].astype(np.float64)
    if not (start[1:] >= start[:-1]).all():  # a Trace keeps its rows by start time; others are sorted here
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
    s, e = start, np.maximum.accumulate(end)
    # a new busy stretch starts where a kernel starts after every earlier kernel ended
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(s)) - 1
    busy = float((e[last] - s[first]).sum())
    floors = floors if floors is not None else _floors(plans, cal)
    need = sum(floors[id(p)] for p in plans)
    if busy + len(s) < need * (1 - 1e-9):  # start/end are whole ns: up to 1 ns lost per kernel
        raise RuntimeError(f"simulator: conservation violated: kernels were busy {busy / 1e3:.1f} us but the "
                           f"run's bytes and flops need at least {need / 1e3:.1f} us on {cal.gpu} (internal "
                           "error: a kernel finished work it had not done)")
