"""The ``cuda`` backend: a Plan executed on a real GPU with the kernels of ``kernels/``.

Everything a knob changes comes from the Plan (``workbench.strategy.compile``), executed as
written:

* **memory**: one allocation for the persistent buffers (weights, constants, caches, inputs,
  outputs) and one for the Plan's arena, so scratch buffers share bytes exactly as the
  allocator placed them (an unsafe allocator can really race); every view's offset and
  strides go to the kernels unchanged (copy elimination is just the rewritten graph's views);
* **host program**: the per-token HostOps in order: stream syncs, blocking copies from pageable
  staging (``per-copy``) or async copies from pinned staging (``boundary``/``implicit``), one
  launch per kernel with the event records and waits of the fork/join (eager), or one
  ``cudaGraphLaunch``, then the async D2H of the logits and the final sync (``--logits
  zero-copy``: no D2H, the logits' kernel stores into their pinned staging, mapped by UVA);
* **graphs**: captured once per KV length (CuPy stream capture of the Plan's launches on its
  streams, events included) and replayed per token; a step whose padded KV length grows past
  the captured one gets its own Plan and capture;
* **PDL**: launches through ``cuLaunchKernelEx`` with programmatic stream serialization, each
  kernel compiled for its launch's (wait, trigger) placement.

``CudaExecutor`` holds the device state (useful to replay a token or snapshot caches);
``workbench.exec.cuda_backend.CudaBackend`` runs it behind the Backend interface.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..graph import DTYPES, Graph, View
from ..models import ModelConfig, build_graph
from ..models.blocks import step_input_names, write_step_inputs
from ..models.weights import device_weight, model_weights, to_storage
from ..strategy import HostOp, Plan, Strategy
from ..strategy.host import kernel_launches, mapped_outputs
from ..strategy.steps import plan_for
from .cuda_ops import KernelCall, bind
from .device import device_info
from .kernels import CudaBackendError, LaunchHandle, NumbaLaunch, module_cache, numba_module, require_cupy
from .launch_state import settle_launch_state

KERNEL_SETS = ("cupy", "numba")
#: persistent buffers are placed at this alignment inside their allocation
ALIGN = 256
#: share of the free GPU memory a run may plan to use (the rest: CUDA context, CuPy pool, graphs)
MEMORY_HEADROOM = 0.92
H2D, D2H = 1, 2


def memory_need(graph: Graph) -> int:
    """GPU bytes an executor of this graph allocates at most: every buffer aligned, scratch
    counted as if nothing were reused (an upper bound of any allocator's arena)."""
    return sum(_align(b.nbytes) for b in graph.buffers().values())


@dataclass
class _Bound:
    """A Plan made runnable: one prepared launch per Plan launch, the kernel calls (for traces
    and tests), the captured CUDA graph once there is one, and the host program prepared: each
    HostOp as a call with its pointers resolved, the step inputs as typed views of the staging
    memory their copies read, and the logits' staging. A token then costs the host what its
    API calls cost (llama.cpp's ``llama_decode`` is C++), not a lookup per op."""

    plan: Plan
    handles: list[Any]
    calls: list[KernelCall]
    graph: Any = None
    arena_ptr: int = 0
    host: list[tuple[HostOp, Callable[[], Any]]] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    logits: np.ndarray | None = None


@dataclass
class _Staging:
    """Host memory of one graph input/output: pinned (async copies) and pageable (blocking)."""

    pinned: np.ndarray
    pageable: np.ndarray
    nbytes: int = 0


@dataclass
class StepTimes:
    """Host wall-clock per token (each token ends with a stream sync, so this is the token's time)."""

    start_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)

    @property
    def us(self) -> np.ndarray:
        return (np.asarray(self.end_ns) - np.asarray(self.start_ns)) / 1e3


