"""What a run will cost before it starts: the model's device memory against the target GPU's, the
host memory and the wall time of the chosen backend, from a Plan compiled for a few layers.

Why: a typo such as ``--layers 100000`` used to run for minutes with no output, a config with
a billion-entry vocabulary died in NumPy's allocator or simulated as if an 80 GB GPU held
250 GB. The cost constants below are rough (measured on a laptop-class core, 2026-11); they
only serve to refuse runs far past ``--max-seconds`` or the machine's memory, with a message
that names the input that makes them large.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass

from .models import ModelConfig, build_graph
from .models.config import KV_PAD
from .strategy import Strategy

#: Default of ``--max-seconds``: longer estimates are refused rather than started.
MAX_SECONDS = 300.0
#: Estimates above this many seconds are announced on stderr before the run starts.
ANNOUNCE_SECONDS = 10.0
#: Layer counts up to this compile exactly; above it, two samples are extrapolated linearly
#: (exact for periodic layer patterns whose period divides SAMPLE_LAYERS // 2).
SAMPLE_LAYERS = 16

#: Seconds (or bytes) per unit of work on one CPU core; see the module docstring.
COMPILE_S_PER_NODE = 100e-6          # build + compile one step's graph, per node
PLAN_BYTES_PER_NODE = 2_500          # Python objects of one compiled Plan, per node
SIM_S_PER_NODE_TOKEN = 30e-6         # discrete-event simulation, per kernel per token
SIM_BYTES_PER_NODE_TOKEN = 2_000     # trace rows (API call + kernel) per kernel per token
REF_S_PER_BYTE_TOKEN = 8e-9          # NumPy reference, per byte of the model per token
REF_HOST_BYTES_PER_BYTE = 6          # f32 copies and temporaries per byte of the f16 model
CUDA_S_PER_NODE_TOKEN = 40e-6        # Python launch path of the cuda backend, per kernel per token
VERIFY_POINTS_PER_LAUNCH = 3.6       # happens-before points per kernel launch per token
VERIFY_S_PER_POINT2 = 4e-9           # reachability bitsets: time per (points squared)
VERIFY_BYTES_PER_POINT2 = 0.25       # Python-int bitsets plus the packed matrix

#: Device memory (total, as cudaMemGetInfo reports it) of the GPUs the simulator is calibrated for.
GPU_MEMORY_BYTES = {"h100": 81_559 * 2**20, "h200": 143_771 * 2**20}


#: What shrinks each backend's host memory most.
HOST_HINTS = {"reference": "lower --layers or --context, or use --backend sim (it allocates no weights)",
              "verify": "lower --tokens or --layers (the analysis grows with their product squared)"}


class ResourceError(RuntimeError):
    """A run that cannot fit or finish in time; the message names the input and the fix."""


@dataclass(frozen=True)
class Footprint:
    """One decode step of a config under a strategy: kernels and device memory, split into the
    part that grows with the layer count and the rest (embeddings, output, scratch)."""

    layers: int
    nodes: int
    memory_bytes: int
    layer_bytes: float      # device bytes per layer
    exact: bool

    @property
    def fixed_bytes(self) -> float:
        return self.memory_bytes - self.layer_bytes * self.layers


@dataclass(frozen=True)
class Estimate:
    """The cost of a run on one backend."""

    backend: str
    footprint: Footprint
    seconds: float
    host_bytes: float
    device_bytes: float | None            # None: the backend uses no GPU (reference, verify)
    device_capacity: float | None         # the target GPU's memory, when known
    device_name: str = ""
    model: str = ""
    what: str = ""                        # the work, in words, for messages

    @property
    def fits_device(self) -> bool:
        return self.device_capacity is None or self.device_bytes is None or self.device_bytes <= self.device_capacity


def footprint(cfg: ModelConfig, strategy: Strategy) -> Footprint:
    """Kernels per step and device memory of ``cfg``: exact up to SAMPLE_LAYERS layers, else
    extrapolated from Plans of SAMPLE_LAYERS / 2 and SAMPLE_LAYERS layers (cheap at any size)."""
    n = cfg.n_layer
    if n <= SAMPLE_LAYERS:
        nodes, mem = _compiled(cfg, strategy)
        small = _compiled(cfg.with_(layers=1), strategy) if n > 1 else (0, 0)
        per_layer = (mem - small[1]) / (n - 1) if n > 1 else float(mem)
        return Footprint(n, nodes, mem, per_layer, True)
    a, b = SAMPLE_LAYERS // 2, SAMPLE_LAYERS
    (na, ma), (nb, mb) = _compiled(cfg.with_(layers=a), strategy), _compiled(cfg.with_(layers=b), strategy)
    per_node, per_byte = (nb - na) / (b - a), (mb - ma) / (b - a)
    return Footprint(n, round(nb + per_node * (n - b)), round(mb + per_byte * (n - b)), per_byte, False)


def _compiled(cfg: ModelConfig, strategy: Strategy) -> tuple[int, int]:
    """(kernels, memory bytes) of the Plan of one step, at the smallest KV length (shapes of
    weights and caches do not depend on it)."""
    from .strategy.compile import compile_plan

    with warnings.catch_warnings():  # the run itself reports unsafe strategies
        warnings.simplefilter("ignore")
        plan = compile_plan(build_graph(cfg, min(cfg.context, KV_PAD)), strategy)
    return len(plan.launches), plan.memory_bytes


def distinct_plans(context: int, tokens: int, start_pos: int) -> int:
    """How many KV lengths (hence Plans to compile) the steps start_pos .. start_pos+tokens-1 use."""
    first = min(context, -(-(start_pos + 1) // KV_PAD) * KV_PAD)
    last = min(context, -(-(start_pos + tokens) // KV_PAD) * KV_PAD)
    return 1 + (last - first + KV_PAD - 1) // KV_PAD


def estimate(cfg: ModelConfig, strategy: Strategy, backend: str, tokens: int, start_pos: int = 0,
             gpu: str | None = None, held_device_bytes: float = 0.0) -> Estimate:
    """The cost of ``tokens`` steps from ``start_pos`` on ``backend`` (sim, cuda, reference or
    verify: the happens-before analysis over ``tokens`` unrolled steps of one Plan).
    ``held_device_bytes``: GPU memory the cuda backend already holds that the run reuses or frees
    first (its cached executors' weights and arenas), counted as available beside the free memory."""
    fp = footprint(cfg, strategy)
    plans = 1 if backend == "verify" else distinct_plans(cfg.context, tokens, start_pos)
    compile_s = COMPILE_S_PER_NODE * fp.nodes * plans
    plan_bytes = PLAN_BYTES_PER_NODE * fp.nodes * plans
    node_tokens = fp.nodes * tokens
    common = dict(backend=backend, footprint=fp, model=cfg.name,
                  what=f"{cfg.name}: {cfg.n_layer} layers, {fp.nodes:,} kernels per step, {tokens:,} tokens")
    if backend == "sim":
        cap, name = _sim_gpu(gpu or "h100")
        return Estimate(**common, seconds=compile_s + SIM_S_PER_NODE_TOKEN * node_tokens,
                        host_bytes=plan_bytes + SIM_BYTES_PER_NODE_TOKEN * node_tokens,
                        device_bytes=fp.memory_bytes, device_capacity=cap, device_name=name)
    if backend == "reference":
        return Estimate(**common, seconds=compile_s + REF_S_PER_BYTE_TOKEN * fp.memory_bytes * (tokens + 2),
                        host_bytes=plan_bytes + REF_HOST_BYTES_PER_BYTE * fp.memory_bytes,
                        device_bytes=None, device_capacity=None)
    if backend == "cuda":
        cap, name = _cuda_gpu()
        if cap is not None and held_device_bytes > 0:
            cap, name = cap + held_device_bytes, name.replace("(free memory)", "(free memory + what the backend holds)")
        return Estimate(**common, seconds=compile_s + CUDA_S_PER_NODE_TOKEN * node_tokens,
                        host_bytes=plan_bytes + SIM_BYTES_PER_NODE_TOKEN * node_tokens,
                        device_bytes=fp.memory_bytes, device_capacity=cap, device_name=name)
    if backend == "verify":
        points = VERIFY_POINTS_PER_LAUNCH * node_tokens
        common["what"] += f" unrolled, {points:,.0f} happens-before points"
        return Estimate(**common, seconds=compile_s + VERIFY_S_PER_POINT2 * points**2,
                        host_bytes=plan_bytes + VERIFY_BYTES_PER_POINT2 * points**2,
                        device_bytes=None, device_capacity=None)
    raise ValueError(f"unknown backend {backend!r}")


def check(est: Estimate, max_seconds: float = MAX_SECONDS, command: str = "run") -> list[str]:
    """Raise ResourceError when the run cannot fit this machine, its GPU (cuda) or
    ``max_seconds``; return the warnings and notices to print (simulated GPU too small, a long
    run announced)."""
    notes: list[str] = []
    fp = est.footprint
    if not est.fits_device:
        need = (f"{est.footprint.memory_bytes / 2**30:,.1f} GiB of device memory ({_split(fp)}) but the "
                f"{est.device_name} has {est.device_capacity / 2**30:,.1f} GiB")
        if est.backend != "sim":
            raise ResourceError(f"{est.model} needs {need}: lower --layers{_layers_hint(fp, est)} or --context, "
                                "or use --backend sim")
        notes.append(f"warning: {est.model} needs {need}; the simulated timings assume it fits "
                     f"(result flagged memory_fits_gpu: false); lower --layers{_layers_hint(fp, est)}")
    available = host_memory_available()
    if available is not None and est.host_bytes > available:
        raise ResourceError(f"{command}{_on(est, command)} would need about {_gib(est.host_bytes)} of host "
                            f"memory ({est.what}; model {_split(fp)}), this machine has {_gib(available)} available: "
                            f"{HOST_HINTS.get(est.backend, 'lower --layers or --tokens')}")
    if est.seconds > max_seconds:
        raise ResourceError(f"{command}{_on(est, command)} would take about {est.seconds:,.0f} s "
                            f"({est.what}), more than --max-seconds {max_seconds:g}: lower --layers or --tokens, "
                            "or raise --max-seconds")
    if est.seconds > ANNOUNCE_SECONDS:
        notes.append(f"about {est.seconds:,.0f} s estimated ({est.what}; --max-seconds {max_seconds:g})")
    return notes


def _on(est: Estimate, command: str) -> str:
    return "" if est.backend == command else f" on the {est.backend} backend"


def _split(fp: Footprint) -> str:
    return (f"{fp.layers} layers x {_gib(fp.layer_bytes)}, embeddings/output/scratch {_gib(max(fp.fixed_bytes, 0))}"
            + ("" if fp.exact else ", extrapolated"))


def _layers_hint(fp: Footprint, est: Estimate) -> str:
    """`` to N`` when some layer count fits the device, else nothing (the non-layer part alone is too big)."""
    if est.device_capacity is None or fp.layer_bytes <= 0:
        return ""
    n = math.floor((est.device_capacity - max(fp.fixed_bytes, 0)) / fp.layer_bytes)
    return f" (at most {n} fit)" if n >= 1 else " (even 1 layer does not fit: the embeddings/output alone are too big)"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def _sim_gpu(gpu: str) -> tuple[float | None, str]:
    """Memory and name of a simulated GPU (its calibration's name; None when unknown)."""
    from .exec.calibration import load_calibration

    name = load_calibration(gpu).name
    cap = GPU_MEMORY_BYTES.get(gpu.lower())
    if cap is None:
        m = re.search(r"(\d+)\s*GB", name)
        cap = int(m.group(1)) * 10**9 if m else None
    return cap, name


def _cuda_gpu() -> tuple[float | None, str]:
    """Free memory and name of the current CUDA device (None when CuPy cannot say)."""
    try:
        import cupy

        free, _total = cupy.cuda.runtime.memGetInfo()
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return float(free), f"{name} (free memory)"
    except Exception:  # no CuPy or no device: the backend itself reports that
        return None, ""


def host_memory_available() -> float | None:
    """Bytes of host memory available to a new allocation: Linux ``MemAvailable``, capped by
    the process's address-space limit (``ulimit -v``); None when neither is known."""
    limit = None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limit = max(float(soft) - _proc_status_bytes("VmSize:"), 0.0)
    except (ImportError, OSError, ValueError):
        pass
    known = [x for x in (limit, _meminfo_available()) if x is not None]
    return min(known) if known else None


def _proc_status_bytes(key: str, path: str = "/proc/self/status") -> float:
    """A ``kB`` line of a /proc file in bytes (0 where absent)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def _meminfo_available() -> float | None:
    free = _proc_status_bytes("MemAvailable:", "/proc/meminfo")
    if free:
        return free
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
