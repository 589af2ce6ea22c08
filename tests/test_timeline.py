"""The Nsight-like timeline: rows, colours, hover and correlation data, PDL lanes, token
boundaries, run comparison, exports; on a synthetic trace and on a simulated run."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
from fixtures.synthetic import synthetic_trace
from plotly.callbacks import InputDeviceState, Points

from workbench.trace import Trace
from workbench.view.compare import compare, token_times
from workbench.view.export import ExportError, chromium_path, export, write_html
from workbench.view.timeline import CLASSES, CUSTOMDATA, highlight, linked_segments, timeline, timeline_widget


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthetic_trace(3, 2, pdl=True)


@pytest.fixture(scope="module")
def fig(trace: Trace) -> go.Figure:
    return timeline(trace, title="synthetic")


def _class_traces(fig: go.Figure) -> dict[str, go.Scattergl]:
    return {cls: fig.data[i] for cls, i in fig.layout.meta["workbench"]["traces"].items()}


def _bars(tr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = np.asarray(tr.x), np.asarray(tr.y)
    return x[0::3], x[1::3], y[0::3]


def test_rows_are_grouped_as_nsight_groups_them(fig: go.Figure) -> None:
    rows = fig.layout.meta["workbench"]["rows"]
    assert rows[:6] == ["Tokens", "Process [4242] llama-decode", "Thread [4242] main", "NVTX", "CUDA API",
                        "CUDA HW (GPU 0 - NVIDIA H200)"]
    named = [r for r in rows[6:] if r]
    assert named == ["Stream 7", "Stream 13", "Stream 14"]
    lanes = rows.index("Stream 13") - rows.index("Stream 7")
    assert lanes >= 2, "PDL overlap on stream 7 needs sub-rows"
    # labels are drawn as annotations, headers bold with a disclosure triangle
    texts = [a.text for a in fig.layout.annotations]
    assert "<b>▾ CUDA HW (GPU 0 - NVIDIA H200)</b>" in texts and "Stream 7" in texts
    assert fig.layout.yaxis.fixedrange and not fig.layout.xaxis.fixedrange   # zoom/pan in time only


def test_colours_follow_the_kind_of_work(fig: go.Figure, trace: Trace) -> None:
    traces = _class_traces(fig)
    assert set(traces) == {"kernel", "h2d", "d2h", "sync", "api", "marker"}
    for cls, tr in traces.items():
        assert tr.line.color == CLASSES[cls][1] and tr.name == CLASSES[cls][0]
        assert isinstance(tr, go.Scattergl)   # WebGL, one trace per colour, not one shape per event
    ev = trace.events
    counts = {"kernel": (ev["kind"] == "kernel").sum(), "h2d": (ev["copy_kind"] == "H2D").sum(),
              "d2h": (ev["copy_kind"] == "D2H").sum(), "sync": (ev["kind"] == "sync").sum(),
              "api": (ev["kind"] == "api").sum(), "marker": (ev["kind"] == "marker").sum()}
    for cls, n in counts.items():
        assert len(traces[cls].x) == 3 * n
    assert CLASSES["h2d"][1] != CLASSES["d2h"][1] != CLASSES["kernel"][1]
    g = timeline(synthetic_trace(2, 1, graphs=True))
    assert len(_class_traces(g)["graph"].x) == 3 * 2


def test_hover_carries_name_duration_stream_node_token(fig: go.Figure, trace: Trace) -> None:
    k = _class_traces(fig)["kernel"]
    assert fig.layout.meta["workbench"]["customdata"] == list(CUSTOMDATA)
    assert "%{text}" in k.hovertemplate and "stream %{customdata[1]}" in k.hovertemplate
    ev = trace.events[trace.events["kind"] == "kernel"].sort_values("start_ns", kind="stable")
    first = ev.iloc[0]
    x0, x1, _ = _bars(k)
    i = int(np.argmin(np.abs(x0 - (first["start_ns"] - trace.events["start_ns"].min()) / 1e3)))
    assert k.text[3 * i] == f"{first['name']}<br>node {first['node']}"
    dur, stream, token, corr = np.asarray(k.customdata)[3 * i]
    assert (dur, stream, token, corr) == (first["end_ns"] - first["start_ns"], first["stream"], first["token"],
                                          first["corr_id"])
    assert x1[i] - x0[i] == pytest.approx(dur / 1e3)


def test_overlapping_events_of_one_row_get_their_own_lane(fig: go.Figure) -> None:
    lod = fig.layout.meta["workbench"]["lod"]["classes"]
    allb = np.concatenate([np.stack([c["x0"], c["x1"], c["y"]], axis=1) for c in lod.values()])
    for y in np.unique(allb[:, 2]):
        b = allb[allb[:, 2] == y]
        b = b[np.argsort(b[:, 0], kind="stable")]
        assert (b[1:, 0] >= b[:-1, 1] - 1e-9).all(), f"bars overlap on row y={y}"


def test_api_call_links_to_the_work_it_launched(fig: go.Figure, trace: Trace) -> None:
    api = _class_traces(fig)["api"]
    cd = np.asarray(api.customdata)
    launches = [i for i in range(0, len(cd), 3) if "attn_q" in api.text[i]]
    corr = int(cd[launches[0], 3])
    bx, by, fx, fy = linked_segments(fig, corr)
    assert len(bx) == 6 and len(fx) == 3        # the call and its kernel, one flow line
    kernel = trace.events[(trace.events["corr_id"] == corr) & (trace.events["kind"] == "kernel")]
    assert kernel["node"].tolist() == ["blk.0.attn_q"]
    rows = fig.layout.meta["workbench"]["rows"]
    assert rows[int(fy[0])] == "CUDA API" and rows[int(fy[1])] in ("Stream 7", "")
    w = timeline_widget(fig)
    hl, flow = w.layout.meta["workbench"]["highlight"]
    k_idx = w.layout.meta["workbench"]["traces"]["kernel"]
    kcd = np.asarray(w.data[k_idx].customdata)
    point = int(np.flatnonzero(kcd[:, 3] == corr)[0])
    w.data[k_idx]._dispatch_on_hover(Points([point], "Kernel", k_idx), InputDeviceState())
    assert len(w.data[hl].x) == 6 and len(w.data[flow].x) == 3
    highlight(w, -1)
    assert len(w.data[hl].x) == 0


def test_token_boundaries_and_token_row(fig: go.Figure, trace: Trace) -> None:
    bound = next(t for t in fig.data if (t.meta or {}).get("cls") == "token-boundary")
    assert len(bound.x) == 3 * 3
    t0 = trace.events["start_ns"].min()
    starts = sorted(trace.events.groupby("token")["start_ns"].min())
    assert np.allclose(np.asarray(bound.x)[0::3], [(s - t0) / 1e3 for s in starts])
    labels = [a.text for a in fig.layout.annotations if a.xref == "x"]
    assert labels == ["t0", "t1", "t2"]


def test_simulated_run_renders_like_nsight() -> None:
    import workbench
    from workbench.models import preset
    from workbench.strategy import Strategy

    run = workbench.run(preset("llama-tiny"), Strategy(graphs=True, pdl=True, streams="qkv", sync="boundary"), tokens=3,
                        backend="sim", gpu="h100")
    fig = timeline(run.trace)
    rows = fig.layout.meta["workbench"]["rows"]
    assert "CUDA API" in rows and {"Stream 0", "Stream 1", "Stream 2"} <= set(rows)
    assert rows.index("CUDA API") < rows.index("Stream 0")
    traces = _class_traces(fig)
    assert {"kernel", "h2d", "d2h", "sync", "graph"} <= set(traces)
    kcorr = set(np.asarray(traces["kernel"].customdata)[0::3, 3])
    gcorr = set(np.asarray(traces["graph"].customdata)[0::3, 3])
    replayed = run.trace.events[(run.trace.events["kind"] == "kernel") & (run.trace.events["graph_id"] > 0)]
    assert set(replayed["corr_id"]) <= gcorr <= kcorr   # every graph launch links to the kernels it replays
    bx, _, fx, _ = linked_segments(fig, int(sorted(gcorr)[-1]))
    assert len(bx) // 3 == 1 + (replayed["corr_id"] == sorted(gcorr)[-1]).sum() and len(fx) > 3


def test_comparison_aligns_runs_at_a_token_and_annotates_the_difference() -> None:
    runs = {"eager": synthetic_trace(3, 2, pdl=False), "graph+PDL": synthetic_trace(3, 2, graphs=True)}
    fig = compare(runs, align_token=1)
    rows = fig.layout.meta["workbench"]["rows"]
    assert rows[0] == "eager" and "graph+PDL" in rows
    token_bars = [t for t in fig.data if (t.meta or {}).get("cls") == "token"]
    x0 = np.concatenate([np.asarray(t.x)[0::3] for t in token_bars])
    tok = np.concatenate([np.asarray(t.customdata)[0::3, 1] for t in token_bars])
    assert np.allclose(x0[tok == 1], 0.0)     # token 1 starts at t = 0 in both runs
    tt = token_times(runs)
    g = tt[tt["run"] == "graph+PDL"].set_index("token")
    assert (g["diff_us"] < 0).all()
    texts = [a.text for a in fig.layout.annotations if a.xref == "x"]
    d1 = g.loc[1]
    assert f"t1 · {d1['time_us']:,.1f} µs ({d1['diff_pct']:+.1f} %)" in texts
    hover = np.concatenate([np.asarray(t.text) for t in token_bars])
    assert f"t1 · {d1['time_us']:,.1f} µs ({d1['diff_us']:+,.1f} µs, {d1['diff_pct']:+.1f} % vs eager)" in hover
    assert "aligned at token 1" in fig.layout.title.text
    with pytest.raises(ValueError, match="no token 7"):
        compare(runs, align_token=7)
    with pytest.raises(ValueError, match="two or more runs"):
        compare({"one": runs["eager"]})


def test_html_export_is_self_contained_with_the_link_script(tmp_path, fig: go.Figure) -> None:
    path = write_html(fig, tmp_path / "t.html")
    html = path.read_text()
    assert "workbenchLinks" in html and "plotly_hover" in html
    assert "<script src=" not in html and len(html) > 3_000_000   # plotly.js inlined: opens offline
    with pytest.raises(ExportError, match="is written from a Trace, not from a figure"):
        export(fig, tmp_path / "t.json")
    with pytest.raises(ExportError, match="expected .html, .png"):
        export(fig, tmp_path / "t.bmp")


@pytest.mark.skipif(chromium_path() is None, reason="no Chrome/Chromium for kaleido: apt-get install chromium")
def test_png_and_svg_export(tmp_path) -> None:
    fig = timeline(synthetic_trace(2, 1))
    png = export(fig, tmp_path / "t.png", width=900)
    svg = export(fig, tmp_path / "t.svg", width=900)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = svg.read_text()
    assert text.lstrip().startswith("<svg") and "Stream 7" in text


@pytest.mark.browser
@pytest.mark.skipif(chromium_path() is None, reason="no Chrome/Chromium to drive")
def test_hovering_a_kernel_in_exported_html_highlights_its_launch(tmp_path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    path = write_html(timeline(synthetic_trace(2, 1)), tmp_path / "t.html")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 700})
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelector('.js-plotly-plot')?.dataset.workbenchLinks === 'ready'")
        at = page.evaluate("""() => {
            const gd = document.querySelector('.js-plotly-plot'), wb = gd.layout.meta.workbench;
            const fd = gd._fullData[wb.traces.kernel], k = 6;
            const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
            return {x: box.left + gd._fullLayout.xaxis.l2p((fd.x[3*k] + fd.x[3*k+1]) / 2),
                    y: box.top + gd._fullLayout.yaxis.l2p(fd.y[3*k]), corr: fd.customdata[3*k][3]};
        }""")
        page.mouse.move(at["x"], at["y"])
        page.wait_for_function("""() => {
            const gd = document.querySelector('.js-plotly-plot'), wb = gd.layout.meta.workbench;
            return (gd.data[wb.highlight[0]].x || []).length === 6; }""", timeout=5000)
        flow = page.evaluate("""() => { const gd = document.querySelector('.js-plotly-plot');
            return Array.from(gd.data[gd.layout.meta.workbench.highlight[1]].x); }""")
        browser.close()
    assert len(flow) == 3


def test_level_of_detail_rasterizes_wide_windows_and_details_narrow_ones() -> None:
    from fixtures.synthetic import synthetic_events

    from workbench.view.timeline import DETAIL_BUDGET, raster_rows, show_window

    tr = synthetic_events(25_000, layers=2)            # more events than one window draws singly
    assert len(tr) > DETAIL_BUDGET
    fig = timeline(tr)
    lod = fig.layout.meta["workbench"]["lod"]
    k = fig.data[lod["classes"]["kernel"]["trace"]]
    assert np.asarray(k.customdata)[0, 3] == -1 and "merged" in k.hovertemplate
    lo, hi = lod["full"]
    assert fig.layout.xaxis.range == tuple(lod["full"])
    # a narrow window shows every event in it, with its correlation id
    assert show_window(fig, lo, lo + (hi - lo) / 100) == "detail"
    x0, x1, _ = _bars(fig.data[lod["classes"]["kernel"]["trace"]])
    c = lod["classes"]["kernel"]
    inside = (c["x1"] >= lo) & (c["x0"] <= lo + (hi - lo) / 100)
    assert len(x0) == inside.sum() and (np.asarray(fig.data[c["trace"]].customdata)[0::3, 3] >= 0).all()
    assert show_window(fig, lo, hi) == "merged"
    # rasterization: a bin goes to the class that keeps it busiest; counts add up
    sel = {"a": (np.array([0.0, 5.0]), np.array([4.0, 6.0]), np.array([1.0, 1.0])),
           "b": (np.array([3.5]), np.array([10.0]), np.array([1.0]))}
    runs = raster_rows(sel, 0.0, 10.0, 10)
    # bins 0-3: a; bin 4: only b; bin 5: a and b tie, the first class wins; bins 6-9: b
    assert runs["a"][0].tolist() == [0.0, 5.0] and runs["a"][1].tolist() == [4.0, 6.0]
    assert runs["b"][0].tolist() == [4.0, 6.0] and runs["b"][1].tolist() == [5.0, 10.0]
    assert runs["a"][3][:, 0].tolist() == [1, 1] and runs["a"][3][:, 1].tolist() == [100, 100]
    assert (runs["b"][2] == 1.0).all() and (runs["b"][3][:, 3] == -1).all()
