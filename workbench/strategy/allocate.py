"""Scratch-buffer allocation into one arena (``Strategy.allocator``).

Every ``act`` buffer gets a byte range of a single arena buffer; the Plan's graph is rebased
onto it, so two buffers sharing bytes are visible to every executor and to the race checker.
The policies differ only in which two buffers may share bytes:

- ``serial-reuse`` is ggml-alloc's assumption of in-order execution: a buffer's bytes are free
  once its last access in graph order is done, so a later buffer may take them even if that
  last reader runs on another stream and has not finished (PR #16991's bug).
- ``stream-aware`` is the ``becomes_visible_at`` design of PR #16991's discussion: a buffer may
  take another's bytes only if every access of the earlier one happens-before every access of
  the later one (stream order plus events), i.e. the last use has become visible to each
  stream that will touch the bytes next.
- ``no-reuse`` gives every buffer its own bytes.

Placement is offline "greedy by size" (largest buffer first, lowest offset that clears every
already placed buffer it may not share with): all lifetimes of a decode step are known before
it runs, and the packing stays close to the peak of live bytes for every policy, so the
footprints compare the policies rather than the fragmentation of an online allocator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..graph import Buffer, Graph, Node, View
from .plan import Allocation
from .streams import StreamSchedule

#: ggml's CUDA buffer alignment (ggml_backend_cuda_buffer_type_get_alignment)
ALIGNMENT = 128
#: name of the arena buffer the Plan's scratch views live in
ARENA = "arena"

Clock = tuple[int, ...]


def _align(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Lifetime:
    """A scratch buffer's accesses: first and last node, the (aligned) bytes its views reach,
    ``release``: per stream the last node that touches it; ``acquire``: per stream the last
    node known complete before *each* of its accesses starts (the element-wise minimum of the
    accessing nodes' vector clocks); ``settled``: the first node index from which on every
    node of every stream is ordered after all its accesses (its ``becomes_visible_at``)."""

    buffer: str
    first: int
    last: int
    nbytes: int
    release: Clock
    acquire: Clock
    settled: int

    def visible_before(self, other: Lifetime) -> bool:
        """Every access of ``self`` happens-before every access of ``other``."""
        return self.last < other.first and all(r <= a for r, a in zip(self.release, other.acquire))


def lifetimes(nodes: Sequence[Node], schedule: StreamSchedule) -> dict[str, Lifetime]:
    """Lifetimes of every ``act`` buffer, in order of first access."""
    acc: dict[str, list[int]] = {}
    reach: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in (*n.srcs, *n.outs):
            if v.buffer.kind != "act" or v.numel == 0:
                continue
            name = v.buffer.name
            lst = acc.setdefault(name, [])
            if not lst or lst[-1] != i:
                lst.append(i)
            reach[name] = max(reach.get(name, 0), v.end)
    # suffix minimum of the vector clocks: settled_min[m][s] bounds what every node >= m knows
    n, ns = len(nodes), schedule.n_streams
    settled_min: list[Clock] = [(n,) * ns] * (n + 1)
    for m in range(n - 1, -1, -1):
        settled_min[m] = tuple(min(a, b) for a, b in zip(settled_min[m + 1], schedule.clocks[m]))
    out: dict[str, Lifetime] = {}
    for name, idx in acc.items():
        release = [-1] * ns
        for i in idx:
            s = schedule.streams[i]
            release[s] = max(release[s], i)
        acquire = [min(col) for col in zip(*(schedule.clocks[i] for i in idx))]
        lo, hi = idx[-1] + 1, n  # settled_min is non-decreasing in m: binary search
        while lo < hi:
            mid = (lo + hi) // 2
            if all(r <= c for r, c in zip(release, settled_min[mid])):
                hi = mid
            else:
                lo = mid + 1
        out[name] = Lifetime(name, idx[0], idx[-1], _align(reach[name]), tuple(release), tuple(acquire), lo)
    return out


def may_share(a: Lifetime, b: Lifetime, policy: str) -> bool:
    """Whether ``a`` and ``b`` may occupy the same bytes under ``policy``."""
    if policy == "no-reuse":
        return False
    if policy == "serial-reuse":
        return a.last < b.first or b.last < a.first
    return a.visible_before(b) or b.visible_before(a)


#: nodes per time bucket of the placement's interval index
_BUCKET = 32


def place(lives: Sequence[Lifetime], policy: str) -> tuple[dict[str, int], int]:
    """Greedy by size: offsets per buffer and the arena size.

    Two buffers can only conflict when their windows ``[first, end)`` overlap, with ``end`` =
    ``last + 1`` under serial-reuse and ``settled`` under stream-aware; a bucketed interval
    index keeps the candidate pairs near-linear in the number of buffers.
    """
    if policy == "no-reuse":
        offsets, top = {}, 0
        for lt in lives:
            offsets[lt.buffer], top = top, top + lt.nbytes
        return offsets, top

    def window(lt: Lifetime) -> tuple[int, int]:
        return lt.first, (lt.last + 1 if policy == "serial-reuse" else max(lt.settled, lt.last + 1))

    buckets: dict[int, list[tuple[Lifetime, int]]] = {}
    offsets = {}
    top = 0
    for lt in sorted(lives, key=lambda lt: (-lt.nbytes, lt.first)):
        lo, hi = window(lt)
        seen: set[str] = set()
        busy = []
        for k in range(lo // _BUCKET, (hi - 1) // _BUCKET + 1):
            for o, off in buckets.get(k, ()):
                if o.buffer in seen:
                    continue
                seen.add(o.buffer)
                olo, ohi = window(o)
                if olo < hi and lo < ohi and not may_share(o, lt, policy):
                    busy.append((off, off + o.nbytes))
        off = 0
        for blo, bhi in sorted(busy):
            if blo >= off + lt.nbytes:
                break
            off = max(off, bhi)
        for k in range(lo // _BUCKET, (hi - 1) // _BUCKET + 1):
            buckets.setdefault(k, []).append((lt, off))
        offsets[lt.buffer] = off
        top = max(top, off + lt.nbytes)
    return {lt.buffer: offsets[lt.buffer] for lt in lives}, top


def unordered_reuse(lives: dict[str, Lifetime], offsets: dict[str, int]) -> list[tuple[str, str]]:
    """Pairs (earlier, later) of buffers placed on shared bytes although some access of the
    earlier one does not happen-before an access of the later one: what ``serial-reuse``
    does wrong on several streams, and what the race checker will report as races."""
    out: list[tuple[str, str]] = []
    active: list[Lifetime] = []  # sweep over time: only buffers whose windows overlap can race
    for lt in sorted(lives.values(), key=lambda lt: lt.first):
        active = [a for a in active if max(a.settled, a.last + 1) > lt.first]
        lo, hi = offsets[lt.buffer], offsets[lt.buffer] + lt.nbytes
        for a in active:
            alo = offsets[a.buffer]
            if alo < hi and lo < alo + a.nbytes and not a.visible_before(lt):
                out.append((a.buffer, lt.buffer))
        active.append(lt)
    return out


def allocate(graph: Graph, schedule: StreamSchedule, policy: str) -> Allocation:
    """Place every scratch buffer of ``graph`` (nodes in issue order, as scheduled) under ``policy``."""
    lives = lifetimes(graph.nodes, schedule)
    offsets, top = place(list(lives.values()), policy)
    persistent = sum(b.nbytes for b in graph.buffers().values() if b.persistent)
    return Allocation(policy, offsets, top, persistent, {n: lt.nbytes for n, lt in lives.items()}, ARENA)


def rebase(graph: Graph, allocation: Allocation) -> Graph:
    """The graph with every scratch view moved onto the arena buffer at its offset."""
    arena = Buffer(allocation.arena, max(allocation.arena_bytes, ALIGNMENT), "act")
    offsets = allocation.offsets

    def move(v: View) -> View:  # View.rebase, built directly: this runs for every view of every node
        off = offsets.get(v.buffer.name) if v.buffer.kind == "act" else None
        return v if off is None else View(arena, v.offset + off, v.shape, v.strides, v.dtype)

    nodes = [Node(n.name, n.op, tuple(move(v) for v in n.srcs), tuple(move(v) for v in n.outs), n.params)
             for n in graph.nodes]
    return Graph(graph.name, nodes, graph.inputs, graph.outputs, graph.weights, graph.caches, graph.consts,
                 dict(graph.meta))
