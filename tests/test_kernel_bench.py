"""The GPU benchmarks' host side without a GPU: kernel_bench's node choice and variant bindings at
full size, gpu_decode's argument checks (both run on the GPU machine; see their docstrings), and
the CPU reports of kernel_fidelity, grid_ab and launch_state."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_calibrate import CUPTI_EPOCH_NS

from workbench.exec import cuda_ops

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bind(node, knobs: dict) -> str:
    kb = _load("kernel_bench")
    with kb.variant(knobs):
        return cuda_ops.bind(node, lambda v: 1 << 20, lambda key, n: 0).name


def test_kernel_bench_covers_each_op_and_restores_the_defaults():
    kb = _load("kernel_bench")
    before = {k: getattr(cuda_ops, k) for knobs in kb.VARIANTS.values() for v in knobs.values() for k in v}
    nodes = {n.name: n for n in kb.bench_nodes("gpt-oss-20b")}
    assert {n.op for n in nodes.values()} == set(kb.OPS)
    assert "ffn_moe_up-0" in nodes and "ffn_moe_gate-0" not in nodes  # gate and up: one shape
    names = {v: _bind(nodes["ffn_moe_up-0"], knobs) for v, knobs in kb.VARIANTS["MUL_MAT_ID"].items()}
    assert names == {"default": "k_mul_mat_id_seg_f16", "warp": "k_mul_mat_id_f16", "seg16": "k_mul_mat_id_seg_f16",
                     "seg8": "k_mul_mat_id_seg_f16"}
    assert _bind(nodes["kqv_out-0"], kb.VARIANTS["FLASH_ATTN_EXT"]["gqa"]) == "k_flash_attn_ext_gqa_f16"
    assert {k: getattr(cuda_ops, k) for k in before} == before


@pytest.mark.parametrize("argv,message", [(["--peers", "jax"], "--peers: unknown jax"),
                                          (["--skip", "lama"], "--skip: unknown lama"),
                                          (["--models", "gpt-oss-20b"], "llama-family presets")])
def test_gpu_decode_names_unknown_peers_and_parts(argv, message):
    gd = _load("gpu_decode")
    with pytest.raises(SystemExit, match=message):
        gd.main(argv)


def test_launch_policies_rebind_what_they_name():
    """benchmarks/launch_policy.py: each policy changes the launches it names (the mat-vec split,
    the attention launch, the norm threads, the carveout) and ``apply("default")`` restores the
    binders, so a benchmark run leaves the library as it found it."""
    from workbench.exec import cuda_quant_ops, kernels
    from workbench.models import build_graph, preset
    from workbench.strategy import compile_plan

    lp = _load("launch_policy")
    g = build_graph(preset("llama-3.2-1b", layers=1, context=512, weight_dtype="q4_0"), pos=448)
    nodes = {n.name: n for n in compile_plan(g, lp.BEST).graph.nodes}

    def launches():
        call = {k: cuda_ops.bind(nodes[k], lambda v: 256 + v.offset, lambda key, n: 0)
                for k in ("Qcur-0", "Kcur-0", "kqv_out-0", "Qcur-0_q8_1", "result_output")}
        return {k: (c.grid, c.block, [a.value for a in c.args[-2:] if hasattr(a, "value")], c.cluster)
                for k, c in call.items()}

    base = launches()
    assert base["Qcur-0_q8_1"][1] == (512,) and base["Kcur-0"][2] == [1, 4]  # norm threads, K/V split-K
    changed = {"mmvq-w4": "Qcur-0", "mmvq-r2": "Qcur-0", "attn-split": "kqv_out-0", "norm-256": "Qcur-0_q8_1"}
    try:
        for policy, node in changed.items():
            lp.apply(policy)
            now = launches()
            assert now[node] != base[node], policy
            assert now["result_output"] == base["result_output"], policy  # an lm_head keeps 4 rows a warp
        lp.apply("carveout-50")
        assert kernels.SMEM_CARVEOUT == 50
        # the persistent fused mat-vecs: fewer resident blocks, the grid capped at 3 an SM
        f16 = compile_plan(build_graph(preset("llama-3.2-1b", layers=1, context=512), pos=448), lp.BEST).graph
        glu = next(n for n in f16.nodes if n.op == "RMS_NORM_MUL_MAT_GLU")
        grid = {}
        for policy in ("default", "fmv-3"):
            lp.apply(policy)
            grid[policy] = cuda_ops.bind(glu, lambda v: 256 + v.offset, lambda key, n: 0).grid
        assert grid == {"default": (4 * 132,), "fmv-3": (3 * 132,)}
    finally:
        lp.apply("default")
    assert launches() == base and kernels.SMEM_CARVEOUT == -1 and cuda_ops.FMV_MAX_BLOCKS == 4 * 132
    assert cuda_quant_ops.mmvq_split is lp._ORIG["mmvq_split"]
    md = lp.table([{"model": "m", "layers": 1, "weight_dtype": "q4_0", "us": {"default": [2.0], "mmvq-w4": [3.0]}}],
                  "GPU")
    assert "+50.0 %" in md and "llama.cpp's split" in md


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_mmvq_sweep_fit_prices_the_kernels_it_timed(gpu):
    """benchmarks/mmvq_sweep.py --fit: each GPU's committed cold-L2 sweep gives every block type's
    mat-vec a sourced fit in that GPU's calibration (the shipped file carries them; the H100's
    through benchmarks/h100_calibration.py), and the simulator then prices the timed launches
    under the binder's split: their total within 2 % (an absolute-error fit keeps the sum), the
    median launch within 10 %."""
    import json

    from workbench.exec.calibration import parse_calibration
    from workbench.exec.cost import kernel_cost
    from workbench.exec.cuda_quant_ops import MMVQ_TYPES

    ms = _load("mmvq_sweep")
    sweep = json.loads((ROOT / "data" / "bench" / f"mmvq_sweep_{gpu}.json").read_text())
    shipped = json.loads((ROOT / "data" / "calibration" / f"{gpu}.json").read_text())
    data = json.loads(json.dumps(shipped))
    fits = ms.fit_calibration(sweep, data)
    assert {f"MUL_MAT/k_mul_mat_vec_q_{t}" for t in MMVQ_TYPES} <= set(fits)
    assert all(data["sources"][f"ops.{k}.fixed_ns"].startswith("measured by benchmarks/mmvq_sweep.py") for k in fits)
    assert {k: shipped["ops"][k] for k in fits} == {k: v for k, (v, _) in fits.items()}  # the file is up to date
    cal = parse_calibration(data)
    got, want = [], []
    for r, node, key in ms.binder_rows(sweep):
        if key not in fits:
            continue
        want.append(r["us"] * 1e3 - cal.dependency_gap_ns)
        got.append(kernel_cost(node, cal).duration_ns)
    got_a, want_a = np.array(got), np.array(want)
    assert len(got) >= 20 and abs(got_a.sum() / want_a.sum() - 1) < 0.02
    assert np.median(np.abs(got_a / want_a - 1)) < 0.10


def test_kernel_ab_exports_a_revisions_kernels(tmp_path):
    """benchmarks/kernel_ab.py's A side: every file of kernels/ as the revision has it (the headers
    the sources include with them), ready for the kernel loader's KERNEL_DIR."""
    import subprocess

    ka = _load("kernel_ab")
    ka.export_kernels("HEAD", tmp_path)
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", "HEAD", "kernels/"],
                             capture_output=True, text=True, check=True).stdout.split()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(n).name for n in tracked)
    assert {"common.cuh", "mmvq.cu"} <= {p.name for p in tmp_path.iterdir()}
    head = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:kernels/mmvq.cu"], capture_output=True,
                          check=True).stdout
    assert (tmp_path / "mmvq.cu").read_bytes() == head


