"""Trace files at scale: the Parquet trace file, the streamed Perfetto JSON, the Perfetto
protobuf export, exact round trips of table and metadata, clear errors for damaged files, the
suffix dispatch of ``save_trace`` and the packed level-of-detail arrays of the HTML export."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures.synthetic import synthetic_trace

import workbench
from workbench.cli import main as cli_main
from workbench.models import load_config
from workbench.strategy import Strategy
from workbench.trace import Trace, TraceError
from workbench.trace.io import load_trace, save_format, save_trace, sniff
from workbench.trace.meta import decode_meta, encode_meta
from workbench.trace.perfetto import read_header, to_perfetto
from workbench.trace.pftrace import SLICE_BEGIN, SLICE_END, _Reader, read_pftrace
from workbench.view.lodpack import pack_class
from workbench.view.timeline import timeline

FORMATS = ["parquet", "json", "json.gz", "pftrace"]
META = dict(model="llama-3.1-8b", strategy="graphs+pdl", gpu="h100", calibration="h100 / host profile python",
            token_starts_ns=[1_000_000, 1_250_000, 1_500_000], processes={4242: "llama-decode"},
            threads={4242: "main"}, devices={0: "NVIDIA H200"}, node_tokens=(6, 7), clock_ghz=1.98, fused=None,
            nested={"pdl": {"wait": "first-read", "families": ["mul_mat_vec"]}}, graphs=True)


def _rich_trace() -> Trace:
    """Every column away from its default somewhere, extra columns of three types, rich meta."""
    tr = synthetic_trace(3, 2, pdl=True, graphs=True)
    ev = tr.events
    ev["family"] = np.where(ev["kind"] == "kernel", "mul_mat", "")
    ev["flops"] = np.arange(len(ev)) * 0.5
    ev["sm_count"] = np.arange(len(ev), dtype=np.int64) % 132
    ev.loc[ev.index[:3], "name"] = ['quote " and \\ backslash', "ünïcødé µs", "comma,\nnewline"]
    return Trace(ev, dict(META))


def _sim_trace() -> Trace:
    cfg = load_config("llama-tiny")
    run = workbench.run(cfg, Strategy(graphs=True, pdl=True), tokens=3, backend="sim", gpu="h100")
    return run.trace


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("make", [_rich_trace, _sim_trace], ids=["synthetic", "sim"])
def test_round_trip_is_exact(tmp_path, fmt: str, make) -> None:
    tr = make()
    path = tr.save(tmp_path / f"t.{fmt}")
    back = load_trace(path)
    pd.testing.assert_frame_equal(back.events, tr.events)       # same columns, dtypes, order, values
    assert back.meta == {**tr.meta, "file": str(path)}
    assert back.save(tmp_path / f"again.{fmt}") and load_trace(tmp_path / f"again.{fmt}").events.equals(tr.events)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_trace_round_trips(tmp_path, fmt: str) -> None:
    tr = Trace(synthetic_trace(1, 1).events.iloc[:0], {"source": "empty"})
    back = load_trace(tr.save(tmp_path / f"e.{fmt}"))
    assert len(back) == 0 and back.meta["source"] == "empty"
    assert list(back.events.columns) == list(tr.events.columns)


def test_meta_codec_keeps_int_keys_tuples_and_numpy_scalars() -> None:
    meta = {**META, "n": np.int64(5), "arr": np.arange(3), "__wb__": "a key that looks like the tag"}
    back = decode_meta(encode_meta(meta))
    assert back["processes"] == {4242: "llama-decode"} and back["node_tokens"] == (6, 7)
    assert back["n"] == 5 and back["arr"] == [0, 1, 2] and back["__wb__"] == meta["__wb__"]
    with pytest.raises(TraceError, match="my file: its meta is not valid JSON"):
        decode_meta("{oops", "my file: its meta")


def test_sniffing_and_save_formats(tmp_path) -> None:
    tr = synthetic_trace(2, 1)
    for fmt, kind in [("parquet", "parquet"), ("json", "perfetto"), ("json.gz", "perfetto"), ("pftrace", "pftrace")]:
        p = tr.save(tmp_path / f"t.{fmt}")
        renamed = p.rename(tmp_path / f"renamed_{fmt.replace('.', '_')}.dat")   # the suffix is not trusted
        assert sniff(renamed) == kind
    assert save_format("a/b.JSON.GZ") == ".json.gz" and save_format("x.perfetto-trace") == ".pftrace"
    with pytest.raises(ValueError, match=r"unknown format '\.txt' for a trace; use one of .*\.parquet"):
        save_trace(tr, tmp_path / "t.txt")
    csv = save_trace(tr, tmp_path / "t.csv")
    assert csv.read_text().splitlines()[0].startswith("row,kind,name,start_ns,end_ns")


def test_perfetto_json_file_is_one_event_per_line_and_plain_json(tmp_path) -> None:
    tr = _rich_trace()
    path = tr.save(tmp_path / "t.json")
    lines = path.read_text().splitlines()
    obj = json.loads(path.read_text())                        # any JSON reader takes the file whole
    ref = json.loads(json.dumps(to_perfetto(tr)))
    assert obj["traceEvents"] == ref["traceEvents"] and obj["otherData"]["producer"] == "workbench"
    assert len(lines) == len(obj["traceEvents"]) + 2          # header line, events, closing line
    assert read_header(path)["columns"] == {"family": "str", "flops": "float64", "sm_count": "int64"}
    with gzip.open(tr.save(tmp_path / "t.json.gz"), "rt") as f:
        assert json.load(f)["traceEvents"] == obj["traceEvents"]


def test_reformatted_workbench_json_still_loads(tmp_path) -> None:
    tr = _rich_trace()
    obj = json.loads(tr.save(tmp_path / "t.json").read_text())
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(obj, indent=2))              # not line-per-event any more: parsed whole
    back = load_trace(pretty)
    pd.testing.assert_frame_equal(back.events, tr.events)
    assert back.meta == {**tr.meta, "file": str(pretty)}


def test_pftrace_structure(tmp_path) -> None:
    tr = _rich_trace()
    path = tr.save(tmp_path / "t.pftrace")
    data = memoryview(path.read_bytes())
    r = _Reader(data, path.name)
    names, types, flows, terminating = [], Counter(), 0, 0
    for _, _, span in r.fields(0, len(data)):
        for f, _, v in r.fields(*span):
            if f == 60:        # TrackDescriptor
                names += [bytes(data[x[0]:x[1]]).decode() for g, _, x in r.fields(*v) if g == 2]
            elif f == 11:      # TrackEvent
                for g, _, x in r.fields(*v):
                    types[x] += g == 9
                    flows += g == 47
                    terminating += g == 48
    assert names[0] == "workbench.trace"
    assert {"CUDA API [4242]", "NVTX [4242]", "Stream 7", "Stream 13"} <= set(names)
    assert any(n.startswith("CUDA HW (GPU 0") for n in names) and any("overlap" in n for n in names)
    assert types[SLICE_BEGIN] == types[SLICE_END] == len(tr)
    json_flows = to_perfetto(tr)["otherData"]["flows"]
    assert flows == terminating == json_flows > 0


def _damage(tmp_path: Path, fmt: str, how: str) -> Path:
    tr = _rich_trace()
    src = tr.save(tmp_path / f"good.{fmt}")
    data = src.read_bytes()
    bad = tmp_path / f"bad_{how}.{fmt}"
    if how == "truncated":
        bad.write_bytes(data[: len(data) // 2])
    else:   # bytes flipped among the events (Parquet: in the data pages, before the footer)
        mid = len(data) // 5
        bad.write_bytes(data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 64]) + data[mid + 64:])
    return bad


@pytest.mark.parametrize("fmt", ["parquet", "pftrace", "json.gz", "json"])
def test_truncated_file_is_a_clear_error(tmp_path, fmt: str) -> None:
    bad = _damage(tmp_path, fmt, "truncated")
    with pytest.raises(TraceError, match=rf"{bad.name}.*(truncated|damaged|not valid)"):
        load_trace(bad)


@pytest.mark.parametrize("fmt", ["parquet", "pftrace"])
def test_corrupted_file_is_a_clear_error(tmp_path, fmt: str) -> None:
    bad = _damage(tmp_path, fmt, "corrupted")
    with pytest.raises(TraceError, match=rf"{bad.name}"):
        load_trace(bad)


def test_foreign_files_say_what_is_wrong(tmp_path) -> None:
    other = tmp_path / "table.parquet"
    pd.DataFrame({"row": ["a"], "kind": ["kernel"]}).to_parquet(other)
    with pytest.raises(TraceError, match=r"table\.parquet: trace table is missing column\(s\) \['name', 'start_ns'"):
        load_trace(other)
    plain = tmp_path / "plain.parquet"
    synthetic_trace(1, 1).events.to_parquet(plain)            # someone else's Parquet of a trace table: loads
    assert len(load_trace(plain)) > 0
    # a protobuf trace that is not workbench's own (a packet with only a timestamp)
    foreign = tmp_path / "chrome.pftrace"
    foreign.write_bytes(b"\x0a\x02\x40\x05")
    with pytest.raises(TraceError, match="not a Perfetto protobuf trace written by workbench"):
        read_pftrace(foreign)


def test_view_converts_between_formats(tmp_path, capsys) -> None:
    tr = _rich_trace()
    src = tr.save(tmp_path / "run.parquet")
    for fmt in ("json.gz", "pftrace", "parquet"):
        out = tmp_path / f"conv.{fmt}"
        assert cli_main(["view", str(src), "--out", str(out)]) == 0
        pd.testing.assert_frame_equal(load_trace(out).events, tr.events)
    other = str(tmp_path / "conv.json.gz")
    assert cli_main(["view", str(src), "--out", str(tmp_path / "x.html"), "--compare", other]) == 0
    assert cli_main(["view", str(src), "--out", str(tmp_path / "x.pftrace"), "--compare", other]) == 2
    assert "--compare draws a figure" in capsys.readouterr().err


def test_run_writes_parquet_with_its_metadata(tmp_path, capsys) -> None:
    p = tmp_path / "run.parquet"
    assert cli_main(["run", "--model", "llama-tiny", "--tokens", "2", "--backend", "sim", "--graphs", "--trace",
                     str(p)]) == 0
    back = load_trace(p)
    assert back.meta["model"] == "llama-tiny" and back.meta["strategy"].startswith("graphs")
    assert back.meta["gpu"] == "h200" and back.meta["source"] == "sim" and back.tokens() == [0, 1]


def _unpack(p: dict) -> np.ndarray:
    """Python twin of UNPACK_JS's unpackArray."""
    dt = {"i1": np.int8, "i2": np.int16, "i4": np.int32, "f8": np.float64}[p["dtype"]]
    w = np.dtype(dt).itemsize
    raw = np.frombuffer(zlib.decompress(base64.b64decode(p["z"])), np.uint8).reshape(w, p["n"]).T.copy()
    v = raw.view(dt).ravel().astype(np.float64)
    return np.cumsum(v) if p["delta"] else v


def test_packed_lod_arrays_restore_bit_exact() -> None:
    fig = timeline(synthetic_trace(6, 2, pdl=True))
    for c in fig.layout.meta["workbench"]["lod"]["classes"].values():
        p = pack_class(c)
        x0 = _unpack(p["x0"]) / 1e3
        x1 = (_unpack(p["x0"]) + _unpack(p["dur"])) / 1e3
        assert np.array_equal(x0, c["x0"]) and np.array_equal(x1, c["x1"])     # same doubles as the figure's
        assert np.array_equal(_unpack(p["y"]).astype(np.float32), c["y"])
        assert np.array_equal(np.stack([_unpack(a) for a in p["cd"]], axis=1), c["cd"])
        assert np.array_equal(_unpack(p["label"]), c["label"])
        assert p["trace"] == c["trace"] and p["detail"] == c["detail"]
