"""The per-row mat-vec term of a kernel fit (``FamilyCost.row_ns``): ``fit_row_kernels``
recovers it, and a fit without it costs what ``fixed + scale x roofline`` always did."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from workbench.exec.calibrate.kernel_fit import fit_groups, fit_row_kernels
from workbench.exec.calibrate.llamacpp_traces import device_calibration
from workbench.exec.calibration import FamilyCost, load_calibration
from workbench.exec.cost import kernel_cost, mat_vec_rows
from workbench.models import preset
from workbench.strategy import Strategy
from workbench.strategy.steps import plan_for


def test_fit_recovers_a_synthetic_row_term():
    """Mat-vecs of three row widths: rows and bytes are not proportional, so both slopes show."""
    rng = np.random.default_rng(0)
    rows = np.repeat([512, 2048, 4096, 8192, 128256], 20).astype(float)
    width = np.tile([2048, 4096, 14336, 2048, 4096], 20)[: len(rows)]
    roofline = rows * width * 2 / 4800.0                   # bf16 bytes at 4.8 TB/s, in ns
    d = 2000.0 + 0.9 * rows + 0.6 * roofline
    f = fit_row_kernels(d * (1 + 0.001 * rng.standard_normal(len(d))), roofline, rows, min_fixed=1000.0)
    assert f.row_ns == pytest.approx(0.9, rel=0.02)
    assert f.work_scale == pytest.approx(0.6, rel=0.02)
    assert f.fixed_ns == pytest.approx(2000.0, rel=0.05)


def test_no_row_term_where_rows_and_bytes_are_proportional():
    """One row width: the row term cannot be told from the roofline's, so none is fitted."""
    import pandas as pd

    rows = np.array([512, 2048, 4096, 8192], float)
    roofline = rows * 2048 * 2 / 4800.0
    kern = pd.DataFrame({"op": "MUL_MAT", "rows": rows, "roofline_ns": roofline, "duration_ns": 1500 + 1.2 * roofline})
    fits, _ = fit_groups(kern, "op", "op", 3, 0.0, "synthetic")
    assert "row_ns" not in fits["MUL_MAT"][0]


def _mat_vec():
    cfg = preset("llama-3.2-1b", layers=1, context=512)
    plan = plan_for(cfg, Strategy(), cfg.kv_len(100))
    return next(la.node for la in plan.launches if la.node.op == "MUL_MAT")


def test_absent_row_term_is_the_old_cost_and_a_present_one_adds_per_row():
    node = _mat_vec()
    cal = device_calibration(load_calibration("h200-llamacpp"))
    plain = kernel_cost(node, cal)
    roof = plain.work_ns / plain.cap
    old = dataclasses.replace(cal, ops={"MUL_MAT": FamilyCost(fixed_ns=3000.0, work_scale=1.2)})
    c = kernel_cost(node, old)
    assert c.fixed_ns + c.work_ns / c.cap == pytest.approx(3000.0 + 1.2 * roof)
    assert c.fixed_ns == pytest.approx(3000.0)                        # all of it fixed, as before
    rows = mat_vec_rows(node, cal.sm_count)
    assert rows > 0
    new = dataclasses.replace(cal, ops={"MUL_MAT": FamilyCost(fixed_ns=3000.0, work_scale=0.7, row_ns=0.8)})
    c = kernel_cost(node, new)
    assert c.duration_ns == pytest.approx(3000.0 + 0.8 * rows + 0.7 * roof)
    assert c.cap == pytest.approx(plain.cap)                           # the row tails work at the kernel's cap