class CudaExecutor:
    """Device state of one model under one strategy: memory, streams, events, compiled kernels
    and bound Plans (one per KV length)."""

    def __init__(self, cfg: ModelConfig, strategy: Strategy, weights: dict[str, np.ndarray] | str | None = None,
                 seed: int = 0, kernels: str = "cupy", share: CudaExecutor | None = None) -> None:
        """``weights``: HF-named storage arrays, None for ``model_weights(cfg, seed)`` (the reference's:
        the checkpoint's safetensors for a config read from its folder, else random),
        or ``"device"`` for the same distributions drawn on the GPU (large models in seconds);
        ``share``: an executor of the same model whose device weights this one reuses (its caches
        are zeroed here: run one executor at a time)."""
        if kernels not in KERNEL_SETS:
            raise ValueError(f"--kernels {kernels!r} is not one of {', '.join(KERNEL_SETS)}")
        cp, _ = require_cupy()
        self.cp = cp
        self.cfg, self.strategy, self.kernel_set = cfg, strategy, kernels
        info = device_info()
        self.cc = info.compute_capability
        self.device_name = info.name
        self.device = info.label
        strategy.validate(self.cc)
        if kernels == "numba":
            self._numba = _numba_kernels()
        self.modules = module_cache(self.cc)
        settle_launch_state(info.index)  # time every run in a serving process's launch state (launch_state.py)
        self._plans: dict[int, _Bound] = {}
        self._arena = None
        self._arena_bytes = 0
        self._workspaces: dict[str, Any] = {}
        self._streams: list[Any] = []
        self._events: list[Any] = []
        self.times = StepTimes()
        self.captures = 0
        #: None, or ``hook(bound, op, call)`` that runs each host op's ``call`` (calibration times them)
        self.host_op_hook: Callable[[_Bound, HostOp, Callable[[], Any]], None] | None = None
        if share is not None:
            def key(c: ModelConfig) -> tuple:
                return c.name, c.context, c.swa_full, c.n_ubatch  # cache shapes follow these too

            if key(share.cfg) != key(cfg) or share.cfg.hf != cfg.hf:
                raise ValueError(f"cannot share device weights of {share.cfg.name} with {cfg.name}")
            self.full = share.full
            self._persistent_mem, self.persistent, self.persistent_bytes = \
                share._persistent_mem, share.persistent, share.persistent_bytes
            self._offsets, self._staging = share._offsets, share._staging
            self.reset()
        else:
            self.full = build_graph(cfg)  # the whole context: the largest shapes of every buffer
            self._check_fits(cfg)
            self._alloc_persistent(weights, seed)
        cp.cuda.runtime.deviceSynchronize()

    # -- memory --------------------------------------------------------------------------------
    def _check_fits(self, cfg: ModelConfig) -> None:
        """A clear error, before allocating, when the model cannot fit in GPU memory (scratch
        counted as if nothing were reused: an upper bound of any allocator's arena). Blocks CuPy's
        pool keeps from released executors count as free: they are handed back first."""
        free, total = self.cp.cuda.runtime.memGetInfo()
        bufs = self.full.buffers().values()
        persistent = {b.name: _align(b.nbytes) for b in bufs if b.persistent}
        need = memory_need(self.full)
        if need > free * MEMORY_HEADROOM and self.cp.get_default_memory_pool().free_bytes():
            self.cp.get_default_memory_pool().free_all_blocks()
            free, total = self.cp.cuda.runtime.memGetInfo()
        if need <= free * MEMORY_HEADROOM:
            return
        layer_bytes = sum(n for name, n in persistent.items() if ".layers." in name or name.startswith("cache_"))
        per_layer = layer_bytes / max(1, cfg.n_layer)
        fit = int((free * MEMORY_HEADROOM - (need - layer_bytes)) // per_layer) if per_layer else 0
        hint = (f"run fewer layers, e.g. --layers {min(fit, cfg.n_layer - 1)}" if fit >= 1 else
                "even one layer does not fit; use a smaller --context or the simulator (--backend sim)")
        raise CudaBackendError(
            f"model {cfg.name} ({cfg.n_layer} layers, context {cfg.context}) needs {need / 2**30:.2f} GiB of GPU "
            f"memory but the {self.device_name} has {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB; {hint}")

    def _alloc_persistent(self, weights: dict[str, np.ndarray] | str | None, seed: int) -> None:
        cp = self.cp
        bufs = [b for b in self.full.buffers().values() if b.persistent]
        offsets, top = {}, 0
        for b in bufs:
            offsets[b.name] = top
            top += _align(b.nbytes)
        self._persistent_mem = cp.zeros(max(top, ALIGN), dtype=cp.uint8)  # caches start at zero
        base = int(self._persistent_mem.data.ptr)
        self._offsets = offsets
        self.persistent = {n: base + off for n, off in offsets.items()}
        self.persistent_bytes = top
        g = self.full
        if isinstance(weights, str):
            if weights != "device":
                raise ValueError(f"weights={weights!r}: pass a dict, None or 'device'")
            from .device_weights import fill_random

            fill_random(cp, g, self.persistent, seed)
        else:
            weights = weights if weights is not None else model_weights(self.cfg, g, seed)
            for name, view in g.weights.items():
                if name not in weights:
                    raise KeyError(f"no weight {name!r} supplied")
                host = np.ascontiguousarray(device_weight(g, name, weights[name]))
                if host.nbytes != view.nbytes:
                    raise ValueError(f"weight {name!r}: {host.nbytes} bytes for a {view.shape} {view.dtype} view")
                self._h2d_blocking(self.persistent[view.buffer.name] + view.offset, host)
        for name, value in g.meta.get("consts", {}).items():
            view = g.consts[name]
            self._h2d_blocking(self.persistent[view.buffer.name] + view.offset,
                               np.ascontiguousarray(to_storage(np.asarray(value, np.float32), view.dtype)))
        self._staging = {}
        for name, view in (*g.inputs.items(), *g.outputs.items()):
            self._staging[name] = _Staging(_pinned(view.nbytes), np.zeros(view.nbytes, np.uint8), view.nbytes)

    def reset(self) -> None:
        """Zero the caches (KV rows and recurrent states): a fresh sequence."""
        self.cp.cuda.runtime.deviceSynchronize()
        for view in self.full.caches.values():
            off = self._offsets[view.buffer.name]
            self._persistent_mem[off: off + view.buffer.nbytes].fill(0)
        self.cp.cuda.runtime.deviceSynchronize()

    def release(self) -> None:
        """Drop this executor's device memory: bound Plans and their captured graphs, the arena,
        workspaces, and its reference to the persistent buffers (freed once no executor sharing
        them holds them). The executor cannot run afterwards."""
        self.cp.cuda.runtime.deviceSynchronize()
        self._plans.clear()
        self._arena, self._arena_bytes = None, 0
        self._workspaces.clear()
        self._persistent_mem, self.persistent, self._staging = None, {}, {}

    def _h2d_blocking(self, dst: int, host: np.ndarray) -> None:
        self.cp.cuda.runtime.memcpy(dst, host.ctypes.data, host.nbytes, H2D)

    def _arena_for(self, plan: Plan) -> int:
        need = max(plan.allocation.arena_bytes, ALIGN)
        if need > self._arena_bytes:  # grow: Plans bound to the old arena are dropped
            self._arena = self.cp.empty(need, dtype=self.cp.uint8)
            self._arena_bytes = need
            self._plans.clear()
        return int(self._arena.data.ptr)

    def _workspace(self, key: str, nbytes: int) -> int:
        ws = self._workspaces.get(key)
        if ws is None or ws.nbytes < nbytes:
            ws = self._workspaces[key] = self.cp.zeros(nbytes, dtype=self.cp.uint8)
        return int(ws.data.ptr)

    def _stream(self, i: int) -> Any:
        """Plan stream ``i``. Stream 0 is a blocking stream: it orders after the legacy default
        stream, where a blocking ``cudaMemcpy`` from pageable memory may still be finishing its
        DMA when the call returns (the ``per-copy`` pattern). Side streams are non-blocking."""
        while len(self._streams) <= i:
            self._streams.append(self.cp.cuda.Stream(non_blocking=len(self._streams) > 0))
        return self._streams[i]

    def _event(self, i: int) -> Any:
        while len(self._events) <= i:
            self._events.append(self.cp.cuda.Event(disable_timing=True))
        return self._events[i]

    # -- plans ---------------------------------------------------------------------------------
    def bound(self, n_kv: int) -> _Bound:
        """The Plan for steps attending over ``n_kv`` rows, bound to device memory."""
        b = self._plans.get(n_kv)
        return b if b is not None else self.bind_plan(plan_for(self.cfg, self.strategy, n_kv, self.cc))

    def bind_plan(self, plan: Plan) -> _Bound:
        """Bind ``plan`` (built for this executor's model and strategy) to device memory; a Plan
        already bound for its KV length is kept."""
        n_kv = int(plan.graph.meta["n_kv"])
        b = self._plans.get(n_kv)
        if b is not None and b.plan is plan:
            return b
        arena = self._arena_for(plan)
        addr = self._addr_fn(plan, arena)
        calls = [bind(la.node, addr, lambda key, n: self._workspace(key, n)) for la in plan.launches]
        self.modules.prefetch({(call.source, *self._placement(la)) for la, call in zip(plan.launches, calls)
                               if not (self.kernel_set == "numba" and call.numba is not None)})
        handles = [self._handle(plan, la, call) for la, call in zip(plan.launches, calls)]
        b = self._plans[n_kv] = _Bound(plan, handles, calls, None, arena)
        b.host = [(op, self._host_fn(b, op)) for op in plan.host_program]
        b.inputs = {name: self._staged(plan, name, "memcpy_h2d") for name in step_input_names(plan.graph)}
        b.logits = self._staged(plan, "logits", "memcpy_d2h").reshape(-1)
        self.cp.cuda.runtime.deviceSynchronize()
        return b

    def _staging_of(self, op: HostOp) -> np.ndarray:
        """The staging memory copy ``op`` reads or writes: pageable for a blocking or pageable
        copy, else pinned."""
        st = self._staging[op.tensor]
        return st.pageable if op.blocking or op.host_buffer == "pageable" else st.pinned

    def _staged(self, plan: Plan, name: str, kind: str) -> np.ndarray:
        """A typed view of the staging memory the Plan's copy (``kind``) of tensor ``name`` reads
        or writes (the pinned buffer when no copy moves it)."""
        graph = plan.graph
        view = graph.inputs[name] if kind == "memcpy_h2d" else graph.outputs[name]
        op = next((op for op in plan.host_program if op.kind == kind and op.tensor == name), None)
        host = self._staging_of(op) if op is not None else self._staging[name].pinned
        return host[: view.nbytes].view(DTYPES[view.dtype][1]).reshape(view.shape)

    def _addr_fn(self, plan: Plan, arena: int):
        arena_name = plan.allocation.arena
        persistent = dict(self.persistent)
        persistent.update(self._mapped_outputs(plan))

        def addr(v: View) -> int:
            name = v.buffer.name
            if name == arena_name:
                return arena + v.offset
            base = persistent.get(name)
            if base is None:
                raise CudaBackendError(f"buffer {name!r} ({v.buffer.kind}) has no device memory: the Plan's "
                                       "allocation placed it nowhere")
            return base + v.offset
        return addr

    def _mapped_outputs(self, plan: Plan) -> dict[str, int]:
        """Buffer -> base address of the outputs no D2H copy moves (``--logits zero-copy``): their
        pinned staging, which UVA maps into the GPU's address space at the same address, so the
        kernel that writes an output stores straight into the host's buffer."""
        out = {}
        for name in mapped_outputs(plan.graph, plan.host_program):
            view = plan.graph.outputs[name]
            if view.buffer.nbytes != view.nbytes:
                raise CudaBackendError(f"--logits zero-copy: output {name!r} is a {view.nbytes}-byte view of the "
                                       f"{view.buffer.nbytes}-byte buffer {view.buffer.name!r}; only a whole buffer "
                                       "can live in mapped host memory. Use --logits copy")
            out[view.buffer.name] = int(self._staging[name].pinned.ctypes.data) - view.offset
        return out

    def _placement(self, la: Any) -> tuple[str, str]:
        """The (wait, trigger) module a launch's kernel comes from."""
        return (la.wait, la.trigger) if self.strategy.pdl else ("none", "none")

    def _handle(self, plan: Plan, la: Any, call: KernelCall) -> Any:
        stream = self._stream(la.stream).ptr
        if self.kernel_set == "numba" and call.numba is not None:
            name, grid, block = call.numba
            h = NumbaLaunch(name, self._numba[name], grid, block, stream, call.args)
            if all(v.buffer.kind == "act" for v in call.writes):  # compile + load now, not inside a capture
                h()
                self._stream(la.stream).synchronize()
            return h
        fn = self.modules.function(call.source, call.name, *self._placement(la))
        cluster = call.cluster if self.cc >= (9, 0) else None  # no clusters before Hopper: the kernel's ticket path
        return LaunchHandle(call.name, fn, call.grid, call.block, stream, call.args, pdl=la.pdl, cluster=cluster)

    def _capture(self, b: _Bound) -> None:
        """Record the Plan's launches (with their fork/join events) into a CUDA graph."""
        cp = self.cp
        s0 = self._stream(0)
        s0.begin_capture(mode=getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None))
        try:
            self._record_graph(b)
        finally:
            graph = s0.end_capture()
        graph.upload(s0)
        s0.synchronize()
        b.graph = graph
        self.captures += 1

    def _record_graph(self, b: _Bound) -> None:
        """Issue what the graph of ``b`` holds, inside its stream capture: the Plan's launches with
        their fork/join events (benchmarks/host_path_variants.py adds the input copies)."""
        for op in kernel_launches(b.plan.launches, graphs=False):
            self._device_op(b, op)

    def drop_graphs(self) -> None:
        """Forget the captured CUDA graphs: the next ``prepare`` captures them again (CUPTI's
        graph-level tracing only follows graphs instantiated after it was enabled)."""
        for b in self._plans.values():
            b.graph = None

    # -- one token ----------------------------------------------------------------------------
    def prepare(self, pos: int) -> _Bound:
        """Bind (and under graphs capture) the Plan of the step at ``pos``, outside any token."""
        b = self.bound(self.cfg.kv_len(pos))
        if self.strategy.graphs and b.graph is None:
            self._capture(b)
        return b

    def step(self, token: int, pos: int) -> np.ndarray:
        """One decode step; returns the logits (float32, a copy of the host staging buffer).

        The token's time ends when its host program has run: the logits have landed in the host
        staging buffer, where ``llama_decode`` + synchronize leaves llama.cpp's (the point
        llama-bench times). The copy out of that buffer into a fresh array (a vocabulary's
        float32 logits, with its page faults) is the caller's, not the step's."""
        b = self.prepare(pos)
        hook = self.host_op_hook
        t0 = time.perf_counter_ns()
        write_step_inputs(b.plan.graph, int(token), pos, b.inputs)
        if hook is None:
            for _, fn in b.host:
                fn()
        else:
            for op, fn in b.host:
                hook(b, op, fn)
        t1 = time.perf_counter_ns()
        self.times.start_ns.append(t0)
        self.times.end_ns.append(t1)
        return b.logits.copy()  # the caller's: the staging is rewritten by the next token

    def _host_fn(self, b: _Bound, op: HostOp) -> Callable[[], Any]:
        """HostOp ``op`` of bound Plan ``b`` as a call with its streams, events and pointers
        resolved once (the graph is looked up per call: it is captured after binding)."""
        k = op.kind
        if k == "launch":
            return b.handles[op.launch]
        if k == "event_record":
            return partial(self._event(op.event).record, self._stream(op.stream))
        if k == "stream_wait_event":
            return partial(self._stream(op.stream).wait_event, self._event(op.event))
        if k == "stream_sync":
            return self._stream(op.stream).synchronize
        if k == "graph_launch":
            stream = self._stream(op.stream)
            return lambda: b.graph.launch(stream)
        if k in ("memcpy_h2d", "memcpy_d2h"):
            graph = b.plan.graph
            view = graph.inputs[op.tensor] if k == "memcpy_h2d" else graph.outputs[op.tensor]
            host = int(self._staging_of(op).ctypes.data)
            dev = self.persistent[view.buffer.name] + view.offset
            src, dst, kind = (host, dev, H2D) if k == "memcpy_h2d" else (dev, host, D2H)
            rt = self.cp.cuda.runtime
            if op.blocking:
                return partial(rt.memcpy, dst, src, view.nbytes, kind)
            return partial(rt.memcpyAsync, dst, src, view.nbytes, kind, self._stream(op.stream).ptr)
        raise CudaBackendError(f"host op {k!r} is not known to the cuda executor")

    def _device_op(self, b: _Bound, op: HostOp) -> None:
        """A launch or a fork/join event op, run now (a graph capture records these)."""
        if op.kind not in ("launch", "event_record", "stream_wait_event"):
            raise CudaBackendError(f"{op.kind} cannot be captured")
        self._host_fn(b, op)()

    # -- state ---------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Copies of the caches (KV and recurrent states) on the device."""
        self.cp.cuda.runtime.deviceSynchronize()
        out = {}
        for name, view in self.full.caches.items():
            a = self.cp.empty(view.buffer.nbytes, self.cp.uint8)
            self.cp.cuda.runtime.memcpy(a.data.ptr, self.persistent[view.buffer.name], view.buffer.nbytes, 3)
            out[name] = a
        return out

    def restore(self, snap: dict[str, Any]) -> None:
        self.cp.cuda.runtime.deviceSynchronize()
        for name, a in snap.items():
            view = self.full.caches[name]
            self.cp.cuda.runtime.memcpy(self.persistent[view.buffer.name], a.data.ptr, view.buffer.nbytes, 3)
        self.cp.cuda.runtime.deviceSynchronize()

    def caches(self) -> dict[str, np.ndarray]:
        """Cache contents as float32 (as ``ReferenceRun.caches``)."""
        from .memory import Memory

        self.cp.cuda.runtime.deviceSynchronize()
        mem = Memory()
        for view in self.full.caches.values():
            off = self._offsets[view.buffer.name]
            mem.arrays[view.buffer.name] = self._persistent_mem[off: off + view.buffer.nbytes].get()
        return {name: mem.read(v) for name, v in self.full.caches.items()}

    def arena_bytes(self) -> np.ndarray:
        """The arena's bytes (scratch of the last step), for node-by-node comparisons."""
        self.cp.cuda.runtime.deviceSynchronize()
        return self._arena.get()

    def persistent_array(self, name: str) -> np.ndarray:
        """A persistent buffer's bytes (weights, caches, inputs, outputs)."""
        self.cp.cuda.runtime.deviceSynchronize()
        off = self._offsets[name]
        n = next(b.nbytes for b in self.full.buffers().values() if b.name == name)
        return self._persistent_mem[off: off + n].get()

    def kernel_of(self, launch: Any) -> tuple[str | None, tuple[int, int, int] | None]:
        """(kernel function name, grid) of a Plan launch, for CUPTI's node matching."""
        for b in self._plans.values():
            if b.plan.launches and launch.index < len(b.calls) and b.plan.launches[launch.index] is launch:
                c = b.calls[launch.index]
                h = b.handles[launch.index]
                return (c.numba[0] if isinstance(h, NumbaLaunch) else c.name), None
        return None, None


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _pinned(nbytes: int) -> np.ndarray:
    import cupyx

    return cupyx.empty_pinned((max(nbytes, 1),), dtype=np.uint8)


def _numba_kernels() -> dict[str, Any]:
    try:
        from numba import cuda
    except ImportError:
        raise CudaBackendError("--kernels numba needs numba with CUDA support (pip install numba-cuda); "
                               "or use --kernels cupy") from None
    if not cuda.is_available():
        raise CudaBackendError("--kernels numba: Numba sees no CUDA GPU; use --kernels cupy")
    return numba_module().KERNELS


__all__ = ["CudaBackendError", "CudaExecutor", "StepTimes"]
