"""``workbench calibrate``: measure the simulator's cost model on this GPU and write the file
the simulator reads (``data/calibration/<gpu>.json``), each field with how it was measured.

Two halves, so that fitting can be re-run without a GPU (``--raw`` / ``--from-raw``):

* **measure** (GPU), in this order in one process: (1) the ``cuda`` executor decodes the
  calibration models under the strategies whose costs the simulator needs (eager, eager + PDL,
  eager qkv, graphs, graphs + PDL; each sync pattern), every host op timed with the host clock,
  *before CUPTI is first enabled* (a CUDA graph instantiated once CUPTI has been active stays
  instrumented); (2) probe kernels (device-to-device copy, a streaming read at growing grid
  sizes for latency x bytes in flight, an FMA loop, empty-kernel chains under graph replay, a
  PDL chain of spin kernels, pinned and pageable copies, three small grids on three streams);
  (3) the same executor runs traced with CUPTI (per-node kernel durations, API periods, PDL
  boundaries, graph capture and instantiation).
* **fit** (pure): raw numbers -> calibration. Host costs are the untraced periods of each host
  op (op start to the next op's start: what the host thread really spends, Python included);
  device latencies and waits come from CUPTI; kernel costs are least-squares fits, in
  absolute error (``fit_kernels`` says why), of ``fixed_ns + work_scale x roofline`` to the
  graph-replay durations of the calibration models' kernels less the per-kernel time CUPTI's
  timestamps add (traced minus untraced graph replays): one per ggml op measured (and per
  executor kernel where an op ran on several), one per kernel family as the fallback for ops
  not measured; PDL's overlap is measured per kernel boundary (graphs vs graphs + PDL) and
  summarised by the global parameters the simulator reads. ``calibration_run_errors`` (``--check``)
  predicts the calibration runs with the result.

By default only Llama shapes are measured (``CALIBRATION_MODELS``; ``--models`` adds others):
the families left out stay held out, so the fidelity report (``benchmarks/sim_fidelity.py``)
shows the error on families the fit has not seen.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..models import ModelConfig, load_config
from ..strategy import Strategy
from ..trace import Trace
from .calibration import CALIBRATION_DIR, Calibration, parse_calibration

# ------------------------------------------------------------------------------------------
# what is measured
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model shape the calibration (or the fidelity report) runs: preset, layers, context, and
    the position of the first decode step (which sets the attended KV length)."""

    model: str
    layers: int | None = None
    context: int | None = None
    pos: int = 0

    def config(self) -> ModelConfig:
        return load_config(self.model, layers=self.layers, context=self.context)

    @property
    def label(self) -> str:
        parts = [self.model]
        if self.layers:
            parts.append(f"L{self.layers}")
        if self.context:
            parts.append(f"ctx{self.context}")
        if self.pos:
            parts.append(f"pos{self.pos}")
        return "/".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "layers": self.layers, "context": self.context, "pos": self.pos}


#: dense Llama shapes at two sizes and two KV lengths: mat-vecs from 512 x 2048 to 14336 x 4096,
#: attention over 256 and 2048 rows
CALIBRATION_MODELS = (
    ModelSpec("llama-3.2-1b", 4, 512),
    ModelSpec("llama-3.1-8b", 2, 2048, 1800),
)
#: the strategies whose traces give each host cost and the PDL boundaries
CALIBRATION_STRATEGIES: dict[str, Strategy] = {
    "eager": Strategy(),
    "eager+pdl": Strategy(pdl=True),
    "eager+qkv+boundary": Strategy(streams="qkv", sync="boundary"),
    "graphs+boundary": Strategy(graphs=True, sync="boundary"),
    "graphs+pdl+implicit": Strategy(graphs=True, pdl=True, sync="implicit"),
}

PROBE_SRC = r"""
extern "C" __global__ void wb_empty() {}

// streaming read: each thread keeps READ_UNROLL 16-byte loads in flight per iteration
#define READ_UNROLL 2
extern "C" __global__ void wb_read(const uint4* __restrict__ x, long long n, unsigned* out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
#pragma unroll 1
    for (; i + (READ_UNROLL - 1) * stride < n; i += READ_UNROLL * stride) {
        uint4 v[READ_UNROLL];
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) v[u] = __ldcs(x + i + u * stride);
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) { uint4 v = __ldcs(x + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// fp32 FMA rate: 8 independent chains per thread
extern "C" __global__ void wb_fma(float* out, int iters) {
    float a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6, a7 = a0 + 7;
    for (int k = 0; k < iters; ++k) {
        a0 = fmaf(a0, 0.9999f, 0.0001f); a1 = fmaf(a1, 0.9999f, 0.0001f);
        a2 = fmaf(a2, 0.9999f, 0.0001f); a3 = fmaf(a3, 0.9999f, 0.0001f);
        a4 = fmaf(a4, 0.9999f, 0.0001f); a5 = fmaf(a5, 0.9999f, 0.0001f);
        a6 = fmaf(a6, 0.9999f, 0.0001f); a7 = fmaf(a7, 0.9999f, 0.0001f);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

// spin for a number of clock cycles; with pdl: trigger dependents, then wait for the predecessor
extern "C" __global__ void wb_spin(long long cycles, int pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""
READ_BYTES_IN_FLIGHT = 32  # READ_UNROLL x 16 bytes per thread


# ------------------------------------------------------------------------------------------
# trace analyses (pure): what the fit reads from an executor trace
# ------------------------------------------------------------------------------------------
LAUNCH_APIS = ("cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernelExC")
#: the calls of a host program (what the simulator charges); others (cudaGetDevice, capture
#: queries...) are part of the Python time around them
PROGRAM_APIS = r"LaunchKernel|GraphLaunch|Memcpy|Synchronize|EventRecord|StreamWaitEvent"


def _steady(ev: pd.DataFrame) -> pd.DataFrame:
    """Events of the measured tokens (all but the first token)."""
    toks = sorted(t for t in ev["token"].unique() if t >= 0)
    return ev[ev["token"] >= (toks[1] if len(toks) > 1 else 0)] if toks else ev.iloc[0:0]


def api_periods(trace: Trace) -> pd.DataFrame:
    """Each host-program call (``PROGRAM_APIS``) of the measured tokens with its ``period_ns``
    (its start to the next such call's start on the same thread: the host time the call and the
    Python around it take),
    ``issue_ns`` (call start to the start of the device work it issued), ``wait_ns`` / ``resume_ns``
    (for calls that waited for device work: from that work's end to the call's return / to the
    next call; NaN otherwise)."""
    ev = trace.events
    host = ev[(ev["row"] == "CUDA API") & ev["name"].str.contains(PROGRAM_APIS)].sort_values("start_ns", kind="stable")
    host = host.assign(next_start=host.groupby("tid")["start_ns"].shift(-1),
                       next_token=host.groupby("tid")["token"].shift(-1))
    dev = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    first_start = dev[dev["corr_id"] >= 0].groupby("corr_id")["start_ns"].min()
    host = host.assign(device_start=host["corr_id"].map(first_start))
    dev_end = np.sort(dev["end_ns"].to_numpy())
    # the device work a blocking call waited for: the last device event ending inside the call
    k = np.searchsorted(dev_end, host["end_ns"].to_numpy(), side="right") - 1
    last_end = np.where(k >= 0, dev_end[np.clip(k, 0, None)], -1)
    waited = (last_end > host["start_ns"].to_numpy()) & host["kind"].isin(["sync"]).to_numpy()
    blocking_copy = (host["name"] == "cudaMemcpy").to_numpy() & (last_end > host["start_ns"].to_numpy())
    out = host.assign(period_ns=host["next_start"] - host["start_ns"], issue_ns=host["device_start"] - host["start_ns"],
                      wait_ns=np.where(waited | blocking_copy, host["end_ns"].to_numpy() - last_end, np.nan),
                      resume_ns=np.where(waited | blocking_copy, host["next_start"].to_numpy() - last_end, np.nan),
                      last_device_end=last_end)
    return _steady(out)


def kernel_table(trace: Trace) -> pd.DataFrame:
    """Median duration, start gap after the previous kernel on its stream, and count of each
    Plan node's kernel over the measured tokens."""
    k = _steady(trace.events)
    k = k[(k["kind"] == "kernel") & (k["node"] != "")].sort_values("start_ns", kind="stable")
    if k.empty:
        return pd.DataFrame(columns=["node", "name", "duration_ns", "gap_ns", "n"])
    k = k.assign(dur=k["end_ns"] - k["start_ns"], gap=k["start_ns"] - k.groupby(["stream", "token"])["end_ns"].shift(1))
    calls = trace.events[trace.events["row"] == "CUDA API"].drop_duplicates("corr_id").set_index("corr_id")["end_ns"]
    # how long after its launch call returned a kernel started (large: it was queued behind others)
    k = k.assign(queued=k["start_ns"] - k["corr_id"].map(calls))
    g = k.groupby("node", sort=False)
    return pd.DataFrame({"name": g["name"].first(), "duration_ns": g["dur"].median(), "gap_ns": g["gap"].median(),
                         "queued_ns": g["queued"].median(), "n": g["dur"].size()}).reset_index()


