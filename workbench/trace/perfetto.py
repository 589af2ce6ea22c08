"""Chrome / Perfetto trace JSON of a Trace (opens in ui.perfetto.dev and chrome://tracing), and
the way back for round trips.

Tracks follow ``workbench.trace.layout``: one process per host process and one per GPU
(``CUDA HW (GPU n)``), one thread per row, and one more thread per lane where events of a row
overlap (PDL kernels of one stream go to ``Stream 7 · overlap 1``), because Chrome JSON slices of
one thread must nest. Every event is an ``X`` slice whose ``args`` carry the Trace columns that
differ from their defaults; a flow (``ac2g``, as Kineto names it) joins each API call to the
device work with its correlation id. Times are microseconds from the first event with ns
precision (``otherData.t0_ns`` holds the origin), so re-import is exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .layout import is_device_row, layout
from .table import COLUMNS, Trace, TraceError

PRODUCER = "workbench"
FORMAT_VERSION = 1
GPU_PID_BASE = 1 << 30      # above any real pid
HOST_PID = 1                # host process of a trace that does not know its pid
DEFAULTS: dict[str, Any] = {"stream": -1, "corr_id": -1, "token": -1, "node": "", "bytes": 0, "copy_kind": "",
                            "graph_id": 0, "tid": -1, "pid": -1, "device": -1}


def _jsonable(meta: dict) -> Any:
    return json.loads(json.dumps(meta, default=str))


def to_perfetto(trace: Trace) -> dict[str, Any]:
    """The trace as a Chrome trace-event JSON object."""
    ev = trace.events
    lay = layout(trace)
    t0 = int(ev["start_ns"].min()) if len(ev) else 0
    meta = trace.meta
    out: list[dict[str, Any]] = []

    tracks = lay.tracks
    track_pid = np.zeros(len(tracks), dtype=np.int64)
    track_tid = np.arange(1, len(tracks) + 1, dtype=np.int64)   # one Chrome thread per track
    named: set[int] = set()
    proc_label = ""
    for i, t in enumerate(tracks.itertuples()):
        if t.host:
            pid = t.pid if t.pid >= 0 else HOST_PID
        else:
            pid = GPU_PID_BASE + max(t.device, 0)
        track_pid[i] = pid
        if t.header and t.level == 0:
            proc_label = t.label
        if t.header:
            continue
        if pid not in named:
            named.add(pid)
            out.append(dict(ph="M", name="process_name", pid=int(pid), args=dict(name=proc_label)))
            out.append(dict(ph="M", name="process_sort_index", pid=int(pid), args=dict(sort_index=i)))
        row = t.row if t.lane == 0 else f"{t.row} · overlap {t.lane}"
        if t.host and t.tid >= 0:
            row = f"{row} [{t.tid}]"
        out.append(dict(ph="M", name="thread_name", pid=int(pid), tid=int(track_tid[i]), args=dict(name=row)))
        out.append(dict(ph="M", name="thread_sort_index", pid=int(pid), tid=int(track_tid[i]),
                        args=dict(sort_index=i)))

    pid_of = track_pid[lay.track]
    tid_of = track_tid[lay.track]
    start = ev["start_ns"].to_numpy() - t0
    dur = ev["end_ns"].to_numpy() - ev["start_ns"].to_numpy()
    extra = [c for c in ev.columns if c not in COLUMNS]
    arg_cols = ["row"] + list(DEFAULTS) + extra
    col_values = {c: ev[c].tolist() for c in arg_cols}
    names, kinds = ev["name"].tolist(), ev["kind"].tolist()
    for i in range(len(ev)):
        args: dict[str, Any] = {}
        for c in arg_cols:
            v = col_values[c][i]
            if c in DEFAULTS and v == DEFAULTS[c]:
                continue
            args[c] = v.item() if isinstance(v, np.generic) else v
        out.append(dict(ph="X", name=names[i], cat=kinds[i], ts=start[i] / 1e3, dur=dur[i] / 1e3,
                        pid=int(pid_of[i]), tid=int(tid_of[i]), args=args))

    # flows: API call -> each piece of device work with its correlation id
    corr = ev["corr_id"].to_numpy()
    device = is_device_row(ev["row"])
    host_api = np.flatnonzero(~device & (corr >= 0) & ev["kind"].isin(["api", "sync"]).to_numpy())
    first_api = pd.Series(host_api, index=corr[host_api])
    first_api = first_api[~first_api.index.duplicated()]
    work = np.flatnonzero(device & (corr >= 0))
    src = first_api.reindex(corr[work]).to_numpy()
    flow_id = 0
    for w, a in zip(work, src):
        if np.isnan(a):
            continue
        a = int(a)
        flow_id += 1
        out.append(dict(ph="s", id=flow_id, cat="ac2g", name="ac2g", pid=int(pid_of[a]), tid=int(tid_of[a]),
                        ts=start[a] / 1e3))
        out.append(dict(ph="f", bp="e", id=flow_id, cat="ac2g", name="ac2g", pid=int(pid_of[w]),
                        tid=int(tid_of[w]), ts=start[w] / 1e3))
    return dict(traceEvents=out, displayTimeUnit="ns",
                otherData=dict(producer=PRODUCER, format=FORMAT_VERSION, t0_ns=t0, flows=flow_id,
                               meta=_jsonable(meta)))


def write_perfetto(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    with open(path, "w") as f:
        json.dump(to_perfetto(trace), f, separators=(",", ":"))
    return path


def is_workbench_json(obj: Any) -> bool:
    return isinstance(obj, dict) and (obj.get("otherData") or {}).get("producer") == PRODUCER


def from_perfetto(obj: dict[str, Any]) -> Trace:
    """A Trace back from ``to_perfetto``'s JSON (every column, exact ns times)."""
    if not is_workbench_json(obj):
        raise TraceError("not a workbench Perfetto export: expected otherData.producer == 'workbench' "
                         "(use workbench.trace.chrome for PyTorch-profiler / Kineto traces)")
    other = obj["otherData"]
    t0 = int(other.get("t0_ns", 0))
    records: list[dict[str, Any]] = []
    for e in obj.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if "row" not in args:
            raise TraceError(f"slice {e.get('name')!r} has no args.row: this file was not written by "
                             "workbench.trace.perfetto")
        start = t0 + round(float(e["ts"]) * 1e3)
        rec = dict(DEFAULTS)
        rec.update(args)
        rec.update(name=e["name"], kind=e.get("cat", ""), start_ns=start, end_ns=start + round(float(e["dur"]) * 1e3))
        records.append(rec)
    df = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=list(COLUMNS))
    meta = dict(other.get("meta") or {})
    return Trace(df, meta)
