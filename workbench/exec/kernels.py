"""The workbench's CUDA kernels on a device: compiling ``kernels/*.cu`` per PDL placement and
launching them through ``cuLaunchKernelEx``.

* Sources live in the repository's ``kernels/`` folder. NVRTC compiles them through CuPy's
  ``RawModule`` with ``PDL_WAIT_AT`` / ``PDL_TRIGGER_AT`` defined for one (wait, trigger)
  placement, so each placement is its own module and a kernel's ``griddepcontrol`` hooks sit
  exactly where the Plan puts them (``-arch=sm_<cc>``; PDL needs sm_90).
* A view reaches a kernel as a ``TV`` struct by value (see ``kernels/common.cuh``); ``Arg`` is
  its host-side twin and ``TVArg`` the ctypes layout.
* ``LaunchHandle`` prebuilds a ``CUlaunchConfig`` (with the programmatic-stream-serialization
  attribute for PDL launches) and the kernel-parameter array once, so launching a kernel of a
  token costs one driver call (eager) or one captured node (graphs).

Nothing here imports CuPy at module import time: the CPU tests and the simulator never need it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

#: the repository's kernel sources (CUDA C for NVRTC, plus the Numba kernels)
KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"
#: source file stems (``kernels/<name>.cu``)
SOURCES = ("elementwise", "norm", "rope", "mul_mat", "attn", "topk", "gdn", "mmvq", "fused_mat_vec")
#: dtype name -> the ``DT_*`` code of common.cuh; ggml's block types get codes past those (the
#: kernels of mmvq.cu read a block type by its layout, never through ``ldf``)
DT_CODES = {"f32": 0, "f16": 1, "bf16": 2, "i32": 3, "i64": 4,
            **{q: 16 + i for i, q in enumerate(("q8_0", "q4_0", "q4_k", "mxfp4", "q6_k", "q8_1"))}}
#: Strategy placement -> the PDL_AT_* macro of common.cuh
PLACEMENTS = {"none": "PDL_AT_none", "start": "PDL_AT_start", "first-read": "PDL_AT_first_read",
              "late": "PDL_AT_late", "after-main-loop": "PDL_AT_after_main_loop", "end": "PDL_AT_end"}


class CudaBackendError(RuntimeError):
    """The cuda backend cannot run here (no GPU, no CuPy, a model too large...); says what to do."""


def require_cupy() -> tuple[Any, Any]:
    """``(cupy, cuda.bindings.driver)`` with a visible GPU, or a CudaBackendError saying why not."""
    try:
        import cupy
        from cuda.bindings import driver
    except ImportError as e:
        raise CudaBackendError(f"the cuda backend needs CuPy and cuda-bindings ({e.name} is not installed): "
                               "install the `gpu` extra (pip install -e '.[gpu]') or run with --backend sim") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver or device
        raise CudaBackendError(f"the cuda backend found no usable CUDA GPU ({e}); run with --backend sim") from None
    if n < 1:
        raise CudaBackendError("the cuda backend found no CUDA GPU; run with --backend sim")
    return cupy, driver


# -------------------------------------------------------------------------------------------
# views as kernel arguments
# -------------------------------------------------------------------------------------------
class TVArg(ctypes.Structure):
    """ctypes layout of ``struct TV`` (common.cuh)."""

    _fields_ = [("p", ctypes.c_void_p), ("s", ctypes.c_longlong * 4), ("n", ctypes.c_int * 4),
                ("dt", ctypes.c_int), ("pad", ctypes.c_int)]


@dataclass(frozen=True)
class Arg:
    """A view as a kernel sees it: device address, 4-D shape and byte strides, dtype."""

    ptr: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    dtype: str

    def ctype(self) -> TVArg:
        return TVArg(self.ptr, (ctypes.c_longlong * 4)(*self.strides), (ctypes.c_int * 4)(*self.shape),
                     DT_CODES[self.dtype], 0)

    @property
    def numel(self) -> int:
        a, b, c, d = self.shape
        return a * b * c * d


def graph_replay_seconds(cp: Any, stream: Any, launch: Any, reps: int, rounds: int = 7, skip: int = 2) -> float:
    """Device seconds per call of ``launch()``: ``reps`` calls captured in one CUDA graph and
    replayed between events, so no host launch cost falls inside the timed interval (median of
    ``rounds`` replays after the first ``skip``)."""
    return float(np.median(graph_replay_samples(cp, stream, launch, reps, rounds, skip)))


def graph_replay_samples(cp: Any, stream: Any, launch: Any, reps: int, rounds: int = 7,
                         skip: int = 2) -> list[float]:
    """The per-call device seconds of each timed replay of :func:`graph_replay_seconds` (the
    first ``skip`` replays are warm-up), for a median with its spread."""
    stream.begin_capture()
    try:
        for _ in range(reps):
            launch()
    finally:
        graph = stream.end_capture()
    graph.upload(stream)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(rounds):
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / reps)
    return ts[skip:]


def ctype_of(value: Any) -> Any:
    """A kernel parameter as the ctypes object whose bytes the driver copies."""
    if isinstance(value, Arg):
        return value.ctype()
    if isinstance(value, ctypes._SimpleCData):
        return value
    raise TypeError(f"kernel argument {value!r}: expected an Arg or a ctypes scalar")


# -------------------------------------------------------------------------------------------
# sources and modules
# -------------------------------------------------------------------------------------------
@cache
def kernel_source(name: str) -> str:
    """``kernels/<name>.cu`` with its ``kernels/*.cuh`` headers inlined, each once (so CuPy's
    compile cache key covers them and NVRTC needs no include path)."""
    path = KERNEL_DIR / f"{name}.cu"
    if not path.exists():
        raise CudaBackendError(f"kernel source {path} is missing: the cuda backend runs from a checkout of the "
                               "repository (pip install -e .)")
    seen: set[str] = set()

    def inline(m: re.Match) -> str:
        header = m.group(1)
        if header in seen:
            return ""
        seen.add(header)
        text = (KERNEL_DIR / header).read_text().replace("#pragma once", "")
        return _LOCAL_INCLUDE.sub(inline, text)

    return _LOCAL_INCLUDE.sub(inline, path.read_text())


#: ``#include "x.cuh"`` of a header in kernels/
_LOCAL_INCLUDE = re.compile(r'#include "(\w+\.cuh)"')


def compile_options(wait: str, trigger: str, cc: tuple[int, int]) -> tuple[str, ...]:
    """NVRTC options for one PDL placement on a device of compute capability ``cc``."""
    return (f"-arch=sm_{cc[0]}{cc[1]}", "--std=c++17", f"-DPDL_WAIT_AT={PLACEMENTS[wait]}",
            f"-DPDL_TRIGGER_AT={PLACEMENTS[trigger]}")


class ModuleCache:
    """Compiled modules per (source, wait, trigger); functions looked up once."""

    #: NVRTC options added to every compile (a benchmark's ``-D`` variant of the kernels)
    extra_options: tuple[str, ...] = ()

    def __init__(self, cc: tuple[int, int]) -> None:
        import cupy

        self._cupy = cupy
        self.cc = cc
        self._modules: dict[tuple[str, str, str], Any] = {}
        self._functions: dict[tuple[str, str, str, str], Any] = {}

    def function(self, source: str, name: str, wait: str = "none", trigger: str = "none") -> Any:
        key = (source, name, wait, trigger)
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = self._module((source, wait, trigger)).get_function(name)
        return fn

    def _module(self, mkey: tuple[str, str, str]) -> Any:
        mod = self._modules.get(mkey)
        if mod is None:
            source, wait, trigger = mkey
            mod = self._modules[mkey] = self._cupy.RawModule(
                code=kernel_source(source), options=compile_options(wait, trigger, self.cc) + self.extra_options)
        return mod

    def prefetch(self, keys: set[tuple[str, str, str]]) -> None:
        """Compile the modules ``(source, wait, trigger)`` not compiled yet, side by side: NVRTC
        runs without the GIL, and a cold first run (or a new PDL placement) otherwise pays each
        source's compile one after another (data/bench/lab_latency_h100.md)."""
        todo = sorted(k for k in keys if k not in self._modules)
        if len(todo) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        mods = [self._module(k) for k in todo]
        device = self._cupy.cuda.Device().id

        def compile_one(mod: Any) -> None:
            with self._cupy.cuda.Device(device):
                mod.compile()

        with ThreadPoolExecutor(max_workers=len(mods)) as pool:
            list(pool.map(compile_one, mods))  # re-raises a compile error here, as a lookup would

    @property
    def compiled(self) -> int:
        return len(self._modules)


_MODULES: dict[tuple[int, int], ModuleCache] = {}


def module_cache(cc: tuple[int, int]) -> ModuleCache:
    """The process-wide module cache of a compute capability (NVRTC compiles each placement once)."""
    mc = _MODULES.get(tuple(cc))
    if mc is None:
        mc = _MODULES[tuple(cc)] = ModuleCache(tuple(cc))
    return mc


#: CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT every launched kernel gets (percent of the
#: SM's unified L1 / shared memory given to shared memory; -1: the driver picks per kernel). A
#: fixed value would spare SMs the drain before a carveout switch between neighbouring kernels;
#: measured, none beat the driver's choice (benchmarks/launch_policy.py,
#: data/bench/launch_policy_carveout_h200.md), so it stays -1 and the benchmark's policies set it.
SMEM_CARVEOUT = -1


class LaunchHandle:
    """One prepared kernel launch: ``handle()`` enqueues it on its stream.

    ``pdl``: launched with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` (the kernel
    may start before its predecessor on the stream completes; its ``griddepcontrol.wait``
    orders its dependent reads). ``cluster``: thread-block cluster dimensions
    (``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION``, sm_90 and later; ``KernelCall.cluster``)."""

    def __init__(self, name: str, function: Any, grid: Sequence[int], block: Sequence[int], stream_ptr: int,
                 args: Sequence[Any], pdl: bool, shared_bytes: int = 0,
                 cluster: Sequence[int] | None = None) -> None:
        from cuda.bindings import driver as cu

        self._cu = cu
        self.name = name
        self.grid = tuple(int(g) for g in (*grid, 1, 1)[:3])
        self.block = tuple(int(b) for b in (*block, 1, 1)[:3])
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block
        cfg.sharedMemBytes = int(shared_bytes)
        cfg.hStream = cu.CUstream(stream_ptr)
        attrs = []
        if pdl:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        self.cluster = tuple(int(c) for c in (*cluster, 1, 1)[:3]) if cluster else None
        if self.cluster:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = self.cluster
            attrs.append(attr)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        self.pdl = pdl
        self._cfg = cfg
        self._func = cu.CUfunction(function.kernel.ptr)
        cu.cuFuncSetAttribute(self._func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                              SMEM_CARVEOUT)
        self._args = [ctype_of(a) for a in args]  # kept alive: the driver reads them at launch
        self._ptrs = (ctypes.c_void_p * max(1, len(self._args)))(*[ctypes.addressof(a) for a in self._args])
        self._params = ctypes.addressof(self._ptrs)
        self._ok = cu.CUresult.CUDA_SUCCESS

    def __call__(self) -> None:
        err, = self._cu.cuLaunchKernelEx(self._cfg, self._func, self._params, 0)
        if err != self._ok:
            raise CudaBackendError(f"cuLaunchKernelEx of {self.name} grid {self.grid} "
                                   f"block {self.block} cluster {self.cluster} failed: {err}")


# -------------------------------------------------------------------------------------------
# Numba kernels
# -------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def numba_module() -> ModuleType:
    """``kernels/numba_kernels.py`` imported by path (it is not part of the installed package)."""
    path = KERNEL_DIR / "numba_kernels.py"
    spec = importlib.util.spec_from_file_location("workbench_numba_kernels", path)
    if spec is None or spec.loader is None:
        raise CudaBackendError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_NUMPY_TYPESTR = {"f32": "<f4", "f16": "<f2", "bf16": "<u2", "i32": "<i4", "i64": "<i8"}


def numba_array(arg: Arg) -> Any:
    """A Numba device array aliasing ``arg`` (no copy, no stream synchronization)."""
    from numba import cuda

    desc = {"shape": arg.shape, "strides": arg.strides, "typestr": _NUMPY_TYPESTR[arg.dtype],
            "data": (arg.ptr, False), "version": 3, "stream": None}
    return cuda.from_cuda_array_interface(desc, owner=None, sync=False)


class NumbaLaunch:
    """A prepared Numba kernel launch on a CuPy stream (Numba launches have no PDL attribute:
    they are full dependencies for the kernels around them, which stays correct)."""

    def __init__(self, name: str, kernel: Any, grid: Sequence[int], block: Sequence[int], stream_ptr: int,
                 args: Sequence[Any]) -> None:
        from numba import cuda

        self.name = name
        self.grid = tuple(int(g) for g in (*grid, 1, 1)[:3])
        self.block = tuple(int(b) for b in (*block, 1, 1)[:3])
        self.pdl = False
        self._stream = cuda.external_stream(stream_ptr)
        self._args = tuple(numba_array(a) if isinstance(a, Arg) else a.value for a in args)
        self._configured = kernel[self.grid, self.block, self._stream]

    def __call__(self) -> None:
        self._configured(*self._args)
