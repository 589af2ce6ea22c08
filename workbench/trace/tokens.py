"""Tokens of an imported trace, from the marker ranges that delimit decode steps.

Nsight Systems and PyTorch-profiler traces do not know tokens, but the program that made them
usually marks its steps: an NVTX range ``token 12`` / ``decode token 12``, or the profiler's
``ProfilerStep#12``. A host event inside such a range (same process and thread) takes its
token; device work takes the token of the API call with its correlation id, so a kernel that
runs while the host already issues the next token still counts for the token that launched it
(the rule ``workbench.trace.cupti_records`` applies to live captures).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .layout import is_device_row

TOKEN_MARKER = re.compile(r"(?:ProfilerStep#|\btoken[\s_#:=]*|\btok[\s_#:=]*)(\d+)\b", re.IGNORECASE)


def tokens_from_markers(events: pd.DataFrame, pattern: re.Pattern[str] = TOKEN_MARKER) -> pd.DataFrame:
    """``events`` with ``token`` filled from token marker ranges; unchanged when any event
    already has a token or no marker names one."""
    if (events["token"] >= 0).any():
        return events
    marks = events[events["kind"] == "marker"]
    found = marks["name"].astype(str).str.extract(pattern, expand=False)
    marks = marks[found.notna()]
    if marks.empty:
        return events
    events = events.copy()
    token = events["token"].to_numpy().copy()
    token[marks.index.to_numpy()] = found[found.notna()].astype(np.int64).to_numpy()
    device = is_device_row(events["row"])
    host = np.flatnonzero(~device & (events["kind"] != "marker").to_numpy())
    h_start = events["start_ns"].to_numpy()[host]
    h_pid = events["pid"].to_numpy()[host]
    h_tid = events["tid"].to_numpy()[host]
    order = np.argsort(h_start, kind="stable")
    host, h_start, h_pid, h_tid = host[order], h_start[order], h_pid[order], h_tid[order]
    # outer ranges first, so a nested range that also names a token wins
    for m in marks.assign(_len=marks["end_ns"] - marks["start_ns"]).sort_values("_len", ascending=False).itertuples():
        lo, hi = np.searchsorted(h_start, [m.start_ns, m.end_ns], side="left")
        sel = np.arange(lo, hi)
        if m.tid >= 0:
            sel = sel[(h_tid[sel] == m.tid) & ((h_pid[sel] == m.pid) | (m.pid < 0))]
        token[host[sel]] = int(token[m.Index])
    corr = events["corr_id"].to_numpy()
    api = (~device) & (corr >= 0) & (token >= 0)
    by_corr = pd.Series(token[api], index=corr[api])
    by_corr = by_corr[~by_corr.index.duplicated()]
    dev_idx = np.flatnonzero(device & (corr >= 0))
    token[dev_idx] = by_corr.reindex(corr[dev_idx]).fillna(-1).astype(np.int64).to_numpy()
    events["token"] = token
    return events
