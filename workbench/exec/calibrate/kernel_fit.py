"""Kernel durations: ``fixed_ns + work_scale x roofline`` fitted per ggml op (and per executor
kernel where an op ran on several) and per kernel family, to the calibration models' measured
kernels less what CUPTI's tracing adds to each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...strategy.steps import plan_for
from ..calibration import Calibration
from ..cost import TOP_K_OPS, executor_kernel, fit_key, kernel_cost, serial_units
from .specs import CALIBRATION_STRATEGIES, FUSED, FUSED_PDL, GRAPH_RUNS, GRAPHS, ModelSpec
from .tables import nan_median

#: measured kernels an op (or an op's executor kernel) needs for a fit of its own; with fewer it
#: takes its kernel family's
MIN_OP_KERNELS = 3
#: the roofline work (alone) below which a kernel's early-launch slowdown is not measured: its
#: step under PDL is its launch overlap and noise, not its blocks' placement
EARLY_MIN_WORK_NS = 2000.0
#: the early-launch extra (at a fit's median work) below which it is not kept: how far one
#: boundary's PDL saving strays from the median saving the extra is measured against
EARLY_MIN_EXTRA_NS = 500.0


@dataclass(frozen=True)
class KernelFit:
    """``duration ~ fixed_ns + work_scale x roofline`` for one group of kernels, how it was
    fitted (``how``, for the calibration's sources) and its median relative error."""

    fixed_ns: float
    work_scale: float
    median_rel_err: float
    how: str
    row_ns: float = 0.0


def fit_kernels(durations: np.ndarray, roofline: np.ndarray, min_fixed: float = 0.0) -> KernelFit:
    """``duration ~ fixed + scale x roofline`` by least squares in *absolute* error.

    Absolute, not relative, because what the simulator must reproduce is us/token, a sum of
    kernel durations: with an intercept the residuals of an absolute fit sum to zero, so the
    fitted kernels' total time over the calibration tokens comes out exact, and each kernel
    weighs by its duration (a 150 us lm_head mat-vec counts for what its time is worth, not as
    one of a hundred 2 us kernels). A relative fit weighs every kernel alike and lets the few big
    ones, most of a token, drift. The price: small kernels sharing a fit with big ones get larger
    relative errors, so kernels that differ in kind are fitted apart (per op, and per executor
    kernel where an op has several).

    Where the roofline varies by less than a tenth of the typical duration (one size, or sizes
    the roofline cannot tell apart) the slope is not identifiable: the roofline is kept (scale 1)
    and only the fixed part is fitted. Where durations fall as the roofline grows, a constant."""
    d, r = np.asarray(durations, float), np.asarray(roofline, float)
    sizes = len(np.unique(np.round(r, 3)))
    how = f"least-squares fit (absolute error) of fixed + scale x roofline to {len(d)} kernels ({sizes} sizes)"
    if len(d) >= 2 and np.ptp(r) > 0.1 * np.median(d):
        A = np.stack([np.ones_like(r), r], axis=1)
        (fixed, scale), *_ = np.linalg.lstsq(A, d, rcond=None)
    else:
        fixed, scale = float(np.mean(d - r)), 1.0
        how = (f"mean of duration - roofline over {len(d)} kernels ({sizes} sizes; roofline spread {np.ptp(r):.0f} ns, "
               "under a tenth of a typical duration: no slope fitted, scale 1)")
    if scale <= 0:
        fixed, scale = float(np.mean(d)), 0.0
        how = (f"mean duration of {len(d)} kernels ({sizes} sizes; durations do not grow with the roofline: "
               "a constant, scale 0)")
    if fixed < min_fixed:  # keep the fixed part >= what PDL overlaps; refit the slope
        fixed = min_fixed
        scale = max(0.0, float(np.sum(r * (d - fixed)) / max(np.sum(r * r), 1e-30)))
        how += f", fixed part held at its floor {min_fixed:.0f} ns (pdl_prologue_ns + pdl_first_read_setup_ns)"
    pred = fixed + scale * r
    return KernelFit(float(fixed), float(scale), float(np.median(np.abs(pred - d) / d)), how)


def fit_row_kernels(durations: np.ndarray, roofline: np.ndarray, rows: np.ndarray,
                    min_fixed: float = 0.0, serial: bool = False) -> KernelFit:
    """``duration ~ fixed + row_ns x rows + scale x roofline`` for mat-vec kernels, by least
    squares in absolute error (as ``fit_kernels``, whose fit it falls back to where the row term
    is not identifiable or not positive).

    One block per output row streams its row and then reduces it (warp shuffles, a shared-memory
    round, the write): a per-row latency that the streaming of the next rows hides only in part,
    so at the same bytes a matrix of narrow rows (2048 wide) takes longer than one of wide rows
    (4096, 14336). Identifiable where the kernels' bytes per row differ (rows and roofline not
    proportional); where the roofline hardly varies but the rows do (an MoE's gate/up and down
    mat-vecs: the same bytes in rows of different width) only the row slope is fitted, scale 1.

    ``serial``: the units are a kernel's serial steps (``cost.TOP_K_OPS``: a sort's stages),
    which set its time whatever its size; where the kernels show one step count the fit is
    proportional to the steps above the fixed floor, so another count scales with its steps
    (as ``early_launch`` makes a one-size fit proportional to the work)."""
    d, r, n = (np.asarray(a, float) for a in (durations, roofline, rows))
    base = fit_kernels(d, r, min_fixed)
    if serial and len(d) and np.all(n > 0) and np.ptp(n) == 0:
        row = float(np.mean(d - r - min_fixed)) / float(n[0])
        if row > 0:
            err = float(np.median(np.abs(min_fixed + row * n + r - d) / d))
            return KernelFit(float(min_fixed), 1.0, err, f"proportional to the serial steps over {len(d)} kernels of "
                             f"one step count ({n[0]:.0f}) above the fixed floor {min_fixed:.0f} ns", row)
    if len(d) < 3 or np.any(n <= 0) or np.ptp(n) == 0:
        return base
    sloped = bool(np.ptp(r) > 0.1 * np.median(d))
    if sloped:
        A = np.stack([np.ones_like(r), n / n.max(), r / r.max()], axis=1)
        if np.linalg.matrix_rank(A, tol=1e-3) < 3:
            return base
        (fixed, row, scale), *_ = np.linalg.lstsq(np.stack([np.ones_like(r), n, r], axis=1), d, rcond=None)
    else:  # as fit_kernels: the roofline's slope not identifiable, kept at 1 (e.g. MoE gate/up vs down)
        (fixed, row), *_ = np.linalg.lstsq(np.stack([np.ones_like(r), n], axis=1), d - r, rcond=None)
        scale = 1.0
    held = fixed < min_fixed
    if held:  # keep the fixed part >= what PDL overlaps; refit the slopes
        fixed = min_fixed
        if not sloped:
            row = float(np.sum(n * (d - r - fixed)) / np.sum(n * n))
        else:
            (row, scale), *_ = np.linalg.lstsq(np.stack([n, r], axis=1), d - fixed, rcond=None)
    if row <= 0 or scale <= 0:
        return base
    pred = fixed + row * n + scale * r
    err = float(np.median(np.abs(pred - d) / d))
    how = (f"least-squares fit (absolute error) of fixed + row_ns x rows + scale x roofline to {len(d)} kernels "
           f"({len(np.unique(np.round(r, 3)))} sizes, {len(np.unique(n))} row counts)"
           + (f", fixed part held at its floor {min_fixed:.0f} ns (pdl_prologue_ns + pdl_first_read_setup_ns)"
              if held else ""))
    return KernelFit(float(fixed), float(scale), err, how, float(row))


def fit_groups(kern: pd.DataFrame, by: str, label: str, min_kernels: int, min_fixed: float,
                what: str) -> tuple[dict[str, tuple[dict[str, float], str]], list[dict[str, Any]]]:
    """A ``fit_kernels`` per value of column ``by`` with at least ``min_kernels`` kernels:
    ``{name: ({fixed_ns, work_scale}, source text)}`` and report rows (``label``: the name's key
    there). ``what`` says where the durations come from. Where ``kern`` has a ``rows`` column
    and every kernel of a group is a mat-vec (rows > 0), the group's fit has a per-row term
    (``fit_row_kernels``; ``row_ns`` in the fit where it is kept)."""
    fits, report = {}, []
    for name, grp in kern.groupby(by):
        if len(grp) < min_kernels:
            continue
        d, r = grp["duration_ns"].to_numpy(), grp["roofline_ns"].to_numpy()
        if "rows" in grp and (grp["rows"] > 0).all():
            serial = "op" in grp and bool(grp["op"].isin(TOP_K_OPS).all())
            f = fit_row_kernels(d, r, grp["rows"].to_numpy(), min_fixed, serial)
        else:
            f = fit_kernels(d, r, min_fixed)
        vals = {"fixed_ns": round(f.fixed_ns, 1), "work_scale": round(f.work_scale, 4)}
        if f.row_ns > 0:
            vals["row_ns"] = round(f.row_ns, 4)
        fits[str(name)] = (vals, f"{f.how} {what}; median fit error {100 * f.median_rel_err:.1f}%")
        report.append({label: str(name), "kernels": len(grp), "sizes": int(grp["roofline_ns"].round(3).nunique()),
                       "fixed_ns": f.fixed_ns, "work_scale": f.work_scale, **({"row_ns": f.row_ns} if f.row_ns else {}),
                       "median_rel_err": f.median_rel_err, "measured_us": float(grp["duration_ns"].sum() / 1e3)})
    return fits, report


def _spec_plans(kt: pd.DataFrame, strategy: str) -> Iterable[tuple[tuple, pd.DataFrame, dict[str, Any]]]:
    """Per calibration model in the kernel table: its rows under ``strategy`` and its Plan's
    nodes by name."""
    keys = ["spec_model", "spec_layers", "spec_context", "spec_pos"]
    for key, grp in kt[kt["strategy"] == strategy].groupby(keys, dropna=False):
        spec = ModelSpec.from_columns(*key)
        cfg = spec.config()
        plan = plan_for(cfg, CALIBRATION_STRATEGIES[strategy], cfg.kv_len(spec.pos))
        yield key, grp, {la.node.name: la.node for la in plan.launches}


def measured_kernels(raw: Mapping[str, Any], cal: Calibration, cupti_ns: float = 0.0,
                     strategy: str | tuple[str, ...] = GRAPHS) -> pd.DataFrame:
    """Every Plan node's kernel measured under ``strategy`` (or each of several) in the calibration models: its op,
    family, the kernel the cuda executor binds for it (``cost.executor_kernel``: the same name
    the simulator looks its fit up by), its measured ``duration_ns`` less ``cupti_ns`` (what
    CUPTI adds per traced kernel), its ``roofline_ns`` on ``cal`` (alone, at its cap),
    ``predicted_ns`` (``kernel_cost(node, cal).duration_ns``) and ``rows`` (``cost.serial_units``:
    a mat-vec's output rows, a top-k selection's serial steps, 0 for other kernels; ``fit_groups``
    gives such fits a per-unit term, ``row_ns``, as the llama.cpp target's mat-vecs have)."""
    rows = []
    kt = pd.DataFrame(raw["kernels"])
    for _, grp, nodes in (t for st in ((strategy,) if isinstance(strategy, str) else strategy)
                          for t in _spec_plans(kt, st)):
        for r in grp.itertuples():
            node = nodes.get(r.node)
            if node is None:
                continue
            c = kernel_cost(node, cal)
            rows.append({"model": r.model, "node": r.node, "op": node.op, "family": node.family,
                         "kernel": executor_kernel(node) or r.name, "duration_ns": r.duration_ns - cupti_ns,
                         "roofline_ns": c.work_ns / c.cap if c.work_ns > 0 else 0.0,
                         "predicted_ns": c.duration_ns, "rows": serial_units(node, cal)})
    return pd.DataFrame(rows, columns=["model", "node", "op", "family", "kernel", "duration_ns", "roofline_ns",
                                       "predicted_ns", "rows"])


@dataclass(frozen=True)
class EarlyFit:
    """What a fit's kernels add when PDL launches them early: ``early_ns + (early_scale - 1) x
    work`` over their duration without PDL, from ``nodes`` kernels; ``how`` for the sources."""

    early_ns: float
    early_scale: float
    nodes: int
    how: str
    median_extra_ns: float  # the fit at the kernels' median work


def fit_early(work: np.ndarray, extra: np.ndarray) -> EarlyFit:
    """``extra ~ early_ns + (early_scale - 1) x work`` by least squares, neither part negative.
    One size (work spread under a tenth of its median): proportional to the work alone; a slope
    that comes out negative: a constant."""
    w, e = np.asarray(work, float), np.asarray(extra, float)
    n = len(w)
    if n >= 2 and np.ptp(w) > 0.1 * np.median(w):
        (c, k), *_ = np.linalg.lstsq(np.stack([np.ones_like(w), w], axis=1), e, rcond=None)
        how = f"least-squares line through {n} kernels of {len(np.unique(np.round(w)))} sizes"
        if k < 0:
            c, k, how = float(np.mean(e)), 0.0, f"mean over {n} kernels (the line's slope came out negative)"
        elif c < 0:
            c, k, how = 0.0, float(w @ e / (w @ w)), f"line through zero over {n} kernels (its intercept was negative)"
    else:
        c, k, how = 0.0, float(w @ e / (w @ w)), f"proportional to the work, over {n} kernels of one size"
    c, k = max(0.0, float(c)), max(0.0, float(k))
    return EarlyFit(c, 1.0 + k, n, how, c + k * float(np.median(w)))


def early_launch(raw: Mapping[str, Any], cal: Calibration) -> dict[tuple[str, str], EarlyFit]:
    """What each fit's kernels add when PDL launches them while their predecessor's main loop
    still runs, from the calibration's fused runs without PDL (``FUSED``) and with PDL
    signalling at every kernel's start (``FUSED_PDL``), keyed ``(section, key)`` as
    ``cost.fit_key`` finds the node's fit in ``cal``. Per node launched early (its median start
    before its predecessor's end): ``extra``, what it added to its stream under PDL (end after
    end) less its duration without PDL, plus the boundary saving the simulator gives it anyway
    under ``cal`` (``pdl_saving_ns``), against ``work``, its roofline work alone under ``cal`` (at
    least ``EARLY_MIN_WORK_NS``); ``fit_early`` over a fit's nodes."""
    kt = pd.DataFrame(raw.get("kernels", []))
    if kt.empty or FUSED_PDL not in set(kt["strategy"]):
        return {}
    keys = ["spec_model", "spec_layers", "spec_context", "spec_pos"]
    pdl = {tuple(k): g.set_index("node") for k, g in kt[kt["strategy"] == FUSED_PDL].groupby(keys, dropna=False)}
    per: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for key, grp, nodes in _spec_plans(kt, FUSED):
        early = pdl.get(tuple(key))
        if early is None:
            continue
        for r in grp.itertuples():
            node = nodes.get(r.node)
            if node is None or r.node not in early.index or not early.at[r.node, "gap_ns"] < 0:
                continue
            c = kernel_cost(node, cal)
            work = c.work_ns / c.cap if c.work_ns > 0 else 0.0
            if work < EARLY_MIN_WORK_NS:
                continue  # no main loop to speak of: what PDL changes there is its overlap, not its work
            how, fk = fit_key(node, cal)
            if fk is not None:
                extra = early.at[r.node, "step_ns"] + pdl_saving_ns(cal, c.pdl_prologue_ns) - r.duration_ns
                per.setdefault(("families" if how == "family" else "ops", fk), []).append((work, extra))
    return {k: fit_early(*np.array(v).T) for k, v in per.items()}


def pdl_saving_ns(cal: Calibration, prologue_ns: float | None = None) -> float:
    """What the simulator's PDL takes off a graph boundary into a kernel that waits at its first
    read (the calibration runs' wait): the gap and the kernel's prologue it overlaps (its own
    ``prologue_ns``, else the device's), less the release (``sim.py`` ``_start_kernel``)."""
    pro = cal.pdl_prologue_ns if prologue_ns is None else prologue_ns
    return cal.dependency_gap_ns + pro + cal.pdl_first_read_setup_ns - cal.pdl_release_ns


#: PDL boundaries into a fit's kernels needed for a prologue of its own (``boundary_prologues``)
MIN_PROLOGUE_BOUNDARIES = 8


@dataclass(frozen=True)
class PrologueFit:
    """A fit's own ``pdl_prologue_ns``: the median PDL saving of ``boundaries`` boundaries into
    its kernels (``saving_ns``) less what the simulator's boundary saves besides the prologue."""

    prologue_ns: float
    saving_ns: float
    boundaries: int


def boundary_prologues(savings: Iterable[tuple[Any, float]], cal: Calibration,
                       ceiling: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], PrologueFit]:
    """Per fit (``(section, key)`` as ``cost.fit_key`` finds a node's fit in ``cal``) with at
    least ``MIN_PROLOGUE_BOUNDARIES`` PDL boundaries into its kernels among ``savings`` ((Plan
    node, measured saving in ns) per boundary): the prologue at which the simulator's saving at
    such a boundary (``pdl_saving_ns``: gap + prologue + setup - release) is their median, within
    [0, ``ceiling`` of the fit] (its fixed part less the setup: the prologue is part of the fixed
    cost). Kernels differ in what they run before ``griddepcontrol.wait`` (a mat-vec issues its
    weight loads there, an element-wise kernel waits first), which one device-wide prologue
    averages away."""
    per: dict[tuple[str, str], list[float]] = {}
    for node, saving in savings:
        how, fk = fit_key(node, cal)
        if fk is not None and saving == saving:
            per.setdefault(("families" if how == "family" else "ops", fk), []).append(float(saving))
    out = {}
    rest = pdl_saving_ns(cal, 0.0)  # what a boundary saves besides the prologue
    for k, v in per.items():
        if len(v) >= MIN_PROLOGUE_BOUNDARIES and k in ceiling:
            saving = float(np.median(v))
            out[k] = PrologueFit(float(np.clip(saving - rest, 0.0, ceiling[k])), saving, len(v))
    return out


