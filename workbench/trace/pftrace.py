"""Perfetto's own protobuf trace format (``.pftrace``): what ui.perfetto.dev and trace_processor
read natively, for traces too big for JSON; and the way back, for workbench's own files.

A ``Trace`` proto is a stream of ``TracePacket`` messages (field 1). Written here, hand-encoded
(no generated code needed; field numbers from perfetto's ``protos/perfetto/trace``):

- one ``TrackDescriptor`` per process (host process, ``CUDA HW (GPU n)``) and one child track
  per drawn row / lane of ``workbench.trace.layout`` (PDL overlap gets its own lane, as in JSON);
- one ``TYPE_SLICE_BEGIN`` / ``TYPE_SLICE_END`` pair of ``TrackEvent`` packets per event, the
  kind as category, the Trace columns that differ from their defaults as debug annotations,
  flows (``flow_ids`` / ``terminating_flow_ids``) from each API call to the work it launched;
- first, a ``workbench.trace`` track with one instant event whose annotations hold the format
  version, the time origin and ``Trace.meta`` (``workbench.trace.meta``), so a re-import is exact.

Timestamps are ns since the trace's first event (``t0_ns`` annotation). ``read_pftrace`` reads
files written here (it is not a general Perfetto importer: export other traces to JSON).
"""

from __future__ import annotations

import struct
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from .layout import layout
from .meta import decode_meta, encode_meta
from .perfetto import DEFAULTS, GPU_PID_BASE, HOST_PID, launch_flows
from .table import COLUMNS, Trace, TraceError

FORMAT_VERSION = 1
ROOT_NAME = b"workbench.trace"
META_EVENT = "workbench.meta"
SEQUENCE_ID = 1
# TracePacket
P_TIMESTAMP, P_TRACK_EVENT, P_SEQ_ID, P_TRACK_DESCRIPTOR = 8, 11, 10, 60
# TrackEvent
E_ANNOTATIONS, E_TYPE, E_TRACK_UUID, E_CATEGORIES, E_NAME, E_FLOW_IDS, E_TERMINATING_FLOW_IDS = 4, 9, 11, 22, 23, 47, 48
SLICE_BEGIN, SLICE_END, INSTANT = 1, 2, 3
# TrackDescriptor / ProcessDescriptor
D_UUID, D_NAME, D_PROCESS, D_PARENT = 1, 2, 3, 5
PROC_PID, PROC_NAME = 1, 6
# DebugAnnotation
A_BOOL, A_INT, A_DOUBLE, A_STRING, A_NAME = 2, 4, 5, 6, 10


def _varint_slow(n: int) -> bytes:
    n &= (1 << 64) - 1      # negative int64: ten-byte two's complement, as protobuf writes it
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint_slow(i) for i in range(1 << 14)]   # lengths, ids, small values: one lookup


