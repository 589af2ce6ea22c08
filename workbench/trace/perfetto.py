"""Chrome / Perfetto trace JSON of a Trace (opens in ui.perfetto.dev and chrome://tracing), and
the way back for round trips.

Tracks follow ``workbench.trace.layout``: one process per host process and one per GPU
(``CUDA HW (GPU n)``), one thread per row, and one more thread per lane where events of a row
overlap (PDL kernels of one stream go to ``Stream 7 · overlap 1``), because Chrome JSON slices of
one thread must nest. Every event is an ``X`` slice whose ``args`` carry the Trace columns that
differ from their defaults; a flow (``ac2g``, as Kineto names it) joins each API call to the
device work with its correlation id. Times are microseconds from the first event with ns
precision (``otherData.t0_ns`` holds the origin), so re-import is exact.

File layout (``write_perfetto``): ``otherData`` first, then one trace event per line. Any JSON
reader takes it; ``read_perfetto_file`` streams it instead of parsing one 500 MB document: the
lines go in blocks through Arrow's multi-threaded JSON reader with the schema given up front
(``otherData.columns`` lists the extra columns), so a million-event file loads in seconds with a
peak memory of a few times the table it builds. ``.gz`` is written and read gzip-compressed.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from .layout import is_device_row, layout
from .meta import decode_meta, encode_meta
from .table import COLUMNS, Trace, TraceError

PRODUCER = "workbench"
FORMAT_VERSION = 2          # 2: otherData first, one event per line, meta tagged (workbench.trace.meta)
GPU_PID_BASE = 1 << 30      # above any real pid
HOST_PID = 1                # host process of a trace that does not know its pid
DEFAULTS: dict[str, Any] = {"stream": -1, "corr_id": -1, "token": -1, "node": "", "bytes": 0, "copy_kind": "",
                            "graph_id": 0, "tid": -1, "pid": -1, "device": -1}
HEADER_PREFIX = b'{"otherData":{"producer":"workbench"'
GZIP_MAGIC = b"\x1f\x8b"
GZIP_LEVEL = 3             # level 9 (gzip's default) takes several times longer for a few % smaller files
BLOCK_BYTES = 16 << 20     # Arrow JSON block: large enough for any one event line
WRITE_BATCH = 65_536       # events serialized by one orjson call


def _other_data(trace: Trace, t0: int, flows: int | None) -> dict[str, Any]:
    extra = {c: str(trace.events[c].dtype) for c in trace.events.columns if c not in COLUMNS}
    out: dict[str, Any] = dict(producer=PRODUCER, format=FORMAT_VERSION, t0_ns=t0, columns=extra,
                               meta_json=encode_meta(trace.meta))
    if flows is not None:
        out["flows"] = flows
    return out


def _events(trace: Trace, t0: int, counter: list[int]) -> Iterator[dict[str, Any]]:
    """Every trace event (track names, slices, flows) in file order; ``counter[0]`` ends as the
    number of flows."""
    ev = trace.events
    lay = layout(trace)
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
            yield dict(ph="M", name="process_name", pid=int(pid), args=dict(name=proc_label))
            yield dict(ph="M", name="process_sort_index", pid=int(pid), args=dict(sort_index=i))
        row = t.row if t.lane == 0 else f"{t.row} · overlap {t.lane}"
        if t.host and t.tid >= 0:
            row = f"{row} [{t.tid}]"
        yield dict(ph="M", name="thread_name", pid=int(pid), tid=int(track_tid[i]), args=dict(name=row))
        yield dict(ph="M", name="thread_sort_index", pid=int(pid), tid=int(track_tid[i]), args=dict(sort_index=i))

    pid_of = track_pid[lay.track].tolist()
    tid_of = track_tid[lay.track].tolist()
    start = ((ev["start_ns"].to_numpy() - t0) / 1e3).tolist()
    dur = ((ev["end_ns"].to_numpy() - ev["start_ns"].to_numpy()) / 1e3).tolist()
    extra = [c for c in ev.columns if c not in COLUMNS]
    rows = ev["row"].tolist()
    optional = [(c, ev[c].tolist(), d) for c, d in DEFAULTS.items()]
    always = [(c, ev[c].tolist()) for c in extra]
    names, kinds = ev["name"].tolist(), ev["kind"].tolist()
    for i in range(len(ev)):
        args = {"row": rows[i]}
        args.update((c, v[i]) for c, v, d in optional if v[i] != d)
        args.update((c, v[i]) for c, v in always)
        yield dict(ph="X", name=names[i], cat=kinds[i], ts=start[i], dur=dur[i], pid=pid_of[i], tid=tid_of[i],
                   args=args)

    work, api = launch_flows(ev)
    for fid, (w, a) in enumerate(zip(work.tolist(), api.tolist()), start=1):
        yield dict(ph="s", id=fid, cat="ac2g", name="ac2g", pid=pid_of[a], tid=tid_of[a], ts=start[a])
        yield dict(ph="f", bp="e", id=fid, cat="ac2g", name="ac2g", pid=pid_of[w], tid=tid_of[w], ts=start[w])
    counter[0] = len(work)


def launch_flows(ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The launch flows of a trace (Kineto's ``ac2g``): (device work row, API call row) per
    flow, one for every piece of device work whose correlation id names an API call (its first)."""
    corr = ev["corr_id"].to_numpy()
    device = is_device_row(ev["row"])
    host_api = np.flatnonzero(~device & (corr >= 0) & ev["kind"].isin(["api", "sync"]).to_numpy())
    first_api = pd.Series(host_api, index=corr[host_api])
    first_api = first_api[~first_api.index.duplicated()]
    work = np.flatnonzero(device & (corr >= 0))
    src = first_api.reindex(corr[work]).to_numpy()
    keep = ~np.isnan(src)
    return work[keep], src[keep].astype(np.int64)


