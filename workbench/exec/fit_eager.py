"""Fit the simulator's eager PDL and eager multi-stream device parameters to measured knob effects.

Launched one by one (no CUDA graph), two things cost the GPU's front end time that a graph's
device-side edges do not, and ``workbench calibrate``'s per-call host costs do not see them:

* ``eager_pdl_release_ns``: an eagerly launched PDL kernel's ``griddepcontrol.wait`` is released
  this long after its predecessor completes (under graphs: ``pdl_release_ns``);
* ``eager_channel_switch_ns``: an eager launch waits this much longer per *other* stream that has
  work queued (the host interface serves the channels with pending work in turn): the fork/join
  of ``qkv`` streams slows every kernel of the main stream while the side streams hold the next
  branch, which is why eager ``qkv`` streams do not pay off where the host runs far ahead.

(A kernel that an eager event wait holds starts ``eager_event_gap_ns`` after the recorded work;
absent from a file that is the eager launch gap, not fitted here.) Both are fitted here, each by a
one-dimensional search with the simulator in the loop, so that the simulated speedup of
``eager+pdl`` and ``eager+qkv+boundary`` over ``eager`` matches the measured ones, least squares in
percentage points, each cell weighted by the inverse variance its interleaved rounds show (a host-
bound cell that CPU noise spreads over 20 pp weighs little). The measured knob effects come from one
interleaved run of every eager cell (``--measured``, the JSON lines of
``benchmarks/decode_matrix.py``: each knob beside an ``eager`` run of the same minutes, which is
what a 2 pp fit needs) or, for files measured before it, from the calibration runs' untraced
us/token (the raw file of ``workbench calibrate``) and ``benchmarks/gpu_decode.py``'s JSON
(``--decode``), taken at different times (there a no-op knob, eager copy-elim on llama-3.2-1b,
measured -1.9 %):

    python -m workbench.exec.fit_eager --measured data/bench/decode_matrix_h200.jsonl \\
        data/bench/decode_matrix_h200_run2.jsonl data/bench/decode_matrix_h200_eager.jsonl \\
        --calibration data/calibration/h200.json --write
    python -m workbench.exec.fit_eager data/bench/calibration_raw_h200.json.gz \\
        --decode data/bench/gpu_decode.json --calibration data/calibration/h200.json --write
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..models import load_config
from ..strategy import Strategy
from ..trace.stats import us_per_token
from .calibrate.raw import read_json
from .calibration import Calibration, parse_calibration
from .sim import simulate_steps

#: the calibration strategies (``calibrate.CALIBRATION_STRATEGIES``) whose effect each parameter sets
KNOBS: dict[str, tuple[str, Strategy]] = {
    "eager_pdl_release_ns": ("eager+pdl", Strategy(pdl=True)),
    "eager_channel_switch_ns": ("eager+qkv+boundary", Strategy(streams="qkv", sync="boundary")),
}
BASE = ("eager", Strategy())
#: the search range of both parameters (ns): 0 up to two eager launch gaps
GRID = np.arange(0.0, 2601.0, 100.0)
#: the measurement noise (pp) a cell carries beyond its rounds' spread: what a no-op knob measured
#: between interleaved runs of the same work on a device-bound model (llama-3.1-8b eager vs
#: eager+copy-elim in decode_matrix_h200_slow_host.jsonl: +2.2 %)
SPREAD_FLOOR_PP = 2.0


def read_raw(path: str | Path) -> dict[str, Any]:
    """A raw file of ``workbench calibrate --raw`` (.json or .json.gz)."""
    return read_json(Path(path))


@dataclass(frozen=True)
class KnobCell:
    """One measured eager knob effect: a model shape, the knob's strategy, and the measured
    us/token of ``eager`` and of the knob's strategy."""

    source: str
    model: str
    layers: int | None
    context: int | None
    pos: int
    tokens: int
    strategy: Strategy
    eager_us: float
    knob_us: float
    #: half the measured speedup's spread (pp) from the interleaved rounds' min-max
    #: (``eager`` min over knob max .. eager max over knob min); 0 where the source has no rounds
    spread_pp: float = 0.0

    @property
    def weight(self) -> float:
        """The cell's weight in the least squares: the inverse of its measurement variance (the
        rounds' spread, plus ``SPREAD_FLOOR_PP`` for what three rounds cannot show). A host-bound
        cell whose rounds spread 20 pp (CPU noise: the no-op copy-elim cells drift up to 10 pp)
        cannot pin a parameter to 2 pp; a device-bound cell whose rounds agree within 2 pp can."""
        return 1.0 / (self.spread_pp ** 2 + SPREAD_FLOOR_PP ** 2)

    def predict(self, cal: Calibration, st: Strategy) -> float:
        cfg = load_config(self.model, layers=self.layers, context=self.context)
        return us_per_token(simulate_steps(cfg, st, self.tokens, cal, self.pos))

    @property
    def label(self) -> str:
        return f"{self.model}{f'/L{self.layers}' if self.layers else ''} ({self.source})"


