"""GPU tests: marked ``gpu`` and skipped cleanly (with the reason) where CuPy cannot see a device."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def gpu_unavailable() -> str | None:
    """Why the GPU tests cannot run here, or None when a CUDA device is visible through CuPy."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver / no device
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if n > 0 else "no CUDA device"


def pytest_collection_modifyitems(config, items):
    why = gpu_unavailable()
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if why:
                item.add_marker(pytest.mark.skip(reason=f"gpu test: {why}"))

