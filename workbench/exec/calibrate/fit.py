"""``fit``: raw measurements -> the calibration file the simulator reads (pure, no GPU).

One step per group of fields, in the order the simulator's model builds on them: the device
from the probes, kernel gaps, launches and their latencies, copies and syncs, events and graphs,
PDL, then kernel durations. Each measured field records in ``sources`` how it was measured.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..calibration import parse_calibration
from ..cost import FUSED_BASE
from .kernel_fit import (
    EARLY_MIN_EXTRA_NS,
    MIN_OP_KERNELS,
    calibration_boundary_prologues,
    cupti_kernel_ns,
    early_launch,
    fit_groups,
    measured_kernels,
    pdl_saving_ns,
)
from .specs import DURATION_RUNS, EAGER, EAGER_PDL, EAGER_QKV, GRAPH_RUNS, GRAPHS, GRAPHS_PDL
from .tables import LAUNCH_APIS, nan_median

#: how the untraced host costs were timed (the start of their source text)
CLOCK = "host-clock period (op start to the next op's start, untraced) of"


class _Output:
    """The calibration file being written: the base file's fields, overwritten by measured
    values, each with its source (``where`` it was measured + how)."""

    def __init__(self, raw: Mapping[str, Any], base: Mapping[str, Any]) -> None:
        env = raw["environment"]
        self.where = (f"measured by `workbench calibrate` on {env['gpu_name']} (driver "
                      f"{env.get('driver_version', '')}, CUDA runtime {env.get('cuda_runtime', '')}, "
                      f"{env['date'][:10]})")
        self.out: dict[str, Any] = json.loads(json.dumps(base))
        self.out["grids"] = "executor"  # the kernel fits below are made under the executor's own grids
        self.out["gpu"] = raw.get("gpu", self.out["gpu"])
        self.out["name"] = env["gpu_name"]
        self.device: dict[str, Any] = self.out["device"]
        self.sources: dict[str, Any] = self.out["sources"]
        self.host: dict[str, Any] = self.out["host_profiles"].setdefault("python", {})

    def set_device(self, key: str, value: float, how: str) -> None:
        if value != value:
            raise ValueError(f"calibration fit: {key} came out NaN ({how}); the raw measurements lack it")
        self.device[key] = round(float(value), 4) if key not in ("sm_count", "max_threads_per_sm") else int(value)
        self.sources[f"device.{key}"] = f"{self.where}: {how}"

    def set_host(self, key: str, value: float, how: str, n: int | None = None) -> None:
        if value != value:
            raise ValueError(f"calibration fit: host cost {key} came out NaN ({how}); the raw measurements lack it")
        self.host[key] = round(max(0.0, float(value)), 1)
        self.sources[f"host_profiles.python.{key}"] = f"{self.where}: {how}" + (f" (n={n})" if n is not None else "")


class _HostTimes:
    """Where host costs come from: the untraced pass timed with the host clock (``host_ops``),
    because CUPTI's API tracing lengthens calls (cudaGraphLaunch most, per graph node); without
    it (older raw files, simulator round trips) the traced CUPTI periods (``api``)."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.api = pd.DataFrame(raw["api"])
        self.ops = pd.DataFrame(raw.get("host_ops", []))
        self.hook_ns = timing_cost_ns(raw)
        self.step_ns, self.step_runs = step_host_ns(raw, self.hook_ns)
        if self.hook_ns > 0:  # each period without what timing it cost (the runs users make are not timed so)
            self.ops["period_ns"] = self.ops["period_ns"] - self.hook_ns
            if "to_next_token_ns" in self.ops:
                self.ops["to_next_token_ns"] = self.ops["to_next_token_ns"] - self.hook_ns

    def untraced(self, strategies: Sequence[str], **match: Any) -> tuple[float, int]:
        """Median host-clock period and count of the host ops of ``strategies`` matching
        ``match`` (column -> value, or a tuple of values)."""
        ho = self.ops
        if ho.empty:
            return float("nan"), 0
        m = ho["strategy"].isin(strategies)
        for k, v in match.items():
            m &= ho[k].isin(v) if isinstance(v, tuple) else (ho[k] == v)
        vals = ho.loc[m, "period_ns"].dropna()
        return (float(vals.median()), len(vals)) if len(vals) else (float("nan"), 0)

    def traced(self, strategy: str, names: Sequence[str], col: str = "period_ns") -> tuple[float, int]:
        """Median CUPTI ``col`` and count of the API calls ``names`` inside a token of ``strategy``."""
        api = self.api
        a = api[(api["strategy"] == strategy) & api["name"].isin(names) & (api["next_token"] == api["token"])]
        v = a[col].dropna()
        return float(v.median()) if len(v) else float("nan"), int(len(v))

    def after_call(self, kind: str) -> float:
        """Untraced host time from an op's return to the next op (the simulator's call cost
        includes it, so the device latency after the call is shortened by it)."""
        ho = self.ops
        if ho.empty or "duration_ns" not in ho:
            return float("nan")
        m = ho[ho["kind"] == kind]
        return max(0.0, nan_median(m["period_ns"] - m["duration_ns"]))

    def cupti_call_ns(self) -> float:
        """How much CUPTI lengthens a call: traced minus untraced period of the same calls."""
        pairs = [(EAGER, LAUNCH_APIS, {"kind": "launch"}), (GRAPHS, ("cudaMemcpyAsync",), {"kind": "memcpy_h2d"}),
                 (EAGER_QKV, ("cudaEventRecord",), {"kind": "event_record"})]
        v = nan_median(self.traced(st, names)[0] - self.untraced([st], **m)[0] for st, names, m in pairs)
        return v if v > 0 else 0.0


