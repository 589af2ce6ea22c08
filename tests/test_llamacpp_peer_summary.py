"""``benchmarks/llamacpp_peer.py``'s summary (CPU): medians per tool, the backend-vs-llama-bench
ratio and each knob step's change, from result records."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("llamacpp_peer", ROOT / "benchmarks" / "llamacpp_peer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_tables():
    peer = _module()
    base = dict(gpu="NVIDIA H100 80GB HBM3", memory="81559 MiB", driver="580.1", date="2026-11-24",
                model="llama-3.2-1b", round=0)
    recs = [
        dict(base, config="pdl0", tool="llamacpp", us=[1000, 1010, 990], env={"GGML_CUDA_PDL": "0"}),
        dict(base, config="default", tool="llamacpp", us=[900, 880, 920], env={}),
        dict(base, config="default", tool="llama-bench", us=[880, 884], env={}, build_commit="0c1e570"),
        dict(base, config="default", tool="cuda", us=[1200], env={}),
        dict(base, config="pdl0", tool="cuda", us=[1300], env={"GGML_CUDA_PDL": "0"}),
        dict(base, config="graph_opt", tool="llamacpp", error="BackendError: boom", env={}),
    ]
    md = peer.summarize(recs)
    label = peer.CONFIGS["default"][0].label()
    assert "0c1e570" in md and "NVIDIA H100" in md
    assert f"| default | {label} | `-` | 900 [880..920] | 882 [880..884] | +2.0 % |" in md
    assert "| PDL under graphs | pdl0 -> default | -10.0 % | - | -7.7 % | - |" in md
    assert "error: BackendError: boom" in md
    assert "| best us/token | | 900 (default) | 882 (default) | 1200 (default) | - |" in md
    assert "--ours-fusion all" not in md
    # ours with the workbench's own fusions too: the header says so
    tagged = [dict(r, ours_fusion="all") if r["tool"] == "cuda" else r for r in recs]
    assert "with `--ours-fusion all`, ours and sim also run the workbench's own fusions (norm-mat-vec" in \
        peer.summarize(tagged)
    assert peer.ours(peer.CONFIGS["default"][0], True).fusion >= {"norm-mat-vec", "qkv-rope-store"}
    assert peer.ours(peer.CONFIGS["no_fusion"][0], True).fusion == frozenset()


def test_the_agreement_is_the_ratio_of_each_back_to_back_pair():
    """Interleaved A B A B calls: each pair's backend median over llama-bench's median, then
    the median [min..max] of those, so drift between pairs does not count."""
    peer = _module()
    base = dict(gpu="NVIDIA H200", memory="143771 MiB", driver="580", date="2026-11-24", model="m", round=0,
                config="default", env={})
    recs = [dict(base, tool="llamacpp", pair=0, us=[1010, 1000, 1020]),
            dict(base, tool="llama-bench", pair=0, us=[1000, 990]),   # +1.5 % (1010 / 995)
            dict(base, tool="llamacpp", pair=1, us=[1100, 1100]),     # the GPU drifted: both slower
            dict(base, tool="llama-bench", pair=1, us=[1110, 1110])]  # -0.9 %
    ratios = peer.pair_ratios(recs)[("m", "default")]
    assert np.allclose(ratios, [1010 / 995, 1100 / 1110])
    md = peer.summarize(recs)
    assert "| +0.3 % [-0.9..+1.5] |" in md


def test_the_fusion_effect_by_pdl_placement_reads_the_committed_grid() -> None:
    """benchmarks/fusion_pdl_placement.py pairs each placement's fusion-off and fusion-on cells by
    round; with llama.cpp's wait and mat-vec signal placement the effect is session 32's -9.2 %,
    with the Strategy default -5.5 % (data/bench/speed_h200.md, session 32)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    from fusion_pdl_placement import report

    text = report(root / "data" / "bench" / "pdl_fusion_grid_1b_h200_s32.jsonl")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "-9.2 %" in rows["start, after-main-loop"] and "-5.5 %" in rows["first-read, start"]
    assert "-11.4 %" in rows["PDL off"] and len(rows) == 6  # header + PDL off + four placements


def test_no_backend_needs_llama_bench_and_skips_the_backend(tmp_path, monkeypatch):
    """``--no-backend`` times llama-bench alone: a build without it is refused by name, and with
    it a configuration measures llama-bench only (every record one process, tagged with the run)."""
    import argparse

    import pytest

    peer = _module()
    for lib in ("libllama.so", "libggml-base.so", "libggml-cuda.so"):  # a CUDA build's libraries
        (tmp_path / lib).write_bytes(b"\0")
    args = argparse.Namespace(llamacpp=str(tmp_path), no_backend=True, threads=1, ours_weights="auto",
                              jsonl=str(tmp_path / "out.jsonl"), budget_s=60.0)
    monkeypatch.setattr(peer, "gpu_info", lambda: {"gpu": "NVIDIA H200", "driver": "580", "memory": "1 MiB"})
    with pytest.raises(SystemExit, match="no-backend.*llama-bench"):
        peer.Bench(args)
    (tmp_path / "llama-bench").write_bytes(b"")
    bench = peer.Bench(args)
    tools = []
    monkeypatch.setattr(bench, "llamacpp", lambda *a: tools.append("llamacpp") or ([1.0], {}))
    monkeypatch.setattr(bench, "bench_tool", lambda *a: tools.append("llama-bench") or ([1.0, 1.0], {}))
    bench.args = argparse.Namespace(**vars(args), pairs=2, no_ours=True, weight_dtype="f16", fill="tiled",
                                    context=512, start_pos=448, tokens=64)
    cfg = argparse.Namespace(family="llama")
    bench.run_config(cfg, "llama-3.2-1b", "default", 0, tmp_path / "m.gguf", [1])
    assert tools == ["llama-bench", "llama-bench"]
    recs = peer.load([str(tmp_path / "out.jsonl")])
    assert [r["pair"] for r in recs] == [0, 1] and len({r["run"] for r in recs}) == 1
