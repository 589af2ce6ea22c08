"""The per-token host program (llama.cpp PR #17795): input copies and syncs, launches, logits back.

``per-copy`` (llama.cpp before #17795): before each input copy the host synchronizes the
stream and copies blocking from a pageable buffer (``s c s c s c s c``). ``boundary``: one sync,
async copies from pinned buffers, one sync (``s a a a a s``). ``implicit``: async copies
ordered by the stream alone (``a a a a``). Then the kernels (eager: one launch per kernel with
the event records/waits between them; graphs: one ``cudaGraphLaunch``), the async D2H of the
logits into a pinned buffer and the final ``cudaStreamSynchronize`` that hands them to the host.
With ``--logits zero-copy`` there is no D2H: the kernel that writes the logits stores them into
pinned host memory mapped into the GPU's address space (``mapped_outputs``), and the final sync
alone hands them over (it waits for that kernel, whose writes are flushed when it completes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..graph import Graph
from .plan import HOST_OPS, HostOp, Launch
from .strategy import Strategy

ASYNC, BLOCKING = HOST_OPS["memcpy_h2d"]


def _sync() -> HostOp:
    return HostOp("stream_sync", HOST_OPS["stream_sync"][0], 0)


def graph_inputs(graph: Graph) -> list[tuple[str, int]]:
    """(name, bytes) of the step's inputs the host fills before each token (token id, position,
    KV row, masks), in the graph's order."""
    return [(name, v.nbytes) for name, v in graph.inputs.items()]


def input_copies(inputs: Iterable[tuple[str, int]], sync: str) -> list[HostOp]:
    """The H2D copies of ``inputs`` ((name, bytes), e.g. ``graph_inputs``) with ``sync``'s pattern."""
    ops: list[HostOp] = []
    if sync == "boundary":
        ops.append(_sync())
    for name, nbytes in inputs:
        if sync == "per-copy":
            ops.append(_sync())
            ops.append(HostOp("memcpy_h2d", BLOCKING, 0, tensor=name, nbytes=nbytes, blocking=True,
                              host_buffer="pageable"))
        else:
            ops.append(HostOp("memcpy_h2d", ASYNC, 0, tensor=name, nbytes=nbytes, host_buffer="pinned"))
    if sync == "boundary":
        ops.append(_sync())
    return ops


def kernel_launches(launches: Sequence[Launch], graphs: bool) -> list[HostOp]:
    """One ``cudaGraphLaunch``, or each launch with its stream's event waits before and records after."""
    if graphs:
        return [HostOp("graph_launch", HOST_OPS["graph_launch"][0], 0)]
    plain, ex = HOST_OPS["launch"]
    ops: list[HostOp] = []
    for la in launches:
        ops.extend(HostOp("stream_wait_event", HOST_OPS["stream_wait_event"][0], la.stream, event=e)
                   for e in la.wait_events)
        ops.append(HostOp("launch", ex if la.pdl else plain, la.stream, launch=la.index))
        ops.extend(HostOp("event_record", HOST_OPS["event_record"][0], la.stream, event=e)
                   for e in la.record_events)
    return ops


def host_program(graph: Graph, launches: Sequence[Launch], strategy: Strategy,
                 inputs: Iterable[tuple[str, int]] | None = None) -> list[HostOp]:
    """One token's host program for ``strategy``; ``inputs`` (name, bytes) replaces the graph's
    own inputs where an executor copies others (llama.cpp's split inputs)."""
    ops = input_copies(graph_inputs(graph) if inputs is None else inputs, strategy.sync)
    ops.extend(kernel_launches(launches, strategy.graphs))
    if strategy.logits == "copy":
        for name, v in graph.outputs.items():
            ops.append(HostOp("memcpy_d2h", HOST_OPS["memcpy_d2h"][0], 0, tensor=name, nbytes=v.nbytes,
                              host_buffer="pinned"))
    ops.append(_sync())
    return ops


def mapped_outputs(graph: Graph, program: Sequence[HostOp]) -> list[str]:
    """The step's outputs that no D2H copy of ``program`` moves: under ``--logits zero-copy`` they
    live in mapped pinned host memory, written there by their kernels and read by the host after
    the final sync."""
    copied = {op.tensor for op in program if op.kind == "memcpy_d2h"}
    return [name for name in graph.outputs if name not in copied]


def pattern(program: Sequence[HostOp]) -> str:
    """Seed 000's shorthand of a host program: ``s`` sync, ``c`` blocking copy, ``a`` async
    copy, ``g`` the kernels (one letter however many launches), ``d`` the D2H copy."""
    out: list[str] = []
    for op in program:
        if op.kind == "stream_sync":
            ch = "s"
        elif op.kind == "memcpy_h2d":
            ch = "c" if op.blocking else "a"
        elif op.kind == "memcpy_d2h":
            ch = "d"
        else:
            ch = "g"
        if not (ch == "g" and out and out[-1] == "g"):
            out.append(ch)
    return " ".join(out)
