"""How a grid's bytes in flight set its share of the DRAM bandwidth (``cost.bandwidth_share``):
the plain Little's law ``min(1, x)`` or, with a measured knee, the smooth approach the
streaming-read probe shows near the peak."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from workbench.exec.calibrate.fit import dram_knee_fit
from workbench.exec.calibration import CALIBRATION_DIR, CalibrationError, load_calibration, parse_calibration
from workbench.exec.cost import bandwidth_share

ROOT = Path(__file__).resolve().parents[1]


def test_plain_share_is_littles_law_and_a_knee_approaches_it_smoothly():
    for x in (0.1, 0.5, 1.0, 2.0, 8.0):
        assert bandwidth_share(x) == min(1.0, x)
    knee = 3.5
    assert bandwidth_share(1.0, knee) == pytest.approx(2 ** (-1 / knee))
    assert bandwidth_share(0.1, knee) == pytest.approx(0.1, rel=1e-3)   # far below the peak: latency-bound
    assert bandwidth_share(8.0, knee) == pytest.approx(1.0, abs=1e-3)   # far above: bandwidth-bound
    xs = [0.1 * i for i in range(1, 60)]
    shares = [bandwidth_share(x, knee) for x in xs]
    assert all(b > a for a, b in zip(shares, shares[1:])) and all(s <= min(1.0, x) for s, x in zip(shares, xs))


def test_the_knee_is_fitted_on_the_read_probe_near_the_peak():
    """On the H200 probe of 2026-11-29 the grids from a third of a latency's bytes in flight up
    fit n = 3.5, closer than ``min(1, x)`` (which has 264 blocks at 100 % of the peak where the
    probe reads 88 %)."""
    raw = json.load(gzip.open(ROOT / "data" / "bench" / "calibration_raw_h200_s31.json.gz"))
    dev = raw["device"]
    cal = json.loads((CALIBRATION_DIR / "h200.json").read_text())["device"]
    knee, how = dram_knee_fit(dev["read_probe"], dev["read_bytes_in_flight_per_thread"],
                              cal["dram_bandwidth_GBps"] * cal["dram_efficiency"], cal["dram_latency_ns"],
                              dev["sm_count"] * dev["max_threads_per_sm"])
    assert knee == 3.5 and "rms 4.6 %" in how and "min(1, x): 7.9 %" in how
    assert load_calibration("h200").dram_knee == knee
    assert dram_knee_fit([], 32, 4000, 500, 1 << 18)[0] == 0.0


def test_a_small_grid_reaches_less_than_the_peak_under_the_knee():
    """A 256-block mat-vec (llama-3.1-8b's K/V projection on the executor: 256 x 256 threads, 2 MiB
    in flight, x about 1.1) gets most of the bandwidth, not all of it; a file without the knee
    (the H100's) keeps min(1, x)."""
    cal = load_calibration("h200")
    x = 256 * 256 * cal.bytes_in_flight_per_thread / (cal.dram_Bpns * cal.dram_latency_ns)
    assert 1.0 < x < 1.2 and 0.8 < bandwidth_share(x, cal.dram_knee) < 0.9
    assert load_calibration("h100").dram_knee == 0.0
    assert dataclasses.replace(cal, dram_knee=0.0).dram_knee == 0.0


def test_a_negative_knee_is_refused():
    data = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    data["device"]["dram_knee"] = -1.0
    with pytest.raises(CalibrationError, match="dram_knee"):
        parse_calibration(data, "test")
