"""The interleaved GPU stage's file (``workbench.exec.calibrate.decode_matrix``) and the two
reports that read it (``benchmarks/sim_fidelity.py``, ``benchmarks/eager_knobs.py``), on the CPU:
a file the simulator wrote must come back from both reports with no error."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import workbench
from workbench.exec.calibrate.decode_matrix import MatrixModel, _rounds, read_matrices, read_matrix
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


def test_pooled_runs_take_the_median_speedup(tmp_path) -> None:
    """Three runs of the same cells pool per model shape: eager's median us/token, a knob's
    us/token at the median of its per-run speedups, its spread the runs' speedups; one file reads
    as itself."""
    def cell(strategy: str, us: float) -> dict:
        return {"kind": "cell", "model": "llama-3.2-1b", "layers": None, "context": 512, "pos": 448,
                "strategy": strategy, "family": "llama", "tokens": 32, "us_per_token": us, "us_min": us,
                "us_max": us, "runs_us": [us]}

    paths = []
    for i, (eager, knob) in enumerate([(100.0, 80.0), (110.0, 100.0), (105.0, 87.5)]):  # +25, +10, +20 %
        paths.append(tmp_path / f"r{i}.jsonl")
        paths[-1].write_text("".join(json.dumps(x) + "\n" for x in (
            {"kind": "environment", "gpu_name": "g", "date": "d", "tokens": 32, "repeats": 1, "settle_run": True},
            cell("eager", eager), cell("eager+pdl", knob))))
    env, df = read_matrices(paths)
    assert env["pooled"] == ["r0.jsonl", "r1.jsonl", "r2.jsonl"]
    by = df.set_index("strategy")
    assert by.at["eager", "us_per_token"] == 105.0
    assert by.at["eager+pdl", "us_per_token"] == pytest.approx(105.0 / 1.2)
    assert by.at["eager+pdl", "us_min"] == pytest.approx(105.0 / 1.25)
    assert by.at["eager+pdl", "us_max"] == pytest.approx(105.0 / 1.1)
    one = read_matrices(paths[:1])[1]
    assert one.to_dict("records") == read_matrix(paths[0])[1].to_dict("records")


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
        want = {st.label() for name, st in sim_fidelity.STRATEGIES.items()
                if name not in sim_fidelity.ONLY or m.spec.model in sim_fidelity.ONLY[name]}
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
    assert fid["knobs"]["pass"].all()
    assert "the simulator meets it" in (tmp_path / "fid" / "sim_fidelity_h200.md").read_text()
    ek = eager_knobs.report(path, tmp_path / "ek")
    assert set(ek["knob"]) == set(eager_knobs.KNOBS) and ek["diff_pp"].abs().max() < 1e-9


def test_measure_loop_interleaves_and_survives_a_failing_model(tmp_path, monkeypatch) -> None:
    """The GPU loop's logic with the executor faked: warm-up, one untimed settle run of the first
    strategy, then rotated rounds, one row per
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
    timed = [label for label, n in calls if n == 8][:10]  # the first model's settle run, then its rounds
    assert timed == ["eager", "eager", "eager+pdl", "graphs", "eager+pdl", "graphs", "eager", "graphs", "eager",
                     "eager+pdl"]
    assert env["settle_run"] is True and rows["runs_us"].map(len).tolist() == [3] * 6  # nothing dropped
    assert sorted(released) == sorted([s.label() for s in sts] * 2)
    assert '"kind": "error"' in out.read_text() and "out of memory" in out.read_text()
    assert dm.measure_matrix(models, out, tokens=8, repeats=1, budget_s=-1.0, log=lambda s: None) == 0


