"""Device properties without a GPU: compute capability parsed for every architecture."""

from __future__ import annotations

import sys

import pytest

from workbench.exec.device import info_from_properties, parse_compute_capability


@pytest.mark.parametrize(("text", "cc"), [("75", (7, 5)), ("80", (8, 0)), ("86", (8, 6)), ("90", (9, 0)),
                                          ("100", (10, 0)), ("103", (10, 3)), ("120", (12, 0)), (90, (9, 0))])
def test_compute_capability_keeps_the_minor_version_last(text, cc) -> None:
    assert parse_compute_capability(text) == cc


def test_a_major_minor_pair_passes_through_and_junk_is_refused() -> None:
    assert parse_compute_capability([10, 0]) == (10, 0)
    with pytest.raises(ValueError, match="compute capability"):
        parse_compute_capability("9.0")


def test_device_info_from_cupy_properties() -> None:
    props = {"name": b"NVIDIA B200", "multiProcessorCount": 148, "maxThreadsPerMultiProcessor": 2048,
             "totalGlobalMem": 192 << 30}
    info = info_from_properties(0, "100", props, 13000, 13000)
    assert info.compute_capability == (10, 0) and info.arch == "sm_100"
    assert info.label == "NVIDIA B200 (compute capability 10.0)" and info.sm_count == 148
    assert info.total_memory_bytes == 192 << 30 and info.driver_version == 13000


def test_importing_the_helper_needs_no_cupy(monkeypatch) -> None:
    import importlib

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.delitem(sys.modules, "workbench.exec.device")
    importlib.import_module("workbench.exec.device")
