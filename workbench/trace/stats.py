"""Per-token statistics of a Trace, whatever produced it (simulator, CUPTI, imported files).

Each analysis is a function of the event table. Token-level numbers skip the first token when
there is more than one (llama-bench's warm-up: the first token pays graph capture and cold
starts), so a steady-state comparison between strategies is what ``summarize`` reports.
Internally the columns are read once as numpy arrays: traces of a thousand tokens have half a
million events.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from .table import Trace

#: host API calls that put kernels on the GPU (runtime and driver names, versioned suffixes)
LAUNCH_API = re.compile(r"(?:LaunchKernel|GraphLaunch)")
SYNC_API = re.compile(r"Synchronize")
DEVICE_KINDS = ("kernel", "memcpy", "memset")


class _Cols:
    """The columns the analyses need, as numpy arrays, plus the measured-token mask."""

    def __init__(self, trace: Trace) -> None:
        ev = trace.events
        self.kind = ev["kind"].to_numpy(dtype=object)
        self.name = ev["name"].to_numpy(dtype=object)
        self.node = ev["node"].to_numpy(dtype=object)
        self.start = ev["start_ns"].to_numpy()
        self.end = ev["end_ns"].to_numpy()
        self.token = ev["token"].to_numpy()
        self.corr = ev["corr_id"].to_numpy()
        toks = np.unique(self.token[self.token >= 0])
        self.tokens = [int(t) for t in toks]
        self.measured = self.tokens[1:] if len(self.tokens) > 1 else self.tokens
        if self.measured:
            self.in_window = self.token >= self.measured[0]
        else:
            self.in_window = np.ones(len(self.kind), bool)
        self.n = len(self.measured) if self.measured else (1 if len(self.kind) else 0)
        if self.in_window.any():
            self.t0 = int(self.start[self.in_window].min())
            self.t1 = int(self.end[self.in_window].max())
        else:
            self.t0 = self.t1 = 0

    def is_kind(self, *kinds: str) -> np.ndarray:
        m = self.kind == kinds[0]
        for k in kinds[1:]:
            m |= self.kind == k
        return m

    def launch_calls(self) -> np.ndarray:
        """Launch calls (kernel or graph) that put work on the GPU; calls made during stream
        capture launch nothing and are left out when correlation ids say so."""
        api = self.is_kind("api")
        names = np.unique(self.name[api])
        launch_names = [n for n in names if LAUNCH_API.search(str(n))]
        m = api & np.isin(self.name, launch_names)
        kc = self.corr[self.is_kind("kernel")]
        if (kc >= 0).any():
            m &= np.isin(self.corr, np.unique(kc[kc >= 0]))
        return m

    def syncs(self) -> np.ndarray:
        """Host syncs: ``sync`` events where the source records them, else ``*Synchronize`` calls."""
        s = self.is_kind("sync")
        if s.any():
            return s
        api = self.is_kind("api")
        names = [n for n in np.unique(self.name[api]) if SYNC_API.search(str(n))]
        return api & np.isin(self.name, names)


def token_ids(trace: Trace) -> list[int]:
    """Token indices present in the trace (events with ``token >= 0``)."""
    return trace.tokens()


def measured_tokens(trace: Trace) -> list[int]:
    """Tokens the per-token statistics use: all but the first when there are several."""
    toks = token_ids(trace)
    return toks[1:] if len(toks) > 1 else toks


def token_table(trace: Trace) -> pd.DataFrame:
    """One row per token: start/end (first and last event), kernels, launch calls, syncs."""
    c = _Cols(trace)
    has = c.token >= 0
    df = pd.DataFrame({"token": c.token[has], "start_ns": c.start[has], "end_ns": c.end[has],
                       "kernels": c.is_kind("kernel")[has], "launches": c.launch_calls()[has],
                       "syncs": c.syncs()[has]})
    return df.groupby("token").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), kernels=("kernels", "sum"),
                                   launches=("launches", "sum"), syncs=("syncs", "sum")).reset_index()


def us_per_token(trace: Trace) -> float:
    """Mean time per measured token (first event of the window to the end of the last)."""
    c = _Cols(trace)
    return (c.t1 - c.t0) / 1e3 / c.n if c.n else float("nan")


def merged_intervals(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Union of intervals as an ``[k, 2]`` array of disjoint, sorted [start, end)."""
    if len(starts) == 0:
        return np.zeros((0, 2), np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    last = np.append(idx[1:] - 1, len(s) - 1)
    return np.stack([s[idx], run_end[last]], axis=1)


def gpu_busy_fraction(trace: Trace) -> float:
    """Share of the measured window during which at least one kernel runs."""
    return _busy(_Cols(trace))


def _busy(c: _Cols) -> float:
    if c.t1 <= c.t0:
        return float("nan")
    k = c.is_kind("kernel")
    m = merged_intervals(np.clip(c.start[k], c.t0, c.t1), np.clip(c.end[k], c.t0, c.t1))
    return float((m[:, 1] - m[:, 0]).sum() / (c.t1 - c.t0))


def device_gaps(trace: Trace, min_ns: int = 0, describe: bool = False) -> pd.DataFrame:
    """Idle stretches of the GPU (no kernel, copy or memset on any stream) between device work,
    each with the work before and after it and the API call that issued the work ending it.
    ``cause`` is ``host`` when that call returned only after the GPU went idle (the GPU waited
    for the host), ``device`` when the work was already queued (a dependency, an event, a
    launch latency), ``unknown`` without a matching call. ``describe`` adds ``host_calls``:
    what the host thread was doing during the gap."""
    c = _Cols(trace)
    out = _gaps(c, min_ns)
    if describe:
        out["host_calls"] = _host_calls(c, out["start_ns"].to_numpy(), out["end_ns"].to_numpy())
    return out


_GAP_COLS = ["start_ns", "end_ns", "gap_us", "token", "before", "after", "api", "cause"]


def _gaps(c: _Cols, min_ns: int = 0) -> pd.DataFrame:
    dev = np.flatnonzero(c.is_kind(*DEVICE_KINDS))
    if len(dev) < 2:
        return pd.DataFrame(columns=_GAP_COLS)
    dev = dev[np.argsort(c.start[dev], kind="stable")]
    s, e = c.start[dev], c.end[dev]
    m = merged_intervals(s, e)
    g0, g1 = m[:-1, 1], m[1:, 0]
    keep = (g1 - g0) > min_ns
    g0, g1 = g0[keep], g1[keep]
    nxt = dev[np.searchsorted(s, g1, side="left")]
    by_end = np.argsort(e, kind="stable")
    prv = dev[by_end[np.clip(np.searchsorted(e[by_end], g0, side="right") - 1, 0, None)]]
    label = np.where(c.node != "", c.node, c.name)
    # the API call (or sync) with the correlation id of the work that ends each gap
    api = np.flatnonzero(c.is_kind("api", "sync") & (c.corr >= 0))
    api_corr = c.corr[api]
    order = np.argsort(api_corr, kind="stable")
    api, api_corr = api[order], api_corr[order]
    corr = c.corr[nxt]
    pos = np.clip(np.searchsorted(api_corr, corr), 0, max(len(api) - 1, 0))
    found = (len(api) > 0) & (corr >= 0)
    if len(api):
        found &= api_corr[pos] == corr
    call = api[pos] if len(api) else np.zeros(len(nxt), np.int64)
    cause = np.where(~found, "unknown", np.where(c.end[call] > g0, "host", "device")) if len(nxt) else []
    return pd.DataFrame({
        "start_ns": g0, "end_ns": g1, "gap_us": (g1 - g0) / 1e3, "token": c.token[nxt],
        "before": label[prv], "after": label[nxt], "api": np.where(found, c.name[call], ""), "cause": cause,
    }, columns=_GAP_COLS)


def host_calls_during(trace: Trace, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """For each window, the host API calls overlapping it (``a, b x4, c``)."""
    return _host_calls(_Cols(trace), starts, ends)


def _host_calls(c: _Cols, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    api = c.is_kind("api", "sync")
    a_s, a_e, a_n = c.start[api], c.end[api], c.name[api]
    return [_compress(a_n[(a_s < t1) & (a_e > t0)]) for t0, t1 in zip(starts, ends)]


def host_gaps(trace: Trace, top: int = 5) -> pd.DataFrame:
    """The ``top`` largest host-caused GPU idle gaps in the measured tokens."""
    c = _Cols(trace)
    return _host_gaps(c, _gaps(c), top)


def _host_gaps(c: _Cols, gaps: pd.DataFrame, top: int) -> pd.DataFrame:
    if c.measured:
        gaps = gaps[gaps["token"].isin(c.measured)]
    gaps = gaps[gaps["cause"] == "host"]
    gaps = gaps.sort_values("gap_us", ascending=False, kind="stable").head(top).reset_index(drop=True)
    gaps["host_calls"] = _host_calls(c, gaps["start_ns"].to_numpy(), gaps["end_ns"].to_numpy())
    return gaps


def _compress(names: np.ndarray, max_parts: int = 8) -> str:
    """``a, b x4, c`` for a run of API names (consecutive repeats counted); a long mixed run is
    summarized as counts per name in order of first appearance."""
    out: list[str] = []
    prev, n = None, 0
    for x in list(names) + [None]:
        if x == prev:
            n += 1
            continue
        if prev is not None:
            out.append(f"{prev} x{n}" if n > 1 else str(prev))
        prev, n = x, 1
    if len(out) > max_parts:
        out = [f"{k} x{v}" if v > 1 else str(k) for k, v in Counter(names).items()]
    return ", ".join(out)


def summarize(trace: Trace, top_gaps: int = 3) -> dict[str, Any]:
    """The numbers ``workbench run --json`` prints: time and work per measured token."""
    c = _Cols(trace)
    n, w = c.n, c.in_window
    us = (c.t1 - c.t0) / 1e3 / n if n else float("nan")
    gaps = _gaps(c)
    if c.measured:
        gaps = gaps[gaps["token"].isin(c.measured)]
    top = _host_gaps(c, gaps, top_gaps)
    api = c.is_kind("api") & w
    names, counts = np.unique(c.name[api], return_counts=True)

    def per_token(mask: np.ndarray) -> float:
        return int((mask & w).sum()) / n if n else float("nan")

    return {
        "tokens": len(c.tokens),
        "measured_tokens": n,
        "us_per_token": us,
        "tokens_per_s": 1e6 / us if us and us == us else float("nan"),
        "kernels_per_token": per_token(c.is_kind("kernel")),
        "launches_per_token": per_token(c.launch_calls()),
        "syncs_per_token": per_token(c.syncs()),
        "api_calls_per_token": {str(k): int(v) / n for k, v in zip(names, counts)} if n else {},
        "gpu_busy_fraction": _busy(c),
        "host_gap_us_per_token": float(gaps.loc[gaps["cause"] == "host", "gap_us"].sum()) / n if n else float("nan"),
        "largest_host_gaps": top[["token", "gap_us", "before", "after", "api", "host_calls"]].to_dict("records"),
    }