def has_eager_runs(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` holds untraced ``eager`` runs beside a run of either knob's strategy."""
    runs = {(r.get("model"), r.get("strategy")) for r in raw.get("runs", []) if "untraced_us_per_token" in r}
    return any((m, label) in runs for m, _ in runs for label, _ in KNOBS.values()) and any(
        s == BASE[0] for _, s in runs)


def calibration_cells(raw: Mapping[str, Any], knob: str) -> list[KnobCell]:
    """``knob``'s cells from the raw file of ``workbench calibrate`` (untraced us/token)."""
    label, st = KNOBS[knob]
    runs = {(r["model"], r["strategy"]): r for r in raw["runs"]}
    return [KnobCell("calibrate", r["spec_model"], r["spec_layers"], r["spec_context"], int(r["spec_pos"]),
                     int(r["tokens"]), st, float(runs[(m, "eager")]["untraced_us_per_token"]),
                     float(r["untraced_us_per_token"]))
            for (m, s_), r in runs.items() if s_ == label and (m, "eager") in runs]


def matrix_cells(path: str | Path | Sequence[str | Path], knob: str, tokens: int = 16) -> list[KnobCell]:
    """``knob``'s cells from an interleaved measured file (``calibrate.decode_matrix``), or from
    several pooled (``read_matrices``): every model shape with ``eager`` and a strategy that sets
    the knob (``KNOBS``, ``DECODE_ROWS`` and ``STACKED``)."""
    from .calibrate.decode_matrix import read_matrices, runs_label

    _, df = read_matrices(path)
    source = runs_label(path)
    sts = {st.label(): st for st in (KNOBS[knob][1], DECODE_ROWS[knob][1], *STACKED.get(knob, ()))}
    out = []
    for _, g in df.groupby(["model", df["layers"].fillna(0), df["context"].fillna(0), "pos"], sort=False):
        us = dict(zip(g["strategy"], g["us_per_token"]))
        r = g.iloc[0]
        if BASE[0] not in us:
            continue
        layers = None if r["layers"] != r["layers"] or r["layers"] is None else int(r["layers"])
        context = None if r["context"] != r["context"] or r["context"] is None else int(r["context"])
        lo = dict(zip(g["strategy"], g["us_min"])) if "us_min" in g else {}
        hi = dict(zip(g["strategy"], g["us_max"])) if "us_max" in g else {}
        out += [KnobCell(source, r["model"], layers, context, int(r["pos"]), tokens, st,
                         float(us[BASE[0]]), float(us[label]), _spread_pp(BASE[0], label, lo, hi))
                for label, st in sts.items() if label in us]
    return out


def _spread_pp(base: str, label: str, lo: Mapping[str, float], hi: Mapping[str, float]) -> float:
    """Half the range of ``label``'s speedup over ``base`` that the rounds' min-max allow (pp)."""
    if not all(k in d for k in (base, label) for d in (lo, hi)):
        return 0.0
    return 0.5 * (speedup_pct(hi[base], lo[label]) - speedup_pct(lo[base], hi[label]))


#: stacked cells that also pin a parameter: eager PDL under Q/K/V streams and implicit syncs (the
#: stack's PDL gain is not the sum of its parts: once PDL frees the host, the GPU's gaps show, and
#: fitted to ``eager+pdl`` alone the release over-predicted the stack by 3-8 pp on every model of
#: decode_matrix_h200*.jsonl, 2026-11-25)
STACKED: dict[str, tuple[Strategy, ...]] = {
    "eager_pdl_release_ns": (Strategy(pdl=True, streams="qkv", sync="implicit", allocator="stream-aware"),),
}

#: gpu_decode.json's rows -> the knob they measure (``benchmarks/gpu_decode.py``'s ``alone()``)
DECODE_ROWS = {"eager_pdl_release_ns": ("pdl", Strategy(pdl=True)),
               "eager_channel_switch_ns": ("qkv", Strategy(streams="qkv", allocator="stream-aware"))}


def decode_cells(decode: Mapping[str, Any], knob: str, tokens: int = 16) -> list[KnobCell]:
    """``knob``'s cells from ``benchmarks/gpu_decode.py``'s JSON (steps 448.. of context 512; the
    simulator runs ``tokens`` of them, its steady state is reached after the first)."""
    row, st = DECODE_ROWS[knob]
    out = []
    for key, rows in decode.items():
        if not isinstance(rows, dict) or "default" not in rows or row not in rows:
            continue
        model, _, layers = key.partition("-L")
        out.append(KnobCell("gpu_decode", model, int(layers) if layers.isdigit() else None, 512, 448, tokens, st,
                            float(rows["default"]["us_per_token_median"]), float(rows[row]["us_per_token_median"])))
    return out


def speedup_pct(t_without: float, t_with: float) -> float:
    """A knob's speedup, ``t(without) / t(with) - 1`` in %: the fit's objective. The reports state
    effects as the change in us/token (``decode_matrix.effect_pct``); the fit keeps the objective the
    shipped calibrations were fitted with, so ``workbench calibrate --from-raw`` reproduces them."""
    return 100.0 * (t_without / t_with - 1.0)


def knob_errors(cal: Calibration, cells: Sequence[KnobCell],
                base: dict[KnobCell, float] | None = None) -> list[tuple[str, float, float]]:
    """(cell, measured %, simulated %) of each cell's knob against eager (``base`` caches the
    simulated eager runs, which neither parameter changes)."""
    base = {} if base is None else base
    out = []
    for c in cells:
        if c not in base:
            base[c] = c.predict(cal, BASE[1])
        out.append((c.label, speedup_pct(c.eager_us, c.knob_us), speedup_pct(base[c], c.predict(cal, c.strategy))))
    return out


def fit_one(cal: Calibration, cells: Sequence[KnobCell], knob: str,
            log: Callable[[str], None] = lambda s: None) -> tuple[float, float, list[tuple[str, float, float]]]:
    """The grid value of ``knob`` with the least squared error of the knob's speedups (each cell
    weighted by its measurement's inverse variance, ``KnobCell.weight``), refined to 10 ns around
    the best; returns (value, weighted rms error in pp, per-cell errors at the value)."""
    if not cells:
        raise ValueError(f"fit_eager: no measured {KNOBS[knob][0]!r} runs beside 'eager' runs; measure them with "
                         "`workbench calibrate` (its default strategies include both)")
    cache: dict[KnobCell, float] = {}

    w = np.array([c.weight for c in cells])
    w = w / w.sum()

    def sse(v: float) -> tuple[float, list[tuple[str, float, float]]]:
        """The weighted mean squared error (pp^2) of the knob's speedups at ``v``."""
        rows = knob_errors(replace(cal, **{knob: float(v)}), cells, cache)
        return float(sum(wi * (s - m) ** 2 for wi, (_, m, s) in zip(w, rows))), rows

    best = min(GRID, key=lambda v: sse(v)[0])
    fine = np.arange(max(0.0, best - 90.0), best + 91.0, 10.0)
    best = float(min(fine, key=lambda v: sse(v)[0]))
    err, rows = sse(best)
    log(f"{knob} = {best:.0f} ns: weighted rms {np.sqrt(err):.2f} pp over {len(rows)} cells")
    return best, float(np.sqrt(err)), rows


def fit(raw: Mapping[str, Any] | None, base: Mapping[str, Any], decode: Mapping[str, Any] | None = None,
        log: Callable[[str], None] = print,
        measured: str | Path | Sequence[str | Path] | None = None) -> dict[str, Any]:
    """The calibration dict ``base`` with both eager parameters fitted to the measured cells:
    ``measured``'s (an interleaved run, ``calibrate.decode_matrix``), ``raw``'s calibration runs
    and ``benchmarks/gpu_decode.py``'s, each where given."""
    if raw is None and decode is None and measured is None:
        raise ValueError("fit_eager: nothing to fit to; give --measured (benchmarks/decode_matrix.py's JSON lines) "
                         "or the raw file of `workbench calibrate --raw`")
    out = json.loads(json.dumps(base))
    cal = parse_calibration(out, "base", "python")
    parts = []
    if measured is not None:
        from .calibrate.decode_matrix import read_matrices

        env = read_matrices(measured)[0]
        names = env.get("pooled") or [Path(measured).name]
        parts.append(f"the interleaved runs of {' + '.join(names)}" + (" (pooled: per cell the median of the runs' "
                     "speedups)" if len(names) > 1 else "") + f" on {env.get('gpu_name', '?')} "
                     f"({str(env.get('date', ''))[:10]})")
    if raw is not None:
        env = raw.get("environment", {})
        parts.append(f"the calibration runs of `workbench calibrate` on {env.get('gpu_name', '?')} "
                     f"({str(env.get('date', ''))[:10]})")
    if decode is not None:
        parts.append(f"benchmarks/gpu_decode.py's runs on {decode['device'].get('gpu', '?')} "
                     f"({str(decode['device'].get('date', ''))[:10]})")
    where = "fitted by `python -m workbench.exec.fit_eager` to " + " and ".join(parts)
    for knob in KNOBS:
        cal = replace(cal, **{knob: 0.0})
    for knob, (label, _) in KNOBS.items():
        cells = ((matrix_cells(measured, knob) if measured is not None else [])
                 + (calibration_cells(raw, knob) if raw is not None else [])
                 + (decode_cells(decode, knob) if decode is not None else []))
        value, rms, rows = fit_one(cal, cells, knob, log)
        cal = replace(cal, **{knob: value})
        out["device"][knob] = value
        per = "; ".join(f"{c.model}{f'/L{c.layers}' if c.layers else ''} {c.strategy.label()}: measured {a:+.1f} %, "
                        f"simulated {s:+.1f} %" for c, (_, a, s) in zip(cells, rows))
        stacked = "".join(f" and {st.label()}" for st in STACKED.get(knob, ()))
        out["sources"][f"device.{knob}"] = (
            f"{where}: the value whose simulated speedups of {label}{stacked} over eager are closest (least squares "
            f"weighted by each cell's inverse measurement variance, weighted rms {rms:.1f} pp) to the measured "
            f"ones (untraced), per measured cell: {per}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.exec.fit_eager", description=__doc__.split("\n\n")[0])
    p.add_argument("raw", nargs="?", help="raw file of `workbench calibrate --raw` (.json or .json.gz)")
    p.add_argument("--measured", nargs="+", help="JSON lines of benchmarks/decode_matrix.py (an interleaved run of "
                   "the eager cells; several runs are pooled, decode_matrix.read_matrices): the preferred source")
    p.add_argument("--calibration", required=True, help="the calibration file to start from (and to rewrite)")
    p.add_argument("--decode", help="benchmarks/gpu_decode.py's JSON (data/bench/gpu_decode.json): more cells")
    p.add_argument("--write", action="store_true", help="rewrite --calibration with the fitted fields")
    a = p.parse_args(argv)
    path = Path(a.calibration)
    decode = json.loads(Path(a.decode).read_text()) if a.decode else None
    out = fit(read_raw(a.raw) if a.raw else None, json.loads(path.read_text()), decode, measured=a.measured)
    if a.write:
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