def test_cold_run_left_out_of_files_without_the_settle_run(tmp_path) -> None:
    """Files measured before the settle run: each model's first timed run (round 0 of its first
    strategy) is left out of that cell's median and spread, every other cell and ``runs_us`` kept;
    a file with the settle run is read as written."""
    def cell(model: str, st: str, runs: list[float]) -> dict:
        return {"kind": "cell", "model": model, "layers": None, "context": 512, "pos": 448, "strategy": st,
                "family": "llama", "tokens": 32, "us_per_token": float(np.median(runs)), "us_min": min(runs),
                "us_max": max(runs), "runs_us": runs}

    cells = [cell("a", "eager", [130.0, 100.0, 104.0]), cell("a", "eager+pdl", [90.0, 95.0, 80.0]),
             cell("b", "eager", [50.0, 60.0, 40.0])]
    for settle in (False, True):
        env = {"kind": "environment", "gpu_name": "g", "date": "d", "tokens": 32, "repeats": 3,
               **({"settle_run": True} if settle else {})}
        path = tmp_path / f"m{settle}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in (env, *cells)))
        _, df = read_matrix(path)
        got = df[["us_per_token", "us_min", "us_max"]].values.tolist()
        if settle:
            assert got == [[104.0, 100.0, 130.0], [90.0, 80.0, 95.0], [50.0, 40.0, 60.0]]
        else:
            assert got == [[102.0, 100.0, 104.0], [90.0, 80.0, 95.0], [50.0, 40.0, 60.0]]
        assert df["runs_us"].map(len).tolist() == [3, 3, 3]


def test_judge_marks_passes_and_misses_inside_the_measured_spread(bench) -> None:
    import pandas as pd

    sim_fidelity = bench[2]
    df = pd.DataFrame({"error_pct": [3.0, -10.5]})
    kn = pd.DataFrame({"measured_pct": [10.0, 10.0, 10.0], "measured_lo": [9.0, 5.0, 9.0],
                       "measured_hi": [11.0, 15.0, 11.0], "predicted_pct": [11.5, 13.0, 13.0]})
    kn["diff_pp"] = kn["predicted_pct"] - kn["measured_pct"]
    verdict = sim_fidelity.judge(df, kn)
    assert list(df["pass"]) == [True, False] and list(kn["pass"]) == [True, False, False]
    assert list(kn["in_spread"]) == [False, True, False]
    assert "does NOT meet it: 1 of 2 cells and 1 of 3 knob effects pass (1 of the 2 knob misses" in verdict


def test_fidelity_predict_takes_the_older_json(bench) -> None:
    """Notebook 05 passes the parsed older JSON (``{"environment", ..., "rows"}``) to predict."""
    _, _, sim_fidelity = bench
    data = json.loads((ROOT / "data" / "bench" / "sim_fidelity_h200_measured.json").read_text())
    data["rows"] = [r for r in data["rows"] if r["model"] == "llama-3.2-1b" and r["strategy"] in ("eager", "graphs")]
    df = sim_fidelity.predict(data, load_calibration("h200"))
    assert list(df["strategy"]) == ["eager", "graphs"] and (df["predicted_us"] > 0).all()
    with pytest.raises(ValueError, match="rows"):
        sim_fidelity.predict({"environment": {}}, load_calibration("h200"))


def test_fit_weights_a_cell_by_its_rounds_spread(tmp_path) -> None:
    """fit_eager's cells carry the measured speedup's spread from the rounds' min-max; a cell whose
    rounds agree weighs more than one that CPU noise spread, one with no rounds weighs the floor's."""
    from workbench.exec.fit_eager import SPREAD_FLOOR_PP, matrix_cells

    env = {"kind": "environment", "gpu_name": "g", "date": "d", "tokens": 32, "repeats": 3, "settle_run": True}

    def cell(model: str, st: str, lo: float, hi: float) -> dict:
        return {"kind": "cell", "model": model, "layers": None, "context": 512, "pos": 448, "strategy": st,
                "family": "llama", "tokens": 32, "us_per_token": (lo + hi) / 2, "us_min": lo, "us_max": hi,
                "runs_us": [lo, hi]}

    lines = [env, cell("llama-3.2-1b", "eager", 99.0, 101.0), cell("llama-3.2-1b", "eager+pdl", 89.0, 91.0),
             cell("llama-3.1-8b", "eager", 80.0, 120.0), cell("llama-3.1-8b", "eager+pdl", 80.0, 100.0)]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    tight, wide = matrix_cells(path, "eager_pdl_release_ns")
    assert tight.spread_pp == pytest.approx(0.5 * (101 / 89 - 99 / 91) * 100)
    assert wide.spread_pp == pytest.approx(0.5 * (120 / 80 - 80 / 100) * 100)
    assert tight.weight > wide.weight
    assert replace(tight, spread_pp=0.0).weight == pytest.approx(SPREAD_FLOOR_PP ** -2)


