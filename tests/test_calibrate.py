"""``workbench calibrate``'s fit, without a GPU: traces the simulator makes with a known
calibration go through the same analyses as CUPTI traces of the executor, and the fit must give
that calibration's parameters back."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import workbench
from workbench.exec.calibrate.fit import fit
from workbench.exec.calibrate.kernel_fit import fit_kernels
from workbench.exec.calibrate.specs import CALIBRATION_STRATEGIES, ModelSpec
from workbench.exec.calibrate.tables import trace_tables
from workbench.exec.calibration import CALIBRATION_DIR, FamilyCost, load_calibration, parse_calibration
from workbench.exec.cost import STAGED_OPS
from workbench.trace import Trace

EARLY = 1.4
HOOK_NS = 700.0  # what timing one host op costs in the host-clock pass (the fit takes it off)
SPECS = (ModelSpec("llama-3.2-1b", 1, 512), ModelSpec("llama-3.1-8b", 2, 2048, 1800))

#: a datasheet-era calibration (no measured families or ops): the base these tests build on
DATASHEET_H100 = CALIBRATION_DIR.parents[1] / "data" / "bench" / "calibration_h100_datasheet.json"


def _synthetic_probes(cal) -> dict:
    """What the probe kernels would measure on a GPU that behaves exactly like ``cal``."""
    full = cal.dram_bandwidth_GBps * cal.dram_efficiency
    reads = [{"blocks": b, "threads": 256 * b, "bytes": 1 << 30,
              "GBps": min(full, 256 * b * cal.bytes_in_flight_per_thread / cal.dram_latency_ns)}
             for b in (1, 2, 4, 8, 16, 132, 1056)]
    h = cal.host
    return {
        "sm_count": cal.sm_count, "max_threads_per_sm": cal.max_threads_per_sm,
        "compute_capability": list(cal.compute_capability), "copy_d2d_GBps": cal.dram_bandwidth_GBps,
        "read_probe": reads, "read_bytes_in_flight_per_thread": cal.bytes_in_flight_per_thread,
        "fp32_TFLOPS": cal.fp32_TFLOPS,
        "probe_trace_summary": {
            "empty_duration_ns": cal.kernel_fixed_ns, "spin_pdl_start_to_start_ns": cal.pdl_launch_ns,
            "h2d_pinned_big_bytes": 1 << 28, "h2d_pinned_big_ns": (1 << 28) / cal.pcie_GBps,
            "h2d_small_pageable_ns": cal.memcpy_latency_ns + 16 / cal.pcie_GBps,
            "h2d_small_pinned_ns": cal.memcpy_latency_ns + 16 / cal.pcie_GBps, "h2d_small_pageable_bytes": 16,
            "eager_start_after_call_start_ns": h.launch_ns + cal.launch_latency_ns,
            "graph_start_after_call_start_ns": h.graph_launch_ns + cal.graph_launch_latency_ns,
            "eager_start_after_call_end_ns": cal.launch_latency_ns,
            "graph_start_after_call_end_ns": cal.graph_launch_latency_ns,
        },
    }


_OP_OF_API = {"cudaLaunchKernel": "launch", "cuLaunchKernelEx": "launch", "cudaGraphLaunch": "graph_launch",
              "cudaMemcpy": "memcpy_h2d", "cudaMemcpyAsync": "memcpy_h2d", "cudaStreamSynchronize": "stream_sync",
              "cudaEventRecord": "event_record", "cudaStreamWaitEvent": "stream_wait_event"}


def _host_ops_of(trace, hook_ns: float = 0.0) -> list[dict]:
    """What ``time_host_ops`` would record for the host program the simulator ran, timing each
    op costing ``hook_ns`` more host time (every later op starts that much later)."""
    ev = trace.events
    api = ev[(ev["row"] == "CUDA API") & ev["name"].isin(list(_OP_OF_API)) & (ev["token"] >= 0)]
    out, pending, last_tok = [], False, None
    for r in api.sort_values("start_ns").itertuples():
        kind = _OP_OF_API[r.name]
        blocking = r.name == "cudaMemcpy"
        if r.token != last_tok:
            i, last_tok = 0, r.token
        shift = len(out) * hook_ns
        out.append({"token": r.token, "i": i, "kind": kind, "api": r.name, "pdl": r.name == "cuLaunchKernelEx",
                    "blocking": blocking, "waits": kind == "stream_sync" and pending,
                    "start_ns": r.start_ns + shift, "end_ns": r.end_ns + shift})
        i += 1
        pending = False if (kind == "stream_sync" or blocking) else True
    return out


#: a CUPTI timestamp of an H200 run (ns since the epoch): float64's spacing there is 256 ns
CUPTI_EPOCH_NS = 1_795_917_429_777_295_744


def _at_cupti_epoch(trace):
    """The simulated trace with its stamps where CUPTI's are: the fit must still read every gap,
    step and period to the ns (a float64 step on the way rounded them all to 256 ns once)."""
    ev = trace.events
    return Trace(ev.assign(start_ns=ev["start_ns"] + CUPTI_EPOCH_NS, end_ns=ev["end_ns"] + CUPTI_EPOCH_NS),
                 dict(trace.meta))


@pytest.fixture(scope="module", params=["cupti-periods", "host-clock", "cupti-epoch"])
def round_trip(request) -> tuple[dict, object]:
    cal = load_calibration(path=DATASHEET_H100)
    # one fit with an early-launch scale: a fused Q/K/V kernel PDL starts early runs 1.4x its work
    staged = cal.kernel_fixed_ns + cal.dram_latency_ns  # its prologue (cost.prologue_ns) is in its own fit
    # simulated on the executor's own grids, the geometry `workbench calibrate` fits under
    cal = replace(cal, grids="executor", ops={"QKV_ROPE_SET_ROWS": FamilyCost(staged, 1.0, early_scale=EARLY)})
    runs = []
    for spec in SPECS:
        for label, st in CALIBRATION_STRATEGIES.items():
            run = workbench.run(spec.config(), st, tokens=6, backend="sim", start_pos=spec.pos, calibration=cal)
            info = {"nodes": len(run.plan.launches), "host_us_per_token": run.stats["us_per_token"]}
            if request.param == "host-clock":  # the untraced passes: host-clock op timings and us/token
                info["host_ops"] = _host_ops_of(run.trace, HOOK_NS)
                info["untraced_us_per_token"] = run.stats["us_per_token"]
                first = min(o["token"] for o in info["host_ops"])  # steady tokens, as us/token counts them
                steady = [o for o in info["host_ops"] if o["token"] > first]
                per_token = len(steady) / len({o["token"] for o in steady})
                info["hooked_us_per_token"] = run.stats["us_per_token"] + per_token * HOOK_NS / 1e3
            trace = _at_cupti_epoch(run.trace) if request.param == "cupti-epoch" else run.trace
            runs.append((spec, label, trace, info))
    raw = {"environment": {"gpu_name": "simulated H100", "date": "2026-01-01T00:00:00"}, "gpu": "h100",
           "device": _synthetic_probes(cal), **trace_tables(runs)}
    base = json.loads(DATASHEET_H100.read_text())
    return fit(json.loads(json.dumps(raw)), base), cal


def test_fit_gives_the_simulators_host_costs_back(round_trip) -> None:
    out, cal = round_trip
    h = out["host_profiles"]["python"]
    for key in ("launch_ns", "launch_pdl_ns", "graph_launch_ns", "memcpy_async_ns", "memcpy_blocking_ns",
                "stream_sync_ns", "sync_wakeup_ns", "event_record_ns", "stream_wait_event_ns"):
        assert h[key] == pytest.approx(getattr(cal.host, key), rel=0.02, abs=5), key
    assert h["token_overhead_ns"] == pytest.approx(0, abs=5)
    assert h["graph_instantiate_per_node_ns"] == pytest.approx(cal.host.graph_instantiate_per_node_ns, rel=0.02)
    assert h["graph_instantiate_ns"] == pytest.approx(cal.host.graph_instantiate_ns, rel=0.02)


def test_fit_gives_the_simulators_device_costs_back(round_trip) -> None:
    out, cal = round_trip
    d = out["device"]
    for key in ("dram_bandwidth_GBps", "dram_latency_ns", "pcie_GBps", "memcpy_latency_ns", "kernel_fixed_ns",
                "dependency_gap_ns", "launch_latency_ns", "graph_launch_latency_ns", "pdl_launch_ns",
                "pdl_release_ns"):
        assert d[key] == pytest.approx(getattr(cal, key), rel=0.02, abs=5), key
    assert d["dram_efficiency"] == pytest.approx(cal.dram_efficiency, rel=1e-3)
    assert d["eager_dependency_gap_ns"] == pytest.approx(cal.eager_gap_ns, abs=5)
    # every kernel of the simulator is fixed + 1 x roofline: each family's fit says so
    for fam, fc in out["families"].items():
        assert fc["work_scale"] == pytest.approx(1.0, rel=0.02), fam
        assert fc["fixed_ns"] == pytest.approx(cal.kernel_fixed_ns, rel=0.02), fam
    # and so does each op's fit, and each fit of an op on one of its executor kernels
    assert {"MUL_MAT", "RMS_NORM", "FLASH_ATTN_EXT", "MUL_MAT/k_mul_mat_vec_rows_f16"} <= set(out["ops"])
    # (a fused kernel that stages its activation: plus the prologue the simulator charges it)
    for op, fc in out["ops"].items():
        staged = op.split("/")[0] in STAGED_OPS
        assert fc["work_scale"] == pytest.approx(1.0, rel=0.02), op
        assert fc["fixed_ns"] == pytest.approx(cal.kernel_fixed_ns + staged * cal.dram_latency_ns, rel=0.02), op
    assert {"RMS_NORM_MUL_MAT_GLU", "QKV_ROPE_SET_ROWS", "MUL_MAT_ADD"} <= set(out["ops"])  # the fused run's


def test_fit_gives_the_early_launch_scale_back(round_trip) -> None:
    """The one fit the simulator ran with an early-launch scale gets it back; no other gets one."""
    out, _ = round_trip
    scaled = {op: (fc["early_ns"], fc["early_scale"]) for op, fc in out["ops"].items() if "early_scale" in fc}
    assert scaled == {"QKV_ROPE_SET_ROWS": (pytest.approx(0, abs=100), pytest.approx(EARLY, rel=0.05))}
    assert "launched early" in out["sources"]["ops.QKV_ROPE_SET_ROWS.early_scale"]
    bad = json.loads(json.dumps(out))
    bad["ops"]["QKV_ROPE_SET_ROWS"]["early_scale"] = 0.5
    with pytest.raises(ValueError, match="early_scale must be within"):
        parse_calibration(bad, "bad")


def test_fitted_file_loads_with_a_source_for_every_field(round_trip) -> None:
    out, _ = round_trip
    cal = parse_calibration(json.loads(json.dumps(out)), "fitted")
    assert set(cal.families) >= {"mul_mat", "norm", "attn"}
    assert all("measured by `workbench calibrate`" in out["sources"][f"families.{f}.fixed_ns"] for f in cal.families)
    assert "measured" in out["sources"]["host_profiles.python.launch_ns"]
    # llama.cpp's profiles are kept as shipped
    shipped = json.loads(DATASHEET_H100.read_text())
    assert out["host_profiles"]["llama.cpp"] == shipped["host_profiles"]["llama.cpp"]


def test_a_missing_family_source_is_refused(round_trip) -> None:
    out, _ = round_trip
    broken = json.loads(json.dumps(out))
    fam = next(iter(broken["families"]))
    del broken["sources"][f"families.{fam}.work_scale"]
    with pytest.raises(ValueError, match="without a source"):
        parse_calibration(broken, "broken")


def test_kernel_fit_is_absolute_least_squares() -> None:
    r = np.array([0.0, 1000.0, 5000.0, 20000.0])
    f = fit_kernels(1500 + 1.3 * r, r)
    assert f.fixed_ns == pytest.approx(1500) and f.work_scale == pytest.approx(1.3) and f.median_rel_err < 1e-9
    f = fit_kernels(1500 + 1.3 * r, r, min_fixed=2000)
    assert f.fixed_ns == 2000 and 1.0 < f.work_scale < 1.3 and "floor" in f.how
    # absolute error: the residuals sum to zero, so the kernels' total time is reproduced
    d = np.array([1800.0, 2100.0, 9000.0, 30000.0])
    f = fit_kernels(d, r)
    assert (f.fixed_ns + f.work_scale * r).sum() == pytest.approx(d.sum())
    # one size: the slope is not identifiable, the roofline is kept and the fixed part fitted
    f = fit_kernels(np.array([2000.0, 2200.0, 2100.0]), np.array([100.0, 100.0, 100.0]))
    assert f.work_scale == 1.0 and f.fixed_ns == pytest.approx(2000) and "no slope" in f.how


def test_a_spec_reads_back_from_raw_table_columns_with_missing_values() -> None:
    """Raw tables store a spec's layers and context as floats, NaN where the preset's default was used."""
    assert ModelSpec.from_columns("llama-3.2-1b", float("nan"), 512.0, 0) == ModelSpec("llama-3.2-1b", None, 512)
    assert ModelSpec.from_columns("llama-3.1-8b", 2.0, 2048.0, 1800.0) == SPECS[1]


def test_early_launch_fit_takes_a_line_a_constant_or_a_scale() -> None:
    """``extra ~ early_ns + (early_scale - 1) x work``, neither part negative: a line where the
    work varies, a constant where the slope comes out negative, a scale where one size is seen."""
    from workbench.exec.calibrate.kernel_fit import fit_early

    w = np.array([3000.0, 12000.0, 18000.0, 250000.0])
    f = fit_early(w, 500 + 0.2 * w)
    assert f.early_ns == pytest.approx(500) and f.early_scale == pytest.approx(1.2) and f.nodes == 4
    assert f.median_extra_ns == pytest.approx(500 + 0.2 * np.median(w))
    f = fit_early(np.array([3000.0, 12000.0]), np.array([2700.0, 2100.0]))  # the Q/K/V kernel's shape
    assert f.early_scale == 1.0 and f.early_ns == pytest.approx(2400) and "negative" in f.how
    f = fit_early(np.array([5000.0, 5000.0]), np.array([1000.0, 1000.0]))
    assert f.early_ns == 0 and f.early_scale == pytest.approx(1.2) and "one size" in f.how


@pytest.mark.parametrize("saving, prologue, release", [(768.0, 512.0, 0.0), (400.0, 280.0, 136.0),
                                                       (5000.0, 832.0, 0.0)])
def test_pdl_fit_grows_the_prologue_when_a_boundary_saves_more_than_gap_and_prologue(saving, prologue, release):
    """``_fit_pdl``: with PDL a boundary saves gap - release + prologue. A saving below gap plus
    the shipped prologue (280 ns) sets the release; one above it (the H100's 768 ns over a
    256 ns gap, ``calibration_raw_h100_s18.json.gz``) leaves the release at 0 and grows the
    prologue to the rest, at most an empty kernel's duration (832 ns)."""
    from workbench.exec.calibrate.fit import _fit_pdl, _Output

    base = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    base["device"].update(pdl_prologue_ns=280.0, dependency_gap_ns=256.0, pdl_first_read_setup_ns=0)
    raw = {"environment": {"gpu_name": "GPU", "date": "2026-11-27"},
           "device": {"probe_trace_summary": {"spin_pdl_start_to_start_ns": 768.0, "empty_duration_ns": 832.0}},
           "boundaries": [{"saving_ns": saving}] * 3}
    o = _Output(raw, base)
    _fit_pdl(o, raw)
    assert (o.device["pdl_prologue_ns"], o.device["pdl_release_ns"]) == (prologue, release)
    assert o.sources["device.pdl_prologue_ns"].startswith("grown to" if saving > 536 else "kept at")


