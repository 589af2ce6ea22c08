"""Write a timeline or trace to a file: self-contained HTML, PNG / SVG / PDF (kaleido driving
Debian's chromium), or Chrome/Perfetto trace JSON (from a Trace).

The HTML carries ``LINK_JS``: hovering an event highlights every event with its correlation id
(an API call and the kernels or copies it launched) and draws flow lines between them; a click
pins the highlight, a click on an event without a correlation id clears it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import plotly.graph_objects as go

from ..trace.table import Trace

#: plotly config of exported HTML: wheel zooms the time axis (rows are fixed), no logo
HTML_CONFIG = {"scrollZoom": True, "displaylogo": False, "responsive": True,
               "toImageButtonOptions": {"format": "png", "scale": 2}}
IMAGE_WIDTH = 1600

LINK_JS = r"""
(function () {
  var gd = document.getElementById('{plot_id}');
  if (!gd || !gd.layout || !gd.layout.meta || !gd.layout.meta.workbench) { return; }
  var wb = gd.layout.meta.workbench, HL = wb.highlight[0], FLOW = wb.highlight[1];
  var HOST = {api: true, graph: true, sync: true};
  var index = null, pinned = false, shown = null;
  function arr(i, key) {
    var f = gd._fullData && gd._fullData[i];
    return (f && f[key]) || gd.data[i][key];
  }
  function build() {
    index = new Map();
    Object.keys(wb.traces).forEach(function (cls) {
      var i = wb.traces[cls], cd = arr(i, 'customdata'), x = arr(i, 'x'), y = arr(i, 'y');
      for (var k = 0; 3 * k < cd.length; k++) {
        var c = cd[3 * k][3];
        if (c < 0) { continue; }
        var list = index.get(c);
        if (!list) { list = []; index.set(c, list); }
        list.push([x[3 * k], x[3 * k + 1], y[3 * k], HOST[cls] === true]);
      }
    });
  }
  function show(corr) {
    if (corr === shown) { return; }
    shown = corr;
    var bx = [], by = [], fx = [], fy = [];
    if (corr !== null && corr >= 0) {
      if (!index) { build(); }
      var list = index.get(corr) || [];
      list.forEach(function (e) { bx.push(e[0], e[1], null); by.push(e[2], e[2], null); });
      list.forEach(function (h) {
        if (!h[3]) { return; }
        list.forEach(function (w) {
          if (w[3]) { return; }
          fx.push(h[0], w[0], null); fy.push(h[2], w[2], null);
        });
      });
    }
    Plotly.restyle(gd, {x: [bx, fx], y: [by, fy]}, [HL, FLOW]);
  }
  function corrOf(ev) {
    var p = ev && ev.points && ev.points[0];
    if (!p || !p.data || !p.data.meta || !(p.data.meta.cls in wb.traces) || !p.customdata) { return null; }
    return p.customdata[3];
  }
  gd.on('plotly_hover', function (ev) { if (!pinned) { show(corrOf(ev)); } });
  gd.on('plotly_unhover', function () { if (!pinned) { show(null); } });
  gd.on('plotly_click', function (ev) {
    var c = corrOf(ev);
    pinned = c !== null && c >= 0;
    shown = undefined;
    show(pinned ? c : null);
  });
  gd.dataset.workbenchLinks = 'ready';
})();
"""


class ExportError(RuntimeError):
    """An export that cannot be made here (no browser for kaleido, wrong input for the format)."""


def chromium_path() -> str | None:
    """The Chrome kaleido will drive: ``$BROWSER_PATH``, else Debian's chromium on PATH."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).exists():
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def write_html(fig: go.Figure, path: str | Path) -> Path:
    """Self-contained HTML (plotly.js inlined: opens offline) with hover/click correlation."""
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True, config=HTML_CONFIG, post_script=LINK_JS)
    return path


def write_image(fig: go.Figure, path: str | Path, *, width: int | None = None, scale: float = 1.0) -> Path:
    """PNG, SVG or PDF through kaleido; kaleido 1.x renders in a Chrome, here Debian's chromium."""
    path = Path(path)
    browser = chromium_path()
    if browser is None:
        raise ExportError(f"writing {path.name} needs a Chrome/Chromium for kaleido and none was found: install "
                          "Debian's chromium (`apt-get install -y chromium`, as scripts/setup.sh does) or set "
                          "BROWSER_PATH to a Chrome executable; HTML export works without one")
    os.environ.setdefault("BROWSER_PATH", browser)
    try:
        import kaleido
    except ImportError as e:
        raise ExportError(f"writing {path.name} needs kaleido: pip install 'kaleido>=1.0' "
                          "(in the package's lab extra)") from e
    # one browser for the whole session: the first image pays chromium's start, later ones do not
    kaleido.start_sync_server(silence_warnings=True)
    with warnings.catch_warnings():   # plotly passes browser options the running server already has
        warnings.filterwarnings("ignore", message="The kopts argument is ignored", category=UserWarning)
        fig.write_image(path, width=width or IMAGE_WIDTH, scale=scale)
    return path


def export(obj: go.Figure | Trace, path: str | Path, **kw) -> Path:
    """Write ``obj`` in the format named by the suffix of ``path``: .html, .png, .svg, .pdf
    (a figure, or a trace drawn with ``timeline``) or .json (Perfetto; needs the Trace)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        if not isinstance(obj, Trace):
            raise ExportError("Perfetto JSON is written from a Trace, not from a figure: pass the trace")
        from ..trace.perfetto import write_perfetto

        return write_perfetto(obj, path)
    if isinstance(obj, Trace):
        from .timeline import timeline

        obj = timeline(obj)
    if suffix in (".html", ".htm"):
        return write_html(obj, path)
    if suffix in (".png", ".svg", ".pdf"):
        return write_image(obj, path, **kw)
    raise ExportError(f"unknown export format {suffix or '(none)'!r} for {path.name}: "
                      "expected .html, .png, .svg, .pdf or .json")
