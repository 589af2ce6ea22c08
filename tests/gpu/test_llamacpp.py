"""The llamacpp backend on a GPU: a CUDA build of llama.cpp named by ``WORKBENCH_LLAMACPP``
(``benchmarks/llamacpp_gpu_run.sh`` builds one and sets it). Each knob runs and computes the
reference's logits; a traced run names its kernels by ggml op, on Stream rows, per token."""

from __future__ import annotations

import os

import numpy as np
import pytest

from workbench.exec.backend import BackendError, RunRequest
from workbench.exec.llamacpp import LlamaCppBackend, LlamaCppOptions
from workbench.llamacpp.switches import LLAMACPP_FUSION as LLAMA_FUSIONS
from workbench.models import TINY_PRESETS, build_graph, preset
from workbench.models.weights import random_weights
from workbench.strategy import Strategy

KNOBS = {
    "eager": Strategy(),
    "graphs": Strategy(graphs=True),
    "graphs+pdl": Strategy(graphs=True, pdl=True),
    "graphs+pdl+fusion": Strategy(graphs=True, pdl=True, fusion=LLAMA_FUSIONS),
    "graphs+pdl+qkv+fusion": Strategy(graphs=True, pdl=True, streams="qkv", fusion=LLAMA_FUSIONS),
}
#: CUDA's f16 mat-vec and flash-attention paths round differently from the CPU's; the bound is
#: 2.5x the CPU test's (tests/test_llamacpp_cpu.py), and each failure prints the worst error.
REL_TOL = 1e-2


@pytest.fixture(scope="module")
def cuda_build():
    from workbench.llamacpp.switches import BuildInfo

    folder = os.environ.get("WORKBENCH_LLAMACPP")
    if not folder:
        pytest.skip("WORKBENCH_LLAMACPP is not set (benchmarks/llamacpp_gpu_run.sh sets it to a CUDA build)")
    if not BuildInfo.of(folder).cuda:
        pytest.skip(f"{folder} is a CPU-only llama.cpp build")
    return folder


def run(folder, cfg, strategy, tokens, trace=False):
    return LlamaCppBackend().run(RunRequest(cfg, strategy, [], tokens, trace=trace,
                                            options=LlamaCppOptions(build=folder)))


def reference(cfg, tokens):
    from workbench.exec.reference import run_reference

    if cfg.model_type == "gpt_oss":  # llama.cpp rounds YaRN's correction range (tests/test_llamacpp_cpu.py)
        cfg = cfg.with_()
        cfg.hf["rope_scaling"]["truncate"] = True
    return run_reference(cfg, random_weights(build_graph(cfg), 0), tokens).logits


def worst(got, want) -> float:
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_every_family_on_cuda_matches_the_reference(cuda_build, name):
    cfg = preset(name, context=64)
    tokens = [3, 141, 59, 26, 5, 35]
    r = run(cuda_build, cfg, KNOBS["graphs+pdl+fusion"], tokens)
    assert "CUDA" in r.device
    err = worst(r.logits, reference(cfg, tokens))
    print(f"{name}: worst relative logit error on CUDA {err:.2e}")
    assert err <= REL_TOL


@pytest.mark.parametrize("knob", list(KNOBS))
def test_each_knob_runs_and_keeps_the_logits(cuda_build, knob):
    cfg = preset("qwen3-next-tiny", context=64)
    tokens = [3, 141, 59, 26]
    r = run(cuda_build, cfg, KNOBS[knob], tokens)
    err = worst(r.logits, reference(cfg, tokens))
    print(f"{knob}: {r.meta['switches_text']}: worst relative logit error {err:.2e}, "
          f"{r.stats['us_per_token']:.0f} us/token")
    assert err <= REL_TOL and r.stats["us_per_token"] > 0


def test_trace_names_kernels_by_ggml_op(cuda_build):
    cfg = preset("llama-3.2-1b", layers=2, context=512)
    r = run(cuda_build, cfg, KNOBS["graphs+pdl+fusion"], [1, 2, 3, 4], trace=True)
    ev = r.trace.events
    k = ev[ev["kind"] == "kernel"]
    assert len(k) > 0 and k["row"].str.startswith("Stream ").all()
    unknown = sorted(set(k.loc[k["op"] == "", "name"]))
    print("kernels without a ggml op:", unknown)
    assert (k["op"] != "").mean() >= 0.9, unknown
    assert {"MUL_MAT", "FLASH_ATTN_EXT", "ROPE", "GET_ROWS"} <= {o for op in k["op"] for o in op.split("+")}
    assert sorted(set(ev.loc[ev["kind"] == "marker", "token"])) == [0, 1, 2, 3]
    assert set(k["token"]) >= {0, 1, 2, 3}
    assert (ev["row"] == "CUDA API").any()


def test_allocator_knob_is_refused_on_cuda_too(cuda_build):
    with pytest.raises(BackendError, match="--allocator"):
        run(cuda_build, preset("llama-tiny", context=64), Strategy(graphs=True, allocator="stream-aware"), [1])


@pytest.mark.parametrize("knob", ["eager", "graphs+pdl+fusion"])
def test_backend_times_as_llama_bench(cuda_build, knob, tmp_path, monkeypatch):
    """Issue 13's acceptance: the backend's us/token within 3 % of the same build's llama-bench
    (same tiled GGUF, switches, threads, depth 448 and 64 tokens; median of three back-to-back
    pairs' ratios, so the GPU's drift between pairs does not count)."""
    from test_llamacpp_timing import backend_and_llama_bench, pair_ratios

    from workbench.exec.llamacpp import physical_cores
    from workbench.llamacpp.build import llama_bench

    exe = llama_bench(cuda_build)
    if exe is None:
        pytest.skip(f"no llama-bench beside {cuda_build} (benchmarks/llamacpp_gpu_run.sh builds it)")
    ratios = pair_ratios(backend_and_llama_bench(str(exe), "llama-3.2-1b", threads=physical_cores(),
                                                 gpu_layers=99, monkeypatch=monkeypatch, tmp=tmp_path, n=64,
                                                 depth=448, layers=4, strategy=KNOBS[knob]))
    print(f"\n{knob}: backend / llama-bench per pair: {', '.join(f'{r:.3f}' for r in ratios)}")
    assert abs(np.median(ratios) - 1) <= 0.03, ratios