def _varint(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 16384 else _varint_slow(n)


@cache
def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int_field(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _str_field(field: int, text: str) -> bytes:
    return _bytes_field(field, text.encode())


def _annotation(name: str, value: Any) -> bytes:
    body = _str_field(A_NAME, name)
    if isinstance(value, bool | np.bool_):
        body += _int_field(A_BOOL, int(value))
    elif isinstance(value, int | np.integer):
        body += _int_field(A_INT, int(value))
    elif isinstance(value, float | np.floating):
        body += _key(A_DOUBLE, 1) + struct.pack("<d", float(value))
    else:
        body += _str_field(A_STRING, str(value))
    return _bytes_field(E_ANNOTATIONS, body)


def _packet(body: bytes) -> bytes:
    return _bytes_field(1, body)


def is_pftrace(head: bytes) -> bool:
    """Whether ``head`` (the first bytes of a file) starts a protobuf trace written here."""
    return head[:1] == b"\x0a" and ROOT_NAME in head[:48]


def write_pftrace(trace: Trace, path: str | Path) -> Path:
    """The trace as a Perfetto protobuf file (see the module docstring)."""
    path = Path(path)
    ev = trace.events
    t0 = int(ev["start_ns"].min()) if len(ev) else 0
    extra = [c for c in ev.columns if c not in COLUMNS]
    seq = _int_field(P_SEQ_ID, SEQUENCE_ID)
    with open(path, "wb") as f:
        # the root track first: its name is what ``is_pftrace`` looks for
        f.write(_packet(_bytes_field(P_TRACK_DESCRIPTOR, _bytes_field(D_NAME, ROOT_NAME) + _int_field(D_UUID, 1))))
        info = (_str_field(E_NAME, META_EVENT) + _int_field(E_TYPE, INSTANT) + _int_field(E_TRACK_UUID, 1)
                + _annotation("format", FORMAT_VERSION) + _annotation("t0_ns", t0)
                + _annotation("columns", orjson.dumps({c: str(ev[c].dtype) for c in extra}).decode())
                + _annotation("meta_json", encode_meta(trace.meta)))
        f.write(_packet(_int_field(P_TIMESTAMP, 0) + _bytes_field(P_TRACK_EVENT, info) + seq))

        lay = layout(trace)
        track_uuid = np.zeros(len(lay.tracks), dtype=np.int64)
        procs: dict[int, int] = {}
        proc_label = ""
        for i, t in enumerate(lay.tracks.itertuples()):
            if t.header and t.level == 0:
                proc_label = t.label
            if t.header:
                continue
            pid = (t.pid if t.pid >= 0 else HOST_PID) if t.host else GPU_PID_BASE + max(t.device, 0)
            if pid not in procs:
                procs[pid] = 1_000_000 + len(procs)
                desc = (_int_field(D_UUID, procs[pid]) + _str_field(D_NAME, proc_label)
                        + _bytes_field(D_PROCESS, _int_field(PROC_PID, pid) + _str_field(PROC_NAME, proc_label)))
                f.write(_packet(_bytes_field(P_TRACK_DESCRIPTOR, desc)))
            row = t.row if t.lane == 0 else f"{t.row} · overlap {t.lane}"
            if t.host and t.tid >= 0:
                row = f"{row} [{t.tid}]"
            track_uuid[i] = 2_000_000 + i
            desc = _int_field(D_UUID, int(track_uuid[i])) + _int_field(D_PARENT, procs[pid]) + _str_field(D_NAME, row)
            f.write(_packet(_bytes_field(P_TRACK_DESCRIPTOR, desc)))
        _write_events(f, trace, t0, track_uuid[lay.track], extra, seq)
    return path


def _flows(ev: pd.DataFrame) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Flow ids leaving each API call and ending at each piece of device work (as in JSON)."""
    out: dict[int, list[int]] = {}
    into: dict[int, int] = {}
    work, api = launch_flows(ev)
    for fid, (w, a) in enumerate(zip(work.tolist(), api.tolist()), start=1):
        out.setdefault(a, []).append(fid)
        into[w] = fid
    return out, into


def _write_events(f, trace: Trace, t0: int, uuid_of: np.ndarray, extra: list[str], seq: bytes) -> None:
    ev = trace.events
    n = len(ev)
    start = ev["start_ns"].to_numpy() - t0
    end = ev["end_ns"].to_numpy() - t0
    # packets in time order; at one instant: ends of slices that had a duration, then begins,
    # then ends of zero-length slices (so touching slices of one track do not nest)
    ts = np.concatenate([start, end])
    phase = np.concatenate([np.ones(n, dtype=np.int8), np.where(end > start, 0, 2).astype(np.int8)])
    order = np.lexsort((phase, ts))
    flows_out, flows_in = _flows(ev)
    names, kinds = ev["name"].tolist(), ev["kind"].tolist()
    uuids = uuid_of.tolist()
    arg_cols = ["row"] + list(DEFAULTS) + extra
    col_values = [(c, ev[c].tolist(), DEFAULTS.get(c)) for c in arg_cols]
    cache: dict[tuple, bytes] = {}

    def cached(field: int, text: str) -> bytes:
        k = (field, text)
        b = cache.get(k)
        if b is None:
            b = cache[k] = _str_field(field, text)
        return b

    buf: list[bytes] = []
    ts_list = ts.tolist()
    tracks = {u: _int_field(E_TRACK_UUID, u) for u in set(uuids)}
    k_ts, k_event, k_flow, k_term = _key(P_TIMESTAMP, 0), _key(P_TRACK_EVENT, 2), _key(E_FLOW_IDS, 1), \
        _key(E_TERMINATING_FLOW_IDS, 1)
    begin, end_type = _int_field(E_TYPE, SLICE_BEGIN), _int_field(E_TYPE, SLICE_END)
    for k in order.tolist():
        i = k if k < n else k - n
        track = tracks[uuids[i]]
        if k < n:
            body = cached(E_NAME, names[i]) + cached(E_CATEGORIES, kinds[i]) + begin + track
            for c, values, default in col_values:
                v = values[i]
                if c in DEFAULTS and v == default:
                    continue
                if c == "corr_id":     # nearly unique: not worth caching
                    body += _annotation(c, v)
                    continue
                key = ("a", c, v)
                a = cache.get(key)
                if a is None:
                    a = cache[key] = _annotation(c, v)
                body += a
            for fid in flows_out.get(i, ()):
                body += k_flow + struct.pack("<Q", fid)
            fid = flows_in.get(i)
            if fid is not None:
                body += k_term + struct.pack("<Q", fid)
        else:
            body = end_type + track
        packet = k_ts + _varint(ts_list[k]) + k_event + _varint(len(body)) + body + seq
        buf.append(b"\x0a" + _varint(len(packet)) + packet)
        if len(buf) >= 65_536:
            f.write(b"".join(buf))
            buf.clear()
    f.write(b"".join(buf))


# ----------------------------------------------------------------------------- reading

class _Reader:
    """Protobuf wire-format fields of one message: (field, wire type, value or (start, end))."""

    def __init__(self, data: bytes | memoryview, name: str) -> None:
        self.data, self.name = data, name

    def _fail(self, pos: int, what: str) -> TraceError:
        return TraceError(f"{self.name} is not a valid Perfetto protobuf trace: {what} at byte {pos}; "
                          "the file is truncated or damaged: write it again")

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        shift = result = 0
        data = self.data
        while True:
            if pos >= end:
                raise self._fail(pos, "a number runs past the end of its message")
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift > 63:
                raise self._fail(pos, "a number longer than 10 bytes")

    def fields(self, pos: int, end: int):
        while pos < end:
            at = pos
            key, pos = self.varint(pos, end)
            field, wire = key >> 3, key & 7
            if wire == 0:
                value, pos = self.varint(pos, end)
                yield field, wire, value
            elif wire == 2:
                size, pos = self.varint(pos, end)
                if pos + size > end:
                    raise self._fail(at, f"field {field} needs {size} bytes, {end - pos} are left")
                yield field, wire, (pos, pos + size)
                pos += size
            elif wire in (1, 5):
                width = 8 if wire == 1 else 4
                if pos + width > end:
                    raise self._fail(at, f"field {field} runs past the end")
                yield field, wire, bytes(self.data[pos:pos + width])
                pos += width
            else:
                raise self._fail(at, f"wire type {wire} (field {field}), which this format does not use")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def read_pftrace(path: str | Path) -> Trace:
    """A Trace back from ``write_pftrace``'s file (every column, exact ns times); TraceError naming
    the file and the fault when it is truncated, damaged or not written here."""
    path = Path(path)
    try:
        return _read(path, memoryview(path.read_bytes()))
    except TraceError:
        raise
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, struct.error) as e:
        raise TraceError(f"{path.name} is not a valid Perfetto protobuf trace ({type(e).__name__}: {e}); the file "
                         "is damaged: write it again") from None


def _read(path: Path, data: memoryview) -> Trace:
    r = _Reader(data, path.name)
    info: dict[str, Any] | None = None
    open_slices: dict[int, list[int]] = {}
    rows: list[dict[str, Any]] = []
    ends: list[int] = []
    for field, wire, span in r.fields(0, len(data)):
        if field != 1 or wire != 2:
            raise r._fail(0, f"top-level field {field} (a Trace holds only packets, field 1)")
        ts, event = 0, None
        for pf, _, pv in r.fields(*span):
            if pf == P_TIMESTAMP:
                ts = pv
            elif pf == P_TRACK_EVENT:
                event = pv
        if event is None:
            continue
        kind, track, name, cat, ann = 0, 0, "", "", {}
        for ef, _, ev in r.fields(*event):
            if ef == E_TYPE:
                kind = ev
            elif ef == E_TRACK_UUID:
                track = ev
            elif ef == E_NAME:
                name = bytes(data[ev[0]:ev[1]]).decode()
            elif ef == E_CATEGORIES:
                cat = bytes(data[ev[0]:ev[1]]).decode()
            elif ef == E_ANNOTATIONS:
                k, v = _read_annotation(r, data, ev)
                ann[k] = v
        if kind == INSTANT and name == META_EVENT:
            info = ann
        elif kind == SLICE_BEGIN:
            if info is None:
                raise TraceError(f"{path.name} is a Perfetto protobuf trace not written by workbench (no "
                                 f"{META_EVENT} event before its slices): open it in ui.perfetto.dev")
            rec = dict(DEFAULTS)
            rec.update(ann)
            rec.update(name=name, kind=cat, start_ns=int(info["t0_ns"]) + ts)
            open_slices.setdefault(track, []).append(len(rows))
            rows.append(rec)
            ends.append(-1)
        elif kind == SLICE_END:
            stack = open_slices.get(track)
            if not stack:
                raise r._fail(span[0], f"a slice ends on track {track} where none is open")
            ends[stack.pop()] = int(info["t0_ns"]) + ts
    if info is None:
        raise TraceError(f"{path.name} holds no {META_EVENT} event: not a Perfetto protobuf trace written by "
                         "workbench (open it in ui.perfetto.dev)")
    unclosed = sum(len(s) for s in open_slices.values())
    if unclosed:
        raise TraceError(f"{path.name} is truncated: {unclosed} slice(s) never end; write it again")
    for rec, e in zip(rows, ends):
        rec["end_ns"] = e
    columns = orjson.loads(info.get("columns", "{}"))
    df = pd.DataFrame.from_records(rows, columns=list(COLUMNS) + list(columns)) if rows else \
        pd.DataFrame(columns=list(COLUMNS) + list(columns))
    for c, d in columns.items():
        df[c] = df[c].astype(d)
    return Trace(df, decode_meta(info.get("meta_json", "{}"), f"{path.name}: its meta_json annotation"))


def _read_annotation(r: _Reader, data: memoryview, span: tuple[int, int]) -> tuple[str, Any]:
    name, value = "", None
    for f, _, v in r.fields(*span):
        if f == A_NAME:
            name = bytes(data[v[0]:v[1]]).decode()
        elif f == A_STRING:
            value = bytes(data[v[0]:v[1]]).decode()
        elif f == A_INT:
            value = _signed(v)
        elif f == A_BOOL:
            value = bool(v)
        elif f == A_DOUBLE:
            value = struct.unpack("<d", v)[0]
    return name, value
