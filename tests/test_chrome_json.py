"""Kineto / Chrome trace JSON read column-wise (``workbench.trace.chrome_json``): every JSON
layout and every place a chunk may end gives the same Trace, mixed-type fields still load, and a
malformed event is an error naming the file and the event's index."""

from __future__ import annotations

import gzip
import json

import orjson
import pandas as pd
import pytest
from fixtures.kineto import kineto_json
from fixtures.synthetic import synthetic_trace

import workbench.trace.chrome_json as chrome_json
from workbench.trace import Trace, TraceError
from workbench.trace.chrome import read_chrome_trace
from workbench.trace.io import load_trace

# what real Kineto files also hold: string pids at the end, odd characters in strings
EXTRA = [
    {"ph": "X", "cat": "Trace", "ts": 1.0, "dur": 2.0, "pid": "Spans", "tid": "PyTorch Profiler",
     "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
    {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": 3.5},
    {"ph": "X", "cat": "cpu_op", "name": 'void f<{lambda()#1}>("x\\"}]") \\', "pid": 1, "tid": 1, "ts": 1.0,
     "dur": 1.0, "args": {"Input Dims": [[], [1, 2]], "k": "a\\\\\"]}"}},
]


@pytest.fixture(scope="module")
def kineto() -> dict:
    obj = kineto_json(synthetic_trace(3, 2, pdl=True), drop_kernel_correlation=True)
    obj["traceEvents"] += EXTRA
    obj["traceName"] = "after the events"     # keys after traceEvents are part of the root too
    return obj


def _same(a: Trace, b: Trace) -> None:
    pd.testing.assert_frame_equal(a.events, b.events)
    assert {k: v for k, v in a.meta.items() if k != "file"} == {k: v for k, v in b.meta.items() if k != "file"}


LAYOUTS = {
    "compact": lambda o: orjson.dumps(o),
    "kineto-indent": lambda o: orjson.dumps(o, option=orjson.OPT_INDENT_2),
    "json-indent-crlf": lambda o: json.dumps(o, indent=1).replace("\n", "\r\n").encode(),
    "spaced-separators": lambda o: json.dumps(o, separators=(" ,\n ", " : ")).encode(),
    "bare-list": lambda o: orjson.dumps(o["traceEvents"]),
}


@pytest.mark.parametrize("chunk", [61, 4096, chrome_json.CHUNK])
def test_every_layout_and_chunk_boundary_reads_the_same(tmp_path, kineto: dict, chunk: int, monkeypatch) -> None:
    want = read_chrome_trace(kineto)
    assert want.meta["flows"] == want.meta["flows_linked"] == 114
    assert want.meta["skipped"] == {"cpu_op": 2, "python_function": 1, "trace": 1}
    monkeypatch.setattr(chrome_json, "CHUNK", chunk)
    for name, dump in LAYOUTS.items():
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(dump(kineto)))
        got = load_trace(path)
        assert got.meta["file"] == str(path)
        _same(got, want)


def test_mixed_type_fields_load_through_the_python_fallback(kineto: dict) -> None:
    """Arrow types a field by its first value: string pids and a string ts send their block to
    orjson, with the same result as numbers would give (strings become stable negative ids)."""
    events = json.loads(json.dumps(kineto["traceEvents"]))
    for e in events:
        if e.get("pid") == 4242:
            e["pid"] = "python3"
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            e["ts"] = str(e["ts"])
    got, want = read_chrome_trace(events), read_chrome_trace(kineto)
    assert got.meta["flows_linked"] == 114 and len(got) == len(want)
    cols = ["row", "kind", "name", "start_ns", "end_ns", "stream", "corr_id", "token"]
    pd.testing.assert_frame_equal(got.events[cols], want.events[cols])
    host = got.events[got.events["row"] == "CUDA API"]
    assert (host["pid"] <= -1000).all() and host["pid"].nunique() == 1


def _write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_malformed_events_name_the_file_and_the_event(tmp_path) -> None:
    ok = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7}
    no_dur = {"ph": "X", "cat": "kernel", "name": "k2", "ts": 1, "pid": 0, "tid": 7}
    cases = {
        "no_dur.json": ({"traceEvents": [ok, ok, ok, no_dur]}, r"no_dur\.json: traceEvents\[3\], X slice 'k2', "
                                                              r"has no numeric 'dur'"),
        "text_dur.json": ({"traceEvents": [ok, dict(ok, dur="long")]}, r"traceEvents\[1\].* numeric 'dur'"),
        "no_ts.json": ({"traceEvents": [dict(ok, ts=None)]}, r"no_ts\.json: traceEvents\[0\].* numeric 'ts'"),
        "skipped_cat.json": ({"traceEvents": [ok, {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1}]},
                             r"traceEvents\[1\], X slice 'aten::mm', has no numeric 'dur'"),
        "scalar.json": ({"traceEvents": [ok, ok, 5]}, r"scalar\.json: traceEvents\[2\] = 5 is not a JSON object"),
        "nested.json": ([ok, [ok]], r"traceEvents\[1\] = \[.*\] is not a JSON object"),
        "not_a_list.json": ({"traceEvents": {"a": 1}}, r"not_a_list\.json: not a Chrome trace.* got dict"),
    }
    for name, (obj, match) in cases.items():
        with pytest.raises(TraceError, match=match):
            load_trace(_write(tmp_path, name, json.dumps(obj)))
    for name, text in {"truncated.json": json.dumps({"traceEvents": [ok, ok]})[:-9],
                       "stray_comma.json": json.dumps([ok, ok]).replace("}, {", "},, {"),
                       "missing_comma.json": json.dumps([ok, ok]).replace("}, {", "} {")}.items():
        with pytest.raises(TraceError, match=rf"{name}.* is not valid JSON \(line"):
            load_trace(_write(tmp_path, name, text))
    with pytest.raises(TraceError, match=r"traceEvents\[1\] = 'x' is not a JSON object"):
        read_chrome_trace([ok, "x"])


def test_an_empty_event_list_says_there_is_no_cuda_activity(tmp_path) -> None:
    for text in ('{"traceEvents": []}', "[ ]", '{"traceEvents": [\n], "x": [1]}'):
        with pytest.raises(TraceError, match=r"no CUDA activity .* found categories \[\]"):
            load_trace(_write(tmp_path, "empty.json", text))
