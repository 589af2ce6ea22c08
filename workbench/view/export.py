"""Write a timeline or trace to a file: self-contained HTML, PNG / SVG / PDF (kaleido driving
Debian's chromium), or a trace file (from a Trace, through ``workbench.trace.io.save_trace``).

The HTML carries ``LOD_JS``, the browser half of ``workbench.view.timeline``: a zoom refills the
event traces for the new window from the typed arrays in ``layout.meta.workbench.lod`` (single
events when few enough are visible, rows rasterized otherwise: ``show_window``), and hovering an
event highlights every event with its correlation id (an API call and the kernels or copies it
launched) with flow lines between them; a click pins the highlight, a click on an event
without a correlation id clears it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from ..trace.table import Trace
from .lodpack import UNPACK_JS, pack_lod

#: plotly config of exported HTML: wheel zooms the time axis (rows are fixed), no logo
HTML_CONFIG = {"scrollZoom": True, "displaylogo": False, "responsive": True, "doubleClick": "reset",
               "toImageButtonOptions": {"format": "png", "scale": 2}}
IMAGE_WIDTH = 1600

LOD_JS = r"""
(function () {
  var gd = document.getElementById('{plot_id}');
  if (!gd || !gd.layout || !gd.layout.meta || !gd.layout.meta.workbench) { return; }
  var wb = gd.layout.meta.workbench, L = wb.lod, HL = wb.highlight[0], FLOW = wb.highlight[1];
  var HOST = {api: true, graph: true, sync: true};
  var TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, u4: Uint32Array, i2: Int16Array,
               u2: Uint16Array, i1: Int8Array, u1: Uint8Array};
  function decode(a) {            // plotly's base64 typed-array spec -> typed array
    if (!a || typeof a.bdata !== 'string') { return a || []; }
    var bin = atob(a.bdata), u8 = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) { u8[i] = bin.charCodeAt(i); }
    return new TYPES[a.dtype](u8.buffer);
  }
  var C = {};
  function fill(classes) {
    Object.keys(classes).forEach(function (cls) {
      var c = classes[cls];
      C[cls] = {trace: c.trace, x0: decode(c.x0), x1: decode(c.x1), y: decode(c.y), cd: decode(c.cd),
                label: decode(c.label), maxdur: c.maxdur, detail: c.detail, overview: c.overview};
    });
  }
  function lowerBound(a, v) {
    var lo = 0, hi = a.length;
    while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] < v) { lo = m + 1; } else { hi = m; } }
    return lo;
  }
  function visible(c, lo, hi) {   // events overlapping [lo, hi]; x0 is sorted
    var a = lowerBound(c.x0, lo - c.maxdur), b = lowerBound(c.x0, hi), idx = [];
    while (b < c.x0.length && c.x0[b] === hi) { b++; }
    for (var i = a; i < b; i++) { if (c.x1[i] >= lo) { idx.push(i); } }
    return idx;
  }
  function detail(c, idx, minLen) {   // bars at least half a pixel long, as in show_window
    var n = idx.length, x = new Float64Array(3 * n), y = new Float32Array(3 * n), cd = new Array(3 * n),
        text = new Array(3 * n);
    for (var k = 0; k < n; k++) {
      var i = idx[k], row = [c.cd[4 * i], c.cd[4 * i + 1], c.cd[4 * i + 2], c.cd[4 * i + 3]], t = L.labels[c.label[i]];
      x[3 * k] = c.x0[i]; x[3 * k + 1] = Math.max(c.x1[i], c.x0[i] + minLen); x[3 * k + 2] = NaN;
      y[3 * k] = y[3 * k + 1] = y[3 * k + 2] = c.y[i];
      cd[3 * k] = cd[3 * k + 1] = cd[3 * k + 2] = row;
      text[3 * k] = text[3 * k + 1] = t; text[3 * k + 2] = '';
    }
    return {x: x, y: y, cd: cd, text: text};
  }
  function raster(sel, lo, hi) {   // timeline.raster_rows: each bin takes the class keeping it busiest
    var bins = L.bins, w = (hi - lo) / bins, names = Object.keys(C), nc = names.length;
    var rowOf = new Map(), ys = [], cov = [], cnt = [], out = {};
    names.forEach(function (cls, ci) {
      var c = C[cls], idx = sel[cls];
      out[cls] = {s: [], e: [], y: [], cd: []};
      for (var k = 0; k < idx.length; k++) {
        var i = idx[k], r = rowOf.get(c.y[i]);
        if (r === undefined) {
          r = ys.length; rowOf.set(c.y[i], r); ys.push(c.y[i]);
          cov.push(new Float64Array(nc * bins)); cnt.push(new Float64Array(nc * bins));
        }
        var p0 = Math.min(bins, Math.max(0, (c.x0[i] - lo) / w));
        var p1 = Math.min(bins, Math.max(0, Math.max((c.x1[i] - lo) / w, p0 + 0.01)));
        var base = ci * bins, b0 = Math.min(bins - 1, Math.floor(p0));
        cnt[r][base + b0] += 1;
        for (var b = b0; b < p1; b++) {
          var a0 = Math.max(p0, b), a1 = Math.min(p1, b + 1);
          if (a1 > a0) { cov[r][base + b] += a1 - a0; }
        }
      }
    });
    for (var r = 0; r < ys.length; r++) {
      var cur = -1, start = 0, n = 0, busy = 0;
      for (var b = 0; b <= bins; b++) {
        var dom = -1, best = 0, tot = 0;
        if (b < bins) {
          for (var ci = 0; ci < nc; ci++) {
            var v = cov[r][ci * bins + b];
            tot += v;
            if (v > best) { best = v; dom = ci; }
          }
        }
        if (dom !== cur) {
          if (cur >= 0) {
            var o = out[names[cur]];
            o.s.push(lo + start * w); o.e.push(lo + b * w); o.y.push(ys[r]);
            o.cd.push([n, Math.min(100, 100 * busy / (b - start)), (b - start) * w, -1]);
          }
          cur = dom; start = b; n = 0; busy = 0;
        }
        if (dom >= 0) { n += cnt[r][dom * bins + b]; busy += tot; }
      }
    }
    return out;
  }
  function bars(o) {
    var n = o.s.length, x = new Float64Array(3 * n), y = new Float32Array(3 * n), cd = new Array(3 * n);
    for (var j = 0; j < n; j++) {
      x[3 * j] = o.s[j]; x[3 * j + 1] = o.e[j]; x[3 * j + 2] = NaN;
      y[3 * j] = y[3 * j + 1] = y[3 * j + 2] = o.y[j];
      cd[3 * j] = cd[3 * j + 1] = cd[3 * j + 2] = o.cd[j];
    }
    return {x: x, y: y, cd: cd, text: null};
  }
  function show(lo, hi) {         // timeline.show_window
    var sel = {}, total = 0, ids = [], up = {x: [], y: [], customdata: [], text: [], hovertemplate: [], mode: []};
    Object.keys(C).forEach(function (cls) { sel[cls] = visible(C[cls], lo, hi); total += sel[cls].length; });
    var one = total <= L.budget, ticks = total <= L.ticks, runs = one ? null : raster(sel, lo, hi);
    Object.keys(C).forEach(function (cls) {
      var c = C[cls], d = one ? detail(c, sel[cls], 0.5 * (hi - lo) / L.bins) : bars(runs[cls]);
      ids.push(c.trace); up.x.push(d.x); up.y.push(d.y); up.customdata.push(d.cd); up.text.push(d.text);
      up.hovertemplate.push(one ? c.detail : c.overview); up.mode.push(one && ticks ? 'lines+markers' : 'lines');
    });
    Plotly.restyle(gd, up, ids);
    gd.dataset.workbenchView = one ? 'detail' : 'merged';
  }
  function onZoom(ev) {
    if (!ev) { return; }
    var keys = Object.keys(ev).join(' ');
    if (keys.indexOf('xaxis.range') < 0 && keys.indexOf('xaxis.autorange') < 0) { return; }
    var r = gd._fullLayout.xaxis.range;
    show(r[0], r[1]);
  }

  // correlation: an API call and the work it launched share a correlation id
  var index = null, pinned = false, shown = null;
  function build() {
    index = new Map();
    Object.keys(C).forEach(function (cls) {
      var c = C[cls];
      for (var i = 0; i < c.x0.length; i++) {
        var corr = c.cd[4 * i + 3];
        if (corr < 0) { continue; }
        var list = index.get(corr);
        if (!list) { list = []; index.set(corr, list); }
        list.push([c.x0[i], c.x1[i], c.y[i], HOST[cls] === true]);
      }
    });
  }
  function link(corr) {
    if (corr === shown) { return; }
    shown = corr;
    var bx = [], by = [], fx = [], fy = [];
    if (corr !== null && corr >= 0) {
      if (!index) { build(); }
      var list = index.get(corr) || [];
      list.forEach(function (e) { bx.push(e[0], e[1], null); by.push(e[2], e[2], null); });
      list.forEach(function (h) {
        if (!h[3]) { return; }
        list.forEach(function (w) { if (!w[3]) { fx.push(h[0], w[0], null); fy.push(h[2], w[2], null); } });
      });
    }
    Plotly.restyle(gd, {x: [bx, fx], y: [by, fy]}, [HL, FLOW]);
  }
  function corrOf(ev) {
    var p = ev && ev.points && ev.points[0];
    if (!p || !p.data || !p.data.meta || !(p.data.meta.cls in C) || !p.customdata) { return null; }
    return p.customdata[3];
  }
  function wire() {
    gd.on('plotly_relayout', onZoom);
    gd.on('plotly_hover', function (ev) { if (!pinned) { link(corrOf(ev)); } });
    gd.on('plotly_unhover', function () { if (!pinned) { link(null); } });
    gd.on('plotly_click', function (ev) {
      var c = corrOf(ev);
      pinned = c !== null && c >= 0;
      shown = undefined;
      link(pinned ? c : null);
    });
    gd.dataset.workbenchLinks = 'ready';
  }
{unpack_js}
  (L.packed ? unpackLod(L) : Promise.resolve(L.classes)).then(function (classes) { fill(classes); wire(); },
    function (err) { gd.dataset.workbenchLinks = 'error: ' + err; });
})();
""".replace("{unpack_js}", UNPACK_JS)


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
    """Self-contained HTML (plotly.js inlined: opens offline) with hover/click correlation; a
    timeline's level-of-detail arrays go in packed (``workbench.view.lodpack``), so the file
    grows by a few bytes an event."""
    path = Path(path)
    meta = fig.layout.meta
    wb = meta.get("workbench") if isinstance(meta, dict) else None
    obj: go.Figure | dict = fig
    if wb is not None and "lod" in wb and not wb["lod"].get("packed"):
        spec = fig.to_plotly_json()    # the figure's own data, not a copy; the figure stays as it is
        packed = {**meta, "workbench": {**wb, "lod": pack_lod(wb["lod"])}}
        obj = {"data": spec["data"], "layout": {**spec["layout"], "meta": packed}}
    pio.write_html(obj, path, include_plotlyjs=True, full_html=True, config=HTML_CONFIG, post_script=LOD_JS,
                   validate=False)
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
    (a figure, or a trace drawn with ``timeline``), or a trace file (.parquet, .json[.gz],
    .pftrace, .csv: ``workbench.trace.io.save_trace``; needs the Trace)."""
    from ..trace.io import DRAWN_SUFFIXES, SAVE_SUFFIXES, save_trace

    path = Path(path)
    name = path.name.lower()
    suffix = path.suffix.lower()
    if suffix not in DRAWN_SUFFIXES and any(name.endswith(s) for s in SAVE_SUFFIXES):
        if not isinstance(obj, Trace):
            raise ExportError(f"a {suffix} trace file (Perfetto JSON, Parquet, ...) is written from a Trace, not from "
                              "a figure: pass the trace")
        return save_trace(obj, path)
    if isinstance(obj, Trace):
        from .timeline import timeline

        obj = timeline(obj)
    if suffix in (".html", ".htm"):
        return write_html(obj, path)
    if suffix in (".png", ".svg", ".pdf"):
        return write_image(obj, path, **kw)
    raise ExportError(f"unknown export format {suffix or '(none)'!r} for {path.name}: "
                      "expected .html, .png, .svg, .pdf, or for a Trace .parquet, .json, .json.gz, .pftrace, .csv")
