"""Measured GPU timelines: CUPTI activity records (cupti-python) into the Trace table.

Records CONCURRENT_KERNEL (not KERNEL, which serializes kernels and would hide stream
concurrency and PDL overlap), RUNTIME, DRIVER, MEMCPY, MEMSET and SYNCHRONIZATION activity.
Host API calls go to the ``CUDA API`` row, kernels and copies to ``Stream N`` rows (N is the
CUDA stream id CUPTI reports, as Nsight Systems numbers them), linked by correlation id.

Two things CUPTI does not know are added here:

- the **token** of each event: the executor calls ``mark_token(i)`` at the start of each
  token's host program; an API call takes the token whose mark precedes it, and device work
  takes the token of the API call with its correlation id (so work of token i that runs while
  the host already issues token i+1 stays token i);
- the **graph node** of each kernel, also inside a CUDA graph replay where one
  ``cudaGraphLaunch`` correlation id covers every kernel: records of one token are put in issue
  order (the start of the API call that issued them; inside a graph launch CUPTI's graph node
  id, which grows in node creation order and so in capture order, then start time) and matched
  to the Plan's launches per stream, in order, by kernel name (and grid where known); see
  ``match_kernels``.

``records_to_trace`` is pure (CPU-testable on recorded records); ``CuptiCapture`` is the live
part. Without cupti-python, ``open_capture`` returns ``EventCapture``: one CUDA-event span per
token, with a printed notice.
"""

from __future__ import annotations

import re
import sys
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from .table import API_ROW, COLUMNS, MARKER_ROW, Trace, stream_row

if TYPE_CHECKING:  # pragma: no cover
    from ..strategy.plan import Plan

#: host calls that block the host thread until device work is done: kind "sync" in the Trace
SYNC_APIS = frozenset({
    "cudaStreamSynchronize", "cuStreamSynchronize", "cudaDeviceSynchronize", "cuCtxSynchronize",
    "cudaEventSynchronize", "cuEventSynchronize",
})

#: CUPTI's ActivityMemcpyKind names -> the Trace's ``copy_kind`` and Nsight Systems' memcpy label
COPY_KINDS = {"HTOD": ("H2D", "Host-to-Device"), "DTOH": ("D2H", "Device-to-Host"),
              "DTOD": ("D2D", "Device-to-Device"), "HTOH": ("H2H", "Host-to-Host"), "PTOP": ("P2P", "Peer-to-Peer")}

_VERSION_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


@dataclass(frozen=True)
class KernelSite:
    """What the executor launches for one Plan node: its plan stream, the compiled kernel's
    function name (None: match by order alone) and grid (None: any)."""

    node: str
    stream: int = 0
    kernel: str | None = None
    grid: tuple[int, int, int] | None = None


def sites_from_plan(plan: Plan, kernel_of: Callable[[Any], tuple[str | None, tuple[int, int, int] | None]]
                    | None = None) -> list[KernelSite]:
    """One KernelSite per Plan launch, in issue order. ``kernel_of(launch)`` gives the executor's
    (kernel name, grid) for a launch; without it nodes are matched by per-stream order alone."""
    sites = []
    for la in plan.launches:
        name, grid = kernel_of(la) if kernel_of else (None, None)
        sites.append(KernelSite(la.node.name, la.stream, name, grid))
    return sites


def copies_from_plan(plan: Plan) -> list[tuple[str, str]]:
    """(copy_kind, tensor) of each memcpy of one token's host program, in issue order."""
    kinds = {"memcpy_h2d": "H2D", "memcpy_d2h": "D2H"}
    return [(kinds[op.kind], op.tensor or "") for op in plan.host_program if op.kind in kinds]


# --------------------------------------------------------------------------- pure conversion