def prologue_ceilings(cal: Calibration) -> dict[tuple[str, str], float]:
    """The largest prologue each fit of ``cal`` can take: its fixed part less the first-read setup."""
    return {(sec, k): fc.fixed_ns - cal.pdl_first_read_setup_ns
            for sec, fits in (("ops", cal.ops), ("families", cal.families)) for k, fc in fits.items()}


def calibration_boundary_prologues(raw: Mapping[str, Any], cal: Calibration) -> dict[tuple[str, str], PrologueFit]:
    """``boundary_prologues`` of the calibration models' boundaries (graph replay without / with
    PDL, the unfused ``GRAPHS`` Plans)."""
    bt = pd.DataFrame(raw.get("boundaries", []))
    if bt.empty:
        return {}
    savings = []
    for spec, grp in bt.groupby(["spec_model", "spec_layers", "spec_context", "spec_pos"], dropna=False):
        ms = ModelSpec.from_columns(*spec)
        cfg = ms.config()
        plan = plan_for(cfg, CALIBRATION_STRATEGIES[GRAPHS], cfg.kv_len(ms.pos))
        nodes = {la.node.name: la.node for la in plan.launches}
        savings += [(nodes[r.node], r.saving_ns) for r in grp.itertuples() if r.node in nodes]
    return boundary_prologues(savings, cal, prologue_ceilings(cal))


