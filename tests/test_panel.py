"""The control panel, headless: set widget values, click Run, check what the panel shows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.strategy import ALL_ON, Strategy
from workbench.view import panel as panel_mod
from workbench.view.panel import GLOBAL, ControlPanel

MODEL = "llama-tiny"


def _xs(fig) -> list[np.ndarray]:
    return [np.asarray(t.x, dtype=float) for t in fig.data]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.allclose(x, y, equal_nan=True) for x, y in zip(a, b))


@pytest.fixture
def p(tmp_path) -> ControlPanel:
    return ControlPanel(MODEL, tokens=3, out_dir=tmp_path / "exports")


def test_click_run_after_toggling_pdl_changes_the_timeline(p):
    p.graphs.value = True
    p.run_button.click()  # queued on the worker thread
    assert p.wait(60)
    assert p.last_error is None, p.last_error
    first = p.figure
    before = _xs(first)
    assert "graphs" in first.layout.title.text and "pdl" not in first.layout.title.text

    p.pdl.value = True
    assert len(p.history) == 1, "without 'run on every change' a knob change must not run"
    assert "press Run" in p.status.value
    p.run_button.click()
    assert p.wait(60)
    assert p.last_error is None, p.last_error
    assert len(p.history) == 2
    assert p.figure is not first and "graphs+pdl" in p.figure.layout.title.text
    assert not _same(before, _xs(p.figure)), "the timeline did not change"
    # speedup against the pinned baseline (the first run) in the summary and the stats table
    table = p.stats_table()
    assert list(table["strategy"]) == ["graphs", "graphs+pdl"]
    expected = p.history[0].us_per_token / p.history[1].us_per_token
    assert table["speedup"].iloc[1] == pytest.approx(expected)
    assert p.speedup() == pytest.approx(expected) and expected > 1.0
    assert f"{expected:.3f}x" in p.summary.value
    assert "race-free" in p.summary.value
    assert p.progress.value == p.progress.max
    # the comparison tab shows both runs
    assert p.compare_figure is not None
    assert "baseline" in " ".join(p.compare_figure.layout.meta["workbench"]["rows"])


def test_auto_run_on_knob_change_keeps_history(tmp_path):
    p = ControlPanel(MODEL, tokens=3, auto=True, history_size=3, out_dir=tmp_path)
    p.run()
    for streams in ("qkv", "auto", "single"):
        p.streams.value = streams
        assert p.wait(60)
    assert p.last_error is None, p.last_error
    assert [e.strategy.streams for e in p.history] == ["qkv", "auto", "single"]  # history_size=3 keeps the last 3
    assert p.baseline is not None and p.baseline.n == 1  # the pinned baseline survives leaving the history
    # show an older run again, without re-running
    older = p.history[0]
    p.history_select.value = older.n
    assert p.shown is older and older.label in p.figure.layout.title.text


def test_impossible_combination_is_shown_and_the_previous_run_stays(p):
    good = p.run()
    fig = p.figure
    p.streams.value = "qkv"
    p.max_streams.value = 2
    assert p.run() is None
    assert "--max-streams 2" in p.last_error
    assert "run failed" in p.status.value and "still shown" in p.status.value
    assert p.shown is good and p.figure is fig and len(p.history) == 1
    assert not p.run_button.disabled


def test_backend_failure_is_shown_not_raised(p, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("device lost")

    monkeypatch.setattr(panel_mod, "run_session", boom)
    assert p.run() is None
    assert "device lost" in p.status.value


def test_late_pdl_wait_shows_races(p):
    p.set_strategy(Strategy(graphs=True, pdl=True, pdl_wait="late"))
    e = p.run()
    assert e is not None and e.races is not None and not e.races.race_free
    assert "race(s)" in p.summary.value and "pdl-early-read" in p.races_html.value
    assert "deliberate race" in p.status.value  # the UnsafeStrategyWarning is shown


def test_per_family_placement_widgets(p):
    p.pdl.value = True
    assert not p.family_wait["norm"].disabled
    p.family_wait["norm"].value = "late"
    p.family_trigger["mul_mat"].value = "end"
    s = p.strategy()
    assert ("norm", "late", p.pdl_trigger.value) in s.pdl_families
    assert ("mul_mat", p.pdl_wait.value, "end") in s.pdl_families
    assert s.placement("norm") == ("late", "start") and s.placement("rope") == ("first-read", "start")
    p.family_wait["norm"].value = GLOBAL
    p.family_trigger["mul_mat"].value = GLOBAL
    assert p.strategy().pdl_families == ()


@pytest.mark.parametrize("s", [Strategy(), ALL_ON, ALL_ON.with_(pdl_families=(("attn", "start", "end"),),
                                                                   max_streams=6, allocator="no-reuse")])
def test_set_strategy_round_trips(p, s):
    p.set_strategy(s)
    assert p.strategy() == s
    assert p.pdl_wait.disabled == (not s.pdl)


def test_exports_say_where_the_file_went(p, tmp_path):
    assert p.export("html") is None and "run first" in p.export_status.value
    p.run()
    html = p.export("html")
    assert html is not None and html.exists() and html.stat().st_size > 10_000
    assert str(html) in p.export_status.value
    p.request_export("json")
    assert p.wait(60)
    out = sorted((tmp_path / "exports").glob("*.json"))
    assert len(out) == 1 and str(out[0].resolve()) in p.export_status.value
    assert json.loads(out[0].read_text())["traceEvents"]


def test_pin_another_baseline(p):
    p.run()
    p.set_strategy(Strategy(graphs=True))
    second = p.run()
    p.pin()
    assert p.baseline is second and p.speedup() == pytest.approx(1.0)
    assert "the shown run is the baseline" in p.compare_box.children[0].value


def test_backends_offered(monkeypatch):
    from workbench.exec import cuda_backend

    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (False, "no GPU"))
    assert panel_mod.available_backends() == ["sim"]
    assert ControlPanel(MODEL).backend.options == ("sim",)
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (True, "1 CUDA device(s)"))
    assert panel_mod.available_backends() == ["cuda", "sim"]
    with pytest.raises(ValueError, match="WORKBENCH_LLAMACPP"):
        ControlPanel(MODEL, backend="llamacpp")


@pytest.mark.slow
def test_llamacpp_in_the_panel(llamacpp_lib, monkeypatch, tmp_path):
    """With a build named, the panel offers llama.cpp; switching to it sets the knobs llama.cpp
    has no switch for to its own and greys them; a run shows its switches, no race verdict of a
    Plan llama.cpp does not run, and a refused knob stays in the status line."""
    from workbench.exec import cuda_backend

    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (False, "no GPU"))
    monkeypatch.setenv("WORKBENCH_LLAMACPP", llamacpp_lib)
    assert panel_mod.available_backends() == ["llamacpp", "sim"]
    p = ControlPanel(MODEL, tokens=3, backend="sim", strategy=Strategy(allocator="stream-aware", logits="zero-copy",
                                                                       fusion=frozenset({"norm-mat-vec"})),
                     out_dir=tmp_path)
    p.backend.value = "llamacpp"
    assert p.strategy() == Strategy()
    assert "no switch for allocator, logits, fusion" in p.status.value
    assert p.allocator.disabled and p.logits.disabled and p.fusion["norm-mat-vec"].disabled
    assert not p.fusion["rms-norm-mul"].disabled and not p.graphs.disabled
    e = p.run()
    assert e is not None, p.last_error
    assert e.backend == "llamacpp" and e.races is None and e.us_per_token > 0
    assert "CPU (llama.cpp)" in p.status.value and "GGML_CUDA_DISABLE_GRAPHS=1" in p.status.value
    assert "llama.cpp schedules its own graph" in p.summary.value
    assert p.export("json").exists()
    p.graphs.value = True  # a CPU build has no CUDA graphs: refused, shown, the previous run kept
    assert p.run() is None and "CPU-only" in p.last_error and p.shown is e


def test_calibration_choice_changes_host_profiles_and_device(p):
    p.gpu.value = "h200"
    assert p.host.value in p.host.options and "llama.cpp" in p.host.options
    p.host.value = "llama.cpp"
    e = p.run()
    assert "h200 calibration" in e.run.device and "llama.cpp" in e.run.device


def test_simulating_llamacpps_schedule_has_no_race_verdict(p):
    """Under a llama.cpp calibration the simulator runs llama.cpp's schedule (its graph, fusions and
    input copies), which the race checker does not prove: the run is shown with no verdict, as a run
    of llama.cpp itself, instead of failing on the inputs only llama.cpp copies."""
    p.gpu.value = "h200-llamacpp"
    e = p.run()
    assert e is not None, p.last_error
    assert e.llamacpp_schedule and e.races is None and e.us_per_token > 0
    assert "llama.cpp schedules its own graph" in p.summary.value
    p.gpu.value = "h200"
    e = p.run()
    assert not e.llamacpp_schedule and e.races is not None and e.races.race_free


def test_a_knob_change_does_not_block_while_a_run_is_slow(tmp_path, monkeypatch):
    import threading
    import time

    real = panel_mod.run_session
    release = threading.Event()

    def slow(*a, **k):
        release.wait(30)  # a long GPU run, say
        return real(*a, **k)

    monkeypatch.setattr(panel_mod, "run_session", slow)
    p = ControlPanel(MODEL, tokens=3, auto=True, out_dir=tmp_path)
    t0 = time.perf_counter()
    p.graphs.value = True          # starts a run on the worker thread
    p.pdl.value = True             # queued behind it (and coalesced with any further change)
    p.sync.value = "implicit"
    assert time.perf_counter() - t0 < 0.5, "knob changes must return at once"
    assert not p.wait(0.2) and "running" in p.status.value
    release.set()
    assert p.wait(60)
    assert p.last_error is None, p.last_error
    assert p.shown.strategy == Strategy(graphs=True, pdl=True, sync="implicit")
    assert len(p.history) <= 2  # the queued changes ran as one run
