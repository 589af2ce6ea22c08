"""Per-GPU parameters of the simulator, loaded from ``data/calibration/<gpu>.json``.

A calibration has two halves: the *device* (roofline numbers, fixed kernel costs, PDL and
replay timings) and a *host profile* (what each CUDA API call costs the host thread). The
host half is a profile because the same GPU is driven by very different hosts: the workbench's
own Python executor, llama.cpp's C++ on Linux, or llama.cpp on Windows where llama.cpp PR #17795 saw syncs
cost several times more. Every field carries its source in the file's ``sources`` map and the
loader refuses a file where one is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..graph.ops import OPS

#: Where the shipped calibrations live (the repository's ``data/calibration``).
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "data" / "calibration"
#: executors a calibration can describe (``workbench calibrate --target``); a file of another
#: executor than ``cuda`` is named ``<gpu>-<executor>.json``
EXECUTORS = ("cuda", "llamacpp")


class CalibrationError(ValueError):
    """A calibration that cannot be used; the message says which GPU/field/file and the fix."""


@dataclass(frozen=True)
class HostCosts:
    """Host-thread cost of each CUDA API call (ns), excluding any wait for the device."""

    launch_ns: float
    launch_pdl_ns: float
    graph_launch_ns: float
    memcpy_async_ns: float
    memcpy_blocking_ns: float
    stream_sync_ns: float
    sync_wakeup_ns: float
    event_record_ns: float
    stream_wait_event_ns: float
    capture_ns: float
    graph_instantiate_ns: float
    graph_instantiate_per_node_ns: float
    #: host work per token outside any CUDA call (input values, staging, reading the logits);
    #: optional in the file (0 where a profile does not give it)
    token_overhead_ns: float = 0.0
    #: host work per graph launch per stream beyond the first (a multi-stream graph: llama.cpp's
    #: GGML_CUDA_GRAPH_OPT reorders and forks the graph on the host every token, and its launch
    #: grows with the branches); optional (0 where a profile does not give it)
    graph_stream_ns: float = 0.0
    #: host work per byte of attention mask a token copies: llama.cpp fills its KQ mask(s) on the
    #: CPU before every step, a cell per cached KV row, so its host time grows with the context;
    #: optional (0 where a profile does not give it)
    mask_fill_ns_per_byte: float = 0.0


@dataclass(frozen=True)
class FamilyCost:
    """Measured correction of the roofline for one ggml op or one kernel family (``workbench
    calibrate``): such a kernel takes ``fixed_ns + work_scale x roofline`` alone on an idle GPU,
    plus ``row_ns`` per output row where the fit has one (a mat-vec's rows, ``cost.mat_vec_rows``:
    each row's block ends in a reduction and a tail no streaming hides, so narrow rows reach a
    lower share of DRAM bandwidth than wide ones at the same bytes; optional, absent = 0), and
    ``early_ns`` + ``early_scale``: what its work becomes when PDL launches it while its
    predecessor's main loop still runs, ``early_ns + early_scale x work``
    (``cost.KernelCost.early_ns``; optional, absent = 0 and 1), and ``pdl_prologue_ns``: the part
    of ``fixed_ns`` such a kernel runs before its ``griddepcontrol.wait`` while its predecessor
    still runs, where its kernels' PDL boundaries show one of their own (a mat-vec that issues its
    weight loads before the wait overlaps more than an element-wise kernel that waits first;
    optional, absent = the device's ``pdl_prologue_ns``)."""

    fixed_ns: float
    work_scale: float
    row_ns: float = 0.0
    early_scale: float = 1.0
    early_ns: float = 0.0
    pdl_prologue_ns: float | None = None

    def prologue_ns(self, device_ns: float) -> float:
        """The PDL prologue of this fit's kernels: its own, else the device's ``device_ns``."""
        return device_ns if self.pdl_prologue_ns is None else self.pdl_prologue_ns


