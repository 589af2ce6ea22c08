"""Chrome trace JSON written by the PyTorch profiler (Kineto) into a Trace.

Kineto writes host CUDA calls as ``cuda_runtime`` / ``cuda_driver`` slices on the calling
thread, device work as ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` slices on ``pid = device,
tid = stream`` with ``args.correlation``, CUPTI synchronization records as ``cuda_sync`` and
one ``ac2g`` flow (``s`` on the call, ``f`` on the work, ``id`` = correlation) per launch.
Calls go to the ``CUDA API`` row of their thread (``kind = sync`` for the blocking ones, with
the stream of their ``cuda_sync`` record), work to ``Stream N``; ``user_annotation`` ranges
become NVTX-row markers (``ProfilerStep#N`` gives tokens, see ``workbench.trace.tokens``).
Where an event lacks ``args.correlation``, its flow end supplies it. CPU ops and Python frames
are not CUDA activity and are left out (counted in ``meta['skipped']``).

The file is read column-wise (``workbench.trace.chrome_json``: NumPy finds the events, Arrow
parses them) and every step below works on whole columns, so a million-event trace loads in
seconds and in memory of the order of the Trace table; an ``X`` slice without numeric ``ts`` and
``dur`` is an error naming the file and the event's index in ``traceEvents``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from .chrome_json import KEPT_CATS, NULL, ChromeEvents, Malformed, read_events, read_events_file
from .cupti_names import SYNC_APIS, api_name
from .table import API_ROW, MARKER_ROW, Trace, TraceError, stream_row
from .tokens import tokens_from_markers

HOST_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset",
               "memset": "memset"}
MARKER_CATS = {"user_annotation"}
SYNC_CATS = {"cuda_sync"}
_COPY = [("HtoD", "H2D"), ("DtoH", "D2H"), ("DtoD", "D2D"), ("HtoH", "H2H"), ("PtoP", "P2P")]
_EXPECTED = "Kineto categories cuda_runtime / cuda_driver (host calls) and kernel / gpu_memcpy / gpu_memset (GPU work)"
_HOST, _DEVICE, _SYNC, _MARKER = 1, 2, 3, 4
_CLASS = {**dict.fromkeys(HOST_CATS, _HOST), **dict.fromkeys(DEVICE_CATS, _DEVICE), **dict.fromkeys(SYNC_CATS, _SYNC),
          **dict.fromkeys(MARKER_CATS, _MARKER)}


def _copy_kind(name: str) -> str:
    for token, kind in _COPY:
        if token in name:
            return kind
    return ""


def read_chrome_file(path: str | Path) -> Trace:
    """A PyTorch-profiler / Kineto trace file (``.json`` or gzipped) as a Trace."""
    return read_chrome_trace(read_events_file(Path(path)))


def read_chrome_trace(obj: dict[str, Any] | list[Any] | ChromeEvents) -> Trace:
    """A PyTorch-profiler / Kineto trace (the parsed JSON, or ``chrome_json``'s columns) as a Trace."""
    return _assemble(obj if isinstance(obj, ChromeEvents) else _events_of(obj))


def _events_of(obj: dict[str, Any] | list[Any]) -> ChromeEvents:
    """Parsed JSON through the same column-wise reader as a file (one serialisation by orjson)."""
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        raise TraceError("not a Chrome trace: expected a JSON object with a 'traceEvents' list (or a list of "
                         f"trace events); got {type(events).__name__}")
    try:
        text = orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        return read_events(io.BytesIO(text))
    except (TypeError, orjson.JSONEncodeError) as e:
        raise TraceError(f"trace events are not JSON data ({e})") from None
    except Malformed:
        bad = next((i for i, e in enumerate(events) if not isinstance(e, dict)), -1)
        raise TraceError(f"traceEvents[{bad}] = {events[bad]!r} is not a JSON object (a trace event)") from None


def _assemble(ev: ChromeEvents) -> Trace:
    """The Trace of ``ev``'s columns, which it takes over (``ev.x`` and ``ev.flows`` are emptied,
    so that they are let go as soon as the rows are built)."""
    x, names_v = ev.x, ev.names
    flow_cols, ev.x, ev.flows = ev.flows, {}, {}
    where = f"{ev.source}: " if ev.source else ""
    processes: dict[int, str] = {}
    threads: dict[int, str] = {}
    for what, pid_, tid_, value in ev.names_of:        # the last name given wins
        if what == "process_name":
            processes[pid_] = value
        else:
            threads[tid_] = value

    cls = np.array([_CLASS[c] for c in KEPT_CATS], np.int8)[x["cat"]]
    if not np.isin(cls, (_HOST, _DEVICE)).any():
        raise TraceError(f"{where}no CUDA activity in this Chrome trace: expected {_EXPECTED}; found categories "
                         f"{sorted(ev.x_cats)}. Profile with torch.profiler activities=[ProfilerActivity.CPU, "
                         "ProfilerActivity.CUDA]")
    # the cuda_sync records (the last one of each correlation id), before the columns are let go
    sy = np.flatnonzero(cls == _SYNC)
    corr_x = x.pop("corr")
    corr_x[corr_x == NULL] = -1
    stream_x = x.pop("stream")
    last = pd.Series(sy, index=corr_x[sy]).groupby(level=0, sort=False).last()
    sync_at = last.to_numpy()
    sync = {"corr": last.index.to_numpy(np.int64), "stream": np.where(stream_x[sync_at] == NULL, -1, stream_x[sync_at]),
            "start": x["start"][sync_at], "end": x["end"][sync_at], "name": x["name"][sync_at]}
    del last, sync_at, sy

    # the rows, in file order; each column of ``x`` is let go once taken
    sel = np.flatnonzero(cls != _SYNC)
    c = cls[sel]
    del cls
    host, dev, mark = c == _HOST, c == _DEVICE, c == _MARKER
    corr = np.where(mark, -1, corr_x[sel])
    raw = stream_x[sel]
    del corr_x, stream_x
    tpid, ttid = x.pop("pid")[sel], x.pop("tid")[sel]      # the track of a row: its event's pid and tid
    start, end = x.pop("start")[sel], x.pop("end")[sel]
    stream = np.where(dev, np.where(raw == NULL, ttid, raw), -1)
    raw = x.pop("device")[sel]
    device = np.where(dev, np.where(raw == NULL, tpid, raw), -1)
    raw = x.pop("bytes")[sel]
    nbytes = np.where(dev & (raw != NULL), raw, 0)
    del raw
    on_host = host | mark
    row_pid, row_tid = np.where(on_host, tpid, -1), np.where(on_host, ttid, -1)
    # strings as categorical codes until the Trace is built: a few distinct values each
    nc = x.pop("name")[sel]
    apis = [api_name(v) for v in names_v]
    name_v = list(dict.fromkeys(names_v + apis))
    at = {v: i for i, v in enumerate(name_v)}
    as_api = np.array([at[v] for v in apis] or [0], np.int32)
    name = np.where(host, as_api[nc], nc).astype(np.int32)
    kind_v = ["api", "sync", "kernel", "memcpy", "memset", "marker"]
    sync_api = np.array([a in SYNC_APIS for a in apis] or [False])
    dev_kind = np.array([kind_v.index(DEVICE_CATS.get(k, "kernel")) for k in KEPT_CATS], np.int8)[x.pop("cat")[sel]]
    kind = np.where(host, sync_api[nc].astype(np.int8), np.where(dev, dev_kind, 5)).astype(np.int8)
    copy_v = ["", "H2D", "D2H", "D2D", "H2H", "P2P"]
    copies = np.array([copy_v.index(_copy_kind(v)) for v in names_v] or [0], np.int8)
    copy_kind = np.where(kind == 3, copies[nc], 0).astype(np.int8)
    streams, inverse = np.unique(np.where(dev, stream, -1), return_inverse=True)
    row_v = [API_ROW, MARKER_ROW] + [stream_row(s) for s in streams]
    row = np.where(host, 0, np.where(mark, 1, 2 + inverse)).astype(np.int32)
    del c, inverse, nc, dev_kind, sel, x

    # a cuda_sync record gives its API call the stream it waited on; one without a call is a sync row
    if sync["corr"].size:
        api_at = np.flatnonzero(host & (corr >= 0))
        by_corr = pd.Series(api_at, index=corr[api_at]).groupby(level=0).last()
        hit = np.isin(sync["corr"], by_corr.index)
        to = by_corr.loc[sync["corr"][hit]].to_numpy()
        stream[to] = sync["stream"][hit]
        kind[to] = 1
        add = {k: v[~hit] for k, v in sync.items()}
        k = len(add["corr"])
        if k:
            none, minus = np.zeros(k, np.int64), np.full(k, -1, np.int64)
            raw_name = np.array([at[v] for v in names_v], np.int32)[add["name"]]
            start, end = np.r_[start, add["start"]], np.r_[end, add["end"]]
            corr, stream = np.r_[corr, add["corr"]], np.r_[stream, add["stream"]]
            device, nbytes = np.r_[device, minus], np.r_[nbytes, none]
            name, kind = np.r_[name, raw_name], np.r_[kind, np.ones(k, np.int8)]
            copy_kind, row = np.r_[copy_kind, np.zeros(k, np.int8)], np.r_[row, np.zeros(k, np.int32)]
            row_pid, row_tid, tpid, ttid = (np.r_[a, minus] for a in (row_pid, row_tid, tpid, ttid))
            host, dev = np.r_[host, np.ones(k, bool)], np.r_[dev, np.zeros(k, bool)]
    flows, linked = _link_flows(flow_cols, start, end, corr, host, dev, tpid, ttid)
    del flow_cols, tpid, ttid, host, dev, mark
    # columns put in the Trace's order (start, then end, then file order) one at a time, so that
    # normalising copies nothing and at most one column exists twice
    order = np.lexsort((end, start))
    cols: dict[str, Any] = {"row": row, "kind": kind, "name": name, "start_ns": start, "end_ns": end,
                            "stream": stream, "corr_id": corr, "bytes": nbytes, "copy_kind": copy_kind,
                            "tid": row_tid, "pid": row_pid, "device": device}
    del row, kind, name, start, end, stream, corr, nbytes, copy_kind, row_tid, row_pid, device
    strings = {"row": row_v, "kind": kind_v, "name": name_v, "copy_kind": copy_v}
    for k in list(cols):
        v = cols.pop(k)[order]
        cols[k] = pd.Categorical.from_codes(v, strings[k]) if k in strings else v
    del order
    cols["token"] = np.full(len(cols["start_ns"]), -1, np.int64)
    # tokens from the ProfilerStep markers, on the columns that rule needs (it copies what it gets)
    need = ["row", "kind", "name", "start_ns", "end_ns", "pid", "tid", "corr_id", "token"]
    cols["token"] = tokens_from_markers(pd.DataFrame({k: cols[k] for k in need}, copy=False))["token"].to_numpy()
    df = pd.DataFrame(cols, copy=False)
    del cols
    meta = dict(source="chrome", processes=processes, threads=threads, flows=flows, flows_linked=linked,
                skipped=dict(ev.skipped))
    return Trace(df, meta)


def _link_flows(f: dict[str, np.ndarray], start: np.ndarray, end: np.ndarray, corr: np.ndarray, host: np.ndarray,
                dev: np.ndarray, tpid: np.ndarray, ttid: np.ndarray) -> tuple[int, int]:
    """Give the slices at both ends of every ``ac2g`` flow its id as correlation id where they lack
    one (``corr`` is updated); return the number of flows and how many join an API call to device work.

    An end is the latest-starting row of its track (the event's pid and tid; API calls for the
    start, device work for the end) that encloses the flow event's ts; where two flows find the
    same row, the first in the file takes it."""
    fid, is_s = f["id"], f["s"]
    if not fid.size:
        return 0, 0
    order = pd.unique(fid)                          # flows in order of first appearance
    ok_all = np.ones(len(order), bool)
    for side, rows in ((True, host), (False, dev)):
        at = np.flatnonzero(is_s == side)
        ends = pd.Series(at, index=fid[at]).groupby(level=0).last()
        have = np.isin(order, corr[rows & (corr >= 0)])
        need = np.flatnonzero(~have & pd.Index(order).isin(ends.index))
        e = ends.loc[order[need]].to_numpy()
        target = _enclosing(np.flatnonzero(rows), start, end, tpid, ttid, f["pid"][e], f["tid"][e], f["ts"][e])
        free = target >= 0
        free[free] = corr[target[free]] < 0
        need, target = need[free], target[free]
        _, first = np.unique(target, return_index=True)   # the first flow in order takes a contested row
        need, target = need[first], target[first]
        corr[target] = order[need]
        have[need] = True
        ok_all &= have
    return len(order), int(ok_all.sum())


def _enclosing(cand: np.ndarray, start: np.ndarray, end: np.ndarray, tpid: np.ndarray, ttid: np.ndarray,
               qpid: np.ndarray, qtid: np.ndarray, qts: np.ndarray) -> np.ndarray:
    """For each query (track pid, tid and a time), the candidate row enclosing it: of the rows
    starting at or before it (by start, then file order), the last that has not ended; -1 if none."""
    out = np.full(len(qts), -1, np.int64)
    if not cand.size or not len(qts):
        return out
    keys = pd.MultiIndex.from_arrays([np.r_[tpid[cand], qpid], np.r_[ttid[cand], qtid]])
    code = pd.factorize(keys)[0]
    ccode, qcode = code[:cand.size], code[cand.size:]
    o = np.lexsort((cand, start[cand], ccode))
    cand, ccode = cand[o], ccode[o]
    bounds = np.searchsorted(ccode, np.arange(ccode.max() + 2))
    q_at = np.argsort(qcode, kind="stable")
    q_bounds = np.searchsorted(qcode[q_at], np.arange(ccode.max() + 2))
    for g in range(ccode.max() + 1):
        q = q_at[q_bounds[g]:q_bounds[g + 1]]
        q = q[np.isfinite(qts[q])]
        if not q.size:
            continue
        rows = cand[bounds[g]:bounds[g + 1]]
        s, e = start[rows], end[rows]
        qt = np.rint(qts[q] * 1e3).astype(np.int64)
        k = np.searchsorted(s, qt, side="right") - 1
        ok = k >= 0
        hit = ok.copy()
        hit[ok] = e[k[ok]] >= qt[ok]
        out[q[hit]] = rows[k[hit]]
        reach = np.maximum.accumulate(e)          # latest end so far: no enclosing row where it is before qt
        for i in np.flatnonzero(ok & ~hit & (reach[np.maximum(k, 0)] >= qt)):
            j = np.flatnonzero(e[:k[i] + 1] >= qt[i])
            out[q[i]] = rows[j[-1]]
    return out
