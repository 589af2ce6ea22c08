"""compile(graph, strategy) -> Plan: every knob implemented once, as a pure function.

Stages, each in its own module: fusions (``fusion``) rewrite the graph; the byte-level hazards
of the rewritten graph (``deps``) drive stream assignment and events (``streams``); the
allocator (``allocate``) places scratch buffers in one arena using the stream schedule and
rebases the graph onto it; PDL placement (``pdl``) and the host program (``host``) finish
the Plan. Executors and the verifier only read the Plan.
"""

from __future__ import annotations

import warnings

from ..graph import Graph
from .allocate import allocate, lifetimes, rebase, unordered_reuse
from .deps import hazards
from .fusion import apply_fusions
from .host import host_program
from .pdl import check_families, place_pdl
from .plan import Launch, Plan
from .strategy import Strategy
from .streams import assign_streams


def compile_plan(graph: Graph, strategy: Strategy, device_cc: tuple[int, int] | None = None, *,
                 fork_keeps_branch: bool = True) -> Plan:
    """Compile ``graph`` (a model's decode step) under ``strategy`` for a device of compute
    capability ``device_cc`` (None: no device check, e.g. for the simulator's own GPU models).
    ``fork_keeps_branch``: see ``streams.assign_streams`` (False: llama.cpp's Q/K/V fork).

    Raises StrategyError for an impossible combination (PDL below compute capability 9.0, an
    unknown kernel family in ``pdl_families``); emits UnsafeStrategyWarning for PDL wait
    ``late``. ``Plan.warnings`` records that warning and notes ``serial-reuse`` allocations
    that recycle bytes across unordered streams (allowed, to study the race).
    """
    check_families(strategy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy.validate(device_cc)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    fused, removed = apply_fusions(graph, strategy.fusion)
    schedule = assign_streams(fused.nodes, hazards(fused.nodes), strategy.streams, strategy.max_streams,
                              fork_keeps_branch)
    allocation = allocate(fused, schedule, strategy.allocator)
    notes = [str(w.message) for w in caught]
    if strategy.allocator == "serial-reuse" and schedule.n_streams > 1:
        bad = unordered_reuse(lifetimes(fused.nodes, schedule), allocation.offsets)
        if bad:
            notes.append(f"allocator serial-reuse on {schedule.n_streams} streams: {len(bad)} pairs of scratch "
                         f"buffers share bytes without an order between their accesses (e.g. {bad[0][1]} reuses "
                         f"{bad[0][0]}); use --allocator stream-aware")
    planned = rebase(fused, allocation)
    pdl = place_pdl(planned.nodes, schedule.streams, strategy)
    launches = [
        Launch(i, n, schedule.streams[i], p, wait, trig, schedule.wait_events[i], schedule.record_events[i])
        for i, (n, (p, wait, trig)) in enumerate(zip(planned.nodes, pdl))
    ]
    return Plan(
        graph=planned,
        source=graph,
        strategy=strategy,
        launches=launches,
        host_program=host_program(planned, launches, strategy),
        allocation=allocation,
        n_streams=schedule.n_streams,
        n_events=schedule.n_events,
        removed=removed,
        warnings=notes,
    )
