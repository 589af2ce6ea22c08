"""The interleaved GPU stage's file (``workbench.exec.calibrate.decode_matrix``) and the two
reports that read it (``benchmarks/sim_fidelity.py``, ``benchmarks/eager_knobs.py``), on the CPU:
a file the simulator wrote must come back from both reports with no error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import workbench
from workbench.exec.calibrate.decode_matrix import MatrixModel, _rounds, read_matrix
from workbench.exec.calibrate.specs import ModelSpec
from workbench.exec.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    """The benchmark scripts, importable by name as they import each other."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import decode_matrix
        import eager_knobs
        import sim_fidelity

        yield decode_matrix, eager_knobs, sim_fidelity
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_read_matrix_reads_both_formats(tmp_path) -> None:
    """The interleaved stage's JSON lines and the older one-object JSON give the same table."""
    env = {"gpu_name": "g", "date": "d"}
    row = {"model": "llama-3.2-1b", "layers": None, "context": 512, "pos": 448, "strategy": "eager",
           "family": "llama", "tokens": 32, "us_per_token": 1.0, "us_min": 1.0, "us_max": 1.0, "runs_us": [1.0]}
    (tmp_path / "a.json").write_text(json.dumps({"environment": env, "tokens": 32, "repeats": 1, "rows": [row]}))
    (tmp_path / "b.jsonl").write_text(json.dumps({"kind": "environment", **env, "tokens": 32, "repeats": 1}) + "\n"
                                      + json.dumps({"kind": "cell", **row}) + "\n"
                                      + json.dumps({"kind": "error", "model": "x", "error": "boom"}) + "\n")
    (ea, a), (eb, b) = read_matrix(tmp_path / "a.json"), read_matrix(tmp_path / "b.jsonl")
    assert ea == eb and a.to_dict("records") == b.to_dict("records")


def test_rounds_rotate() -> None:
    """Each round starts one strategy later: every strategy runs first once in n rounds."""
    assert [r[0] for r in _rounds(3, 3)] == [0, 1, 2] and all(sorted(r) == [0, 1, 2] for r in _rounds(3, 5))


def test_stage_matrix_is_the_union_of_both_reports(bench) -> None:
    decode_matrix, eager_knobs, sim_fidelity = bench
    models = decode_matrix.matrix()
    assert [m.spec for m in models] == [spec for spec, _, _ in sim_fidelity.MODELS]
    for m in models:
        labels = [st.label() for st in m.strategies]
        assert len(labels) == len(set(labels))
        want = {label for label in sim_fidelity.STRATEGIES
                if label not in sim_fidelity.ONLY or m.spec.model in sim_fidelity.ONLY[label]}
        assert want | {"eager"} | {st.label() for st in eager_knobs.KNOBS.values()} == set(labels)
    # both held-out families stay in the matrix (the fidelity report's held-out policy)
    assert {fam for _, fam, held in sim_fidelity.MODELS if held} == {"qwen3", "gpt_oss"}


def test_reports_read_a_simulated_stage_file(bench, tmp_path) -> None:
    """A stage file written by the simulator: the fidelity report's cells err 0 % and the eager
    knob report's effects differ by 0 pp."""
    decode_matrix, eager_knobs, sim_fidelity = bench
    cal = load_calibration("h200")
    spec = ModelSpec("llama-3.2-1b", 2, 512, 0)
    m = MatrixModel(spec, next(x for x in decode_matrix.matrix() if x.spec.model == "llama-3.2-1b").strategies)
    lines = [{"kind": "environment", "gpu_name": "NVIDIA H200", "date": "2026-01-01", "tokens": 16, "repeats": 1}]
    for st in m.strategies:
        us = workbench.run(spec.config(), st, tokens=16, backend="sim", calibration=cal).stats["us_per_token"]
        lines.append({"kind": "cell", **spec.to_dict(), "label": spec.label, "family": "llama",
                      "strategy": st.label(), "tokens": 16, "us_per_token": us, "us_min": us, "us_max": us,
                      "runs_us": [us]})
    path = tmp_path / "stage.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    fid = sim_fidelity.report(path, None, "h200", tmp_path / "fid")
    assert len(fid["rows"]) == len(sim_fidelity.STRATEGIES) - 1  # copy-elim: qwen3-next only
    assert fid["rows"]["error_pct"].abs().max() < 1e-9 and fid["knobs"]["diff_pp"].abs().max() < 1e-9
    ek = eager_knobs.report(path, tmp_path / "ek")
    assert set(ek["knob"]) == set(eager_knobs.KNOBS) and ek["diff_pp"].abs().max() < 1e-9


def test_measure_loop_interleaves_and_survives_a_failing_model(tmp_path, monkeypatch) -> None:
    """The GPU loop's logic with the executor faked: warm-up then rotated rounds, one row per
    strategy with every run, every executor released, a failing model leaves an error line and
    the next model is still measured, a spent budget skips the rest."""
    from types import SimpleNamespace

    import workbench.api
    import workbench.exec.calibrate.decode_matrix as dm
    import workbench.exec.calibrate.environment as envmod
    import workbench.exec.cuda
    from workbench.strategy import Strategy

    calls, released = [], []

    class FakeExecutor:
        def __init__(self, cfg, st, where, seed, share=None):
            if cfg.name.startswith("qwen3-8b"):
                raise RuntimeError("out of memory")
            self.st = st

        def release(self):
            released.append(self.st.label())

    def fake_run(cfg, st, *, tokens, executor, **kw):
        calls.append((st.label(), tokens))
        return SimpleNamespace(stats={"us_per_token": 100.0 + len(calls)})

    monkeypatch.setattr(workbench.exec.cuda, "CudaExecutor", FakeExecutor)
    monkeypatch.setattr(workbench.api, "run", fake_run)
    monkeypatch.setattr(envmod, "environment", lambda: {"gpu_name": "fake", "date": "2026-01-01"})
    monkeypatch.setattr(envmod, "warm_gpu", lambda: 0.0)
    monkeypatch.setattr(dm, "_free_gpu", lambda: None)
    sts = (Strategy(), Strategy(pdl=True), Strategy(graphs=True))
    models = [dm.MatrixModel(ModelSpec("llama-3.2-1b", 2, 512, 0), sts),
              dm.MatrixModel(ModelSpec("qwen3-8b", 2, 512, 0), sts),
              dm.MatrixModel(ModelSpec("qwen3-30b-a3b", 2, 512, 0), sts)]
    out = tmp_path / "m.jsonl"
    assert dm.measure_matrix(models, out, tokens=8, repeats=3, log=lambda s: None) == 6
    env, rows = read_matrix(out)
    assert env["tokens"] == 8 and env["repeats"] == 3
    assert list(rows["model"].unique()) == ["llama-3.2-1b", "qwen3-30b-a3b"]
    assert all(len(r) == 3 for r in rows["runs_us"])
    timed = [label for label, n in calls if n == 8][:9]  # the first model's rounds
    assert timed == ["eager", "eager+pdl", "graphs", "eager+pdl", "graphs", "eager", "graphs", "eager", "eager+pdl"]
    assert sorted(released) == sorted([s.label() for s in sts] * 2)
    assert '"kind": "error"' in out.read_text() and "out of memory" in out.read_text()
    assert dm.measure_matrix(models, out, tokens=8, repeats=1, budget_s=-1.0, log=lambda s: None) == 0
