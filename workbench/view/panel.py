"""The lab's control panel: every knob as a widget, a Run button, and what a run shows.

``ControlPanel`` puts a model (preset, layers, context, start position, tokens), a backend
(``sim`` with a GPU calibration and host profile, ``cuda`` only where a GPU is present, ``llamacpp``
where ``$WORKBENCH_LLAMACPP`` names a build: the knobs llama.cpp has no switch for are greyed) and every
Strategy knob, PDL wait and trigger per kernel family included, above four outputs: the Nsight-like
timeline, a stats table of the run history with the speedup against a pinned baseline, the
baseline-vs-run comparison, and the race check's verdict. Export buttons write the shown run as
HTML, PNG, SVG, Perfetto JSON or a Parquet trace and say where the file went.

Why it is built this way:

* **never block the kernel**: a click or a knob change only queues a run; one worker thread
  executes runs one after another, so the kernel keeps answering while a long run (a big model,
  a GPU run, a race check of thousands of accesses) is in flight. ``run()`` is the same work,
  synchronous, for notebooks and tests.
* **never lose a run**: every finished run goes into a short history (``history_size``); the
  stats table lists them all, any of them can be shown again, and one is pinned as the
  baseline every later run is compared with.
* **errors stay in the panel**: an impossible knob combination or a failing backend is shown
  in the status line; the previous run stays on screen.
"""

from __future__ import annotations

import html
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from ..exec.backend import get_backend
from ..exec.calibration import default_gpu, known_gpus, load_calibration
from ..exec.cuda_backend import present_gpu_name
from ..exec.llamacpp import BUILD_ENV as LLAMACPP_BUILD_ENV
from ..graph import KERNEL_FAMILIES
from ..llamacpp.switches import LLAMACPP_FUSION
from ..models import ModelConfig, load_config
from ..models.presets import PRESETS
from ..strategy import ALLOCATORS, FUSIONS, LOGITS_MODES, PDL_TRIGGERS, PDL_WAITS, STREAM_MODES, SYNC_MODES, Strategy
from ..verify import RaceReport
from .session import Entry, LabSession, RunSettings
from .timeline import timeline, timeline_widget

#: per-family dropdown value meaning "use the global wait / trigger"
GLOBAL = "(global)"
#: stages of one run, for the progress bar (the token stage advances per token)
STAGES = ("plan", "weights", "tokens", "race check", "draw")