@dataclass(frozen=True)
class Calibration:
    """One GPU's device parameters plus the host profile in use."""

    gpu: str
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int
    dram_bandwidth_GBps: float
    dram_efficiency: float
    dram_latency_ns: float
    bytes_in_flight_per_thread: float
    fp32_TFLOPS: float
    pcie_GBps: float
    memcpy_latency_ns: float
    kernel_fixed_ns: float
    #: between dependent kernels of a graph replay, in the settled launch state every cuda-backend
    #: run is timed in (``launch_state.py``; a process with no eager launches yet has shorter gaps)
    dependency_gap_ns: float
    launch_latency_ns: float
    graph_launch_latency_ns: float
    pdl_prologue_ns: float
    pdl_launch_ns: float
    pdl_release_ns: float
    pdl_first_read_setup_ns: float
    pdl_late_read_fraction: float
    host: HostCosts
    host_profile: str
    host_profiles: dict[str, HostCosts] = field(default_factory=dict, hash=False, compare=False)
    sources: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    #: optional per-family corrections (measured calibrations); families not listed use the
    #: device-wide roofline with ``kernel_fixed_ns``
    families: dict[str, FamilyCost] = field(default_factory=dict, hash=False, compare=False)
    #: optional per-op corrections, preferred over the op's family (one family lumps kernels of
    #: very different cost: SOFT_MAX and ARGSORT_TOP_K; MUL_MAT and MUL_MAT_ID); keyed by ggml op
    #: (``MUL_MAT``) or by op and the cuda executor's kernel for it
    #: (``MUL_MAT/k_mul_mat_vec_rows_f16``), see ``cost.measured_fit``
    ops: dict[str, FamilyCost] = field(default_factory=dict, hash=False, compare=False)
    #: optional: gap between stream-ordered kernels launched one by one (no graph) when the next
    #: one is already queued; -1 (absent from the file) means ``dependency_gap_ns``
    eager_dependency_gap_ns: float = -1.0
    #: optional: from the completion of work recorded in an event to the start of a kernel that an
    #: eagerly issued ``cudaStreamWaitEvent`` holds on another stream (the host interface switches
    #: to the waiting channel and then does the launch's front-end work); -1 means ``eager_gap_ns``
    eager_event_gap_ns: float = -1.0
    #: optional: from the completion of its predecessor to the release of an eagerly launched PDL
    #: kernel's ``griddepcontrol.wait`` (the completion travels through the front end, not a
    #: graph's device-side edge); -1 means ``pdl_release_ns``
    eager_pdl_release_ns: float = -1.0
    #: optional: from its predecessor's trigger (``launch_dependents``) to the early start of an
    #: eagerly launched PDL kernel. The front end's per-launch work that an eager launch adds to a
    #: graph's (``eager_gap_ns - dependency_gap_ns``) is not removed by PDL, only overlapped with
    #: the running predecessor: -1 (absent) means ``pdl_launch_ns`` plus that extra work
    eager_pdl_launch_ns: float = -1.0
    #: optional: extra gap before an eagerly launched kernel per *other* stream with work queued
    #: (the GPU's host interface serves the channels with pending work in turn); 0 when absent
    eager_channel_switch_ns: float = 0.0
    #: optional: how sharply a grid's achieved DRAM bandwidth reaches the peak as its bytes in
    #: flight ``x`` (a share of bandwidth x idle latency) grow: ``x / (1 + x^n)^(1/n)``
    #: (``cost.bandwidth_share``; near ``x = 1`` the latency rises with the load); 0 (absent): the
    #: plain Little's law ``min(1, x)``
    dram_knee: float = 0.0
    #: whose kernels and host program the file calibrates: ``cuda`` (the workbench's executor)
    #: or ``llamacpp`` (llama.cpp: ops keyed by llama.cpp's kernel names, ``cost.measured_fit``,
    #: and the simulator plans llama.cpp's schedule, ``llamacpp_schedule``)
    executor: str = "cuda"
    #: the launch geometry the file's kernel fits were made under (``cost.kernel_geometry``):
    #: ``executor``, the cuda executor's own grids (``workbench calibrate`` since 2026-11-29);
    #: ``llamacpp``, llama.cpp's (files fitted before, and every llama.cpp calibration)
    grids: str = "llamacpp"

    @property
    def eager_gap_ns(self) -> float:
        """Gap before a queued eagerly launched kernel (the GPU front end's per-launch work)."""
        return self.eager_dependency_gap_ns if self.eager_dependency_gap_ns >= 0 else self.dependency_gap_ns

    @property
    def eager_event_gap(self) -> float:
        """Gap from recorded work to a kernel held by an eager event wait on another stream."""
        return self.eager_event_gap_ns if self.eager_event_gap_ns >= 0 else self.eager_gap_ns

    @property
    def eager_pdl_release(self) -> float:
        """Predecessor completion to the release of an eagerly launched PDL kernel's wait."""
        return self.eager_pdl_release_ns if self.eager_pdl_release_ns >= 0 else self.pdl_release_ns

    @property
    def eager_pdl_launch(self) -> float:
        """Predecessor's trigger to the earliest start of an eagerly launched PDL kernel."""
        if self.eager_pdl_launch_ns >= 0:
            return self.eager_pdl_launch_ns
        return self.pdl_launch_ns + max(0.0, self.eager_gap_ns - self.dependency_gap_ns)

    @property
    def dram_Bpns(self) -> float:
        """Achievable DRAM bandwidth in bytes per ns (peak x efficiency)."""
        return self.dram_bandwidth_GBps * self.dram_efficiency

    @property
    def fp32_flops_per_ns(self) -> float:
        return self.fp32_TFLOPS * 1e3

    @property
    def device_label(self) -> str:
        what = f"{self.gpu} calibration" if self.executor == "cuda" else f"{self.gpu} {self.executor} calibration"
        return f"{self.name} (simulated, {what}, host profile {self.host_profile})"

    def with_host(self, profile: str | None = None, **overrides: float) -> Calibration:
        """The same device under another host profile and/or with some host costs overridden
        (e.g. ``cal.with_host(launch_ns=9000)`` to model a slower-launch host)."""
        cal = self
        if profile is not None:
            if profile not in self.host_profiles:
                raise CalibrationError(f"unknown host profile {profile!r} for {self.gpu}; known: "
                                       f"{', '.join(self.host_profiles)}")
            cal = replace(cal, host=self.host_profiles[profile], host_profile=profile)
        if overrides:
            bad = sorted(set(overrides) - {f.name for f in fields(HostCosts)})
            if bad:
                raise CalibrationError(f"unknown host cost field(s) {bad}; known: "
                                       f"{', '.join(f.name for f in fields(HostCosts))}")
            cal = replace(cal, host=replace(cal.host, **{k: float(v) for k, v in overrides.items()}),
                          host_profile=f"{cal.host_profile}+custom")
        return cal


