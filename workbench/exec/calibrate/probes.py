"""Probe kernels on the GPU: memory bandwidth and latency, FMA rate, launch and graph-launch
latencies, a PDL chain, copies and stream concurrency, timed with CUDA events and CUPTI."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ...trace import Trace, rebased
from ...trace.cupti import CuptiCapture, cupti_available
from ..device import device_info
from .probe_source import PROBE_SRC, READ_BYTES_IN_FLIGHT


def _cupti_capture() -> CuptiCapture:
    """A CUPTI capture, or an error that says how to get one (the probes need its timestamps)."""
    if not cupti_available():
        raise RuntimeError("workbench calibrate reads kernel and API timestamps from CUPTI: install cupti-python "
                           "(pip install cupti-python, or the `gpu` extra)")
    return CuptiCapture()


class _Probes:
    """The probe kernels on one stream, launched plain, with PDL, or captured into graphs."""

    def __init__(self) -> None:
        import cupy as cp

        from ..kernels import LaunchHandle

        self.cp = cp
        self.device = device_info()
        self.mod = cp.RawModule(code=PROBE_SRC, options=(f"-arch={self.device.arch}",))
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
    raw["sm_count"] = pr.device.sm_count
    raw["max_threads_per_sm"] = pr.device.max_threads_per_sm
    raw["compute_capability"] = list(pr.device.compute_capability)

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

    cap = _cupti_capture().start()
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
    raw["probe_trace_summary"] = probe_summary(tr, [m for m, _ in marks])
    log("  " + ", ".join(f"{k}={v:.0f}" for k, v in raw["probe_trace_summary"].items() if isinstance(v, float)))
    return raw


def probe_summary(tr: Trace, labels: Sequence[str]) -> dict[str, float]:
    """Numbers from the CUPTI trace of the probe runs (token i = the i-th mark)."""
    ev = rebased(tr.events)
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
