"""Regenerate the screenshots under ``docs/`` from real runs.

* ``docs/notebooks/<notebook>.png``: each notebook is executed top to bottom (nbclient, in a
  scratch folder) and the figure of its cell tagged ``main-plot`` is written through kaleido;
* ``docs/panel.png`` and ``docs/panel_compare.png``: ``00_tour`` runs in a real JupyterLab driven
  by Playwright on Debian's chromium; PDL is toggled in the control panel and the panel is shot
  with its timeline, then with the comparison against the pinned baseline.

Usage: ``python docs/make_screenshots.py [--only 03_pdl ...] [--no-panel]``
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import plotly.graph_objects as go
from nbclient import NotebookClient

from workbench.view.export import write_image
from workbench.view.lab import NOTEBOOKS, LabServer, launch_chromium, run_notebook_in_browser

DOCS = Path(__file__).resolve().parent
PLOTLY = "application/vnd.plotly.v1+json"


def main_figure(path: Path, work: Path) -> tuple[go.Figure, float]:
    """Execute the notebook; the figure its ``main-plot`` cell drew, and the run time."""
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
    elapsed = time.perf_counter() - t0
    for cell in nb.cells:
        if "main-plot" in cell.metadata.get("tags", []):
            for out in cell.outputs:
                if PLOTLY in out.get("data", {}):
                    return go.Figure(out["data"][PLOTLY]), elapsed
    raise RuntimeError(f"{path.name}: no figure in the cell tagged main-plot")


def notebook_shots(names: list[str] | None) -> None:
    out = DOCS / "notebooks"
    out.mkdir(exist_ok=True)
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if names and path.stem not in names:
            continue
        with tempfile.TemporaryDirectory() as work:
            fig, elapsed = main_figure(path, Path(work))
        png = write_image(fig, out / f"{path.stem}.png", width=1400, scale=1.0)
        print(f"{png.relative_to(DOCS.parent)}  ({path.name} ran in {elapsed:.1f} s)", flush=True)


def panel_shots() -> None:
    from playwright.sync_api import sync_playwright

    title = "() => document.querySelector('.wb-panel .wb-timeline .js-plotly-plot').layout.title.text"
    with tempfile.TemporaryDirectory() as root:
        shutil.copy(NOTEBOOKS / "00_tour.ipynb", root)
        with LabServer(root) as lab, sync_playwright() as pw:
            browser = launch_chromium(pw)
            page = browser.new_page(viewport={"width": 1500, "height": 2200})
            run_notebook_in_browser(page, lab, "00_tour.ipynb", timeout_s=300)
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
            panel = page.locator(".wb-panel")
            panel.scroll_into_view_if_needed()
            page.locator(".wb-panel .wb-pdl input[type=checkbox]").click()
            page.wait_for_function(title + ".includes('graphs+pdl')", timeout=120_000)
            page.wait_for_function("() => document.querySelector('.wb-panel .wb-summary').innerText"
                                   ".includes('graphs+pdl')", timeout=60_000)
            page.wait_for_timeout(1000)
            panel.screenshot(path=str(DOCS / "panel.png"))
            page.locator(".wb-panel .lm-TabBar-tab", has_text="vs baseline").click()
            page.wait_for_timeout(1500)
            panel.screenshot(path=str(DOCS / "panel_compare.png"))
            browser.close()
    print("docs/panel.png, docs/panel_compare.png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="notebook stems to redo (default: all)")
    p.add_argument("--no-panel", action="store_true", help="skip the JupyterLab panel screenshots")
    p.add_argument("--no-notebooks", action="store_true", help="skip the notebooks' main plots")
    args = p.parse_args(argv)
    if not args.no_notebooks:
        notebook_shots(args.only)
    if not args.no_panel:
        panel_shots()
    return 0


if __name__ == "__main__":
    sys.exit(main())