def boundary_table(plain: Trace, pdl: Trace) -> pd.DataFrame:
    """Per pair of consecutive kernels on one stream, the time from the first one's end to the
    second one's end without and with PDL (medians over the measured tokens), and the saving."""
    def ends(tr: Trace) -> pd.DataFrame:
        k = _steady(tr.events)
        k = k[(k["kind"] == "kernel") & (k["node"] != "")].sort_values("start_ns", kind="stable")
        k = k.assign(prev=k.groupby(["stream", "token"])["node"].shift(1),
                     step=k["end_ns"] - k.groupby(["stream", "token"])["end_ns"].shift(1),
                     overlap=k.groupby(["stream", "token"])["end_ns"].shift(1) - k["start_ns"])
        k = k.dropna(subset=["prev"])
        g = k.groupby(["prev", "node"], sort=False)
        return pd.DataFrame({"step_ns": g["step"].median(), "overlap_ns": g["overlap"].median()})

    a, b = ends(plain), ends(pdl)
    t = a.add_suffix("_plain").join(b.add_suffix("_pdl"), how="inner").reset_index()
    return t.assign(saving_ns=t["step_ns_plain"] - t["step_ns_pdl"])


# ------------------------------------------------------------------------------------------
# measuring (GPU)
# ------------------------------------------------------------------------------------------
def _capture():
    from ..trace.cupti import CuptiCapture, cupti_available

    if not cupti_available():
        raise RuntimeError("workbench calibrate reads kernel and API timestamps from CUPTI: install cupti-python "
                           "(pip install cupti-python, or the `gpu` extra)")
    return CuptiCapture()


class _Probes:
    """The probe kernels on one stream, launched plain, with PDL, or captured into graphs."""

    def __init__(self) -> None:
        import cupy as cp

        from .kernels import LaunchHandle

        self.cp = cp
        dev = cp.cuda.Device()
        self.cc = tuple(int(c) for c in dev.compute_capability)
        self.mod = cp.RawModule(code=PROBE_SRC, options=(f"-arch=sm_{self.cc[0]}{self.cc[1]}",))
        self.stream = cp.cuda.Stream(non_blocking=True)
        self._Launch = LaunchHandle

    def handle(self, name: str, grid: int, block: int, args: Sequence[Any], pdl: bool = False, stream: Any = None):
        import ctypes

        cargs = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_void_p(int(a)) for a in args]
        s = stream or self.stream
        return self._Launch(name, self.mod.get_function(name), (grid,), (block,), s.ptr, cargs, pdl)

    def graph(self, fn: Callable[[], None]) -> Any:
        s = self.stream
        s.begin_capture()
        try:
            fn()
        finally:
            g = s.end_capture()
        g.upload(s)
        s.synchronize()
        return g


def _events_time_ms(cp: Any, stream: Any, fn: Callable[[], None], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b))
    return out


def measure_device(log: Callable[[str], None] = print) -> dict[str, Any]:
    """Probe-kernel microbenchmarks (the device half of the calibration)."""
    import ctypes

    pr = _Probes()
    cp, s = pr.cp, pr.stream
    raw: dict[str, Any] = {}
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    raw["sm_count"] = int(props["multiProcessorCount"])
    raw["max_threads_per_sm"] = int(props["maxThreadsPerMultiProcessor"])
    raw["compute_capability"] = list(pr.cc)

    # device-to-device copy: bytes read + written per second
    n = 1 << 30
    src_buf, dst_buf = cp.empty(n, cp.uint8), cp.empty(n, cp.uint8)
    src_buf.fill(1)
    with s:
        ms = _events_time_ms(cp, s, lambda: cp.copyto(dst_buf, src_buf), 10)
    raw["copy_d2d_GBps"] = 2 * n / (np.median(ms[2:]) * 1e-3) / 1e9
    log(f"  D2D copy {raw['copy_d2d_GBps']:.0f} GB/s")

    # streaming read at growing grid sizes (256 threads a block)
    x = cp.ones(n // 16 * 4, cp.uint32)
    out = cp.zeros(4, cp.uint32)
    reads = []
    for blocks in (1, 2, 4, 8, 16, 33, 66, 132, 264, 528, 1056, 2112):
        nvec = n // 16 if blocks >= 132 else min(n // 16, blocks * 256 * 2 * 256)
        h = pr.handle("wb_read", blocks, 256, (x.data.ptr, ctypes.c_longlong(nvec), out.data.ptr))
        h()
        ms = _events_time_ms(cp, s, h, 5)
        reads.append({"blocks": blocks, "threads": 256 * blocks, "bytes": nvec * 16,
                      "GBps": nvec * 16 / (np.median(ms[1:]) * 1e-3) / 1e9})
    raw["read_probe"] = reads
    raw["read_bytes_in_flight_per_thread"] = READ_BYTES_IN_FLIGHT
    log("  read probe " + ", ".join(f"{r['blocks']}b:{r['GBps']:.0f}" for r in reads))
    src_buf = dst_buf = x = None  # free 3 GiB before the next probes

    # fp32 FMA rate
    blocks, threads, iters = raw["sm_count"] * 8, 256, 1 << 11
    y = cp.zeros(blocks * threads, cp.float32)
    h = pr.handle("wb_fma", blocks, threads, (y.data.ptr, ctypes.c_int(iters)))
    h()
    ms = _events_time_ms(cp, s, h, 5)
    raw["fp32_TFLOPS"] = 2 * 8 * iters * blocks * threads / (np.median(ms[1:]) * 1e-3) / 1e12
    log(f"  FMA {raw['fp32_TFLOPS']:.1f} TFLOP/s")

    # CUPTI: empty chains (graph), launch latencies, PDL chain of spin kernels, copies, concurrency
    spin_cycles = 15000  # ~8 us at Hopper's ~1.9 GHz boost clock
    L = 64
    empty = [pr.handle("wb_empty", 1, 32, ()) for _ in range(L)]
    empty132 = [pr.handle("wb_empty", raw["sm_count"], 128, ()) for _ in range(L)]
    spin = [pr.handle("wb_spin", raw["sm_count"], 128, (ctypes.c_longlong(spin_cycles), ctypes.c_int(0)))
            for _ in range(16)]
    spin_pdl = [pr.handle("wb_spin", raw["sm_count"], 128, (ctypes.c_longlong(spin_cycles), ctypes.c_int(1)), pdl=True)
                for _ in range(16)]
    g_empty = pr.graph(lambda: [h() for h in empty])
    g_empty132 = pr.graph(lambda: [h() for h in empty132])
    g_spin = pr.graph(lambda: [h() for h in spin])
    g_spin_pdl = pr.graph(lambda: [h() for h in spin_pdl])
    side = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    small = 8
    xs = [cp.ones(small * 256 * 2 * 512 * 4, cp.uint32) for _ in range(3)]
    nv = small * 256 * 2 * 512
    conc_serial = [pr.handle("wb_read", small, 256, (xx.data.ptr, ctypes.c_longlong(nv), out.data.ptr)) for xx in xs]
    conc_par = [pr.handle("wb_read", small, 256, (xx.data.ptr, ctypes.c_longlong(nv), out.data.ptr), stream=st)
                for xx, st in zip(xs, [s, *side])]

    def fork_join() -> None:
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s)
        for st in side:
            st.wait_event(ev)
        for hh in conc_par:
            hh()
        for st in side:
            e = cp.cuda.Event(disable_timing=True)
            e.record(st)
            s.wait_event(e)

    g_serial = pr.graph(lambda: [h() for h in conc_serial])
    # (three 8-block streaming reads: serial in one graph vs fork/join on three streams)
    g_par = pr.graph(fork_join)
    big = 256 << 20
    hp = cp.cuda.alloc_pinned_memory(big)
    hbuf = np.frombuffer(hp, np.uint8, big)
    dbuf = cp.empty(big, cp.uint8)
    small_h = np.zeros(16, np.uint8)
    small_p = np.frombuffer(cp.cuda.alloc_pinned_memory(16), np.uint8, 16)
    for g in (g_empty, g_empty132, g_spin, g_spin_pdl, g_serial, g_par):  # warm up
        g.launch(s)
    s.synchronize()

    cap = _capture().start()
    reps = 5
    marks: list[tuple[str, int]] = []

    def mark(label: str) -> None:
        s.synchronize()
        marks.append((label, int(time.perf_counter_ns())))
        cap.mark_token(len(marks) - 1)

    for _ in range(reps):
        mark("graph_empty")
        g_empty.launch(s)
        mark("graph_empty132")
        g_empty132.launch(s)
        mark("graph_spin")
        g_spin.launch(s)
        mark("graph_spin_pdl")
        g_spin_pdl.launch(s)
        mark("graph_serial3")
        g_serial.launch(s)
        mark("graph_fork3")
        g_par.launch(s)
        for _ in range(8):
            mark("eager_idle")
            empty[0]()
            s.synchronize()
        mark("h2d_pinned_big")
        cp.cuda.runtime.memcpyAsync(dbuf.data.ptr, hbuf.ctypes.data, big, 1, s.ptr)
        mark("d2h_pinned_big")
        cp.cuda.runtime.memcpyAsync(hbuf.ctypes.data, dbuf.data.ptr, big, 2, s.ptr)
        for _ in range(8):
            mark("h2d_small_pageable")
            cp.cuda.runtime.memcpy(dbuf.data.ptr, small_h.ctypes.data, 16, 1)
            mark("h2d_small_pinned")
            cp.cuda.runtime.memcpyAsync(dbuf.data.ptr, small_p.ctypes.data, 16, 1, s.ptr)
            s.synchronize()
    mark("end")
    tr = cap.stop()
    raw["probe_trace_summary"] = _probe_summary(tr, [m for m, _ in marks])
    log("  " + ", ".join(f"{k}={v:.0f}" for k, v in raw["probe_trace_summary"].items() if isinstance(v, float)))
    return raw


