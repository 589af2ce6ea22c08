"""Nsight Systems-like timeline of a Trace (plotly, WebGL).

Rows follow ``workbench.trace.layout`` (Process -> Thread -> NVTX / CUDA API; CUDA HW (GPU) ->
Stream N, split into lanes where events overlap, e.g. PDL kernels), colours follow the kind of
work (kernels, H2D / D2H / D2D copies, memsets, syncs, graph launches, other API calls, NVTX),
a ``Tokens`` row and dashed lines mark token boundaries.

Scale: every colour class is ONE ``Scattergl`` trace whose bars are line segments
(start, end, gap) drawn by WebGL, not one shape per event. Level of detail: a window showing
at most ``DETAIL_BUDGET`` events draws them one by one (with end ticks below ``TICK_BUDGET``);
a wider one is rasterized as Nsight draws a zoomed-out row: ``OVERVIEW_BINS`` bins per row,
each taking the colour of the class that keeps it busiest (hover gives the events and busy
share; ``raster_rows``). Every event stays in
``layout.meta.workbench.lod`` (typed arrays, sorted by start), so zooming refills the traces for
the new window: ``LOD_JS`` of ``workbench.view.export`` in HTML, ``show_window`` in a widget.
Timings of a 1.4 M-event run: ``data/bench/timeline_scale.md``. Hover data rides
in ``customdata`` columns ``CUSTOMDATA`` (duration, stream, token, correlation id) and ``text``.

Correlation: hovering or clicking an event fills the two highlight traces (the linked events
and flow lines from the API call to the work it launched). In a notebook ``timeline_widget``
wires this with FigureWidget callbacks; ``workbench.view.export`` writes HTML whose script
(``LOD_JS``) does the same in the browser.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..trace.analysis import token_spans
from ..trace.layout import Layout, assign_lanes, layout
from ..trace.table import Trace

#: colour class -> (legend name, colour). Nsight's conventions: kernels blue, HtoD green, DtoH red.
CLASSES: dict[str, tuple[str, str]] = {
    "kernel": ("Kernel", "#3d7cc9"),
    "h2d": ("Memcpy HtoD", "#3fa34d"),
    "d2h": ("Memcpy DtoH", "#d1495b"),
    "d2d": ("Memcpy DtoD", "#8e6bbf"),
    "memset": ("Memset", "#29a3a3"),
    "sync": ("Synchronization", "#f28e2b"),
    "graph": ("CUDA graph", "#e3b505"),
    "api": ("CUDA API", "#b3a58c"),
    "marker": ("NVTX", "#76b7b2"),
}
TOKEN_COLORS = ("#c9ced6", "#dde1e7")
HIGHLIGHT_COLOR = "#ff1f8e"
#: customdata columns of every event trace (the HTML script and the widget read corr_id from here)
CUSTOMDATA = ("dur", "stream", "token", "corr_id")

ROW_PX = 22
BAR_PX = 14
MARGIN_L = 250
LABEL_CHARS = 34
MAX_TOKEN_LABELS = 300
DETAIL_BUDGET = 20_000   # events a window draws one by one; more are rasterized per row
TICK_BUDGET = 3_000      # events a window draws with end ticks (WebGL markers cost ~0.3 ms each)
OVERVIEW_BINS = 1_200    # rasterized view: bins per row across the window (about one per pixel)


def _darker(color: str, f: float = 0.7) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"#{int(r * f):02x}{int(g * f):02x}{int(b * f):02x}"


CLASS_NAMES = tuple(CLASSES)
_KIND_CLASS = {"kernel": "kernel", "memset": "memset", "sync": "sync", "marker": "marker", "memcpy": "d2d",
               "graph": "graph"}
_COPY_CLASS = {"H2D": "h2d", "D2H": "d2h"}


def class_codes(events: pd.DataFrame) -> np.ndarray:
    """Index into CLASS_NAMES of every event's colour class (codes of the few distinct kinds,
    copy kinds and API names are mapped, not a million strings compared)."""
    code = {c: i for i, c in enumerate(CLASS_NAMES)}
    kc, kinds = pd.factorize(events["kind"], sort=False)
    out = np.array([code[_KIND_CLASS.get(str(k), "api")] for k in kinds], dtype=np.int8)[kc]
    memcpy = np.flatnonzero(kc == list(kinds).index("memcpy")) if "memcpy" in set(kinds) else np.zeros(0, int)
    if len(memcpy):
        cc, copies = pd.factorize(events["copy_kind"].to_numpy()[memcpy], sort=False)
        out[memcpy] = np.array([code[_COPY_CLASS.get(str(c), "d2d")] for c in copies], dtype=np.int8)[cc]
    api = np.flatnonzero(out == code["api"])
    if len(api):
        nc, names = pd.factorize(events["name"].to_numpy()[api], sort=False)
        graph = np.array(["GraphLaunch" in str(n) for n in names], dtype=bool)[nc]
        out[api[graph]] = code["graph"]
    return out


def color_class(events: pd.DataFrame) -> np.ndarray:
    """Colour class (a key of CLASSES) of every event."""
    return np.array(CLASS_NAMES, dtype=object)[class_codes(events)]


@dataclass
class Panel:
    """One run drawn in a figure: its trace, an optional run header and its time origin
    (events are drawn at ``(t - origin_ns) / 1000`` microseconds)."""

    trace: Trace
    label: str | None = None
    origin_ns: int | None = None
    token_labels: dict[int, str] | None = None   # text on each token's bar (default ``t<token>``)
    token_hover: dict[int, str] | None = None    # hover text of each token's bar (default: its label)


def _labels(events: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Hover text per event as (code, table): name, and the graph node when there is one."""
    name_codes, names = pd.factorize(events["name"], sort=False)
    node_codes, nodes = pd.factorize(events["node"], sort=False)
    n_nodes = max(len(nodes), 1)
    key_id, uniq = pd.factorize(name_codes.astype(np.int64) * n_nodes + node_codes, sort=False)
    texts = []
    for k in uniq:
        name, node = str(names[k // n_nodes]), str(nodes[k % n_nodes])
        texts.append(f"{name}<br>node {node}" if node and node != name else name)
    return key_id.astype(np.int32), texts


def _segments(x0: np.ndarray, x1: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bars as line segments: (start, end, gap) per event."""
    n = len(x0)
    x = np.empty(3 * n)
    x[0::3], x[1::3], x[2::3] = x0, x1, np.nan
    yy = np.repeat(y.astype(np.float32), 3)
    return x, yy


def _triple(a: np.ndarray) -> np.ndarray:
    return np.repeat(a, 3, axis=0)


HOVER = {
    "kernel": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "h2d": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "d2h": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "d2d": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "memset": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "sync": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "graph": "stream %{customdata[1]} · token %{customdata[2]} · corr %{customdata[3]}",
    "api": "token %{customdata[2]} · corr %{customdata[3]}",
    "marker": "token %{customdata[2]}",
}


def build_figure(panels: list[Panel], *, title: str | None = None, tokens: bool = True) -> go.Figure:
    """The figure of one or more runs stacked on one time axis (``timeline`` and ``compare``)."""
    rows: list[dict] = []            # every drawn row, top to bottom (y = index)
    parts: list[dict[str, np.ndarray]] = []   # per panel: x0, x1, y, class code, hover data of its events
    token_bars: list[pd.DataFrame] = []
    boundaries: list[tuple[float, int, int]] = []   # (x, first row, last row)
    labels: list[str] = []           # hover text table of all panels (events hold codes)
    for panel in panels:
        ev = panel.trace.events
        origin = panel.origin_ns if panel.origin_ns is not None else (int(ev["start_ns"].min()) if len(ev) else 0)
        top = len(rows)
        indent = 0
        if panel.label is not None:
            rows.append(dict(label=panel.label, level=0, header=True, run=True))
            indent = 1
        spans = token_spans(panel.trace) if tokens else pd.DataFrame()
        if len(spans):
            tok_y = len(rows)
            lanes = assign_lanes(np.zeros(len(spans), dtype=np.int64), spans["start_ns"].to_numpy(),
                                 spans["end_ns"].to_numpy())
            for lane in range(int(lanes.max()) + 1):
                rows.append(dict(label="Tokens" if lane == 0 else "", level=indent, header=False, run=False))
            names = panel.token_labels or {}
            token_bars.append(spans.assign(x0=(spans["start_ns"] - origin) / 1e3, x1=(spans["end_ns"] - origin) / 1e3,
                                           y=tok_y + lanes, run=panel.label or "",
                                           text=[names.get(int(t), f"t{t}") for t in spans["token"]],
                                           hover=[(panel.token_hover or {}).get(int(t), names.get(int(t), f"t{t}"))
                                                  for t in spans["token"]]))
        lay: Layout = layout(panel.trace)
        base = len(rows)
        for t in lay.tracks.itertuples():
            rows.append(dict(label=t.label, level=t.level + indent, header=bool(t.header), run=False))
        if len(ev):
            start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
            codes, table = _labels(ev)
            parts.append({
                "x0": (start - origin) / 1e3, "x1": (end - origin) / 1e3, "y": base + lay.track,
                "cls": class_codes(ev), "dur": end - start, "stream": ev["stream"].to_numpy(),
                "token": ev["token"].to_numpy(), "corr": ev["corr_id"].to_numpy(), "label": codes + len(labels)})
            labels += table
        if len(spans):
            for s in spans["start_ns"].to_numpy():
                boundaries.append(((s - origin) / 1e3, top, len(rows) - 1))

    fig = go.Figure()
    meta_traces: dict[str, int] = {}
    lod: dict[str, dict] = {}
    cols = ("x0", "x1", "y", "cls", "dur", "stream", "token", "corr", "label")
    events = {c: np.concatenate([p[c] for p in parts]) if parts else np.zeros(0) for c in cols}
    order = np.lexsort((events["x0"], events["cls"])) if parts else np.zeros(0, dtype=np.int64)
    bounds = np.searchsorted(events["cls"][order], np.arange(len(CLASS_NAMES) + 1)) if parts else None
    for code, (cls, (name, color)) in enumerate(CLASSES.items()):
        if bounds is None or bounds[code] == bounds[code + 1]:
            continue
        idx = order[bounds[code]:bounds[code + 1]]    # this class's events, by start
        dur = events["dur"][idx]
        unit, dur_v = ("ns", dur) if dur.max() < 2**31 else ("µs", dur // 1000)
        cd = np.stack([np.clip(dur_v, 0, 2**31 - 1), events["stream"][idx], events["token"][idx],
                       np.clip(events["corr"][idx], -1, 2**31 - 1)], axis=1).astype(np.int32)
        x0, x1 = events["x0"][idx], events["x1"][idx]
        meta_traces[cls] = len(fig.data)
        lod[cls] = dict(
            trace=len(fig.data), x0=x0, x1=x1, y=events["y"][idx].astype(np.float32), cd=cd,
            label=events["label"][idx].astype(np.int32), maxdur=float((x1 - x0).max()), tick=_darker(color),
            detail=("<b>%{text}</b><br>start %{x:,.3f} µs · dur %{customdata[0]:,} " + unit + "<br>" + HOVER[cls]
                    + "<extra>" + name + "</extra>"),
            overview=("<b>" + name + "</b>: %{customdata[0]:,} events (merged at this zoom)<br>row busy "
                      "%{customdata[1]:.0f} % of %{customdata[2]:,.2f} µs<extra></extra>"))
        fig.add_trace(go.Scattergl(
            x=[], y=[], mode="lines", name=name, legendgroup=cls, line=dict(color=color, width=BAR_PX),
            # end ticks (detail views): back-to-back calls stay apart, sub-pixel events stay visible
            marker=dict(symbol="line-ns-open", size=BAR_PX, color=lod[cls]["tick"],
                        line=dict(width=1, color=lod[cls]["tick"])),
            hovertemplate=lod[cls]["detail"], connectgaps=False, meta=dict(cls=cls, dur_unit=unit)))

    if token_bars:
        tb = pd.concat(token_bars, ignore_index=True)
        for parity in (0, 1):
            sel = tb[tb["token"] % 2 == parity]
            if sel.empty:
                continue
            x, y = _segments(sel["x0"].to_numpy(), sel["x1"].to_numpy(), sel["y"].to_numpy())
            cd = np.stack([sel["time_ns"].to_numpy() / 1e3, sel["token"].to_numpy()], axis=1)
            fig.add_trace(go.Scattergl(
                x=x, y=y, mode="lines", name="Token", legendgroup="token", showlegend=parity == 0,
                line=dict(color=TOKEN_COLORS[parity], width=BAR_PX), customdata=_triple(cd),
                hovertemplate="<b>%{text}</b><br>token %{customdata[1]}: %{customdata[0]:,.1f} µs<extra></extra>",
                meta=dict(cls="token")))
            fig.data[-1].text = np.repeat(sel["hover"].to_numpy(dtype=object), 3)
        if len(tb) <= MAX_TOKEN_LABELS:   # annotations: drawn above the WebGL bars, move with zoom
            for r in tb.itertuples():
                fig.add_annotation(x=(r.x0 + r.x1) / 2, y=r.y, xref="x", yref="y", text=r.text, showarrow=False,
                                   font=dict(size=10, color="#20242a"))
    if token_bars and len(boundaries) <= MAX_TOKEN_LABELS:   # more: the alternating Tokens row marks them
        bx = np.array([b[0] for b in boundaries])
        y0 = np.array([b[1] - 0.5 for b in boundaries])
        y1 = np.array([b[2] + 0.5 for b in boundaries])
        xs = np.empty(3 * len(bx))
        xs[0::3], xs[1::3], xs[2::3] = bx, bx, np.nan
        ys = np.empty(3 * len(bx))
        ys[0::3], ys[1::3], ys[2::3] = y0, y1, np.nan
        fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name="token boundary", hoverinfo="skip",
                                   line=dict(color="#7a828c", width=1, dash="dash"), showlegend=False,
                                   meta=dict(cls="token-boundary")))

    highlight = len(fig.data)
    fig.add_trace(go.Scattergl(x=[], y=[], mode="lines", name="linked", hoverinfo="skip", showlegend=False,
                               line=dict(color=HIGHLIGHT_COLOR, width=BAR_PX), meta=dict(cls="highlight")))
    fig.add_trace(go.Scattergl(x=[], y=[], mode="lines", name="launch flow", hoverinfo="skip", showlegend=False,
                               line=dict(color=HIGHLIGHT_COLOR, width=1.5), meta=dict(cls="flow")))
    _style(fig, rows, title)
    lo = min([float(events["x0"].min())] if parts else [0.0])
    hi = max([float(events["x1"].max())] if parts else [1.0])
    if token_bars:
        lo, hi = min(lo, float(tb["x0"].min())), max(hi, float(tb["x1"].max()))
    pad = 0.01 * (hi - lo) or 1.0
    full = [lo - pad, hi + pad]
    fig.layout.meta = dict(workbench=dict(
        customdata=list(CUSTOMDATA), traces=meta_traces, highlight=[highlight, highlight + 1],
        rows=[r["label"] for r in rows], row_height=ROW_PX, bar_px=BAR_PX,
        lod=dict(budget=DETAIL_BUDGET, ticks=TICK_BUDGET, bins=OVERVIEW_BINS, full=full, labels=labels,
                 classes=lod)))
    # an explicit range: double-click returns here (autorange would fit whatever the window drew)
    fig.update_xaxes(range=full)
    show_window(fig, *full)
    return fig


def _style(fig: go.Figure, rows: list[dict], title: str | None) -> None:
    n = max(len(rows), 1)
    shapes, annotations = [], []
    for y, r in enumerate(rows):
        fill = "#dfe3e8" if r.get("run") else "#eef0f3" if r["header"] else ("#ffffff" if y % 2 else "#f8f9fb")
        shapes.append(dict(type="rect", xref="paper", yref="y", x0=0, x1=1, y0=y - 0.5, y1=y + 0.5,
                           fillcolor=fill, line=dict(width=0), layer="below"))
        label = r["label"]
        if not label:
            continue
        text = (label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…")
        if r["header"]:
            text = "<b>▾ " + text + "</b>"
        annotations.append(dict(xref="paper", yref="y", x=0, y=y, xanchor="left", showarrow=False,
                                xshift=-(MARGIN_L - 8) + 14 * r["level"], text=text,
                                font=dict(size=11, color="#1f2328" if r["header"] else "#3b4148")))
    fig.update_layout(
        title=dict(text=title, x=0.01, font=dict(size=14)) if title else None,
        height=max(260, n * ROW_PX + 110), margin=dict(l=MARGIN_L, r=20, t=70 if title else 50, b=40),
        plot_bgcolor="white", paper_bgcolor="white", hovermode="closest", dragmode="zoom",
        shapes=shapes, annotations=list(fig.layout.annotations) + annotations,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, font=dict(size=11), itemclick="toggle"),
        hoverlabel=dict(bgcolor="white", font=dict(size=11, family="monospace")),
        xaxis=dict(title=dict(text="time (µs)", font=dict(size=11)), showgrid=True, gridcolor="#e6e8eb",
                   zeroline=False, ticks="outside", tickformat=",.0f", showspikes=True, spikemode="across",
                   spikethickness=1, spikecolor="#9aa0a6", spikedash="solid"),
        yaxis=dict(range=[n - 0.5, -0.5], fixedrange=True, showticklabels=False, showgrid=False, zeroline=False),
    )


def timeline(trace: Trace, *, title: str | None = None, tokens: bool = True) -> go.Figure:
    """Nsight Systems-like figure of one trace."""
    return build_figure([Panel(trace)], title=title, tokens=tokens)


# ----------------------------------------------------------------------------- level of detail

def _visible(c: dict, lo: float, hi: float) -> np.ndarray:
    """Indices of a class's events overlapping [lo, hi] (events are sorted by start)."""
    a = int(np.searchsorted(c["x0"], lo - c["maxdur"], side="left"))
    b = int(np.searchsorted(c["x0"], hi, side="right"))
    idx = np.arange(a, b)
    return idx[c["x1"][idx] >= lo]


def _coverage(p0: np.ndarray, p1: np.ndarray, bins: int) -> np.ndarray:
    """Busy length of every bin [k, k+1) under intervals [p0, p1) given in bin units:
    F(k) = sum_p0<k (k - p0) - sum_p1<k (k - p1), coverage = diff(F)."""
    k = np.arange(bins + 1, dtype=np.float64)

    def g(p: np.ndarray) -> np.ndarray:
        ps = np.sort(p)
        c = np.searchsorted(ps, k, side="left")
        return k * c - np.concatenate([[0.0], np.cumsum(ps)])[c]

    return np.diff(g(p0) - g(p1))


def raster_rows(sel: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], lo: float, hi: float,
                bins: int) -> dict[str, tuple[np.ndarray, ...]]:
    """Level of detail of a wide window, as Nsight draws a zoomed-out row: each row is cut into
    ``bins`` bins, a bin takes the class whose events keep it busiest, and consecutive bins of
    one class become one bar. Per class: (start, end, y, customdata = events started in the bar,
    busy % of the bar, bar length, -1). ``LOD_JS`` does the same in the browser."""
    w = (hi - lo) / bins
    names = list(sel)
    ys = np.unique(np.concatenate([v[2] for v in sel.values()])) if sel else np.zeros(0)
    cov = np.zeros((len(ys), len(names), bins))
    cnt = np.zeros((len(ys), len(names), bins))
    for ci, cls in enumerate(names):
        x0, x1, y = sel[cls]
        if len(x0) == 0:
            continue
        p0 = np.clip((x0 - lo) / w, 0, bins)
        p1 = np.clip(np.maximum((x1 - lo) / w, p0 + 0.01), 0, bins)   # instants still mark their bin
        r = np.searchsorted(ys, y)
        o = np.argsort(r, kind="stable")
        cuts = np.flatnonzero(np.diff(r[o])) + 1
        for grp in np.split(o, cuts):
            cov[r[grp[0]], ci] = _coverage(p0[grp], p1[grp], bins)
            np.add.at(cnt[r[grp[0]], ci], np.minimum(p0[grp].astype(np.int64), bins - 1), 1)
    total = cov.sum(axis=1)                          # rows x bins
    dom = np.where(total > 0, cov.argmax(axis=1), -1)
    # runs of one dominant class along each row (a row boundary always cuts)
    flat = np.concatenate([dom, np.full((len(ys), 1), -1)], axis=1).ravel()
    edge = np.flatnonzero(np.diff(np.concatenate([[-2], flat])) != 0)
    starts, cls_of = edge, flat[edge]
    ends = np.append(edge[1:], len(flat))
    keep = cls_of >= 0
    starts, ends, cls_of = starts[keep], ends[keep], cls_of[keep]
    row, k0 = np.divmod(starts, bins + 1)
    k1 = ends - row * (bins + 1)
    out = {}
    csum_busy = np.concatenate([np.zeros((len(ys), 1)), np.cumsum(total, axis=1)], axis=1)
    for ci, cls in enumerate(names):
        m = cls_of == ci
        r, a, b = row[m], k0[m], k1[m]
        csum_n = np.concatenate([np.zeros((len(ys), 1)), np.cumsum(cnt[:, ci], axis=1)], axis=1)
        n = csum_n[r, b] - csum_n[r, a]
        busy = 100.0 * (csum_busy[r, b] - csum_busy[r, a]) / np.maximum(b - a, 1)
        span = (b - a) * w
        cd = np.stack([n, np.clip(busy, 0, 100), span, np.full(len(r), -1.0)], axis=1).astype(np.float32)
        out[cls] = (lo + a * w, lo + b * w, ys[r].astype(np.float32), cd)
    return out


def show_window(fig: go.Figure, lo: float, hi: float) -> str:
    """Refill the event traces for the time window [lo, hi] (us): every event when at most
    DETAIL_BUDGET are visible (with end ticks under TICK_BUDGET), else each row merged.
    Returns ``detail`` or ``merged``."""
    lod = fig.layout.meta["workbench"]["lod"]
    classes = lod["classes"]
    sel = {cls: _visible(c, lo, hi) for cls, c in classes.items()}
    total = sum(len(i) for i in sel.values())
    detail, ticks = total <= lod["budget"], total <= lod["ticks"]
    labels = np.asarray(lod["labels"], dtype=object)
    min_len = 0.5 * (hi - lo) / lod["bins"]   # half a pixel: dense rows keep their gaps visible
    if not detail:
        runs = raster_rows({cls: (c["x0"][sel[cls]], c["x1"][sel[cls]], c["y"][sel[cls]])
                            for cls, c in classes.items()}, lo, hi, lod["bins"])
    with fig.batch_update() if _is_widget(fig) else _nullcontext():
        for cls, c in classes.items():
            idx = sel[cls]
            tr = fig.data[c["trace"]]
            if detail:   # at least about half a pixel long: a lone short kernel stays visible
                x, y = _segments(c["x0"][idx], np.maximum(c["x1"][idx], c["x0"][idx] + min_len), c["y"][idx])
                text = np.repeat(labels[c["label"][idx]], 3) if len(labels) else np.zeros(0, dtype=object)
                text[2::3] = ""
                tr.update(x=x, y=y, customdata=_triple(c["cd"][idx]), text=text,
                          mode="lines+markers" if ticks else "lines", hovertemplate=c["detail"])
            else:
                s, e, yy, cd = runs[cls]
                x, y = _segments(s, e, yy)
                tr.update(x=x, y=y, customdata=_triple(cd), text=None, mode="lines", hovertemplate=c["overview"])
    return "detail" if detail else "merged"


# ----------------------------------------------------------------------------- correlation

HOST_CLASSES = ("api", "graph", "sync")


def linked_segments(fig: go.Figure, corr_id: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """Bars of every event with correlation id ``corr_id`` and flow lines from its API call(s)
    to the device work: (bar x, bar y, flow x, flow y), gap-separated like the event traces."""
    host: list[tuple[float, float]] = []
    work: list[tuple[float, float]] = []
    bx: list[float] = []
    by: list[float] = []
    for cls, c in fig.layout.meta["workbench"]["lod"]["classes"].items():
        for k in np.flatnonzero(c["cd"][:, 3] == corr_id):
            x0, x1, yy = float(c["x0"][k]), float(c["x1"][k]), float(c["y"][k])
            bx += [x0, x1, np.nan]
            by += [yy, yy, np.nan]
            (host if cls in HOST_CLASSES else work).append((x0, yy))
    fx: list[float] = []
    fy: list[float] = []
    for hx, hy in host:
        for wx, wy in work:
            fx += [hx, wx, np.nan]
            fy += [hy, wy, np.nan]
    return bx, by, fx, fy


def highlight(fig: go.Figure, corr_id: int) -> None:
    """Fill the highlight traces with the events of ``corr_id`` (clear them with -1)."""
    hl, flow = fig.layout.meta["workbench"]["highlight"]
    bx, by, fx, fy = linked_segments(fig, corr_id) if corr_id >= 0 else ([], [], [], [])
    with fig.batch_update() if _is_widget(fig) else _nullcontext():
        fig.data[hl].x, fig.data[hl].y = bx, by
        fig.data[flow].x, fig.data[flow].y = fx, fy


def _is_widget(fig: go.Figure) -> bool:
    """Whether ``fig`` is a FigureWidget, without touching ``go.FigureWidget``: that import pulls
    in ipywidgets, nbformat and jsonschema, seconds a script drawing to HTML should not pay."""
    mod = sys.modules.get("plotly.graph_objs._figurewidget")
    return mod is not None and isinstance(fig, mod.FigureWidget)


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def timeline_widget(trace_or_fig: Trace | go.Figure, **kw) -> go.FigureWidget:
    """A FigureWidget whose hover / click on any event highlights the events sharing its
    correlation id (API call <-> the kernels or copies it launched), and whose zoom refills the
    traces for the new window (single events once few enough are visible)."""
    fig = trace_or_fig if isinstance(trace_or_fig, go.Figure) else timeline(trace_or_fig, **kw)
    w = go.FigureWidget(fig)
    traces = w.layout.meta["workbench"]["traces"]

    def on_point(tr, points, _state) -> None:
        if points.point_inds:
            highlight(w, int(np.asarray(tr.customdata)[points.point_inds[0]][3]))

    def on_range(_layout, xrange) -> None:
        if xrange is not None and len(xrange) == 2:
            show_window(w, float(xrange[0]), float(xrange[1]))

    for i in traces.values():
        w.data[i].on_hover(on_point)
        w.data[i].on_click(on_point)
    w.layout.on_change(on_range, "xaxis.range")
    return w
