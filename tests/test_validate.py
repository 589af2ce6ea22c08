"""Run-option checks that the CLI cannot reach without a GPU: notices for the cuda backend,
run labels for comparisons, output checks for image formats."""

from __future__ import annotations

import pytest

from workbench import validate
from workbench.strategy import Strategy
from workbench.validate import OptionError, inert_options, run_labels


def test_cuda_notices_name_the_knob_that_is_off():
    eager = Strategy()
    notes = inert_options({"node_tokens": "4", "trace": "t.json", "gpu": "h200", "host_profile": "llama.cpp"},
                          eager, "cuda")
    assert any("--node-tokens 4" in n and "--graphs" in n for n in notes)
    assert any("--gpu h200" in n for n in notes) and any("--host-profile llama.cpp" in n for n in notes)
    graphs = Strategy(graphs=True)
    assert inert_options({"node_tokens": "4", "trace": "t.json"}, graphs, "cuda") == []
    assert inert_options({"node_tokens": "all"}, graphs, "cuda")  # no --trace: nothing to trace per kernel
    assert inert_options({}, Strategy(pdl=True, pdl_wait="late", streams="auto", max_streams=2), "sim") == []


def test_run_labels_tell_same_named_runs_apart(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a, b = tmp_path / "x" / "run.json", tmp_path / "y" / "run.json"
    assert run_labels([a, b]) == ["x/run.json", "y/run.json"]
    assert run_labels([a, tmp_path / "other.json"]) == ["run.json", "other.json"]
    with pytest.raises(OptionError, match="same file"):
        run_labels([a, tmp_path / "y" / ".." / "x" / "run.json"])


def test_image_output_needs_its_tools_before_the_work(tmp_path, monkeypatch):
    import workbench.view.export as export

    monkeypatch.setattr(export, "chromium_path", lambda: None)
    monkeypatch.setattr(validate.importlib.util, "find_spec", lambda name: object())
    with pytest.raises(OptionError, match="--out t.png: writing .png needs a Chrome/Chromium"):
        validate.check_output("--out", tmp_path / "t.png", (".png",))
    assert validate.check_output("--out", tmp_path / "t.html", (".html",)) == tmp_path / "t.html"
    assert not (tmp_path / "t.html").exists()
