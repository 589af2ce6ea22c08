"""Scratch-buffer allocation into one arena (``Strategy.allocator``), ggml-alloc style.

Every ``act`` buffer gets a byte range of a single arena buffer; the Plan's graph is rebased
onto it, so two buffers sharing bytes are visible to every executor and to the race checker.

- ``serial-reuse`` is ggml-alloc: it assumes in-order execution and frees a buffer right
  after its last access in graph order, so the next allocation may take those bytes even if
  the last reader runs on another stream and has not finished (seed 001's bug).
- ``stream-aware`` is the ``becomes_visible_at`` design of seed 001's discussion: a freed
  block carries, per stream, the last node of that stream that touched it, and a node may
  take it only once every one of those nodes happens-before it (stream order plus events).
- ``no-reuse`` gives every buffer its own bytes.

Free blocks are best-fit and merged with their neighbours, as in ``ggml_dyn_tallocr``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


@dataclass
class _Block:
    offset: int
    size: int
    release: Clock  # per stream: last node of that stream that touched these bytes (-1: none)


class _Arena:
    """Best-fit free list over a growing arena; a block is usable by a node when ``ready``."""

    def __init__(self) -> None:
        self.free: list[_Block] = []  # sorted by offset, never adjacent
        self.top = 0

    def alloc(self, size: int, ready: Callable[[Clock], bool]) -> int:
        fits = [b for b in self.free if b.size >= size and ready(b.release)]
        if fits:
            b = min(fits, key=lambda b: (b.size, b.offset))
            off = b.offset
            b.offset += size
            b.size -= size
            if b.size == 0:
                self.free.remove(b)
            return off
        last = self.free[-1] if self.free else None
        if last is not None and last.offset + last.size == self.top and ready(last.release):
            self.free.pop()  # grow the arena from the trailing free block
            self.top = last.offset + size
            return last.offset
        off = self.top
        self.top += size
        return off

    def release(self, offset: int, size: int, clock: Clock) -> None:
        blocks = self.free
        k = next((i for i, b in enumerate(blocks) if b.offset > offset), len(blocks))
        blocks.insert(k, _Block(offset, size, clock))
        if k + 1 < len(blocks) and offset + size == blocks[k + 1].offset:  # merge with the next
            nxt = blocks.pop(k + 1)
            blocks[k].size += nxt.size
            blocks[k].release = _max(blocks[k].release, nxt.release)
        if k > 0 and blocks[k - 1].offset + blocks[k - 1].size == offset:  # and with the previous
            cur = blocks.pop(k)
            blocks[k - 1].size += cur.size
            blocks[k - 1].release = _max(blocks[k - 1].release, cur.release)


def _max(a: Clock, b: Clock) -> Clock:
    return tuple(max(x, y) for x, y in zip(a, b))


@dataclass(frozen=True)
class Lifetime:
    """A scratch buffer's accesses: first and last node, the bytes views reach, and per
    stream the last node that touched it."""

    buffer: str
    first: int
    last: int
    nbytes: int
    last_per_stream: Clock


def lifetimes(nodes: Sequence[Node], schedule: StreamSchedule) -> dict[str, Lifetime]:
    """Lifetimes of every ``act`` buffer, in order of first access."""
    acc: dict[str, list[int]] = {}
    reach: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in (*n.srcs, *n.outs):
            if v.buffer.kind != "act" or v.numel == 0:
                continue
            acc.setdefault(v.buffer.name, []).append(i)
            reach[v.buffer.name] = max(reach.get(v.buffer.name, 0), v.end)
    out: dict[str, Lifetime] = {}
    for name, idx in acc.items():
        per = [-1] * schedule.n_streams
        for i in idx:
            s = schedule.streams[i]
            per[s] = max(per[s], i)
        out[name] = Lifetime(name, min(idx), max(idx), _align(reach[name]), tuple(per))
    return out


def allocate(graph: Graph, schedule: StreamSchedule, policy: str) -> Allocation:
    """Place every scratch buffer of ``graph`` (nodes in issue order) under ``policy``."""
    lives = lifetimes(graph.nodes, schedule)
    starting: dict[int, list[Lifetime]] = {}
    ending: dict[int, list[Lifetime]] = {}
    for lt in lives.values():
        starting.setdefault(lt.first, []).append(lt)
        ending.setdefault(lt.last, []).append(lt)
    arena = _Arena()
    offsets: dict[str, int] = {}
    none: Clock = (-1,) * schedule.n_streams
    for i in range(len(graph.nodes)):
        clock = schedule.clocks[i]
        if policy == "stream-aware":
            def ready(rel: Clock, clock: Clock = clock) -> bool:
                return all(c >= r for c, r in zip(clock, rel))
        else:
            def ready(rel: Clock) -> bool:
                return True
        for lt in starting.get(i, ()):
            offsets[lt.buffer] = arena.alloc(lt.nbytes, ready)
        if policy == "no-reuse":
            continue
        for lt in ending.get(i, ()):
            arena.release(offsets[lt.buffer], lt.nbytes, lt.last_per_stream if policy == "stream-aware" else none)
    persistent = sum(b.nbytes for b in graph.buffers().values() if b.persistent)
    return Allocation(policy, offsets, arena.top, persistent, {n: lt.nbytes for n, lt in lives.items()}, ARENA)


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
