"""Quantised weights against the real llama.cpp CPU build: every family's tiny preset in q8_0,
q4_0 and mxfp4 (and q4_k on the tiny presets widened to whole 256-value blocks), the same GGUF.

The reference models llama.cpp's CUDA path: activations quantised to q8_1 (``QUANTIZE_Q8_1``)
before every quantised mat-mul. llama.cpp's CPU backend differs from it in two known places,
and the tests take them out one at a time so that what remains must match to float32 rounding:

- its flash attention accumulates ``softmax(QK) V`` in f16 over an f16 KV cache (the reference
  and the CUDA vector kernel keep f32). Rounded outputs move some activations across a q8
  rounding step, so from the second position on (the first attends to one row, exactly) the
  logits differ by up to 1.4e-2 of the largest (q4_0/q8_0/mxfp4, 4 tokens, these presets);
  ``workbench.llamacpp.cpu_numerics.cpu_attend`` is that accumulation, and with it every token matches to < 2e-7;
- for k-quants it multiplies with q8_K activations (256-value blocks, an f32 scale) instead
  of q8_0/q8_1 (32-value blocks, an f16 scale, the same values as q8_1): ``q8_k`` emulates them.

``TOL_EXACT`` (1e-5 of the largest logit, 50x the float32 summation-order differences seen)
then fails any wrong block, scale, row order or activation rounding. One token in a sequence may
miss it (but not ``TOL_PLAIN``): an activation within an ulp of a q8 rounding boundary rounds
the other way under the other summation order (Qwen3-Next 256-wide, q4_k, first token: one
value 5.7e-6 from the boundary moves the logits by 4.6e-3). The plain reference is held to
``TOL_PLAIN`` (3e-2, 2x the worst seen) and the same greedy tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.exec.backend import RunRequest
from workbench.exec.llamacpp import LlamaCppBackend, LlamaCppOptions
from workbench.exec.reference import run_reference
from workbench.llamacpp.cpu_numerics import ggml_cpu_numerics
from workbench.models import TINY_PRESETS, ModelConfig, build_graph, preset
from workbench.models.weights import random_weights
from workbench.strategy import Strategy

CONTEXT = 64
TOKENS = [5, 77, 200, 13]
TOL_EXACT = 1e-5
TOL_PLAIN = 3e-2
#: q4_k needs rows of whole 256-value blocks: the tiny presets with every width at 256
WIDE = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256, shared_expert_intermediate_size=256,
            head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64)




def config(name: str, qtype: str) -> ModelConfig:
    cfg = preset(name, context=CONTEXT, weight_dtype=qtype)
    if qtype == "q4_k":
        cfg = ModelConfig(f"{name}-256", {**cfg.hf, **{k: v for k, v in WIDE.items() if k in cfg.hf}},
                          context=CONTEXT, weight_dtype=qtype)
    if cfg.model_type == "gpt_oss":  # llama.cpp's YaRN rounds its correction range (test_llamacpp_cpu)
        cfg = cfg.with_()
        cfg.hf["rope_scaling"]["truncate"] = True
    return cfg


def llamacpp_logits(lib: str, cfg: ModelConfig) -> np.ndarray:
    req = RunRequest(cfg, Strategy(), [], TOKENS, options=LlamaCppOptions(build=lib, threads=2))
    return LlamaCppBackend().run(req).logits


def reference_logits(cfg: ModelConfig) -> np.ndarray:
    return run_reference(cfg, random_weights(build_graph(cfg), 0), TOKENS).logits


def worst(got: np.ndarray, want: np.ndarray) -> float:
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "mxfp4", "q4_k"])
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_reference_equals_llamacpp_on_the_same_quantised_gguf(llamacpp_lib, name, qtype):
    cfg = config(name, qtype)
    if qtype != "q4_k":
        assert {v.dtype for v in build_graph(cfg).weights.values()} >= {qtype if qtype != "mxfp4" else "q8_0"}
    else:
        assert "q4_k" in {v.dtype for v in build_graph(cfg).weights.values()}
    got = llamacpp_logits(llamacpp_lib, cfg)
    plain = reference_logits(cfg)
    if qtype != "q4_k":  # q8_K against q8_1 activations: the plain comparison is not meaningful
        assert worst(got, plain) <= TOL_PLAIN, f"{name} {qtype}: plain reference off by {worst(got, plain):.2e}"
        assert (got.argmax(axis=1) == plain.argmax(axis=1)).all()
    with ggml_cpu_numerics(q8_k_activations=qtype == "q4_k"):
        cpu = reference_logits(cfg)
    err = np.abs(got - cpu).max(axis=1) / np.abs(cpu).max(axis=1)
    assert (err > TOL_EXACT).sum() <= 1 and err.max() <= TOL_PLAIN, f"{name} {qtype}: {err} with ggml-cpu's numerics"


@pytest.mark.slow
def test_a_q4_k_m_style_file_with_a_q6_k_output_is_read_and_matches(llamacpp_lib, tmp_path, monkeypatch):
    """Q4_K_M files keep the output (and some layers) in q6_k: read from the file, it multiplies
    as in llama.cpp (q6_k blocks made by ggml's own quantiser)."""
    import ctypes
    from pathlib import Path

    import workbench.models.gguf_write as gw
    from workbench.models import load_config
    from workbench.models.quant import dequantize
    from workbench.models.weights import model_weights

    lib = ctypes.CDLL(str(next(Path(llamacpp_lib).glob("libggml-base.so*"))))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    tensors = gw.gguf_tensors

    def with_q6_k_output(cfg, graph, weight):
        for gname, a, dtype in tensors(cfg, graph, weight):
            if gname == "output.weight":
                x = np.ascontiguousarray(dequantize(a, dtype))
                q = np.zeros((x.shape[0], x.shape[1] // 256 * 210), np.uint8)
                lib.ggml_quantize_chunk(14, x.ctypes.data, q.ctypes.data, 0, x.shape[0], x.shape[1], None)  # Q6_K
                a, dtype = q, "q6_k"
            yield gname, a, dtype

    monkeypatch.setattr(gw, "gguf_tensors", with_q6_k_output)
    path = gw.write_gguf(config("llama-tiny", "q4_k"), tmp_path / "q4_k_m.gguf", qtype="q4_k")
    cfg = load_config(str(path), context=CONTEXT)
    assert cfg.weight_dtype == "q4_k" and dict(cfg.tensor_types)["lm_head.weight"] == "q6_k"
    assert build_graph(cfg).node("result_output").srcs[1].dtype == "q8_1"
    got = llamacpp_logits(llamacpp_lib, cfg)
    with ggml_cpu_numerics(q8_k_activations=True):
        want = run_reference(cfg, model_weights(cfg, build_graph(cfg)), TOKENS).logits
    err = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert (err > TOL_EXACT).sum() <= 1 and err.max() <= TOL_PLAIN, err
