"""Stream assignment (``Strategy.streams``) and the fork/join events that keep it correct.

``single`` puts every kernel on stream 0. ``qkv`` is llama.cpp PR #16991: after each
normalisation whose output feeds exactly three mat-muls (the Q, K and V projections; found from
the graph's structure, not its node names) the three branches run on streams 0, 1 and 2 (fork
event recorded after the norm) and meet again at the first attention node (join events from
streams 1 and 2). ``auto`` puts any
independent branch on its own stream, up to ``max_streams``.

Events are placed generically from the byte-level hazards: whenever a node depends on a node
of another stream that does not already happen-before it, the producer records an event and
the consumer's stream waits on it. Vector clocks (for each stream, the last node of that stream
known to have completed) make "already happens-before" exact, so no event is redundant; the
allocator reuses them to decide when a buffer is visible to every stream (``stream-aware``).
Every side stream joins stream 0 before the graph's last node, so a token ends on stream 0
(what a CUDA graph capture requires and what the final ``cudaStreamSynchronize`` waits for).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..graph import Node
from ..graph.ops import op_info

#: the ops of each of the forked branches' first node: the Q, K and V projections (their bias
#: fused in by mul-mat-add), or with quantised weights the q8_1 quantisation of their input
#: (llama.cpp's mmvq runs it first)
FORK_CONSUMER_OPS = ("MUL_MAT", "MUL_MAT_ADD", "QUANTIZE_Q8_1")
#: the mat-vecs that carry a folded norm (norm-mat-vec): their activation input, not a norm, forks
NORM_FOLDED_OPS = ("RMS_NORM_MUL_MAT",)
#: the op where the Q, K and V branches meet
JOIN_OP = "FLASH_ATTN_EXT"
#: PR #16991's fan-out
QKV_FANOUT = 3


@dataclass(frozen=True)
class StreamSchedule:
    """Per node (index as in the graph): stream, events waited before it and recorded after it.

    ``clocks[i][s]`` is the index of the last node of stream ``s`` that happens-before node
    ``i`` completes (``i`` itself for its own stream), -1 when none: ``a`` happens-before
    ``b`` iff ``clocks[b][stream[a]] >= a``.
    """

    streams: list[int]
    wait_events: list[tuple[int, ...]]
    record_events: list[tuple[int, ...]]
    clocks: list[tuple[int, ...]]
    n_streams: int
    n_events: int

    def happens_before(self, a: int, b: int) -> bool:
        """Node ``a`` completes before node ``b`` starts (stream order and events)."""
        return a == b or (a < b and self.clocks[b][self.streams[a]] >= a)


def assign_streams(nodes: Sequence[Node], deps: list[list[int]], mode: str, max_streams: int,
                   fork_keeps_branch: bool = True) -> StreamSchedule:
    """Stream per node for ``mode`` (single, qkv, auto), then the events that order it.
    ``fork_keeps_branch`` (``qkv``): the first branch stays on the forking stream (the
    workbench's schedule); False: every branch on a stream of its own (llama.cpp's)."""
    if mode == "single" or max_streams == 1 or not nodes:
        streams = [0] * len(nodes)
    elif mode == "qkv":
        streams = _qkv_streams(nodes, deps, 0 if fork_keeps_branch else 1)
    elif mode == "auto":
        streams = _auto_streams(deps, max_streams)
    else:  # Strategy validates the value; this guards direct callers
        raise ValueError(f"unknown stream mode {mode!r}")
    return place_events(streams, deps)


def _is_norm_output(i: int, nodes: Sequence[Node], deps: list[list[int]]) -> bool:
    """A normalisation's result: a norm op, or the weight MUL right after one (ggml's
    ``attn_norm`` is ``mul(rms_norm(x), w)`` unless fused)."""
    if op_info(nodes[i].op).family == "norm":
        return True
    return nodes[i].op == "MUL" and any(op_info(nodes[d].op).family == "norm" for d in deps[i])


def fork_points(nodes: Sequence[Node], deps: list[list[int]]) -> list[int]:
    """Nodes after which ``qkv`` forks: a normalisation whose output is read by exactly
    ``QKV_FANOUT`` nodes, all of them mat-muls (llama.cpp: a norm with exactly three consumers)."""
    readers: dict[int, list[int]] = {}
    for j, ds in enumerate(deps):
        for d in ds:
            if any(src.overlaps(nodes[d].dst) for src in nodes[j].srcs):
                readers.setdefault(d, []).append(j)
    return [i for i, r in sorted(readers.items())
            if (len(r) == QKV_FANOUT and all(nodes[j].op in FORK_CONSUMER_OPS for j in r)
                and _is_norm_output(i, nodes, deps)) or _folded_qkv(i, r, nodes)]


def _folded_qkv(i: int, readers: list[int], nodes: Sequence[Node]) -> bool:
    """Node ``i`` feeds exactly ``QKV_FANOUT`` mat-vecs that each normalise it with one norm
    weight (the Q/K/V projections after norm-mat-vec): each branch recomputes the norm."""
    folded = [j for j in readers if nodes[j].op in NORM_FOLDED_OPS]
    return len(folded) == QKV_FANOUT and len({nodes[j].srcs[-1] for j in folded}) == 1


def _qkv_streams(nodes: Sequence[Node], deps: list[list[int]], first: int = 0) -> list[int]:
    """PR #16991: fork after the Q/K/V norm, one stream per branch, join at the attention.
    The branches take streams ``first``, ``first + 1``, ...: from 0, the Q branch continues the
    forking stream (so PDL still links the norm to the Q projection, the workbench's
    schedule); from 1, each branch waits for the fork's event and the forking stream for every
    branch's at the join, as llama.cpp's ``ggml_cuda_concurrent_event`` does (its
    ``stream_mapping``: branch ``i`` on stream ``i + 1``), so neither edge is a PDL one."""
    streams = [0] * len(nodes)
    forks = fork_points(nodes, deps)
    for f, nxt in zip(forks, [*forks[1:], len(nodes)]):
        join = next((j for j in range(f + 1, nxt) if nodes[j].op == JOIN_OP), None)
        if join is None:
            continue  # not an attention layer (e.g. a gated-delta-net layer)
        branch: dict[int, int] = {}  # node -> branch number, in order of the branches' first nodes
        n_branches = 0
        for j in range(f + 1, join):
            owners = {branch[d] for d in deps[j] if d in branch}
            if len(owners) == 1:
                branch[j] = owners.pop()
            elif not owners and f in deps[j]:  # a direct consumer of the fork starts a branch
                branch[j] = n_branches
                n_branches += 1
        for j, b in branch.items():
            streams[j] = b + first if b < QKV_FANOUT else 0
    return streams


def _auto_streams(deps: list[list[int]], max_streams: int) -> list[int]:
    """Any independent branch on its own stream: a node continues the stream of a producer
    that is still that stream's last node; a node forking off a producer whose stream moved on
    takes a stream that is idle for it (or a new one, up to ``max_streams``)."""
    n = len(deps)
    streams = [0] * n
    tail: list[int | None] = [None] * max_streams
    used = 1
    clocks: list[list[int]] = []
    for i in range(n):
        ds = deps[i]
        clock = [-1] * max_streams
        for d in ds:
            clock = [max(a, b) for a, b in zip(clock, clocks[d])]
        if not ds:
            s = 0
        else:
            cont = [streams[d] for d in ds if tail[streams[d]] == d]
            if cont:
                s = 0 if 0 in cont else streams[max(d for d in ds if tail[streams[d]] == d)]
            else:
                idle = [t for t in range(used) if tail[t] is None or clock[t] >= tail[t]]
                if idle:
                    s = idle[0]
                elif used < max_streams:
                    s, used = used, used + 1
                else:
                    s = min(range(used), key=lambda t: tail[t])
        if i == n - 1:
            s = 0  # the token ends on stream 0
        own = tail[s]
        if own is not None:
            clock = [max(a, b) for a, b in zip(clock, clocks[own])]
        clock[s] = i
        clocks.append(clock)
        tail[s] = i
        streams[i] = s
    return streams


def place_events(streams: list[int], deps: list[list[int]]) -> StreamSchedule:
    """Events for every cross-stream dependency not already implied, plus the final join."""
    n = len(streams)
    streams = list(streams)
    deps = [list(d) for d in deps]
    if n:  # the token ends on stream 0: every side stream joins it before the last node
        streams[-1] = 0
        last_on = {s: i for i, s in enumerate(streams[:-1])}
        deps[-1] = sorted(set(deps[-1]) | {i for s, i in last_on.items() if s != 0})
    n_streams = max(streams, default=0) + 1
    tail: list[int | None] = [None] * n_streams
    clocks: list[tuple[int, ...]] = []
    event_of: dict[int, int] = {}
    waits: list[tuple[int, ...]] = []
    records: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        s = streams[i]
        own = tail[s]
        clock = list(clocks[own]) if own is not None else [-1] * n_streams
        w: list[int] = []
        for d in sorted(deps[i], reverse=True):  # latest first: its clock may cover the rest
            sd = streams[d]
            if sd == s or clock[sd] >= d:
                continue
            if d not in event_of:
                event_of[d] = len(event_of)
                records[d].append(event_of[d])
            w.append(event_of[d])
            clock = [max(a, b) for a, b in zip(clock, clocks[d])]
        clock[s] = i
        clocks.append(tuple(clock))
        waits.append(tuple(sorted(w)))
        tail[s] = i
    # number events in the order they are recorded (the order a trace shows them)
    renum = {e: k for k, e in enumerate(e for r in records for e in r)}
    waits = [tuple(sorted(renum[e] for e in w)) for w in waits]
    recs = [tuple(renum[e] for e in r) for r in records]
    return StreamSchedule(streams, waits, recs, clocks, n_streams, len(event_of))
