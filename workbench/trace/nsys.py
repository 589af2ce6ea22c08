"""Nsight Systems SQLite exports (``nsys export --type sqlite``) into a Trace.

Tables read (documented export schema; all times are ns from the session start):

- ``CUPTI_ACTIVITY_KIND_RUNTIME``: host CUDA calls (``nameId`` -> StringIds, ``globalTid``,
  ``correlationId``) -> ``CUDA API`` row of the thread; blocking ones are ``kind = sync``.
- ``CUPTI_ACTIVITY_KIND_KERNEL``: kernels (``shortName`` / ``demangledName`` -> StringIds,
  ``deviceId``, ``streamId``, ``correlationId``, ``globalPid``, ``graphId`` / ``graphNodeId``).
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` (``copyKind``: 1 HtoD, 2 DtoH, 8 DtoD, 9 HtoH, 10 PtoP,
  ``bytes``) and ``CUPTI_ACTIVITY_KIND_MEMSET``.
- ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` (``syncType``: 1 event sync, 2 stream wait event,
  3 stream sync, 4 context sync): gives its API call the stream it waited on.
- ``NVTX_EVENTS`` (``eventType`` 34 mark, 59 push/pop range, 60 start/end range; ``text`` or
  ``textId``): markers on the thread's NVTX row; ``token N`` ranges give tokens.
- ``ThreadNames``, ``PROCESSES``, ``TARGET_INFO_GPU`` (+ ``TARGET_INFO_CUDA_DEVICE``): row labels.

``globalTid`` / ``globalPid`` pack the ids: pid = (g >> 24) & 0xFFFFFF, tid = g & 0xFFFFFF.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd

from .cupti_names import COPY_KIND_VALUES, SYNC_APIS, api_name
from .cupti_names import COPY_KINDS as CUPTI_COPY_KINDS
from .table import API_ROW, MARKER_ROW, Trace, TraceError
from .tokens import tokens_from_markers

CUDA_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
               "CUPTI_ACTIVITY_KIND_MEMSET")
#: the export's copyKind values -> (the Trace's ``copy_kind``, Nsight Systems' memcpy label)
COPY_KINDS = {value: CUPTI_COPY_KINDS[name] for value, name in COPY_KIND_VALUES.items()}
SYNC_TYPES = {1: "Event synchronize", 2: "Stream wait event", 3: "Stream synchronize", 4: "Context synchronize"}
BLOCKING_SYNC_TYPES = (1, 3, 4)
NVTX_RANGES = (59, 60)
NVTX_MARK = 34


def _pid(g: pd.Series) -> np.ndarray:
    return ((g.fillna(0).astype(np.int64).to_numpy() >> 24) & 0xFFFFFF).astype(np.int64)


def _tid(g: pd.Series) -> np.ndarray:
    return (g.fillna(0).astype(np.int64).to_numpy() & 0xFFFFFF).astype(np.int64)


class _Db:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            names = self.con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except sqlite3.DatabaseError as e:
            raise TraceError(f"{path.name} is not a readable SQLite database ({e}): expected an Nsight Systems "
                             "export made with `nsys export --type sqlite`") from None
        self.tables = {n for (n,) in names}

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self.con.execute(f"PRAGMA table_info('{table}')")]

    def read(self, table: str, wanted: list[str], required: list[str]) -> pd.DataFrame | None:
        if table not in self.tables:
            return None
        have = self.columns(table)
        missing = [c for c in required if c not in have]
        if missing:
            raise TraceError(f"{self.path.name}: table {table} lacks column(s) {missing}; expected the documented "
                             f"nsys export schema with {required}")
        cols = [c for c in wanted if c in have]
        return pd.read_sql_query(f"SELECT {', '.join(f'[{c}]' for c in cols)} FROM {table}", self.con)


def read_nsys_sqlite(path: str | Path) -> Trace:
    """An ``nsys export --type sqlite`` database as a Trace."""
    path = Path(path)
    db = _Db(path)
    try:
        return _read(db)
    finally:
        db.con.close()


def _read(db: _Db) -> Trace:
    present = [t for t in CUDA_TABLES if t in db.tables]
    if "StringIds" not in db.tables or not present:
        raise TraceError(f"{db.path.name} is not an Nsight Systems export with CUDA activity: expected tables "
                         f"StringIds and {', '.join(CUDA_TABLES)}; found {sorted(db.tables)[:12]}. Collect with "
                         "`nsys profile --trace=cuda,nvtx` and export with `nsys export --type sqlite`")
    strings = dict(db.con.execute("SELECT id, value FROM StringIds").fetchall())

    def text(ids: pd.Series) -> list[str]:
        return [strings.get(int(i), f"<string {int(i)}>") if pd.notna(i) else "" for i in ids]

    parts: list[pd.DataFrame] = []
    rt = db.read("CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end", "globalTid", "correlationId", "nameId"],
                 ["start", "end", "correlationId", "nameId"])
    if rt is not None and len(rt):
        names = pd.Series([api_name(n) for n in text(rt["nameId"])], index=rt.index)
        gt = rt["globalTid"] if "globalTid" in rt else pd.Series(0, index=rt.index)
        api = pd.DataFrame(dict(row=API_ROW, kind=np.where(names.isin(SYNC_APIS), "sync", "api"), name=names,
                                start_ns=rt["start"], end_ns=rt["end"], corr_id=rt["correlationId"],
                                pid=_pid(gt), tid=_tid(gt)))
        sy = db.read("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", ["start", "end", "streamId", "correlationId", "syncType"],
                     ["start", "end", "correlationId"])
        if sy is not None and len(sy):
            api = _merge_syncs(api, sy)
        parts.append(api)

    graph_of_corr = {}
    if parts:
        g = parts[0][parts[0]["name"].str.contains("GraphLaunch", regex=False)]
        graph_of_corr = dict.fromkeys(g["corr_id"].tolist(), 1)
    for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        df = db.read(table, ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "shortName",
                             "demangledName", "graphId", "graphNodeId", "bytes", "copyKind"],
                     ["start", "end", "streamId"] + (["shortName"] if kind == "kernel" else []))
        if df is None or df.empty:
            continue
        parts.append(_device(df, kind, text, graph_of_corr))

    nv = db.read("NVTX_EVENTS", ["start", "end", "eventType", "text", "textId", "globalTid"], ["start", "eventType"])
    if nv is not None and len(nv):
        nv = nv[nv["eventType"].isin(NVTX_RANGES + (NVTX_MARK,))]
        if len(nv):
            label = nv["text"] if "text" in nv else pd.Series(None, index=nv.index)
            if "textId" in nv:
                label = label.where(label.notna(), pd.Series(text(nv["textId"]), index=nv.index))
            end = nv["end"].where(nv["end"].notna() & (nv["end"] >= nv["start"]), nv["start"])
            gt = nv["globalTid"] if "globalTid" in nv else pd.Series(0, index=nv.index)
            parts.append(pd.DataFrame(dict(row=MARKER_ROW, kind="marker", name=label.fillna("").astype(str),
                                           start_ns=nv["start"], end_ns=end, pid=_pid(gt), tid=_tid(gt))))

    if not parts:
        raise TraceError(f"{db.path.name}: the CUDA activity tables are empty (nothing was traced)")
    df = pd.concat(parts, ignore_index=True)
    df = tokens_from_markers(Trace(df).events)
    return Trace(df, dict(source="nsys", **_names(db, text)))


def _merge_syncs(api: pd.DataFrame, sy: pd.DataFrame) -> pd.DataFrame:
    """SYNCHRONIZATION records: the stream each blocking call waited on; a record whose call
    was not traced becomes a sync event of its own."""
    stype = sy["syncType"] if "syncType" in sy else pd.Series(3, index=sy.index)
    stream = sy["streamId"] if "streamId" in sy else pd.Series(-1, index=sy.index)
    rec = pd.DataFrame(dict(corr_id=sy["correlationId"], _stream=stream.fillna(-1).astype(np.int64),
                            _type=stype.fillna(0).astype(np.int64), start_ns=sy["start"], end_ns=sy["end"]))
    rec = rec.drop_duplicates("corr_id")
    api = api.merge(rec[["corr_id", "_stream", "_type"]], on="corr_id", how="left")
    matched = api["_type"].notna()
    api["stream"] = np.where(matched, api["_stream"].fillna(-1), -1).astype(np.int64)
    blocking = matched & api["_type"].isin(BLOCKING_SYNC_TYPES)
    api["kind"] = np.where(blocking, "sync", api["kind"])
    orphans = rec[~rec["corr_id"].isin(api["corr_id"])]
    if len(orphans):
        api = pd.concat([api, pd.DataFrame(dict(
            row=API_ROW, kind=np.where(orphans["_type"].isin(BLOCKING_SYNC_TYPES), "sync", "api"),
            name=[SYNC_TYPES.get(int(t), "Synchronization") for t in orphans["_type"]],
            start_ns=orphans["start_ns"], end_ns=orphans["end_ns"], stream=orphans["_stream"],
            corr_id=orphans["corr_id"]))], ignore_index=True)
    return api.drop(columns=["_stream", "_type"])


def _device(df: pd.DataFrame, kind: str, text, graph_of_corr: dict[int, int]) -> pd.DataFrame:
    stream = df["streamId"].astype(np.int64)
    corr = df["correlationId"].fillna(-1).astype(np.int64) if "correlationId" in df else pd.Series(-1, index=df.index)
    out = pd.DataFrame(dict(row=[f"Stream {s}" for s in stream], kind=kind, start_ns=df["start"], end_ns=df["end"],
                            stream=stream, corr_id=corr,
                            device=df["deviceId"].fillna(-1).astype(np.int64) if "deviceId" in df else 0,
                            pid=_pid(df["globalPid"]) if "globalPid" in df else -1))
    if kind == "kernel":
        short = pd.Series(text(df["shortName"]), index=df.index)
        if "demangledName" in df:
            short = short.where(short != "", pd.Series(text(df["demangledName"]), index=df.index))
        out["name"] = short
        if "graphId" in df:
            gid = df["graphId"].fillna(0).astype(np.int64)
        elif "graphNodeId" in df:
            gid = (df["graphNodeId"].fillna(0) > 0).astype(np.int64)
        else:
            gid = pd.Series(0, index=df.index)
        from_call = corr.map(graph_of_corr).fillna(0).astype(np.int64)
        out["graph_id"] = np.maximum(gid.to_numpy(), from_call.to_numpy())
    elif kind == "memcpy":
        ck = df["copyKind"].fillna(0).astype(np.int64) if "copyKind" in df else pd.Series(0, index=df.index)
        out["copy_kind"] = [COPY_KINDS.get(int(k), ("", ""))[0] for k in ck]
        out["name"] = [f"[CUDA memcpy {COPY_KINDS.get(int(k), ('', 'Unknown'))[1]}]" for k in ck]
        out["bytes"] = df["bytes"].fillna(0).astype(np.int64) if "bytes" in df else 0
    else:
        out["name"] = "[CUDA memset]"
        out["bytes"] = df["bytes"].fillna(0).astype(np.int64) if "bytes" in df else 0
    return out


def _names(db: _Db, text) -> dict[str, dict[int, str]]:
    """Process, thread and GPU names for the row labels, where the export has them."""
    out: dict[str, dict[int, str]] = {"processes": {}, "threads": {}, "devices": {}}
    tn = db.read("ThreadNames", ["nameId", "globalTid"], ["nameId", "globalTid"])
    if tn is not None:
        for tid, name in zip(_tid(tn["globalTid"]), text(tn["nameId"])):
            out["threads"][int(tid)] = name
    pr = db.read("PROCESSES", ["pid", "name"], ["pid", "name"])
    if pr is not None:
        out["processes"] = {int(p): str(n) for p, n in zip(pr["pid"], pr["name"]) if pd.notna(p)}
    gpu = db.read("TARGET_INFO_GPU", ["id", "name"], ["id", "name"])
    if gpu is not None:
        by_gpu = {int(i): str(n) for i, n in zip(gpu["id"], gpu["name"])}
        cuda = db.read("TARGET_INFO_CUDA_DEVICE", ["cudaId", "gpuId"], ["cudaId", "gpuId"])
        pairs = zip(cuda["cudaId"], cuda["gpuId"]) if cuda is not None else ((i, i) for i in by_gpu)
        out["devices"] = {int(c): by_gpu[int(g)] for c, g in pairs if int(g) in by_gpu}
    return out
