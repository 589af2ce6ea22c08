"""A million-event timeline in a real browser: the run of issue 18 (simulated, 1.4 M events) saved as
Parquet, drawn by ``workbench view`` to HTML, opened in Debian's chromium through Playwright;
it renders and a zoom onto one token draws that token's kernels one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main as cli_main
from workbench.trace.io import load_trace
from workbench.view.export import chromium_path

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(chromium_path() is None, reason="no Chrome/Chromium to drive (scripts/setup.sh)")]
RUN = ["--backend", "sim", "--model", "llama-3.1-8b", "--tokens", "2200", "--context", "2304", "--graphs", "--pdl"]
READY = "document.querySelector('.js-plotly-plot')?.dataset.workbenchLinks === 'ready'"
KERNELS = """() => { const gd = document.querySelector('.js-plotly-plot');
    const k = gd._fullData[gd.layout.meta.workbench.traces.kernel];   // x decoded
    const cd = Array.isArray(k.customdata) ? k.customdata.map(r => r[2]) : [];
    return {view: gd.dataset.workbenchView, x: Array.from(k.x || []), cd: cd}; }"""


@pytest.mark.timeout(300)
def test_million_event_html_renders_and_zooms_to_single_kernels(tmp_path, capsys) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    src, html = tmp_path / "run.parquet", tmp_path / "run.html"
    assert cli_main(["run", *RUN, "--trace", str(src)]) == 0
    assert cli_main(["view", str(src), "--out", str(html)]) == 0
    assert html.stat().st_size <= 15 * 2**20
    trace = load_trace(src)
    ev = trace.events
    assert len(ev) >= 1_000_000
    token = 1000
    t0 = int(ev["start_ns"].min())
    mine = ev[(ev["token"] == token) & (ev["kind"] == "kernel")]
    lo, hi = (int(mine["start_ns"].min()) - t0) / 1e3, (int(mine["end_ns"].max()) - t0) / 1e3
    inside = ev[(ev["kind"] == "kernel") & (ev["end_ns"] - t0 >= lo * 1e3) & (ev["start_ns"] - t0 <= hi * 1e3)]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 900})
        try:
            page.goto(Path(html).as_uri(), timeout=120_000)
            page.wait_for_function(READY, timeout=120_000)
            whole = page.evaluate(KERNELS)
            assert 0 < len(whole["x"]) < 3 * len(inside)    # rendered: rows rasterized, not every event
            page.evaluate(f"() => Plotly.relayout(document.querySelector('.js-plotly-plot'), "
                          f"{{'xaxis.range': [{lo}, {hi}]}})")
            page.wait_for_function("document.querySelector('.js-plotly-plot').dataset.workbenchView === 'detail'",
                                   timeout=60_000)
            zoomed = page.evaluate(KERNELS)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()
    # every kernel of the window drawn singly, with exact start times and its token
    starts = sorted(zoomed["x"][0::3])
    assert len(starts) == len(inside)
    assert starts == sorted(((inside["start_ns"] - t0) / 1e3).tolist())
    assert set(zoomed["cd"][0::3]) >= {token} and len(mine) > 500
