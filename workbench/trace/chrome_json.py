"""The ``traceEvents`` of a Chrome trace JSON file as NumPy columns, without a Python object per event.

A PyTorch-profiler trace of a million events is a few hundred MB of JSON; parsed into Python
dicts it takes many times that and tens of seconds. Here the text is streamed (gunzipped when
it starts with the gzip magic) in chunks; NumPy finds where each element of the ``traceEvents``
array begins and ends (braces and brackets outside strings, quotes with their backslash escapes),
the chunk is re-framed as newline-delimited JSON (one event a line) and Arrow's JSON reader parses
it into typed columns; of those only the fields and the events ``workbench.trace.chrome`` uses are
kept, as compact NumPy arrays (names as codes), so memory stays of the order of the Trace table.

Real Kineto traces mix types in a field (``pid: "Spans"`` beside numeric pids); a block Arrow
refuses is parsed with orjson and converted in Python, so only such blocks pay the per-event
cost. Any syntax fault is reported by re-reading the file with orjson, which says where it is.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from .table import TraceError

CHUNK = 4 << 20             # bytes of JSON text scanned and parsed at a time: the transient memory
SMALL = 512                 # events in a block parsed in Python where Arrow refuses it (mixed types)
_BLANK_NEWLINES = bytes.maketrans(b"\n\r", b"  ")   # raw newlines are only whitespace in valid JSON
_SPECIAL = bytes(int(chr(i) in '"\\{}[]') for i in range(256))   # translate: the bytes _structure looks at -> 1
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:\s*$')

#: the categories (lower case) whose ``X`` slices ``workbench.trace.chrome`` turns into rows
KEPT_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver", "kernel", "gpu_memcpy", "memcpy", "gpu_memset",
             "memset", "user_annotation", "cuda_sync")
_ARGS = pa.struct([("correlation", pa.int64()), ("stream", pa.int64()), ("device", pa.int64()),
                   ("bytes", pa.int64()), ("name", pa.string())])
#: what Arrow reads of each event; every other field is ignored
SCHEMA = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("pid", pa.int64()),
                    ("tid", pa.int64()), ("ts", pa.float64()), ("dur", pa.float64()), ("id", pa.int64()),
                    ("args", _ARGS)])
#: one block's events as flat columns: ``idx`` is the event's index in traceEvents; ``pid``/``tid``/``id``
#: are null where absent (or, from the Python fallback, strings already mapped to negative ids)
FLAT = pa.schema([("idx", pa.int64()), ("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()),
                  ("pid", pa.int64()), ("tid", pa.int64()), ("ts", pa.float64()), ("dur", pa.float64()),
                  ("id", pa.int64()), ("corr", pa.int64()), ("stream", pa.int64()), ("device", pa.int64()),
                  ("bytes", pa.int64()), ("aname", pa.string())])
_ARG_COLS = {"corr": "correlation", "stream": "stream", "device": "device", "bytes": "bytes", "aname": "name"}


class Malformed(Exception):
    """The text is not the JSON it should be; the caller re-reads it with orjson to say where."""


#: null in an integer column of ``ChromeEvents.x``
NULL = np.iinfo(np.int64).min
_X_COLS = ("cat", "name", "pid", "tid", "start", "end", "corr", "stream", "device", "bytes")
_FLOW_COLS = ("id", "s", "pid", "tid", "ts")


@dataclass
class ChromeEvents:
    """A Chrome trace's events, read column-wise: NumPy columns of what ``workbench.trace.chrome``
    uses, counts of the rest. ``root``: the top-level object without its events (None for a bare list).

    ``x``: the X slices of ``KEPT_CATS`` in file order (``cat``: index in ``KEPT_CATS``, ``name``:
    index in ``names``, times in ns, ``NULL`` where an arg is absent); ``flows``: the ``ac2g`` flow
    events (``s``: a start; ``ts`` in us, NaN if absent); ``names_of``: (``process_name`` or
    ``thread_name``, pid, tid, name) of the metadata events, in file order."""

    root: dict[str, Any] | None = None
    x: dict[str, np.ndarray] = field(default_factory=dict)
    flows: dict[str, np.ndarray] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    names_of: list[tuple[str, int, int, str]] = field(default_factory=list)
    events: int = 0
    skipped: Counter[str] = field(default_factory=Counter)   # X slices of other categories, by lower-case cat
    x_cats: set[str] = field(default_factory=set)            # every X slice's category as written
    ids: dict[Any, int] = field(default_factory=dict)        # non-integer pid/tid/id -> stable negative id
    source: str = ""                                         # the file's name, for messages


def int_id(v: Any, ids: dict[Any, int]) -> int:
    """Chrome pids/tids/ids are usually ints but may be strings (``"Spans"``) or absent: those get
    stable negative ids, so they still tell tracks apart."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return ids.setdefault(v, -1000 - len(ids))


