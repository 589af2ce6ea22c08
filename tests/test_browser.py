"""The lab in a real browser: JupyterLab on a free localhost port with a token, Playwright driving
Debian's chromium, ``00_tour`` run top to bottom, PDL toggled in the panel, the timeline redrawn."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from workbench.view.lab import NOTEBOOKS, LabServer, launch_chromium, run_notebook_in_browser

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (scripts/setup.sh)"),
]
sync_api = pytest.importorskip("playwright.sync_api")

TITLE = "() => document.querySelector('.wb-panel .wb-timeline .js-plotly-plot').layout.title.text"
# per drawn trace: how many x values and their sum (bars moved when PDL overlaps kernels)
BARS = ("() => document.querySelector('.wb-panel .wb-timeline .js-plotly-plot').data"
        ".map(t => Array.from(t.x || []).reduce((a, b) => [a[0] + 1, a[1] + (Number.isFinite(b) ? b : 0)], [0, 0]))")


def test_tour_in_jupyterlab_toggle_pdl(tmp_path):
    root = tmp_path / "notebooks"
    root.mkdir()
    shutil.copy(NOTEBOOKS / "00_tour.ipynb", root)  # the lab saves outputs: never into the checkout
    shot = Path(os.environ.get("WORKBENCH_SCREENSHOT_DIR", tmp_path)) / "browser_tour_panel.png"
    with LabServer(root) as lab, sync_api.sync_playwright() as pw:
        browser = launch_chromium(pw, CHROMIUM)
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        try:
            run_notebook_in_browser(page, lab, "00_tour.ipynb", timeout_s=240)
            panel = page.locator(".wb-panel")
            panel.scroll_into_view_if_needed()
            page.wait_for_function(TITLE + " !== undefined", timeout=30_000)
            before_title, before_bars = page.evaluate(TITLE), page.evaluate(BARS)
            assert "graphs" in before_title and "pdl" not in before_title

            pdl = page.locator(".wb-panel .wb-pdl input[type=checkbox]")
            assert not pdl.is_checked()
            pdl.click()  # 'run on every change' is on in the tour: the kernel runs it in the background
            page.wait_for_function(TITLE + ".includes('graphs+pdl')", timeout=120_000)
            assert page.evaluate(TITLE) != before_title
            assert page.evaluate(BARS) != before_bars, "the timeline's bars did not change"
            page.wait_for_function("() => document.querySelector('.wb-panel .wb-summary').innerText"
                                   ".includes('graphs+pdl')", timeout=60_000)
            summary = page.locator(".wb-panel .wb-summary").inner_text()
            assert "graphs+pdl" in summary and "vs baseline" in summary and "race-free" in summary
            panel.screenshot(path=str(shot))
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()
    assert shot.stat().st_size > 20_000