def step_host_ns(raw: Mapping[str, Any], hook_ns: float) -> tuple[float, int]:
    """The host work of a step outside its CUDA calls, as its measured time counts it: per
    graph-replay run (few host ops, so little timing in the way), its us/token with every op timed
    (``CudaExecutor.step``: from the step's start to its final sync's return) less the span of
    its timed ops (the first call's start to the last call's end) and one op's timing cost; the
    median over the runs and their count (NaN, 0 for raw files without the timed pass)."""
    runs, ho = pd.DataFrame(raw.get("runs", [])), pd.DataFrame(raw.get("host_ops", []))
    if runs.empty or ho.empty or "hooked_us_per_token" not in runs:
        return float("nan"), 0
    ho = ho[ho["strategy"].isin(GRAPH_RUNS)].sort_values(["model", "strategy", "token", "i"])
    last = ho.groupby(["model", "strategy", "token"]).tail(1)
    span = (ho.groupby(["model", "strategy", "token"])["period_ns"].sum(min_count=1).fillna(0)
            + last.set_index(["model", "strategy", "token"])["duration_ns"]).groupby(["model", "strategy"]).mean()
    hooked = pd.to_numeric(runs["hooked_us_per_token"], errors="coerce") * 1e3
    per = [h - span[(m, st)] - hook_ns for m, st, h in zip(runs["model"], runs["strategy"], hooked)
           if (m, st) in span.index and h == h]
    return nan_median(per), len(per)


def timing_cost_ns(raw: Mapping[str, Any]) -> float:
    """What timing one host op adds to it (``runs.time_host_ops``' clock reads and record): per
    run, its us/token with every op timed less its us/token run plainly, over its host ops per
    token; the median over the eager PDL runs (``EAGER_PDL``), the ones their host paces (PDL
    lets each kernel start as it is launched, so any host time shows in the token's; in runs the
    device paces, the timing's cost hides behind it); 0 for raw files without the plain pass."""
    runs, ho = pd.DataFrame(raw.get("runs", [])), pd.DataFrame(raw.get("host_ops", []))
    if runs.empty or ho.empty or "hooked_us_per_token" not in runs:
        return 0.0
    runs = runs[runs["strategy"] == EAGER_PDL]
    runs = runs.assign(hooked_us_per_token=pd.to_numeric(runs["hooked_us_per_token"], errors="coerce"))
    ops = ho.groupby(["model", "strategy"]).size() / ho.groupby(["model", "strategy"])["token"].nunique()
    per = [(r.hooked_us_per_token - r.untraced_us_per_token) * 1e3 / ops[(r.model, r.strategy)]
           for r in runs.itertuples()
           if (r.model, r.strategy) in ops.index and r.hooked_us_per_token == r.hooked_us_per_token]
    v = nan_median(per)
    return v if v > 0 else 0.0


