"""``workbench calibrate --target llamacpp``: the offline fit on the committed llama.cpp
timelines (``data/traces/llamacpp/``), the calibration it writes, and the simulator under it."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import workbench
from workbench.cli import main as cli
from workbench.exec.calibrate.llamacpp_fit import fit_folder, hold_out, read_measured
from workbench.exec.calibrate.llamacpp_schedule import llamacpp_strategy
from workbench.exec.calibrate.llamacpp_traces import TraceFolderError, matched_kernels, read_traces
from workbench.exec.calibration import (
    CALIBRATION_DIR,
    CalibrationError,
    default_gpu,
    load_calibration,
    parse_calibration,
)
from workbench.exec.cost import measured_fit
from workbench.models import preset
from workbench.strategy import FUSIONS, WORKBENCH_FUSIONS, Strategy
from workbench.strategy.steps import plan_for

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "traces" / "llamacpp"
FUSED = frozenset({"rms-norm-mul", "copy-elim"})


@pytest.fixture(scope="module")
def fitted() -> dict:
    return fit_folder(TRACES, json.loads((CALIBRATION_DIR / "h200.json").read_text()))


def test_offline_fit_on_the_committed_traces_loads_and_keys_llamacpp_kernels(fitted):
    cal = parse_calibration(fitted, "fit")
    assert cal.executor == "llamacpp" and cal.host_profile == "llama.cpp"
    # llama.cpp's fused kernels, fitted under their own ops (its fusion pass ran in the traces)
    for op in ("MUL_MAT", "MUL_MAT_GLU", "MUL_MAT_ADD", "RMS_NORM_MUL", "ROPE_SET_ROWS", "FLASH_ATTN_EXT"):
        assert op in cal.ops, op
    # the cuda executor's op/kernel fits are gone: their kernel names are the workbench's
    assert not [k for k in cal.ops if "/" in k and "k_mul_mat" in k]
    assert fitted["measured"]["traces"] and fitted["measured"]["kernels_fitted"] > 100
    # host numbers from the timelines say so
    src = fitted["sources"]
    assert "CUPTI" in src["host_profiles.llama.cpp.graph_launch_ns"]
    assert "llama.cpp" in src["device.dependency_gap_ns"]
    assert "without / with PDL" in src["device.pdl_prologue_ns"]  # llama.cpp's own, not the base's
    assert "simulator in the loop" in src["device.pdl_release_ns"]
    assert "simulator in the loop" in src["host_profiles.llama.cpp.token_overhead_ns"]
    assert "GGML_CUDA_GRAPH_OPT" in src["host_profiles.llama.cpp.graph_stream_ns"]


CAPTURES = TRACES / "h200_captures"
#: the H200 peer runs: llama-bench alone, 4-12 processes per cell in each of two leases of 2026-11-29
#: (sessions 33 and 34), gpt-oss-20b's 8 step configs at 8 and 24 layers again in a third (session 37),
#: 4 eager / graph configs of qwen3-next, llama-3.2-1b and qwen3-30b again in a fourth (session 38),
#: and the cells they lack (gpt-oss-20b's other configs at 24 layers, its 32k context) from v3
PEER = ROOT / "data" / "bench" / "llamacpp_peer_v7_h200.jsonl"
#: the 2026-11-25 runs alone (two leases)
PEER_V2 = ROOT / "data" / "bench" / "llamacpp_peer_v2_h200.jsonl"


def test_shipped_calibration_predicts_the_untraced_runs_in_sample():
    """In-sample check of the shipped file (fitted on the H200 captures and the untraced peer
    runs): llama-3.2-1b's captured configs within 5 % of llama.cpp's untraced us/token, or inside
    the range of its processes (the eager cell, host-bound, spans 1863-2178 us over llama-bench's
    processes and is predicted 5.5 % above their median)."""
    from workbench.exec.calibrate.llamacpp_fit import simulated_us

    cal = load_calibration("h200-llamacpp")
    measured = read_measured(PEER, 512)
    runs = [t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b" and t.context == 512]
    assert len(runs) == 10  # and two long-context captures, whose kernels only the kernel fits take
    for t in runs:
        key = ("llama-3.2-1b", 16, t.config_label)
        pred, row = simulated_us(t, cal)[0], measured.rows[key]
        assert pred == pytest.approx(measured[key], rel=0.05) or row["us_min"] <= pred <= row["us_max"], t.name


@pytest.fixture(scope="module")
def fitted_1b(tmp_path_factory) -> dict:
    """The fit on llama-3.2-1b's H200 captures and the one-lease peer runs (sync configs included)."""
    folder = tmp_path_factory.mktemp("caps")
    for p in CAPTURES.glob("llama-3.2-1b-L16_*.parquet"):
        shutil.copy(p, folder / p.name)
    return fit_folder(folder, json.loads((CALIBRATION_DIR / "h200.json").read_text()), PEER)


