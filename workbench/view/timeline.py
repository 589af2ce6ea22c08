"""Nsight Systems-like timeline of a Trace (plotly, WebGL).

Rows follow ``workbench.trace.layout`` (Process -> Thread -> NVTX / CUDA API; CUDA HW (GPU) ->
Stream N, split into lanes where events overlap, e.g. PDL kernels), colours follow the kind of
work (kernels, H2D / D2H / D2D copies, memsets, syncs, graph launches, other API calls, NVTX),
a ``Tokens`` row and dashed lines mark token boundaries.

Scale: every colour class is ONE ``Scattergl`` trace whose bars are line segments
(start, end, gap) drawn by WebGL, not one shape per event; a million events build in about a
second (``benchmarks/timeline_scale.py``). Hover data rides in ``customdata`` columns
``CUSTOMDATA`` (duration, stream, token, correlation id) and ``text`` (name and node).

Correlation: hovering or clicking an event fills the two highlight traces (the linked events
and flow lines from the API call to the work it launched). In a notebook ``timeline_widget``
wires this with FigureWidget callbacks; ``workbench.view.export`` writes HTML with a small
script doing the same in the browser (``LINK_JS``).
"""

from __future__ import annotations

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
    "graph": ("Graph launch", "#e3b505"),
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


def _darker(color: str, f: float = 0.7) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"#{int(r * f):02x}{int(g * f):02x}{int(b * f):02x}"


def color_class(events: pd.DataFrame) -> np.ndarray:
    """Colour class (a key of CLASSES) of every event."""
    kind = events["kind"].to_numpy(dtype=object)
    out = np.full(len(events), "api", dtype=object)
    out[kind == "kernel"] = "kernel"
    out[kind == "memset"] = "memset"
    out[kind == "sync"] = "sync"
    out[kind == "marker"] = "marker"
    copy = events["copy_kind"].to_numpy(dtype=object)
    memcpy = kind == "memcpy"
    out[memcpy] = "d2d"
    out[memcpy & (copy == "H2D")] = "h2d"
    out[memcpy & (copy == "D2H")] = "d2h"
    api = kind == "api"
    if api.any():
        names, codes = np.unique(events["name"].to_numpy(dtype=object)[api].astype(str), return_inverse=True)
        graph = np.array(["GraphLaunch" in n for n in names], dtype=bool)[codes]
        idx = np.flatnonzero(api)
        out[idx[graph]] = "graph"
    return out


@dataclass
class Panel:
    """One run drawn in a figure: its trace, an optional run header and its time origin
    (events are drawn at ``(t - origin_ns) / 1000`` microseconds)."""

    trace: Trace
    label: str | None = None
    origin_ns: int | None = None
    token_labels: dict[int, str] | None = None   # text on each token's bar (default ``t<token>``)