def _structure(text: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the braces and brackets of ``text`` outside strings, with +1 for an opening
    one and -1 for a closing one. ``text`` starts outside any string; a backslash escapes the next
    byte (only an escaped quote matters: it does not end the string)."""
    special = np.flatnonzero(np.frombuffer(text.translate(_SPECIAL), np.bool_))   # 0/1 bytes: a bool array
    c = np.frombuffer(text, np.uint8)[special]
    quotes = special[c == 34]
    bs = special[c == 92]
    if bs.size:
        gap = np.flatnonzero(np.diff(bs) != 1)
        first, last = bs[np.r_[0, gap + 1]], bs[np.r_[gap, bs.size - 1]]
        quotes = quotes[~np.isin(quotes, last[(last - first) % 2 == 0] + 1)]   # after a run of odd length
    folded = c | 32                                       # [ -> {, ] -> }
    bracket = (folded == 123) | (folded == 125)
    pos, delta = special[bracket], np.where(folded[bracket] == 123, 1, -1)
    outside = (np.searchsorted(quotes, pos) & 1) == 0
    return pos[outside], delta[outside]


def _gaps(a: np.ndarray, lo: np.ndarray, hi: np.ndarray, commas: np.ndarray) -> np.ndarray | None:
    """Positions of the commas in the ``a[lo[i]:hi[i]]``, or None unless each of them is blanks
    around exactly ``commas[i]`` commas."""
    n = hi - lo
    if (n < commas).any():
        return None
    keep = n > 0
    lo, n, commas = lo[keep], n[keep], commas[keep]
    if not n.size:
        return np.zeros(0, np.int64)
    starts = np.cumsum(n) - n
    idx = np.repeat(lo - starts, n) + np.arange(int(n.sum()))
    v = a[idx]
    is_comma = v == 44
    if not (is_comma | (v == 32) | (v == 10) | (v == 13) | (v == 9)).all():
        return None
    if not (np.add.reduceat(is_comma.astype(np.int64), starts) == commas).all():
        return None
    return idx[is_comma]


class _Framer:
    """Splits a Chrome trace JSON text into newline-delimited blocks of its traceEvents elements."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.head = b""          # the root's text up to and including the traceEvents '['
        self.tail = bytearray()  # from the closing ']' to the end
        self.level = 0           # nesting depth of the events array's elements' container
        self.found = False

    def _read(self, n: int) -> bytes:
        try:
            return self.stream.read(n)
        except (OSError, EOFError) as e:
            raise Malformed(f"unreadable ({type(e).__name__}: {e})") from None

    def _find_events(self) -> bytes:
        """Read until the traceEvents array opens; return the text after its '['
        (b"" and ``found`` False when the file has no such array)."""
        text = b""
        while True:
            data = self._read(max(CHUNK, len(text)))
            text = text + data
            a = np.frombuffer(text, np.uint8)
            start = text[:64].lstrip()[:1]
            if start == b"[":                  # a bare list of events
                at = text.index(b"[")
                self.head, self.level, self.found = text[:at + 1], 1, True
                return text[at + 1:]
            if start != b"{":
                break
            pos, delta = _structure(text)
            depth = np.cumsum(delta)
            for p in pos[(depth == 2) & (delta > 0) & (a[pos] == 91)]:
                m = _KEY.search(text[max(0, p - 256):p])
                if m and m.group(1) == b"traceEvents":
                    self.head, self.level, self.found = text[:p + 1], 2, True
                    return text[p + 1:]
            if not data:
                break
        self.tail = bytearray(text)
        return b""

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(number of events, their text one a line) for each chunk of the events array."""
        pending = self._find_events()
        if not self.found:
            return
        level, after_element, eof = self.level, False, False
        while True:
            data = b"" if eof else self._read(CHUNK)
            eof = eof or not data
            text = pending + data
            a = np.frombuffer(text, np.uint8)
            pos, delta = _structure(text)
            depth = level + np.cumsum(delta)
            out = np.flatnonzero(depth < level)
            end = int(pos[out[0]]) if out.size else -1          # the events array's closing ']'
            if end >= 0:
                if a[end] != 93:
                    raise Malformed("traceEvents closed by '}'")
                pos, delta, depth = pos[:out[0]], delta[:out[0]], depth[:out[0]]
            opens = pos[(depth == level + 1) & (delta > 0)]
            closes = pos[(depth == level) & (delta < 0)]
            n = closes.size
            if n and (a[opens[:n]] != 123).any():
                raise Malformed("an element of traceEvents is not a JSON object")
            if end < 0 and eof:
                raise Malformed("the traceEvents array is not closed")
            if n:
                commas = _gaps(a, np.r_[0, closes[:-1] + 1], opens[:n],
                               np.r_[int(after_element), np.ones(n - 1, np.int64)])
                if end >= 0 and (opens.size != n or _gaps(a, closes[-1:] + 1, np.array([end]),
                                                          np.zeros(1, np.int64)) is None):
                    commas = None   # after the last event: only blanks up to ']', and no started element
                if commas is None:
                    raise Malformed("traceEvents elements are not separated by single commas")
                lines = bytearray(memoryview(text)[opens[0]:closes[-1] + 1]).translate(_BLANK_NEWLINES)
                block = np.frombuffer(lines, np.uint8)
                block[commas[commas > opens[0]] - opens[0]] = 32
                block[closes[:-1] + 1 - opens[0]] = 10          # each event on a line of its own
                yield n, block
                after_element = True
            elif end >= 0 and (opens.size or _gaps(a, np.zeros(1, np.int64), np.array([end]),
                                                   np.zeros(1, np.int64)) is None):
                raise Malformed("traceEvents ends inside an element or with a stray comma")
            if end >= 0:
                self.tail = bytearray(text[end:])
                while data := self._read(CHUNK):
                    self.tail += data
                return
            pending = text[closes[-1] + 1:] if n else text

    def root(self) -> Any:
        """The top-level JSON value without its events (an empty traceEvents list)."""
        try:
            return orjson.loads(bytes(self.head) + bytes(self.tail) if self.found else bytes(self.tail))
        except orjson.JSONDecodeError as e:
            raise Malformed(str(e)) from None


def _flatten(t: pa.Table, first: int) -> pa.Table:
    """Arrow's nested parse of one block as ``FLAT`` columns (all events, in order)."""
    args = t.column("args")
    cols: dict[str, Any] = {"idx": pa.array(np.arange(first, first + t.num_rows, dtype=np.int64))}
    for c in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id"):
        cols[c] = t.column(c)
    for c, a in _ARG_COLS.items():
        cols[c] = pc.struct_field(args, a)
    return pa.table(cols, schema=FLAT)


def _num(v: Any, kind: type) -> Any:
    try:
        return None if v is None else kind(v)
    except (TypeError, ValueError):
        return None


def _from_objects(events: list[Any], first: int, ids: dict[Any, int]) -> pa.Table:
    """``FLAT`` columns of events Arrow could not type (a field with mixed types), in Python."""
    rows = []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise Malformed(f"traceEvents[{first + i}] is not a JSON object")
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        name = e.get("name")
        cat = e.get("cat")
        rows.append({"idx": first + i, "ph": _str(e.get("ph")), "cat": None if cat is None else str(cat),
                     "name": None if name is None else str(name),
                     "pid": int_id(e.get("pid"), ids), "tid": int_id(e.get("tid"), ids),
                     "id": int_id(e.get("id"), ids) if "id" in e else None,
                     "ts": _num(e.get("ts"), float), "dur": _num(e.get("dur"), float),
                     "corr": _num(args.get("correlation"), int), "stream": _num(args.get("stream"), int),
                     "device": _num(args.get("device"), int), "bytes": _num(args.get("bytes") or 0, int),
                     "aname": None if args.get("name") is None else str(args["name"])})
    return pa.Table.from_pylist(rows, schema=FLAT)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _parse(block: np.ndarray, first: int, ids: dict[Any, int]) -> pa.Table:
    """``FLAT`` columns of one block (events one a line): by Arrow; a block it refuses is halved
    until the few events with mixed-type fields are parsed by orjson."""
    try:
        t = pj.read_json(pa.BufferReader(pa.py_buffer(block)),
                         # one thread: the chunks are small, and threads were slower on a busy 2-core machine
                         read_options=pj.ReadOptions(block_size=CHUNK + (1 << 20), use_threads=False),
                         parse_options=pj.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore"))
        return _flatten(t, first)
    except pa.ArrowInvalid:
        pass
    ends = np.flatnonzero(block == 10)
    if ends.size >= SMALL:
        half = (ends.size + 1) // 2
        cut = int(ends[half - 1]) + 1
        return pa.concat_tables([_parse(block[:cut], first, ids), _parse(block[cut:], first + half, ids)])
    text = block.tobytes()
    try:
        events = orjson.loads(b"[" + text.rstrip(b"\n").replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError as e:
        raise Malformed(str(e)) from None
    return _from_objects(events, first, ids)


def _ints(t: pa.Table, c: str, fill: int) -> np.ndarray:
    a = t.column(c)
    return (pc.fill_null(a, fill) if a.null_count else a).to_numpy()


def _keep(t: pa.Table, out: ChromeEvents, parts: dict[str, list[np.ndarray]], codes: dict[str, int]) -> None:
    """Add to ``parts`` the columns of the events ``workbench.trace.chrome`` uses (named metadata,
    ac2g flows, X slices of the kept categories); X slices are checked for numeric ts/dur and the
    others counted."""
    ph = t.column("ph")
    is_x = pc.fill_null(pc.equal(ph, "X"), False)
    raw = t.column("cat")
    cat = pc.utf8_lower(pc.fill_null(raw, ""))
    name = t.column("name")
    if pc.any(is_x).as_py():
        out.x_cats.update("None" if c is None else c for c in pc.unique(raw.filter(is_x)).to_pylist())
        x = t.filter(is_x)
        bad = pc.or_(pc.is_null(x.column("ts")), pc.is_null(x.column("dur")))
        if pc.any(bad).as_py():
            row = x.filter(bad).slice(0, 1).to_pylist()[0]
            what = "'dur'" if row["ts"] is not None else "'ts'"
            raise TraceError(f"{out.source or 'trace'}: traceEvents[{row['idx']}], X slice {row['name']!r}, has no "
                             f"numeric {what}: an X slice needs numeric 'ts' and 'dur' (microseconds)")
        xcat = cat.filter(is_x)
        other = pc.invert(pc.is_in(xcat, pa.array(KEPT_CATS)))
        counts = pc.value_counts(xcat.filter(other))
        out.skipped.update({(c.as_py() or "(none)"): n.as_py()
                            for c, n in zip(counts.field("values"), counts.field("counts"))})
    null_id = int_id(None, out.ids) if any(t.column(c).null_count for c in ("pid", "tid", "id")) else 0
    kept = pc.and_(is_x, pc.is_in(cat, pa.array(KEPT_CATS)))
    if pc.any(kept).as_py():
        x = t.filter(kept)
        d = pc.dictionary_encode(pc.fill_null(x.column("name").combine_chunks(), ""))
        lut = np.array([codes.setdefault(v, len(codes)) for v in d.dictionary.to_pylist()], np.int32)
        ts = x.column("ts").to_numpy()
        start = np.rint(ts * 1e3).astype(np.int64)
        del ts
        cols = {"cat": pc.index_in(cat.filter(kept), pa.array(KEPT_CATS)).to_numpy().astype(np.int8),
                "name": lut[d.indices.to_numpy()], "pid": _ints(x, "pid", null_id), "tid": _ints(x, "tid", null_id),
                "start": start, "end": start + np.rint(x.column("dur").to_numpy() * 1e3).astype(np.int64)}
        for c in ("corr", "stream", "device", "bytes"):
            cols[c] = _ints(x, c, NULL)
        for c, v in cols.items():
            parts["x." + c].append(v)
    flow = pc.and_(pc.is_in(ph, pa.array(["s", "f", "t"])), pc.or_(pc.equal(cat, "ac2g"), pc.equal(name, "ac2g")))
    flow = pc.fill_null(flow, False)
    if pc.any(flow).as_py():
        f = t.filter(flow)
        for c, v in {"id": _ints(f, "id", null_id), "s": pc.equal(f.column("ph"), "s").to_numpy(zero_copy_only=False),
                     "pid": _ints(f, "pid", null_id), "tid": _ints(f, "tid", null_id),
                     "ts": pc.fill_null(f.column("ts"), np.nan).to_numpy()}.items():
            parts["f." + c].append(v)
    meta = pc.fill_null(pc.and_(pc.equal(ph, "M"), pc.is_in(name, pa.array(["process_name", "thread_name"]))), False)
    if pc.any(meta).as_py():
        m = t.filter(meta)
        out.names_of += [(r["name"], int_id(r["pid"], out.ids) if r["pid"] is not None else null_id,
                          int_id(r["tid"], out.ids) if r["tid"] is not None else null_id, r["aname"])
                         for r in m.select(["name", "pid", "tid", "aname"]).to_pylist() if r["aname"] is not None]


def read_events(stream: IO[bytes], source: str = "") -> ChromeEvents:
    """The events of the Chrome trace JSON in ``stream``; ``Malformed`` when it is not valid JSON
    or an element of traceEvents is not an object; TraceError for an X slice without numeric ts/dur."""
    framer = _Framer(stream)
    out = ChromeEvents(source=source)
    parts: dict[str, list[np.ndarray]] = {**{"x." + c: [] for c in _X_COLS}, **{"f." + c: [] for c in _FLOW_COLS}}
    codes: dict[str, int] = {}
    for n, block in framer.blocks():
        t = _parse(block, out.events, out.ids)
        out.events += n
        _keep(t, out, parts, codes)
        del t
    root = framer.root()
    if not framer.found:
        events = root.get("traceEvents") if isinstance(root, dict) else root
        raise TraceError(f"{source + ': ' if source else ''}not a Chrome trace: expected a JSON object with a "
                         f"'traceEvents' list (or a list of trace events); got {type(events).__name__}")
    out.root = root if isinstance(root, dict) else None
    empty = {"cat": np.int8, "name": np.int32, "s": bool, "ts": np.float64}
    for key, arrays in parts.items():
        kind, c = key.split(".")
        col = np.concatenate(arrays) if arrays else np.zeros(0, empty.get(c, np.int64))
        arrays.clear()
        (out.x if kind == "x" else out.flows)[c] = col
    out.names = list(codes)
    return out


def read_events_file(path: Path) -> ChromeEvents:
    """``read_events`` of a file (gzipped or not); a syntax fault is a TraceError naming the file and where."""
    from .io import _json
    from .perfetto import open_text

    try:
        with open_text(path) as f:
            return read_events(f, path.name)
    except Malformed:
        pass
    obj = _json(path, b"")      # raises the TraceError that says what and where
    events = obj.get("traceEvents") if isinstance(obj, dict) else obj
    if isinstance(events, list):
        bad = next((i for i, e in enumerate(events) if not isinstance(e, dict)), None)
        if bad is not None:
            raise TraceError(f"{path.name}: traceEvents[{bad}] = {events[bad]!r} is not a JSON object (a trace event)")
    raise TraceError(f"{path.name} could not be read as a Chrome trace although it is valid JSON") from None