def test_fit_on_real_captures_and_untraced_runs(fitted_1b):
    """The real-data path on llama-3.2-1b's ten H200 captures and the untraced peer file: the
    graph launch is the base's untraced one, CUPTI's per-kernel cost comes from the fusion pair,
    the host residuals and GRAPH_OPT's fork cost from the untraced runs, and the fit predicts
    each captured config within 10 % of its untraced us/token."""
    from workbench.exec.calibrate.llamacpp_fit import simulated_us

    data = fitted_1b
    src, prof = data["sources"], data["host_profiles"]["llama.cpp"]
    base = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    untraced = base["host_profiles"]["python"]["graph_launch_ns"]
    if prof["token_overhead_ns"] > 0:  # the base's untraced launch, as long as host time is left over
        assert prof["graph_launch_ns"] == untraced
        assert "node-level graph tracing" in src["host_profiles.llama.cpp.graph_launch_ns"]
    else:  # predicted slow with no overhead: the launch is lowered, to a tenth of it at most
        assert 0.1 * untraced - 1 <= prof["graph_launch_ns"] < untraced  # (written rounded to 0.1 ns)
        assert "lowered" in src["host_profiles.llama.cpp.graph_launch_ns"]
    assert "without / with fusion" in data["measured"]["cupti_kernel_how"]
    assert "untraced us/token" in src["host_profiles.llama.cpp.token_overhead_ns"]
    assert "untraced us/token" in src["host_profiles.llama.cpp.graph_stream_ns"]
    cal = parse_calibration(data, "fit")
    measured = read_measured(PEER, 512)
    for t in (t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b" and t.context == 512):
        us = measured[("llama-3.2-1b", 16, t.config_label)]
        assert simulated_us(t, cal)[0] == pytest.approx(us, rel=0.10), t.name


def test_peer_rows_keep_their_decode_window():
    """The 32k gpt-oss row is its own cell (context and start from the record) and stays out of
    a 512-context fit's targets."""
    from workbench.exec.calibrate.llamacpp_fit import measured_table, model_key

    assert model_key("gpt-oss-20b (8 layers) @ 32736") == ("gpt-oss-20b", 8)
    assert model_key("qwen3-next-80b-a3b (8 layers)") == ("qwen3-next-80b-a3b", 8)
    assert model_key("llama-3.1-8b") == ("llama-3.1-8b", 32)
    t = measured_table(PEER)
    long = t[t["context"] == 32768]
    assert set(long["model"]) == {"gpt-oss-20b"} and set(long["start_pos"]) == {32736}
    # eager was measured at both windows: the 512-row fit target is the 512-row run's (about
    # 2200 us/token in llamacpp_peer_h200.md), not the 32k one's (about 2670)
    m512 = read_measured(PEER, 512)
    assert ("gpt-oss-20b", 8, "default") in m512 and m512[("gpt-oss-20b", 8, "eager")] < 2400


def test_knob_effects_say_whether_their_cells_share_a_lease():
    """llama-3.1-8b's pdl0 and default cells come from two machine leases of 2026-11-25 (session 5
    and an unnamed one): the PDL knob between them is flagged cross-lease, the graphs knob (both
    cells of session 5) is not, and a lease-free table (the cuda target's) gets no flag."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sim_fidelity import knob_table

    from workbench.exec.calibrate.llamacpp_fit import measured_table

    t = measured_table(PEER_V2)
    t = t[(t["model"] == "llama-3.1-8b") & (t["context"].isin([-1, 512]))]
    leases = t.set_index("config")["leases"]
    assert leases["pdl0"] == "2026-11-25/5" and leases["default"] == "2026-11-25/-"
    df = t.assign(label="8b", family="llama", held_out=False, strategy=t["config"], predicted_us=t["us_per_token"])
    steps = {"pdl": ("pdl0", "default"), "graphs": ("no_graphs_pdl0", "pdl0")}
    kn = knob_table(df, steps).set_index("knob")
    assert not kn.at["pdl", "same_lease"] and kn.at["graphs", "same_lease"]
    assert "same_lease" not in knob_table(df.drop(columns="leases"), steps).columns


def test_knob_effects_pair_llamacpp_processes_round_by_round(tmp_path):
    """Each record is one llama.cpp process: a knob's effect is the median of the per-round
    effects of its two cells' processes, not the ratio of pooled repetitions, and two calls'
    round 0 (``run``) stay apart."""
    from workbench.exec.calibrate.decode_matrix import knob_effect
    from workbench.exec.calibrate.llamacpp_fit import measured_table

    # process medians: a slow process (round 1 of the first call) moves both of its round's cells
    us = {("c1", 0): (1000, 900), ("c1", 1): (1100, 1001), ("c2", 0): (1010, 900), ("c2", 1): (990, 900)}
    path = tmp_path / "peer.jsonl"
    path.write_text("".join(json.dumps({"tool": "llama-bench", "model": "llama-3.2-1b", "config": cfg,
                                        "us": [v, v + 1, v - 1], "round": rnd, "pair": 0, "run": run,
                                        "date": "2026-11-29", "session": 33, "context": 512, "start_pos": 448,
                                        "tokens": 64}) + "\n"
                            for (run, rnd), pair in us.items() for cfg, v in zip(("pdl0", "default"), pair)))
    t = measured_table(path).set_index("config")
    assert len(t.at["pdl0", "runs"]) == 4 and t.at["pdl0", "runs"]["2026-11-29/33/c2/0/0"] == 1010
    m, lo, hi = knob_effect(t.loc["pdl0"], t.loc["default"])
    per_round = sorted(100 * (b / a - 1) for a, b in us.values())
    assert m == pytest.approx((per_round[1] + per_round[2]) / 2)
    assert (lo, hi) == (pytest.approx(per_round[0]), pytest.approx(per_round[-1]))
    # one process a cell: the ratio of the medians, as before
    one = {k: v for k, v in t.at["pdl0", "runs"].items() if "/c1/0/" in k}
    assert knob_effect(dict(t.loc["pdl0"], runs=one), t.loc["default"])[0] == pytest.approx(
        100 * (t.at["default", "us_per_token"] / t.at["pdl0", "us_per_token"] - 1))


def test_round_paired_effects_of_cells_pooled_over_two_leases_stay_within_a_lease(tmp_path):
    """Two leases (sessions 33 and 34) each time both cells in rounds: the cells pool both
    leases, yet every pair of the effect comes from one lease (a round's key names it), so the
    knob is flagged same-lease; cells of different leases with no round in common are not."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sim_fidelity import knob_table

    from workbench.exec.calibrate.decode_matrix import round_pairs
    from workbench.exec.calibrate.llamacpp_fit import measured_table

    recs = [{"tool": "llama-bench", "model": "llama-3.2-1b", "config": cfg, "us": [v], "round": rnd, "pair": 0,
             "run": "r", "date": "2026-11-29", "session": sess, "context": 512, "start_pos": 448, "tokens": 64}
            for sess, scale in ((33, 1.0), (34, 0.8)) for rnd in (0, 1)
            for cfg, v in (("pdl0", 1000 * scale), ("default", 950 * scale))]
    recs.append(dict(recs[0], config="eager", session=35, us=[2000]))
    path = tmp_path / "peer.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    t = measured_table(path)
    t = t.assign(label="1b", family="llama", held_out=False, strategy=t["config"], predicted_us=t["us_per_token"])
    by = t.set_index("config")
    pairs = round_pairs(by.loc["pdl0"], by.loc["default"])
    assert len(pairs) == 4 and all(b / a == pytest.approx(0.95) for a, b in pairs)  # no pair spans the leases
    kn = knob_table(t, {"pdl": ("pdl0", "default"), "eager": ("eager", "pdl0")}).set_index("knob")
    assert kn.at["pdl", "same_lease"] and kn.at["pdl", "measured_pct"] == pytest.approx(-5.0)
    assert not kn.at["eager", "same_lease"]


def test_kernel_counts_compare_a_capture_with_the_schedule():
    from workbench.exec.calibrate.llamacpp_traces import kernel_counts

    t = next(t for t in read_traces(CAPTURES) if t.name == "llama-3.2-1b-L16_default")
    c = kernel_counts(t).set_index("family")
    assert (c.loc["mul_mat", ["captured", "simulated"]] == 97).all()  # llama.cpp's mat-vecs, fused as planned
    # llama.cpp's inp_out_ids row selection: a GET_ROWS (and an unfused ADD) the schedule adds
    assert (c.loc["get_rows", ["captured", "simulated"]] == 2).all()
    assert (c.loc["elementwise", ["captured", "simulated"]] == 1).all()
    # each of the 16 attentions: flash_attn_ext_vec, then flash_attn_combine_results
    assert (c.loc["attn", ["captured", "simulated"]] == 32).all()


def test_llamacpp_runs_each_decode_attention_as_two_kernels():
    """llama.cpp splits a head's keys over blocks and merges their partials in a second kernel
    (``launch_fattn``): the schedule has the merge after each attention, on its stream, reading
    what the attention wrote and writing what the layer reads; one tile of keys, no split."""
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.exec.cost import kernel_name

    for model in ("llama-3.2-1b", "gpt-oss-20b", "qwen3-next-80b-a3b"):
        cfg = preset(model, layers=4, context=512)
        for strategy in (Strategy(), Strategy(graphs=True, pdl=True, streams="qkv", fusion=FUSIONS)):
            las = llamacpp_plan(cfg, strategy, 512).launches
            attn = [i for i, la in enumerate(las) if la.node.op == "FLASH_ATTN_EXT"]
            mains = [i for i in attn if "pass" not in las[i].node.params]
            assert len(attn) == 2 * len(mains) > 0, model
            for i in mains:
                main, merge = las[i].node, las[i + 1].node
                assert [kernel_name(main), kernel_name(merge)] == ["flash_attn_ext_vec", "flash_attn_combine_results"]
                assert las[i + 1].stream == las[i].stream and merge.srcs == (main.dst,)
                assert merge.name == f"{main.name}_combine"
                layer = range(i + 2, next((j for j in mains if j > i), len(las)))  # (the arena reuses buffers)
                assert any(merge.dst in las[j].node.srcs for j in layer)
                assert not any(main.dst in las[j].node.srcs for j in layer)
    short = llamacpp_plan(preset("llama-3.2-1b", layers=2, context=512), Strategy(), 64).launches
    assert [la.node.name for la in short if la.node.op == "FLASH_ATTN_EXT"] == ["kqv_out-0", "kqv_out-1"]


#: (model, config, family) whose kernels per token the llama.cpp schedule does not reproduce: none
KNOWN_COUNT_GAPS: set[tuple[str, str, str]] = set()


def test_llamacpp_schedule_runs_the_captured_kernels_per_token():
    """Per committed H200 capture and kernel family, the Plan the simulator runs under a llama.cpp
    calibration has as many kernels per token as llama.cpp ran, but for ``KNOWN_COUNT_GAPS``."""
    from workbench.exec.calibrate.llamacpp_traces import kernel_counts

    gaps = set()
    for t in read_traces(CAPTURES):
        for r in kernel_counts(t).itertuples():
            if r.captured != r.simulated:
                gaps.add((t.model, t.config_label, r.family))
    assert gaps == KNOWN_COUNT_GAPS


def test_llamacpp_schedule_leaves_the_workbench_graph_alone():
    """The llama.cpp schedule's extra and unfused kernels exist in its Plan only."""
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.models import build_graph

    cfg = preset("qwen3-30b-a3b", layers=2, context=512)
    graph_before = [n.name for n in build_graph(cfg, 512).nodes]
    fused = Strategy(graphs=True, fusion=FUSIONS)
    ours = [la.node for la in plan_for(cfg, fused, 512).launches]
    theirs = [la.node for la in llamacpp_plan(cfg, fused, 512).launches]
    assert "MUL_MAT_ID_GLU" in {n.op for n in ours} and "MUL_MAT_ID_GLU" not in {n.op for n in theirs}
    assert "attn_out-1_out_ids" in {n.name for n in theirs} and "attn_out-1_out_ids" not in {n.name for n in ours}
    assert "kqv_out-1_combine" in {n.name for n in theirs} and "kqv_out-1_combine" not in {n.name for n in ours}
    # Q/K norm + rope (+ the K cache row) one kernel each, as llama.cpp's rms_norm+mul+rope fusion
    assert not {n.op for n in theirs} & {"ROPE", "ROPE_SET_ROWS"}
    # without fusion the 8 experts are summed by 7 ADDs per layer, as build_moe_ffn adds them
    unfused = llamacpp_plan(cfg, Strategy(graphs=True), 512).launches
    assert sum(la.node.name.startswith("ffn_moe_out-0") and la.node.op == "ADD" for la in unfused) == 7
    assert [n.name for n in build_graph(cfg, 512).nodes] == graph_before


def test_llamacpp_gdn_schedule_runs_llamacpps_state_kernels():
    """Qwen3-Next's GDN layers in llama.cpp's schedule only: per layer two state GET_ROWS, the
    conv state's CONCAT and CPY, two Q/K REPEATs and the beta CONT (copy-family stand-ins named by
    their ggml op), one merged wqkv mat-vec; without fusion the L2 norms as RMS_NORM + SCALE. The
    copies are the same with and without fusion and without the GDN cache fusion alone, as
    llama.cpp's one-token captures run them (``gdn_copy_elided``)."""
    from collections import Counter

    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.models import build_graph

    cfg = preset("qwen3-next-80b-a3b", layers=1, context=512)
    graph_before = [n.name for n in build_graph(cfg, 512).nodes]
    for s in (Strategy(graphs=True, fusion=FUSED), Strategy(graphs=True),
              Strategy(graphs=True, fusion=FUSED - {"copy-elim"})):
        nodes = [la.node for la in llamacpp_plan(cfg, s, 512).launches]
        copies = Counter(n.params.get("ggml_op", n.op) for n in nodes if n.family == "copy")
        assert copies["CONCAT"] == 1 and copies["REPEAT"] == 2 and copies["CONT"] == 1
        assert copies["CPY"] == 1
        assert sum(n.op == "GET_ROWS" and n.name.endswith("states-0") for n in nodes) == 2
        assert "linear_attn_qkv_mixed-0" in {n.name for n in nodes} and "linear_attn_v-0" not in {n.name for n in nodes}
        norms = Counter(n.op for n in nodes if n.name.startswith(("q_conv_normed", "k_conv_normed")))
        assert norms == (Counter(L2_NORM=2) if s.fusion else Counter(RMS_NORM=2, SCALE=2))
    assert [n.name for n in build_graph(cfg, 512).nodes] == graph_before
    assert "linear_attn_v-0" in graph_before


def test_kernels_match_plan_nodes_of_llamacpps_schedule():
    t = next(t for t in read_traces(TRACES) if t.name.endswith("_graphs"))
    m, unmatched = matched_kernels(t, load_calibration("h200"))
    # every token's mat-vecs matched (Q, K, V, O+residual, gate+up+GLU, down+residual per layer + lm_head)
    per_token = m[m["family"] == "mul_mat"].groupby("token").size()
    assert (per_token == 6 * 2 + 1).all()
    assert set(m["op"]) >= {"MUL_MAT_GLU", "MUL_MAT_ADD", "ROPE_SET_ROWS"}
    assert (m["exposed_ns"] > 0).all()
    assert set(unmatched["family"]) <= {"get_rows", "elementwise"}  # llama.cpp's out_ids rows, its last ADD


def test_llamacpp_strategy_applies_its_whole_fusion_set():
    llamacpps = frozenset(FUSIONS) - frozenset(WORKBENCH_FUSIONS)  # not the workbench's own
    assert llamacpp_strategy(Strategy(graphs=True, fusion=FUSED)).fusion == llamacpps
    no_gdn_copy_elim = Strategy(graphs=True, fusion={"rms-norm-mul"})
    assert llamacpp_strategy(no_gdn_copy_elim).fusion == llamacpps - {"copy-elim"}
    assert llamacpp_strategy(Strategy(graphs=True)).fusion == frozenset()


def test_command_writes_a_calibration_the_simulator_runs(tmp_path, capsys):
    out = tmp_path / "h200-llamacpp.json"
    assert cli(["calibrate", "--target", "llamacpp", "--from-traces", str(TRACES), "--out", str(out)]) == 0
    cal = load_calibration(path=out)
    assert cal.executor == "llamacpp"
    assert "MUL_MAT_GLU" in capsys.readouterr().err
    run = workbench.run("llama-3.2-1b", Strategy(graphs=True, pdl=True, fusion=FUSED), tokens=3, backend="sim",
                        layers=2, context=512, start_pos=448, calibration=cal, quiet=True)
    assert run.stats["us_per_token"] > 0
    ops = {la.node.op for la in run.meta["plans"][-1].launches}
    assert {"MUL_MAT_GLU", "MUL_MAT_ADD"} <= ops  # llama.cpp's kernel list, not the Strategy's fusions alone


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_shipped_llamacpp_calibration_simulates_by_name(gpu):
    """Each shipped llama.cpp calibration (the H100's fitted from its own captures,
    data/traces/llamacpp/h100_captures) runs by name and prices llama.cpp's fused kernels."""
    run = workbench.run("llama-3.2-1b", Strategy(graphs=True, fusion=FUSED), tokens=2, backend="sim", layers=2,
                        gpu=f"{gpu}-llamacpp", quiet=True)
    assert run.stats["us_per_token"] > 0
    cal = run.meta["calibration"]
    assert "llamacpp" in run.device and cal.executor == "llamacpp"
    node = next(la.node for la in run.meta["plans"][-1].launches if la.node.op == "MUL_MAT_GLU")
    assert measured_fit(node, cal)[0] == "op"
    assert default_gpu(None)[0] != f"{gpu}-llamacpp"  # the default stays the workbench's own executor


def test_cli_run_takes_calibration_name(capsys):
    assert cli(["run", "--model", "llama-3.2-1b", "--layers", "2", "--tokens", "2", "--backend", "sim",
                "--calibration", "h200-llamacpp", "--graphs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["us_per_token"] > 0


def test_hold_out_leaves_a_model_out_of_the_fit():
    traces = read_traces(TRACES)
    assert hold_out(traces, ["qwen3-8b"]) == traces
    assert hold_out(traces, ["llama-3.2-1b"]) == []
    with pytest.raises(TraceFolderError, match="held out"):
        fit_folder(TRACES, json.loads((CALIBRATION_DIR / "h200.json").read_text()), held_out=["llama-3.2-1b"])


def test_bad_inputs_are_clear(tmp_path, capsys):
    assert cli(["calibrate", "--target", "llamacpp", "--from-traces", str(tmp_path)]) == 2
    assert "holds no trace" in capsys.readouterr().err
    assert cli(["calibrate", "--target", "llamacpp", "--from-traces", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli(["calibrate", "--from-traces", str(TRACES)]) == 2
    assert "--target llamacpp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["calibrate", "--target", "tensorrt"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(CalibrationError, match="no calibration for GPU 'h300'"):
        load_calibration("h300")


def test_read_measured_prefers_the_backend_over_llama_bench(tmp_path):
    p = tmp_path / "peer.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (
        {"tool": "llama-bench", "model": "llama-3.2-1b", "config": "default", "us": [700.0]},
        {"tool": "llamacpp", "model": "llama-3.2-1b", "config": "default", "us": [710.0, 712.0]},
        {"tool": "llamacpp", "model": "llama-3.2-1b", "config": "default", "us": [714.0]},
        {"tool": "cuda", "model": "llama-3.2-1b", "config": "default", "us": [900.0]},
        {"tool": "llamacpp", "model": "llama-3.2-1b", "config": "pdl0", "error": "boom"},
        {"tool": "llama-bench", "model": "qwen3-30b-a3b (8 layers)", "config": "pdl0", "us": [5000.0]})) + "\n")
    assert read_measured(p) == {("llama-3.2-1b", 16, "default"): 712.0, ("qwen3-30b-a3b", 8, "pdl0"): 5000.0}


def test_a_model_shape_takes_the_tool_that_timed_it_in_more_processes(tmp_path):
    """gpt-oss-20b at 24 layers: two backend processes a cell against llama-bench's 2 + 4 from a
    later lease; the shape's cells all come from llama-bench, a cell only the backend timed keeps
    the backend's, and a tie keeps the backend (the H100 file's one process of each)."""
    from workbench.exec.calibrate.llamacpp_fit import measured_table

    def rec(tool, model, config, us, rnd, session=5):
        return {"tool": tool, "model": model, "config": config, "us": [us], "round": rnd, "session": session,
                "date": "2026-11-29"}

    big = "gpt-oss-20b (24 layers)"
    rows = [rec("llamacpp", big, c, 4000.0 + i, r) for r in (0, 1) for i, c in enumerate(("default", "sync_implicit"))]
    rows += [rec("llama-bench", big, "default", 3900.0, r, s) for s, rs in ((5, (0, 1)), (37, range(4))) for r in rs]
    rows += [rec(tool, "llama-3.2-1b", "default", us, 0) for tool, us in (("llamacpp", 700.0), ("llama-bench", 690.0))]
    p = tmp_path / "peer.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    t = measured_table(p).set_index(["model", "config"])
    assert t.loc[("gpt-oss-20b", "default"), "tool"] == "llama-bench"
    assert t.loc[("gpt-oss-20b", "default"), "us_per_token"] == 3900.0
    assert t.loc[("gpt-oss-20b", "sync_implicit"), "tool"] == "llamacpp"  # llama-bench never timed it
    assert t.loc[("llama-3.2-1b", "default"), "tool"] == "llamacpp"  # a tie keeps the backend


def test_plan_of_a_trace_matches_the_recorded_meta():
    t = read_traces(TRACES)[0]
    cfg = preset(t.model, layers=t.layers, context=t.context)
    assert plan_for(cfg, llamacpp_strategy(t.strategy), cfg.kv_len(t.start_pos)).launches


def test_fidelity_report_against_llamacpp_runs_on_the_committed_traces(tmp_path):
    """The report's mechanics on a made-up measured file (its numbers are test inputs, not data)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sim_fidelity import report_llamacpp

    p = tmp_path / "peer.jsonl"
    p.write_text("\n".join(json.dumps({"tool": "llamacpp", "model": "llama-3.2-1b (2 layers)", "config": c, "us": us})
                           for c, us in (("pdl0", [600.0, 610.0]), ("default", [590.0]), ("graph_opt", [620.0]),
                                         ("no_graphs_pdl0", [900.0]), ("bogus", [1.0]))) + "\n")
    res = report_llamacpp(p, TRACES, None, set(), tmp_path, tokens=3, start_pos=448, context=512)
    df, kn = res["rows"], res["knobs"]
    assert sorted(df["strategy"]) == ["default", "graph_opt", "no_graphs_pdl0", "pdl0"]  # unknown configs dropped
    assert set(kn["knob"]) >= {"PDL under graphs", "CUDA graphs (PDL off)"}
    md = (tmp_path / "sim_fidelity_llamacpp_h200.md").read_text()
    assert "**Acceptance**" in md and f"of {len(df)} cells" in md
    assert res["calibration"].executor == "llamacpp"


def test_fit_recovers_the_simulators_own_kernel_costs(tmp_path):
    """Round trip on MoE and GDN shapes: the simulator's timelines under the llama.cpp calibration,
    dressed as llamacpp traces (op and family per kernel), fit back to kernel costs that predict
    every kernel (the matching and the fit are right where the truth is known)."""
    import dataclasses

    from workbench.trace import Trace
    from workbench.trace.io import save_trace

    for model in ("qwen3-30b-a3b", "qwen3-next-80b-a3b"):
        for config, s in (("pdl0", Strategy(graphs=True, fusion=FUSED)), ("no_graphs_pdl0", Strategy(fusion=FUSED))):
            r = workbench.run(model, s, tokens=3, backend="sim", layers=2, context=512, start_pos=448,
                              gpu="h200-llamacpp", quiet=True)
            nodes = {la.node.name: la.node for p in r.meta["plans"] for la in p.launches}
            ev = r.trace.events.copy()
            ev["family"] = [nodes[n].family if n in nodes else "" for n in ev["node"]]
            ev["op"] = [nodes[n].op if n in nodes else "" for n in ev["node"]]
            knobs = {f.name: sorted(v) if isinstance(v, frozenset) else v
                     for f in dataclasses.fields(s) for v in [getattr(s, f.name)]}
            meta = dict(r.trace.meta, backend="llamacpp", model=model, layers=2, context=512, start_pos=448,
                        strategy_knobs=knobs, config=config, gpu_name="NVIDIA H200")
            save_trace(Trace(ev, meta), tmp_path / f"{model}-L2_{config}.parquet")
    cal = fit_folder(tmp_path, json.loads((CALIBRATION_DIR / "h200.json").read_text()))
    fits = cal["measured"]["op_fits"]
    # llama.cpp runs the MoE gate and up apart (no MUL_MAT_ID_GLU in its schedule)
    assert {"MUL_MAT_ID", "GLU", "TOPK_MOE", "GATED_DELTA_NET", "SSM_CONV"} <= {f["op"] for f in fits}
    # within 2 %: where the roofline spreads by under a tenth of the durations, fit_kernels keeps
    # scale 1 (RMS_NORM_MUL's four sizes here, the GDN gated norm's among them: 1.5 %)
    assert max(f["median_rel_err"] for f in fits) < 0.02
    assert not cal["measured"]["unmatched"]


def test_untraced_measurements_lower_what_tracing_inflates():
    """Given untraced us/token below what the traced host calls allow (values made up for the
    test), the token overhead goes to 0 and the traced graph launch comes down."""
    from workbench.exec.calibrate.llamacpp_fit import fit

    traces = read_traces(TRACES)
    measured = {("llama-3.2-1b", 2, t.config_label): 300.0 for t in traces}
    cal = fit(traces, json.loads((CALIBRATION_DIR / "h200.json").read_text()), measured)
    prof, src = cal["host_profiles"]["llama.cpp"], cal["sources"]
    assert prof["token_overhead_ns"] == 0
    assert "lowered" in src["host_profiles.llama.cpp.graph_launch_ns"]
    assert cal["measured"]["cupti_kernel_ns"] == 0  # one kernel count: no slope to fit
    parse_calibration(cal, "fit")


def test_capture_script_names_and_bundles(tmp_path):
    """benchmarks/llamacpp_capture.py on CPU: its file names are what the fit reads back, the
    peer benchmark's configs are reused, and the bundle is one tar."""
    import sys
    import tarfile

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import llamacpp_capture as cap
    from llamacpp_peer import CONFIGS

    caps = cap.captures(["llama-3.2-1b", "qwen3-30b-a3b:8"], ["default", "graph_opt"], 6)
    assert [c.stem for c in caps] == ["llama-3.2-1b-L16_default", "llama-3.2-1b-L16_graph_opt",
                                      "qwen3-30b-a3b-L8_default", "qwen3-30b-a3b-L8_graph_opt"]
    assert caps[1].strategy == CONFIGS["graph_opt"][0] and caps[0].start_pos == 448 and caps[0].context == 512
    assert set(cap.PLAIN_CONFIGS) <= set(CONFIGS) and "sync_boundary" not in cap.PLAIN_CONFIGS
    d = tmp_path / "llamacpp_h200"
    shutil.copytree(TRACES, d)
    tar = cap.bundle(d, tmp_path / "out" / "b.tar")
    with tarfile.open(tar) as tf:
        assert "llamacpp_h200/llama-3.2-1b-L2_graphs.json.gz" in tf.getnames()


def test_ops_only_pdl_traces_show_are_fitted_from_them():
    """Where llama.cpp's unfused ops run only in its no_fusion capture, which keeps PDL on, they
    are fitted from it (not left to the workbench executor's base fit), each kernel's time on its
    stream plus the prologue a PDL kernel runs before its predecessor ends. (The captures of
    2026-11-29 add unfused runs without PDL, ``graphs`` and ``eager``: left out here.)"""
    from workbench.exec.calibrate.llamacpp_fit import kernel_fits

    every = [t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b"]
    traces = [t for t in every if t.config_label not in ("graphs", "eager")]
    assert kernel_fits(every, load_calibration("h200"), 0.0, 0.0)[2]["trace"].isin(
        {t.name for t in every if not t.strategy.pdl}).all()  # with them, every op has a no-PDL capture
    base = load_calibration("h200")
    ops, _, used, *_ = kernel_fits(traces, base, 0.0, 0.0)
    no_pdl = {t.name for t in traces if not t.strategy.pdl}
    late = used[~used["trace"].isin(no_pdl)]
    assert len(late) and set(late["op"]).isdisjoint(used.loc[used["trace"].isin(no_pdl), "op"])
    assert set(late["op"]) <= set(ops)
    early = base.pdl_prologue_ns + base.pdl_first_read_setup_ns - base.pdl_release_ns
    assert (late["duration_ns"] == (late["exposed_ns"] + early).clip(lower=1.0)).all()
    # given what the capture pairs show PDL saving, that is what is added back instead
    *_, used2, _, _, _ = kernel_fits(traces, base, 0.0, 0.0, (417.0, "test"))
    late2 = used2[~used2["trace"].isin(no_pdl)]
    assert (late2["duration_ns"] == (late2["exposed_ns"] + 417.0).clip(lower=1.0)).all()


def med_all(savings) -> float:
    return float(np.median([v for _, v in savings]))


def test_llamacpp_pdl_prologue_comes_from_its_own_capture_pairs(fitted_1b):
    """What PDL saves llama.cpp's kernels is read off its pdl0 / default captures (plain
    launches excluded), and the device prologue the fit writes follows from it, not from the
    base calibration's (the cuda executor's kernels overlap more of their predecessor)."""
    from workbench.exec.calibrate.kernel_fit import pdl_saving_ns, prologue_ceilings
    from workbench.exec.calibrate.llamacpp_fit import _set_prologues, capture_savings
    from workbench.exec.calibrate.llamacpp_schedule import launched_plainly

    traces = [t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b"]
    base = load_calibration("h200")
    savings = capture_savings(traces, base)
    assert len(savings) > 50
    cfg = traces[0].config()
    assert not any(launched_plainly(n, cfg) for n, _ in savings)  # rope_norm takes no PDL: not a boundary
    med = sorted(v for _, v in savings)[len(savings) // 2]
    assert 100 < med < 1000  # a few hundred ns a kernel, as measured
    assert "without / with PDL" in fitted_1b["sources"]["device.pdl_prologue_ns"]
    for start in (0.0, 250.0):  # whatever prologue the base had, the captures set it
        cal = copy.deepcopy(fitted_1b)
        cal["device"]["pdl_prologue_ns"] = start
        _set_prologues(cal, savings)
        c = parse_calibration(cal, "fit")
        want = min(max(0.0, med_all(savings) - pdl_saving_ns(c, 0.0)), min(prologue_ceilings(c).values()))
        assert c.pdl_prologue_ns == pytest.approx(want, abs=0.1) and want > 0
    assert all("pdl_prologue_ns" not in fc for fc in fitted_1b["ops"].values())  # no cuda kernel's prologue left


def test_llamacpp_host_program_copies_its_split_inputs():
    """The schedule's host program copies what llama.cpp's captures show per token (6 copies on
    llama, 7 on qwen3-next, 9 on gpt-oss; the embedding row is n_embd f32), each upstream as a sync
    and a blocking copy, under the sync patch as its boundary / implicit patterns."""
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.strategy.host import pattern

    for model, n in (("llama-3.2-1b", 6), ("qwen3-next-80b-a3b", 7), ("gpt-oss-20b", 9)):
        cfg = preset(model, layers=1, context=512)
        copies = {s: [h for h in llamacpp_plan(cfg, Strategy(graphs=True, sync=s), 512).host_program
                      if h.kind == "memcpy_h2d"] for s in ("per-copy", "boundary", "implicit")}
        assert all(len(c) == n for c in copies.values()), model
        assert copies["per-copy"][0].tensor == "inp_embd" and copies["per-copy"][0].nbytes == 4 * cfg.get("hidden_size")
        assert all(h.blocking for h in copies["per-copy"]) and not any(h.blocking for h in copies["implicit"])
    gpt = preset("gpt-oss-20b", layers=1, context=512)
    names = [h.tensor for h in llamacpp_plan(gpt, Strategy(graphs=True), 512).host_program if h.kind == "memcpy_h2d"]
    assert {"k_idxs_swa", "v_idxs_swa", "kq_mask_swa", "inp_out_ids"} <= set(names)
    llama = preset("llama-3.2-1b", layers=1, context=512)
    prog = llamacpp_plan(llama, Strategy(graphs=True, sync="boundary"), 512).host_program
    assert pattern(prog) == "s a a a a a a s g d s"
    # the workbench's own executor still copies its graph's inputs
    assert len([h for h in plan_for(llama, Strategy(graphs=True), 512).host_program if h.kind == "memcpy_h2d"]) == 4


def test_blocking_copies_are_read_off_the_upstream_captures():
    """ggml's set_tensor in the upstream captures: a cudaMemcpyAsync and the sync of its copy stream
    right after, 6 a token on llama-3.2-1b; none in the sync patch's captures."""
    from workbench.exec.calibrate.llamacpp_fit import blocking_copy_spans

    runs = {t.config_label: t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b"}
    spans = blocking_copy_spans([runs["default"]])
    tokens = len(runs["default"].trace.tokens())
    assert len(spans) == 6 * tokens
    assert 3_000 < sorted(spans)[len(spans) // 2] < 20_000
    assert blocking_copy_spans([runs["sync_implicit"]]) == []


def test_memcpy_blocking_is_fitted_on_the_measured_sync_knob(fitted_1b):
    """Fitted on the untraced sync knob pairs, never above the traced copy (CUPTI only adds)."""
    from workbench.exec.calibrate.llamacpp_fit import blocking_copy_spans

    src = fitted_1b["sources"]["host_profiles.llama.cpp.memcpy_blocking_ns"]
    assert "simulator in the loop" in src and "sync-reduction patch" in src and "up to the traced cost" in src
    spans = sorted(blocking_copy_spans([t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b"]))
    assert fitted_1b["host_profiles"]["llama.cpp"]["memcpy_blocking_ns"] <= spans[len(spans) // 2]



def test_kernels_llamacpp_launches_plainly_take_no_pdl():
    """Under PDL the llama.cpp schedule launches without the attribute what llama.cpp launches with
    <<<...>>>: llama's rope_norm (not qwen3's rope_neox), the f16 MoE expert mat-vec (not a quantized
    one), soft_max, gpt-oss's swiglu_oai and add_id; the rest stay PDL launches."""
    from workbench.exec.calibrate.llamacpp_schedule import launched_plainly, llamacpp_plan

    pdl = Strategy(graphs=True, pdl=True)
    for model, plain, kept in (("llama-3.2-1b", {"ROPE"}, {"MUL_MAT", "RMS_NORM", "SET_ROWS"}),
                               ("qwen3-30b-a3b", {"MUL_MAT_ID", "SOFT_MAX", "ARGSORT_TOP_K"}, {"ROPE", "MUL_MAT"}),
                               ("gpt-oss-20b", {"MUL_MAT_ID", "ADD_ID", "GLU"}, {"ROPE", "MUL_MAT"})):
        cfg = preset(model, layers=1, context=512)
        launches = llamacpp_plan(cfg, pdl, 512).launches
        by_op: dict[str, set[bool]] = {}
        for la in launches[1:]:
            by_op.setdefault(la.node.op, set()).add(la.pdl)
        assert all(by_op[op] == {False} for op in plain), (model, by_op)
        assert all(True in by_op[op] for op in kept), (model, by_op)
        assert not any(la.pdl for la in llamacpp_plan(cfg, Strategy(graphs=True), 512).launches)
    moe = next(la.node for la in llamacpp_plan(preset("qwen3-30b-a3b", layers=1), pdl, 512).launches
               if la.node.op == "MUL_MAT_ID")
    assert launched_plainly(moe, preset("qwen3-30b-a3b", layers=1))


def test_llamacpp_fit_takes_the_base_without_the_executors_first_read_setup():
    """llama.cpp's kernels wait before any work, so its fit starts from the cuda base less the
    work our kernels do before a first-read wait: setup 0, and both PDL releases (which absorbed
    that overlap in the base's refit) less it; a base without the term passes unchanged."""
    from workbench.exec.calibrate.llamacpp_fit import without_first_read_setup

    base = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    dev = base["device"]
    assert dev["pdl_first_read_setup_ns"] > 0
    out = without_first_read_setup(base)
    assert out["device"]["pdl_first_read_setup_ns"] == 0.0
    for fld in ("pdl_release_ns", "eager_pdl_release_ns"):
        assert out["device"][fld] == max(0.0, dev[fld] - dev["pdl_first_read_setup_ns"])
    parse_calibration(out, "llama.cpp base")  # every field still sourced
    assert base["device"]["pdl_first_read_setup_ns"] == dev["pdl_first_read_setup_ns"]  # the base is not edited
    plain = copy.deepcopy(out)
    assert without_first_read_setup(plain) == plain


def test_long_context_captures_feed_the_kernel_fits_only(fitted_1b):
    """llama-3.2-1b's captures at 8k and 32k rows sit beside its 512-row ones: the fit's cells and
    host numbers come from the 512-row context (main_context), its kernel fits take every capture,
    so its attention fit prices the 32k-row kernel (32 key tiles a block, not 1) within 10 %."""
    import sys

    from workbench.exec.calibrate.llamacpp_fit import main_context
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan
    from workbench.exec.cost import kernel_cost

    traces = [t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b"]
    assert main_context(traces) == 512 and {t.context for t in traces} == {512, 8192, 32768}
    long = {"llama-3.2-1b-L16_graphs_ctx8192", "llama-3.2-1b-L16_graphs_ctx32768"}
    assert long <= set(fitted_1b["measured"]["traces"])
    cal = parse_calibration(fitted_1b, "fit")
    t = next(t for t in traces if t.context == 32768)
    m = matched_kernels(t, cal)[0]
    attn = m[m["kernel"] == "flash_attn_ext_vec"]  # the attention, not its merge pass
    cfg = t.config()
    node = next(la.node for la in llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos + 1)).launches
                if la.node.op == "FLASH_ATTN_EXT")
    captured = float(attn["exposed_ns"].median()) - fitted_1b["measured"]["cupti_kernel_ns"]
    assert captured > 30_000  # 32 key tiles a block: 6x the 512-row kernel
    assert kernel_cost(node, cal).duration_ns == pytest.approx(captured, rel=0.10)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from llamacpp_capture import captures

    (cap,) = captures(["llama-3.2-1b"], ["graphs"], 6, 32768)
    assert (cap.stem, cap.context, cap.start_pos) == ("llama-3.2-1b-L16_graphs_ctx32768", 32768, 32704)
    (cap,) = captures(["llama-3.2-1b"], ["graphs"], 6)
    assert (cap.stem, cap.start_pos) == ("llama-3.2-1b-L16_graphs", 448)


def test_llamacpp_schedule_forks_qkv_as_its_captures_show():
    """Under GGML_CUDA_GRAPH_OPT llama.cpp puts every Q/K/V branch on a stream of its own (the
    Q projection on another stream than the attention it feeds: four streams), and Qwen3-Next
    on one stream; the llama.cpp schedule runs as many streams as each committed capture (H200
    and H100), while the workbench's own ``qkv`` keeps Q on the forking stream."""
    from workbench.exec.calibrate.llamacpp_schedule import llamacpp_plan

    def streams(plan) -> tuple[int, int, int]:
        """Streams of layer 0's attention norm, Q projection (with or without its bias) and attention."""
        by = {la.node.name: la.stream for la in plan.launches}
        return by["attn_norm-0"], next(s for n, s in by.items() if n.startswith("Qcur-0")), by["kqv_out-0"]

    seen = 0
    for t in [*read_traces(CAPTURES), *read_traces(TRACES / "h100_captures")]:
        if t.config_label != "graph_opt":
            continue
        ev = t.trace.events
        kern = ev[(ev["kind"] == "kernel") & (ev["token"] == 1)].sort_values("start_ns")
        cfg = t.config()
        n_kv = cfg.kv_len(t.start_pos + 1)
        plan = llamacpp_plan(cfg, t.strategy, n_kv)
        assert plan.n_streams == kern["stream"].nunique(), t.name
        if plan.n_streams > 1:
            seen += 1
            norm_s, q_s, fa_s = streams(plan)
            assert q_s not in (norm_s, fa_s), t.name
            norm = kern[kern["op"].str.startswith("RMS_NORM")].iloc[0]
            q = kern[(kern["op"] == "MUL_MAT") & (kern["start_ns"] > norm["start_ns"])].iloc[0]
            fa = kern[kern["op"] == "FLASH_ATTN_EXT"].iloc[0]
            assert q["stream"] != fa["stream"], t.name  # (graph replay picks the stream ids: the norm's vary)
            ours = plan_for(cfg, t.strategy, n_kv)
            norm_s, q_s, fa_s = streams(ours)
            assert ours.n_streams == 3 and norm_s == q_s == fa_s, t.name
    assert seen == 8  # four models on each GPU


def test_the_host_fills_llamacpps_attention_mask_every_token(fitted_1b):
    """llama.cpp fills its KQ mask on the CPU before each step, a cell per cached KV row: the
    captures at 512, 8192 and 32768 rows put the host's time before the first CUDA call on a line
    of about 3 ns a mask byte, the fit keeps that slope, and the simulator charges it per token
    (every other host cost alike, the 32k-row token is that much longer with it than without)."""
    from dataclasses import replace

    import workbench
    from workbench.exec.calibrate.llamacpp_fit import first_call_us, mask_bytes, mask_fill_cost

    one_b = sorted((t for t in read_traces(CAPTURES) if t.model == "llama-3.2-1b" and t.config_label == "graphs"),
                   key=lambda t: t.context)
    points = [(mask_bytes(t), first_call_us(t)) for t in one_b]
    assert [b for b, _ in points] == [1024, 16384, 65536]  # f16 cells, the KV rows padded to 256
    assert points[0][1] < points[1][1] < points[2][1]
    slope, how = mask_fill_cost(one_b)
    assert 1.0 < slope < 6.0 and "llama-3.2-1b" in how
    assert fitted_1b["host_profiles"]["llama.cpp"]["mask_fill_ns_per_byte"] == pytest.approx(slope, rel=1e-3)
    cal = parse_calibration(fitted_1b, "fit")
    t = one_b[-1]
    no_mask = replace(cal.host, mask_fill_ns_per_byte=0.0)
    without = replace(cal, host=no_mask, host_profiles={**cal.host_profiles, cal.host_profile: no_mask})
    us = [workbench.run(t.config(), t.strategy, tokens=9, backend="sim", start_pos=t.start_pos, calibration=c,
                        quiet=True).stats["us_per_token"] for c in (cal, without)]
    # 8 tokens measured from the first one's first CUDA call: 7 of their 8 fills fall inside
    assert us[0] - us[1] == pytest.approx(slope * 65536 / 1e3 * 7 / 8, rel=0.02)