def test_host_path_variants_markdown_matches_its_committed_run():
    """benchmarks/host_path_variants.py: the committed table is what the script writes from the
    committed run's JSON (ratios of medians, the largest logits difference over the variants)."""
    import json

    hp = _load("host_path_variants")
    data = ROOT / "data" / "bench"
    result = json.loads((data / "host_path_variants_h200.json").read_text())
    assert hp.markdown(result) == (data / "host_path_variants_h200.md").read_text()
    r = result["results"][1]
    ratio = np.median(r["us"]["launch_ahead"]) / np.median(r["us"]["step"])
    assert r["model"] == "llama-3.1-8b" and f"| {ratio:.3f} |" in hp.markdown(result)


def test_pdl_saving_by_model_reproduces_its_committed_table():
    """benchmarks/pdl_saving_by_model.py: the committed table follows from the committed matrix and
    report (measured and predicted saving per kernel, the cuda backend's grids bound on the CPU)."""
    mod = _load("pdl_saving_by_model")
    data = ROOT / "data" / "bench"
    df = mod.table(data / "decode_matrix_h200_s31b.jsonl", data / "sim_fidelity_h200.csv", 4 * 132)
    row = df.set_index("model").loc["llama-3.1-8b/ctx1024/pos600"]
    assert row["kernels"] == 612 and row["measured_ns_per_kernel"] > row["predicted_ns_per_kernel"]
    by_model, by_node = mod.timeline_tables(data / "kernel_timelines_h200_s29.csv.gz")
    # in the settled launch state every model's small kernels save about the same; the large
    # ones are where models differ (gpt-oss-20b's 360-block kernels lose time under PDL)
    assert by_model["small_median_saved_ns"].between(800, 1100).all()
    gpt_oss = by_node[by_node["model"].str.startswith("gpt-oss-20b")].set_index("node")
    assert gpt_oss.loc["ffn_moe_down", "blocks"] == 360 and gpt_oss.loc["ffn_moe_down", "median_saved_ns"] < 0
    md = mod.markdown(df, "decode_matrix_h200_s31b.jsonl", "sim_fidelity_h200.csv",
                      ("kernel_timelines_h200_s29.csv.gz", by_model, by_node))
    assert md == (data / "pdl_saving_by_model_h200.md").read_text()


