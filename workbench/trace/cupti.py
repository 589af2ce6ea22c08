"""Live CUPTI capture (cupti-python): activity records of a run, converted into the Trace table.

Records CONCURRENT_KERNEL (not KERNEL, which serializes kernels and would hide stream
concurrency and PDL overlap), RUNTIME, DRIVER, MEMCPY, MEMSET and SYNCHRONIZATION activity.
Host API calls go to the ``CUDA API`` row, kernels and copies to ``Stream N`` rows (N is the
CUDA stream id CUPTI reports, as Nsight Systems numbers them), linked by correlation id.
Tokens and graph nodes are added by ``cupti_records.records_to_trace`` (pure); the names the
trace readers share live in ``cupti_names``. Without cupti-python, ``open_capture`` returns
``EventCapture``: one CUDA-event span per token, with a printed notice.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .cupti_records import KernelSite, activity_to_record, records_to_trace
from .table import MARKER_ROW, Trace, stream_row


def cupti_available() -> bool:
    try:
        from cupti import cupti  # noqa: F401
    except Exception:
        return False
    return True


class _CuptiNames:
    """``name_of`` for ``activity_to_record``: CUPTI's enum member names, API callback names
    cached by (domain, callback id)."""

    def __init__(self) -> None:
        self._callbacks: dict[tuple[str, int], str] = {}

    def __call__(self, enum: str, value: int) -> str:
        from cupti import cupti

        if enum in ("RUNTIME", "DRIVER"):
            key = (enum, value)
            if key not in self._callbacks:
                dom = cupti.CallbackDomain.DRIVER_API if enum == "DRIVER" else cupti.CallbackDomain.RUNTIME_API
                self._callbacks[key] = str(cupti.get_callback_name(dom, value))
            return self._callbacks[key]
        return getattr(cupti, enum)(value).name


class _Router:
    """CUPTI allows one pair of buffer callbacks per process: they feed the active capture."""

    registered = False
    target: CuptiCapture | None = None
    BUFFER_BYTES = 32 << 20   # large: buffers complete at flush, not mid-run on CUPTI's thread

    @classmethod
    def request(cls) -> tuple[int, int]:
        return cls.BUFFER_BYTES, 0

    @classmethod
    def complete(cls, activities: Any) -> None:
        if cls.target is not None and activities:
            cls.target._raw.extend(cls.target._convert(a) for a in activities)


class CuptiCapture:
    """Context manager: enable CUPTI activity on ``start``, convert on ``stop``.

    Usage: ``cap.start(); for i: cap.mark_token(i); <token i>; trace = cap.stop()``.

    ``graph_trace`` follows Nsight Systems' ``--cuda-graph-trace``: ``node`` records every
    kernel of a graph replay (what PDL overlap and stream concurrency need to be seen),
    ``graph`` records one GRAPH_TRACE span per graph launch instead, except in ``node_tokens``,
    which get node detail. Launches outside a graph are recorded per kernel in both modes.
    Why both: per-node records make CUPTI instrument every graph launch, which lengthens
    cudaGraphLaunch many times over and costs a sizeable share of us/token; graph spans cost a
    few % (measured by ``benchmarks/trace_overhead.py``: ``data/bench/trace_overhead_h200.md``).
    Two CUPTI 13.0 behaviours shape the code: GRAPH_TRACE crashes the process when a graph
    instantiated before it was enabled is launched (so a graph-level capture needs the graphs
    captured again after ``start``: ``needs_fresh_graphs``), and with GRAPH_TRACE on, graph
    nodes give no kernel records (so node tokens switch it off). Detaching CUPTI after a
    capture (``cuptiFinalize``) would undo the few % it keeps costing untraced, but a later
    graph-level capture then hits illegal-address errors, so the capture stays attached.
    """

    #: what a capture records by default (CONCURRENT_KERNEL, not KERNEL: see the module docstring)
    KINDS = ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER", "MEMCPY", "MEMSET", "SYNCHRONIZATION")
    #: kinds recorded per graph node, which graph-level tokens leave off (copies and memsets
    #: outside graphs stay recorded: with graphs instantiated under GRAPH_TRACE they cost no
    #: measurable time, benchmarks/trace_overhead.py)
    DETAIL_KINDS = ("CONCURRENT_KERNEL",)
    GRAPH_TRACES = ("node", "graph")

    def __init__(self, sites: Sequence[KernelSite] = (), copies: Sequence[tuple[str, str]] = (),
                 kinds: Sequence[str] = KINDS, graph_trace: str = "node", node_tokens: Iterable[int] = (),
                 **meta: Any):
        if graph_trace not in self.GRAPH_TRACES:
            raise ValueError(f"graph_trace={graph_trace!r}: use 'node' (every kernel of a graph replay) or "
                             "'graph' (one span per graph launch, node detail only for node_tokens)")
        self.sites, self.copies, self.meta = list(sites), list(copies), dict(meta)
        self.kind_names = tuple(kinds)
        self.graph_trace = graph_trace
        self.node_tokens = frozenset(int(t) for t in node_tokens)
        self._raw: list[dict[str, Any] | None] = []
        self._names = _CuptiNames()
        self.marks: list[tuple[int, int]] = []
        self.end_mark: int | None = None
        self._enabled: list[str] = []
        self._level_token: int | None = None
        self.meta.update(graph_trace=graph_trace, node_tokens=sorted(self.node_tokens))

    def _convert(self, a: Any) -> dict[str, Any] | None:
        return activity_to_record(a, self._names)

    @property
    def needs_fresh_graphs(self) -> bool:
        """CUPTI 13.0 crashes the process when GRAPH_TRACE is on while a graph instantiated
        before it was enabled is launched (measured on an H200): a graph-level capture needs the
        executor to capture its graphs again after ``start``."""
        return self.graph_trace == "graph"

    def _kinds_for(self, detail: bool) -> list[str]:
        """Activity kinds to record for a token with (or without) node detail."""
        if self.graph_trace == "node" or detail:  # node detail: GRAPH_TRACE off, else no kernel records
            return list(self.kind_names)
        return [k for k in self.kind_names if k not in self.DETAIL_KINDS] + ["GRAPH_TRACE"]

    def _switch(self, kinds: Sequence[str]) -> None:
        """Record ``kinds`` from now on: disable what is no longer wanted first (CUPTI refuses
        GRAPH_TRACE together with per-node kernel records), then enable the rest."""
        from cupti import cupti

        for k in [k for k in self._enabled if k not in kinds]:
            cupti.activity_disable(cupti.ActivityKind[k])
            self._enabled.remove(k)
        for k in [k for k in kinds if k not in self._enabled]:
            cupti.activity_enable(cupti.ActivityKind[k])
            self._enabled.append(k)

    def start(self) -> CuptiCapture:
        from cupti import cupti

        if _Router.target is not None:
            raise RuntimeError("a CUPTI capture is already running in this process; stop it first")
        if not _Router.registered:
            cupti.activity_register_callbacks(_Router.request, _Router.complete)
            _Router.registered = True
        _Router.target = self
        try:
            self._switch(self._kinds_for(detail=False))
        except Exception:
            self._switch([])
            _Router.target = None
            raise
        return self

    def before_token(self, token: int) -> bool:
        """Switch between node detail and graph spans for ``token`` (call before the executor
        prepares the token, so a graph captured for it is captured under the right kinds).
        True when graph spans were just switched back on: graphs captured meanwhile (under node
        detail) must be captured again, or CUPTI crashes on their launch."""
        if self.graph_trace != "graph" or self._level_token == token:
            return False
        self._level_token = token
        was_graph = "GRAPH_TRACE" in self._enabled
        self._switch(self._kinds_for(detail=token in self.node_tokens))
        return not was_graph and "GRAPH_TRACE" in self._enabled

    def mark_token(self, token: int) -> None:
        """Call at the start of token ``token``'s host program (outside any stream capture);
        switches kinds too where ``before_token`` was not called."""
        from cupti import cupti

        self.before_token(token)
        self.marks.append((token, int(cupti.get_timestamp())))

    def stop(self) -> Trace:
        from cupti import cupti

        self.end_mark = int(cupti.get_timestamp())
        try:
            cupti.activity_flush_all(1)
        finally:
            self._switch([])
            cupti.activity_flush_all(1)
            _Router.target = None
        return self.trace()

    def records(self) -> list[dict[str, Any]]:
        return [r for r in self._raw if r is not None]

    def trace(self) -> Trace:
        return records_to_trace(self.records(), self.marks, self.sites, self.copies, self.end_mark, **self.meta)

    def __enter__(self) -> CuptiCapture:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if _Router.target is self:
            self.stop()


class EventCapture:
    """Coarse fallback without cupti-python: a CUDA event on the main stream at each token mark
    gives one device span per token (``Stream N`` row, kind ``kernel``, named ``token i``) and
    host time stamps give one ``NVTX`` marker per token. No per-kernel detail."""

    def __init__(self, stream: Any = None, stream_id: int = 0, **meta: Any):
        import cupy as cp

        self._cp = cp
        self.stream = stream if stream is not None else cp.cuda.get_current_stream()
        self.stream_id = stream_id
        self.meta = dict(meta)
        self._events: list[tuple[int, Any, int]] = []

    def start(self) -> EventCapture:
        return self

    def mark_token(self, token: int) -> None:
        ev = self._cp.cuda.Event()
        ev.record(self.stream)
        self._events.append((token, ev, time.perf_counter_ns()))

    def stop(self) -> Trace:
        end = self._cp.cuda.Event()
        end.record(self.stream)
        t_end = time.perf_counter_ns()
        end.synchronize()
        rows: list[dict[str, Any]] = []
        if self._events:
            _, ev0, h0 = self._events[0]
            bounds = self._events + [(-1, end, t_end)]
            sid = self.stream_id
            for (tok, ev, h), (_, nxt, hn) in zip(bounds, bounds[1:]):
                d0 = int(self._cp.cuda.get_elapsed_time(ev0, ev) * 1e6)
                d1 = int(self._cp.cuda.get_elapsed_time(ev0, nxt) * 1e6)
                rows.append(dict(row=stream_row(sid), kind="kernel", name=f"token {tok}", start_ns=h0 + d0,
                                 end_ns=h0 + max(d0, d1), stream=sid, token=tok))
                rows.append(dict(row=MARKER_ROW, kind="marker", name=f"token {tok}", start_ns=h, end_ns=hn, token=tok))
        self.meta.setdefault("source", "cuda-events")
        return Trace.from_records(rows, **self.meta)

    def __enter__(self) -> EventCapture:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        pass


NOTICE = ("workbench: cupti-python is not installed: the trace is coarse (one CUDA-event span per "
          "token, no kernels or API calls). Install it with `pip install cupti-python` (or the "
          "`gpu` extra) for a full timeline.")


def open_capture(sites: Sequence[KernelSite] = (), copies: Sequence[tuple[str, str]] = (), stream: Any = None,
                 **meta: Any) -> CuptiCapture | EventCapture:
    """A CUPTI capture when cupti-python imports, else the coarse CUDA-event one with a notice."""
    if cupti_available():
        return CuptiCapture(sites, copies, **meta)
    print(NOTICE, file=sys.stderr)
    return EventCapture(stream, **meta)
