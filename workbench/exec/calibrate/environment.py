"""The machine a calibration runs on: what it records about it (GPU, driver, library versions),
the calibration file's key for the GPU, and the warm-up before anything is timed."""

from __future__ import annotations

import datetime as _dt
import platform
import time
from typing import Any

from ..device import device_info


def environment() -> dict[str, Any]:
    """GPU name, driver, CUDA and library versions, date: what every measured file records."""
    import cupy as cp

    env: dict[str, Any] = {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                           "python": platform.python_version(), "cupy": cp.__version__}
    info = device_info()
    env["gpu_name"] = info.name
    env["driver"] = info.driver_version
    env["cuda_runtime"] = info.runtime_version
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


def warm_gpu(seconds: float = 2.0) -> float:
    """Keep the GPU busy for ``seconds`` (device-to-device copies) so its clocks have ramped up
    before anything is timed: an idle GPU idles at a low SM clock, and a calibration started on
    one measured its untraced runs well above what its own (later, traced) kernel durations and
    host costs add up to (``data/bench/calibration_h100.md``)."""
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
