"""Every notebook runs top to bottom, headless, in the CI time budget; committed notebooks carry
no outputs; ``workbench lab`` opens JupyterLab on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main as cli_main
from workbench.view.lab import NOTEBOOKS, execute_notebook

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

PATHS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
EXPECTED = ["00_tour", "01_sync_reduction", "02_stream_concurrency", "03_pdl", "04_copy_elimination",
            "05_simulator_vs_gpu", "06_bring_your_own_trace", "07_llamacpp"]
BUDGET_S = 60.0
PLOTLY = "application/vnd.plotly.v1+json"


def test_every_notebook_is_there():
    assert [p.stem for p in PATHS] == EXPECTED


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear outputs before committing"
    tagged = [c for c in nb.cells if "main-plot" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: exactly one cell tagged main-plot (docs/make_screenshots.py draws it)"


@pytest.mark.slow
@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_runs_top_to_bottom(path, tmp_path):
    check_notebook_run(path, tmp_path / "nb")


def check_notebook_run(path: Path, work: Path) -> float:
    """Run ``path`` in the scratch folder ``work`` (exports land there, not in the checkout) and
    check it finished in budget, without errors, with its main plot drawn; the seconds taken."""
    elapsed, nb = execute_notebook(path, work, BUDGET_S)
    assert elapsed <= BUDGET_S, f"{path.name} took {elapsed:.1f} s (budget {BUDGET_S:.0f} s)"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    main = next(c for c in nb.cells if "main-plot" in c.metadata.get("tags", []))
    assert any(PLOTLY in o.get("data", {}) for o in main.outputs), f"{path.name}: the main-plot cell drew no figure"
    return elapsed


def test_lab_command(capsys):
    assert cli_main(["lab", "--dry-run", "--no-browser", "--port", "8899"]) == 0
    cmd = capsys.readouterr().out
    assert "-m jupyterlab" in cmd and f"--ServerApp.root_dir={NOTEBOOKS}" in cmd
    assert "--port=8899" in cmd and "00_tour.ipynb" in cmd and "--no-browser" in cmd


def test_lab_command_errors(capsys, tmp_path: Path):
    assert cli_main(["lab", "--dry-run", "--dir", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["lab", "--dry-run", "--notebook", "nope.ipynb"]) == 2
    assert "00_tour.ipynb" in capsys.readouterr().err
