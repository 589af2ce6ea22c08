"""Nsight Systems row layout of a Trace: which track every event is drawn on.

Nsight groups host rows under ``Process [pid] -> Thread [tid] -> NVTX / CUDA API`` and device
rows under ``CUDA HW (GPU n) -> Stream N``. Events that overlap on one row (kernels launched with
Programmatic Dependent Launch start before their predecessor ends; NVTX ranges nest) would hide
each other, so a row is split into lanes (sub-rows). The timeline and the Perfetto export both
draw from this one layout, so a row looks the same in either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .table import API_ROW, MARKER_ROW, Trace

STREAM_PREFIX = "Stream "


def is_device_row(rows: pd.Series) -> np.ndarray:
    """Rows of device work (``Stream N``), as opposed to host rows (CUDA API, NVTX, ...)."""
    codes, names = pd.factorize(rows, sort=False)
    return np.array([str(n).startswith(STREAM_PREFIX) for n in names], dtype=bool)[codes]


def assign_lanes(group: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """First-fit lane of every event inside its group, lane 0 for events that overlap nothing.

    Events that touch (one ends where the next starts) share a lane. Only clusters of
    overlapping events need first-fit (a trace without overlap costs a sort); many short ones
    (PDL chains) are placed all at once, step by step, a few long ones event by event.
    """
    n = len(start)
    lanes = np.zeros(n, dtype=np.int64)
    if n == 0:
        return lanes
    order = np.lexsort((start, group))
    g, s, e = group[order], start[order], end[order]
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = g[1:] != g[:-1]
    # running max of ends inside each group: offset groups so one accumulate does all of them
    lo = int(min(s.min(), e.min()))
    width = int(max(s.max(), e.max())) - lo + 1
    rank = np.cumsum(new_group) - 1
    e_adj = (e - lo) + rank * width
    s_adj = (s - lo) + rank * width
    prev_max = np.empty(n, dtype=np.int64)
    prev_max[0] = -1
    prev_max[1:] = np.maximum.accumulate(e_adj)[:-1]
    prev_max[new_group] = -1
    starts_cluster = s_adj >= prev_max
    cluster = np.cumsum(starts_cluster)
    size = np.bincount(cluster)
    in_multi = size[cluster] > 1
    sorted_lanes = np.zeros(n, dtype=np.int64)
    idx = np.flatnonzero(in_multi)
    if len(idx):
        first = np.zeros(len(size), dtype=np.int64)
        first[cluster[::-1]] = np.arange(n)[::-1]
        pos = idx - first[cluster[idx]]          # place of each event inside its cluster
        if int(pos.max()) * _STEP_COST < len(idx):
            sorted_lanes[idx] = _first_fit_wavefront(cluster[idx], pos, s[idx], e[idx])
        else:
            sorted_lanes[idx] = _first_fit_loop(s[idx], e[idx], starts_cluster[idx])
    lanes[order] = sorted_lanes
    return lanes


#: one wavefront step (numpy calls over all clusters at once) costs about this many events of the
#: Python loop; many short clusters (PDL chains, one per token) go wavefront, few long ones loop
_STEP_COST = 60


def _first_fit_loop(s: np.ndarray, e: np.ndarray, fresh_cluster: np.ndarray) -> np.ndarray:
    """First-fit lanes, one event after another (events sorted by start inside each cluster)."""
    out = np.zeros(len(s), dtype=np.int64)
    ss, ee, fresh = s.tolist(), e.tolist(), fresh_cluster.tolist()
    lane_end: list[int] = []
    for k in range(len(ss)):
        if fresh[k]:
            lane_end = []
        st = ss[k]
        for j, le in enumerate(lane_end):
            if le <= st:
                lane_end[j] = ee[k]
                out[k] = j
                break
        else:
            out[k] = len(lane_end)
            lane_end.append(ee[k])
    return out


def _first_fit_wavefront(cluster: np.ndarray, pos: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """First-fit lanes of all clusters at once: step p places the p-th event of every cluster."""
    out = np.zeros(len(s), dtype=np.int64)
    cid = np.unique(cluster, return_inverse=True)[1]
    order = np.lexsort((cid, pos))
    bounds = np.searchsorted(pos[order], np.arange(int(pos.max()) + 2))
    free_at = np.iinfo(np.int64).min
    lane_end = np.full((int(cid.max()) + 1, 4), free_at, dtype=np.int64)
    for p in range(len(bounds) - 1):
        sel = order[bounds[p]:bounds[p + 1]]
        c, st = cid[sel], s[sel]
        fits = lane_end[c] <= st[:, None]
        if not fits.any(axis=1).all():   # every lane busy somewhere: add lanes
            lane_end = np.concatenate([lane_end, np.full_like(lane_end, free_at)], axis=1)
            fits = lane_end[c] <= st[:, None]
        j = fits.argmax(axis=1)
        lane_end[c, j] = e[sel]
        out[sel] = j
    return out


@dataclass(frozen=True)
class Layout:
    """``tracks``: one row per drawn track in display order (headers included), with columns
    ``label, level, header, host, pid, tid, device, row, lane, stream``; ``track``: the track
    index of every event of the trace (same order as ``trace.events``)."""

    tracks: pd.DataFrame
    track: np.ndarray


def _name(meta: dict, key: str, ident: int) -> str:
    names = meta.get(key) or {}
    return str(names.get(ident, names.get(str(ident), "")))


def _row_rank(row: str) -> tuple[int, int, str]:
    if row == MARKER_ROW:
        return (0, 0, row)
    if row == API_ROW:
        return (1, 0, row)
    if row.startswith(STREAM_PREFIX):
        tail = row[len(STREAM_PREFIX):]
        return (2, int(tail) if tail.lstrip("-").isdigit() else 0, row)
    return (3, 0, row)


def layout(trace: Trace) -> Layout:
    """Group, order and split the trace's rows the way Nsight Systems shows them."""
    ev = trace.events
    row_codes, row_names = pd.factorize(ev["row"], sort=False)
    device = np.array([str(n).startswith(STREAM_PREFIX) for n in row_names], dtype=bool)[row_codes]
    # a device row belongs to its GPU whatever process launched it; a host row to its thread
    pid = np.where(device, -1, ev["pid"].to_numpy())
    tid = np.where(device, -1, ev["tid"].to_numpy())
    dev = np.where(device, ev["device"].to_numpy(), -1)
    key = row_codes.astype(np.int64)
    for col in (pid, tid, dev):
        codes, uniq = pd.factorize(col, sort=False)
        key = key * max(len(uniq), 1) + codes
    key_id, uniq_keys = pd.factorize(key, sort=False)
    first = np.zeros(len(uniq_keys), dtype=np.int64)
    first[key_id[::-1]] = np.arange(len(key_id))[::-1]   # first event of each key
    key_rows = [(bool(device[i]), int(pid[i]), int(tid[i]), int(dev[i]), int(row_codes[i])) for i in first]
    lanes = assign_lanes(key_id, ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy())
    n_lanes = np.zeros(len(key_rows), dtype=np.int64)
    if len(key_id):
        np.maximum.at(n_lanes, key_id, lanes + 1)

    rows = []
    for k, (d, p, t, v, r) in enumerate(key_rows):
        name = str(row_names[r])
        rows.append(dict(key=k, host=not d, pid=int(p), tid=int(t), device=int(v), row=name,
                         lanes=int(n_lanes[k]), rank=_row_rank(name)))
    rows.sort(key=lambda x: (not x["host"], x["pid"], x["tid"], x["device"], x["rank"]))

    tracks: list[dict] = []
    track_of_key_lane: dict[tuple[int, int], int] = {}
    last_proc = last_thread = last_dev = None
    meta = trace.meta
    for x in rows:
        if x["host"]:
            if x["pid"] != last_proc:
                pname = _name(meta, "processes", x["pid"])
                plabel = f"Process [{x['pid']}] {pname}".rstrip() if x["pid"] >= 0 else "Process (host)"
                tracks.append(_header(plabel, 0, x, host=True))
                last_proc, last_thread = x["pid"], None
            if x["tid"] != last_thread:
                tname = _name(meta, "threads", x["tid"])
                tlabel = f"Thread [{x['tid']}] {tname}".rstrip() if x["tid"] >= 0 else "Thread (main)"
                tracks.append(_header(tlabel, 1, x, host=True))
                last_thread = x["tid"]
            level = 2
        else:
            if x["device"] != last_dev:
                dname = _name(meta, "devices", x["device"])
                ident = f"GPU {x['device']}" if x["device"] >= 0 else "GPU"
                tracks.append(_header(f"CUDA HW ({ident}{' - ' + dname if dname else ''})", 0, x, host=False))
                last_dev = x["device"]
            level = 1
        stream = int(_row_rank(x["row"])[1]) if x["row"].startswith(STREAM_PREFIX) else -1
        for lane in range(x["lanes"]):
            track_of_key_lane[(x["key"], lane)] = len(tracks)
            tracks.append(dict(label=x["row"] if lane == 0 else "", level=level, header=False, host=x["host"],
                               pid=x["pid"], tid=x["tid"], device=x["device"], row=x["row"], lane=lane,
                               stream=stream))
    cols = ["label", "level", "header", "host", "pid", "tid", "device", "row", "lane", "stream"]
    table = pd.DataFrame(tracks, columns=cols)
    lut = np.zeros((len(key_rows), int(n_lanes.max()) if len(n_lanes) else 0), dtype=np.int64)
    for (k, lane), t in track_of_key_lane.items():
        lut[k, lane] = t
    track = lut[key_id, lanes] if len(key_id) else np.zeros(0, dtype=np.int64)
    return Layout(table, track)


def _header(label: str, level: int, x: dict, host: bool) -> dict:
    return dict(label=label, level=level, header=True, host=host, pid=x["pid"] if host else -1,
                tid=x["tid"] if host and level == 1 else -1, device=-1 if host else x["device"], row="",
                lane=-1, stream=-1)
