"""Two or more runs stacked on one time axis, aligned at a chosen token, with the per-token
time of each run and its difference to the baseline (the first run unless named) on the token
bars (label: time and %; hover: also the difference in us), and each run's steady-state time
per token (``workbench.trace.stats``: the first token is warm-up) in the title, as one reads two
Nsight Systems reports side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import plotly.graph_objects as go

from ..trace.analysis import token_spans
from ..trace.stats import us_per_token
from ..trace.table import Trace
from .timeline import Panel, build_figure


def _named(traces: Mapping[str, Trace] | Sequence[Trace]) -> dict[str, Trace]:
    if isinstance(traces, Mapping):
        runs = dict(traces)
    else:
        runs = {str(t.meta.get("label") or t.meta.get("strategy") or f"run {i}"): t for i, t in enumerate(traces)}
    if len(runs) < 2:
        raise ValueError(f"a comparison needs two or more runs, got {len(runs)}")
    return runs


def token_times(traces: Mapping[str, Trace] | Sequence[Trace], baseline: str | None = None) -> pd.DataFrame:
    """Per run and token: the token's time in us and its difference to the baseline run's same
    token (``diff_us``, ``diff_pct``; NaN where the baseline lacks that token)."""
    runs = _named(traces)
    baseline = baseline if baseline is not None else next(iter(runs))
    if baseline not in runs:
        raise ValueError(f"baseline {baseline!r} is not one of the runs {list(runs)}")
    rows = []
    for name, tr in runs.items():
        spans = token_spans(tr)
        rows.append(pd.DataFrame({"run": name, "token": spans["token"].astype(int),
                                  "time_us": spans["time_ns"] / 1e3}))
    out = pd.concat(rows, ignore_index=True)
    base = out[out["run"] == baseline].set_index("token")["time_us"]
    ref = out["token"].map(base)
    out["diff_us"] = out["time_us"] - ref
    out["diff_pct"] = 100.0 * out["diff_us"] / ref
    return out


def compare(traces: Mapping[str, Trace] | Sequence[Trace], align_token: int = 0, *, baseline: str | None = None,
            title: str | None = None) -> go.Figure:
    """Runs stacked top to bottom, each shifted so that ``align_token`` starts at t = 0."""
    runs = _named(traces)
    times = token_times(runs, baseline)
    baseline = baseline if baseline is not None else next(iter(runs))
    panels = []
    means = {}
    for name, tr in runs.items():
        spans = token_spans(tr)
        hit = spans[spans["token"] == align_token]
        if hit.empty:
            have = spans["token"].astype(int).tolist()
            raise ValueError(f"run {name!r} has no token {align_token} to align at; its tokens are "
                             f"{have[:20]}{' ...' if len(have) > 20 else ''}")
        t = times[times["run"] == name].set_index("token")
        labels, hover = {}, {}
        for tok, r in t.iterrows():
            labels[int(tok)] = hover[int(tok)] = f"t{tok} · {r['time_us']:,.1f} µs"
            if name != baseline and pd.notna(r["diff_us"]):
                labels[int(tok)] += f" ({r['diff_pct']:+.1f} %)"
                hover[int(tok)] += f" ({r['diff_us']:+,.1f} µs, {r['diff_pct']:+.1f} % vs {baseline})"
        means[name] = us_per_token(tr)
        panels.append(Panel(tr, label=name, origin_ns=int(hit["start_ns"].iloc[0]), token_labels=labels,
                            token_hover=hover))
    b = means[baseline]
    summary = " · ".join(f"{n}: {m:,.1f} µs/token" + ("" if n == baseline else f" ({100 * (m - b) / b:+.1f} %)")
                         for n, m in means.items())
    head = f"{title} — " if title else ""
    fig = build_figure(panels, title=f"{head}aligned at token {align_token} · steady state (first token left out): "
                                     f"{summary}")
    fig.layout.meta["workbench"]["token_times"] = times.round(3).to_dict("records")
    return fig