def _t0(trace: Trace) -> int:
    return int(trace.events["start_ns"].min()) if len(trace.events) else 0


def to_perfetto(trace: Trace) -> dict[str, Any]:
    """The trace as a Chrome trace-event JSON object."""
    t0, counter = _t0(trace), [0]
    events = list(_events(trace, t0, counter))
    return dict(otherData=_other_data(trace, t0, counter[0]), displayTimeUnit="ns", traceEvents=events)


def write_perfetto(trace: Trace, path: str | Path) -> Path:
    """Chrome / Perfetto JSON, one event per line (gzip-compressed when the name ends in .gz)."""
    path = Path(path)
    t0 = _t0(trace)
    header = orjson.dumps(dict(otherData=_other_data(trace, t0, None), displayTimeUnit="ns"))
    gz = path.suffix.lower() == ".gz"
    raw = gzip.open(path, "wb", compresslevel=GZIP_LEVEL) if gz else open(path, "wb", buffering=1 << 20)
    with raw as f:
        f.write(header[:-1] + b',"traceEvents":[')
        sep, batch = b"\n", []
        for e in _events(trace, t0, [0]):
            batch.append(e)
            if len(batch) == WRITE_BATCH:
                f.write(sep + _lines(batch))
                sep, batch = b",\n", []
        if batch:
            f.write(sep + _lines(batch))
        f.write(b"\n]}\n")
    return path


def _lines(events: list[dict[str, Any]]) -> bytes:
    """Events as JSON, one a line, comma-separated: one ``orjson.dumps`` of the list, split where
    one event ends and the next begins (``},{"ph":`` occurs nowhere else: every event starts with
    its ``ph`` key, and no value is an object followed by another)."""
    return orjson.dumps(events)[1:-1].replace(b'},{"ph":', b'},\n{"ph":')


def is_workbench_json(obj: Any) -> bool:
    return isinstance(obj, dict) and (obj.get("otherData") or {}).get("producer") == PRODUCER


def _meta(other: dict[str, Any], where: str) -> dict[str, Any]:
    if "meta_json" in other:
        return decode_meta(other["meta_json"], where)
    return dict(other.get("meta") or {})      # format 1 wrote plain JSON


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
    return Trace(df, _meta(other, "otherData.meta_json"))


# ----------------------------------------------------------------------------- fast path

_ARROW = {"int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64(), "float32": pa.float32(),
          "bool": pa.bool_()}


def _arrow_type(dtype: str) -> pa.DataType:
    return _ARROW.get(dtype, pa.string())


