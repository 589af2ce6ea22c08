"""The calibrated discrete-event simulator: the default backend when there is no GPU.

It runs a Plan's per-token host program the way a CUDA process would and times it on a model
of the GPU (parameters in ``data/calibration/<gpu>.json``):

* the **host thread** issues API calls one after another; each costs the host profile's time
  (launch, graph launch, async/blocking memcpy, event record/wait) and blocking calls (stream
  sync, blocking memcpy) return only after the device work they wait for, plus a wake-up;
* **streams** run their work in order; an event wait holds a stream until the recorded work
  is done; a CUDA graph launch runs its kernels on the graph's own streams with the captured
  fork/join edges and completes when all of them have;
* two **copy engines** (H2D, D2H) run copies one at a time each;
* the **SMs** run kernels (``cost.py``): a fixed part plus work that concurrent kernels share
  (each up to its grid's cap, the whole GPU at most). A kernel launched with PDL may start
  ``pdl_launch_ns`` after its predecessor on the stream triggered (``launch_dependents``) if
  resident-thread slots allow; its prologue (and the work before ``griddepcontrol.wait``)
  overlaps the predecessor, the rest waits for the predecessor to complete;
* kernels launched **eagerly** (no graph) pay the GPU front end's share: a larger gap after
  their predecessor, one more channel switch per other stream holding issued work, the eager
  gap after an event wait, a later early start (the front end's launch work, overlapped with
  the running predecessor) and a later release of a PDL wait (``Calibration.eager_*``);
* **conservation**: a kernel's work never ends before the GPU share it got covers it, and the
  whole trace is checked against the Plans' bytes / bandwidth floor (``floor.py``).

Under graph replay every token's device schedule repeats: when a replay starts on an idle GPU
and the host program cannot launch more work before it syncs on that stream, the replay's
kernel timings are those of the first such replay of the same Plan, shifted, so they are reused
instead of recomputed (exactly what a full simulation gives; ``memo=False`` checks it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..models import ModelConfig
from ..models.blocks import MASK_INPUT
from ..strategy import HostOp, Launch, Plan, Strategy
from ..strategy.steps import plans_for_steps
from ..trace import API_ROW, Trace, stream_row
from .calibration import Calibration
from .cost import KernelCost, kernel_cost, memcpy_ns
from .floor import check_conservation, floor_of

# stream-op kinds
KERNEL, MEMCPY, WAIT, GRAPH = 0, 1, 2, 3
# heap actions
_TRY, _PROLOGUE, _SEGMENT, _GATE, _END, _GRAPH_START, _DELAY = range(7)
#: engine keys of a graph's internal streams: base + the Plan's stream id
_GRAPH_STREAMS = 1 << 20
_NAN = math.nan
HOST_TID = 1
PID = 1


@dataclass
class _Kernel:
    """A kernel that has started: its cost and where it is in its steps."""

    cost: KernelCost
    steps: list[tuple[str, float]]   # ("work", amount) / ("gate", 0) / ("delay", ns) / ("trigger", 0)
    i: int
    tail_ns: float
    pdl_pred: int                    # the kernel it may overlap (PDL), -1 if none
    gate_open: bool = False


class _Rows:
    """Column builder for the Trace: strings interned as codes; replays of a memoized graph kept
    as (template, offset) pairs and expanded with numpy at the end."""

    COLS = ("row", "kind", "name", "start", "end", "stream", "corr", "token", "node", "bytes", "copy",
            "graph", "tid", "device")

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.strings: list[str] = []
        self.cols: dict[str, list] = {c: [] for c in self.COLS}
        #: template id -> (template columns, [(t0, corr, token, graph_id), ...])
        self.replays: dict[int, tuple[dict[str, np.ndarray], list[tuple[float, int, int, int]]]] = {}

    def code(self, s: str) -> int:
        c = self.codes.get(s)
        if c is None:
            c = self.codes[s] = len(self.strings)
            self.strings.append(s)
        return c

    def add(self, row: int, kind: int, name: int, start: float, end: float, stream: int = -1, corr: int = -1,
            token: int = -1, node: int = 0, nbytes: int = 0, copy: int = 0, graph: int = 0,
            tid: int = -1, device: int = -1) -> None:
        c = self.cols
        c["row"].append(row)
        c["kind"].append(kind)
        c["name"].append(name)
        c["start"].append(start)
        c["end"].append(end)
        c["stream"].append(stream)
        c["corr"].append(corr)
        c["token"].append(token)
        c["node"].append(node)
        c["bytes"].append(nbytes)
        c["copy"].append(copy)
        c["graph"].append(graph)
        c["tid"].append(tid)
        c["device"].append(device)

    def replay(self, key: int, template: dict[str, np.ndarray], t0: float, corr: int, token: int, graph: int) -> None:
        self.replays.setdefault(key, (template, []))[1].append((t0, corr, token, graph))

    def __len__(self) -> int:
        return len(self.cols["row"]) + sum(len(t["start"]) * len(r) for t, r in self.replays.values())

    def _parts(self) -> list[dict[str, np.ndarray]]:
        parts = [{k: np.asarray(v) for k, v in self.cols.items()}] if self.cols["row"] else []
        for tpl, reps in self.replays.values():
            n, m = len(tpl["start"]), len(reps)
            t0, corr, token, graph = (np.array(x) for x in zip(*reps))
            part = {k: np.tile(v, m) for k, v in tpl.items() if k not in ("start", "end")}
            part["start"] = (tpl["start"][None, :] + t0[:, None]).ravel()
            part["end"] = (tpl["end"][None, :] + t0[:, None]).ravel()
            part["corr"], part["token"], part["graph"] = (np.repeat(x, n) for x in (corr, token, graph))
            parts.append(part)
        return parts

    def frame(self) -> pd.DataFrame:
        """The event table, sorted by (start, end) as ``Trace`` keeps it."""
        parts = self._parts()
        if not parts:
            return pd.DataFrame({c: [] for c in ("row", "kind", "name", "start_ns", "end_ns")})
        col = {k: np.concatenate([p[k] for p in parts]) for k in self.COLS}
        start, end = np.rint(col["start"]).astype(np.int64), np.rint(col["end"]).astype(np.int64)
        order = np.lexsort((end, start))
        strings = np.array(self.strings, dtype=object)

        def text(k: str) -> np.ndarray:
            return strings[col[k].astype(np.int64)[order]]

        def ints(k: str) -> np.ndarray:
            return col[k].astype(np.int64)[order]

        return pd.DataFrame({
            "row": text("row"), "kind": text("kind"), "name": text("name"),
            "start_ns": start[order], "end_ns": end[order], "stream": ints("stream"), "corr_id": ints("corr"),
            "token": ints("token"), "node": text("node"), "bytes": ints("bytes"), "copy_kind": text("copy"),
            "graph_id": ints("graph"), "tid": ints("tid"), "pid": np.full(len(start), PID, np.int64),
            "device": ints("device"),
        })


class _PlanInfo:
    """What the engine precomputes once per Plan: kernel costs and trace codes per launch."""

    def __init__(self, plan: Plan, cal: Calibration, rows: _Rows) -> None:
        self.launches: list[Launch] = plan.launches
        self.costs: list[KernelCost] = [kernel_cost(la.node, cal) for la in plan.launches]
        self.name_codes = [rows.code(c.name) for c in self.costs]
        self.node_codes = [rows.code(la.node.name) for la in plan.launches]
        self.row_codes = [rows.code(stream_row(la.stream)) for la in plan.launches]
        self.replay_exclusive = _replay_is_exclusive(plan.host_program)
        #: bytes of attention mask the host fills and copies each token (``mask_fill_ns_per_byte``)
        self.mask_bytes = sum(op.nbytes for op in plan.host_program
                              if op.kind == "memcpy_h2d" and (op.tensor or "").startswith(MASK_INPUT))


def _replay_is_exclusive(program: Sequence[HostOp]) -> bool:
    """True if, after its graph launch, the host program syncs on the launch stream before it
    launches anything else: then nothing can run beside a replay that starts on an idle GPU."""
    seen = None
    for op in program:
        if seen is None:
            if op.kind == "graph_launch":
                seen = op.stream
            continue
        if op.kind in ("launch", "graph_launch"):
            return False
        if op.kind == "device_sync" or (op.stream == seen and (
                op.kind == "stream_sync" or (op.kind.startswith("memcpy") and op.blocking))):
            return True
    return False


class _Engine:
    """Host thread + device (streams, copy engines, SMs) driven by one event heap."""

    def __init__(self, cal: Calibration, memo: bool = True) -> None:
        self.cal = cal
        self.memo_enabled = memo
        self.rows = _Rows()
        r = self.rows
        r.code("")
        self.K_API, self.K_SYNC, self.K_KERNEL, self.K_MEMCPY = (r.code(k) for k in ("api", "sync", "kernel", "memcpy"))
        self.ROW_API = r.code(API_ROW)
        self.H2D, self.D2H = r.code("H2D"), r.code("D2H")
        # device
        self.now = 0.0
        self.heap: list[tuple] = []
        self.seq = 0
        self.kind: list[int] = []
        self.stream: list[int] = []
        self.ready: list[float] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.trig: list[float] = []
        self.prev: list[int] = []
        self.deps: list[tuple[int, ...]] = []  # ops a kernel fully depends on (event waits before it)
        self.pending_waits: dict[int, list[int]] = {}
        self.data: list = []           # per op: launch index / (bytes, h2d) / event dep / plan
        self.corr: list[int] = []
        self.token: list[int] = []
        self.graph_of: list[int] = []  # graph op an internal op belongs to, -1 otherwise
        self.pinfo_of: list[_PlanInfo | None] = []
        self.queues: dict[int, deque[int]] = {}
        self.last_op: dict[int, int] = {}
        self.pending_try: dict[int, float] = {}
        self.done_waiters: dict[int, list[tuple[int, int]]] = {}
        self.running: dict[int, _Kernel] = {}
        self.holders: dict[int, float] = {}
        self.occ = 0.0
        self.res_wait: list[int] = []
        self.fluid: dict[int, list[float]] = {}   # op -> [remaining, rate, cap, version, amount]
        self.fluid_t = 0.0
        self.fluid_version = 0  # one counter for all segments: a stale _SEGMENT never matches a later one
        self.engine_free = [0.0, 0.0]               # H2D, D2H copy engines
        self.graph_left: dict[int, int] = {}        # graph op -> internal ops not yet complete
        self.graph_events: dict[int, int] = {}
        self.graph_id_of: dict[int, int] = {}
        self.memo: dict[int, tuple[float, dict[str, np.ndarray]]] = {}
        self.recording: tuple[int, int, float, list] | None = None  # (graph op, plan id, t0, rows)
        self.exclusive_until = -math.inf
        # host
        self.host_t = 0.0
        self.next_corr = 1
        self.events: dict[int, int] = {}
        self.graph_plan: Plan | None = None
        self.graph_id = 0
        self.infos: dict[int, _PlanInfo] = {}
        self.n_device_events = 0

    # ---------------------------------------------------------------------------------------
    # host thread
    # ---------------------------------------------------------------------------------------
    def info(self, plan: Plan) -> _PlanInfo:
        pi = self.infos.get(id(plan))
        if pi is None:
            pi = self.infos[id(plan)] = _PlanInfo(plan, self.cal, self.rows)
        return pi

    def _api(self, name: str, t0: float, t1: float, token: int, node: str = "", stream: int = -1,
             kind: int | None = None, corr: int | None = None) -> int:
        """One host API call row; returns its correlation id (a new one unless given)."""
        if corr is None:
            corr = self._corr()
        r = self.rows
        r.add(self.ROW_API, self.K_API if kind is None else kind, r.code(name), t0, t1, stream, corr, token,
              r.code(node), 0, 0, 0, HOST_TID, -1)
        return corr

    def _corr(self) -> int:
        self.next_corr += 1
        return self.next_corr - 1

    def run_token(self, plan: Plan, token: int) -> None:
        """Issue one token's host program (capturing the graph first if it changed)."""
        h, pi = self.cal.host, self.info(plan)
        # host work outside CUDA calls (inputs, staging, logits), and filling the attention mask(s)
        self.host_t += h.token_overhead_ns + h.mask_fill_ns_per_byte * pi.mask_bytes
        for op in plan.host_program:
            t0 = self.host_t
            k = op.kind
            if k in ("memcpy_h2d", "memcpy_d2h"):
                h2d = k == "memcpy_h2d"
                cost = h.memcpy_blocking_ns if op.blocking else h.memcpy_async_ns
                corr = self._corr()
                o = self._enqueue(MEMCPY, op.stream, t0 + cost, (op.nbytes, h2d, op.tensor or "",
                                                                  op.host_buffer or "pageable"), corr, token)
                t1 = t0 + cost
                if op.blocking:
                    t1 = max(t1, self._wait_for(o) + h.sync_wakeup_ns)
                self._api(op.api, t0, t1, token, op.tensor or "", op.stream, corr=corr)
            elif k == "stream_sync":
                self._flush_waits(op.stream, t0, -1, token)
                last = self.last_op.get(op.stream, -1)
                done = self._wait_for(last) if last >= 0 else -math.inf
                t1 = t0 + h.stream_sync_ns
                if done > t0:
                    t1 = max(t1, done + h.sync_wakeup_ns)
                self._api(op.api, t0, t1, token, "", op.stream, kind=self.K_SYNC)
            elif k == "device_sync":
                for st in [st for st, w in self.pending_waits.items() if w]:
                    self._flush_waits(st, t0, -1, token)
                lasts = [o for st, o in self.last_op.items() if st < _GRAPH_STREAMS and o >= 0]
                done = max((self._wait_for(o) for o in lasts), default=-math.inf)
                t1 = t0 + h.stream_sync_ns
                if done > t0:
                    t1 = max(t1, done + h.sync_wakeup_ns)
                self._api(op.api, t0, t1, token, "", -1, kind=self.K_SYNC)
            elif k == "launch":
                la = plan.launches[op.launch]
                t1 = t0 + (h.launch_pdl_ns if la.pdl else h.launch_ns)
                corr = self._api(op.api, t0, t1, token, la.node.name, la.stream)
                self._enqueue(KERNEL, la.stream, t1 + self.cal.launch_latency_ns, la.index, corr, token, pi)
            elif k == "graph_launch":
                if self.graph_plan is not plan:
                    self._capture(plan, token)
                    t0 = self.host_t
                t1 = t0 + h.graph_launch_ns + h.graph_stream_ns * (plan.n_streams - 1)
                corr = self._api(op.api, t0, t1, token, "", op.stream)
                g = self._enqueue(GRAPH, op.stream, t1 + self.cal.graph_launch_latency_ns, plan, corr, token, pi)
                self.graph_id_of[g] = self.graph_id
            elif k == "event_record":
                t1 = t0 + h.event_record_ns
                self._api(op.api, t0, t1, token, "", op.stream)
                self.events[op.event] = self.last_op.get(op.stream, -1)
            elif k == "stream_wait_event":
                t1 = t0 + h.stream_wait_event_ns
                self._api(op.api, t0, t1, token, "", op.stream)
                self._wait_event(op.stream, self.events.get(op.event, -1))
            else:
                raise ValueError(f"simulator: unknown host op kind {k!r} in the plan's host program")
            self.host_t = t1

    def _capture(self, plan: Plan, token: int) -> None:
        """Stream capture of the plan's launches, then instantiation (host cost only)."""
        h = self.cal.host
        t = self.host_t
        t = self._api_span("cudaStreamBeginCapture", t, h.capture_ns, token)
        for la in plan.launches:
            for _ in la.wait_events:
                t = self._api_span("cudaStreamWaitEvent", t, h.stream_wait_event_ns, token, stream=la.stream)
            name = "cuLaunchKernelEx" if la.pdl else "cudaLaunchKernel"
            t = self._api_span(name, t, h.launch_pdl_ns if la.pdl else h.launch_ns, token, la.node.name, la.stream)
            for _ in la.record_events:
                t = self._api_span("cudaEventRecord", t, h.event_record_ns, token, stream=la.stream)
        t = self._api_span("cudaStreamEndCapture", t, h.capture_ns, token)
        cost = h.graph_instantiate_ns + h.graph_instantiate_per_node_ns * len(plan.launches)
        t = self._api_span("cudaGraphInstantiate", t, cost, token)
        self.host_t = t
        self.graph_plan = plan
        self.graph_id += 1

    def _api_span(self, name: str, t: float, cost: float, token: int, node: str = "", stream: int = -1) -> float:
        self._api(name, t, t + cost, token, node, stream)
        return t + cost

    def _wait_for(self, op: int) -> float:
        """Advance the device until ``op`` completes; its end time."""
        end = self.end
        while end[op] != end[op]:
            if not self.heap:
                raise RuntimeError("simulator deadlock: the host waits for device work that can never run "
                                   "(an event waited on before it is recorded on another stream?)")
            self._step()
        return end[op]

    def drain(self) -> None:
        while self.heap:
            self._step()
        stuck = [s for s, q in self.queues.items() if q]
        if stuck:
            raise RuntimeError(f"simulator deadlock: work left on stream(s) {stuck} that can never start")

    # ---------------------------------------------------------------------------------------
    # device: stream ops
    # ---------------------------------------------------------------------------------------
    def _new_op(self, kind: int, stream: int, ready: float, data, corr: int, token: int,
                pi: _PlanInfo | None = None, graph: int = -1) -> int:
        if kind != KERNEL and kind != WAIT and self.pending_waits.get(stream):
            self._flush_waits(stream, ready, corr, token, graph)
        o = len(self.kind)
        self.kind.append(kind)
        self.stream.append(stream)
        self.ready.append(ready)
        self.start.append(_NAN)
        self.end.append(_NAN)
        self.trig.append(_NAN)
        self.data.append(data)
        self.corr.append(corr)
        self.token.append(token)
        self.graph_of.append(graph)
        self.pinfo_of.append(pi)
        self.prev.append(self.last_op.get(stream, -1))
        self.deps.append(tuple(self.pending_waits.pop(stream, ())) if kind == KERNEL else ())
        self.last_op[stream] = o
        q = self.queues.get(stream)
        if q is None:
            q = self.queues[stream] = deque()
        q.append(o)
        return o

    def _wait_event(self, stream: int, dep: int) -> None:
        """``cudaStreamWaitEvent``: the next kernel on ``stream`` depends on ``dep`` (the work the
        event recorded). Folded into that kernel, so a PDL edge to the kernel before it survives,
        as in a captured graph; any other op gets an explicit wait marker."""
        if dep >= 0:
            self.pending_waits.setdefault(stream, []).append(dep)

    def _flush_waits(self, stream: int, ready: float, corr: int, token: int, graph: int = -1) -> None:
        """Turn pending event waits of ``stream`` into wait markers on the stream."""
        for dep in self.pending_waits.pop(stream, ()):
            self._new_op(WAIT, stream, ready, dep, corr, token, None, graph)
            if graph >= 0:
                self.graph_left[graph] += 1
            if len(self.queues[stream]) == 1:
                self._try(stream)

    def _enqueue(self, kind: int, stream: int, ready: float, data, corr: int, token: int,
                 pi: _PlanInfo | None = None) -> int:
        o = self._new_op(kind, stream, ready, data, corr, token, pi)
        if len(self.queues[stream]) == 1:
            self._try(stream)
        return o

    def _push(self, t: float, action: int, a: int, b: float = 0.0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, action, a, b))

    def _step(self) -> None:
        t, _, action, a, b = heapq.heappop(self.heap)
        self.now = t
        self.n_device_events += 1
        if action == _TRY:
            if self.pending_try.get(a) == t:
                del self.pending_try[a]
                self._try(a)
        elif action == _PROLOGUE or action == _DELAY:  # a kernel's next step is due
            self._advance_kernel(a)
        elif action == _SEGMENT:
            f = self.fluid.get(a)
            if f is not None and f[3] == b:
                self._fluid_remove(a)
                self._advance_kernel(a)
        elif action == _GATE:
            self.running[a].gate_open = True
            self._advance_kernel(a)
        elif action == _END:
            self._end(a)
        elif action == _GRAPH_START:
            self._graph_start(a)

    def _retry_at(self, s: int, t: float) -> None:
        p = self.pending_try.get(s)
        if p is None or t < p:
            self.pending_try[s] = t
            self._push(t, _TRY, s)

    def _try(self, s: int) -> None:
        """Start the first not-yet-started op of stream ``s`` if everything it waits for is done."""
        q = self.queues.get(s)
        if not q:
            return
        o = q[0]
        cal = self.cal
        kind = self.kind[o]
        t = max(self.now, self.ready[o])
        ev_gap = cal.dependency_gap_ns if self.graph_of[o] >= 0 else cal.eager_event_gap
        for d in self.deps[o]:
            de = self.end[d]
            if de != de:
                self.done_waiters.setdefault(d, []).append((_TRY, s))
                return
            t = max(t, de + ev_gap)
        pred = self.prev[o]
        pdl_pred = -1
        if pred >= 0:
            pe = self.end[pred]
            if self.graph_of[o] >= 0:
                gap = cal.dependency_gap_ns
            else:  # eager launch: the front end's work, after its turns on other streams' channels
                gap = cal.eager_gap_ns
                if cal.eager_channel_switch_ns and len(self.queues) > 1:
                    now, ready = self.now, self.ready  # issued by the host by now: the head's ready time passed
                    gap += cal.eager_channel_switch_ns * sum(
                        1 for st, oq in self.queues.items() if oq and st != s and st < _GRAPH_STREAMS
                        and ready[oq[0]] <= now)
            if kind == KERNEL and self.kind[pred] == KERNEL and self._launch(o).pdl:
                tr = self.trig[pred]
                cand = math.inf
                if tr == tr:
                    cand = tr + (cal.pdl_launch_ns if self.graph_of[o] >= 0 else cal.eager_pdl_launch)
                if pe == pe:
                    cand = min(cand, pe + gap)
                if cand == math.inf:
                    return  # retried when pred triggers or ends
                t = max(t, cand)
                pdl_pred = pred
            else:
                if pe != pe:
                    return  # retried when pred ends
                t = max(t, pe if kind == WAIT else pe + gap)
        if kind == WAIT:
            dep = self.data[o]
            if dep >= 0:
                de = self.end[dep]
                if de != de:
                    self.done_waiters.setdefault(dep, []).append((_TRY, s))
                    return
                t = max(t, de)
            q.popleft()
            self.start[o] = t
            self._push(t, _END, o)
            return
        if kind == MEMCPY:
            nbytes, h2d, _, _ = self.data[o]
            e = 0 if h2d else 1
            st = max(t, self.engine_free[e])
            en = st + memcpy_ns(nbytes, cal)
            self.engine_free[e] = en
            q.popleft()
            self.start[o] = st
            self._push(en, _END, o)
            return
        if t > self.now:
            self._retry_at(s, t)
            return
        if kind == GRAPH:
            q.popleft()
            self.start[o] = t
            self._graph_start(o)
            return
        # a kernel: needs free resident-thread slots
        if self.holders and self.occ >= 1.0 - 1e-9:
            if s not in self.res_wait:
                self.res_wait.append(s)
            return
        q.popleft()
        self._start_kernel(o, pdl_pred)

    def _launch(self, o: int) -> Launch:
        return self.pinfo_of[o].launches[self.data[o]]

    # ---------------------------------------------------------------------------------------
    # device: kernels
    # ---------------------------------------------------------------------------------------
    def _start_kernel(self, o: int, pdl_pred: int) -> None:
        cal = self.cal
        if self.now < self.exclusive_until - 1e-6:
            raise RuntimeError("simulator: a kernel started during a reused graph replay (internal error)")
        if self.recording is not None and self.graph_of[o] != self.recording[0]:
            self.recording = None  # something ran beside the replay: do not reuse its timings
        pi = self.pinfo_of[o]
        la = self._launch(o)
        cost = pi.costs[la.index]
        self.start[o] = self.now
        self.holders[o] = cost.occupancy
        self.occ += cost.occupancy
        pdl = la.pdl and pdl_pred >= 0
        wait = la.wait if pdl else "start"
        pre = cost.pdl_prologue_ns + (cal.pdl_first_read_setup_ns if wait != "start" else 0.0)
        pre_work = cost.work_ns * cal.pdl_late_read_fraction if wait == "late" else 0.0
        rest = cost.work_ns - pre_work
        if pdl and (cost.early_scale != 1.0 or cost.early_ns) and self.end[pdl_pred] != self.end[pdl_pred] \
                and self._launch(pdl_pred).trigger == "start":
            # launched while the predecessor's main loop runs: its blocks take SM slots as the
            # predecessor's retire, unevenly, and its main loop runs that much slower
            rest = rest * cost.early_scale + cost.early_ns * cost.cap
        steps: list[tuple[str, float]] = [("work", pre_work), ("gate", 0.0)]
        # what a first-read kernel does before its wait (index arithmetic, a mat-vec's first weight
        # loads: ``pdl_first_read_setup_ns``, overlapped with the predecessor in ``pre``) comes after
        # the wait, before the main loop, when the kernel waits at its start (as llama.cpp's do)
        setup = cal.pdl_first_read_setup_ns if pdl and wait == "start" else 0.0
        if setup:
            steps.append(("delay", setup))
        trigger = la.trigger
        if trigger == "after-main-loop":
            steps += [("work", rest * (1.0 - cost.write_fraction)), ("trigger", 0.0),
                      ("work", rest * cost.write_fraction)]
        elif trigger == "end":
            steps += [("work", rest), ("trigger", 0.0)]
        else:
            steps.append(("work", rest))
        self.running[o] = _Kernel(cost, steps, 0, cost.fixed_ns - pre - setup, pdl_pred if pdl else -1)
        if trigger == "start":
            self._trigger(o)
        self._push(self.now + pre, _PROLOGUE, o)

    def _trigger(self, o: int) -> None:
        self.trig[o] = self.now
        s = self.stream[o]
        q = self.queues.get(s)
        if q and self.prev[q[0]] == o:
            self._try(s)

    def _advance_kernel(self, o: int) -> None:
        k = self.running[o]
        steps = k.steps
        while k.i < len(steps):
            what, amount = steps[k.i]
            if what == "work":
                k.i += 1
                if amount > 0:
                    self._fluid_add(o, amount, k.cost.cap)
                    return
            elif what == "gate":
                if not k.gate_open and k.pdl_pred >= 0:
                    pe = self.end[k.pdl_pred]
                    if pe != pe:
                        self.done_waiters.setdefault(k.pdl_pred, []).append((_GATE, o))
                        return
                    g = pe + (self.cal.pdl_release_ns if self.graph_of[o] >= 0 else self.cal.eager_pdl_release)
                    if g > self.now:
                        self._push(g, _GATE, o)
                        return
                k.gate_open = True
                k.i += 1
            elif what == "delay":
                k.i += 1
                self._push(self.now + amount, _DELAY, o)
                return
            else:  # trigger
                k.i += 1
                self._trigger(o)
        # tail: blocks retire, slots are free for others
        self.occ -= self.holders.pop(o)
        if not self.holders:
            self.occ = 0.0
        if self.res_wait:
            waiting, self.res_wait = self.res_wait, []
            for s in waiting:
                self._try(s)
        self._push(self.now + k.tail_ns, _END, o)

    # fluid sharing of the GPU among kernels in their work phase ----------------------------
    def _fluid_sync(self) -> None:
        dt = self.now - self.fluid_t
        if dt > 0:
            for f in self.fluid.values():
                f[0] -= f[1] * dt
        self.fluid_t = self.now

    def _fluid_add(self, o: int, amount: float, cap: float) -> None:
        self._fluid_sync()
        self.fluid[o] = [amount, 0.0, cap, -1.0, amount]
        self._reflow()

    def _fluid_remove(self, o: int) -> None:
        """End a work segment, checking conservation: the rate it got, integrated over time, covers
        its work (a kernel never finishes bytes it has not moved, whatever PDL or streams overlap)."""
        self._fluid_sync()
        f = self.fluid.pop(o)
        if f[0] > 1e-6 * f[4] + 1e-3:
            raise RuntimeError(f"simulator: conservation violated: a work segment of "
                               f"{self._launch(o).node.name} ended with {f[0]:.1f} of {f[4]:.1f} ns of work "
                               "left (internal error)")
        if self.fluid:
            self._reflow()


    def _reflow(self) -> None:
        """Water-filling: each kernel gets min(cap, fair share of what is left)."""
        fl = self.fluid
        if len(fl) == 1:
            (o, f), = fl.items()
            if f[1] != f[2]:
                f[1] = f[2]
                self.fluid_version += 1
                f[3] = self.fluid_version
                self._push(self.now + max(f[0], 0.0) / f[1], _SEGMENT, o, f[3])
            return
        left = 1.0
        items = sorted(fl.items(), key=lambda kv: kv[1][2])
        n = len(items)
        for j, (o, f) in enumerate(items):
            r = min(f[2], left / (n - j))
            left -= r
            if r != f[1]:
                f[1] = r
                self.fluid_version += 1
                f[3] = self.fluid_version
                self._push(self.now + max(f[0], 0.0) / r, _SEGMENT, o, f[3])

    # completion ------------------------------------------------------------------------------
    def _end(self, o: int) -> None:
        self.end[o] = self.now
        kind = self.kind[o]
        r = self.rows
        s = self.stream[o]
        g = self.graph_of[o]
        if kind == KERNEL:
            del self.running[o]
            pi = self.pinfo_of[o]
            i = self.data[o]
            ps = s - _GRAPH_STREAMS if g >= 0 else s
            gid = self.graph_id_of.get(g, 0) if g >= 0 else 0
            r.add(pi.row_codes[i], self.K_KERNEL, pi.name_codes[i], self.start[o], self.now, ps, self.corr[o],
                  self.token[o], pi.node_codes[i], 0, 0, gid, -1, 0)
            rec = self.recording
            if rec is not None and g == rec[0]:
                rec[3].append((self.start[o] - rec[2], self.now - rec[2], ps, pi.row_codes[i], pi.name_codes[i],
                               pi.node_codes[i]))
        elif kind == MEMCPY:
            nbytes, h2d, tensor, hostbuf = self.data[o]
            host = "Pinned" if hostbuf == "pinned" else "Pageable"
            name = f"[CUDA memcpy Host-to-Device] ({host})" if h2d else f"[CUDA memcpy Device-to-Host] ({host})"
            r.add(r.code(stream_row(s)), self.K_MEMCPY, r.code(name), self.start[o], self.now, s, self.corr[o],
                  self.token[o], r.code(tensor), nbytes, self.H2D if h2d else self.D2H, 0, -1, 0)
        elif kind == GRAPH:
            self._graph_end(o)
        for action, x in self.done_waiters.pop(o, ()):
            if action == _TRY:
                self._try(x)
            else:
                self._advance_kernel(x)  # the gate opens pdl_release_ns after this end
        if g >= 0:
            self.graph_left[g] -= 1
            if self.graph_left[g] == 0:
                self._push(self.now, _END, g)
        self._try(s)

    # ---------------------------------------------------------------------------------------
    # device: CUDA graphs
    # ---------------------------------------------------------------------------------------
    def _graph_start(self, g: int) -> None:
        plan: Plan = self.data[g]
        pi = self.pinfo_of[g]
        key = id(plan)
        exclusive = (self.memo_enabled and pi.replay_exclusive and not self.holders and not self.fluid
                     and not any(self.kind[o] in (KERNEL, GRAPH) for q in self.queues.values() for o in q))
        memo = self.memo.get(key) if exclusive else None
        if memo is not None:
            makespan, template = memo
            self._emit_replay(g, key, template)
            self.graph_left[g] = 0
            self.exclusive_until = self.now + makespan
            self._push(self.now + makespan, _END, g)
            return
        if exclusive:
            self.recording = (g, key, self.now, [])
        self.graph_events = {}
        n = 0
        for la in plan.launches:
            s = _GRAPH_STREAMS + la.stream
            for e in la.wait_events:
                self._wait_event(s, self.graph_events.get(e, -1))
            o = self._new_op(KERNEL, s, self.now, la.index, self.corr[g], self.token[g], pi, g)
            n += 1
            for e in la.record_events:
                self.graph_events[e] = o
        for ps in {la.stream for la in plan.launches}:
            self.pending_waits.pop(_GRAPH_STREAMS + ps, None)  # a wait with no kernel after it orders nothing
        self.graph_left[g] = n
        if n == 0:
            self._push(self.now, _END, g)
            return
        for ps in sorted({la.stream for la in plan.launches}):
            self._try(_GRAPH_STREAMS + ps)

    def _graph_end(self, g: int) -> None:
        for ps in list(self.queues):
            if ps >= _GRAPH_STREAMS:
                self.last_op.pop(ps, None)
        rec = self.recording
        if rec is not None and rec[0] == g:
            self.recording = None
            rows = rec[3]
            n = len(rows)
            arr = np.array([x[:3] for x in rows], dtype=np.float64).reshape(-1, 3)
            codes = np.array([x[3:] for x in rows], dtype=np.int64).reshape(-1, 3)
            template = {"start": arr[:, 0], "end": arr[:, 1], "stream": arr[:, 2].astype(np.int64),
                        "row": codes[:, 0], "name": codes[:, 1], "node": codes[:, 2],
                        "kind": np.full(n, self.K_KERNEL, np.int64), "bytes": np.zeros(n, np.int64),
                        "copy": np.zeros(n, np.int64), "tid": np.full(n, -1, np.int64),
                        "device": np.zeros(n, np.int64)}
            self.memo[rec[1]] = (self.now - rec[2], template)

    def _emit_replay(self, g: int, key: int, template: dict[str, np.ndarray]) -> None:
        self.rows.replay(key, template, self.now, self.corr[g], self.token[g], self.graph_id_of[g])


def simulate(plans: Sequence[Plan], cal: Calibration, *, memo: bool = True) -> Trace:
    """Simulate one token per Plan in ``plans`` (the same Plan object repeats while the KV
    length keeps the graph's shape) and return the trace."""
    eng = _Engine(cal, memo=memo)
    for token, plan in enumerate(plans):
        eng.run_token(plan, token)
    eng.drain()
    trace = Trace(eng.rows.frame(), {
        "source": "sim", "gpu": cal.gpu, "device": cal.device_label, "host_profile": cal.host_profile,
        "device_events": eng.n_device_events,
    })
    check_conservation(trace, plans, cal, {k: floor_of(pi.costs, cal) for k, pi in eng.infos.items()})
    return trace


def simulate_steps(cfg: ModelConfig, strategy: Strategy, n_tokens: int, cal: Calibration, start_pos: int = 0,
                   memo: bool = True) -> Trace:
    """``simulate`` over the Plans of ``n_tokens`` steps from ``start_pos`` (``plans_for_steps``):
    for library code that needs a simulated timing without a Run (calibration fits and checks)."""
    return simulate(plans_for_steps(cfg, strategy, n_tokens, start_pos, cal.compute_capability), cal, memo=memo)