class ControlPanel:
    """Widgets for one model + strategy, a run history and the views of the shown run.

    ``ControlPanel(model="llama-3.2-1b", strategy=Strategy(graphs=True))`` sets initial values;
    display it as the last expression of a cell. ``run()`` runs synchronously and returns the
    Entry; the Run button and (with ``auto`` ticked) every knob change queue a run on the worker
    thread; ``wait()`` blocks until the queue is empty.
    """

    def __init__(self, model: str = "llama-3.2-1b", *, layers: int | None = None, context: int = 512,
                 position: int = 0, tokens: int = 8, backend: str | None = None, gpu: str | None = None,
                 host: str | None = None, strategy: Strategy | None = None, auto: bool = False,
                 race_check: bool = True, history_size: int = 8, out_dir: str | Path = "exports",
                 figure_width: int = 1150) -> None:
        self.session = LabSession(history_size)
        self.out_dir = Path(out_dir)
        self.figure_width = figure_width
        self.last_error: str | None = None
        self._quiet = 0
        self._lock = threading.Lock()
        self._cv = threading.Condition()
        self._jobs: dict[str, Callable[[], object]] = {}
        self._worker: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

        style = {"description_width": "92px"}
        wide = W.Layout(width="250px")
        # -- model -------------------------------------------------------------------------
        self.model = W.Dropdown(options=list(PRESETS), value=model, description="model", style=style, layout=wide)
        self.layers = W.BoundedIntText(value=0, min=0, max=1024, description="layers", style=style, layout=wide,
                                       tooltip="0 = all layers of the preset")
        self.context = W.BoundedIntText(value=context, min=1, max=1 << 20, description="context", style=style,
                                        layout=wide)
        self.position = W.BoundedIntText(value=position, min=0, max=1 << 20, description="position", style=style,
                                         layout=wide, tooltip="KV position of the first decoded token")
        self.tokens = W.BoundedIntText(value=tokens, min=1, max=4096, description="tokens", style=style,
                                       layout=wide)
        # -- backend -----------------------------------------------------------------------
        offered = available_backends()
        if backend is not None and backend not in offered:
            raise ValueError(f"backend {backend!r} is not offered here ({', '.join(offered)}): cuda needs a GPU with "
                             f"CuPy, llamacpp a build named by ${LLAMACPP_BUILD_ENV} (benchmarks/llamacpp_gpu_run.sh "
                             "builds one on a GPU machine; python -m workbench.llamacpp.build makes a CPU one)")
        self.backend = W.Dropdown(options=offered, value=backend or offered[0], description="backend",
                                  style=style, layout=wide)
        self.gpu = W.Dropdown(options=known_gpus(), value=gpu or default_gpu(present_gpu_name())[0],
                              description="calibration", style=style, layout=wide)
        self.host = W.Dropdown(options=[], description="host profile", style=style, layout=wide)
        self._fill_hosts(host)
        # -- strategy ----------------------------------------------------------------------
        self.sync = W.ToggleButtons(options=list(SYNC_MODES), description="sync", style={"button_width": "92px"})
        self.graphs = W.Checkbox(description="CUDA graphs", indent=False, layout=W.Layout(width="120px"))
        self.streams = W.ToggleButtons(options=list(STREAM_MODES), description="streams",
                                       style={"button_width": "62px"})
        self.max_streams = W.BoundedIntText(value=4, min=1, max=16, description="max streams", style=style,
                                            layout=W.Layout(width="160px"))
        self.pdl = W.Checkbox(description="PDL", indent=False, layout=W.Layout(width="70px"))
        self.pdl_wait = W.Dropdown(options=list(PDL_WAITS), description="wait", style={"description_width": "40px"},
                                   layout=W.Layout(width="170px"))
        self.pdl_trigger = W.Dropdown(options=list(PDL_TRIGGERS), description="trigger",
                                      style={"description_width": "50px"}, layout=W.Layout(width="200px"))
        self.family_wait = {f: W.Dropdown(options=[GLOBAL, *PDL_WAITS], layout=W.Layout(width="110px"))
                            for f in KERNEL_FAMILIES}
        self.family_trigger = {f: W.Dropdown(options=[GLOBAL, *PDL_TRIGGERS], layout=W.Layout(width="140px"))
                               for f in KERNEL_FAMILIES}
        self.fusion = {f: W.Checkbox(description=f, indent=False, layout=W.Layout(width="130px")) for f in FUSIONS}
        self.allocator = W.Dropdown(options=list(ALLOCATORS), description="allocator", style=style, layout=wide)
        self.logits = W.ToggleButtons(options=list(LOGITS_MODES), description="logits",
                                      tooltips=["async D2H copy after the step (llama.cpp)",
                                                "their kernel writes them into mapped pinned host memory"],
                                      style={"button_width": "92px"})
        # -- actions and outputs -------------------------------------------------------------
        self.auto = W.Checkbox(value=auto, description="run on every change", indent=False,
                               layout=W.Layout(width="170px"))
        self.race_check = W.Checkbox(value=race_check, description="race check", indent=False,
                                     layout=W.Layout(width="110px"))
        self.run_button = W.Button(description="Run", button_style="primary", icon="play")
        self.pin_button = W.Button(description="Pin as baseline", icon="thumb-tack")
        self.progress = W.IntProgress(value=0, min=0, max=100, layout=W.Layout(width="160px"))
        self.progress_label = W.Label(layout=W.Layout(width="150px"))
        self.status = W.HTML()
        self.summary = W.HTML()
        self.history_select = W.Dropdown(options=[], description="show", style={"description_width": "40px"},
                                         layout=W.Layout(width="420px"))
        labels = {"json": "Perfetto JSON", "parquet": "Parquet trace"}
        self.export_buttons = {fmt: W.Button(description=labels.get(fmt, fmt.upper()), icon="download",
                                             layout=W.Layout(width="auto"))
                               for fmt in ("html", "png", "svg", "json", "parquet")}
        self.export_status = W.HTML()
        self.timeline_box = W.Box(layout=W.Layout(width="100%"))
        self.compare_box = W.Box(layout=W.Layout(width="100%"))
        self.stats_html = W.HTML()
        self.races_html = W.HTML()
        self.figure: go.FigureWidget | None = None
        self.compare_figure: go.FigureWidget | None = None

        # stable CSS hooks for browser tests and screenshots
        for w, cls in ((self.pdl, "wb-pdl"), (self.graphs, "wb-graphs"), (self.run_button, "wb-run"),
                       (self.timeline_box, "wb-timeline"), (self.compare_box, "wb-compare"),
                       (self.status, "wb-status"), (self.summary, "wb-summary")):
            w.add_class(cls)

        self.set_strategy(strategy or Strategy())
        self.layers.value = layers or 0
        self._wire()
        self.ui = self._layout()
        self._show_status("ready: set the knobs and press Run")

    # -------------------------------------------------------------------------- reading knobs
    def strategy(self) -> Strategy:
        """The Strategy the widgets describe (raises StrategyError for an impossible one)."""
        families = tuple(
            (f, self.family_wait[f].value if self.family_wait[f].value != GLOBAL else self.pdl_wait.value,
             self.family_trigger[f].value if self.family_trigger[f].value != GLOBAL else self.pdl_trigger.value)
            for f in KERNEL_FAMILIES
            if self.family_wait[f].value != GLOBAL or self.family_trigger[f].value != GLOBAL)
        return Strategy(sync=self.sync.value, graphs=self.graphs.value, streams=self.streams.value,
                        max_streams=self.max_streams.value, pdl=self.pdl.value, pdl_wait=self.pdl_wait.value,
                        pdl_trigger=self.pdl_trigger.value, pdl_families=families,
                        fusion=frozenset(f for f, w in self.fusion.items() if w.value), allocator=self.allocator.value,
                        logits=self.logits.value)

    def set_strategy(self, s: Strategy) -> None:
        """Set every knob widget from ``s`` without triggering runs."""
        self._quiet += 1
        try:
            self.sync.value, self.graphs.value, self.streams.value = s.sync, s.graphs, s.streams
            self.max_streams.value, self.pdl.value = s.max_streams, s.pdl
            self.pdl_wait.value, self.pdl_trigger.value = s.pdl_wait, s.pdl_trigger
            overrides = {f: (w, t) for f, w, t in s.pdl_families}
            for f in KERNEL_FAMILIES:
                w, t = overrides.get(f, (GLOBAL, GLOBAL))
                self.family_wait[f].value, self.family_trigger[f].value = w, t
            for f, box in self.fusion.items():
                box.value = f in s.fusion
            self.allocator.value = s.allocator
            self.logits.value = s.logits
        finally:
            self._quiet -= 1
        self._sync_enabled()

    def config(self) -> ModelConfig:
        return load_config(self.model.value, layers=self.layers.value or None, context=self.context.value)

    def settings(self) -> RunSettings:
        """Model and backend settings of the next run (what the history records beside the Strategy)."""
        return RunSettings(model=self.model.value, layers=self.layers.value or None, context=self.context.value,
                           position=self.position.value, tokens=self.tokens.value, backend=self.backend.value,
                           gpu=self.gpu.value, host=self.host.value)

    # the session's history, baseline and shown run, as attributes of the panel
    history = property(lambda self: self.session.history)
    baseline = property(lambda self: self.session.baseline)
    shown = property(lambda self: self.session.shown)

    def knob_widgets(self) -> dict[str, Any]:
        """Strategy field -> its widget(s): one entry per knob of ``strategy.knobs.KNOBS``."""
        return {"sync": self.sync, "graphs": self.graphs, "streams": self.streams, "max_streams": self.max_streams,
                "pdl": self.pdl, "pdl_wait": self.pdl_wait, "pdl_trigger": self.pdl_trigger,
                "pdl_families": (self.family_wait, self.family_trigger), "fusion": self.fusion,
                "allocator": self.allocator, "logits": self.logits}

    # -------------------------------------------------------------------------- running
    def run(self) -> Entry | None:
        """Run the current settings now (in the calling thread); the Entry, or None on error
        (the message is in the status line and ``last_error``)."""
        with self._lock:
            return self._run_once()

    def request_run(self) -> None:
        """Queue a run on the worker thread and return at once (queued runs coalesce)."""
        self._submit("run", self.run)

    def request_export(self, fmt: str) -> None:
        """Queue an export of the shown run on the worker thread (kaleido takes seconds)."""
        self.export_status.value = f"writing {fmt} …"
        self._submit(f"export-{fmt}", lambda: self.export(fmt))

    def wait(self, timeout: float | None = 120.0) -> bool:
        """Block until queued work is done; False on timeout."""
        return self._idle.wait(timeout)

    def _submit(self, key: str, job: Callable[[], object]) -> None:
        with self._cv:
            self._jobs[key] = job
            self._idle.clear()
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="workbench-panel", daemon=True)
                self._worker.start()

    def _work(self) -> None:
        while True:
            with self._cv:
                if not self._jobs:
                    self._worker = None
                    self._idle.set()
                    return
                key = next(iter(self._jobs))
                job = self._jobs.pop(key)
            try:
                job()
            except Exception as e:  # noqa: BLE001 - keep the worker (and wait()) alive whatever a job does
                self.last_error = f"{type(e).__name__}: {e}"
                self._show_status(f"<span style='color:#b00020'>{html.escape(self.last_error)}</span>")

    def _run_once(self) -> Entry | None:
        self.progress.value = 0
        self.progress.bar_style = "info"
        self.run_button.disabled = True
        try:
            settings = self.settings()
            strategy = self.strategy()
            cfg = self.config()
            self._show_status(f"running {html.escape(cfg.name)} · {html.escape(strategy.label())} "
                              f"on {settings.backend} …")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                entry = run_session(self.session, settings, strategy, cfg, self.race_check.value, self._progress)
            self._stage("draw")
            self.show(entry)
            self.progress.value = self.progress.max
            self.progress.bar_style = "success"
            notes = sorted({str(w.message) for w in caught} | set(entry.run.meta.get("notes", ()))
                           | set(entry.run.meta.get("switch_notes", ())))
            switches = entry.run.meta.get("switches_text")
            self.last_error = None
            self._show_status(f"run #{entry.n} done in {entry.seconds:.2f} s on {html.escape(entry.run.device)}"
                              + (f" · llama.cpp switches <code>{html.escape(switches)}</code>" if switches else "")
                              + "".join(f"<br>⚠ {html.escape(n)}" for n in notes))
            return entry
        except Exception as e:  # noqa: BLE001 - the panel must survive any failure and show it
            self.last_error = f"{type(e).__name__}: {e}"
            self.progress.bar_style = "danger"
            tb = html.escape(f"{type(e).__name__}: {e}")
            self._show_status(f"<span style='color:#b00020'><b>run failed</b>: {tb}</span>"
                              + (" (the previous run is still shown)" if self.shown else ""))
            return None
        finally:
            self.run_button.disabled = False
            self.progress_label.value = ""

    def _stage(self, stage: str) -> None:
        self._progress(stage, 0, 0)

    def _progress(self, stage: str, done: int, total: int) -> None:
        """Progress of the running job: stages split the bar, the token stage advances per token."""
        k = STAGES.index(stage) if stage in STAGES else STAGES.index("tokens")
        frac = (k + (done / total if total else 0.0)) / len(STAGES)
        self.progress.value = max(self.progress.value, int(100 * frac))
        self.progress_label.value = f"{stage} {done}/{total}" if total else stage

    # -------------------------------------------------------------------------- showing
    def show(self, entry: Entry) -> None:
        """Show ``entry`` (any run of the history): timeline, comparison, stats, races."""
        self.session.shown = entry
        title = f"{entry.label} · {entry.run.device}"
        fig = timeline_widget(timeline(entry.run.trace, title=title).update_layout(width=self.figure_width))
        old, self.figure = self.figure, fig
        self.timeline_box.children = (fig,)
        if old is not None:
            old.close()
        self._show_compare()
        self._refresh_tables()

    def pin(self, entry: Entry | None = None) -> None:
        """Pin ``entry`` (default: the shown run) as the baseline of every speedup."""
        entry = entry or self.shown
        if entry is None:
            self._show_status("nothing to pin yet: run first")
            return
        self.session.pin(entry)
        self._show_compare()
        self._refresh_tables()
        self._show_status(f"baseline is now {html.escape(entry.label)}")

    def speedup(self, entry: Entry | None = None) -> float:
        """Baseline time per token over the entry's (> 1: the entry is faster)."""
        return self.session.speedup(entry)

    def stats_table(self) -> pd.DataFrame:
        """One row per run of the history, with the speedup against the baseline."""
        return self.session.stats_table()

    def _show_compare(self) -> None:
        base, cur = self.baseline, self.shown
        if base is None or cur is None:
            return
        if base is cur:
            self.compare_box.children = (W.HTML("<p>the shown run is the baseline: pin another run, or run "
                                                 "again with other knobs, to compare</p>"),)
            return
        from .compare import compare

        runs = {f"baseline {base.label}": base.run.trace, cur.label: cur.run.trace}
        common = sorted(set(base.run.trace.tokens()) & set(cur.run.trace.tokens()))
        align = common[1] if len(common) > 1 else (common[0] if common else 0)
        fig = go.FigureWidget(compare(runs, align_token=align, title=f"steady-state speedup {self.speedup(cur):.3f}x")
                              .update_layout(width=self.figure_width))
        old, self.compare_figure = self.compare_figure, fig
        self.compare_box.children = (fig,)
        if old is not None:
            old.close()

    def _refresh_tables(self) -> None:
        e = self.shown
        if e is None:
            return
        s = e.run.stats
        sp = self.speedup(e)
        verdict = _verdict(e.races, e.llamacpp_schedule)
        self.summary.value = (
            f"<div style='font-size:14px'><b>{html.escape(e.label)}</b> · {s['us_per_token']:,.1f} µs/token · "
            f"{s['tokens_per_s']:,.1f} tokens/s · <b>{sp:.3f}x</b> vs baseline "
            f"{html.escape(self.baseline.label) if self.baseline else '-'} · {verdict}</div>")
        table = self.stats_table()
        fmt = {"µs/token": "{:,.1f}", "tokens/s": "{:,.1f}", "kernels/token": "{:,.1f}",
               "launches/token": "{:,.1f}", "syncs/token": "{:,.1f}", "GPU busy": "{:.1%}",
               "memory MiB": "{:,.1f}", "speedup": "{:.3f}x"}
        self.stats_html.value = table.style.format(fmt, na_rep="-").hide(axis="index").to_html()
        self.races_html.value = _race_html(e.races, e.llamacpp_schedule)
        self._quiet += 1
        try:
            self.history_select.options = [(x.label + f" · {x.us_per_token:,.1f} µs/token", x.n)
                                           for x in reversed(self.history)]
            self.history_select.value = e.n
        finally:
            self._quiet -= 1

    # -------------------------------------------------------------------------- export
    def export(self, fmt: str) -> Path | None:
        """Write the shown run as ``html``, ``png``, ``svg`` (its timeline) or ``json``
        (Perfetto trace) under ``out_dir``; the path, or None with the error shown."""
        e = self.shown
        if e is None:
            self.export_status.value = "nothing to export yet: run first"
            return None
        try:
            out = self.session.export(e, fmt, self.out_dir)
        except Exception as err:  # noqa: BLE001
            self.export_status.value = f"<span style='color:#b00020'>export failed: {html.escape(str(err))}</span>"
            return None
        self.export_status.value = (f"wrote <code>{html.escape(str(out))}</code> "
                                    f"({out.stat().st_size / 1024:,.0f} KiB)")
        return out

    # -------------------------------------------------------------------------- wiring
    def _fill_hosts(self, host: str | None = None) -> None:
        cal = load_calibration(self.gpu.value)
        self.host.options = list(cal.host_profiles)
        self.host.value = host if host in cal.host_profiles else cal.host_profile

    def _knobs(self) -> list[W.Widget]:
        return [self.model, self.layers, self.context, self.position, self.tokens, self.backend, self.gpu, self.host,
                self.sync, self.graphs, self.streams, self.max_streams, self.pdl, self.pdl_wait, self.pdl_trigger,
                *self.family_wait.values(), *self.family_trigger.values(), *self.fusion.values(), self.allocator,
                self.logits]

    def _wire(self) -> None:
        for w in self._knobs():
            w.observe(self._on_knob, names="value")
        self.gpu.observe(lambda _: self._fill_hosts(self.host.value), names="value")
        self.model.observe(lambda _: setattr(self.layers, "value", 0), names="value")
        self.run_button.on_click(lambda _: self.request_run())
        self.pin_button.on_click(lambda _: self.pin())
        for fmt, b in self.export_buttons.items():
            b.on_click(lambda _, fmt=fmt: self.request_export(fmt))
        self.history_select.observe(self._on_select, names="value")

    def _on_knob(self, change: dict) -> None:
        if self._quiet:
            return
        reset = ""
        if change.get("owner") is self.backend and change.get("new") == "llamacpp":
            reset = self._to_llamacpp_knobs()
        self._sync_enabled()
        if self.auto.value:
            self.request_run()
        elif self.shown is not None or reset:
            self._show_status(reset + ("; " if reset else "") + "knobs changed: press Run"
                              + (" (the shown run is unchanged)" if self.shown is not None else ""))

    def _on_select(self, change: dict) -> None:
        if self._quiet or change["new"] is None:
            return
        for e in self.history:
            if e.n == change["new"] and e is not self.shown:
                self.show(e)

    def _sync_enabled(self) -> None:
        on = self.pdl.value
        self.pdl_wait.disabled = self.pdl_trigger.disabled = not on
        for f in KERNEL_FAMILIES:
            self.family_wait[f].disabled = self.family_trigger[f].disabled = not on
        self.max_streams.disabled = self.streams.value == "single"
        self.gpu.disabled = self.host.disabled = self.backend.value != "sim"
        for w in self._no_llamacpp_switch():  # knobs llama.cpp has no switch for (llamacpp.switches)
            w.disabled = self.backend.value == "llamacpp" or w.disabled

    def _no_llamacpp_switch(self) -> list[W.Widget]:
        return [self.allocator, self.logits, self.max_streams, self.pdl_wait, self.pdl_trigger,
                *self.family_wait.values(), *self.family_trigger.values(),
                *(box for f, box in self.fusion.items() if f not in LLAMACPP_FUSION)]

    def _to_llamacpp_knobs(self) -> str:
        """Set the knobs llama.cpp has no switch for to what llama.cpp does (its allocator, PDL
        placement and logits copy; none of the workbench's own fusions); what changed, in words."""
        try:
            s = self.strategy()
        except ValueError:
            return ""  # an impossible combination: the run will say so
        default = Strategy()
        t = s.with_(allocator=default.allocator, logits=default.logits, pdl_wait=default.pdl_wait,
                    pdl_trigger=default.pdl_trigger, pdl_families=(), fusion=s.fusion & LLAMACPP_FUSION,
                    streams="qkv" if s.streams == "auto" else s.streams)
        changed = [k for k in ("allocator", "logits", "pdl_wait", "pdl_trigger", "pdl_families", "fusion", "streams")
                   if getattr(s, k) != getattr(t, k)]
        if not changed:
            return ""
        self.set_strategy(t)
        return "llama.cpp has no switch for " + ", ".join(changed) + ": set to what llama.cpp does"

    def _show_status(self, text: str) -> None:
        self.status.value = f"<span style='font-size:13px'>{text}</span>"

    def _layout(self) -> W.Widget:
        model = W.VBox([W.HTML("<b>Model</b>"), self.model, self.layers, self.context, self.position, self.tokens])
        backend = W.VBox([W.HTML("<b>Backend</b>"), self.backend, self.gpu, self.host, self.allocator,
                          W.HBox(list(self.fusion.values()))])
        strat = W.VBox([W.HTML("<b>Strategy</b>"), self.sync, self.logits, W.HBox([self.streams, self.max_streams]),
                        W.HBox([self.graphs, self.pdl, self.pdl_wait, self.pdl_trigger])])
        grid = [W.HTML("<b>family</b>"), W.HTML("<b>wait</b>"), W.HTML("<b>trigger</b>")]
        for f in KERNEL_FAMILIES:
            grid += [W.Label(f), self.family_wait[f], self.family_trigger[f]]
        families = W.Accordion([W.GridBox(grid, layout=W.Layout(grid_template_columns="110px 120px 150px"))])
        families.set_title(0, "PDL placement per kernel family")
        families.selected_index = None
        actions = W.HBox([self.run_button, self.progress, self.progress_label, self.auto, self.race_check,
                          self.pin_button],
                         layout=W.Layout(align_items="center"))
        exports = W.HBox([W.Label("export shown run:"), *self.export_buttons.values(), self.export_status],
                         layout=W.Layout(align_items="center"))
        tabs = W.Tab([self.timeline_box, self.compare_box, W.VBox([self.stats_html]), self.races_html])
        for i, t in enumerate(("Timeline", "vs baseline", "Stats", "Race check")):
            tabs.set_title(i, t)
        controls = W.HBox([model, backend, W.VBox([strat, families])], layout=W.Layout(flex_flow="row wrap"))
        ui = W.VBox([controls, actions, self.status, self.summary, self.history_select, tabs, exports],
                    layout=W.Layout(width="100%"))
        ui.add_class("wb-panel")
        return ui

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.ui._repr_mimebundle_(**kwargs)


