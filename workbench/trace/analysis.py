"""Trace analyses in the style of Holistic Trace Analysis and Nsight Systems' expert rules.

Each analysis is a function ``Trace -> DataFrame``; ``idle_figure`` and ``speedup_figure`` draw
the two that read best as pictures. Speedup tables follow llama.cpp's
``scripts/compare-llama-bench.py``: one row per model and test (``tg128``: 128 generated
tokens), t/s of the baseline and the candidate, and their ratio.

Vocabulary: *device work* is every event on a ``Stream N`` row (kernels, copies, memsets);
*host calls* are the api/sync events of the ``CUDA API`` rows; events are linked by ``corr_id``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..graph.ops import OPS
from .layout import is_device_row
from .stats import device_gaps, merged_intervals, us_per_token
from .table import Trace, rebased

# --------------------------------------------------------------------------- helpers


def token_spans(trace: Trace) -> pd.DataFrame:
    """One row per token: first start and last end of its events and the token's time, the
    distance to the next token's start (what tokens/s sees); the last token's time is its span."""
    ev = trace.events
    ev = ev[ev["token"] >= 0]
    if ev.empty:
        return pd.DataFrame(columns=["token", "start_ns", "end_ns", "time_ns"])
    origin = int(ev["start_ns"].min())
    ev = rebased(ev, origin)  # the shift below makes floats: exact only for small stamps
    g = ev.groupby("token")
    out = pd.DataFrame({"start_ns": g["start_ns"].min(), "end_ns": g["end_ns"].max()}).reset_index()
    out = out.sort_values("start_ns", kind="stable").reset_index(drop=True)
    nxt = out["start_ns"].shift(-1)
    out["time_ns"] = (nxt - out["start_ns"]).fillna(out["end_ns"] - out["start_ns"]).astype(np.int64)
    return out.assign(start_ns=out["start_ns"] + origin, end_ns=out["end_ns"] + origin)


def _split(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(device work, host calls) of a trace."""
    ev = trace.events
    device = is_device_row(ev["row"])
    work = ev[device & ev["kind"].isin(["kernel", "memcpy", "memset"]).to_numpy()]
    host = ev[~device & ev["kind"].isin(["api", "sync"]).to_numpy()]
    return work, host


