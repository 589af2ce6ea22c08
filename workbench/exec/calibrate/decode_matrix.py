"""Untraced decode us/token of a (model shape x strategy) matrix on the cuda executor, measured
interleaved and written as JSON lines: the one measurement behind the fidelity report
(``benchmarks/sim_fidelity.py``), the eager knob report (``benchmarks/eager_knobs.py``) and the
eager fit (``python -m workbench.exec.fit_eager``).

Why interleaved: measured one after another, two runs of the *same* work drift apart by up to
2 % (``gpu_decode.json``: llama-3.2-1b eager vs eager+copy-elim, a no-op there, -1.9 %), as large
as the knob effects the simulator is held to. So every strategy of a model shares one warmed-up
executor each (weights shared on the GPU), and the repeats go round the strategies, each round
in a rotated order: a slow drift then shifts every strategy alike.

The file: one ``{"kind": "environment", ...}`` line (GPU, driver, date, tokens, repeats) and one
``{"kind": "cell", ...}`` line per (model shape, strategy), written as soon as the model is done
(a model whose executor fails leaves one ``{"kind": "error", ...}`` line and the run goes on).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...strategy import Strategy
from .specs import ModelSpec


@dataclass(frozen=True)
class MatrixModel:
    """A model shape and the strategies measured on it (labelled by ``Strategy.label()``)."""

    spec: ModelSpec
    strategies: tuple[Strategy, ...]


def _rounds(n: int, repeats: int) -> list[list[int]]:
    """Round r visits the n strategies starting at r mod n: each one runs early and late alike."""
    return [[(r + i) % n for i in range(n)] for r in range(repeats)]


def measure_model(m: MatrixModel, tokens: int, repeats: int, seed: int = 0,
                  log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One model shape's cells: every strategy's executor built (sharing the first one's weights)
    and warmed up (kernels compiled, graph captured), then ``repeats`` interleaved rounds of one
    ``tokens``-step run each; a run's us/token is the mean host time of its steady tokens."""
    from ...api import run as run_model
    from ..cuda import CudaExecutor

    cfg = m.spec.config()
    run = {"tokens": tokens, "backend": "cuda", "seed": seed, "start_pos": m.spec.pos}
    t0 = time.perf_counter()
    exs: list[Any] = []
    us: list[list[float]] = [[] for _ in m.strategies]
    try:
        for st in m.strategies:
            exs.append(CudaExecutor(cfg, st, "device", seed, share=exs[0] if exs else None))
            run_model(cfg, st, **{**run, "tokens": 4}, executor=exs[-1])  # warm-up: compile, capture
        # the GPU sat idle while the later strategies compiled and captured: one untimed run
        # brings it back to speed before round 0's first run (``COLD_RUN``)
        run_model(cfg, m.strategies[0], **run, executor=exs[0])
        t1 = time.perf_counter()
        for order in _rounds(len(m.strategies), repeats):
            for i in order:
                us[i].append(float(run_model(cfg, m.strategies[i], **run, executor=exs[i]).stats["us_per_token"]))
    finally:  # the next model needs the memory, whether or not this one finished
        for ex in reversed(exs):
            ex.release()
    rows = []
    for st, u in zip(m.strategies, us):
        rows.append({"kind": "cell", **m.spec.to_dict(), "label": m.spec.label, "family": cfg.model_type,
                     "strategy": st.label(), "tokens": tokens, "us_per_token": float(np.median(u)),
                     "us_min": float(np.min(u)), "us_max": float(np.max(u)), "runs_us": u})
        log(f"{m.spec.label:32s} {st.label():34s} {np.median(u):9.1f} us/token [{np.min(u):.1f}-{np.max(u):.1f}]")
    log(f"{m.spec.label}: {len(m.strategies)} strategies, warm-up {t1 - t0:.1f} s, "
        f"{repeats} rounds {time.perf_counter() - t1:.1f} s")
    return rows


