"""Happens-before over a Plan unrolled for several consecutive tokens.

The Plan's host program is replayed token after token, the way the CUDA runtime would see it,
and every operation becomes a few *points* of a DAG whose edges mean "completes before":

* host thread: program order; a blocking call or a sync returns only after the device work it
  waits for (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, blocking ``cudaMemcpy``);
* streams: FIFO order, except under Programmatic Dependent Launch (PDL);
* events: ``cudaEventRecord`` snapshots what the stream has queued so far, ``cudaStreamWaitEvent``
  makes later work on the waiting stream follow the latest record issued before the wait;
* ``cudaGraphLaunch``: the captured launches replay as one unit after the stream's earlier work,
  with the dependencies seen at capture (stream order, events); later work follows all of them;
* PDL: a kernel launched with programmatic stream serialization may *start* once its
  predecessor kernel triggered (``griddepcontrol.launch_dependents``; implicitly when its blocks
  exit); only after its own ``griddepcontrol.wait`` is it ordered after the predecessor's
  completion *and memory flush*. A trigger never makes the predecessor's writes visible.

Each kernel has four points: ``start`` (S), ``wait`` (W, the griddepcontrol.wait; S itself
without PDL), ``trigger`` (T: S for trigger ``start``, after W otherwise) and ``end`` (E,
completion and flush). A memcpy has S and E, a host step one point. Points are created in a
topological order, so "a happens before b" is one bit of b's ancestor set (a reachability
bitset over all points, see ``HappensBefore.matrix``).

Conservative choices (a verifier may report a race that a particular driver hides, never the
reverse): an async copy from *pageable* memory is treated like one from pinned memory (the CUDA
docs say it "might be synchronous"); inside a captured graph every kernel-to-kernel dependency of
a PDL launch, also one joined through an event, is a programmatic edge; a blocking H2D copy from
pageable memory returns once the host buffer is staged, before the device write is done.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..graph import View
from ..strategy.host import mapped_outputs
from ..strategy.plan import HostOp, Launch, Plan

#: Host op kinds this analysis understands (plan.HOST_OPS plus ``device_sync``).
SYNC_KINDS = ("stream_sync", "device_sync")


class PlanFormatError(ValueError):
    """A Plan whose host program cannot be interpreted; the message names the op."""


@dataclass
class Op:
    """One operation instance of the unrolled program (a kernel, a memcpy or a host step)."""

    index: int
    kind: str                      # "kernel" | "memcpy" | "host"
    token: int
    name: str                      # node name, "memcpy_h2d inp_pos", "host writes inp_pos", ...
    stream: int | None             # None on the host thread
    start: int
    wait: int
    trigger: int
    end: int
    launch: Launch | None = None
    host_op: HostOp | None = None
    in_graph: bool = False
    #: the op issued just before this one on its stream (for explanations)
    stream_pred: int | None = None
    #: for a blocking copy from pageable memory: the host point where the CPU stages the buffer
    staged_at: int | None = None
    #: for a captured kernel: the stream its graph was launched on, and the capture's origin stream
    graph_stream: int | None = None
    capture_origin: int | None = None
    #: for a host step reading a zero-copy output (``--logits zero-copy``): the output's view, in
    #: mapped host memory that its kernel wrote directly
    reads: View | None = None

    @property
    def lane(self) -> tuple[str, int | None]:
        """Which queue the op runs in: a captured kernel on the capture's origin stream runs in
        the stream the graph is launched on; on another capture stream, in a graph-internal one."""
        if not self.in_graph:
            return ("host", None) if self.stream is None else ("stream", self.stream)
        if self.stream == self.capture_origin:
            return ("stream", self.graph_stream)
        return ("graph", self.stream)

    def where(self) -> str:
        if self.stream is None:
            return "the host thread"
        if not self.in_graph:
            return f"stream {self.stream}"
        if self.stream != self.capture_origin:
            return f"capture stream {self.stream} (inside the CUDA graph)"
        if self.stream == self.graph_stream:
            return f"stream {self.stream} (CUDA graph)"
        return f"stream {self.graph_stream} (CUDA graph captured on stream {self.stream})"


@dataclass
class _Stream:
    """What the next operation on a stream must follow: (start-dep, wait-dep) point pairs.

    A full dependency is ``(E, E)``; a kernel predecessor is ``(T, E)`` so that a PDL launch
    may start after its trigger but waits for its end. ``last`` is the last op issued on it."""

    deps: list[tuple[int, int]] = field(default_factory=list)
    last: int | None = None


@dataclass
class HappensBefore:
    """The unrolled program: ops, points (with their direct predecessors) and reachability."""

    plan: Plan
    tokens: int
    ops: list[Op] = field(default_factory=list)
    preds: list[tuple[int, ...]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _anc: list[int] | None = None
    _matrix: np.ndarray | None = None

    # -- construction -------------------------------------------------------------------------
    def point(self, label: str, deps: list[int] | tuple[int, ...] = ()) -> int:
        """A new point after ``deps`` (all already created: creation order is topological)."""
        self.preds.append(tuple(sorted({d for d in deps if d is not None})))
        self.labels.append(label)
        self._anc = None
        self._matrix = None
        return len(self.preds) - 1

    # -- queries ------------------------------------------------------------------------------
    @property
    def n_points(self) -> int:
        return len(self.preds)

    def ancestors(self) -> list[int]:
        """Per point, a Python-int bitset of every point that happens before it."""
        if self._anc is None:
            anc: list[int] = []
            for deps in self.preds:
                acc = 0
                for d in deps:
                    acc |= anc[d] | (1 << d)
                anc.append(acc)
            self._anc = anc
        return self._anc

    def matrix(self) -> np.ndarray:
        """The ancestor bitsets as a packed ``uint8`` matrix (row = point, little-endian bits)
        for vectorized order tests: ``before(a, b) = M[b, a >> 3] >> (a & 7) & 1``."""
        if self._matrix is None:
            anc = self.ancestors()
            width = (self.n_points + 7) // 8
            buf = b"".join(a.to_bytes(width, "little") for a in anc)
            self._matrix = np.frombuffer(buf, dtype=np.uint8).reshape(self.n_points, width)
        return self._matrix

    def before(self, a: int, b: int) -> bool:
        """True when point ``a`` happens before point ``b`` (or is ``b``)."""
        return a == b or bool((self.ancestors()[b] >> a) & 1)


def build(plan: Plan, tokens: int = 2) -> HappensBefore:
    """Unroll ``plan``'s host program for ``tokens`` consecutive tokens into a HappensBefore.

    At the start of each token the host rewrites the staging buffer of every H2D copy (the next
    token's inputs); at its end it reads every D2H destination (sampling from the logits)."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    return _Unroller(plan, tokens).run()


class _Unroller:
    def __init__(self, plan: Plan, tokens: int) -> None:
        self.plan = plan
        self.hb = HappensBefore(plan, tokens)
        self.streams: dict[int, _Stream] = {}
        self.events: dict[int, list[tuple[int, int]]] = {}
        self.host = self.hb.point("program start")
        self.token = 0

    # -- helpers ------------------------------------------------------------------------------
    def stream(self, s: int, table: dict[int, _Stream] | None = None) -> _Stream:
        table = self.streams if table is None else table
        return table.setdefault(s, _Stream())

    def new_op(self, kind: str, name: str, stream: int | None, start: int, wait: int, trigger: int, end: int,
               **kw) -> Op:
        op = Op(len(self.hb.ops), kind, self.token, name, stream, start, wait, trigger, end, **kw)
        self.hb.ops.append(op)
        return op

    def host_step(self, label: str, deps: list[int] = ()) -> int:
        self.host = self.hb.point(f"t{self.token} host: {label}", [self.host, *deps])
        return self.host

    # -- device operations --------------------------------------------------------------------
    def kernel(self, launch: Launch, st: _Stream, issue: int, in_graph: bool, extra: list[int] = ()) -> Op:
        """Place one kernel instance after what its stream owes, with PDL relaxation."""
        name = launch.node.name
        tag = f"t{self.token} {name}"
        start_deps = [issue, *extra]
        wait_deps: list[int] = []
        for sd, wd in st.deps:
            start_deps.append(sd if launch.pdl else wd)
            wait_deps.append(wd)
        s = self.hb.point(f"{tag} start", start_deps)
        w = self.hb.point(f"{tag} griddepcontrol.wait", [s, *wait_deps]) if launch.pdl else s
        t = s if launch.trigger == "start" else self.hb.point(f"{tag} trigger ({launch.trigger})", [w])
        e = self.hb.point(f"{tag} end", [w, t])
        op = self.new_op("kernel", name, launch.stream, s, w, t, e, launch=launch, in_graph=in_graph,
                         stream_pred=st.last)
        st.deps = [(t, e)]
        st.last = op.index
        return op

    def memcpy(self, hop: HostOp, st: _Stream, issue: int) -> Op:
        name = f"{hop.kind} {hop.tensor}"
        s = self.hb.point(f"t{self.token} {name} start", [issue, *(wd for _, wd in st.deps)])
        e = self.hb.point(f"t{self.token} {name} end", [s])
        op = self.new_op("memcpy", name, hop.stream, s, s, e, e, host_op=hop, stream_pred=st.last)
        st.deps = [(e, e)]
        st.last = op.index
        return op

    def record(self, event: int, st: _Stream, events: dict[int, list[tuple[int, int]]], keep_pdl: bool) -> None:
        events[event] = list(st.deps) if keep_pdl else [(wd, wd) for _, wd in st.deps]

    def wait_event(self, event: int, st: _Stream, events: dict[int, list[tuple[int, int]]], where: str) -> None:
        if event not in events:
            note = f"{where}: waits on event {event} that was never recorded before (the wait is a no-op)"
            if note not in self.hb.notes:
                self.hb.notes.append(note)
            return
        st.deps = st.deps + events[event]

    # -- the host program ---------------------------------------------------------------------
    def run(self) -> HappensBefore:
        program = self.plan.host_program
        h2d = [h for h in program if h.kind == "memcpy_h2d"]
        d2h = [h for h in program if h.kind == "memcpy_d2h"]
        mapped = mapped_outputs(self.plan.graph, program)
        eager_events = any(h.kind in ("event_record", "stream_wait_event") for h in program)
        if any(h.kind == "launch" for h in program) and not eager_events and \
                any(la.wait_events or la.record_events for la in self.plan.launches):
            self.hb.notes.append("the launches list events but the eager host program issues no "
                                 "cudaEventRecord/cudaStreamWaitEvent: the events are not applied")
        for t in range(self.hb.tokens):
            self.token = t
            if h2d:
                p = self.host_step("rewrites host input buffers")
                for hop in h2d:
                    self.new_op("host", f"host writes {hop.tensor}", None, p, p, p, p, host_op=hop)
            for i, hop in enumerate(program):
                self.host_op(i, hop)
            if d2h:
                p = self.host_step("reads host output buffers")
                for hop in d2h:
                    self.new_op("host", f"host reads {hop.tensor}", None, p, p, p, p, host_op=hop)
            if mapped:
                p = self.host_step("reads zero-copy outputs")
                for name in mapped:
                    self.new_op("host", f"host reads {name} (zero-copy)", None, p, p, p, p,
                                reads=self.plan.graph.outputs[name])
        return self.hb

    def host_op(self, i: int, hop: HostOp) -> None:
        kind = hop.kind
        where = f"host op {i} ({kind})"
        if kind in ("memcpy_h2d", "memcpy_d2h"):
            st = self.stream(hop.stream)
            if kind == "memcpy_h2d" and hop.blocking and hop.host_buffer == "pageable":
                # cudaMemcpy from pageable memory: stream sync, stage the host buffer, return;
                # the DMA to the device may still be in flight.
                staged = self.host_step(f"stages {hop.tensor}", [wd for _, wd in st.deps])
                self.memcpy(hop, st, staged).staged_at = staged
            else:
                op = self.memcpy(hop, st, self.host)
                if hop.blocking:
                    self.host_step(f"{hop.api} returns", [op.end])
        elif kind == "launch":
            if hop.launch is None or not 0 <= hop.launch < len(self.plan.launches):
                raise PlanFormatError(f"{where}: launch index {hop.launch!r} is not in plan.launches")
            # Eagerly, the host program's own event ops are what runs (Launch.wait_events and
            # record_events describe them; under capture they are used directly).
            launch = self.plan.launches[hop.launch]
            self.kernel(launch, self.stream(launch.stream), self.host, in_graph=False)
        elif kind == "graph_launch":
            self.graph_launch(hop)
        elif kind == "event_record":
            self.record(self._event(hop, where), self.stream(hop.stream), self.events, keep_pdl=False)
        elif kind == "stream_wait_event":
            self.wait_event(self._event(hop, where), self.stream(hop.stream), self.events, where)
        elif kind == "stream_sync":
            self.host_step(f"cudaStreamSynchronize({hop.stream})", [wd for _, wd in self.stream(hop.stream).deps])
        elif kind == "device_sync":
            self.host_step("cudaDeviceSynchronize", [wd for st in self.streams.values() for _, wd in st.deps])
        else:
            raise PlanFormatError(f"{where}: unknown host op kind {kind!r}")

    @staticmethod
    def _event(hop: HostOp, where: str) -> int:
        if hop.event is None:
            raise PlanFormatError(f"{where}: event op without an event id")
        return hop.event

    def graph_launch(self, hop: HostOp) -> None:
        """One replay of the captured graph (all of plan.launches) on ``hop.stream``."""
        origin = self.stream(hop.stream)
        begin = self.hb.point(f"t{self.token} cudaGraphLaunch begin",
                              [self.host, *(wd for _, wd in origin.deps)])
        # The capture began on the stream of the first launch; other capture streams join
        # only through events (a launch on a never-forked stream depends on the launch alone).
        origin_stream = self.plan.launches[0].stream if self.plan.launches else hop.stream
        capture: dict[int, _Stream] = {origin_stream: _Stream([(begin, begin)])}
        events: dict[int, list[tuple[int, int]]] = {}
        ends = []
        for launch in self.plan.launches:
            st = self.stream(launch.stream, capture)
            for ev in launch.wait_events:
                self.wait_event(ev, st, events, f"captured launch {launch.node.name}")
            op = self.kernel(launch, st, begin, in_graph=True)
            op.graph_stream, op.capture_origin = hop.stream, origin_stream
            ends.append(op.end)
            for ev in launch.record_events:
                self.record(ev, st, events, keep_pdl=True)
        end = self.hb.point(f"t{self.token} cudaGraphLaunch end", [begin, *ends])
        origin.deps = [(end, end)]