def test_fidelity_kernel_check_matches_the_bound_kernel(bench, tmp_path) -> None:
    """The kernels-alone table pairs each node with the kernel_bench row of the kernel and grid the
    executor binds now (not the table's `default`, which predates later default changes)."""
    _, _, sim_fidelity = bench
    md = tmp_path / "kernels.md"
    head = "| model | node | op | shape | variant | kernel | grid | us |\n|---|---|---|---|---|---|---|---|\n"
    row = "| llama-3.2-1b | Qcur-0 | MUL_MAT | [2048, 2048] | {} | `{}` | ({}, 1) | {} |\n"
    md.write_text(head + row.format("default", "k_mul_mat_vec_f16", 512, 5.55)
                  + row.format("rows", "k_mul_mat_vec_rows_f16", 256, 5.72))
    kc = sim_fidelity.kernel_check(load_calibration("h200"), md,
                                   ((ModelSpec("llama-3.2-1b", 2, 512, 448), "llama", False),))
    assert kc[["node", "kernel", "measured_us"]].values.tolist() == [["Qcur-0", "k_mul_mat_vec_f16", 5.55]]
    assert kc["simulated_us"].iloc[0] > 0


def test_pdl_per_kernel_is_the_saving_over_the_kernel_count(bench) -> None:
    """The per-kernel view of a PDL knob: (from - to) us over the from-Plan's kernels, in ns."""
    import pandas as pd

    sim_fidelity = bench[2]
    df = pd.DataFrame({"label": ["m"] * 2, "held_out": [False] * 2, "strategy": ["graphs", "graphs+pdl"],
                       "us_per_token": [1000.0, 900.0], "predicted_us": [1000.0, 950.0],
                       "kernels_per_token": [200.0, 200.0]})
    t = sim_fidelity.per_kernel_table(df)
    assert list(t["knob"]) == ["pdl"]
    row = t.iloc[0]
    assert row["measured_ns_per_kernel"] == pytest.approx(500.0)
    assert row["predicted_ns_per_kernel"] == pytest.approx(250.0) and row["diff_ns"] == pytest.approx(-250.0)


def test_a_knob_effect_is_the_median_of_the_rounds_own_effects() -> None:
    """Round by round, each cell of one interleaved run is timed beside the other: a slow round
    moves both and cancels in its own effect, where the ratio of the cells' medians mixes rounds.
    An effect is the change in us/token (negative: faster), as the issues state effects. A
    model's cold first run is left out of the pairs; cells without rounds (llama.cpp's
    repetitions) give the ratio of their medians, spread from the cells' min-max."""
    from workbench.exec.calibrate.decode_matrix import effect_as_speedup, effect_pct, knob_effect

    eager = {"runs_us": [1000.0, 1400.0, 1010.0, 1390.0, 990.0], "us_per_token": 1010.0,
             "us_min": 990.0, "us_max": 1400.0}
    knob = {"runs_us": [900.0, 1260.0, 920.0, 1250.0, 880.0], "us_per_token": 920.0,
            "us_min": 880.0, "us_max": 1260.0}
    m, lo, hi = knob_effect(eager, knob)
    r = sorted(100 * (b / a - 1) for a, b in zip(eager["runs_us"], knob["runs_us"]))
    assert (m, lo, hi) == (pytest.approx(r[2]), pytest.approx(r[0]), pytest.approx(r[-1]))
    assert -11.2 < lo and hi < -8.8  # the ratio of medians' cross spread would read -37.1 .. +27.3 %
    warm = sorted(100 * (b / a - 1) for a, b in zip(eager["runs_us"][1:], knob["runs_us"][1:]))
    m0, lo0, hi0 = knob_effect({**eager, "cold_run": 0.0}, knob)  # round 0 left out
    assert (m0, lo0, hi0) == (pytest.approx(float(np.median(warm))), pytest.approx(warm[0]), pytest.approx(warm[-1]))
    no_rounds = [{k: v for k, v in cell.items() if k != "runs_us"} for cell in (eager, knob)]
    plain = knob_effect(*no_rounds)
    assert plain == (pytest.approx(100 * (920 / 1010 - 1)), pytest.approx(100 * (880 / 1400 - 1)),
                     pytest.approx(100 * (1260 / 990 - 1)))
    # graphs over eager at twice the speed: -50 % as an effect, +100 % as a speedup
    assert effect_pct(2000.0, 1000.0) == pytest.approx(-50.0)
    assert effect_as_speedup(-50.0) == pytest.approx(100.0)
    assert effect_as_speedup(effect_pct(1010.0, 920.0)) == pytest.approx(100 * (1010 / 920 - 1))
