"""A lab session without widgets: runs through ``workbench.run``, a short history, a pinned
baseline, speedups, the race check and exports. ``view.panel.ControlPanel`` puts widgets on
top of it; notebooks and tests can drive it directly.

Why a history and a baseline: every finished run is kept (``history_size``) so none is lost
when the knobs change, and every later run is compared with one pinned run.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..api import run as run_workbench
from ..exec.backend import Progress, get_backend
from ..exec.run import Run
from ..models import ModelConfig
from ..strategy import Strategy
from ..verify import RaceReport, verify


@dataclass(frozen=True)
class RunSettings:
    """Model and backend settings of a run (what the history records beside the Strategy)."""

    model: str = "llama-3.2-1b"
    layers: int | None = None
    context: int = 512
    position: int = 0
    tokens: int = 8
    backend: str = "sim"
    gpu: str | None = None
    host: str | None = None
    seed: int = 0

    def backend_options(self) -> dict[str, Any]:
        if self.backend == "sim":
            return {"gpu": self.gpu, "host": self.host}
        if self.backend == "llamacpp":  # a lab run is timed and traced: tiled weights, no logits pass
            return {"fill": "tiled", "logits": False}
        return {}


@dataclass
class Entry:
    """One finished run of the history: what was asked, what came back, and its race verdict."""

    n: int
    model: str
    backend: str
    gpu: str
    strategy: Strategy
    run: Run
    races: RaceReport | None
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def llamacpp_schedule(self) -> bool:
        """The run is llama.cpp's schedule, not a workbench Plan: run by llama.cpp itself, or
        simulated under a llama.cpp calibration (``<gpu>-llamacpp``), whose Plan is llama.cpp's
        graph, fusions and input copies (``llamacpp_schedule``). The race checker proves the
        workbench's Plans, so it has no verdict on such a run."""
        return runs_llamacpp_schedule(self.backend, self.run)

    @property
    def label(self) -> str:
        where = f"{self.gpu}/{self.settings.get('host')}" if self.backend == "sim" else self.backend
        return f"#{self.n} {self.model} {self.strategy.label()} @{where}"

    @property
    def us_per_token(self) -> float:
        return float(self.run.stats.get("us_per_token", float("nan")))


def runs_llamacpp_schedule(backend: str, run: Run) -> bool:
    """``Entry.llamacpp_schedule`` of a run of ``backend``."""
    cal = run.meta.get("calibration")
    return bool(getattr(get_backend(backend), "schedules_own_graph", False)
                or getattr(cal, "executor", "") == "llamacpp")


class LabSession:
    """Runs and their history. ``run`` is synchronous; the panel calls it from its worker."""

    def __init__(self, history_size: int = 8) -> None:
        self.history: deque[Entry] = deque(maxlen=history_size)
        self.baseline: Entry | None = None
        self.shown: Entry | None = None
        self._n = 0

    def run(self, settings: RunSettings, strategy: Strategy, *, race_check: bool = True,
            progress: Progress | None = None, config: ModelConfig | None = None) -> Entry:
        """Run ``strategy`` under ``settings`` (on a GPU the timeline is a CUPTI trace: graph
        replays as one span per launch, the last 2 tokens kernel by kernel), check its Plan for
        races, and add it to the history (the first run becomes the baseline)."""
        t0 = time.perf_counter()
        model = config if config is not None else settings.model
        backend = get_backend(settings.backend)
        r = run_workbench(model, strategy, tokens=settings.tokens, backend=settings.backend,
                          layers=None if config is not None else settings.layers,
                          context=None if config is not None else settings.context, start_pos=settings.position,
                          seed=settings.seed, trace=getattr(backend, "can_trace", lambda: True)(),
                          progress=progress, quiet=True, **settings.backend_options())
        races = None
        if race_check and r.plan is not None and not runs_llamacpp_schedule(settings.backend, r):
            if progress is not None:
                progress("race check", 0, 1)
            races = verify(r.plan, tokens=2)
        self._n += 1
        gpu = r.meta["calibration"].gpu if "calibration" in r.meta else settings.backend
        entry = Entry(self._n, r.plan.graph.meta["config"].name if r.plan else str(settings.model), r.backend, gpu,
                      strategy, r, races, time.perf_counter() - t0, {**settings.__dict__, "gpu": gpu})
        self.history.append(entry)
        if self.baseline is None:
            self.baseline = entry
        self.shown = entry
        return entry

    def pin(self, entry: Entry) -> None:
        self.baseline = entry

    def speedup(self, entry: Entry | None = None) -> float:
        """Baseline time per token over the entry's (> 1: the entry is faster)."""
        entry = entry or self.shown
        if entry is None or self.baseline is None:
            return float("nan")
        return self.baseline.us_per_token / entry.us_per_token

    def stats_table(self) -> pd.DataFrame:
        """One row per run of the history, with the speedup against the baseline."""
        rows = []
        for e in self.history:
            s = e.run.stats
            rows.append({
                "run": e.n, "model": e.model, "backend": e.backend, "strategy": e.strategy.label(),
                "µs/token": s.get("us_per_token"), "tokens/s": s.get("tokens_per_s"),
                "kernels/token": s.get("kernels_per_token"), "launches/token": s.get("launches_per_token"),
                "syncs/token": s.get("syncs_per_token"), "GPU busy": s.get("gpu_busy_fraction"),
                "memory MiB": s.get("memory_bytes", float("nan")) / 2**20,
                "speedup": self.speedup(e),
                "races": "not checked" if e.races is None else len(e.races.races),
                "baseline": "◀" if e is self.baseline else "",
            })
        return pd.DataFrame(rows)

    def export(self, entry: Entry, fmt: str, out_dir: str | Path) -> Path:
        """Write ``entry`` as ``html``, ``png``, ``svg`` (its timeline), or its trace itself as
        ``parquet`` (the native file), ``json`` (Perfetto) or ``pftrace`` (Perfetto protobuf)."""
        from ..trace.io import save_trace
        from .export import export
        from .timeline import timeline

        slug = f"{entry.model}_{entry.strategy.label()}_run{entry.n}"
        slug = slug.replace("/", "-").replace("(", "").replace(")", "").replace(",", "-")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{slug}.{fmt}"
        if fmt in ("json", "parquet", "pftrace"):
            return save_trace(entry.run.trace, path).resolve()
        return export(timeline(entry.run.trace, title=entry.label), path).resolve()