def cupti_kernel_ns(raw: Mapping[str, Any]) -> float:
    """What CUPTI tracing adds per kernel under graph replay (0 where the raw file cannot say):
    median over the graph-replay calibration runs of (traced - untraced us/token - (traced -
    untraced host-call time per token)) / kernels per token."""
    runs, api, ho, kt = (pd.DataFrame(raw.get(k, [])) for k in ("runs", "api", "host_ops", "kernels"))
    if runs.empty or ho.empty or "untraced_us_per_token" not in runs or "duration_ns" not in ho:
        return 0.0
    api = api.assign(dur=api["end_ns"] - api["start_ns"])
    per = []
    for r in runs[runs["strategy"].isin(GRAPH_RUNS)].itertuples():
        a = api[(api["model"] == r.model) & (api["strategy"] == r.strategy)]
        h = ho[(ho["model"] == r.model) & (ho["strategy"] == r.strategy)]
        n = len(kt[(kt["model"] == r.model) & (kt["strategy"] == r.strategy)])
        if a.empty or h.empty or not n or r.untraced_us_per_token != r.untraced_us_per_token:
            continue
        calls = a.groupby("token")["dur"].sum().median() - h.groupby("token")["duration_ns"].sum().median()
        per.append(((r.host_us_per_token - r.untraced_us_per_token) * 1e3 - calls) / n)
    v = nan_median(per)
    return v if v > 0 else 0.0