def measure_matrix(models: Sequence[MatrixModel], out: Path, tokens: int, repeats: int, seed: int = 0,
                   budget_s: float | None = None, log: Callable[[str], None] = print) -> int:
    """Measure ``models`` in order into the JSON-lines file ``out`` (each model's cells written
    when it is done). A model is not started once ``budget_s`` seconds have passed: the file
    then holds the models before it, and the log names the ones skipped. Returns the cells written."""
    from .environment import environment, warm_gpu

    t0 = time.perf_counter()
    n = 0
    with Path(out).open("w") as f:
        f.write(json.dumps({"kind": "environment", **environment(), "tokens": tokens, "repeats": repeats,
                            "settle_run": True}) + "\n")
        warm_gpu()
        for m in models:
            if budget_s is not None and time.perf_counter() - t0 > budget_s:
                log(f"skipped {m.spec.label}: the {budget_s:.0f} s budget is spent")
                continue
            try:
                rows = measure_model(m, tokens, repeats, seed, log)
            except Exception as e:  # noqa: BLE001 - one model's failure must not lose the others' cells
                log(f"FAILED {m.spec.label}: {e!r}")
                rows = [{"kind": "error", **m.spec.to_dict(), "label": m.spec.label, "error": repr(e)}]
            for row in rows:
                f.write(json.dumps(row) + "\n")
                n += row["kind"] == "cell"
            f.flush()
            log(f"--- {time.perf_counter() - t0:.0f} s")
            _free_gpu()
    return n


def _free_gpu() -> None:
    import gc

    import cupy as cp

    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()