def _probe_summary(tr: Trace, labels: Sequence[str]) -> dict[str, float]:
    """Numbers from the CUPTI trace of the probe runs (token i = the i-th mark)."""
    ev = tr.events
    ev = ev.assign(label=[labels[t] if 0 <= t < len(labels) else "" for t in ev["token"]])
    kern = ev[ev["kind"] == "kernel"].sort_values("start_ns", kind="stable")
    api = ev[ev["row"] == "CUDA API"]
    out: dict[str, float] = {}

    def chain(label: str) -> pd.DataFrame:
        k = kern[kern["label"] == label]
        return k.assign(dur=k["end_ns"] - k["start_ns"],
                        gap=k["start_ns"] - k.groupby("token")["end_ns"].shift(1),
                        s2s=k["start_ns"] - k.groupby("token")["start_ns"].shift(1),
                        e2e=k["end_ns"] - k.groupby("token")["end_ns"].shift(1))

    e = chain("graph_empty")
    out["empty_duration_ns"] = float(e["dur"].median())
    out["empty_gap_ns"] = float(e["gap"].median())
    e = chain("graph_empty132")
    out["empty132_duration_ns"] = float(e["dur"].median())
    out["empty132_gap_ns"] = float(e["gap"].median())
    sp = chain("graph_spin")
    out["spin_duration_ns"] = float(sp["dur"].median())
    out["spin_gap_ns"] = float(sp["gap"].median())
    sp = chain("graph_spin_pdl")
    out["spin_pdl_duration_ns"] = float(sp["dur"].median())
    out["spin_pdl_start_to_start_ns"] = float(sp["s2s"].median())
    out["spin_pdl_end_to_end_ns"] = float(sp["e2e"].median())
    for label in ("graph_serial3", "graph_fork3"):
        k = kern[kern["label"] == label].groupby("token").agg(s=("start_ns", "min"), e=("end_ns", "max"))
        out[f"{label}_span_ns"] = float((k["e"] - k["s"]).median())
    k3 = kern[kern["label"] == "graph_serial3"]
    out["read8_alone_ns"] = float((k3["end_ns"] - k3["start_ns"]).median())
    # launch latencies: kernel start - API call end, GPU idle
    idle = kern[kern["label"] == "eager_idle"].merge(api[["corr_id", "start_ns", "end_ns"]], on="corr_id",
                                                      suffixes=("", "_api"))
    out["eager_start_after_call_start_ns"] = float((idle["start_ns"] - idle["start_ns_api"]).median())
    out["eager_start_after_call_end_ns"] = float((idle["start_ns"] - idle["end_ns_api"]).median())
    gl = kern[kern["label"] == "graph_empty"].groupby("token").first().reset_index()
    gl = gl.merge(api[["corr_id", "start_ns", "end_ns"]], on="corr_id", suffixes=("", "_api"))
    out["graph_start_after_call_start_ns"] = float((gl["start_ns"] - gl["start_ns_api"]).median())
    out["graph_start_after_call_end_ns"] = float((gl["start_ns"] - gl["end_ns_api"]).median())
    cp_ = ev[ev["kind"] == "memcpy"]
    for label in ("h2d_pinned_big", "d2h_pinned_big", "h2d_small_pageable", "h2d_small_pinned"):
        c = cp_[cp_["label"] == label]
        out[f"{label}_ns"] = float((c["end_ns"] - c["start_ns"]).median())
        out[f"{label}_bytes"] = float(c["bytes"].median())
    return out


@dataclass
class _Prepared:
    """One calibration run's executor, warmed up (kernels compiled, graph captured) before CUPTI
    was ever enabled in the process, with its untraced timings."""

    spec: ModelSpec
    strategy: Strategy
    ex: Any
    ids: np.ndarray
    host_ops: list[dict[str, Any]]
    untraced_us_per_token: float


def _steady_us(ex: Any, a: int, b: int | None) -> float:
    us = (np.asarray(ex.times.end_ns[a:b]) - np.asarray(ex.times.start_ns[a:b])) / 1e3
    return float(np.mean(us[1:])) if len(us) > 1 else float(us[0])


def prepare_untraced(spec: ModelSpec, strategy: Strategy, tokens: int, seed: int = 0, share: Any = None) -> _Prepared:
    """Build and warm up the executor, then time ``tokens`` steps untraced with the host clock.

    Must run before CUPTI is first enabled in the process: a CUDA graph instantiated once CUPTI
    has been active stays instrumented (its launches keep costing ~0.5 us per node)."""
    from .cuda import CudaExecutor

    cfg = spec.config()
    ex = CudaExecutor(cfg, strategy, "device", seed, share=share)
    ids = np.random.default_rng(seed).integers(0, cfg.get("vocab_size"), tokens)
    p0 = spec.pos
    if any(cfg.kv_len(p0 + i) != cfg.kv_len(p0) for i in range(tokens)):
        raise ValueError(f"{spec.label}: {tokens} tokens cross a KV-length step; use fewer tokens or another pos")
    ex.prepare(p0)  # compile kernels and capture outside the measurement
    ex.step(int(ids[0]), p0)
    n1 = len(ex.times.start_ns)
    host_ops = time_host_ops(ex, ids, p0)
    return _Prepared(spec, strategy, ex, ids, host_ops, _steady_us(ex, n1, None))


def trace_executor(pr: _Prepared) -> tuple[Trace, dict[str, Any]]:
    """A CUPTI trace of the prepared run's decode steps, graph capture included (in token -1)."""
    from ..trace.cupti import CuptiCapture, copies_from_plan, sites_from_plan

    ex, p0, cfg = pr.ex, pr.spec.pos, pr.spec.config()
    b = ex.prepare(p0)
    sites = sites_from_plan(b.plan, ex.kernel_of)
    b.graph = None  # captured again below, inside the trace
    cap = CuptiCapture(sites, copies_from_plan(b.plan), model=cfg.name, strategy=pr.strategy.label(),
                       backend="cuda", device=ex.device).start()
    try:
        ex.prepare(p0)
        n0 = len(ex.times.start_ns)
        for i, tok in enumerate(pr.ids):
            ex.prepare(p0 + i)
            cap.mark_token(i)
            ex.step(int(tok), p0 + i)
    finally:
        tr = cap.stop()
    return tr, {"host_us_per_token": _steady_us(ex, n0, None), "untraced_us_per_token": pr.untraced_us_per_token,
                "host_ops": pr.host_ops, "nodes": len(b.plan.launches), "device": ex.device,
                "device_name": ex.device_name}


