"""Scratch-buffer allocation into one arena (``Strategy.allocator``).

Every ``act`` buffer gets a byte range of a single arena buffer; the Plan's graph is rebased
onto it, so two buffers sharing bytes are visible to every executor and to the race checker.
The policies differ only in which two buffers may share bytes:

- ``serial-reuse`` is ggml-alloc's assumption of in-order execution: a buffer's bytes are free
  once its last access in graph order is done, so a later buffer may take them even if that
  last reader runs on another stream and has not finished (seed 001's bug).
- ``stream-aware`` is the ``becomes_visible_at`` design of seed 001's discussion: a buffer may
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
    accessing nodes' vector clocks)."""

    buffer: str
    first: int
    last: int
    nbytes: int
    release: Clock
    acquire: Clock

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
    out: dict[str, Lifetime] = {}
    for name, idx in acc.items():
        release = [-1] * schedule.n_streams
        for i in idx:
            s = schedule.streams[i]
            release[s] = max(release[s], i)
        acquire = [min(col) for col in zip(*(schedule.clocks[i] for i in idx))]
        out[name] = Lifetime(name, idx[0], idx[-1], _align(reach[name]), tuple(release), tuple(acquire))
    return out


def may_share(a: Lifetime, b: Lifetime, policy: str) -> bool:
    """Whether ``a`` and ``b`` may occupy the same bytes under ``policy``."""
    if policy == "no-reuse":
        return False
    if policy == "serial-reuse":
        return a.last < b.first or b.last < a.first
    return a.visible_before(b) or b.visible_before(a)


def place(lives: Sequence[Lifetime], policy: str) -> tuple[dict[str, int], int]:
    """Greedy by size: offsets per buffer and the arena size."""
    placed: list[tuple[Lifetime, int]] = []
    offsets: dict[str, int] = {}
    top = 0
    for lt in sorted(lives, key=lambda lt: (-lt.nbytes, lt.first)):
        busy = sorted((off, off + o.nbytes) for o, off in placed if not may_share(o, lt, policy))
        off = 0
        for lo, hi in busy:
            if lo >= off + lt.nbytes:
                break
            off = max(off, hi)
        placed.append((lt, off))
        offsets[lt.buffer] = off
        top = max(top, off + lt.nbytes)
    return {b: offsets[b] for b in (lt.buffer for lt in lives)}, top


def unordered_reuse(lives: dict[str, Lifetime], offsets: dict[str, int]) -> list[tuple[str, str]]:
    """Pairs (earlier, later) of buffers placed on shared bytes although some access of the
    earlier one does not happen-before an access of the later one: what ``serial-reuse``
    does wrong on several streams, and what the race checker will report as races."""
    spans = sorted((offsets[b], offsets[b] + lt.nbytes, b) for b, lt in lives.items())
    out: list[tuple[str, str]] = []
    for k, (_, hi, a) in enumerate(spans):
        for lo2, _hi2, b in spans[k + 1:]:
            if lo2 >= hi:
                break
            x, y = sorted((lives[a], lives[b]), key=lambda lt: lt.first)
            if not x.visible_before(y):
                out.append((x.buffer, y.buffer))
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
