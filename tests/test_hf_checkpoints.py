"""Checkpoints saved by the installed transformers and loaded by path: the workbench runs each
as the same model (1e-4 relative logits over more steps than any sliding window), in both
generations of config keys and both expert layouts, or refuses it naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hf_checkpoints import (
    CHECKPOINTS,
    TOKENS,
    hf_logits,
    save_checkpoint,
    to_fused_experts,
    to_old_keys,
    workbench_logits,
)
from hf_parity import max_rel_err

from workbench.models import ConfigError, load_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

TOL = 1e-4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (folder, transformers' logits), each checkpoint saved once per module."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            folder = save_checkpoint(name, tmp_path_factory.mktemp(name))
            cache[name] = folder, hf_logits(folder)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_checkpoint_matches_transformers(saved, tmp_path, name):
    folder, theirs = saved(name)
    ours = workbench_logits(folder)
    assert max_rel_err(ours, theirs) <= TOL, f"{name}: {max_rel_err(ours, theirs):.2e}"
    old = to_old_keys(folder, tmp_path / "old")
    assert "rope_parameters" not in json.loads((old / "config.json").read_text())
    assert max_rel_err(hf_logits(old), theirs) <= 1e-5  # the rewrite is the same model to transformers
    assert max_rel_err(workbench_logits(old), theirs) <= TOL, f"{name} (older keys)"


@pytest.mark.parametrize("name", ["qwen3-moe", "qwen3-next"])
def test_fused_expert_layout_loads_the_same(saved, tmp_path, name):
    folder, theirs = saved(name)
    fused = to_fused_experts(folder, tmp_path / "fused")
    assert max_rel_err(workbench_logits(fused), theirs) <= TOL


def test_bf16_checkpoint_loads(tmp_path):
    """Most checkpoints on the Hub are bf16: the weights widen to f32 bit-exactly, or stay bf16
    (storage) with the same values; into f16 the narrowing is stated."""
    from workbench.exec.reference import run_reference
    from workbench.models import build_graph
    from workbench.models.weights import model_weights

    folder = save_checkpoint("llama-attention-bias", tmp_path / "bf16", dtype="bfloat16")
    assert '"BF16"' in (folder / "model.safetensors").read_bytes()[:4096].decode("latin1")
    theirs = hf_logits(folder)
    assert max_rel_err(workbench_logits(folder), theirs) <= TOL
    cfg = load_config(str(folder), context=32, weight_dtype="bf16", kv_dtype="f32")
    weights = model_weights(cfg, build_graph(cfg))
    assert weights["model.layers.0.self_attn.q_proj.weight"].dtype == np.uint16  # bf16 bits, kept
    assert max_rel_err(run_reference(cfg, weights, TOKENS).logits, theirs) <= TOL
    with pytest.warns(UserWarning, match="bf16 checkpoint weights stored as f16"):
        model_weights(cfg.with_(weight_dtype="f16"), build_graph(cfg.with_(weight_dtype="f16")))


def test_weight_beyond_f16_range_is_refused(tmp_path):
    from safetensors.numpy import save_file

    from workbench.models import build_graph, preset
    from workbench.models.weights import load_safetensors

    graph = build_graph(preset("llama-tiny", context=16))
    tensors = {k: np.full(v.shape, 0.5, np.float32) for k, v in graph.weights.items()}
    tensors["model.layers.1.mlp.up_proj.weight"][0, 0] = 1e5
    save_file(tensors, str(tmp_path / "m.safetensors"))
    with pytest.raises(ConfigError, match="'model.layers.1.mlp.up_proj.weight' holds values beyond f16"):
        load_safetensors(graph, tmp_path)


def test_saved_config_reads_transformers5_keys(saved):
    """What the table's rows were silently running before: every key read, none defaulted."""
    folder, _ = saved("llama-llama3-rope")
    cfg = load_config(str(folder))
    assert cfg.hf["rope_theta"] == 1e6 and cfg.hf["rope_scaling"]["rope_type"] == "llama3"
    folder, _ = saved("qwen3-moe")
    assert load_config(str(folder)).hf["num_experts"] == 6


@pytest.mark.parametrize("change,field", [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                          "long_factor": [1.0] * 8, "original_max_position_embeddings": 64}}, "rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e6}}}, "rope_parameters"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),  # beside rope_parameters
    ({"num_experts": 5}, "num_local_experts"),  # both names, different counts
    ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
])
def test_unmodelled_field_is_refused_by_name(saved, tmp_path, change, field):
    base = "qwen3-moe" if field == "num_local_experts" else "qwen3-sliding" if field == "layer_types" \
        else "llama-attention-bias"
    folder, _ = saved(base)
    hf = json.loads((folder / "config.json").read_text())
    hf.update(change)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    for f in folder.glob("*.safetensors"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ConfigError, match=field):
        workbench_logits(tmp_path)