def time_host_ops(ex: Any, ids: Sequence[int], p0: int) -> list[dict[str, Any]]:
    """The executor's host program timed with the host clock, untraced: each host op's start
    and end (ns) per token, its kind, API, whether it is a PDL launch, and for syncs whether
    device work was pending (issued since the stream was last drained)."""
    out: list[dict[str, Any]] = []
    orig = ex._host_op
    state = {"token": -1, "i": 0, "pending": False}

    def timed(b: Any, op: Any) -> None:
        pdl = op.kind == "launch" and b.plan.launches[op.launch].pdl
        waits = op.kind == "stream_sync" and state["pending"]
        t0 = time.perf_counter_ns()
        orig(b, op)
        t1 = time.perf_counter_ns()
        out.append({"token": state["token"], "i": state["i"], "kind": op.kind, "api": op.api, "pdl": bool(pdl),
                    "blocking": bool(op.blocking), "waits": bool(waits), "start_ns": t0, "end_ns": t1})
        state["i"] += 1
        if op.kind == "stream_sync" or (op.kind.startswith("memcpy") and op.blocking):
            state["pending"] = False
        elif op.kind != "stream_sync":
            state["pending"] = True

    ex._host_op = timed
    try:
        for i, tok in enumerate(ids):
            ex.prepare(p0 + i)
            state.update(token=i, i=0)
            ex.step(int(tok), p0 + i)
    finally:
        del ex._host_op
    return out


def host_op_table(ops: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Periods of host ops timed by ``time_host_ops``: ``period_ns`` to the next op of the same
    token, and for a token's last op ``to_next_token_ns`` (its end to the next token's first op)."""
    df = pd.DataFrame(list(ops))
    if df.empty:
        return df
    df = df.sort_values("start_ns", kind="stable")
    nxt = df["start_ns"].shift(-1)
    same = df["token"].shift(-1) == df["token"]
    df["period_ns"] = np.where(same, nxt - df["start_ns"], np.nan)
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    df["to_next_token_ns"] = np.where(~same & df["token"].shift(-1).notna(), nxt - df["end_ns"], np.nan)
    first = df["token"].min()
    return df[df["token"] > first]  # steady tokens


def prepare_models(specs: Iterable[ModelSpec], strategies: Mapping[str, Strategy], tokens: int = 12,
                   seed: int = 0, log: Callable[[str], None] = print) -> list[tuple[str, _Prepared]]:
    """The untraced half: every calibration run prepared and timed before CUPTI is enabled."""
    out = []
    for spec in specs:
        first = None
        for label, st in strategies.items():
            pr = prepare_untraced(spec, st, tokens, seed, share=first)
            first = first or pr.ex
            out.append((label, pr))
            log(f"  {spec.label:32s} {label:22s} {pr.untraced_us_per_token:9.1f} us/token untraced")
    return out


def measure_models(prepared: Sequence[tuple[str, _Prepared]], log: Callable[[str], None] = print,
                   keep: Callable[[str, Trace], None] | None = None) -> dict[str, Any]:
    """The traced half: a CUPTI trace of each prepared run -> the tables the fit reads."""
    runs: list[tuple[ModelSpec, str, Trace, dict[str, Any]]] = []
    for label, pr in prepared:
        t0 = time.perf_counter()
        tr, info = trace_executor(pr)
        runs.append((pr.spec, label, tr, info))
        if keep is not None:
            keep(f"{pr.spec.label}/{label}", tr)
        log(f"  {pr.spec.label:32s} {label:22s} {info['host_us_per_token']:9.1f} us/token traced  "
            f"{len(tr)} events  {time.perf_counter() - t0:.1f} s")
    return trace_tables(runs)


def trace_tables(runs: Sequence[tuple[ModelSpec, str, Trace, Mapping[str, Any]]]) -> dict[str, Any]:
    """The raw tables of the fit from (model, strategy label, trace, info) runs: per-node
    kernel durations, host call periods, graph instantiation, PDL boundaries. ``info`` holds
    ``nodes`` (launches per token) and ``host_us_per_token``. Pure: the tests feed it
    simulator traces and check that the fit gives the simulator's parameters back."""
    kernels, periods, bounds, instantiate, rows, hostops = [], [], [], [], [], []
    by_spec: dict[ModelSpec, dict[str, Trace]] = {}
    for spec, label, tr, info in runs:
        by_spec.setdefault(spec, {})[label] = tr
        spec_cols = {f"spec_{k}": v for k, v in spec.to_dict().items()}
        kernels.append(kernel_table(tr).assign(model=spec.label, strategy=label, **spec_cols))
        ap = api_periods(tr)
        periods.append(ap[["name", "kind", "token", "start_ns", "end_ns", "period_ns", "issue_ns", "wait_ns",
                           "resume_ns", "next_token"]].assign(model=spec.label, strategy=label))
        if info.get("host_ops"):
            ho = host_op_table(info["host_ops"])
            hostops.append(ho.drop(columns=["start_ns", "end_ns"]).assign(model=spec.label, strategy=label))
        host = tr.events[tr.events["row"] == "CUDA API"]
        inst = host[host["name"].str.contains("GraphInstantiate|GraphUpload")]
        if len(inst):  # instantiate + upload of the one capture
            instantiate.append({"model": spec.label, "strategy": label, "nodes": int(info["nodes"]),
                                "ns": float((inst["end_ns"] - inst["start_ns"]).sum())})
        cap_calls = host[host["name"].str.contains("StreamBeginCapture|StreamEndCapture")]
        rows.append({"model": spec.label, "strategy": label, "host_us_per_token": info.get("host_us_per_token"),
                     **{f"spec_{k}": v for k, v in spec.to_dict().items()},
                     "tokens": int(tr.events.loc[tr.events["token"] >= 0, "token"].nunique()),
                     "untraced_us_per_token": info.get("untraced_us_per_token"),
                     "calls_per_token": float(ap.groupby("token").size().median()) if len(ap) else 0.0,
                     "capture_call_ns": float((cap_calls["end_ns"] - cap_calls["start_ns"]).median())
                     if len(cap_calls) else float("nan"), "events": len(tr), "device": info.get("device", "")})
    for spec, traces in by_spec.items():
        if "graphs+boundary" in traces and "graphs+pdl+implicit" in traces:
            bt = boundary_table(traces["graphs+boundary"], traces["graphs+pdl+implicit"])
            bounds.append(bt.assign(model=spec.label, **{f"spec_{k}": v for k, v in spec.to_dict().items()}))
    return {
        "kernels": _records(pd.concat(kernels, ignore_index=True)) if kernels else [],
        "api": _records(pd.concat(periods, ignore_index=True)) if periods else [],
        "boundaries": _records(pd.concat(bounds, ignore_index=True)) if bounds else [],
        "instantiate": instantiate,
        "runs": rows,
        "host_ops": _records(pd.concat(hostops, ignore_index=True)) if hostops else [],
    }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records"))