def _first_call(host: pd.DataFrame) -> pd.DataFrame:
    """The host call of each correlation id (the earliest, when a trace repeats one)."""
    h = host[host["corr_id"] >= 0].sort_values("start_ns", kind="stable")
    return h.drop_duplicates("corr_id").set_index("corr_id")


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint busy intervals covering the given ones, as (starts, ends)."""
    m = merged_intervals(start, end)
    return m[:, 0], m[:, 1]


def _covered_both(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of time covered by both interval unions ``a`` and ``b``."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0
    t = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.zeros(len(b[0]) + len(b[1]))])
    db = np.concatenate([np.zeros(len(a[0]) + len(a[1])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    o = np.argsort(t, kind="stable")
    t, ca, cb = t[o], np.cumsum(da[o]), np.cumsum(db[o])
    both = (ca[:-1] > 0) & (cb[:-1] > 0)
    return int(np.sum(np.diff(t)[both]))


# --------------------------------------------------------------------------- GPU idle gaps

IDLE_CAUSES = ("host sync", "token boundary", "launch overhead", "queued work", "unlinked")


def gpu_idle_gaps(trace: Trace, min_gap_ns: int = 0) -> pd.DataFrame:
    """Every interval in which the GPU runs nothing, with what it waited for.

    ``workbench.trace.stats.device_gaps`` finds the gaps and whether the host call that issued
    the work ending a gap returned only after the GPU went idle (the GPU waited for the host).
    Here that host cause is split: ``token boundary`` -- the work after the gap is its token's
    first (host work between tokens: sampling, input preparation); ``host sync`` -- the host
    spent the gap in a synchronizing call; ``launch overhead`` -- inside a token, the host issues
    work more slowly than the GPU runs it. ``queued work``: the work was already issued (an
    event wait, a dependency, launch latency); ``unlinked``: no host call has its correlation id.
    """
    gaps = device_gaps(trace, min_gap_ns, describe=True)
    if gaps.empty:
        return gaps.assign(cause=pd.Series(dtype=object))
    work, _ = _split(trace)
    first = work[work["token"] >= 0].groupby("token")["start_ns"].min()
    # int64 throughout: a token missing from ``first`` (NaN) would make the stamps float64, which
    # at CUPTI's ~1.8e18 ns cannot tell stamps 256 ns apart
    opens_token = gaps["end_ns"].to_numpy() == gaps["token"].map(first).fillna(-1).astype("int64").to_numpy()
    synced = gaps["host_calls"].str.contains("Synchronize|cudaMemcpy(?!Async)|cudaMemset(?!Async)", regex=True)
    host = gaps["cause"] == "host"
    cause = np.select([host & opens_token, host & synced, host, gaps["cause"] == "device"],
                      ["token boundary", "host sync", "launch overhead", "queued work"], "unlinked")
    return gaps.assign(cause=cause)


def idle_summary(gaps: pd.DataFrame) -> pd.DataFrame:
    """GPU idle time per cause: gaps, total and mean in us, share of all idle time."""
    if gaps.empty:
        return pd.DataFrame(columns=["cause", "gaps", "idle_us", "mean_us", "share"])
    g = gaps.groupby("cause")["gap_us"]
    out = pd.DataFrame({"gaps": g.size(), "idle_us": g.sum(), "mean_us": g.mean()}).reset_index()
    out["share"] = out["idle_us"] / out["idle_us"].sum()
    return out.sort_values("idle_us", ascending=False).reset_index(drop=True)


def idle_figure(gaps: pd.DataFrame):
    """Stacked bars: GPU idle time per token, by cause."""
    import plotly.graph_objects as go

    fig = go.Figure()
    if not gaps.empty:
        per = gaps.groupby(["token", "cause"])["gap_us"].sum().unstack(fill_value=0)
        for cause in [c for c in IDLE_CAUSES if c in per.columns]:
            fig.add_bar(x=per.index, y=per[cause], name=cause)
    fig.update_layout(barmode="stack", title="GPU idle time per token", xaxis_title="token",
                      yaxis_title="idle (µs)", plot_bgcolor="white")
    return fig


# --------------------------------------------------------------------------- host calls

def sync_calls_per_token(trace: Trace) -> pd.DataFrame:
    """Per token: host API calls, synchronizing calls among them and the time spent in those,
    copies issued and launches (the counts PR #17795 reduces)."""
    _, host = _split(trace)
    host = host[host["token"] >= 0]
    cols = ["token", "api_calls", "sync_calls", "sync_us", "memcpy_calls", "launch_calls"]
    if host.empty:
        return pd.DataFrame(columns=cols)
    name = host["name"].astype(str)
    df = pd.DataFrame({"token": host["token"], "sync": host["kind"] == "sync",
                       "sync_ns": np.where(host["kind"] == "sync", host["end_ns"] - host["start_ns"], 0),
                       "memcpy": name.str.contains("Memcpy", regex=False),
                       "launch": name.str.contains("Launch", regex=False)})
    g = df.groupby("token")
    out = pd.DataFrame({"api_calls": g.size(), "sync_calls": g["sync"].sum(), "sync_us": g["sync_ns"].sum() / 1e3,
                        "memcpy_calls": g["memcpy"].sum(), "launch_calls": g["launch"].sum()}).reset_index()
    return out[cols]


def launch_overhead(trace: Trace, summary: bool = True) -> pd.DataFrame:
    """Launch cost of kernels: the host time of the launching call (``call_us``) and the launch
    delay from the call's start to the kernel's start (``delay_us``). With ``summary`` one row
    per API (count, mean, p50, p95); otherwise one row per launched kernel (the first kernel of
    a graph launch stands for the launch)."""
    work, host = _split(trace)
    kernels = work[(work["kind"] == "kernel") & (work["corr_id"] >= 0)].sort_values("start_ns", kind="stable")
    first = kernels.drop_duplicates("corr_id")
    calls = _first_call(host)
    c = calls[["name", "start_ns", "end_ns"]].add_suffix("_call")
    j = first.merge(c, left_on="corr_id", right_index=True, how="inner")
    per = pd.DataFrame({"corr_id": j["corr_id"], "token": j["token"], "api": j["name_call"], "kernel": j["name"],
                        "call_us": (j["end_ns_call"] - j["start_ns_call"]) / 1e3,
                        "delay_us": (j["start_ns"] - j["start_ns_call"]) / 1e3}).reset_index(drop=True)
    if not summary:
        return per
    cols = ["api", "launches", "call_us_mean", "delay_us_mean", "delay_us_p50", "delay_us_p95"]
    if per.empty:
        return pd.DataFrame(columns=cols)
    g = per.groupby("api")
    return pd.DataFrame({"launches": g.size(), "call_us_mean": g["call_us"].mean(),
                         "delay_us_mean": g["delay_us"].mean(), "delay_us_p50": g["delay_us"].median(),
                         "delay_us_p95": g["delay_us"].quantile(0.95)}).reset_index()[cols]


# --------------------------------------------------------------------------- streams

def kernel_overlap(trace: Trace) -> pd.DataFrame:
    """Per stream: kernels, their summed time, the time the stream is busy, the time its kernels
    overlap each other (``pdl_overlap_us``: PDL lets a kernel start before its predecessor ends)
    and the time it runs concurrently with other streams (``concurrent_us``)."""
    work, _ = _split(trace)
    k = work[work["kind"] == "kernel"]
    cols = ["stream", "kernels", "kernel_us", "busy_us", "pdl_overlap_us", "overlapped_kernels", "concurrent_us"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    unions = {s: _union(g["start_ns"].to_numpy(), g["end_ns"].to_numpy()) for s, g in k.groupby("stream")}
    out = []
    for s, g in k.groupby("stream"):
        g = g.sort_values("start_ns", kind="stable")
        st, en = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        busy = int(np.sum(unions[s][1] - unions[s][0]))
        total = int(np.sum(en - st))
        overlapped = int(np.sum(st[1:] < np.maximum.accumulate(en)[:-1])) if len(st) > 1 else 0
        others = [u for t, u in unions.items() if t != s]
        if others:
            o = _union(np.concatenate([u[0] for u in others]), np.concatenate([u[1] for u in others]))
            conc = _covered_both(unions[s], o)
        else:
            conc = 0
        out.append(dict(stream=int(s), kernels=len(g), kernel_us=total / 1e3, busy_us=busy / 1e3,
                        pdl_overlap_us=(total - busy) / 1e3, overlapped_kernels=overlapped, concurrent_us=conc / 1e3))
    return pd.DataFrame(out, columns=cols)


# --------------------------------------------------------------------------- critical path

#: host calls that return only when their device work is done, besides kind == "sync" events
BLOCKING_CALLS = ("cudaMemcpy", "cudaMemset", "cuMemcpyHtoD", "cuMemcpyDtoH")


def critical_path(trace: Trace, tokens: list[int] | None = None, join_window_ns: int = 2_000) -> pd.DataFrame:
    """Per token, the chain of events that sets the token's time, walked back from its last event.

    The predecessor of device op N is whichever released it last: the previous op on its stream
    (``stream``; under PDL it may still run, then N's share is its tail past it), its launching
    host call (``launch``, when issued after the stream was free) or an op of another stream that
    ended just before N started (``cross-stream``: a join through an event). The predecessor of
    a host call is the device op a synchronizing call waited for (``sync``) or the previous call
    of its thread (``host``). ``share_ns`` is the part of the token's time owed to each step;
    the shares add up to the token's span.
    """
    ev = trace.events
    device = is_device_row(ev["row"])
    ev = ev.assign(_dev=device)
    ev = ev[(ev["kind"] != "marker") & (ev["token"] >= 0)]
    cols = ["token", "step", "row", "kind", "name", "node", "start_ns", "end_ns", "share_ns", "edge"]
    out = []
    for tok, e in ev.groupby("token"):
        if tokens is not None and tok not in tokens:
            continue
        e = e.sort_values(["start_ns", "end_ns"], kind="stable").reset_index(drop=True)
        start, end = e["start_ns"].to_numpy(), e["end_ns"].to_numpy()
        dev = e["_dev"].to_numpy()
        rows = e["row"].to_numpy()
        corr = e["corr_id"].to_numpy()
        waits = np.where((e["kind"] == "sync").to_numpy() | e["name"].isin(BLOCKING_CALLS).to_numpy(),
                         e["stream"].to_numpy(), -2)   # -2: does not wait; -1: waits on any stream
        host_idx = np.flatnonzero(~dev)
        dev_idx = np.flatnonzero(dev)
        dev_by_end = dev_idx[np.argsort(end[dev_idx], kind="stable")]
        call_of = {}
        for i in host_idx:
            if corr[i] >= 0:
                call_of.setdefault(int(corr[i]), int(i))
        row_idx = {r: np.flatnonzero(rows == r) for r in np.unique(rows)}
        t0 = int(start.min())
        cur = int(np.argmax(end))
        path = []
        seen = set()
        while cur is not None and cur not in seen:
            seen.add(cur)
            pred, edge = _predecessor(cur, start, end, dev, rows, corr, waits, row_idx, call_of, dev_by_end,
                                      join_window_ns)
            path.append((cur, edge))
            cur = pred
        floor = t0
        for step, (i, edge) in enumerate(reversed(path)):
            share = max(int(end[i]) - floor, 0)
            floor = max(floor, int(end[i]))
            r = e.iloc[i]
            out.append(dict(token=int(tok), step=step, row=r["row"], kind=r["kind"], name=r["name"], node=r["node"],
                            start_ns=int(r["start_ns"]), end_ns=int(r["end_ns"]), share_ns=share, edge=edge))
    return pd.DataFrame(out, columns=cols)


def _predecessor(i, start, end, dev, rows, corr, waits, row_idx, call_of, dev_by_end, window) -> tuple[int | None, str]:
    same = row_idx[rows[i]]
    k = int(np.searchsorted(same, i)) - 1
    prev = int(same[k]) if k >= 0 else None
    if dev[i]:
        cands: list[tuple[int, int, str]] = []     # (release time, index, edge)
        if prev is not None:
            cands.append((int(min(end[prev], start[i])), prev, "stream"))
        call = call_of.get(int(corr[i])) if corr[i] >= 0 else None
        if call is not None and start[call] <= start[i]:
            cands.append((int(start[call]), call, "launch"))
        k = int(np.searchsorted(end[dev_by_end], start[i], side="right")) - 1
        while k >= 0:
            j = int(dev_by_end[k])
            if rows[j] != rows[i]:
                if start[i] - end[j] <= window:
                    cands.append((int(end[j]), j, "cross-stream"))
                break
            k -= 1
        if not cands:
            return None, "start"
        _, j, edge = max(cands, key=lambda c: (c[0], c[2] == "stream"))
        return j, edge
    # host call: a synchronizing call that returned after device work (of its stream) ended waited for it
    if waits[i] > -2:
        k = int(np.searchsorted(end[dev_by_end], end[i], side="right")) - 1
        while k >= 0:
            j = int(dev_by_end[k])
            if waits[i] < 0 or rows[j] == f"Stream {waits[i]}":
                if end[j] > start[i] and (prev is None or end[j] > end[prev]):
                    return j, "sync"
                break
            k -= 1
    return (prev, "host") if prev is not None else (None, "start")


def critical_path_summary(path: pd.DataFrame) -> pd.DataFrame:
    """Per token: path length and how much of it is host calls, kernels and copies."""
    if path.empty:
        return pd.DataFrame(columns=["token", "steps", "path_us", "host_us", "kernel_us", "copy_us"])
    p = path.assign(host=~path["row"].str.startswith("Stream "))
    g = p.groupby("token")
    return pd.DataFrame({
        "steps": g.size(), "path_us": g["share_ns"].sum() / 1e3,
        "host_us": p[p["host"]].groupby("token")["share_ns"].sum().reindex(g.size().index, fill_value=0) / 1e3,
        "kernel_us": p[p["kind"] == "kernel"].groupby("token")["share_ns"].sum()
        .reindex(g.size().index, fill_value=0) / 1e3,
        "copy_us": p[p["kind"].isin(["memcpy", "memset"])].groupby("token")["share_ns"].sum()
        .reindex(g.size().index, fill_value=0) / 1e3,
    }).reset_index()


# --------------------------------------------------------------------------- kernels

#: kernel-name patterns of ggml-cuda, cuBLAS/CUTLASS and PyTorch kernels -> op family (graph/ops.py)
FAMILY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((f, re.compile(p, re.IGNORECASE)) for f, p in (
    ("gdn", r"gated_delta|delta_net|ssm_conv|\bgdn"),
    ("attn", r"flash_attn|fmha|attention|\battn|sdpa|flash_fwd"),
    ("norm", r"norm"),
    ("rope", r"rope|rotary"),
    ("softmax", r"soft_?max|top_?k|argsort"),
    ("mul_mat", r"mul_mat|mat_?vec|gemv|gemm|matmul|mmvq|\bmmq|cublas|cutlass|xmma|nvjet|sm\d\d_"),
    ("set_rows", r"set_rows|index_put|scatter"),
    ("get_rows", r"get_rows|embedding|index_select|gather"),
    ("copy", r"cpy|copy|transpose|\bcont"),
    ("elementwise", r"add|mul|bin_bcast|elementwise|silu|glu|gelu|scale|sigmoid|softplus|unary|vectorized|fill"),
))


def family_of(name: str) -> str:
    """Op family of a kernel name: a ggml op name itself, else the first matching pattern."""
    info = OPS.get(name.upper())
    if info is not None:
        return info.family
    for family, pat in FAMILY_PATTERNS:
        if pat.search(name):
            return family
    return "other"


def kernel_summary(trace: Trace) -> pd.DataFrame:
    """Kernel time by op family (a ``family`` column of the trace wins over name patterns):
    count, total / mean / min / max in us, share of all kernel time."""
    k = trace.events[trace.events["kind"] == "kernel"]
    cols = ["family", "kernels", "total_us", "mean_us", "min_us", "max_us", "share"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    if "family" in k.columns:
        fam = k["family"].astype(str)
    else:
        names = k["name"].astype(str)
        uniq = {n: family_of(n) for n in names.unique()}
        fam = names.map(uniq)
    d = (k["end_ns"] - k["start_ns"]) / 1e3
    g = d.groupby(fam.to_numpy())
    out = pd.DataFrame({"kernels": g.size(), "total_us": g.sum(), "mean_us": g.mean(), "min_us": g.min(),
                        "max_us": g.max()})
    out["share"] = out["total_us"] / out["total_us"].sum()
    out = out.rename_axis("family").reset_index()
    return out.sort_values("total_us", ascending=False).reset_index(drop=True)[cols]


# --------------------------------------------------------------------------- speedup tables

def tokens_per_second(trace: Trace) -> float:
    """Steady-state generated tokens per second (``workbench.trace.stats``: the first token is
    llama-bench's warm-up and is left out when there are several)."""
    us = us_per_token(trace)
    if not us == us or us <= 0:
        raise ValueError("the trace has no tokens (token >= 0): tokens/s needs per-token events")
    return 1e6 / us


def bench_results(traces: Mapping[str, Trace], model: str, test: str | None = None) -> pd.DataFrame:
    """llama-bench-like results (``model, test, config, t/s``) of traces keyed by config name."""
    rows = []
    for config, tr in traces.items():
        n = len(tr.tokens())
        rows.append({"model": model, "test": test or f"tg{n}", "config": config, "t/s": tokens_per_second(tr)})
    return pd.DataFrame(rows)


def speedup_table(results: pd.DataFrame, baseline: str, candidates: list[str] | None = None) -> pd.DataFrame:
    """compare-llama-bench.py's table: ``Model | Test | t/s <baseline> | t/s <candidate> | Speedup``
    (one t/s and Speedup pair per candidate when there are several). ``results`` has columns
    ``model, test, config, t/s``."""
    missing = {"model", "test", "config", "t/s"} - set(results.columns)
    if missing:
        raise ValueError(f"speedup_table needs columns model, test, config, t/s; missing {sorted(missing)}")
    configs = list(dict.fromkeys(results["config"]))
    if baseline not in configs:
        raise ValueError(f"baseline {baseline!r} is not among the configs {configs}")
    candidates = candidates or [c for c in configs if c != baseline]
    wide = results.pivot_table(index=["model", "test"], columns="config", values="t/s", aggfunc="mean", sort=False)
    out = pd.DataFrame({"Model": wide.index.get_level_values(0), "Test": wide.index.get_level_values(1),
                        f"t/s {baseline}": wide[baseline].to_numpy()})
    for c in candidates:
        suffix = "" if len(candidates) == 1 else f" {c}"
        out[f"t/s {c}"] = wide[c].to_numpy()
        out[f"Speedup{suffix}"] = wide[c].to_numpy() / wide[baseline].to_numpy()
    return out


def to_markdown(table: pd.DataFrame, digits: int = 2) -> str:
    """A pipe table as compare-llama-bench prints it: text left-aligned, numbers right-aligned."""
    num = [pd.api.types.is_numeric_dtype(table[c]) for c in table.columns]
    cells = [[f"{v:.{digits}f}" if n and isinstance(v, float) else str(v) for v, n in zip(row, num)]
             for row in table.itertuples(index=False)]
    heads = [str(c) for c in table.columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]

    def line(vals: list[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, num)) + " |"

    rule = "|" + "|".join((("-" * (w + 1)) + ":") if n else (":" + "-" * (w + 1)) for w, n in zip(widths, num)) + "|"
    return "\n".join([line(heads), rule] + [line(r) for r in cells])


def speedup_figure(table: pd.DataFrame):
    """Bars of t/s per config and test (the speedup table drawn)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    label = table["Model"].astype(str) + " " + table["Test"].astype(str)
    for c in [c for c in table.columns if c.startswith("t/s ")]:
        fig.add_bar(x=label, y=table[c], name=c[4:], text=[f"{v:.1f}" for v in table[c]], textposition="outside")
    fig.update_layout(barmode="group", yaxis_title="tokens / s", plot_bgcolor="white", title="decode throughput")
    return fig


# --------------------------------------------------------------------------- summary

def trace_summary(trace: Trace) -> dict:
    """Counts a user checks first after loading a trace (``workbench view --summary``)."""
    ev = trace.events
    work, host = _split(trace)
    calls = set(host.loc[host["corr_id"] >= 0, "corr_id"].tolist())
    linked = work["corr_id"].isin(calls) & (work["corr_id"] >= 0)
    kinds = ev["kind"].value_counts()
    return {
        "source": str(trace.meta.get("source", "")),
        "events": int(len(ev)),
        "kernels": int(kinds.get("kernel", 0)),
        "api_calls": int(len(host)),
        "syncs": int(kinds.get("sync", 0)),
        "memcpys": int(kinds.get("memcpy", 0)),
        "memsets": int(kinds.get("memset", 0)),
        "markers": int(kinds.get("marker", 0)),
        "streams": int(work["stream"].nunique()),
        "linked_pairs": int(linked.sum()),
        "linked_kernels": int((linked & (work["kind"] == "kernel")).sum()),
        "tokens": len(trace.tokens()),
        "span_us": trace.span_ns / 1e3,
    }