def _labels(events: pd.DataFrame) -> np.ndarray:
    """Hover text per event: name, and the graph node when there is one."""
    name_codes, names = pd.factorize(events["name"], sort=False)
    node_codes, nodes = pd.factorize(events["node"], sort=False)
    key = name_codes.astype(np.int64) * max(len(nodes), 1) + node_codes
    key_id, uniq = pd.factorize(key, sort=False)
    n_nodes = max(len(nodes), 1)
    texts = []
    for k in uniq:
        name, node = str(names[k // n_nodes]), str(nodes[k % n_nodes])
        texts.append(f"{name}<br>node {node}" if node and node != name else name)
    return np.array(texts, dtype=object)[key_id]


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
    "graph": "token %{customdata[2]} · corr %{customdata[3]}",
    "api": "token %{customdata[2]} · corr %{customdata[3]}",
    "marker": "token %{customdata[2]}",
}


def build_figure(panels: list[Panel], *, title: str | None = None, tokens: bool = True) -> go.Figure:
    """The figure of one or more runs stacked on one time axis (``timeline`` and ``compare``)."""
    rows: list[dict] = []            # every drawn row, top to bottom (y = index)
    parts: list[pd.DataFrame] = []   # per panel: events with x0, x1, y, cls, label
    token_bars: list[pd.DataFrame] = []
    boundaries: list[tuple[float, int, int]] = []   # (x, first row, last row)
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
                                           text=[names.get(int(t), f"t{t}") for t in spans["token"]]))
        lay: Layout = layout(panel.trace)
        base = len(rows)
        for t in lay.tracks.itertuples():
            rows.append(dict(label=t.label, level=t.level + indent, header=bool(t.header), run=False))
        if len(ev):
            start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
            parts.append(pd.DataFrame({
                "x0": (start - origin) / 1e3, "x1": (end - origin) / 1e3, "y": base + lay.track,
                "cls": color_class(ev), "dur": end - start, "stream": ev["stream"].to_numpy(),
                "token": ev["token"].to_numpy(), "corr": ev["corr_id"].to_numpy(), "text": _labels(ev)}))
        if len(spans):
            for s in spans["start_ns"].to_numpy():
                boundaries.append(((s - origin) / 1e3, top, len(rows) - 1))

    fig = go.Figure()
    meta_traces: dict[str, int] = {}
    events = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["cls"])
    for cls, (name, color) in CLASSES.items():
        sel = events[events["cls"] == cls]
        if sel.empty:
            continue
        x, y = _segments(sel["x0"].to_numpy(), sel["x1"].to_numpy(), sel["y"].to_numpy())
        dur = sel["dur"].to_numpy()
        unit, dur_v = ("ns", dur) if dur.max() < 2**31 else ("µs", dur // 1000)
        cd = np.stack([np.clip(dur_v, 0, 2**31 - 1), sel["stream"].to_numpy(), sel["token"].to_numpy(),
                       np.clip(sel["corr"].to_numpy(), -1, 2**31 - 1)], axis=1).astype(np.int32)
        text = np.repeat(sel["text"].to_numpy(dtype=object), 3)
        text[2::3] = ""
        meta_traces[cls] = len(fig.data)
        fig.add_trace(go.Scattergl(
            x=x, y=y, mode="lines+markers", name=name, legendgroup=cls, line=dict(color=color, width=BAR_PX),
            # a tick at both ends of every bar: back-to-back calls stay apart, sub-pixel events visible
            marker=dict(symbol="line-ns-open", size=BAR_PX, color=_darker(color), line=dict(width=1,
                        color=_darker(color))),
            hovertemplate=("<b>%{text}</b><br>start %{x:,.3f} µs · dur %{customdata[0]:,} " + unit + "<br>"
                           + HOVER[cls] + "<extra>" + name + "</extra>"),
            customdata=None, connectgaps=False, meta=dict(cls=cls, dur_unit=unit)))
        # set after construction: plotly deep-copies arrays passed to the constructor (slow for text)
        fig.data[-1].customdata = _triple(cd)
        fig.data[-1].text = text

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
                hovertemplate="<b>token %{customdata[1]}</b><br>%{customdata[0]:,.1f} µs per token<extra></extra>",
                meta=dict(cls="token")))
        if len(tb) <= MAX_TOKEN_LABELS:   # annotations: drawn above the WebGL bars, move with zoom
            for r in tb.itertuples():
                fig.add_annotation(x=(r.x0 + r.x1) / 2, y=r.y, xref="x", yref="y", text=r.text, showarrow=False,
                                   font=dict(size=10, color="#20242a"))
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
    fig.layout.meta = dict(workbench=dict(
        customdata=list(CUSTOMDATA), traces=meta_traces, highlight=[highlight, highlight + 1],
        rows=[r["label"] for r in rows], row_height=ROW_PX, bar_px=BAR_PX))
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


# ----------------------------------------------------------------------------- correlation

def linked_segments(fig: go.Figure, corr_id: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """Bars of every event with correlation id ``corr_id`` and flow lines from its API call(s)
    to the device work: (bar x, bar y, flow x, flow y), gap-separated like the event traces."""
    traces = fig.layout.meta["workbench"]["traces"]
    host: list[tuple[float, float]] = []
    work: list[tuple[float, float]] = []
    bx: list[float] = []
    by: list[float] = []
    for cls, i in traces.items():
        tr = fig.data[i]
        cd = np.asarray(tr.customdata)
        hit = np.flatnonzero(cd[0::3, 3] == corr_id)
        x = np.asarray(tr.x)
        y = np.asarray(tr.y)
        for k in hit:
            x0, x1, yy = float(x[3 * k]), float(x[3 * k + 1]), float(y[3 * k])
            bx += [x0, x1, np.nan]
            by += [yy, yy, np.nan]
            (host if cls in ("api", "graph", "sync") else work).append((x0, yy))
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
    with fig.batch_update() if isinstance(fig, go.FigureWidget) else _nullcontext():
        fig.data[hl].x, fig.data[hl].y = bx, by
        fig.data[flow].x, fig.data[flow].y = fx, fy


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def timeline_widget(trace_or_fig: Trace | go.Figure, **kw) -> go.FigureWidget:
    """A FigureWidget whose hover / click on any event highlights the events sharing its
    correlation id (API call <-> the kernels or copies it launched)."""
    fig = trace_or_fig if isinstance(trace_or_fig, go.Figure) else timeline(trace_or_fig, **kw)
    w = go.FigureWidget(fig)
    traces = w.layout.meta["workbench"]["traces"]

    def on_point(tr, points, _state) -> None:
        if points.point_inds:
            corr = int(np.asarray(tr.customdata)[points.point_inds[0]][3])
            highlight(w, corr)

    for i in traces.values():
        w.data[i].on_hover(on_point)
        w.data[i].on_click(on_point)
    return w
