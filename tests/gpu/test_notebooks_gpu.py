"""Every notebook runs top to bottom on the GPU (the ``cuda`` backend is what they pick there),
each within the same 60 s budget as on the simulator; times are recorded."""

from __future__ import annotations

import pytest
from gpu_cases import record

pytest.importorskip("nbclient")
from test_notebooks import PATHS, check_notebook_run  # noqa: E402


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_notebook_runs_on_the_gpu(path, tmp_path):
    seconds = check_notebook_run(path, tmp_path / "nb")
    record(test="notebook", notebook=path.stem, seconds=seconds)