def open_text(path: Path) -> IO[bytes]:
    """``path`` as a byte stream, gunzipped when it starts with the gzip magic."""
    with open(path, "rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    return gzip.open(path, "rb") if gz else open(path, "rb")


def read_header(path: Path) -> dict[str, Any] | None:
    """``otherData`` of a file ``write_perfetto`` wrote (its first line), else None."""
    with open_text(path) as f:
        try:
            line = f.readline(1 << 24)
        except (OSError, EOFError):
            return None
    if not line.startswith(HEADER_PREFIX):
        return None
    try:
        return orjson.loads(line.rstrip()[:-len(b',"traceEvents":[')] + b"}")["otherData"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


class _Lines:
    """The event lines of a ``write_perfetto`` file as newline-delimited JSON (no array
    punctuation) for Arrow's reader: raw newlines never occur inside JSON strings, so every
    ``,\\n`` ends an event. The flows come last in the file and hold nothing the slices do not
    (their ids are the slices' correlation ids): they are read (the end of the file is checked)
    but not parsed, which halves the parsing."""

    HOLD = 8    # bytes kept back until the end of the file: the closing "]}" must not leak out
    FIRST_FLOW = b'\n{"ph":"s",'

    def __init__(self, f: IO[bytes], path: Path) -> None:
        self.f, self.path = f, path
        self.pending, self.comma, self.done, self.skipping, self.tail = b"", b"", False, False, b""
        self.closed = False
        f.readline(1 << 24)   # the header line

    def _fill(self, n: int) -> None:
        while not self.done and (self.skipping or len(self.pending) < n + self.HOLD):
            try:
                chunk = self.f.read(4 << 20)
            except (EOFError, OSError, gzip.BadGzipFile) as e:
                raise TraceError(f"{self.path.name} is truncated or damaged ({type(e).__name__}: {e}); "
                                 "write it again") from None
            if not chunk:
                self.done = True
                end = self.tail if self.skipping else self.pending + self.comma
                if not end.rstrip().endswith(b"]}"):
                    raise TraceError(f"{self.path.name} is truncated: it ends without the closing ']}}' of "
                                     "traceEvents; write it again")
                if not self.skipping:
                    self.pending = end.rstrip()[:-2] + b"\n"
                self.comma = b""
                return
            if self.skipping:
                self.tail = (self.tail + chunk)[-16:]
                continue
            text = self.comma + chunk
            self.comma = b"," if text.endswith(b",") else b""    # ",\n" may straddle two reads
            if self.comma:
                text = text[:-1]
            before = len(self.pending)
            self.pending += text.replace(b",\n", b"\n")
            at = self.pending.find(self.FIRST_FLOW, max(0, before - len(self.FIRST_FLOW)))
            if at >= 0:
                self.tail = self.pending[-16:] + self.comma
                self.pending, self.skipping = self.pending[:at + 1], True

    def read(self, n: int = -1) -> bytes:
        self._fill(n if n >= 0 else 1 << 62)
        avail = len(self.pending) if self.done else max(0, len(self.pending) - self.HOLD)
        k = avail if n < 0 else min(n, avail)
        out, self.pending = self.pending[:k], self.pending[k:]
        return out

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _schema(other: dict[str, Any]) -> pa.Schema:
    args = [("row", pa.string())] + [(c, pa.string() if isinstance(d, str) else pa.int64())
                                      for c, d in DEFAULTS.items()]
    args += [(c, _arrow_type(d)) for c, d in (other.get("columns") or {}).items()]
    return pa.schema([("ph", pa.string()), ("name", pa.string()), ("cat", pa.string()), ("ts", pa.float64()),
                      ("dur", pa.float64()), ("args", pa.struct(args))])


def read_perfetto_file(path: str | Path, other: dict[str, Any] | None = None) -> Trace:
    """A Trace from a ``write_perfetto`` file, streamed (see the module docstring); exact."""
    path = Path(path)
    other = other if other is not None else read_header(path)
    if other is None:
        raise TraceError(f"{path.name} was not written by workbench.trace.perfetto.write_perfetto "
                         "(its first line is not the workbench otherData header)")
    schema = _schema(other)
    batches = []
    try:
        with open_text(path) as f:
            reader = pj.open_json(_Lines(f, path), read_options=pj.ReadOptions(block_size=BLOCK_BYTES),
                                  parse_options=pj.ParseOptions(explicit_schema=schema,
                                                                unexpected_field_behavior="ignore"))
            for b in reader:
                b = b.filter(pc.equal(b.column("ph"), "X"))
                if b.num_rows:
                    batches.append(b)
    except pa.ArrowInvalid as e:
        if "Empty JSON stream" not in str(e):   # a trace without events has no event lines at all
            raise TraceError(f"{path.name}: an event line is not valid trace-event JSON ({e}); write it again") \
                from None
    if not batches:
        batches = [pa.RecordBatch.from_pylist([], schema=schema)]
    t0 = int(other.get("t0_ns", 0))
    # one Arrow table of the Trace's columns, converted column by column (self_destruct): the
    # batches are let go as their columns are taken, so the load peaks near the table's own size
    names = ["row"] + list(DEFAULTS) + list(other.get("columns") or {})
    cols: dict[str, Any] = {}
    for c in names:
        a = pa.chunked_array([pc.struct_field(b.column("args"), c) for b in batches],
                             type=schema.field("args").type.field(c).type)
        d = DEFAULTS.get(c)
        if c == "row" and a.null_count:
            raise TraceError(f"{path.name}: {a.null_count} slice(s) have no args.row: not written by "
                             "workbench.trace.perfetto")
        cols[c] = pc.fill_null(a, d) if d is not None and a.null_count else a
    ts = pa.chunked_array([b.column("ts") for b in batches]).to_numpy()
    start = t0 + np.rint(ts * 1e3).astype(np.int64)
    del ts
    dur = pa.chunked_array([b.column("dur") for b in batches]).to_numpy()
    end = start + np.rint(dur * 1e3).astype(np.int64)
    del dur
    cols.update(name=pa.chunked_array([b.column("name") for b in batches]),
                kind=pa.chunked_array([b.column("cat") for b in batches]),
                start_ns=pa.array(start), end_ns=pa.array(end))
    del batches, start, end
    table = pa.table(cols)
    del cols
    df = table.to_pandas(self_destruct=True, split_blocks=True)
    del table
    for c, d in (other.get("columns") or {}).items():
        if d not in _ARROW and d not in ("object", "str", "string"):
            df[c] = df[c].astype(d)
    return Trace(df, _meta(other, f"{path.name}: otherData.meta_json"))