#: the launch geometries a file's kernel fits can be made under (``Calibration.grids``)
GRIDS = ("executor", "llamacpp")
#: device fields a file may leave out (the eager launch model; older files predate them)
_OPTIONAL_DEVICE_FIELDS = ("eager_dependency_gap_ns", "eager_event_gap_ns", "eager_pdl_release_ns",
                           "eager_pdl_launch_ns", "eager_channel_switch_ns", "dram_knee")
_DEVICE_FIELDS = [f.name for f in fields(Calibration)
                  if f.name not in ("gpu", "name", "host", "host_profile", "host_profiles", "sources", "families",
                                    "ops", "executor", "grids", *_OPTIONAL_DEVICE_FIELDS)]
_HOST_FIELDS = [f.name for f in fields(HostCosts)]
_OPTIONAL_HOST_FIELDS = {"token_overhead_ns", "graph_stream_ns", "mask_fill_ns_per_byte"}
FAMILY_FIELDS = [f.name for f in fields(FamilyCost)]  # a fit's fields, the optional ones included
_OPTIONAL_FAMILY_FIELDS = {"row_ns", "early_scale", "early_ns", "pdl_prologue_ns"}


def known_gpus(directory: Path = CALIBRATION_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


def load_calibration(gpu: str = "h100", host: str | None = None, path: str | Path | None = None) -> Calibration:
    """The calibration of ``gpu`` (``h100``, ``h200``, ...) or of the file at ``path``, under
    host profile ``host`` (default: the file's ``default_host_profile``)."""
    if path is None:
        p = CALIBRATION_DIR / f"{gpu.lower()}.json"
        if not p.exists():
            raise CalibrationError(f"no calibration for GPU {gpu!r}; known GPUs: {', '.join(known_gpus())} "
                                   f"(files in {CALIBRATION_DIR}; <gpu>-llamacpp ones predict llama.cpp); pass "
                                   "--gpu with one of them, or fit one with workbench calibrate [--target llamacpp]")
    else:
        p = Path(path)
        if not p.exists():
            raise CalibrationError(f"calibration file {p} does not exist")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{p}: not valid JSON ({e})") from None
    return parse_calibration(data, str(p), host)


def parse_calibration(data: dict[str, Any], origin: str = "<dict>", host: str | None = None) -> Calibration:
    """Validate a calibration dict (every field present, numeric, sourced) and build it."""
    for key in ("gpu", "name", "device", "host_profiles", "sources"):
        if key not in data:
            raise CalibrationError(f"{origin}: missing top-level key {key!r}")
    device, profiles, sources = data["device"], data["host_profiles"], data["sources"]
    _check_keys(origin, "device", device, [*_DEVICE_FIELDS, *_OPTIONAL_DEVICE_FIELDS], set(_OPTIONAL_DEVICE_FIELDS))
    if not profiles:
        raise CalibrationError(f"{origin}: host_profiles is empty; add at least one profile")
    for name, prof in profiles.items():
        _check_keys(origin, f"host_profiles.{name}", prof, _HOST_FIELDS, _OPTIONAL_HOST_FIELDS)
    families = data.get("families", {})
    for fam, fc in families.items():
        _check_keys(origin, f"families.{fam}", fc, FAMILY_FIELDS, _OPTIONAL_FAMILY_FIELDS)
    ops = data.get("ops", {})
    unknown = sorted(k for k in ops if k.split("/", 1)[0] not in OPS or k.endswith("/"))
    if unknown:
        raise CalibrationError(f"{origin}: ops section names unknown ggml op(s) {unknown}: a key is a ggml op "
                               f"or op/kernel (the cuda executor's kernel for it); known ops: {', '.join(sorted(OPS))}")
    for op, oc in ops.items():
        _check_keys(origin, f"ops.{op}", oc, FAMILY_FIELDS, _OPTIONAL_FAMILY_FIELDS)
    expected = {f"device.{k}" for k in (*_DEVICE_FIELDS, *(k for k in _OPTIONAL_DEVICE_FIELDS if k in device))}
    expected |= {f"host_profiles.{n}.{k}" for n, prof in profiles.items() for k in _HOST_FIELDS
                 if k in prof or k not in _OPTIONAL_HOST_FIELDS}
    expected |= {f"families.{fam}.{k}" for fam, fc in families.items() for k in FAMILY_FIELDS if k in fc}
    expected |= {f"ops.{op}.{k}" for op, oc in ops.items() for k in FAMILY_FIELDS if k in oc}
    missing = sorted(expected - set(sources))
    if missing:
        raise CalibrationError(f"{origin}: field(s) without a source: {missing}; every number needs "
                               "its source (measurement, datasheet, derivation or stated assumption)")
    stray = sorted(set(sources) - expected)
    if stray:
        raise CalibrationError(f"{origin}: sources for unknown field(s): {stray}")
    empty = sorted(k for k, v in sources.items() if not str(v).strip())
    if empty:
        raise CalibrationError(f"{origin}: empty source text for {empty}")

    dev: dict[str, Any] = {}
    for k in _DEVICE_FIELDS:
        v = device[k]
        if k == "compute_capability":
            if not (isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(x, int) for x in v)):
                raise CalibrationError(f"{origin}: device.compute_capability must be [major, minor], got {v!r}")
            dev[k] = (int(v[0]), int(v[1]))
            continue
        dev[k] = _number(origin, f"device.{k}", v)
    for k in _OPTIONAL_DEVICE_FIELDS:
        if k in device:
            dev[k] = _number(origin, f"device.{k}", device[k])
    for k in ("sm_count", "max_threads_per_sm"):
        dev[k] = int(dev[k])
    for k in ("sm_count", "max_threads_per_sm", "dram_bandwidth_GBps", "dram_latency_ns",
              "bytes_in_flight_per_thread", "fp32_TFLOPS", "pcie_GBps"):
        if dev[k] <= 0:
            raise CalibrationError(f"{origin}: device.{k} must be > 0, got {dev[k]}")
    if dev.get("dram_knee", 0.0) < 0:
        raise CalibrationError(f"{origin}: device.dram_knee must be >= 0 (0: min(1, x)), got {dev['dram_knee']}")
    for k in ("dram_efficiency", "pdl_late_read_fraction"):
        if not 0 <= dev[k] <= 1:
            raise CalibrationError(f"{origin}: device.{k} must be within [0, 1], got {dev[k]}")
    if dev["pdl_prologue_ns"] + dev["pdl_first_read_setup_ns"] > dev["kernel_fixed_ns"]:
        raise CalibrationError(f"{origin}: pdl_prologue_ns + pdl_first_read_setup_ns must not exceed kernel_fixed_ns")

    fam_costs = {fam: FamilyCost(**{k: _number(origin, f"families.{fam}.{k}", fc[k]) for k in FAMILY_FIELDS
                                   if k in fc})
                 for fam, fc in families.items()}
    op_costs = {op: FamilyCost(**{k: _number(origin, f"ops.{op}.{k}", oc[k]) for k in FAMILY_FIELDS if k in oc})
                for op, oc in ops.items()}
    bad = [f"{sec}.{k}" for sec, costs in (("families", fam_costs), ("ops", op_costs))
           for k, c in costs.items() if not (1.0 <= c.early_scale <= 4.0 and c.early_ns >= 0)]
    if bad:
        raise CalibrationError(f"{origin}: early_scale must be within [1, 4] and early_ns >= 0 (what a kernel's work "
                               f"becomes when PDL starts it early), not so in {', '.join(bad)}")
    setup = dev["pdl_first_read_setup_ns"]
    short = sorted([f"families.{f}" for f, fc in fam_costs.items()
                    if fc.fixed_ns < fc.prologue_ns(dev["pdl_prologue_ns"]) + setup]
                   + [f"ops.{o}" for o, oc in op_costs.items()
                      if oc.fixed_ns < oc.prologue_ns(dev["pdl_prologue_ns"]) + setup])
    if short:
        raise CalibrationError(f"{origin}: {short} have fixed_ns below their PDL prologue (their own "
                               "pdl_prologue_ns, else the device's) + pdl_first_read_setup_ns")
    host_profiles = {name: HostCosts(**{k: _number(origin, f"host_profiles.{name}.{k}", prof[k])
                                        for k in _HOST_FIELDS if k in prof})
                     for name, prof in profiles.items()}
    profile = host or data.get("default_host_profile") or next(iter(host_profiles))
    if profile not in host_profiles:
        raise CalibrationError(f"unknown host profile {profile!r} for {data['gpu']}; known: "
                               f"{', '.join(host_profiles)}")
    executor = str(data.get("executor", "cuda"))
    if executor not in EXECUTORS:
        raise CalibrationError(f"{origin}: unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    grids = str(data.get("grids", "llamacpp"))
    if grids not in GRIDS:
        raise CalibrationError(f"{origin}: unknown grids {grids!r}; known: {', '.join(GRIDS)} (the launch geometry "
                               "its kernel fits were made under)")
    return Calibration(gpu=str(data["gpu"]), name=str(data["name"]), host=host_profiles[profile], families=fam_costs,
                       executor=executor, grids=grids,
                       ops=op_costs, host_profile=profile, host_profiles=host_profiles, sources=dict(sources), **dev)


def _check_keys(origin: str, where: str, section: dict[str, Any], expected: list[str],
                optional: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    missing = [k for k in expected if k not in section and k not in optional]
    if missing:
        raise CalibrationError(f"{origin}: {where} is missing field(s) {missing}")
    extra = sorted(set(section) - set(expected))
    if extra:
        raise CalibrationError(f"{origin}: {where} has unknown field(s) {extra}; known: {expected}")


def _number(origin: str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise CalibrationError(f"{origin}: {key} must be a number, got {v!r}")
    if v < 0:
        raise CalibrationError(f"{origin}: {key} must be >= 0, got {v}")
    return float(v)


def default_gpu(present: str | None = None) -> tuple[str, str]:
    """(calibration, why) for the simulator when none is asked for: the calibration of the GPU
    named ``present`` (the CUDA device of this machine, if any) when one is shipped for it, else
    the newest measured file (one with a ``measured`` section), else the first known file."""
    known = known_gpus()
    if present:
        key = gpu_key(present)
        if key in known:
            return key, f"the calibration of the {present} present"
    files = {g: json.loads((CALIBRATION_DIR / f"{g}.json").read_text()) for g in known}
    known = [g for g in known if files[g].get("executor", "cuda") == "cuda"]  # the workbench's own executor
    measured = [g for g in known if "measured" in files[g]]
    why = f"no calibration for the {present} present" if present else "no GPU present"
    if measured:
        return measured[-1], f"{why}; the measured {measured[-1]} calibration"
    return known[0], f"{why}; no measured calibration shipped"


def gpu_key(name: str) -> str:
    """Calibration key of a device name: ``NVIDIA H100 80GB HBM3`` -> ``h100``; ``NVIDIA H200`` -> ``h200``."""
    low = name.lower()
    for key in ("h200", "h100", "h20", "gh200", "b200", "a100", "l40s", "l4"):
        if key in low:
            return key
    words = low.replace("nvidia", "").split()
    return words[0] if words else ""