def read_matrix(path: str | Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """(environment with tokens and repeats, one row per cell) of a measured file: the JSON lines
    of ``measure_matrix`` or the older JSON of the fidelity / eager knob reports
    (``{"environment", "tokens", "repeats", "rows"}``)."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # JSON lines: more than one value
        data = None
    if isinstance(data, dict) and "rows" in data:
        env = {**data["environment"], "tokens": data["tokens"], "repeats": data["repeats"]}
        return env, pd.DataFrame(data["rows"])
    lines = [json.loads(x) for x in text.splitlines() if x.strip()]
    envs = [x for x in lines if x.get("kind") == "environment"]
    if not envs:
        raise ValueError(f"{path}: no environment line; expected the JSON lines of "
                         "workbench.exec.calibrate.decode_matrix.measure_matrix")
    rows = pd.DataFrame([x for x in lines if x.get("kind") == "cell"]).drop(columns="kind", errors="ignore")
    env = {k: v for k, v in envs[0].items() if k != "kind"}
    if not env.get("settle_run") and "runs_us" in rows:
        rows = drop_cold_runs(rows)
    return env, rows


def read_matrices(paths: str | Path | Sequence[str | Path]) -> tuple[dict[str, Any], pd.DataFrame]:
    """``read_matrix`` of one file; of several interleaved runs of the same cells, their pool.

    Why pool by effect: each run compares its strategies with an ``eager`` run of the same minutes,
    but two runs on one machine differ by a host-speed drift as large as the 2 pp the eager knobs
    are held to (decode_matrix_h200*.jsonl, 2026-11-25: llama-3.2-1b eager+pdl 15.2, 15.7 and
    17.2 %). So a pooled cell keeps, per model shape, ``eager``'s median us/token over the runs, and
    every other strategy's us/token is that over the median of its per-run speedups over ``eager``;
    ``us_min``/``us_max`` span the runs' speedups (``eager``'s are its median: the spread is the
    runs' disagreement), ``runs_us`` holds one value per run. The environment is the first run's,
    with ``pooled`` naming the files."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if len(paths) == 1:
        return read_matrix(paths[0])
    read = [read_matrix(p) for p in paths]
    frames = []
    for i, (_, df) in enumerate(read):
        df = df.copy()
        df["_run"] = i
        frames.append(df)
    cat = pd.concat(frames, ignore_index=True)
    shape = cat[[c for c in ("model", "layers", "context", "pos") if c in cat]].map(str).agg("/".join, axis=1)
    rows = []
    for _, g in cat.groupby(shape, sort=False):
        eager = g[g["strategy"] == "eager"].set_index("_run")["us_per_token"]
        if eager.empty:
            continue
        base = float(np.median(eager))
        for _, gs in g.groupby("strategy", sort=False):
            gs = gs[gs["_run"].isin(eager.index)]
            if gs.empty:
                continue
            speedup = (eager[gs["_run"]].to_numpy() / gs["us_per_token"].to_numpy())
            row = gs.iloc[0].drop(labels=["_run", "cold_run"], errors="ignore").to_dict()
            us = [base / x for x in speedup]
            row.update(us_per_token=base / float(np.median(speedup)), us_min=float(np.min(us)),
                       us_max=float(np.max(us)), runs_us=us)
            rows.append(row)
    env = {**read[0][0], "pooled": [Path(p).name for p in paths]}
    return env, pd.DataFrame(rows)


def effect_pct(t_without: float, t_with: float) -> float:
    """A knob's effect as the issues state it: the change in us/token its strategy makes,
    ``t(with) / t(without) - 1`` in % (negative: faster). Unlike the speedup ``t(without) /
    t(with) - 1``, it does not grow past the time saved: graphs over eager at a 95 % speedup is
    -49 %, so a bound in points weighs large and small effects alike."""
    return 100.0 * (t_with / t_without - 1.0)


def effect_as_speedup(effect: float) -> float:
    """``effect_pct``'s value as the speedup ``t(without) / t(with) - 1`` (%)."""
    return 100.0 * (100.0 / (100.0 + effect) - 1.0)


def knob_effect(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float, float, float]:
    """The measured effect of going from cell ``a`` to cell ``b`` (``effect_pct``, %), and its
    spread (lo, hi).

    Where both cells hold one us/token per round of one interleaved run (``runs_us``: each round
    times every strategy of a model back to back), the effect is the median of the rounds' own
    effects and the spread their min-max. Each round compares its strategies within the same
    minutes, so a slow phase of the host that moves a whole round cancels (eager cells spread up
    to 60 % between rounds: data/bench/calibration_h200_s31.md). A model's cold first run
    (``drop_cold_runs``) is left out of the pairs. Cells of llama.cpp (``llamacpp_fit.measured_table``)
    hold ``runs``, each process's median by its round: the effect pairs the processes of the rounds
    both cells ran (at least two). Otherwise it is the ratio of the medians, with the spread of the
    cells' min-max."""
    pairs = round_pairs(a, b)
    if pairs:
        r = np.array([effect_pct(x, y) for x, y in pairs])
        return float(np.median(r)), float(r.min()), float(r.max())
    return (effect_pct(a["us_per_token"], b["us_per_token"]), effect_pct(a["us_max"], b["us_min"]),
            effect_pct(a["us_min"], b["us_max"]))


def round_pairs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The (us/token of ``a``, of ``b``) pairs ``knob_effect`` reduces, one per round both cells
    ran (empty where they hold no rounds to pair). A llama.cpp round's key names its machine lease
    (``llamacpp_fit.measured_table``), so a pair never spans two leases, even where each cell
    pools several."""
    ka, kb = a.get("runs"), b.get("runs")
    ra, rb = a.get("runs_us"), b.get("runs_us")
    if isinstance(ka, Mapping) and isinstance(kb, Mapping) and len(set(ka) & set(kb)) >= 2:
        return [(ka[k], kb[k]) for k in sorted(set(ka) & set(kb))]
    if isinstance(ra, (list, tuple, np.ndarray)) and isinstance(rb, (list, tuple, np.ndarray)) \
            and len(ra) == len(rb) >= 2:
        cold = {int(c) for c in (a.get("cold_run"), b.get("cold_run")) if c is not None and c == c}
        return [(x, y) for i, (x, y) in enumerate(zip(ra, rb)) if i not in cold]
    return []


def runs_label(paths: str | Path | Sequence[str | Path]) -> str:
    """A measured file's stem, or the pooled files' stems joined by ``+`` (the reports' source)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    return "+".join(Path(p).stem for p in paths)


#: measured without the untimed settle run, a model's first timed run (round 0 of its first
#: strategy, ``eager``) follows the warm-up of every other strategy, seconds of host-side
#: compiling and graph capture with the GPU idle, and runs slow: in decode_matrix_h200_slow_host.jsonl
#: (2026-11-25) it is the slowest of eager's three runs on five of the six models, by 3-4 % on the
#: device-bound 8B models whose other runs agree within 2 %, which no-op knobs then show as speedups
COLD_RUN = 0


def cold_run_note(env: dict[str, Any]) -> str:
    """The reports' sentence on the cold run (empty for files measured with the settle run)."""
    if env.get("settle_run"):
        return ""
    return ("Each model's first timed run (round 0 of `eager`, measured right after every strategy's warm-up, "
            "the GPU idle meanwhile) is left out of its cell's median and spread (`decode_matrix.drop_cold_runs`). ")


def drop_cold_runs(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with each model shape's first timed run left out of its first cell's median and
    spread (files measured before the settle run); ``runs_us`` keeps every run, ``cold_run`` names
    the one left out."""
    rows = rows.copy()
    keys = [c for c in ("model", "layers", "context", "pos") if c in rows]
    first = rows[keys].astype(str).drop_duplicates().index  # the file keeps each model's cells together, in order
    for i in first:
        runs = list(rows.at[i, "runs_us"])
        if len(runs) < 2:
            continue
        kept = runs[:COLD_RUN] + runs[COLD_RUN + 1:]
        rows.at[i, "us_per_token"] = float(np.median(kept))
        rows.at[i, "us_min"], rows.at[i, "us_max"] = float(np.min(kept)), float(np.max(kept))
        rows.loc[i, "cold_run"] = COLD_RUN  # which run the knob effects' round pairs leave out
    return rows