def test_token_overhead_is_the_steps_own_host_work() -> None:
    """The executor's us/token runs from a step's start to its final sync's return, so the fit
    charges a token only the host work inside the step (``fit.step_host_ns``: the timed step less
    its timed ops' span), not the host's time between steps (the logits copied out, the decode
    loop: ``to_next_token_ns``), which the simulator would otherwise add to every token."""
    import gzip
    from pathlib import Path

    import pandas as pd

    from workbench.exec.calibrate.fit import step_host_ns, timing_cost_ns

    # the raw file the shipped h200.json was fitted from
    with gzip.open(Path(__file__).parents[1] / "data/bench/calibration_raw_h200_s31.json.gz", "rt") as f:
        raw = json.load(f)
    inside, n = step_host_ns(raw, timing_cost_ns(raw))
    between = pd.DataFrame(raw["host_ops"])["to_next_token_ns"].dropna().median()
    assert n == 25 and 0 < inside < 10_000 and between > 20_000  # 4.7 us inside a step, 40 us between steps
    assert load_calibration("h200").host.token_overhead_ns == pytest.approx(inside, abs=0.1)
    assert step_host_ns({"runs": [], "host_ops": []}, 0.0)[1] == 0  # older raw files: the earlier rules
def test_model_spec_parses_layers_context_and_pos():
    """``--models preset[:layers[:context[:pos]]]``: empty fields keep the preset's own, pos is the
    first decode step (a second KV length of one model, e.g. for decode attention's fit)."""
    assert ModelSpec.parse("llama-3.1-8b:2:1024:600") == ModelSpec("llama-3.1-8b", 2, 1024, 600)
    assert ModelSpec.parse("llama-3.1-8b::1024") == ModelSpec("llama-3.1-8b", None, 1024, 0)
    assert ModelSpec.parse("qwen3-8b") == ModelSpec("qwen3-8b", None, None, 0)
    assert ModelSpec.parse("llama-3.1-8b:2:1024:600").label == "llama-3.1-8b/L2/ctx1024/pos600"


