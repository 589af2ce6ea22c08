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
import pyarrow as pa
import pyarrow.compute as pc

from .chrome_json import ChromeEvents, Malformed, int_id, read_events, read_events_file
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


def _codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """A string column as small integer codes and the distinct values (null as "")."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    d = pc.dictionary_encode(pc.fill_null(col, ""))
    return d.indices.to_numpy(zero_copy_only=False), d.dictionary.to_pylist()


def _where(codes: np.ndarray, values: list[str], pred: Any) -> np.ndarray:
    return np.isin(codes, [i for i, v in enumerate(values) if pred(v)])


def _ids(t: pa.Table, c: str, ids: dict[Any, int]) -> np.ndarray:
    """An id column with absent values as the stable negative id of ``None``."""
    a = t.column(c)
    return pc.fill_null(a, int_id(None, ids) if a.null_count else 0).to_numpy()


def _assemble(ev: ChromeEvents) -> Trace:
    t, ids = ev.table, ev.ids
    where = f"{ev.source}: " if ev.source else ""
    ph_c, ph_v = _codes(t.column("ph"))
    cat_c, cat_v = _codes(t.column("cat"))
    name_c, name_v = _codes(t.column("name"))
    is_x = _where(ph_c, ph_v, lambda v: v == "X")
    is_m = _where(ph_c, ph_v, lambda v: v == "M")
    cls = np.array([_CLASS.get(v, 0) for v in cat_v] or [0], np.int8)[cat_c] * is_x
    pid, tid = _ids(t, "pid", ids), _ids(t, "tid", ids)
    ts = pc.fill_null(t.column("ts"), np.nan).to_numpy()
    start_all = np.zeros(len(ts), np.int64)
    finite = np.isfinite(ts)
    start_all[finite] = np.rint(ts[finite] * 1e3).astype(np.int64)
    dur = pc.fill_null(t.column("dur"), 0.0).to_numpy()
    end_all = start_all + np.rint(dur * 1e3).astype(np.int64)
    corr_all = pc.fill_null(t.column("corr"), -1).to_numpy()
    arg_stream = t.column("stream")
    arg_device = t.column("device")

    # named processes and threads (the last name given wins)
    processes: dict[int, str] = {}
    threads: dict[int, str] = {}
    aname = t.column("aname")
    for key, ids_col, out in (("process_name", pid, processes), ("thread_name", tid, threads)):
        sel = np.flatnonzero(is_m & (name_c == (name_v.index(key) if key in name_v else -1)))
        for i, v in zip(sel, aname.take(pa.array(sel)).to_pylist()):
            if v is not None:
                out[int(ids_col[i])] = v

    # the rows, in event order
    sel = np.flatnonzero(np.isin(cls, (_HOST, _DEVICE, _MARKER)))
    c = cls[sel]
    host, dev, mark = c == _HOST, c == _DEVICE, c == _MARKER
    if not (host | dev).any():
        raise TraceError(f"{where}no CUDA activity in this Chrome trace: expected {_EXPECTED}; found categories "
                         f"{sorted(ev.x_cats)}. Profile with torch.profiler activities=[ProfilerActivity.CPU, "
                         "ProfilerActivity.CUDA]")
    n = len(sel)
    start, end = start_all[sel], end_all[sel]
    corr = np.where(mark, -1, corr_all[sel])
    stream = np.full(n, -1, np.int64)
    stream[dev] = np.where(arg_stream.is_null().to_numpy(zero_copy_only=False),
                           tid, pc.fill_null(arg_stream, 0).to_numpy())[sel][dev]
    device = np.full(n, -1, np.int64)
    device[dev] = np.where(arg_device.is_null().to_numpy(zero_copy_only=False),
                           pid, pc.fill_null(arg_device, 0).to_numpy())[sel][dev]
    nbytes = np.where(dev, pc.fill_null(t.column("bytes"), 0).to_numpy()[sel], 0)
    names = np.array(name_v, dtype=object)
    apis = np.array([api_name(v) for v in name_v], dtype=object)
    is_sync_api = np.array([a in SYNC_APIS for a in apis] or [False])
    nc = name_c[sel]
    name = np.where(host, apis[nc], names[nc])
    dev_kind = np.array([DEVICE_CATS.get(v, "") for v in cat_v], dtype=object)[cat_c[sel]]
    kind = np.where(host, np.where(is_sync_api[nc], "sync", "api"), np.where(dev, dev_kind, "marker")).astype(object)
    copies = np.array([_copy_kind(v) for v in name_v], dtype=object)
    copy_kind = np.where(kind == "memcpy", copies[nc], "").astype(object)
    streams, inverse = np.unique(stream, return_inverse=True)
    row = np.where(host, API_ROW, np.where(mark, MARKER_ROW, np.array([stream_row(s) for s in streams],
                                                                      dtype=object)[inverse])).astype(object)
    tpid, ttid = pid[sel], tid[sel]                 # the track of a row: its event's pid and tid
    on_host = host | mark
    row_pid, row_tid = np.where(on_host, tpid, -1), np.where(on_host, ttid, -1)

    # a cuda_sync record gives its API call the stream it waited on; one without a call is a sync row
    sy = np.flatnonzero(cls == _SYNC)
    add = np.zeros(0, np.int64)
    if sy.size:
        last = pd.Series(sy, index=corr_all[sy]).groupby(level=0, sort=False).last()
        sync_stream = pc.fill_null(arg_stream, -1).to_numpy()
        api_at = np.flatnonzero(host & (corr >= 0))
        by_corr = pd.Series(api_at, index=corr[api_at]).groupby(level=0).last()
        hit = last.index.isin(by_corr.index)
        at = by_corr.loc[last.index[hit]].to_numpy()
        stream[at] = sync_stream[last.to_numpy()[hit]]
        kind[at] = "sync"
        add = last.to_numpy()[~hit]
    k = len(add)
    if k:
        start, end = np.r_[start, start_all[add]], np.r_[end, end_all[add]]
        corr, stream = np.r_[corr, corr_all[add]], np.r_[stream, pc.fill_null(arg_stream, -1).to_numpy()[add]]
        device, nbytes = np.r_[device, np.full(k, -1)], np.r_[nbytes, np.zeros(k, np.int64)]
        name, kind = np.r_[name, names[name_c[add]]], np.r_[kind, np.full(k, "sync", object)]
        copy_kind, row = np.r_[copy_kind, np.full(k, "", object)], np.r_[row, np.full(k, API_ROW, object)]
        row_pid, row_tid = np.r_[row_pid, np.full(k, -1)], np.r_[row_tid, np.full(k, -1)]
        tpid, ttid = np.r_[tpid, np.full(k, -1)], np.r_[ttid, np.full(k, -1)]
        host, dev = np.r_[host, np.ones(k, bool)], np.r_[dev, np.zeros(k, bool)]

    flows, linked = _link_flows(t, is_x | is_m, ph_c, ph_v, ts, pid, tid, ids,
                                start, end, corr, host, dev, tpid, ttid)
    df = pd.DataFrame({"row": row, "kind": kind, "name": name, "start_ns": start, "end_ns": end, "stream": stream,
                       "corr_id": corr, "bytes": nbytes, "copy_kind": copy_kind, "tid": row_tid, "pid": row_pid,
                       "device": device})
    del row, kind, name, start, end, stream, corr, nbytes, copy_kind, row_tid, row_pid, device, t
    df = tokens_from_markers(Trace(df).events)
    meta = dict(source="chrome", processes=processes, threads=threads, flows=flows, flows_linked=linked,
                skipped=dict(ev.skipped))
    return Trace(df, meta)


def _link_flows(t: pa.Table, not_flow: np.ndarray, ph_c: np.ndarray, ph_v: list[str], ts: np.ndarray,
                pid: np.ndarray, tid: np.ndarray, ids: dict[Any, int], start: np.ndarray, end: np.ndarray,
                corr: np.ndarray, host: np.ndarray, dev: np.ndarray, tpid: np.ndarray,
                ttid: np.ndarray) -> tuple[int, int]:
    """Give the slices at both ends of every ``ac2g`` flow its id as correlation id where they lack
    one (``corr`` is updated); return the number of flows and how many join an API call to device work.

    An end is the latest-starting row of its track (the event's pid and tid; API calls for the
    start, device work for the end) that encloses the flow event's ts; where two flows find the
    same row, the first in the file takes it."""
    fl = np.flatnonzero(~not_flow)
    if not fl.size:
        return 0, 0
    fid = _ids(t, "id", ids)[fl]
    is_s = _where(ph_c, ph_v, lambda v: v == "s")[fl]
    order = pd.unique(fid)                          # flows in order of first appearance
    ok_all = np.ones(len(order), bool)
    for side, rows, want in ((True, host, host), (False, dev, dev)):
        ends = pd.Series(fl[is_s == side], index=fid[is_s == side]).groupby(level=0).last()
        have = np.isin(order, corr[want & (corr >= 0)])
        need = np.flatnonzero(~have & pd.Index(order).isin(ends.index))
        ev = ends.loc[order[need]].to_numpy()
        target = _enclosing(np.flatnonzero(rows), start, end, tpid, ttid, pid[ev], tid[ev], ts[ev])
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