def test_kernel_fidelity_reproduces_its_committed_report():
    """benchmarks/kernel_fidelity.py: the committed report follows from the committed full-size
    timelines and the shipped H200 calibration; the router's top-k, priced per serial step, is
    within 10 % of every model's measured median duration."""
    mod = _load("kernel_fidelity")
    data = ROOT / "data" / "bench"
    import pandas as pd

    cmp = mod.compare(pd.read_csv(data / "kernel_timelines_h200_s29.csv.gz"), None, "h200")
    t = mod.tables(cmp)
    md = mod.markdown(t, "kernel_timelines_h200_s29.csv.gz", "`data/calibration/h200.json`")
    assert md == (data / "kernel_fidelity_h200.md").read_text()
    k = t["kernels"]
    top_k = k[(k["name"] == "k_argsort_top_k") & (k["strategy"] == "graphs")]
    assert len(top_k) == 3  # gpt-oss-20b, Qwen3-30B-A3B, Qwen3-Next: 4 of 32, 8 of 128, 10 of 512
    assert ((top_k["median_dur_sim_ns"] / top_k["median_dur_ns"] - 1).abs() < 0.10).all(), top_k


def test_kernel_fidelity_reads_the_fusion_trace():
    """The fusion trace of llama.cpp's set on llama-3.2-1b: its committed report follows from it,
    and its runs are the Strategies that ran (195 kernels fused, 308 not, PDL off and on)."""
    mod = _load("kernel_fidelity")
    data = ROOT / "data" / "bench"
    import pandas as pd

    measured, strategies = mod.from_fusion_trace(pd.read_csv(data / "fusion_trace_1b_h200_s28.csv.gz"))
    assert measured.groupby("strategy").size().to_dict() == {
        "graphs": 308, "graphs+pdl": 308, "graphs+llamacpp-fusion": 195, "graphs+pdl+llamacpp-fusion": 195}
    assert strategies["graphs+pdl+llamacpp-fusion"].pdl and strategies["graphs"].fusion == frozenset()
    md = mod.markdown(mod.tables(mod.compare(measured, None, "h200", strategies)),
                      "fusion_trace_1b_h200_s28.csv.gz", "`data/calibration/h200.json`")
    assert md == (data / "kernel_fidelity_fusion_1b_h200.md").read_text()


def test_grid_ab_old_rules_are_the_rules_before():
    """benchmarks/grid_ab.py's `old_rules` variant is the binder's rules before 2026-11-29, which
    the new ones differ from only where grid_ab_h200.md measured them faster."""
    mod = _load("grid_ab")
    old_glu, old_qkv = mod.OLD_RULES["fused_splits"], mod.OLD_RULES["qkv_splits"]
    assert (old_glu(14336, 512), old_glu(8192, 256), old_glu(12288, 512), old_glu(512, 256)) == (2, 1, 1, 4)
    assert (old_qkv(1536, 256), old_qkv(3072, 512)) == (1, 1)
    assert (cuda_ops.fused_splits(14336, 512), cuda_ops.fused_splits(8192, 256)) == (2, 1)  # unchanged
    assert (cuda_ops.fused_splits(12288, 512), cuda_ops.fused_splits(512, 256)) == (2, 1)  # Qwen3-8B, Qwen3-30B-A3B
    assert (cuda_ops.qkv_splits(1536, 256), cuda_ops.qkv_splits(3072, 512)) == (2, 1)  # llama-3.2-1b, llama-3.1-8b


def test_gaps_are_exact_at_cuptis_epoch_and_per_stream(tmp_path) -> None:
    """benchmarks/launch_state.py --gaps: the gap between consecutive kernels of one stream, read
    to the ns where CUPTI's stamps sit (float64 steps by 256 ns there)."""
    bench = _load("launch_state")
    rows = []
    for stream, gap in ((7, 96), (9, 416)):
        t = CUPTI_EPOCH_NS + 13 + stream
        for i in range(5):
            rows.append({"model": "m", "strategy": "graphs", "node": f"n{stream}-{i}", "name": "k",
                         "start_ns": t, "end_ns": t + 1000, "stream": stream})
            t += 1000 + gap
    csv = tmp_path / "k.csv.gz"
    pd.DataFrame(rows).to_csv(csv, index=False)
    g = bench.kernel_gaps(pd.DataFrame(rows))
    assert sorted(g.unique()) == [96, 416] and len(g) == 8  # no gap across the two streams
    t = bench.gap_table([str(csv)])
    assert t.loc[0, "kernels"] == 10 and t.loc[0, "gap_p25_ns"] == 96 and t.loc[0, "gap_p75_ns"] == 416


def test_llama_cpp_replays_its_graphs_with_96_ns_gaps() -> None:
    """The committed llama.cpp capture that launch_state_h200.md (session 30) reads."""
    bench = _load("launch_state")
    path = ROOT / "data" / "traces" / "llamacpp" / "h200_captures" / "llama-3.2-1b-L16_pdl0.parquet"
    t = bench.gap_table([str(path)])
    assert t.loc[0, "kernels"] == 213 and t.loc[0, "gap_median_ns"] == 96