def test_probe_and_token_times_are_exact_at_cuptis_epoch() -> None:
    """A chain of PDL spin kernels started 700 ns apart, stamped as CUPTI stamps them: the probe
    summary reads 700 (not float64's nearest multiple of 256), and so do the token times."""
    from workbench.exec.calibrate.probes import probe_summary
    from workbench.trace.analysis import token_spans

    t0 = CUPTI_EPOCH_NS + 37
    ev = [{"row": "Stream 7", "kind": "kernel", "name": "spin", "stream": 7, "token": 0, "corr_id": i,
           "start_ns": t0 + 700 * i, "end_ns": t0 + 700 * i + 1000} for i in range(16)]
    ev += [{"row": "Stream 7", "kind": "kernel", "name": "k", "stream": 7, "token": 1 + i, "corr_id": 100 + i,
            "start_ns": t0 + 20_000 + 1_000_099 * i, "end_ns": t0 + 20_500 + 1_000_099 * i} for i in range(4)]
    s = probe_summary(Trace.from_records(ev), ["graph_spin_pdl"])
    assert s["spin_pdl_start_to_start_ns"] == 700
    assert s["spin_pdl_end_to_end_ns"] == 700
    spans = token_spans(Trace.from_records(ev))
    assert spans["time_ns"].iloc[1] == 1_000_099  # token 1's start to token 2's, to the ns
    assert spans["start_ns"].iloc[0] == t0