def environment() -> dict[str, Any]:
    """GPU name, driver, CUDA and library versions, date: what every measured file records."""
    import cupy as cp

    env: dict[str, Any] = {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                           "python": platform.python_version(), "cupy": cp.__version__}
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    env["gpu_name"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    env["driver"] = cp.cuda.runtime.driverGetVersion()
    env["cuda_runtime"] = cp.cuda.runtime.runtimeGetVersion()
    try:
        import subprocess

        env["driver_version"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                               capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001 - informative only
        env["driver_version"] = ""
    for mod in ("cupti", "cuda.bindings", "numba"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            env[mod] = getattr(m, "__version__", "")
        except Exception:  # noqa: BLE001
            env[mod] = "not installed"
    return env


def gpu_key(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; ``NVIDIA H200`` -> ``h200``."""
    low = name.lower()
    for key in ("h200", "h100", "h20", "gh200", "b200", "a100", "l40s", "l4"):
        if key in low:
            return key
    return low.replace("nvidia", "").strip().split()[0]


def warm_gpu(seconds: float = 2.0) -> float:
    """Keep the GPU busy for ``seconds`` (device-to-device copies) so its clocks have ramped up
    before anything is timed: an idle H100 reports a 345 MHz SM clock, and the first H100
    calibration call, started on an idle GPU without this, measured its untraced runs 4-25 %
    above what its own (later, traced) kernel durations and host costs add up to."""
    import cupy as cp

    a = cp.empty(1 << 28, cp.uint8)
    b = cp.empty_like(a)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(8):
            b[...] = a
        cp.cuda.runtime.deviceSynchronize()
    del a, b
    return time.perf_counter() - t0


def measure(specs: Sequence[ModelSpec] = CALIBRATION_MODELS,
            strategies: Mapping[str, Strategy] | None = None, tokens: int = 12,
            log: Callable[[str], None] = print, keep: Callable[[str, Trace], None] | None = None) -> dict[str, Any]:
    """Everything the fit needs, measured on this GPU."""
    env = environment()
    log(f"calibrating {env['gpu_name']} (driver {env['driver_version']}, CUDA runtime {env['cuda_runtime']})")
    raw: dict[str, Any] = {"format": 1, "environment": env, "gpu": gpu_key(env["gpu_name"]),
                           "models": [s.to_dict() for s in specs]}
    log(f"GPU warm-up {warm_gpu():.1f} s")
    log("executor runs, untraced (before CUPTI is first enabled)")
    prepared = prepare_models(specs, strategies or CALIBRATION_STRATEGIES, tokens, log=log)
    log("device probes")
    raw["device"] = measure_device(log)
    log("executor traces")
    raw.update(measure_models(prepared, log=log, keep=keep))
    return raw


# ------------------------------------------------------------------------------------------
# fitting (pure)
# ------------------------------------------------------------------------------------------
def _median(x: Iterable[float]) -> float:
    a = np.asarray([v for v in x if v is not None and v == v], dtype=float)
    return float(np.median(a)) if len(a) else float("nan")


#: measured kernels an op (or an op's executor kernel) needs for a fit of its own; with fewer it
#: takes its kernel family's
MIN_OP_KERNELS = 3


@dataclass(frozen=True)
class KernelFit:
    """``duration ~ fixed_ns + work_scale x roofline`` for one group of kernels, how it was
    fitted (``how``, for the calibration's sources) and its median relative error."""

    fixed_ns: float
    work_scale: float
    median_rel_err: float
    how: str


def fit_kernels(durations: np.ndarray, roofline: np.ndarray, min_fixed: float = 0.0) -> KernelFit:
    """``duration ~ fixed + scale x roofline`` by least squares in *absolute* error.

    Absolute, not relative, because what the simulator must reproduce is us/token, a sum of
    kernel durations: with an intercept the residuals of an absolute fit sum to zero, so the
    fitted kernels' total time over the calibration tokens comes out exact, and each kernel
    weighs by its duration (a 150 us lm_head mat-vec counts for what its time is worth, not as
    one of a hundred 2 us kernels). A relative fit weighs every kernel alike and lets the few big
    ones, most of a token, drift. The price: small kernels sharing a fit with big ones get larger
    relative errors, so kernels that differ in kind are fitted apart (per op, and per executor
    kernel where an op has several).

    Where the roofline varies by less than a tenth of the typical duration (one size, or sizes
    the roofline cannot tell apart) the slope is not identifiable: the roofline is kept (scale 1)
    and only the fixed part is fitted. Where durations fall as the roofline grows, a constant."""
    d, r = np.asarray(durations, float), np.asarray(roofline, float)
    sizes = len(np.unique(np.round(r, 3)))
    how = f"least-squares fit (absolute error) of fixed + scale x roofline to {len(d)} kernels ({sizes} sizes)"
    if len(d) >= 2 and np.ptp(r) > 0.1 * np.median(d):
        A = np.stack([np.ones_like(r), r], axis=1)
        (fixed, scale), *_ = np.linalg.lstsq(A, d, rcond=None)
    else:
        fixed, scale = float(np.mean(d - r)), 1.0
        how = (f"mean of duration - roofline over {len(d)} kernels ({sizes} sizes; roofline spread {np.ptp(r):.0f} ns, "
               "under a tenth of a typical duration: no slope fitted, scale 1)")
    if scale <= 0:
        fixed, scale = float(np.mean(d)), 0.0
        how = (f"mean duration of {len(d)} kernels ({sizes} sizes; durations do not grow with the roofline: "
               "a constant, scale 0)")
    if fixed < min_fixed:  # keep the fixed part >= what PDL overlaps; refit the slope
        fixed = min_fixed
        scale = max(0.0, float(np.sum(r * (d - fixed)) / max(np.sum(r * r), 1e-30)))
        how += f", fixed part held at its floor {min_fixed:.0f} ns (pdl_prologue_ns + pdl_first_read_setup_ns)"
    pred = fixed + scale * r
    return KernelFit(float(fixed), float(scale), float(np.median(np.abs(pred - d) / d)), how)


def _fit_groups(kern: pd.DataFrame, by: str, label: str, min_kernels: int, min_fixed: float,
                what: str) -> tuple[dict[str, tuple[dict[str, float], str]], list[dict[str, Any]]]:
    """A ``fit_kernels`` per value of column ``by`` with at least ``min_kernels`` kernels:
    ``{name: ({fixed_ns, work_scale}, source text)}`` and report rows (``label``: the name's key
    there). ``what`` says where the durations come from."""
    fits, report = {}, []
    for name, grp in kern.groupby(by):
        if len(grp) < min_kernels:
            continue
        f = fit_kernels(grp["duration_ns"].to_numpy(), grp["roofline_ns"].to_numpy(), min_fixed)
        fits[str(name)] = ({"fixed_ns": round(f.fixed_ns, 1), "work_scale": round(f.work_scale, 4)},
                           f"{f.how} {what}; median fit error {100 * f.median_rel_err:.1f}%")
        report.append({label: str(name), "kernels": len(grp), "sizes": int(grp["roofline_ns"].round(3).nunique()),
                       "fixed_ns": f.fixed_ns, "work_scale": f.work_scale, "median_rel_err": f.median_rel_err,
                       "measured_us": float(grp["duration_ns"].sum() / 1e3)})
    return fits, report


def _spec_plans(kt: pd.DataFrame, strategy: str) -> Iterable[tuple[tuple, pd.DataFrame, dict[str, Any]]]:
    """Per calibration model in the kernel table: its rows under ``strategy`` and its Plan's
    nodes by name."""
    from ..models import build_graph
    from ..strategy.compile import compile_plan

    keys = ["spec_model", "spec_layers", "spec_context", "spec_pos"]
    for key, grp in kt[kt["strategy"] == strategy].groupby(keys, dropna=False):
        model, layers, context, pos = key
        cfg = load_config(model, layers=None if layers != layers else int(layers),
                          context=None if context != context else int(context))
        plan = compile_plan(build_graph(cfg, cfg.kv_len(int(pos))), CALIBRATION_STRATEGIES[strategy])
        yield key, grp, {la.node.name: la.node for la in plan.launches}


def measured_kernels(raw: Mapping[str, Any], cal: Calibration, cupti_ns: float = 0.0,
                     strategy: str = "graphs+boundary") -> pd.DataFrame:
    """Every Plan node's kernel measured under ``strategy`` in the calibration models: its op,
    family, the kernel the cuda executor binds for it (``cost.executor_kernel``: the same name
    the simulator looks its fit up by), its measured ``duration_ns`` less ``cupti_ns`` (what
    CUPTI adds per traced kernel), and its ``roofline_ns`` on ``cal`` (alone, at its cap) and
    ``predicted_ns`` (``kernel_cost(node, cal).duration_ns``)."""
    from .cost import executor_kernel, kernel_cost

    rows = []
    for _, grp, nodes in _spec_plans(pd.DataFrame(raw["kernels"]), strategy):
        for r in grp.itertuples():
            node = nodes.get(r.node)
            if node is None:
                continue
            c = kernel_cost(node, cal)
            rows.append({"model": r.model, "node": r.node, "op": node.op, "family": node.family,
                         "kernel": executor_kernel(node) or r.name, "duration_ns": r.duration_ns - cupti_ns,
                         "roofline_ns": c.work_ns / c.cap if c.work_ns > 0 else 0.0,
                         "predicted_ns": c.duration_ns})
    return pd.DataFrame(rows, columns=["model", "node", "op", "family", "kernel", "duration_ns", "roofline_ns",
                                       "predicted_ns"])


def calibration_run_errors(raw: Mapping[str, Any], cal: Calibration) -> pd.DataFrame:
    """Self-consistency of a calibration: the simulator with ``cal`` predicts every calibration
    run of ``raw`` (same model, strategy, start position and tokens as measured). Per run:
    measured (untraced) and predicted us/token and the error; and, for the graph-replay run of
    each model, its kernels' time per token measured (CUPTI durations less what tracing adds)
    and predicted, which separates the kernel-duration model from the rest of the simulator."""
    from .sim import run_sim

    runs = pd.DataFrame(raw["runs"])
    inflation = cupti_kernel_ns(raw)
    kern = measured_kernels(raw, cal, inflation).groupby("model")[["duration_ns", "predicted_ns"]].sum() / 1e3
    rows = []
    for r in runs.itertuples():
        spec = ModelSpec(r.spec_model, None if r.spec_layers != r.spec_layers else int(r.spec_layers),
                         None if r.spec_context != r.spec_context else int(r.spec_context), int(r.spec_pos))
        us = run_sim(spec.config(), CALIBRATION_STRATEGIES[r.strategy], int(r.tokens), start_pos=spec.pos,
                     calibration=cal).stats["us_per_token"]
        row = {"model": r.model, "strategy": r.strategy, "measured_us": float(r.untraced_us_per_token),
               "predicted_us": us, "error_pct": 100 * (us / r.untraced_us_per_token - 1)}
        if r.strategy == "graphs+boundary" and r.model in kern.index:
            m, p = kern.loc[r.model, "duration_ns"], kern.loc[r.model, "predicted_ns"]
            row.update(kernel_measured_us=m, kernel_predicted_us=p, kernel_error_pct=100 * (p / m - 1))
        rows.append(row)
    return pd.DataFrame(rows)


def _host(api: pd.DataFrame, strategy: str, names: Sequence[str], col: str = "period_ns") -> tuple[float, int]:
    a = api[(api["strategy"] == strategy) & api["name"].isin(names) & (api["next_token"] == api["token"])]
    v = a[col].dropna()
    return float(v.median()) if len(v) else float("nan"), int(len(v))


def cupti_kernel_ns(raw: Mapping[str, Any]) -> float:
    """What CUPTI tracing adds per kernel under graph replay (0 where the raw file cannot say):
    median over the graph-replay calibration runs of (traced - untraced us/token - (traced -
    untraced host-call time per token)) / kernels per token."""
    runs, api, ho, kt = (pd.DataFrame(raw.get(k, [])) for k in ("runs", "api", "host_ops", "kernels"))
    if runs.empty or ho.empty or "untraced_us_per_token" not in runs or "duration_ns" not in ho:
        return 0.0
    api = api.assign(dur=api["end_ns"] - api["start_ns"])
    per = []
    for r in runs[runs["strategy"].str.startswith("graphs")].itertuples():
        a = api[(api["model"] == r.model) & (api["strategy"] == r.strategy)]
        h = ho[(ho["model"] == r.model) & (ho["strategy"] == r.strategy)]
        n = len(kt[(kt["model"] == r.model) & (kt["strategy"] == r.strategy)])
        if a.empty or h.empty or not n or r.untraced_us_per_token != r.untraced_us_per_token:
            continue
        calls = a.groupby("token")["dur"].sum().median() - h.groupby("token")["duration_ns"].sum().median()
        per.append(((r.host_us_per_token - r.untraced_us_per_token) * 1e3 - calls) / n)
    v = _median(per)
    return v if v > 0 else 0.0


def fit(raw: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """Raw measurements + the shipped calibration file (dict) -> the measured calibration file.

    Fields measured here replace the shipped ones and their sources say how they were measured;
    the other host profiles (llama.cpp's) are kept as shipped."""
    env, dev = raw["environment"], raw["device"]
    pt = dev["probe_trace_summary"]
    where = (f"measured by `workbench calibrate` on {env['gpu_name']} (driver {env.get('driver_version', '')}, "
             f"CUDA runtime {env.get('cuda_runtime', '')}, {env['date'][:10]})")
    out = json.loads(json.dumps(base))
    out["gpu"] = raw.get("gpu", out["gpu"])
    out["name"] = env["gpu_name"]
    d, src = out["device"], out["sources"]
    hp = out["host_profiles"].setdefault("python", {})

    def setd(key: str, value: float, how: str) -> None:
        if value != value:
            raise ValueError(f"calibration fit: {key} came out NaN ({how}); the raw measurements lack it")
        d[key] = round(float(value), 4) if key not in ("sm_count", "max_threads_per_sm") else int(value)
        src[f"device.{key}"] = f"{where}: {how}"

    def seth(key: str, value: float, how: str, n: int | None = None) -> None:
        if value != value:
            raise ValueError(f"calibration fit: host cost {key} came out NaN ({how}); the raw measurements lack it")
        hp[key] = round(max(0.0, float(value)), 1)
        src[f"host_profiles.python.{key}"] = f"{where}: {how}" + (f" (n={n})" if n is not None else "")

    d["compute_capability"] = list(dev["compute_capability"])
    src["device.compute_capability"] = f"{where}: cudaGetDeviceProperties"
    setd("sm_count", dev["sm_count"], "cudaGetDeviceProperties.multiProcessorCount")
    setd("max_threads_per_sm", dev["max_threads_per_sm"], "cudaGetDeviceProperties.maxThreadsPerMultiProcessor")
    setd("dram_bandwidth_GBps", dev["copy_d2d_GBps"],
         "1 GiB device-to-device copy (CuPy copyto), bytes read + written / median time of 8 (CUDA events)")
    reads = dev["read_probe"]
    full = max(r["GBps"] for r in reads)
    setd("dram_efficiency", min(1.0, full / dev["copy_d2d_GBps"]),
         f"streaming-read probe at full grid ({full:.0f} GB/s) / device-to-device copy bandwidth")
    bif = dev["read_bytes_in_flight_per_thread"]
    lat = [r["threads"] * bif / (r["GBps"]) for r in reads if r["GBps"] < 0.3 * full]
    setd("dram_latency_ns", _median(lat),
         f"Little's law on the streaming-read probe below 30% of peak bandwidth ({bif} B in flight per thread): "
         "threads x bytes in flight / achieved bandwidth, median over grid sizes")
    setd("bytes_in_flight_per_thread", bif,
         "the read probe's two 16-byte loads in flight per thread, the same depth the latency above was measured with")
    setd("fp32_TFLOPS", dev["fp32_TFLOPS"],
         "FMA probe: 8 independent fmaf chains per thread, 8 blocks x 256 threads per SM")
    pcie = pt["h2d_pinned_big_bytes"] / pt["h2d_pinned_big_ns"]
    setd("pcie_GBps", pcie, "256 MiB pinned H2D cudaMemcpyAsync, CUPTI memcpy duration")
    pageable, pinned = pt["h2d_small_pageable_ns"], pt["h2d_small_pinned_ns"]
    setd("memcpy_latency_ns", (pageable + pinned) / 2 - 16 / pcie,
         f"16-byte H2D copies, CUPTI memcpy duration: pageable cudaMemcpy {pageable:.0f} ns and pinned "
         f"cudaMemcpyAsync {pinned:.0f} ns, mean, minus bytes / pcie_GBps")

    api = pd.DataFrame(raw["api"])
    kt = pd.DataFrame(raw["kernels"])
    # Host costs come from the untraced pass, timed with the host clock (``host_ops``): CUPTI's
    # API tracing lengthens calls (cudaGraphLaunch by ~0.5 us per graph node). Without it (older
    # raw files, simulator round trips) they come from the traced periods.
    ho = pd.DataFrame(raw.get("host_ops", []))

    def untraced(strategies: Sequence[str], **match: Any) -> tuple[float, int]:
        if ho.empty:
            return float("nan"), 0
        m = ho["strategy"].isin(strategies)
        for k, v in match.items():
            m &= ho[k].isin(v) if isinstance(v, tuple) else (ho[k] == v)
        vals = ho.loc[m, "period_ns"].dropna()
        return (float(vals.median()), len(vals)) if len(vals) else (float("nan"), 0)

    clock = "host-clock period (op start to the next op's start, untraced) of"

    def host_cost(key: str, strategies: Sequence[str], match: Mapping[str, Any], apis: Sequence[str], what: str,
                  strategy_traced: str) -> float:
        v, n = untraced(strategies, **match)
        if n:
            seth(key, v, f"median {clock} {what} in executor runs ({', '.join(strategies)}) of the calibration "
                         "models", n)
        else:
            v, n = _host(api, strategy_traced, apis)
            seth(key, v, f"median CUPTI period (call start to next call start) of {what} in {strategy_traced} "
                         "executor runs of the calibration models", n)
        return v

    # how much CUPTI lengthens a call: traced minus untraced period of the same calls
    pairs = [("eager", LAUNCH_APIS, {"kind": "launch"}), ("graphs+boundary", ("cudaMemcpyAsync",),
             {"kind": "memcpy_h2d"}), ("eager+qkv+boundary", ("cudaEventRecord",), {"kind": "event_record"})]
    infl = [(_host(api, st_, names)[0] - untraced([st_], **m)[0]) for st_, names, m in pairs]
    cupti_ns = _median(infl)
    cupti_ns = cupti_ns if cupti_ns > 0 else 0.0

    # kernel gaps in graph replay of the models (no PDL, one stream)
    g = kt[kt["strategy"] == "graphs+boundary"]["gap_ns"].dropna()
    setd("dependency_gap_ns", _median(g),
         "median gap between consecutive kernels of one stream under graph replay of the calibration models "
         f"(n={len(g)})")

    # eager launches: the gap before a kernel that was already queued behind its predecessor
    ek = kt[kt["strategy"] == "eager"]
    if "queued_ns" in ek:
        queued = ek[ek["queued_ns"] > 2000]
        ek = queued if len(queued) else ek
    setd("eager_dependency_gap_ns", _median(ek["gap_ns"]),
         "median gap between consecutive kernels of one stream in eager executor runs of the calibration models, "
         f"over kernels that started > 2 us after their launch call returned (queued) (n={len(ek)})")

    # launch latencies relative to the simulator's host time line (call start + call cost)
    launch_ns = host_cost("launch_ns", ["eager"], {"kind": "launch", "pdl": False}, LAUNCH_APIS,
                          "cuLaunchKernelEx", "eager")
    host_cost("launch_pdl_ns", ["eager+pdl"], {"kind": "launch", "pdl": True}, LAUNCH_APIS,
              "cuLaunchKernelEx with the PDL attribute", "eager+pdl")
    graph_ns = host_cost("graph_launch_ns", ["graphs+boundary", "graphs+pdl+implicit"], {"kind": "graph_launch"},
                         ("cudaGraphLaunch",), "cudaGraphLaunch", "graphs+boundary")
    def after_call(kind: str) -> float:
        """Untraced host time from an op's return to the next op (the simulator's call cost
        includes it, so the device latency after the call is shortened by it)."""
        if ho.empty or "duration_ns" not in ho:
            return float("nan")
        m = ho[ho["kind"] == kind]
        return _median(m["period_ns"] - m["duration_ns"])

    def set_latency(field: str, kind: str, probe: str, call_cost: float, what: str, call: str) -> None:
        """``field``: device start after the call, on the simulator's host time line."""
        tail = after_call(kind)
        if tail == tail:
            setd(field, max(0.0, pt[f"{probe}_start_after_call_end_ns"] - tail),
                 f"probe (CUPTI): {what} starts {pt[f'{probe}_start_after_call_end_ns']:.0f} ns after {call} "
                 f"returns on an idle GPU, minus the {tail:.0f} ns of host time after the call that "
                 f"host_profiles.python.{kind}_ns already counts (host clock, untraced)")
        else:
            setd(field, max(0.0, pt[f"{probe}_start_after_call_start_ns"] - call_cost),
                 f"probe: {what} starts {pt[f'{probe}_start_after_call_start_ns']:.0f} ns after {call} "
                 f"starts on an idle GPU, minus the call's cost (host_profiles.python.{kind}_ns)")

    set_latency("launch_latency_ns", "launch", "eager", launch_ns, "an empty kernel", "its launch call")
    set_latency("graph_launch_latency_ns", "graph_launch", "graph", graph_ns, "a graph's first kernel",
                "cudaGraphLaunch")
    host_cost("memcpy_async_ns", ["graphs+boundary", "graphs+pdl+implicit", "eager+qkv+boundary"],
              {"kind": ("memcpy_h2d", "memcpy_d2h"), "blocking": False}, ("cudaMemcpyAsync",),
              "cudaMemcpyAsync (pinned staging)", "graphs+boundary")
    # a blocking copy: the simulator charges the time until the copy starts, then the copy and a wake-up
    v, n = untraced(["eager", "eager+pdl", "graphs+boundary", "eager+qkv+boundary"], kind="stream_sync", waits=False)
    if n:
        seth("stream_sync_ns", v, f"median {clock} cudaStreamSynchronize with no device work pending", n)
    else:
        sy = api[(api["kind"] == "sync") & api["wait_ns"].isna() & (api["next_token"] == api["token"])]
        seth("stream_sync_ns", _median(sy["period_ns"]), "median CUPTI period of cudaStreamSynchronize on an "
             "idle stream", len(sy))
    waited = api[(api["kind"] == "sync") & api["wait_ns"].notna()]
    within = waited[waited["next_token"] == waited["token"]]
    seth("sync_wakeup_ns", max(0.0, _median(within["resume_ns"]) - cupti_ns),
         "median time from the end of the awaited device work to the host's next call over syncs that waited "
         f"inside a token (CUPTI), minus {cupti_ns:.0f} ns that CUPTI adds to a call (traced - untraced periods of "
         "the same calls)", len(within))
    # a blocking copy: the simulator charges this, then the copy (memcpy_latency_ns + bytes / pcie_GBps), then
    # the wake-up; the three together are the measured period
    per_copy = api[(api["strategy"] == "eager") & (api["name"] == "cudaMemcpy")]
    v, n = untraced(["eager", "eager+pdl"], kind="memcpy_h2d", blocking=True)
    if n:
        copy = d["memcpy_latency_ns"] + 16 / d["pcie_GBps"]
        seth("memcpy_blocking_ns", v - copy - hp["sync_wakeup_ns"], f"median {clock} the blocking cudaMemcpy "
             f"(pageable staging, per-copy runs), {v:.0f} ns, minus the copy ({copy:.0f} ns) and the wake-up "
             "(sync_wakeup_ns) the simulator adds to it", n)
    else:
        seth("memcpy_blocking_ns", _median(per_copy["issue_ns"]), "median CUPTI time from a blocking cudaMemcpy's "
             "start to its copy starting on the device (per-copy runs)", len(per_copy))
    # the host work between tokens (inputs, staging, logits) that no API call covers
    tok = ho["to_next_token_ns"].dropna() if "to_next_token_ns" in ho else pd.Series(dtype=float)
    if len(tok):
        seth("token_overhead_ns", float(tok.median()), "median host-clock time (untraced) from the return of a "
             "token's final sync to the next token's first call: the executor's per-token Python (input values, "
             "staging, logits copy)", len(tok))
    else:
        last = waited[waited["next_token"] == waited["token"] + 1]
        seth("token_overhead_ns", _median(last["resume_ns"]) - hp["sync_wakeup_ns"], "median CUPTI time from the "
             "end of a token's last device work to the next token's first call, minus sync_wakeup_ns", len(last))
    host_cost("event_record_ns", ["eager+qkv+boundary"], {"kind": "event_record"}, ("cudaEventRecord",),
              "cudaEventRecord", "eager+qkv+boundary")
    host_cost("stream_wait_event_ns", ["eager+qkv+boundary"], {"kind": "stream_wait_event"},
              ("cudaStreamWaitEvent",), "cudaStreamWaitEvent", "eager+qkv+boundary")
    caps = [r["capture_call_ns"] for r in raw["runs"] if r["capture_call_ns"] == r["capture_call_ns"]]
    seth("capture_ns", _median(caps), "median duration of cudaStreamBeginCapture / EndCapture calls", len(caps))
    inst = pd.DataFrame(raw["instantiate"])
    if len(inst) >= 2 and inst["nodes"].nunique() >= 2:
        slope, icpt = np.polyfit(inst["nodes"], inst["ns"], 1)
    else:
        slope, icpt = (float(inst["ns"].median() / inst["nodes"].median()), 0.0) if len(inst) else (np.nan, np.nan)
    seth("graph_instantiate_ns", max(0.0, icpt), "intercept of a line through cudaGraphInstantiate durations vs "
         "graph nodes of the calibration models", len(inst))
    seth("graph_instantiate_per_node_ns", max(0.0, slope), "slope of the same line", len(inst))

    # PDL: start-to-start in a chain of spin kernels that trigger at start; per-boundary savings
    setd("pdl_launch_ns", pt["spin_pdl_start_to_start_ns"],
         "CUPTI: chain of 16 spin kernels (132 blocks, trigger at start) under graph + PDL, median start-to-start")
    bt = pd.DataFrame(raw["boundaries"])
    saving = _median(bt["saving_ns"]) if len(bt) else float("nan")
    prologue = min(float(d["pdl_prologue_ns"]), float(pt["empty_duration_ns"]))
    # simulator: with PDL a boundary takes release - prologue - setup + the kernel; without, gap + the kernel
    release = d["dependency_gap_ns"] - saving + prologue + d["pdl_first_read_setup_ns"]
    setd("pdl_release_ns", max(0.0, release),
         f"per-boundary saving of graph + PDL over graph replay in the calibration models (median {saving:.0f} ns "
         f"over {len(bt)} kernel pairs, by family pair in the raw file) = gap - release + prologue")
    shipped = str(src.get("device.pdl_prologue_ns", ""))
    shipped = shipped.split("pdl_release_ns); ", 1)[1] if shipped.startswith("kept at ") else shipped
    src["device.pdl_prologue_ns"] = (f"kept at {prologue:.0f} ns (shipped value): CUPTI timestamps do not separate "
                                     "the prologue from the release (only release - prologue is observable, see "
                                     "pdl_release_ns); " + shipped)
    d["pdl_prologue_ns"] = prologue

    # kernel durations: fixed + scale x roofline per ggml op (and per executor kernel where an op
    # has several), per kernel family as the fallback for ops not measured
    inflation = cupti_kernel_ns(raw)
    base_cal = replace(parse_calibration(out, "fit", "python"), families={}, ops={})
    kern = measured_kernels(raw, base_cal, inflation)
    min_fixed = d["pdl_prologue_ns"] + d["pdl_first_read_setup_ns"]
    for k in [k for k in src if k.startswith(("families.", "ops."))]:
        del src[k]  # the base's fits are replaced, not merged
    what = (f"of the calibration models under graph replay, their CUPTI durations less {inflation:.0f} ns "
            "per kernel that tracing adds (graph-replay calibration runs timed traced and untraced)")
    families, fam_report = _fit_groups(kern, "family", "family", 1, min_fixed, what)
    ops, op_report = _fit_groups(kern, "op", "op", MIN_OP_KERNELS, min_fixed, what)
    # an op whose nodes ran on different kernels of the executor (MUL_MAT: per-row vs row-streaming
    # mat-vec) also gets a fit per kernel, which the simulator prefers (cost.measured_fit)
    split = kern.groupby("op")["kernel"].nunique()
    multi = kern[kern["op"].isin(split[split > 1].index)]
    op_kernels, opk_report = _fit_groups(multi.assign(key=multi["op"] + "/" + multi["kernel"]), "key", "op",
                                         MIN_OP_KERNELS, min_fixed, what)
    ops.update(op_kernels)
    for section, fits in (("families", families), ("ops", ops)):
        for name, (fc, how) in fits.items():
            for k in fc:
                src[f"{section}.{name}.{k}"] = f"{where}: {how}"
    out["families"] = {name: fc for name, (fc, _) in families.items()}
    out["ops"] = {name: fc for name, (fc, _) in sorted(ops.items())}
    fixed = [fc["fixed_ns"] for fc in out["families"].values()]
    fallback = _median(fixed) if fixed else pt["empty_duration_ns"]
    setd("kernel_fixed_ns", max(min_fixed, fallback),
         f"median fixed cost of the {len(fixed)} fitted kernel families; used for families the calibration did "
         f"not measure (an empty kernel, {pt['empty_duration_ns']:.0f} ns under graph replay (CUPTI), is only a lower "
         "bound: every measured family pays 2-4x that for its memory round trips and reductions)")
    out["measured"] = {"environment": env, "models": raw.get("models", []), "family_fits": fam_report,
                       "op_fits": op_report + opk_report, "cupti_kernel_ns": inflation}
    for k in [k for k in src if k.startswith("host_profiles.llama.cpp") and "python value" in str(src[k])
              and "datasheet-era" not in str(src[k])]:
        src[k] = str(src[k]).replace("python value", "datasheet-era python value")
    return out


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------
def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="calibration file to write (default data/calibration/<gpu>.json of this GPU)")
    p.add_argument("--raw", help="also write the raw measurements (JSON, gzip'd if it ends in .gz) here")
    p.add_argument("--from-raw", metavar="RAW", help="fit a calibration from raw measurements (.json or .json.gz); "
                                                     "no GPU needed")
    p.add_argument("--base", help="calibration to start from (default: the shipped one of the same GPU)")
    p.add_argument("--tokens", type=int, default=12, help="decode steps per traced executor run (default 12)")
    p.add_argument("--check", action="store_true", help="after fitting, predict every calibration run of the raw "
                                                        "measurements with the fitted file and print the errors")
    default = ",".join(f"{s.model}:{s.layers}:{s.context}" for s in CALIBRATION_MODELS)
    p.add_argument("--models", help=f"comma-separated preset[:layers[:context]] to measure (default {default})")


def parse_models(text: str | None) -> list[ModelSpec]:
    if not text:
        return list(CALIBRATION_MODELS)
    out = []
    for part in text.split(","):
        bits = part.strip().split(":")
        out.append(ModelSpec(bits[0], int(bits[1]) if len(bits) > 1 and bits[1] else None,
                             int(bits[2]) if len(bits) > 2 and bits[2] else None))
    return out


def _read_json(path: Path) -> Any:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _write_json(path: Path, obj: Any) -> None:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))


def main(args: argparse.Namespace) -> int:
    if args.from_raw:
        raw = _read_json(Path(args.from_raw))
    else:
        from .kernels import require_cupy

        require_cupy()
        raw = measure(parse_models(args.models), tokens=args.tokens, log=lambda s: print(s, file=sys.stderr))
        if args.raw:
            _write_json(Path(args.raw), raw)
    gpu = raw.get("gpu", "gpu")
    base_path = Path(args.base) if args.base else CALIBRATION_DIR / f"{gpu}.json"
    if not base_path.exists():
        base_path = CALIBRATION_DIR / "h100.json"
    cal = fit(raw, json.loads(base_path.read_text()))
    from .fit_eager import fit as fit_eager
    from .fit_eager import has_eager_runs

    if has_eager_runs(raw):  # the eager PDL / multi-stream front-end parameters (simulator in the loop)
        cal = fit_eager(raw, cal, log=lambda s: print(s, file=sys.stderr))
    parsed = parse_calibration(cal, "fitted calibration")  # the simulator must be able to read it
    out = Path(args.out) if args.out else CALIBRATION_DIR / f"{gpu}.json"
    out.write_text(json.dumps(cal, indent=2) + "\n")
    print(f"wrote {out} ({cal['name']}); {len(cal['ops'])} ggml ops (or op/kernel pairs) and "
          f"{len(cal['families'])} kernel families fitted", file=sys.stderr)
    for f in [*cal["measured"]["op_fits"], *cal["measured"]["family_fits"]]:
        name = f.get("op", f.get("family"))
        print(f"  {name:34s} {f['kernels']:4d} kernels {f['sizes']:3d} sizes  fixed {f['fixed_ns']:7.0f} ns  "
              f"scale {f['work_scale']:.3f}  median error {100 * f['median_rel_err']:5.1f}%", file=sys.stderr)
    if args.check:
        t = calibration_run_errors(raw, parsed)
        print("calibration runs predicted with the fitted file (untraced us/token; kernels: graph replay, per token)",
              file=sys.stderr)
        print(t.to_string(index=False, float_format=lambda v: f"{v:.1f}"), file=sys.stderr)
    return 0