def _host_cost(o: _Output, times: _HostTimes, key: str, strategies: Sequence[str], match: Mapping[str, Any],
               apis: Sequence[str], what: str, strategy_traced: str) -> float:
    """Host cost ``key``: the untraced period of the matching host ops, else the CUPTI period
    of ``apis`` in ``strategy_traced``."""
    v, n = times.untraced(strategies, **match)
    if n:
        o.set_host(key, v, f"median {CLOCK} {what} in executor runs ({', '.join(strategies)}) of the calibration "
                           "models", n)
    else:
        v, n = times.traced(strategy_traced, apis)
        o.set_host(key, v, f"median CUPTI period (call start to next call start) of {what} in {strategy_traced} "
                           "executor runs of the calibration models", n)
    return v


def fit(raw: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """Raw measurements + the shipped calibration file (dict) -> the measured calibration file.

    Fields measured here replace the shipped ones and their sources say how they were measured;
    the other host profiles (llama.cpp's) are kept as shipped."""
    o = _Output(raw, base)
    times = _HostTimes(raw)
    kt = pd.DataFrame(raw["kernels"])
    _fit_device(o, raw["device"])
    _fit_kernel_gaps(o, kt)
    _fit_launches(o, times, raw["device"]["probe_trace_summary"])
    _fit_copies_and_syncs(o, times, times.cupti_call_ns())
    _fit_events_and_graphs(o, times, raw)
    _fit_pdl(o, raw)
    _fit_kernel_durations(o, raw)
    if times.hook_ns > 0:
        for k in [k for k, v in o.sources.items() if k.startswith("host_profiles.python.") and CLOCK in str(v)]:
            o.sources[k] += (f"; each period less the {times.hook_ns:.0f} ns that timing an op adds to it "
                             "(timing_cost_ns: with every op timed vs run plainly)")
    _mark_datasheet_sources(o.sources)
    return o.out


#: the values ``dram_knee_fit`` tries (0: the plain ``min(1, x)``)
DRAM_KNEE_GRID = (0.0, *np.arange(1.0, 10.01, 0.25))
#: bytes-in-flight share from which the read probe's points fit the knee (below it they fit the latency)
KNEE_FROM_X = 0.3


def dram_knee_fit(reads: Sequence[Mapping[str, Any]], bif: float, peak_GBps: float, latency_ns: float,
                  max_threads: int) -> tuple[float, str]:
    """``dram_knee`` from the streaming-read probe: the grid value whose ``cost.bandwidth_share``
    of the probe's grids (bytes in flight ``x`` of bandwidth x latency at least ``KNEE_FROM_X``)
    has the least squared log error against their measured bandwidth."""
    from ..cost import bandwidth_share

    pts = [(min(r["threads"], max_threads) * bif / (peak_GBps * latency_ns), r["GBps"] / peak_GBps) for r in reads]
    pts = [(x, y) for x, y in pts if x >= KNEE_FROM_X and y > 0]
    if not pts:
        return 0.0, "no read-probe grid near the peak: the plain Little's law min(1, x)"
    err = [(float(np.sqrt(np.mean([np.log(bandwidth_share(x, k) / y) ** 2 for x, y in pts]))), float(k))
           for k in DRAM_KNEE_GRID]
    rms, knee = min(err)
    plain = err[0][0]
    return knee, (f"least squared log error of x / (1 + x^n)^(1/n) against the streaming-read probe's {len(pts)} "
                  f"grids with x >= {KNEE_FROM_X} (x: threads x {bif:g} B in flight / (bandwidth x the latency "
                  f"above)): rms {100 * rms:.1f} % (min(1, x): {100 * plain:.1f} %)")


def _fit_device(o: _Output, dev: Mapping[str, Any]) -> None:
    """The device's properties, memory system, FMA rate and PCIe copies, from the probes."""
    pt = dev["probe_trace_summary"]
    o.device["compute_capability"] = list(dev["compute_capability"])
    o.sources["device.compute_capability"] = f"{o.where}: cudaGetDeviceProperties"
    o.set_device("sm_count", dev["sm_count"], "cudaGetDeviceProperties.multiProcessorCount")
    o.set_device("max_threads_per_sm", dev["max_threads_per_sm"],
                 "cudaGetDeviceProperties.maxThreadsPerMultiProcessor")
    o.set_device("dram_bandwidth_GBps", dev["copy_d2d_GBps"],
                 "1 GiB device-to-device copy (CuPy copyto), bytes read + written / median time of 8 (CUDA events)")
    reads = dev["read_probe"]
    full = max(r["GBps"] for r in reads)
    o.set_device("dram_efficiency", min(1.0, full / dev["copy_d2d_GBps"]),
                 f"streaming-read probe at full grid ({full:.0f} GB/s) / device-to-device copy bandwidth")
    bif = dev["read_bytes_in_flight_per_thread"]
    lat = [r["threads"] * bif / (r["GBps"]) for r in reads if r["GBps"] < 0.3 * full]
    o.set_device("dram_latency_ns", nan_median(lat),
                 f"Little's law on the streaming-read probe below 30% of peak bandwidth ({bif} B in flight per "
                 "thread): threads x bytes in flight / achieved bandwidth, median over grid sizes")
    o.set_device("bytes_in_flight_per_thread", bif, "the read probe's two 16-byte loads in flight per thread, the "
                 "same depth the latency above was measured with")
    knee, how = dram_knee_fit(reads, bif, o.device["dram_bandwidth_GBps"] * o.device["dram_efficiency"],
                              o.device["dram_latency_ns"], dev["sm_count"] * dev["max_threads_per_sm"])
    o.set_device("dram_knee", knee, how)
    o.set_device("fp32_TFLOPS", dev["fp32_TFLOPS"],
                 "FMA probe: 8 independent fmaf chains per thread, 8 blocks x 256 threads per SM")
    pcie = pt["h2d_pinned_big_bytes"] / pt["h2d_pinned_big_ns"]
    o.set_device("pcie_GBps", pcie, "256 MiB pinned H2D cudaMemcpyAsync, CUPTI memcpy duration")
    pageable, pinned = pt["h2d_small_pageable_ns"], pt["h2d_small_pinned_ns"]
    o.set_device("memcpy_latency_ns", (pageable + pinned) / 2 - 16 / pcie,
                 f"16-byte H2D copies, CUPTI memcpy duration: pageable cudaMemcpy {pageable:.0f} ns and pinned "
                 f"cudaMemcpyAsync {pinned:.0f} ns, mean, minus bytes / pcie_GBps")


def _fit_kernel_gaps(o: _Output, kt: pd.DataFrame) -> None:
    """The gap between dependent kernels of one stream, under graph replay and eager."""
    g = kt[kt["strategy"] == GRAPHS]["gap_ns"].dropna()
    o.set_device("dependency_gap_ns", nan_median(g),
                 "median gap between consecutive kernels of one stream under graph replay of the calibration "
                 f"models (n={len(g)})")
    # eager launches: the gap before a kernel that was already queued behind its predecessor
    ek = kt[kt["strategy"] == EAGER]
    if "queued_ns" in ek:
        queued = ek[ek["queued_ns"] > 2000]
        ek = queued if len(queued) else ek
    o.set_device("eager_dependency_gap_ns", nan_median(ek["gap_ns"]),
                 "median gap between consecutive kernels of one stream in eager executor runs of the calibration "
                 f"models, over kernels that started > 2 us after their launch call returned (queued) (n={len(ek)})")


def _fit_launches(o: _Output, times: _HostTimes, pt: Mapping[str, float]) -> None:
    """Kernel and graph launch costs, then the launch latencies relative to the simulator's
    host time line (call start + call cost)."""
    launch_ns = _host_cost(o, times, "launch_ns", [EAGER], {"kind": "launch", "pdl": False}, LAUNCH_APIS,
                           "cuLaunchKernelEx", EAGER)
    _host_cost(o, times, "launch_pdl_ns", [EAGER_PDL], {"kind": "launch", "pdl": True}, LAUNCH_APIS,
               "cuLaunchKernelEx with the PDL attribute", EAGER_PDL)
    graph_ns = _host_cost(o, times, "graph_launch_ns", [GRAPHS, GRAPHS_PDL], {"kind": "graph_launch"},
                          ("cudaGraphLaunch",), "cudaGraphLaunch", GRAPHS)

    def set_latency(field: str, kind: str, probe: str, call_cost: float, what: str, call: str) -> None:
        """``field``: device start after the call, on the simulator's host time line."""
        tail = times.after_call(kind)
        if tail == tail:
            o.set_device(field, max(0.0, pt[f"{probe}_start_after_call_end_ns"] - tail),
                         f"probe (CUPTI): {what} starts {pt[f'{probe}_start_after_call_end_ns']:.0f} ns after "
                         f"{call} returns on an idle GPU, minus the {tail:.0f} ns of host time after the call that "
                         f"host_profiles.python.{kind}_ns already counts (host clock, untraced)")
        else:
            o.set_device(field, max(0.0, pt[f"{probe}_start_after_call_start_ns"] - call_cost),
                         f"probe: {what} starts {pt[f'{probe}_start_after_call_start_ns']:.0f} ns after {call} "
                         f"starts on an idle GPU, minus the call's cost (host_profiles.python.{kind}_ns)")

    set_latency("launch_latency_ns", "launch", "eager", launch_ns, "an empty kernel", "its launch call")
    set_latency("graph_launch_latency_ns", "graph_launch", "graph", graph_ns, "a graph's first kernel",
                "cudaGraphLaunch")


def _fit_copies_and_syncs(o: _Output, times: _HostTimes, cupti_ns: float) -> None:
    """Copies, stream syncs, the wake-up after a sync and the per-token host work between them;
    ``cupti_ns``: what CUPTI adds to a call (taken off the traced wake-ups)."""
    api = times.api
    _host_cost(o, times, "memcpy_async_ns", [GRAPHS, GRAPHS_PDL, EAGER_QKV],
               {"kind": ("memcpy_h2d", "memcpy_d2h"), "blocking": False}, ("cudaMemcpyAsync",),
               "cudaMemcpyAsync (pinned staging)", GRAPHS)
    v, n = times.untraced([EAGER, EAGER_PDL, GRAPHS, EAGER_QKV], kind="stream_sync", waits=False)
    if n:
        o.set_host("stream_sync_ns", v, f"median {CLOCK} cudaStreamSynchronize with no device work pending", n)
    else:
        sy = api[(api["kind"] == "sync") & api["wait_ns"].isna() & (api["next_token"] == api["token"])]
        o.set_host("stream_sync_ns", nan_median(sy["period_ns"]), "median CUPTI period of cudaStreamSynchronize on "
                   "an idle stream", len(sy))
    waited = api[(api["kind"] == "sync") & api["wait_ns"].notna()]
    within = waited[waited["next_token"] == waited["token"]]
    o.set_host("sync_wakeup_ns", max(0.0, nan_median(within["resume_ns"]) - cupti_ns),
               "median time from the end of the awaited device work to the host's next call over syncs that waited "
               f"inside a token (CUPTI), minus {cupti_ns:.0f} ns that CUPTI adds to a call (traced - untraced periods "
               "of the same calls)", len(within))
    # a blocking copy: the simulator charges this, then the copy (memcpy_latency_ns + bytes / pcie_GBps), then
    # the wake-up; the three together are the measured period
    per_copy = api[(api["strategy"] == EAGER) & (api["name"] == "cudaMemcpy")]
    v, n = times.untraced([EAGER, EAGER_PDL], kind="memcpy_h2d", blocking=True)
    if n:
        copy = o.device["memcpy_latency_ns"] + 16 / o.device["pcie_GBps"]
        o.set_host("memcpy_blocking_ns", v - copy - o.host["sync_wakeup_ns"], f"median {CLOCK} the blocking "
                   f"cudaMemcpy (pageable staging, per-copy runs), {v:.0f} ns, minus the copy ({copy:.0f} ns) and the "
                   "wake-up (sync_wakeup_ns) the simulator adds to it", n)
    else:
        o.set_host("memcpy_blocking_ns", nan_median(per_copy["issue_ns"]), "median CUPTI time from a blocking "
                   "cudaMemcpy's start to its copy starting on the device (per-copy runs)", len(per_copy))
    # the host work of a token that no API call covers, as the executor's us/token counts it: its
    # step's own (the inputs' values), not what the host does between steps (the logits copied
    # out of the staging, the decode loop), which the measured time leaves out (CudaExecutor.step)
    ho = times.ops
    tok = ho["to_next_token_ns"].dropna() if "to_next_token_ns" in ho else pd.Series(dtype=float)
    if times.step_runs:
        o.set_host("token_overhead_ns", times.step_ns, "median over the graph-replay runs of the host-clock time per "
                   "token with every host op timed (CudaExecutor.step: from its start to its final sync's return) less "
                   "the span of those ops and one op's timing cost: the step's host work outside CUDA calls (the "
                   "inputs' values). The host's work between steps (the logits copied out, the decode loop; "
                   f"median {nan_median(tok):.0f} ns) is not part of a token's measured time", times.step_runs)
    elif len(tok):
        o.set_host("token_overhead_ns", float(tok.median()), "median host-clock time (untraced) from the return of "
                   "a token's final sync to the next token's first call: the executor's per-token Python (input "
                   "values, staging, logits copy)", len(tok))
    else:
        last = waited[waited["next_token"] == waited["token"] + 1]
        o.set_host("token_overhead_ns", nan_median(last["resume_ns"]) - o.host["sync_wakeup_ns"], "median CUPTI "
                   "time from the end of a token's last device work to the next token's first call, minus "
                   "sync_wakeup_ns", len(last))


def _fit_events_and_graphs(o: _Output, times: _HostTimes, raw: Mapping[str, Any]) -> None:
    """Cross-stream events, stream capture, and graph instantiation (a line in graph nodes)."""
    _host_cost(o, times, "event_record_ns", [EAGER_QKV], {"kind": "event_record"}, ("cudaEventRecord",),
               "cudaEventRecord", EAGER_QKV)
    _host_cost(o, times, "stream_wait_event_ns", [EAGER_QKV], {"kind": "stream_wait_event"},
               ("cudaStreamWaitEvent",), "cudaStreamWaitEvent", EAGER_QKV)
    caps = [r["capture_call_ns"] for r in raw["runs"] if r["capture_call_ns"] == r["capture_call_ns"]]
    o.set_host("capture_ns", nan_median(caps), "median duration of cudaStreamBeginCapture / EndCapture calls",
               len(caps))
    inst = pd.DataFrame(raw["instantiate"])
    if len(inst) >= 2 and inst["nodes"].nunique() >= 2:
        slope, icpt = np.polyfit(inst["nodes"], inst["ns"], 1)
    else:
        slope, icpt = (float(inst["ns"].median() / inst["nodes"].median()), 0.0) if len(inst) else (np.nan, np.nan)
    o.set_host("graph_instantiate_ns", max(0.0, icpt), "intercept of a line through cudaGraphInstantiate durations "
               "vs graph nodes of the calibration models", len(inst))
    o.set_host("graph_instantiate_per_node_ns", max(0.0, slope), "slope of the same line", len(inst))


def _fit_pdl(o: _Output, raw: Mapping[str, Any]) -> None:
    """PDL: start-to-start in a chain of spin kernels that trigger at start, and the release
    from the per-boundary savings of graphs + PDL over graphs in the calibration models; where a
    boundary saves more than the gap and the base's prologue, the prologue grows to the rest (the
    H100's 768 ns, ``data/bench/calibration_h100.md``), else the simulator's PDL saving stays capped
    below what the GPU saves."""
    d, pt = o.device, raw["device"]["probe_trace_summary"]
    o.set_device("pdl_launch_ns", pt["spin_pdl_start_to_start_ns"],
                 "CUPTI: chain of 16 spin kernels (132 blocks, trigger at start) under graph + PDL, median "
                 "start-to-start")
    bt = pd.DataFrame(raw["boundaries"])
    saving = nan_median(bt["saving_ns"]) if len(bt) else float("nan")
    prologue = min(float(d["pdl_prologue_ns"]), float(pt["empty_duration_ns"]))
    setup, gap = float(d["pdl_first_read_setup_ns"]), float(d["dependency_gap_ns"])
    # simulator: with PDL a boundary takes release - prologue - setup + the kernel; without, gap + the kernel
    release = gap - saving + prologue + setup
    shipped = str(o.sources.get("device.pdl_prologue_ns", ""))
    shipped = shipped.split("pdl_release_ns); ", 1)[1] if shipped.startswith("kept at ") else shipped
    shipped = shipped.split("the rest of the saving; ", 1)[1] if shipped.startswith("grown to ") else shipped
    if release < 0:
        # a boundary saves more than the gap and the assumed prologue: the wait lets go as the
        # predecessor ends (release 0) and the dependent's early part is the rest of the saving,
        # at most an empty kernel's whole duration
        prologue = min(float(pt["empty_duration_ns"]), saving - gap - setup)
        release = gap - saving + prologue + setup
        o.sources["device.pdl_prologue_ns"] = (
            f"grown to {prologue:.0f} ns by `workbench calibrate` (at most the empty kernel's "
            f"{pt['empty_duration_ns']:.0f} ns): graph + PDL saved a median {saving:.0f} ns per kernel boundary, more "
            f"than the dependency gap ({gap:.0f} ns) plus the shipped prologue, so the release is 0 and the "
            "dependent's block launch and index math before griddepcontrol.wait are the rest of the saving; "
            + shipped)
    else:
        o.sources["device.pdl_prologue_ns"] = (f"kept at {prologue:.0f} ns (shipped value): CUPTI timestamps do "
                                               "not separate the prologue from the release (only release - "
                                               "prologue is observable, see pdl_release_ns); " + shipped)
    o.set_device("pdl_release_ns", max(0.0, release),
                 f"per-boundary saving of graph + PDL over graph replay in the calibration models (median "
                 f"{saving:.0f} ns over {len(bt)} kernel pairs, by family pair in the raw file) = gap - release + "
                 "prologue")
    d["pdl_prologue_ns"] = prologue


def _fit_kernel_durations(o: _Output, raw: Mapping[str, Any]) -> None:
    """Kernel durations: fixed + scale x roofline per ggml op (and per executor kernel where an
    op has several), per kernel family as the fallback for ops not measured."""
    d, src, out = o.device, o.sources, o.out
    pt = raw["device"]["probe_trace_summary"]
    inflation = cupti_kernel_ns(raw)
    for k in [k for k in src if k.startswith(("families.", "ops."))]:
        del src[k]  # the base's fits are replaced, not merged
    # parsed without the base's fits: a prologue _fit_pdl just grew may exceed their fixed parts
    base_cal = parse_calibration(dict(out, families={}, ops={}), "fit", "python")
    ran = {k["strategy"] for k in raw["kernels"]}
    kern = measured_kernels(raw, base_cal, inflation, tuple(s for s in DURATION_RUNS if s in ran))
    min_fixed = d["pdl_prologue_ns"] + d["pdl_first_read_setup_ns"]
    what = (f"of the calibration models under graph replay, their CUPTI durations less {inflation:.0f} ns "
            "per kernel that tracing adds (graph-replay calibration runs timed traced and untraced)")
    # a family is the fallback of ops not measured: fitted on the unfused kernels only (a fused
    # kernel's op has a fit of its own, and its longer prologue would bias its family's)
    families, fam_report = fit_groups(kern[~kern["op"].isin(FUSED_BASE)], "family", "family", 1, min_fixed, what)
    ops, op_report = fit_groups(kern, "op", "op", MIN_OP_KERNELS, min_fixed, what)
    # an op whose nodes ran on different kernels of the executor (MUL_MAT: per-row vs row-streaming
    # mat-vec) also gets a fit per kernel, which the simulator prefers (cost.measured_fit)
    split = kern.groupby("op")["kernel"].nunique()
    multi = kern[kern["op"].isin(split[split > 1].index)]
    op_kernels, opk_report = fit_groups(multi.assign(key=multi["op"] + "/" + multi["kernel"]), "key", "op",
                                        MIN_OP_KERNELS, min_fixed, what)
    ops.update(op_kernels)
    for section, fits in (("families", families), ("ops", ops)):
        for name, (fc, how) in fits.items():
            for k in fc:
                src[f"{section}.{name}.{k}"] = f"{o.where}: {how}"
    out["families"] = {name: fc for name, (fc, _) in families.items()}
    out["ops"] = {name: fc for name, (fc, _) in sorted(ops.items())}
    _fit_prologues(o, raw)
    _fit_early_launch(o, raw)
    fixed = [fc["fixed_ns"] for fc in out["families"].values()]
    fallback = nan_median(fixed) if fixed else pt["empty_duration_ns"]
    o.set_device("kernel_fixed_ns", max(min_fixed, fallback),
                 f"median fixed cost of the {len(fixed)} fitted kernel families; used for families the calibration "
                 f"did not measure (an empty kernel, {pt['empty_duration_ns']:.0f} ns under graph replay (CUPTI), is "
                 "only a lower bound: every measured family pays 2-4x that for its memory round trips and "
                 "reductions)")
    out["measured"] = {"environment": raw["environment"], "models": raw.get("models", []),
                       "family_fits": fam_report, "op_fits": op_report + opk_report, "cupti_kernel_ns": inflation}


def _fit_prologues(o: _Output, raw: Mapping[str, Any]) -> None:
    """Each fit's own ``pdl_prologue_ns`` where the calibration models show at least
    ``MIN_PROLOGUE_BOUNDARIES`` PDL boundaries into its kernels (``kernel_fit.boundary_prologues``)."""
    fitted = parse_calibration(o.out, "fit", "python")
    rest = pdl_saving_ns(fitted, 0.0)
    for (section, key), f in sorted(calibration_boundary_prologues(raw, fitted).items()):
        o.out[section][key]["pdl_prologue_ns"] = round(f.prologue_ns, 1)
        o.sources[f"{section}.{key}.pdl_prologue_ns"] = (
            f"{o.where}: median PDL saving {f.saving_ns:.0f} ns over {f.boundaries} boundaries into its kernels "
            f"(graph replay without / with PDL signalling at start) less the {rest:.0f} ns the simulator's boundary "
            "saves besides the prologue (gap + first-read setup - release), within [0, fixed_ns - setup]: what "
            "these kernels run before griddepcontrol.wait")


def _fit_early_launch(o: _Output, raw: Mapping[str, Any]) -> None:
    """Each fit's ``early_ns`` / ``early_scale`` (``kernel_fit.early_launch``) where its kernels
    ran measurably slower when PDL launched them at their predecessor's start: by over
    ``EARLY_MIN_EXTRA_NS`` at their median work, from 2 kernels or more."""
    fitted = parse_calibration(o.out, "fit", "python")
    kern = {k: v for k, v in early_launch(raw, fitted).items() if v.nodes >= 2}
    for (section, key), f in sorted(kern.items()):
        if f.median_extra_ns < EARLY_MIN_EXTRA_NS:
            continue
        fc = o.out[section][key]
        fc["early_ns"], fc["early_scale"] = round(f.early_ns, 1), round(min(f.early_scale, 4.0), 4)
        for field in ("early_ns", "early_scale"):
            o.sources[f"{section}.{key}.{field}"] = (
                f"{o.where}: {f.how} launched early (PDL signal at every kernel's start, every fusion): extra = end "
                "after the predecessor's end + what the simulator's PDL saves at its boundary (gap + the kernel's "
                "prologue - release) - duration without PDL, against roofline work")


def _mark_datasheet_sources(src: dict[str, Any]) -> None:
    """The llama.cpp host profile is kept as shipped: its sources that quote the python value
    say it is the datasheet-era one, not the value just measured."""
    for k in [k for k in src if k.startswith("host_profiles.llama.cpp") and "python value" in str(src[k])
              and "datasheet-era" not in str(src[k])]:
        src[k] = str(src[k]).replace("python value", "datasheet-era python value")
