"""``benchmarks/llamacpp_peer.py``'s summary (CPU): medians per tool, the backend-vs-llama-bench
ratio and each knob step's change, from result records."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    assert "0c1e570" in md and "NVIDIA H100" in md
    assert "| default | graphs+pdl+copy-elim+rms-norm-mul | `-` | 900 [880..920] | 882 [880..884] | +2.0 % |" in md
    assert "| PDL under graphs | pdl0 -> default | -10.0 % | - | -7.7 % | - |" in md
    assert "error: BackendError: boom" in md
    assert "| best us/token | | 900 (default) | 882 (default) | 1200 (default) | - |" in md