def api_name(raw: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel`` (Nsight Systems drops the suffixes)."""
    return _VERSION_SUFFIX.sub("", raw)


def kernel_base_name(name: str) -> str:
    """A kernel's function name without mangling and template arguments: ``_Z8rms_normPKfPfi``
    and ``rms_norm<256>`` both give ``rms_norm``; ``_ZN2ns4gemmE...`` gives ``gemm``."""
    if name.startswith("_Z"):
        s, i, parts = name, 2, []
        nested = s.startswith("_ZN")
        if nested:
            i = 3
            while i < len(s) and s[i] in "KVrL":
                i += 1
        while i < len(s) and s[i].isdigit():
            j = i
            while j < len(s) and s[j].isdigit():
                j += 1
            n = int(s[i:j])
            parts.append(s[j:j + n])
            i = j + n
            if not nested:
                break
        if parts:
            return parts[-1]
    return name.split("<", 1)[0].split("(", 1)[0].strip()


def _site_matches(site: KernelSite, rec: Mapping[str, Any]) -> bool:
    if site.kernel is not None and kernel_base_name(site.kernel) != kernel_base_name(str(rec["name"])):
        return False
    if site.grid is not None and "grid" in rec and tuple(rec["grid"]) != tuple(site.grid):
        return False
    return True


def match_kernels(kernels: Sequence[Mapping[str, Any]], sites: Sequence[KernelSite],
                  stream_map: dict[int, int] | None = None, lookahead: int = 4) -> list[str]:
    """Graph node name of each kernel record of ONE token ("" where none fits).

    ``kernels`` must be in issue order: sorted by the start of the API call that issued them,
    then by start (eager launches each have their own call; a graph replay's kernels share one
    and are ordered by when they ran). A stream runs its launches in Plan order, so only the
    next unmatched site of each plan stream is a candidate; among candidates with the record's
    name (and grid) the one on the plan stream this CUDA stream was seen running before wins
    (Q/K/V mat-vecs share a kernel name), else the earliest in the Plan. A record no head fits
    may skip up to ``lookahead`` sites of a stream (a launch the executor did not make).
    ``stream_map`` (CUDA stream id -> plan stream) is learned across calls when passed in.
    """
    smap = stream_map if stream_map is not None else {}
    pending: dict[int, deque[int]] = {}
    for i, s in enumerate(sites):
        pending.setdefault(s.stream, deque()).append(i)
    out: list[str] = []
    for rec in kernels:
        cands = [(ps, q[0], 0) for ps, q in pending.items() if q and _site_matches(sites[q[0]], rec)]
        if not cands:
            for ps, q in pending.items():
                for depth, i in enumerate(list(q)[1:lookahead + 1], start=1):
                    if _site_matches(sites[i], rec):
                        cands.append((ps, i, depth))
                        break
        if not cands:
            out.append("")
            continue
        pref = smap.get(int(rec.get("stream", -1)))
        chosen = next((c for c in cands if c[0] == pref and c[2] == 0), None)
        if chosen is None:
            chosen = min(cands, key=lambda c: (c[2], c[1]))
        ps, i, depth = chosen
        for _ in range(depth + 1):
            pending[ps].popleft()
        smap.setdefault(int(rec.get("stream", -1)), ps)
        out.append(sites[i].node)
    return out


def records_to_trace(records: Iterable[Mapping[str, Any]], token_marks: Sequence[tuple[int, int]] = (),
                     sites: Sequence[KernelSite] = (), copies: Sequence[tuple[str, str]] = (),
                     end_mark: int | None = None, stream_ids: Mapping[int, int] | None = None,
                     **meta: Any) -> Trace:
    """Raw CUPTI records (dicts from ``activity_record``) -> Trace.

    ``token_marks``: (token, host timestamp) at the start of each token's host program;
    ``end_mark``: host timestamp after the last token (later calls get token -1). ``sites``:
    one token's kernel launches (``sites_from_plan``); ``copies``: one token's memcpys
    (``copies_from_plan``), matched in order to give each copy its tensor name as ``node``.
    ``stream_ids``: plan stream -> CUDA stream id of the executor's streams, where known.
    """
    recs = list(records)
    marks = sorted(((int(ts), int(t)) for t, ts in token_marks))
    mark_ts = [ts for ts, _ in marks]
    mark_tok = [t for _, t in marks]

    def token_at(ts: int) -> int:
        if end_mark is not None and ts >= end_mark:
            return -1
        k = bisect_right(mark_ts, ts) - 1
        return mark_tok[k] if k >= 0 else -1

    apis = [r for r in recs if r["src"] in ("runtime", "driver")]
    runtime = sorted((r for r in apis if r["src"] == "runtime"), key=lambda r: r["start"])
    # a driver call made inside a runtime call on the same thread is that call's implementation
    apis = [r for r in apis if r["src"] == "runtime" or not _nested(r, runtime)]
    api_by_corr = {int(r["corr"]): r for r in apis}
    syncs = {int(r["corr"]): r for r in recs if r["src"] == "sync"}

    rows: list[dict[str, Any]] = []
    for r in apis:
        name = api_name(str(r["name"]))
        s = syncs.get(int(r["corr"]))
        rows.append(dict(row=API_ROW, kind="sync" if name in SYNC_APIS else "api", name=name,
                         start_ns=r["start"], end_ns=r["end"], stream=int(s["stream"]) if s else -1,
                         corr_id=r["corr"], token=token_at(int(r["start"])), tid=r.get("tid", -1),
                         pid=r.get("pid", -1)))
    for corr, s in syncs.items():  # a synchronization record whose API call was not traced
        if corr not in api_by_corr:
            rows.append(dict(row=API_ROW, kind="sync", name=str(s.get("name", "Synchronization")),
                             start_ns=s["start"], end_ns=s["end"], stream=s["stream"], corr_id=corr,
                             token=token_at(int(s["start"]))))

    def device_token(r: Mapping[str, Any]) -> tuple[int, int, int]:
        api = api_by_corr.get(int(r["corr"]))
        if api is not None:
            return token_at(int(api["start"])), int(api["start"]), int(api.get("pid", -1))
        return token_at(int(r["start"])), int(r["start"]), -1

    kernels: dict[int, list[dict[str, Any]]] = {}
    for r in recs:
        if r["src"] not in ("kernel", "memcpy", "memset", "graph"):
            continue
        tok, issued, pid = device_token(r)
        name = f"CUDA graph {r.get('graph_id', 0)}" if r["src"] == "graph" else r["name"]
        row = dict(row=stream_row(int(r["stream"])), name=name, start_ns=r["start"], end_ns=r["end"],
                   stream=r["stream"], corr_id=r["corr"], token=tok, graph_id=r.get("graph_id", 0),
                   bytes=r.get("bytes", 0), pid=pid, device=r.get("device", -1), _issued=issued, _rec=r)
        if r["src"] == "kernel":
            row.update(kind="kernel")
            kernels.setdefault(tok, []).append(row)
        else:
            row.update(kind=r["src"], copy_kind=r.get("copy_kind", ""))
        rows.append(row)

    stream_map = {int(cuda): int(ps) for ps, cuda in (stream_ids or {}).items()}
    if sites:
        for tok, ks in sorted(kernels.items()):
            if tok < 0:
                continue
            ks.sort(key=lambda k: (k["_issued"], k["_rec"].get("graph_node_id", 0), k["start_ns"], k["corr_id"]))
            names = match_kernels([dict(k["_rec"]) for k in ks], sites, stream_map)
            for k, n in zip(ks, names):
                k["node"] = n
    if copies:
        by_tok: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            if row.get("kind") == "memcpy" and row["token"] >= 0:
                by_tok.setdefault(row["token"], []).append(row)
        for cs in by_tok.values():
            cs.sort(key=lambda c: (c["_issued"], c["start_ns"]))
            want = deque(copies)
            for c in cs:
                while want and want[0][0] != c["copy_kind"]:
                    want.popleft()
                if want:
                    c["node"] = want.popleft()[1]
    for row in rows:
        row.pop("_issued", None)
        row.pop("_rec", None)
    meta.setdefault("source", "cupti")
    meta["stream_map"] = {str(k): v for k, v in stream_map.items()}
    if not rows:  # nothing recorded (no activity kind that produced records)
        return Trace(pd.DataFrame({c: pd.Series(dtype=t) for c, t in COLUMNS.items()}), meta)
    return Trace.from_records(rows, **meta)


def _nested(r: Mapping[str, Any], runtime: Sequence[Mapping[str, Any]]) -> bool:
    """Whether driver record ``r`` lies inside a runtime record of the same thread."""
    starts = [x["start"] for x in runtime]
    k = bisect_right(starts, r["start"]) - 1
    while k >= 0:
        x = runtime[k]
        if x["end"] >= r["end"] and x.get("tid", -1) == r.get("tid", -1):
            return True
        if r["start"] - x["start"] > 10_000_000:  # 10 ms back is far enough for one call
            return False
        k -= 1
    return False


# --------------------------------------------------------------------------- live capture

def cupti_available() -> bool:
    try:
        from cupti import cupti  # noqa: F401
    except Exception:
        return False
    return True


def activity_record(a: Any, names: dict[tuple[str, int], str]) -> dict[str, Any] | None:
    """One cupti-python activity object -> a plain dict (what ``records_to_trace`` reads and
    what recorded traces keep). ``names`` caches callback names by (domain, cbid)."""
    from cupti import cupti

    kind = cupti.ActivityKind(a.kind).name
    if kind == "CONCURRENT_KERNEL":
        return dict(src="kernel", start=a.start, end=a.end, corr=a.correlation_id, name=a.name,
                    stream=a.stream_id, graph_id=a.graph_id, graph_node_id=a.graph_node_id,
                    grid=(a.grid_x, a.grid_y, a.grid_z), block=(a.block_x, a.block_y, a.block_z),
                    device=a.device_id)
    if kind == "GRAPH_TRACE":
        return dict(src="graph", start=a.start, end=a.end, corr=a.correlation_id, stream=a.stream_id,
                    graph_id=a.graph_id, device=a.device_id)
    if kind in ("RUNTIME", "DRIVER"):
        key = (kind, a.cbid)
        if key not in names:
            dom = cupti.CallbackDomain.DRIVER_API if kind == "DRIVER" else cupti.CallbackDomain.RUNTIME_API
            names[key] = str(cupti.get_callback_name(dom, a.cbid))
        return dict(src=kind.lower(), start=a.start, end=a.end, corr=a.correlation_id, name=names[key],
                    tid=a.thread_id, pid=a.process_id)
    if kind == "MEMCPY":
        ck = cupti.ActivityMemcpyKind(a.copy_kind).name
        trace_kind, label = COPY_KINDS.get(ck, (ck, ck))
        host_side = a.dst_kind if trace_kind == "D2H" else a.src_kind
        mem = cupti.ActivityMemoryKind(host_side).name.replace("_", " ").title()
        name = f"[CUDA memcpy {label}]" + (f" ({mem})" if trace_kind in ("H2D", "D2H") else "")
        return dict(src="memcpy", start=a.start, end=a.end, corr=a.correlation_id, name=name,
                    stream=a.stream_id, bytes=a.bytes, copy_kind=trace_kind, graph_id=a.graph_id,
                    device=a.device_id)
    if kind == "MEMSET":
        return dict(src="memset", start=a.start, end=a.end, corr=a.correlation_id, name="[CUDA memset]",
                    stream=a.stream_id, bytes=a.bytes, graph_id=a.graph_id, device=a.device_id)
    if kind == "SYNCHRONIZATION":
        return dict(src="sync", start=a.start, end=a.end, corr=a.correlation_id, stream=a.stream_id,
                    name=cupti.ActivitySynchronizationType(a.type).name.replace("_", " ").title())
    return None


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
    Why both (H200, llama-3.2-1b, ``benchmarks/trace_overhead.py``, ``data/bench/
    trace_overhead_h200.md``): per-node records make CUPTI instrument every graph launch
    (cudaGraphLaunch 2 -> 50 us) and cost +15-21 % us/token; graph spans cost about +3 %.
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
        self._names: dict[tuple[str, int], str] = {}
        self.marks: list[tuple[int, int]] = []
        self.end_mark: int | None = None
        self._enabled: list[str] = []
        self._level_token: int | None = None
        self.meta.update(graph_trace=graph_trace, node_tokens=sorted(self.node_tokens))

    def _convert(self, a: Any) -> dict[str, Any] | None:
        return activity_record(a, self._names)

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
