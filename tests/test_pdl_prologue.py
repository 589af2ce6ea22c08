"""A fit's own PDL prologue: what its kernels run before ``griddepcontrol.wait`` while their
predecessor still runs, fitted from the PDL boundaries into them (``kernel_fit.boundary_prologues``)
and honoured by the cost model and the simulator."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

import workbench
from workbench.exec.calibrate.kernel_fit import (
    MIN_PROLOGUE_BOUNDARIES,
    boundary_prologues,
    calibration_boundary_prologues,
    pdl_saving_ns,
    prologue_ceilings,
)
from workbench.exec.calibration import FamilyCost, load_calibration
from workbench.exec.cost import fit_key, kernel_cost
from workbench.models import build_graph, load_config
from workbench.strategy import Strategy

BENCH = Path(__file__).resolve().parents[1] / "data" / "bench"


def _nodes(op: str, n: int) -> list:
    """``n`` nodes of ``op`` that share one fit of the shipped H200 calibration."""
    cal = load_calibration("h200")
    nodes = [x for x in build_graph(load_config("llama-3.2-1b", layers=8, context=256)).nodes if x.op == op]
    nodes = [x for x in nodes if fit_key(x, cal) == fit_key(nodes[0], cal)]
    assert len(nodes) >= n
    return nodes[:n]


def test_boundary_prologues_take_each_fits_median_saving_less_the_rest() -> None:
    cal = load_calibration("h200")
    rest = pdl_saving_ns(cal, 0.0)
    mm, add = _nodes("MUL_MAT", 9), _nodes("ADD", MIN_PROLOGUE_BOUNDARIES)
    savings = [(n, rest + 900.0 + 10 * i) for i, n in enumerate(mm)]  # median: rest + 940
    savings += [(n, rest - 500.0) for n in add]  # PDL cost time there: no negative prologue
    savings += [(n, float("nan")) for n in add]  # unmeasured boundaries are skipped
    fits = boundary_prologues(savings, cal, prologue_ceilings(cal))
    by_key = {k: f for k, f in fits.items()}
    mm_key = next(k for k in by_key if k[1].startswith("MUL_MAT"))
    assert by_key[mm_key].prologue_ns == pytest.approx(940.0) and by_key[mm_key].boundaries == 9
    add_key = next(k for k in by_key if k[1] == "ADD")
    assert by_key[add_key].prologue_ns == 0.0 and by_key[add_key].boundaries == MIN_PROLOGUE_BOUNDARIES
    # too few boundaries: no fit of its own; a ceiling caps the prologue at the fit's fixed part
    assert boundary_prologues(savings[:MIN_PROLOGUE_BOUNDARIES - 1], cal, prologue_ceilings(cal)) == {}
    capped = boundary_prologues(savings, cal, {mm_key: 300.0, add_key: 300.0})
    assert capped[mm_key].prologue_ns == 300.0


def test_a_fits_own_prologue_is_what_pdl_overlaps_in_the_simulator() -> None:
    """Same kernels, same durations alone; a longer prologue of the mat-vecs' fit makes PDL
    save more, and changes nothing without PDL."""
    cal = load_calibration("h200")
    node = _nodes("MUL_MAT", 1)[0]
    key = next(k for k in cal.ops if k.startswith("MUL_MAT"))  # any: the test sets every MUL_MAT key
    own = {k: replace(fc, pdl_prologue_ns=min(fc.fixed_ns - cal.pdl_first_read_setup_ns, 1500.0))
           for k, fc in cal.ops.items() if k.split("/")[0] == "MUL_MAT"}
    longer = replace(cal, ops={**cal.ops, **own})
    assert key in own
    assert kernel_cost(node, longer).duration_ns == pytest.approx(kernel_cost(node, cal).duration_ns)
    assert kernel_cost(node, longer).pdl_prologue_ns > kernel_cost(node, cal).pdl_prologue_ns
    cfg = load_config("llama-3.2-1b", layers=2, context=256)

    def us(c, pdl: bool) -> float:
        return float(workbench.run(cfg, Strategy(graphs=True, pdl=pdl), tokens=2, start_pos=200, backend="sim",
                                   calibration=c, quiet=True).stats["us_per_token"])

    # without PDL only the conservation floor of a fit scaled below the roofline moves (cost.py)
    assert us(longer, False) == pytest.approx(us(cal, False), rel=0.01)
    assert us(longer, True) - us(cal, True) < us(longer, False) - us(cal, False) - 5.0


def test_calibration_boundaries_give_kernels_that_wait_first_a_shorter_prologue() -> None:
    """On the committed H200 calibration runs: MUL_MAT_ID reads its expert ids before any weight
    (no load before the wait: a prologue of 0), while GLU's boundary saves about a microsecond."""
    with gzip.open(BENCH / "calibration_raw_h200_s19.json.gz", "rt") as f:
        raw = json.load(f)
    fits = calibration_boundary_prologues(raw, load_calibration("h200"))
    assert fits[("ops", "MUL_MAT_ID")].prologue_ns < 100.0
    assert fits[("ops", "GLU")].prologue_ns > 500.0
    assert all(f.boundaries >= MIN_PROLOGUE_BOUNDARIES for f in fits.values())


def test_family_cost_prologue_defaults_to_the_devices() -> None:
    assert FamilyCost(1000.0, 1.0).prologue_ns(280.0) == 280.0
    assert FamilyCost(1000.0, 1.0, pdl_prologue_ns=0.0).prologue_ns(280.0) == 0.0


def test_a_kernel_that_waits_at_its_start_does_its_setup_after_the_wait() -> None:
    """The calibration runs wait at first-read: each kernel's index arithmetic (and a mat-vec's
    first weight loads) runs while it waits for its predecessor. A kernel that waits at its start,
    as llama.cpp's do, does that work after the wait: up to ``pdl_first_read_setup_ns`` more per
    kernel that waited, less where it launched late (signal after the predecessor's main loop), and
    first-read's own timing is what it was with no setup (the release absorbs it). Measured on an
    H200: +96 us/token on llama-3.2-1b (data/bench/pdl_placement_fusion_h200_s32.md)."""
    cal = load_calibration("h200")
    assert cal.pdl_first_read_setup_ns > 0
    cfg = load_config("llama-3.2-1b", layers=2)

    def us(c, **knobs) -> float:
        st = Strategy(graphs=True, pdl=True, **knobs)
        return workbench.run(cfg, st, tokens=4, backend="sim", calibration=c, quiet=True).stats["us_per_token"]

    kernels = workbench.run(cfg, Strategy(graphs=True), tokens=2, backend="sim", calibration=cal,
                            quiet=True).stats["kernels_per_token"]
    extra = us(cal, pdl_wait="start") - us(cal)
    assert 0.8 * kernels * cal.pdl_first_read_setup_ns / 1e3 < extra <= kernels * cal.pdl_first_read_setup_ns / 1e3
    late = us(cal, pdl_wait="start", pdl_trigger="after-main-loop") - us(cal, pdl_trigger="after-main-loop")
    assert 0 <= late < extra
    none = replace(cal, pdl_first_read_setup_ns=0.0, pdl_release_ns=0.0)  # the file before the measurement
    assert us(none) == pytest.approx(us(cal), rel=2e-3)
    assert us(none, pdl_wait="start") == pytest.approx(us(none), rel=2e-3)
