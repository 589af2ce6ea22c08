"""The Trace: one event table whatever the source (simulator, CUPTI, nsys SQLite, Chrome JSON).

Columns follow DESIGN.md; rows are named as Nsight Systems names them (``CUDA API`` for the
host thread's API calls, ``Stream N`` for device work, ``NVTX`` for markers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: ``graph``: one CUDA graph execution on a stream, recorded at graph level (CUPTI GRAPH_TRACE,
#: Nsight Systems' ``--cuda-graph-trace=graph``) instead of one event per kernel node
KINDS = ("api", "kernel", "memcpy", "memset", "sync", "marker", "graph")

#: column -> dtype. ``stream``/``corr_id``/``token`` are -1 where not applicable; ``node`` is ""
#: for events without a graph node. ``graph_id`` > 0 marks work replayed from a CUDA graph.
COLUMNS: dict[str, str] = {
    "row": "object",
    "kind": "object",
    "name": "object",
    "start_ns": "int64",
    "end_ns": "int64",
    "stream": "int64",
    "corr_id": "int64",
    "token": "int64",
    "node": "object",
    "bytes": "int64",
    "copy_kind": "object",   # "H2D", "D2H", "D2D" for memcpy, "" otherwise
    "graph_id": "int64",
    "tid": "int64",          # host thread id for api/marker rows, -1 otherwise
    "pid": "int64",          # process id (host rows, and device work it launched), -1 if unknown
    "device": "int64",       # GPU index for device work (Stream rows), -1 otherwise
}

API_ROW = "CUDA API"
MARKER_ROW = "NVTX"


def stream_row(stream: int) -> str:
    return f"Stream {stream}"


def rebased(events: pd.DataFrame, origin: int | None = None) -> pd.DataFrame:
    """``events`` with ``start_ns``/``end_ns`` counted from ``origin`` (default: the earliest
    start), still int64. CUPTI stamps are ~1.8e18 ns, where float64's spacing is 256 ns: a gap or
    period computed after any step that makes them float (a shift's or a map's NaN, a merge)
    comes out a multiple of 256 ns. Tables of gaps, steps and periods start from these."""
    if events.empty:
        return events
    o = int(events["start_ns"].min()) if origin is None else int(origin)
    return events.assign(start_ns=events["start_ns"].astype("int64") - o, end_ns=events["end_ns"].astype("int64") - o)


class TraceError(ValueError):
    """A trace (file or table) that does not fit the schema; says what was expected."""


@dataclass
class Trace:
    """An event table plus what produced it (``source``: sim, cupti, nsys, chrome, ...)."""

    events: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.events = normalize(self.events)

    @staticmethod
    def from_records(records: list[dict[str, Any]], **meta: Any) -> Trace:
        return Trace(pd.DataFrame.from_records(records), dict(meta))

    def __len__(self) -> int:
        return len(self.events)

    @property
    def span_ns(self) -> int:
        if self.events.empty:
            return 0
        return int(self.events["end_ns"].max() - self.events["start_ns"].min())

    def of_kind(self, *kinds: str) -> pd.DataFrame:
        return self.events[self.events["kind"].isin(kinds)]

    def tokens(self) -> list[int]:
        t = self.events["token"]
        return sorted(int(x) for x in t[t >= 0].unique())

    def save(self, path: str | Path) -> Path:
        """Write the trace in the format the suffix of ``path`` names (``.parquet`` for anything
        big; see ``workbench.trace.io.save_trace``); ``workbench.trace.io.load_trace`` reads it back."""
        from .io import save_trace

        return save_trace(self, path)


def _copy_on_write() -> bool:
    return int(pd.__version__.split(".")[0]) >= 3 or pd.options.mode.copy_on_write is True


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Fill optional columns, enforce dtypes, check required ones and value ranges, sort by start."""
    required = ("row", "kind", "name", "start_ns", "end_ns")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceError(f"trace table is missing column(s) {missing}; required: {list(required)}")
    # columns are replaced below, never written into; under copy-on-write (pandas 3) a shallow copy
    # keeps the caller's table as it is without copying a million rows
    df = df.copy(deep=not _copy_on_write())
    defaults = {"stream": -1, "corr_id": -1, "token": -1, "node": "", "bytes": 0, "copy_kind": "",
                "graph_id": 0, "tid": -1, "pid": -1, "device": -1}
    for col, default in defaults.items():
        if col not in df.columns:
            df[col] = default
        else:
            df[col] = df[col].fillna(default) if df[col].dtype == object or df[col].isna().any() else df[col]
    bad = sorted(set(df["kind"].unique()) - set(KINDS))
    if bad:
        raise TraceError(f"unknown event kind(s) {bad}; expected {list(KINDS)}")
    for col, dtype in COLUMNS.items():
        df[col] = df[col].astype(dtype) if dtype != "object" else df[col].astype(str)
    if (df["end_ns"] < df["start_ns"]).any():
        n = int((df["end_ns"] < df["start_ns"]).sum())
        raise TraceError(f"{n} event(s) end before they start")
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[list(COLUMNS) + extra]
    order = np.lexsort((df["end_ns"].to_numpy(), df["start_ns"].to_numpy()))
    if (order == np.arange(len(order))).all():  # already sorted (the simulator's tables): skip the copy
        return df.reset_index(drop=True)
    return df.iloc[order].reset_index(drop=True)
