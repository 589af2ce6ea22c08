"""What the code needs to know about the GPU it runs on, read in one place.

CuPy reports a device's compute capability as a string of digits with the minor version last
(``"90"``, ``"100"``, ``"120"``); splitting it digit by digit reads Blackwell's ``"100"`` as
(1, 0, 0), so every caller goes through ``parse_compute_capability``. CuPy is imported only
when a device is queried: importing this module needs no GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any


def parse_compute_capability(cc: str | int | Sequence[int]) -> tuple[int, int]:
    """``"90"`` -> (9, 0), ``"100"`` -> (10, 0), ``"120"`` -> (12, 0); a (major, minor) pair
    is returned as is."""
    if isinstance(cc, str | int):
        text = str(cc).strip()
        if not text.isdigit() or len(text) < 2:
            raise ValueError(f"compute capability {cc!r}: expected digits with the minor version last, e.g. '90'")
        return int(text[:-1]), int(text[-1])
    major, minor = (int(c) for c in cc)
    return major, minor


@dataclass(frozen=True)
class DeviceInfo:
    """One CUDA device's identity and the properties the executor and the calibration read."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int
    total_memory_bytes: int
    #: CUDA driver and runtime versions as CUDA encodes them (1000 x major + 10 x minor)
    driver_version: int
    runtime_version: int

    @property
    def label(self) -> str:
        """``NVIDIA H100 80GB HBM3 (compute capability 9.0)``: what traces and runs record."""
        major, minor = self.compute_capability
        return f"{self.name} (compute capability {major}.{minor})"

    @property
    def arch(self) -> str:
        """The NVRTC architecture option value: ``sm_90``, ``sm_100``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def info_from_properties(index: int, compute_capability: str | int | Sequence[int], props: dict[str, Any],
                         driver_version: int, runtime_version: int) -> DeviceInfo:
    """A DeviceInfo from CuPy's ``getDeviceProperties`` dict (pure: testable without a GPU)."""
    return DeviceInfo(index=index, name=_text(props["name"]),
                      compute_capability=parse_compute_capability(compute_capability),
                      sm_count=int(props["multiProcessorCount"]),
                      max_threads_per_sm=int(props["maxThreadsPerMultiProcessor"]),
                      total_memory_bytes=int(props["totalGlobalMem"]),
                      driver_version=int(driver_version), runtime_version=int(runtime_version))


@cache
def _device_info(index: int) -> DeviceInfo:
    import cupy as cp

    rt = cp.cuda.runtime
    return info_from_properties(index, cp.cuda.Device(index).compute_capability, rt.getDeviceProperties(index),
                                rt.driverGetVersion(), rt.runtimeGetVersion())


def device_info(index: int | None = None) -> DeviceInfo:
    """The current CUDA device's (or device ``index``'s) info; needs CuPy and a GPU."""
    if index is None:
        import cupy as cp

        index = cp.cuda.Device().id
    return _device_info(int(index))
