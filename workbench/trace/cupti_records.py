"""CUPTI activity records (plain dicts) -> the Trace table, with tokens and graph nodes.

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

Pure: no CUPTI import, so recorded records convert (and are tested) on any machine. The live
capture (``trace.cupti``) turns each cupti-python activity into a dict with
``activity_to_record`` and hands the dicts to ``records_to_trace``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from .cupti_names import COPY_KINDS, SYNC_APIS, api_name, kernel_base_name
from .table import API_ROW, COLUMNS, Trace, stream_row

if TYPE_CHECKING:  # pragma: no cover
    from ..strategy.plan import Plan

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
    """Raw CUPTI records (dicts from ``activity_to_record``) -> Trace.

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


#: ``name_of(enum, value)``: the name of a CUPTI enum value, for the enums ``ActivityKind``,
#: ``ActivityMemcpyKind``, ``ActivityMemoryKind`` and ``ActivitySynchronizationType``, and for
#: ``RUNTIME`` / ``DRIVER`` the name of the API call with that callback id
EnumNames = Callable[[str, int], str]


def activity_to_record(a: Any, name_of: EnumNames) -> dict[str, Any] | None:
    """One CUPTI activity (an object with cupti-python's attribute names) -> a plain dict: what
    ``records_to_trace`` reads and what recorded traces keep. None for kinds not traced.
    ``name_of`` resolves CUPTI's enum values, so this needs no CUPTI import."""
    kind = name_of("ActivityKind", a.kind)
    if kind == "CONCURRENT_KERNEL":
        return dict(src="kernel", start=a.start, end=a.end, corr=a.correlation_id, name=a.name,
                    stream=a.stream_id, graph_id=a.graph_id, graph_node_id=a.graph_node_id,
                    grid=(a.grid_x, a.grid_y, a.grid_z), block=(a.block_x, a.block_y, a.block_z),
                    device=a.device_id)
    if kind == "GRAPH_TRACE":
        return dict(src="graph", start=a.start, end=a.end, corr=a.correlation_id, stream=a.stream_id,
                    graph_id=a.graph_id, device=a.device_id)
    if kind in ("RUNTIME", "DRIVER"):
        return dict(src=kind.lower(), start=a.start, end=a.end, corr=a.correlation_id, name=name_of(kind, a.cbid),
                    tid=a.thread_id, pid=a.process_id)
    if kind == "MEMCPY":
        ck = name_of("ActivityMemcpyKind", a.copy_kind)
        trace_kind, label = COPY_KINDS.get(ck, (ck, ck))
        host_side = a.dst_kind if trace_kind == "D2H" else a.src_kind
        mem = name_of("ActivityMemoryKind", host_side).replace("_", " ").title()
        name = f"[CUDA memcpy {label}]" + (f" ({mem})" if trace_kind in ("H2D", "D2H") else "")
        return dict(src="memcpy", start=a.start, end=a.end, corr=a.correlation_id, name=name,
                    stream=a.stream_id, bytes=a.bytes, copy_kind=trace_kind, graph_id=a.graph_id,
                    device=a.device_id)
    if kind == "MEMSET":
        return dict(src="memset", start=a.start, end=a.end, corr=a.correlation_id, name="[CUDA memset]",
                    stream=a.stream_id, bytes=a.bytes, graph_id=a.graph_id, device=a.device_id)
    if kind == "SYNCHRONIZATION":
        return dict(src="sync", start=a.start, end=a.end, corr=a.correlation_id, stream=a.stream_id,
                    name=name_of("ActivitySynchronizationType", a.type).replace("_", " ").title())
    return None
