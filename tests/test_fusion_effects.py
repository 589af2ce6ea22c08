"""benchmarks/fusion_effects.py on the simulator: the pairs it times and the rows it writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fusion_effects  # noqa: E402


def test_each_fusion_that_applies_gets_an_alone_and_a_drop_row(tmp_path):
    out = tmp_path / "fe.jsonl"
    md = tmp_path / "fe.md"
    assert fusion_effects.main(["--backend", "sim", "--models", "qwen3-moe-tiny", "--tokens", "4", "--runs", "1",
                                "--rounds", "1", "--fusions", "topk-moe,moe-weighted-reduction,qkv-rope-store",
                                "--jsonl", str(out), "--md", str(md)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # qkv-rope-store does not rewrite Qwen3's graph (its head norms sit between): left out
    assert sorted((r["fusion"], r["how"]) for r in rows) == [
        ("moe-weighted-reduction", "alone"), ("moe-weighted-reduction", "drop"), ("topk-moe", "alone"),
        ("topk-moe", "drop")]
    for r in rows:
        # on the simulator the measurement is the prediction, and a fusion never costs time there
        assert r["effect_pct"] == r["predicted_pct"] > 0
        assert r["without_us"] > r["with_us"]
    assert "| qwen3-moe-tiny | q4_0 | topk-moe | alone |" in md.read_text()
