"""Trace files in and out: ``load_trace`` sniffs the format (not trusting the suffix),
``save_trace`` writes the format the suffix names.

Read:

- Parquet (``PAR1`` header): the native trace file (``workbench.trace.columnar``);
- Perfetto protobuf written by workbench (``workbench.trace.pftrace``);
- SQLite (``SQLite format 3`` header): an Nsight Systems export (``workbench.trace.nsys``);
- JSON, optionally gzip-compressed (``.json.gz`` as the PyTorch profiler may write): a
  workbench Perfetto export is streamed back exactly (``workbench.trace.perfetto``), any other
  Chrome trace read as a PyTorch-profiler / Kineto trace (``workbench.trace.chrome``);
- an ``.nsys-rep`` / ``.qdrep`` report: a clear error saying how to export it.

Write (``SAVE_SUFFIXES``): ``.parquet``; ``.json`` / ``.json.gz`` (Perfetto / Chrome JSON);
``.pftrace`` / ``.perfetto-trace`` (Perfetto protobuf, for ui.perfetto.dev when JSON is too
big); ``.csv`` (the events table, no metadata); ``.html`` / ``.png`` / ``.svg`` / ``.pdf`` (the
timeline drawn by ``workbench.view.export``).
"""

from __future__ import annotations

from pathlib import Path

import orjson

from .table import Trace, TraceError

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
EXPECTED = ("a workbench trace (.parquet, Perfetto .json[.gz] or .pftrace), an Nsight Systems SQLite export "
            "(nsys export --type sqlite) or a PyTorch-profiler / Kineto Chrome trace JSON (.json or .json.gz)")
PROTOBUF_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb")
DRAWN_SUFFIXES = (".html", ".htm", ".png", ".svg", ".pdf")
SAVE_SUFFIXES = (".parquet", ".json", ".json.gz", ".pftrace", ".perfetto-trace", ".csv") + DRAWN_SUFFIXES


def sniff(path: str | Path) -> str:
    """``parquet``, ``pftrace``, ``nsys``, ``perfetto`` (a workbench JSON export), ``chrome`` or
    ``nsys-rep``; TraceError otherwise."""
    kind = _detect(Path(path))[0]
    return "perfetto" if kind == "perfetto-lines" else kind


def _detect(path: Path) -> tuple[str, object]:
    """The format of ``path`` and what was read to tell (the JSON header or parsed object)."""
    if not path.exists():
        raise FileNotFoundError(f"no such trace file: {path}")
    if path.is_dir():
        raise TraceError(f"{path} is a directory; expected a file: {EXPECTED}")
    with open(path, "rb") as f:
        head = f.read(256)
    if head.startswith(PARQUET_MAGIC):
        return "parquet", None
    if head.startswith(SQLITE_MAGIC):
        return "nsys", None
    from .pftrace import is_pftrace

    if is_pftrace(head) or (path.suffix.lower() in PROTOBUF_SUFFIXES and head.lstrip()[:1] not in (b"{", b"[")):
        return "pftrace", None
    if path.suffix.lower() in (".nsys-rep", ".qdrep"):
        return "nsys-rep", None
    from .perfetto import read_header

    try:
        other = read_header(path)
    except (OSError, EOFError):
        other = None
    if other is not None:
        return "perfetto-lines", other
    from .chrome_json import read_events_file  # column-wise: no Python object per event
    from .perfetto import is_workbench_json

    obj = read_events_file(path)
    return ("perfetto" if is_workbench_json(obj.root) else "chrome"), obj


def _json(path: Path, head: bytes) -> object:
    from .perfetto import open_text

    try:
        with open_text(path) as f:
            data = f.read()
        return orjson.loads(data)
    except (OSError, EOFError) as e:
        raise TraceError(f"{path.name} is neither Parquet, SQLite nor (gzipped) JSON text ({type(e).__name__}); "
                         f"expected {EXPECTED}") from None
    except orjson.JSONDecodeError as e:
        if not data.strip():
            raise TraceError(f"{path.name} is empty; expected {EXPECTED}") from None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{path.name} is neither Parquet, SQLite nor (gzipped) JSON text; expected "
                             f"{EXPECTED}") from None
        raise TraceError(f"{path.name} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                         f"expected {EXPECTED}") from None


def load_trace(path: str | Path) -> Trace:
    """Read a trace file of any supported format."""
    path = Path(path)
    kind, obj = _detect(path)
    if kind == "nsys-rep":
        raise TraceError(f"{path.name} is an Nsight Systems report, which only nsys can read: export it with "
                         f"`nsys export --type sqlite -o {path.stem}.sqlite {path.name}` and load the .sqlite")
    if kind == "parquet":
        from .columnar import read_parquet

        trace = read_parquet(path)
    elif kind == "pftrace":
        from .pftrace import read_pftrace

        trace = read_pftrace(path)
    elif kind == "nsys":
        from .nsys import read_nsys_sqlite

        trace = read_nsys_sqlite(path)
    elif kind == "perfetto-lines":   # obj: the otherData header
        from .perfetto import read_perfetto_file

        trace = read_perfetto_file(path, obj)
    elif kind == "perfetto":
        from .perfetto import from_perfetto

        trace = from_perfetto(_json(path, b""))   # a workbench export not one event a line: small
    else:
        from .chrome import read_chrome_trace

        trace = read_chrome_trace(obj)
    trace.meta.setdefault("file", str(path))
    return trace


def save_format(path: str | Path) -> str:
    """The format ``save_trace`` writes for ``path`` (its suffix); ValueError naming the choices."""
    name = Path(path).name.lower()
    for suffix in sorted(SAVE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return {".htm": ".html", ".perfetto-trace": ".pftrace"}.get(suffix, suffix)
    raise ValueError(f"{Path(path).name}: unknown format {Path(path).suffix or '(none)'!r} for a trace; use one of "
                     f"{', '.join(SAVE_SUFFIXES)} (.parquet for big traces)")


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` in the format named by the suffix of ``path`` (``SAVE_SUFFIXES``)."""
    path = Path(path)
    fmt = save_format(path)
    if fmt == ".parquet":
        from .columnar import write_parquet

        return write_parquet(trace, path)
    if fmt in (".json", ".json.gz"):
        from .perfetto import write_perfetto

        return write_perfetto(trace, path)
    if fmt == ".pftrace":
        from .pftrace import write_pftrace

        return write_pftrace(trace, path)
    if fmt == ".csv":
        trace.events.to_csv(path, index=False)
        return path
    from ..view.export import export

    return export(trace, path)
