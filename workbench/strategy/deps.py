"""Byte-level dependencies between the nodes of a graph: RAW, WAR and WAW hazards.

``Graph.producers()`` gives ggml's src edges (read-after-write only). Scheduling on several
streams must also keep a cache write after every earlier read of those bytes (write-after-read)
and two writes of the same bytes in order (write-after-write), so fusion, stream assignment and
the allocator all reason over the full hazard set computed here, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..graph import Node, View


@dataclass(frozen=True)
class Access:
    """One read or write of a view by node ``node`` (an index into the node list)."""

    node: int
    view: View
    write: bool


def overlap(a: View, b: View) -> bool:
    """``a.overlaps(b)`` with a fast path for two dense views (their spans are their bytes)."""
    if a.buffer.name != b.buffer.name:
        return False
    if a is b or a == b:
        return a.numel > 0
    if a.is_contiguous and b.is_contiguous:
        return a.start < b.end and b.start < a.end and a.numel > 0 and b.numel > 0
    return a.overlaps(b)


def accesses_by_buffer(nodes: Sequence[Node]) -> dict[str, list[Access]]:
    """Every read and write of every buffer, in node order (reads of a node before its writes)."""
    out: dict[str, list[Access]] = {}
    for i, n in enumerate(nodes):
        for v in n.srcs:
            out.setdefault(v.buffer.name, []).append(Access(i, v, False))
        for v in n.outs:
            out.setdefault(v.buffer.name, []).append(Access(i, v, True))
    return out


def hazards(nodes: Sequence[Node]) -> list[list[int]]:
    """For each node, the earlier nodes it must follow: the writers of bytes it reads (RAW),
    and the readers and writers of bytes it writes (WAR, WAW). Sorted ascending."""
    writes: dict[str, list[tuple[int, View]]] = {}
    reads: dict[str, list[tuple[int, View]]] = {}
    deps: list[list[int]] = []
    for i, n in enumerate(nodes):
        d: set[int] = set()
        for r in n.srcs:
            for j, w in writes.get(r.buffer.name, ()):
                if j not in d and overlap(w, r):
                    d.add(j)
        for w in n.outs:
            name = w.buffer.name
            for j, v in writes.get(name, ()):
                if j not in d and overlap(v, w):
                    d.add(j)
            for j, v in reads.get(name, ()):
                if j != i and j not in d and overlap(v, w):
                    d.add(j)
        deps.append(sorted(d))
        for r in n.srcs:
            reads.setdefault(r.buffer.name, []).append((i, r))
        for w in n.outs:
            writes.setdefault(w.buffer.name, []).append((i, w))
    return deps


def readers_of(nodes: Sequence[Node], index: dict[str, list[Access]], view: View, after: int) -> list[int]:
    """Nodes after ``after`` that read any byte of ``view`` (each once, in order)."""
    out: list[int] = []
    for a in index.get(view.buffer.name, ()):
        if a.node > after and not a.write and (not out or out[-1] != a.node) and overlap(a.view, view):
            out.append(a.node)
    return out


def touchers_between(index: dict[str, list[Access]], view: View, lo: int, hi: int,
                     writes_only: bool = False) -> list[int]:
    """Nodes strictly between ``lo`` and ``hi`` that access (or only write) bytes of ``view``."""
    return sorted({a.node for a in index.get(view.buffer.name, ())
                   if lo < a.node < hi and (a.write or not writes_only) and overlap(a.view, view)})
