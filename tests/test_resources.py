"""Resource estimates before a run: the extrapolated footprint matches a real compile, and the
checks refuse what cannot fit or finish with messages that say what to lower."""

from __future__ import annotations

import dataclasses
import time

import pytest

from workbench import resources
from workbench.models import preset
from workbench.resources import Estimate, ResourceError, check, distinct_plans, estimate, footprint
from workbench.strategy import Strategy


@pytest.mark.parametrize("name, layers", [("llama-tiny", 40), ("gpt-oss-tiny", 34), ("qwen3-next-tiny", 36)])
def test_extrapolated_footprint_equals_the_compiled_plan(name, layers):
    """Past SAMPLE_LAYERS the kernels and bytes are extrapolated; periodic layer patterns
    (gpt-oss every 2nd, Qwen3-Next every 4th layer) make that exact."""
    cfg = preset(name, layers=layers)
    strategy = Strategy(graphs=True, fusion=frozenset({"rms-norm-mul"}))
    fp = footprint(cfg, strategy)
    assert not fp.exact
    nodes, mem = resources._compiled(cfg, strategy)
    assert (fp.nodes, fp.memory_bytes) == (nodes, mem)
    small = footprint(preset(name, layers=4), strategy)
    assert small.exact and small.layer_bytes > 0 and small.fixed_bytes > 0


def test_distinct_plans_follow_the_kv_padding():
    assert distinct_plans(512, 8, 0) == 1
    assert distinct_plans(512, 2, 255) == 2        # positions 255 and 256 straddle a pad
    assert distinct_plans(4096, 4096, 0) == 16
    assert distinct_plans(300, 300, 0) == 2        # the last pad is capped at the context


def fake(backend: str, **kw) -> Estimate:
    fp = resources.Footprint(layers=32, nodes=700, memory_bytes=100 * 2**30, layer_bytes=3 * 2**30, exact=False)
    base = dict(backend=backend, footprint=fp, seconds=1.0, host_bytes=1e6, device_bytes=fp.memory_bytes,
                device_capacity=80 * 2**30, device_name="NVIDIA H100", model="m", what="m: 32 layers")
    return Estimate(**{**base, **kw})


def test_device_memory_is_an_error_on_a_gpu_and_a_warning_in_the_simulator():
    with pytest.raises(ResourceError, match=r"100\.0 GiB of device memory.*lower --layers \(at most 25 fit\)"):
        check(fake("cuda"))
    notes = check(fake("sim"))
    assert len(notes) == 1 and notes[0].startswith("warning:") and "memory_fits_gpu: false" in notes[0]
    assert check(fake("sim", device_bytes=10 * 2**30)) == []


def test_host_memory_and_time_limits(monkeypatch):
    monkeypatch.setattr(resources, "host_memory_available", lambda: 2.0 * 2**30)
    with pytest.raises(ResourceError, match="reference backend would need about 4.0 GiB of host memory.*--layers"):
        check(fake("reference", device_bytes=None, device_capacity=None, host_bytes=4 * 2**30))
    with pytest.raises(ResourceError, match="about 400 s .* more than --max-seconds 300"):
        check(fake("sim", device_bytes=1, seconds=400.0))
    assert check(fake("sim", device_bytes=1, seconds=20.0))[0].startswith("about 20 s estimated")


def test_estimates_grow_with_the_work():
    cfg, s = preset("llama-tiny"), Strategy()
    short, long = estimate(cfg, s, "sim", 8), estimate(cfg, s, "sim", 512)
    assert long.seconds > short.seconds and long.host_bytes > short.host_bytes
    v2, v64 = estimate(cfg, s, "verify", 2), estimate(cfg, s, "verify", 64)
    assert v64.host_bytes / v2.host_bytes > 100     # quadratic in the unrolled points
    deeper = estimate(dataclasses.replace(cfg).with_(layers=64), s, "reference", 8)
    assert deeper.host_bytes > estimate(cfg, s, "reference", 8).host_bytes


def test_heartbeat_beats_while_a_long_run_works_and_stops_after():
    from workbench.progress import heartbeat

    beats: list[str] = []
    with heartbeat(beats.append, estimate_s=1.0, what="sim backend", every=0.05, min_seconds=0.5):
        time.sleep(0.3)
    n = len(beats)
    time.sleep(0.15)
    assert n >= 2 and len(beats) == n and beats[0].startswith("sim backend: 0 s elapsed of about 1 s estimated")
    with heartbeat(beats.append, estimate_s=0.1, every=0.01, min_seconds=0.5):  # short runs stay quiet
        time.sleep(0.05)
    assert len(beats) == n


def test_memory_the_cuda_backend_holds_counts_as_available(monkeypatch) -> None:
    """A run on the cuda backend reuses (same model) or frees first (another model) the device
    memory its cached executors hold, and a given executor already holds its run's weights: the
    check counts that memory beside the free memory, so a model that fits is not refused for
    being resident already (a benchmark's second strategy of qwen3-30b-a3b on an 80 GB H100)."""
    from types import SimpleNamespace

    from workbench import resources
    from workbench.exec.cuda_backend import CudaBackend, CudaOptions

    gib = 2**30
    monkeypatch.setattr(resources, "_cuda_gpu", lambda: (20.0 * gib, "H100 (free memory)"))
    cfg = preset("qwen3-30b-a3b", context=512, weight_dtype="f16")
    est = resources.estimate(cfg, Strategy(), "cuda", 4)
    assert not est.fits_device and est.footprint.memory_bytes > 50 * gib
    held = resources.estimate(cfg, Strategy(), "cuda", 4, held_device_bytes=60.0 * gib)
    assert held.fits_device and "what the backend holds" in held.device_name

    weights = object()
    owner = SimpleNamespace(_persistent_mem=weights, persistent_bytes=57 * gib, _arena_bytes=gib)
    other = SimpleNamespace(_persistent_mem=weights, persistent_bytes=57 * gib, _arena_bytes=2 * gib)  # shares them
    be = CudaBackend()
    be._owners[("m",)], be._executors[("m", "a")], be._executors[("m", "b")] = owner, owner, other
    assert be.held_bytes(CudaOptions()) == 60 * gib  # the shared weights once, each arena once
    assert be.held_bytes(CudaOptions(executor=other)) == 59 * gib
    assert CudaBackend().held_bytes(CudaOptions()) == 0