def test_malformed_safetensors_dtype_is_named(tmp_path):
    from safetensors.numpy import save_file

    from workbench.models import build_graph, preset
    from workbench.models.weights import load_safetensors

    graph = build_graph(preset("llama-tiny", context=16))
    save_file({k: np.zeros(v.shape, np.int32) for k, v in graph.weights.items()}, str(tmp_path / "m.safetensors"))
    with pytest.raises(ConfigError, match="dtype I32"):
        load_safetensors(graph, tmp_path)


def test_decode_is_longer_than_every_window():
    windows = [kw.get("sliding_window") for kw in CHECKPOINTS.values() if kw.get("sliding_window")]
    assert windows and len(TOKENS) > max(windows) + 1


def llama3_rope_freqs(cfg) -> np.ndarray:
    """``rope_freqs`` as llama.cpp's ``convert_hf_to_gguf.py`` (LlamaModel) computes it for a
    llama3 ``rope_scaling``: per rotated pair, the divisor of the base frequency."""
    import math

    sc, base, dim = cfg.hf["rope_scaling"], cfg.hf["rope_theta"], cfg.head_dim
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, lo, hi = sc.get("factor", 8.0), sc.get("low_freq_factor", 1.0), sc.get("high_freq_factor", 4.0)
    old = sc.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def test_llama3_gguf_reads_rope_freqs(saved, tmp_path):
    """A Llama-3 GGUF keeps its rope scaling only as the ``rope_freqs`` tensor: same logits as
    its config.json twin (and transformers) with the same weights."""
    from test_models import write_gguf

    from workbench.exec.reference import run_reference
    from workbench.models import build_graph, from_gguf
    from workbench.models.weights import load_safetensors

    folder, theirs = saved("llama-llama3-rope")
    twin = load_config(str(folder), context=32, weight_dtype="f32", kv_dtype="f32")
    path = tmp_path / "llama3.gguf"
    write_gguf(path, twin, extra={"rope_freqs.weight": llama3_rope_freqs(twin)})
    cfg = from_gguf(path, context=32, weight_dtype="f32", kv_dtype="f32")
    assert cfg.rope_freq_factors is not None and not cfg.hf.get("rope_scaling")
    graph = build_graph(cfg)
    ours = run_reference(cfg, load_safetensors(graph, folder), TOKENS).logits
    assert max_rel_err(ours, workbench_logits(folder)) <= TOL
    assert max_rel_err(ours, theirs) <= TOL
    write_gguf(tmp_path / "plain.gguf", twin)  # without the tensor: a different model, as ggml would run it
    plain = from_gguf(tmp_path / "plain.gguf", context=32, weight_dtype="f32", kv_dtype="f32")
    assert max_rel_err(run_reference(plain, load_safetensors(graph, folder), TOKENS).logits, theirs) > 1e-2


@pytest.mark.parametrize("name", ["llama-mlp-bias", "qwen3-sliding", "qwen3-next"])
def test_checkpoint_under_all_optimizations(saved, name):
    """The biases and sliding masks survive every rewrite: the Plans of ALL_ON (fusions,
    streams, stream-aware allocation) give the same logits, simulate, and verify race-free."""
    import workbench
    from workbench.exec.reference import run_reference
    from workbench.models import build_graph
    from workbench.models.weights import model_weights
    from workbench.strategy import ALL_ON
    from workbench.strategy.steps import plans_for_steps
    from workbench.verify import verify

    folder, theirs = saved(name)
    cfg = load_config(str(folder), context=32, weight_dtype="f32", kv_dtype="f32")
    plans = plans_for_steps(cfg, ALL_ON, len(TOKENS))
    ours = run_reference(cfg, model_weights(cfg, build_graph(cfg)), TOKENS,
                         graph_for=lambda pos: plans[pos].graph).logits
    assert max_rel_err(ours, theirs) <= TOL
    assert verify(plans[-1]).race_free
    assert workbench.run(cfg, ALL_ON, tokens=2, backend="sim", quiet=True).stats["tokens"] == 2
    ref = workbench.run(cfg, ALL_ON, tokens=TOKENS, backend="reference", quiet=True)  # the run path: its weights
    assert max_rel_err(ref.logits, theirs) <= TOL
