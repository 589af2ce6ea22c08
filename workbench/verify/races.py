"""Race detection: conflicting accesses (write/write, read/write on shared bytes) of different
operations with no happens-before order.

Pairs come from an interval sort per buffer (a sweep: each access meets only the accesses that
start inside its span), never from all pairs; buffers nobody writes are skipped. The order test
of all candidate pairs of a buffer is one vectorized lookup in the packed reachability matrix.
Ops are created in a topological order, so for a pair only "earlier op's end happens before
later op's begin" needs testing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..graph.tensor import runs_overlap
from .accesses import AccessTable
from .hb import HappensBefore

#: candidate pairs tested per vectorized chunk (bounds peak memory on huge arenas)
CHUNK_PAIRS = 4_000_000


@dataclass(frozen=True)
class RacePair:
    """Indices into the AccessTable: ``first`` belongs to the op issued first."""

    first: int
    second: int


def _candidate_chunks(lo: np.ndarray, hi: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """For accesses sorted by ``lo``: every (i, j), i < j, with ``lo[j] < hi[i]`` (span overlap)."""
    n = len(lo)
    stop = np.searchsorted(lo, hi, side="left")          # first j with lo[j] >= hi[i]
    counts = np.maximum(stop - np.arange(1, n + 1), 0)
    i0 = 0
    while i0 < n:
        csum = np.cumsum(counts[i0:])
        i1 = i0 + max(1, int(np.searchsorted(csum, CHUNK_PAIRS, side="right")))
        c = counts[i0:i1]
        total = int(c.sum())
        if total:
            first = np.repeat(np.arange(i0, i1), c)
            starts = np.repeat(np.cumsum(c) - c, c)
            second = first + 1 + (np.arange(total) - starts)
            yield first, second
        i0 = i1


def find_races(hb: HappensBefore, table: AccessTable) -> tuple[list[RacePair], int]:
    """All unordered conflicting pairs and the number of conflicting pairs checked."""
    if not len(table):
        return [], 0
    col = table.columns
    matrix = hb.matrix()
    races: list[RacePair] = []
    checked = 0
    cache: dict[int, list[tuple[int, int]]] = {}

    def runs(k: int) -> list[tuple[int, int]]:
        if k not in cache:
            cache[k] = table.accesses[k].view.intervals()
        return cache[k]

    order = np.lexsort((col["lo"], col["buffer"]))
    buf_sorted = col["buffer"][order]
    bounds = np.flatnonzero(np.diff(buf_sorted)) + 1
    for group in np.split(order, bounds):
        if len(group) < 2 or not col["write"][group].any():
            continue
        lo, hi = col["lo"][group], col["hi"][group]
        for fi, si in _candidate_chunks(lo, hi):
            i, j = group[fi], group[si]
            keep = (col["write"][i] | col["write"][j]) & (col["op"][i] != col["op"][j])
            i, j = i[keep], j[keep]
            if not len(i):
                continue
            strided = col["strided"][i] | col["strided"][j]
            if strided.any():
                exact = np.ones(len(i), bool)
                for k in np.flatnonzero(strided):
                    exact[k] = runs_overlap(runs(i[k]), runs(j[k]))
                i, j = i[exact], j[exact]
            checked += len(i)
            swap = col["op"][i] > col["op"][j]
            a = np.where(swap, j, i)
            b = np.where(swap, i, j)
            a_end, b_begin = col["end"][a], col["begin"][b]
            ordered = (a_end == b_begin) | ((matrix[b_begin, a_end >> 3] >> (a_end & 7)) & 1).astype(bool)
            for x, y in zip(a[~ordered].tolist(), b[~ordered].tolist()):
                races.append(RacePair(x, y))
    races.sort(key=lambda r: (table.accesses[r.second].op, table.accesses[r.first].op))
    return races, checked