def available_backends() -> list[str]:
    """Backends the panel offers: ``cuda`` first where a GPU is present, ``llamacpp`` where
    ``$WORKBENCH_LLAMACPP`` names a build, ``sim`` always."""
    return ([*(["cuda"] if get_backend("cuda").available()[0] else []),
             *(["llamacpp"] if get_backend("llamacpp").configured() else []), "sim"])


def run_session(session: LabSession, settings: RunSettings, strategy: Strategy, cfg: ModelConfig,
                race_check: bool, progress: Any) -> Entry:
    """One run of the panel (a module function so tests can make it fail)."""
    return session.run(settings, strategy, race_check=race_check, progress=progress, config=cfg)


#: why a run of llama.cpp's schedule (llama.cpp itself, or simulated under a llama.cpp calibration)
#: has no race verdict
OWN_GRAPH = "race check n/a: llama.cpp schedules its own graph (the checker proves the workbench's Plans)"


def _verdict(report: RaceReport | None, llamacpp_schedule: bool = False) -> str:
    if report is None:
        return OWN_GRAPH if llamacpp_schedule else "race check off"
    if report.race_free:
        return f"<span style='color:#1a7f37'>race-free</span> ({report.checked_pairs:,} conflicting pairs ordered)"
    causes = ", ".join(f"{c} {n}" for c, n in sorted(report.by_cause().items()))
    return f"<span style='color:#b00020'><b>{len(report.races)} race(s)</b></span> ({html.escape(causes)})"


def _race_html(report: RaceReport | None, llamacpp_schedule: bool = False) -> str:
    if report is None:
        return f"<p>{OWN_GRAPH if llamacpp_schedule else 'race check is off for this run'}</p>"
    return f"<p>{_verdict(report)}</p><pre style='font-size:11px'>{html.escape(report.text(limit=10))}</pre>"


def panel(**kwargs: Any) -> ControlPanel:
    """``ControlPanel(**kwargs)``: the call a notebook cell ends with."""
    return ControlPanel(**kwargs)
