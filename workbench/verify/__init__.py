"""Prove a Plan race-free: happens-before over the unrolled host program, accesses as byte
ranges of allocated buffers, every unordered conflicting pair explained.

``verify(plan, tokens=2)`` is the whole analysis; ``workbench verify`` is its command line.
"""

from __future__ import annotations

import time

from ..strategy.plan import Plan
from .accesses import Access, AccessTable, collect
from .hb import HappensBefore, Op, PlanFormatError, build
from .races import RacePair, find_races
from .report import CAUSES, Explainer, Race, RaceReport, Side


def verify(plan: Plan, tokens: int = 2, label: str | None = None) -> RaceReport:
    """Every pair of conflicting accesses of ``plan`` over ``tokens`` consecutive tokens that
    no happens-before order separates, explained."""
    t0 = time.perf_counter()
    hb = build(plan, tokens)
    table = collect(hb)
    pairs, checked = find_races(hb, table)
    explain = Explainer(hb, table)
    races = [explain.race(p) for p in pairs]
    return RaceReport(label or f"{plan.graph.name} {plan.strategy.label()}", tokens, races, checked,
                      len(hb.ops), hb.n_points, len(table), time.perf_counter() - t0, list(hb.notes))


__all__ = [
    "CAUSES", "Access", "AccessTable", "HappensBefore", "Op", "PlanFormatError", "Race", "RacePair", "RaceReport",
    "Side", "build", "collect", "find_races", "verify",
]
