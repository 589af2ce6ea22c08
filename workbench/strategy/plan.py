"""The Plan: what a Strategy compiles to, read by every executor and by the verifier.

A knob is implemented once, in the compile step, by changing what is written here: the
rewritten and allocated graph, each launch's stream / PDL placement / events, and the per-token
host program (copies, syncs, launches or one graph launch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..graph import Graph, Node
from .strategy import Strategy

#: Host API operations of the per-token program, named as CUDA (and Nsight Systems) name them.
HOST_OPS = {
    "memcpy_h2d": ("cudaMemcpyAsync", "cudaMemcpy"),  # (async name, blocking name)
    "memcpy_d2h": ("cudaMemcpyAsync", "cudaMemcpy"),
    "stream_sync": ("cudaStreamSynchronize",),
    "device_sync": ("cudaDeviceSynchronize",),  # waits for every stream (understood by the verifier)
    "launch": ("cudaLaunchKernel", "cuLaunchKernelEx"),
    "graph_launch": ("cudaGraphLaunch",),
    "event_record": ("cudaEventRecord",),
    "stream_wait_event": ("cudaStreamWaitEvent",),
}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: a node of the Plan's graph placed on a stream.

    ``pdl``: launched with programmatic stream serialization (may start before its predecessor
    on the same stream ends); ``wait``/``trigger``: where the kernel executes
    ``griddepcontrol.wait`` / ``launch_dependents``. ``wait_events`` are waited on by the
    stream before the launch; ``record_events`` are recorded on it right after.

    Conventions of ``compile_plan``: the first kernel of each stream in a token has
    ``pdl=False`` (no kernel precedes it there) and ``wait='start'``; ``trigger`` is set for
    every kernel when PDL is on (it lets the next kernel of the stream start). PDL relaxes only
    the same-stream edge; an event wait is a full dependency.
    """

    index: int
    node: Node
    stream: int = 0
    pdl: bool = False
    wait: str = "start"
    trigger: str = "none"
    wait_events: tuple[int, ...] = ()
    record_events: tuple[int, ...] = ()


@dataclass(frozen=True)
class HostOp:
    """One step of the per-token host program (see HOST_OPS for kinds).

    ``launch``: index into Plan.launches for ``launch``; ``event``: event id for event ops;
    ``tensor``: the graph input/output name a memcpy moves; ``host_buffer``: ``pinned`` or
    ``pageable`` staging memory the copy reads or writes (rewritten by the host every token).
    """

    kind: str
    api: str
    stream: int = 0
    launch: int | None = None
    event: int | None = None
    tensor: str | None = None
    nbytes: int = 0
    blocking: bool = False
    host_buffer: str | None = None


@dataclass(frozen=True)
class Allocation:
    """Where each scratch buffer lives in the arena, and the footprint of each policy.

    ``offsets``/``sizes``: byte offset and reserved (aligned) size of each scratch buffer of
    the source graph inside the arena buffer ``arena`` (the Plan's graph views are rebased
    onto it, so reuse shows up as overlapping byte ranges). ``buffers_at`` maps arena bytes
    back to the model's buffer names (for race reports).
    """

    policy: str
    offsets: dict[str, int]
    arena_bytes: int
    persistent_bytes: int
    sizes: dict[str, int] = field(default_factory=dict)
    arena: str = "arena"

    @property
    def total_bytes(self) -> int:
        return self.arena_bytes + self.persistent_bytes

    def buffers_at(self, lo: int, hi: int) -> list[str]:
        """Scratch buffers whose reserved range overlaps arena bytes ``[lo, hi)``."""
        return [b for b, off in self.offsets.items() if off < hi and lo < off + self.sizes.get(b, 0)]


@dataclass
class Plan:
    """One decode step compiled under a Strategy (see ``compile_plan``).

    Stream 0 is the main stream: it receives the H2D copies, forks to the side streams by
    events, and every side stream joins it again before the last launch (so a token ends on
    stream 0 and a CUDA graph capture can start and end there). Event ids run 0..n_events-1
    in the order they are recorded; each is recorded once per token. ``graph`` nodes and
    ``launches`` correspond one to one, in issue order.
    """

    graph: Graph                 # rewritten (fusions) and allocated (views on the arena)
    source: Graph                # the model's graph before compilation
    strategy: Strategy
    launches: list[Launch]       # in host issue order (also capture order under graphs)
    host_program: list[HostOp]   # one token's host program
    allocation: Allocation
    n_streams: int = 1
    n_events: int = 0
    removed: list[str] = field(default_factory=list)  # nodes removed by fusions
    warnings: list[str] = field(default_factory=list)

    @property
    def memory_bytes(self) -> int:
        return self.allocation.total_bytes

    def launch_of(self, node_name: str) -> Launch:
        for launch in self.launches:
            if launch.node.name == node_name:
                return launch
        raise KeyError(f"no launch for node {node_name!r}")
