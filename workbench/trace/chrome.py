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
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from typing import Any

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


def _int(v: Any, ids: dict[Any, int]) -> int:
    """Chrome pids/tids are usually ints but may be strings; strings get stable negative ids."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return ids.setdefault(v, -1000 - len(ids))


def _copy_kind(name: str) -> str:
    for token, kind in _COPY:
        if token in name:
            return kind
    return ""


def read_chrome_trace(obj: dict[str, Any] | list[Any]) -> Trace:
    """A PyTorch-profiler / Kineto trace (the parsed JSON) as a Trace."""
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if not isinstance(events, list):
        raise TraceError("not a Chrome trace: expected a JSON object with a 'traceEvents' list (or a list of "
                         f"trace events); got {type(events).__name__}")
    ids: dict[Any, int] = {}
    processes: dict[int, str] = {}
    threads: dict[int, str] = {}
    rows: list[dict[str, Any]] = []
    syncs: dict[int, dict[str, Any]] = {}
    flows: dict[int, dict[str, dict[str, Any]]] = {}
    skipped: Counter[str] = Counter()
    for e in events:
        if not isinstance(e, dict):
            raise TraceError(f"trace event {e!r} is not a JSON object")
        ph = e.get("ph")
        cat = str(e.get("cat", "")).lower()
        if ph == "M":
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name" and name is not None:
                processes[_int(e.get("pid"), ids)] = str(name)
            elif e.get("name") == "thread_name" and name is not None:
                threads[_int(e.get("tid"), ids)] = str(name)
            continue
        if ph in ("s", "f", "t") and (cat == "ac2g" or e.get("name") == "ac2g"):
            flows.setdefault(_int(e.get("id"), ids), {})["s" if ph == "s" else "f"] = e
            continue
        if ph != "X":
            continue
        try:
            start = round(float(e["ts"]) * 1e3)
            end = start + round(float(e.get("dur", 0)) * 1e3)
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"slice {e.get('name')!r} needs numeric 'ts' and 'dur' (microseconds)") from None
        args = e.get("args") or {}
        corr = int(args.get("correlation", -1) if args.get("correlation") is not None else -1)
        pid, tid = _int(e.get("pid"), ids), _int(e.get("tid"), ids)
        name = str(e.get("name", ""))
        if cat in HOST_CATS:
            api = api_name(name)
            rows.append(dict(row=API_ROW, kind="sync" if api in SYNC_APIS else "api", name=api, start_ns=start,
                             end_ns=end, corr_id=corr, pid=pid, tid=tid, _track=("h", pid, tid)))
        elif cat in DEVICE_CATS:
            stream = int(args.get("stream", tid))
            device = int(args.get("device", pid))
            kind = DEVICE_CATS[cat]
            rows.append(dict(row=stream_row(stream), kind=kind, name=name, start_ns=start, end_ns=end,
                             stream=stream, corr_id=corr, device=device, bytes=int(args.get("bytes", 0) or 0),
                             copy_kind=_copy_kind(name) if kind == "memcpy" else "", _track=("d", pid, tid)))
        elif cat in SYNC_CATS:
            syncs[corr] = dict(name=name, start_ns=start, end_ns=end, stream=int(args.get("stream", -1)),
                               device=int(args.get("device", pid)))
        elif cat in MARKER_CATS:
            rows.append(dict(row=MARKER_ROW, kind="marker", name=name, start_ns=start, end_ns=end, pid=pid, tid=tid,
                             _track=("h", pid, tid)))
        else:
            skipped[cat or "(none)"] += 1
    if not any(r["kind"] != "marker" for r in rows):
        cats = sorted({str(e.get("cat")) for e in events if isinstance(e, dict) and e.get("ph") == "X"})
        raise TraceError(f"no CUDA activity in this Chrome trace: expected {_EXPECTED}; found categories {cats}. "
                         "Profile with torch.profiler activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")

    # a cuda_sync record gives its API call the stream it waited on
    by_corr_api = {r["corr_id"]: r for r in rows if r["row"] == API_ROW and r["corr_id"] >= 0}
    for corr, s in syncs.items():
        api = by_corr_api.get(corr)
        if api is not None:
            api["stream"] = s["stream"]
            api["kind"] = "sync"
        else:
            rows.append(dict(row=API_ROW, kind="sync", name=s["name"], start_ns=s["start_ns"], end_ns=s["end_ns"],
                             stream=s["stream"], corr_id=corr, _track=("h", -1, -1)))
    linked = _link_flows(rows, flows, ids)
    for r in rows:
        r.pop("_track", None)
    df = tokens_from_markers(Trace.from_records(rows).events)
    meta = dict(source="chrome", processes=processes, threads=threads, flows=len(flows), flows_linked=linked,
                skipped=dict(skipped))
    return Trace(df, meta)


def _link_flows(rows: list[dict[str, Any]], flows: dict[int, dict[str, dict[str, Any]]], ids: dict[Any, int]) -> int:
    """Give both ends of every ``ac2g`` flow its id as correlation id where the slice lacks one;
    return how many flows join an API call to device work."""
    by_track: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_track.setdefault(r["_track"], []).append(r)
    starts = {}
    for k, rs in by_track.items():
        rs.sort(key=lambda r: r["start_ns"])
        starts[k] = [r["start_ns"] for r in rs]

    def enclosing(e: dict[str, Any], host: bool) -> dict[str, Any] | None:
        key = ("h" if host else "d", _int(e.get("pid"), ids), _int(e.get("tid"), ids))
        rs = by_track.get(key)
        if not rs:
            return None
        ts = round(float(e["ts"]) * 1e3)
        k = bisect_right(starts[key], ts) - 1
        while k >= 0 and rs[k]["end_ns"] < ts:
            k -= 1
        return rs[k] if k >= 0 else None

    api_corr = {r["corr_id"] for r in rows if r["row"] == API_ROW and r["corr_id"] >= 0}
    work_corr = {r["corr_id"] for r in rows if r["row"] != API_ROW and r["kind"] != "marker" and r["corr_id"] >= 0}
    linked = 0
    for fid, ends in flows.items():
        ok = 0
        for ph, host, have in (("s", True, api_corr), ("f", False, work_corr)):
            if fid in have:
                ok += 1
                continue
            e = ends.get(ph)
            r = enclosing(e, host) if e is not None else None
            if r is not None and r["corr_id"] < 0:
                r["corr_id"] = fid
                have.add(fid)
                ok += 1
        linked += ok == 2
    return linked
