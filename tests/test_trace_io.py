"""Trace files in and out: Perfetto JSON round trip and structure, nsys SQLite and Kineto JSON
import, format sniffing and the errors a wrong file gives, ``workbench view`` on files."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from fixtures.kineto import kineto_json
from fixtures.nsys_export import write_nsys_sqlite
from fixtures.synthetic import synthetic_trace

from workbench.cli import main as cli_main
from workbench.trace import API_ROW, Trace, TraceError
from workbench.trace.chrome import read_chrome_trace
from workbench.trace.io import load_trace, sniff
from workbench.trace.nsys import read_nsys_sqlite
from workbench.trace.perfetto import from_perfetto, to_perfetto, write_perfetto

KEY = ["row", "kind", "start_ns", "end_ns", "stream", "corr_id", "token"]


def _sorted(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return df[cols].sort_values(cols, kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthetic_trace(3, 2, pdl=True)


# ----------------------------------------------------------------------------- Perfetto

@pytest.mark.parametrize("graphs", [False, True])
def test_perfetto_round_trip_keeps_every_event(tmp_path, graphs: bool) -> None:
    tr = synthetic_trace(3, 2, pdl=True, graphs=graphs)
    tr.events["family"] = np.where(tr.events["kind"] == "kernel", "mul_mat", "")   # an extra column survives too
    path = write_perfetto(tr, tmp_path / "t.json")
    back = load_trace(path)
    cols = list(tr.events.columns)
    assert len(back) == len(tr)
    pd.testing.assert_frame_equal(back.events[cols], tr.events[cols])
    assert back.meta["processes"] == {4242: "llama-decode"}   # integer keys survive JSON (workbench.trace.meta)


def test_perfetto_json_is_what_the_trace_viewers_expect(trace: Trace) -> None:
    obj = json.loads(json.dumps(to_perfetto(trace)))
    ev = obj["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert "Process [4242] llama-decode" in procs.values()
    assert any(p.startswith("CUDA HW (GPU 0") for p in procs.values())
    assert {"CUDA API [4242]", "NVTX [4242]", "Stream 7", "Stream 13", "Stream 14"} <= set(names.values())
    # PDL: overlapping kernels of stream 7 go to sub-tracks, and no thread has partially overlapping slices
    assert any(n.startswith("Stream 7 · overlap") for n in names.values())
    slices: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in names, "every slice is on a named thread"
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, ss in slices.items():
        ss.sort()
        for (_, e0), (s1, e1) in zip(ss, ss[1:]):
            assert s1 >= e0 - 1e-9 or e1 <= e0 + 1e-9, f"slices of {names[key]} overlap without nesting"
    assert sum(len(v) for v in slices.values()) == len(trace)
    # flows: one per (launch, device work) pair, s bound to the call's slice, f to the work's start
    flows = defaultdict(dict)
    for e in ev:
        if e["ph"] in ("s", "f"):
            flows[e["id"]][e["ph"]] = e
    work = trace.events[trace.events["row"].str.startswith("Stream ")]
    assert len(flows) == len(work) == obj["otherData"]["flows"]
    for f in flows.values():
        s, t = f["s"], f["f"]
        assert t["bp"] == "e"
        assert any(a <= s["ts"] <= b for a, b in slices[(s["pid"], s["tid"])])
        assert any(abs(a - t["ts"]) < 1e-9 for a, _ in slices[(t["pid"], t["tid"])])
        assert names[(s["pid"], s["tid"])].startswith("CUDA API")
        assert names[(t["pid"], t["tid"])].startswith("Stream")


def test_from_perfetto_rejects_foreign_json() -> None:
    with pytest.raises(TraceError, match="producer"):
        from_perfetto({"traceEvents": []})


# ----------------------------------------------------------------------------- nsys SQLite

def test_nsys_sqlite_export_imports_every_event(tmp_path, trace: Trace) -> None:
    path = write_nsys_sqlite(trace, tmp_path / "report.sqlite")
    got = load_trace(path)
    assert got.meta["source"] == "nsys"
    cols = KEY + ["pid", "tid"]
    pd.testing.assert_frame_equal(_sorted(got.events, cols), _sorted(trace.events, cols))
    ev = got.events
    assert set(ev.loc[ev["row"] == API_ROW, "name"]) == {"cudaMemcpyAsync", "cudaStreamSynchronize",
                                                          "cudaLaunchKernel", "cudaEventRecord", "cudaStreamWaitEvent"}
    k = ev[ev["kind"] == "kernel"]
    assert set(k["name"]) == set(trace.events.loc[trace.events["kind"] == "kernel", "name"])   # shortName
    assert set(k["row"]) == {"Stream 7", "Stream 13", "Stream 14"} and (k["device"] == 0).all()
    copies = ev[ev["kind"] == "memcpy"]
    assert set(copies["copy_kind"]) == {"H2D", "D2H"}
    assert "[CUDA memcpy Host-to-Device]" in set(copies["name"])
    assert (copies.loc[copies["copy_kind"] == "D2H", "bytes"] == 128_000).all()
    syncs = ev[ev["kind"] == "sync"]
    assert len(syncs) == 12 and (syncs["stream"] == 7).all()   # stream from SYNCHRONIZATION records
    assert sorted(got.tokens()) == [0, 1, 2]                     # from the "decode token N" NVTX ranges
    assert got.meta["threads"] == {4242: "main"} and got.meta["devices"] == {0: "NVIDIA H200"}


def test_nsys_graph_kernels_and_orphan_sync_records(tmp_path) -> None:
    tr = synthetic_trace(2, 1, graphs=True)
    path = write_nsys_sqlite(tr, tmp_path / "graph.sqlite")
    con = sqlite3.connect(path)
    # a context sync whose runtime call was not traced, and a stream-wait-event record (not blocking)
    con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (5, 9, 0, 1, NULL, 7, 99999, 0, 4, 0)")
    con.commit()
    con.close()
    got = read_nsys_sqlite(path)
    k = got.events[got.events["kind"] == "kernel"]
    assert (k["graph_id"] > 0).all()
    launch = got.events[got.events["name"] == "cudaGraphLaunch"]
    assert len(launch) == 2 and set(k["corr_id"]) == set(launch["corr_id"])
    orphan = got.events[got.events["corr_id"] == 99999]
    assert orphan[["kind", "name", "stream"]].values.tolist() == [["sync", "Context synchronize", 7]]


def test_nsys_errors_say_what_was_expected(tmp_path) -> None:
    empty = tmp_path / "other.sqlite"
    con = sqlite3.connect(empty)
    con.execute("CREATE TABLE foo (x INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match="StringIds and CUPTI_ACTIVITY_KIND_RUNTIME"):
        load_trace(empty)
    bad = tmp_path / "bad.sqlite"
    con = sqlite3.connect(bad)
    con.executescript("CREATE TABLE StringIds (id INTEGER, value TEXT);"
                      "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER);")
    con.commit()
    con.close()
    with pytest.raises(TraceError, match=r"lacks column\(s\) \['streamId', 'shortName'\]"):
        load_trace(bad)
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00\x01binary report")
    with pytest.raises(TraceError, match="nsys export --type sqlite"):
        load_trace(rep)


# ----------------------------------------------------------------------------- Kineto JSON

@pytest.mark.parametrize("drop", [False, True])
def test_pytorch_profiler_trace_links_every_flow(tmp_path, trace: Trace, drop: bool) -> None:
    path = tmp_path / "decode.pt.trace.json.gz"     # the profiler may gzip: sniffed, not trusted by name
    with gzip.open(path, "wt") as f:
        json.dump(kineto_json(trace, drop_kernel_correlation=drop), f)
    got = load_trace(path)
    ev = got.events
    assert got.meta["source"] == "chrome"
    assert got.meta["flows"] == got.meta["flows_linked"] == 114
    assert got.meta["skipped"] == {"cpu_op": 1, "python_function": 1}
    # kernels on their streams, each linked to exactly one launch call by correlation id
    k = ev[ev["kind"] == "kernel"]
    assert set(k["row"]) == {"Stream 7", "Stream 13", "Stream 14"}
    assert (k["row"] == "Stream " + k["stream"].astype(str)).all()
    calls = ev[ev["row"] == API_ROW]
    assert k["corr_id"].isin(calls["corr_id"]).all()
    assert calls.set_index("corr_id").loc[k["corr_id"], "name"].eq("cudaLaunchKernel").all()
    # same events as the source trace, shifted to Kineto's time origin
    shift = int(ev["start_ns"].min() - trace.events["start_ns"].min())
    mine = ev.assign(start_ns=ev["start_ns"] - shift, end_ns=ev["end_ns"] - shift)
    pd.testing.assert_frame_equal(_sorted(mine, KEY), _sorted(trace.events, KEY))
    assert sorted(got.tokens()) == [0, 1, 2]      # ProfilerStep#N
    assert (ev.loc[ev["kind"] == "sync", "stream"] == 7).all()   # from the cuda_sync records


def test_chrome_errors_say_what_was_expected(tmp_path) -> None:
    cases = {
        "empty.json": ("", "is empty"),
        "broken.json": ('{"traceEvents": [', "not valid JSON"),
        "scalar.json": ("42", "expected a JSON object with a 'traceEvents' list"),
        "cpu_only.json": (json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1,
                                                        "dur": 2, "pid": 1, "tid": 1}]}),
                          r"no CUDA activity .* found categories \['cpu_op'\]"),
        "no_ts.json": (json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k"}]}), "numeric 'ts'"),
    }
    for name, (text, match) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        with pytest.raises(TraceError, match=match):
            load_trace(p)
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.json")
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    with pytest.raises(TraceError, match="neither Parquet, SQLite nor"):
        load_trace(binary)


def test_sniffing_ignores_the_suffix(tmp_path, trace: Trace) -> None:
    a = write_nsys_sqlite(trace, tmp_path / "looks_like.json")
    b = tmp_path / "looks_like.sqlite"
    b.write_text(json.dumps(kineto_json(trace)))
    c = write_perfetto(trace, tmp_path / "w.trace")
    assert (sniff(a), sniff(b), sniff(c)) == ("nsys", "chrome", "perfetto")


def test_read_chrome_trace_accepts_the_bare_event_list(trace: Trace) -> None:
    events = kineto_json(trace)["traceEvents"]
    assert len(read_chrome_trace(events)) == len(trace)


# ----------------------------------------------------------------------------- CLI

def test_view_summary_and_conversion(tmp_path, trace: Trace, capsys) -> None:
    src = write_nsys_sqlite(trace, tmp_path / "r.sqlite")
    assert cli_main(["view", str(src), "--summary"]) == 0
    s = json.loads(capsys.readouterr().out.strip())
    assert s == {"source": "nsys", "events": 285, "kernels": 102, "api_calls": 168, "syncs": 12, "memcpys": 12,
                 "memsets": 0, "markers": 3, "streams": 3, "linked_pairs": 114, "linked_kernels": 102, "tokens": 3,
                 "span_us": trace.span_ns / 1e3}
    out = tmp_path / "r.json"
    assert cli_main(["view", str(src), "--out", str(out)]) == 0
    assert len(load_trace(out)) == 285
    assert cli_main(["view", str(tmp_path / "nope.sqlite")]) == 2
    assert "no such trace file" in capsys.readouterr().err
