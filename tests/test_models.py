"""Model acceptance: full-size graphs (parameter counts, bytes per token), activation scale of
the random weights, and clear errors for bad presets, configs, GGUF and safetensors files."""

from __future__ import annotations

import importlib.util
import json
import tracemalloc

import numpy as np
import pytest

from workbench.exec.memory import Memory
from workbench.exec.reference import execute_graph, load_static
from workbench.models import (
    BUILDERS,
    PRESETS,
    PUBLISHED_PARAMS,
    TINY_PRESETS,
    ConfigError,
    ModelConfig,
    build_graph,
    from_gguf,
    from_hf_config,
    load_config,
    preset,
)
from workbench.models.blocks import step_input_names, step_input_values, write_step_inputs
from workbench.models.config import GGUF_ARCHS, MODEL_TYPES
from workbench.models.rope import rope_params
from workbench.models.weights import load_safetensors, random_weights, save_safetensors

FULL_PRESETS = [n for n in PRESETS if n not in TINY_PRESETS]
MOE_FULL = [n for n in FULL_PRESETS if PRESETS[n]["model_type"] in ("qwen3_moe", "gpt_oss", "qwen3_next")]


def _need_builder(cfg: ModelConfig) -> None:
    """Skip (with the reason) when the family's builder module has not been written yet."""
    module = BUILDERS[cfg.family].split(":")[0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist yet (family {cfg.family!r} is being written separately)")


# -- (a) full-size presets: shapes only -----------------------------------------------------------

@pytest.mark.parametrize("name", FULL_PRESETS)
def test_full_size_graph_matches_published_params(name):
    """Building the full-size graph allocates no weights, and its parameter count is within 2 %
    of the model card."""
    cfg = preset(name)
    _need_builder(cfg)
    tracemalloc.start()
    try:
        graph = build_graph(cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    s = graph.summary()
    assert peak < 64 * 2**20, f"building {name} took {peak / 2**20:.0f} MiB: weights were allocated?"
    assert s["weight_bytes"] > 50 * peak
    published = PUBLISHED_PARAMS[name]
    rel = s["params"] / published - 1
    print(f"{name}: {s['params'] / 1e9:.3f} B params (published {published / 1e9:.2f} B, {rel:+.2%}), "
          f"{s['bytes_per_token'] / 1e9:.3f} GB read per token")
    assert abs(rel) <= 0.02, f"{name}: {s['params']:.4g} params vs published {published:.4g} ({rel:+.2%})"
    assert s["bytes_per_token"] > 0 and s["flops_per_token"] > 0


def _active_weight_bytes(graph) -> float:
    """Weight bytes one token must read: all of each dense tensor, ``k / n_expert`` of each
    expert tensor (``mlp.experts.*``) and one row of the embedding table."""
    cfg = graph.meta["config"]
    k = cfg.get("num_experts_per_tok")
    total = 0.0
    for name, v in graph.weights.items():
        if ".mlp.experts." in name:
            total += v.nbytes * k / v.shape[0]
        elif name == "model.embed_tokens.weight":
            total += v.nbytes / v.shape[0]
        else:
            total += v.nbytes
    return total


@pytest.mark.parametrize("name", MOE_FULL)
def test_moe_bytes_per_token_count_only_active_experts(name):
    """A MoE decode step reads the chosen experts only: the expert matmuls read exactly
    ``k / n_expert`` of each expert tensor, and bytes per token are the active weight bytes
    plus activations, KV rows and recurrent state (a few %), far below the weight size."""
    cfg = preset(name, context=512)
    _need_builder(cfg)
    graph = build_graph(cfg)
    s = graph.summary()
    k = cfg.get("num_experts_per_tok")
    expert_nodes = [n for n in graph.nodes if n.op in ("MUL_MAT_ID", "ADD_ID")]
    # MUL_MAT_ID reads (weights, x); ADD_ID reads (x, biases): what is left is the expert share
    read = sum(n.bytes - n.dst.nbytes - n.srcs[1 if n.op == "MUL_MAT_ID" else 0].nbytes for n in expert_nodes)
    expert_bytes = sum(v.nbytes * k / v.shape[0] for w, v in graph.weights.items() if ".mlp.experts." in w)
    assert read == pytest.approx(expert_bytes, rel=1e-9)
    active = _active_weight_bytes(graph)
    extra = s["bytes_per_token"] - active
    assert 0 <= extra <= 0.1 * active, (name, s["bytes_per_token"], active)
    assert s["bytes_per_token"] < 0.25 * s["weight_bytes"]


# -- (b) activation scale of the seeded random weights --------------------------------------------

#: Narrow widths for the activation-scale test (each applied only where the preset has the field).
NARROW = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=32,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)


def narrowed(name: str, scale: int = 1) -> ModelConfig:
    """The preset at its full depth (layer count, layer types, sliding window, rope, top-k) with
    every width replaced by ``NARROW`` times ``scale`` and at most 16 experts."""
    hf = dict(PRESETS[name])
    for key, width in NARROW.items():
        if key in hf:
            hf[key] = width * scale if key not in ("head_dim", "vocab_size") else width
    for key in ("num_experts", "num_local_experts"):
        if key in hf:
            hf[key] = min(hf[key], 16)
    return ModelConfig(f"{name}-narrow{scale}", hf, context=8)


def residual_rms(cfg: ModelConfig, tokens=(1, 77, 200)) -> list[float]:
    """Run ``tokens`` through the reference with seeded random weights (f16 weights and KV as
    on the GPU); assert every node's output is finite at every step; return the RMS of the
    residual stream after each layer at the last step."""
    graph = build_graph(cfg)
    mem = Memory()
    load_static(graph, mem, random_weights(graph, seed=0))
    for pos, tok in enumerate(tokens):
        for key, value in step_input_values(graph, tok, pos).items():
            mem.write(graph.inputs[key], value)
        execute_graph(graph, mem)
        bad = [n.name for n in graph.nodes if not np.all(np.isfinite(mem.read(n.dst)))]
        assert not bad, f"{cfg.name}: non-finite outputs at step {pos}: {bad[:5]}"
    return [float(np.sqrt(np.mean(mem.read(graph.node(f"l_out-{il}").dst) ** 2))) for il in range(cfg.n_layer)]


@pytest.mark.parametrize("name", FULL_PRESETS)
def test_random_weights_keep_activations_finite_through_all_layers(name):
    """Seeded random weights keep every activation finite and the residual stream O(1) through
    all layers of every full-size preset.

    Run cheaply: the preset's full depth and layer pattern with narrow widths. The initialiser
    draws each projection from N(0, 1/fan_in) (norms near 1, residual writers halved), so the
    variance a layer adds to the residual stream does not depend on the width; depth is what
    could make activations grow, and depth is kept. ``test_activation_scale_is_width_free``
    checks that claim by comparing two widths."""
    cfg = narrowed(name)
    _need_builder(cfg)
    rms = residual_rms(cfg)
    assert max(rms) < 16.0, f"{name}: residual RMS grows to {max(rms):.1f} (per layer: {rms})"


@pytest.mark.parametrize("name,scale", [("llama-3.1-8b", 4), ("qwen3-30b-a3b", 2)])
def test_activation_scale_is_width_free(name, scale):
    """The residual RMS after the last layer barely moves when every width is multiplied by
    ``scale``, which is what lets the test above stand in for the full-width model."""
    narrow, wide = residual_rms(narrowed(name))[-1], residual_rms(narrowed(name, scale=scale))[-1]
    assert 0.67 < wide / narrow < 1.5, (narrow, wide)


# -- (c) clear errors -----------------------------------------------------------------------------

def test_unknown_preset_lists_known_ones():
    for fn in (preset, load_config):
        with pytest.raises(ConfigError, match="unknown model preset 'llama-9000'") as e:
            fn("llama-9000")
        assert all(p in str(e.value) for p in PRESETS)


@pytest.mark.parametrize("name,field", [
    ("llama-tiny", "hidden_size"),
    ("qwen3-moe-tiny", "num_experts_per_tok"),
    ("qwen3-moe-tiny", "moe_intermediate_size"),
    ("gpt-oss-tiny", "intermediate_size"),
    ("gpt-oss-tiny", "num_local_experts"),
])
def test_config_json_missing_field_is_named(tmp_path, name, field):
    hf = dict(PRESETS[name])
    del hf[field]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match=f"{field} is missing: the .* builder needs it"):  # at load
        from_hf_config(tmp_path)


def test_config_json_without_or_with_unknown_model_type(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="no 'model_type'"):
        from_hf_config(path)
    path.write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ConfigError, match="'mamba' is not supported") as e:
        load_config(str(path))
    assert all(t in str(e.value) for t in MODEL_TYPES)


def write_gguf(path, cfg: ModelConfig, arch: str | None = None, skip: tuple[str, ...] = (),
               tensors: bool = True, extra: dict[str, np.ndarray] | None = None) -> None:
    """A metadata GGUF for ``cfg`` with the keys llama.cpp's ``convert_hf_to_gguf.py`` writes
    (plus, with ``tensors``, the embedding and, when untied, output tensors that tell tied from
    untied; without them the vocabulary size is written as a key and the model reads as untied;
    ``extra``: more tensors by GGUF name, e.g. ``rope_freqs.weight``)."""
    import gguf

    hf = cfg.hf
    arch = arch or {v: k for k, v in GGUF_ARCHS.items()}[hf["model_type"]]
    w = gguf.GGUFWriter(str(path), arch)
    keys = {
        "name": cfg.name, "block_count": hf["num_hidden_layers"], "context_length": hf["max_position_embeddings"],
        "embedding_length": hf["hidden_size"], "head_count": hf["num_attention_heads"],
        "head_count_kv": hf["num_key_value_heads"], "key_length": cfg.head_dim, "value_length": cfg.head_dim,
        "layer_norm_rms_eps": hf["rms_norm_eps"], "rope_freq_base": hf["rope_theta"],
        "feed_forward_length": hf["intermediate_size"],
        "rope_dimension_count": int(cfg.head_dim * hf.get("partial_rotary_factor", 1.0)),
    }
    if "num_experts" in hf or "num_local_experts" in hf:
        keys["expert_count"] = hf.get("num_experts", hf.get("num_local_experts"))
        keys["expert_used_count"] = hf["num_experts_per_tok"]
        keys["expert_feed_forward_length"] = hf.get("moe_intermediate_size", hf["intermediate_size"])
    if "sliding_window" in hf:
        keys["sliding_window"] = hf["sliding_window"]
    if (hf.get("rope_scaling") or {}).get("rope_type") == "yarn":
        keys["rope_scaling_type"] = gguf.RopeScalingType.YARN
        keys["rope_scaling_factor"] = hf["rope_scaling"]["factor"]
        keys["rope_scaling_orig_ctx_len"] = hf["rope_scaling"]["original_max_position_embeddings"]
    if hf["model_type"] == "qwen3_next":
        keys.update(ssm_conv_kernel=hf["linear_conv_kernel_dim"], ssm_state_size=hf["linear_key_head_dim"],
                    ssm_group_count=hf["linear_num_key_heads"], ssm_time_step_rank=hf["linear_num_value_heads"],
                    ssm_inner_size=hf["linear_value_head_dim"] * hf["linear_num_value_heads"],
                    full_attention_interval=hf["full_attention_interval"],
                    expert_shared_feed_forward_length=hf["shared_expert_intermediate_size"])
    for key, value in keys.items():
        if key not in skip:
            getattr(w, f"add_{key}")(value)
    if tensors:
        w.add_token_list([f"t{i}" for i in range(hf["vocab_size"])])
        w.add_tensor("token_embd.weight", np.zeros((hf["vocab_size"], hf["hidden_size"]), np.float16))
        if not hf.get("tie_word_embeddings", False):
            w.add_tensor("output.weight", np.zeros((hf["vocab_size"], hf["hidden_size"]), np.float16))
        for name, value in (extra or {}).items():
            w.add_tensor(name, value)
    else:
        w.add_vocab_size(hf["vocab_size"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_gguf_of_supported_arch_yields_the_config(tmp_path, name):
    """Every field from_gguf derives equals the preset's, and (where the family builder
    exists) the graph has the same weights with the same shapes and the same RoPE."""
    cfg = preset(name)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, cfg)
    got = load_config(str(path), context=64)
    assert got.name == name and got.context == 64
    llama3_rope = (cfg.hf.get("rope_scaling") or {}).get("rope_type") == "llama3"  # a tensor in GGUF
    differ = {k: (v, cfg.hf.get(k)) for k, v in got.hf.items()
              if k in cfg.hf and v != cfg.hf[k] and not (k == "rope_scaling" and llama3_rope)}
    assert not differ, differ
    missing = {"num_experts", "num_local_experts", "moe_intermediate_size", "sliding_window", "layer_types",
               "linear_num_value_heads", "partial_rotary_factor", "full_attention_interval"} & set(cfg.hf) - set(got.hf)
    assert not missing
    _need_builder(cfg)
    want, have = build_graph(cfg), build_graph(got.with_(context=cfg.context))
    assert {k: v.shape for k, v in have.weights.items()} == {k: v.shape for k, v in want.weights.items()}
    if not llama3_rope:
        np.testing.assert_array_equal(rope_params(got)[0], rope_params(cfg)[0])


def test_gguf_full_size_moe_params(tmp_path):
    """The GGUF route gives the same parameter count as the preset for the full-size MoE models."""
    for name in ("qwen3-30b-a3b", "gpt-oss-20b"):
        path = tmp_path / f"{name}.gguf"
        write_gguf(path, preset(name).with_(layers=2), tensors=False)
        got = from_gguf(path)
        assert build_graph(got).summary()["params"] == build_graph(preset(name, layers=2)).summary()["params"]


def test_gguf_of_unsupported_arch_names_it(tmp_path):
    path = tmp_path / "mamba.gguf"
    write_gguf(path, preset("llama-tiny"), arch="mamba")
    with pytest.raises(ConfigError, match="architecture 'mamba' is not supported") as e:
        load_config(str(path))
    assert all(a in str(e.value) for a in GGUF_ARCHS)


def test_gguf_missing_key_and_bad_files(tmp_path):
    path = tmp_path / "moe.gguf"
    write_gguf(path, preset("qwen3-moe-tiny"), skip=("expert_count",))
    with pytest.raises(ConfigError, match="'qwen3moe.expert_count' is missing"):
        from_gguf(path)
    with pytest.raises(ConfigError, match="no GGUF file at"):
        from_gguf(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 4)
    with pytest.raises(ConfigError, match="not a readable GGUF file"):
        from_gguf(junk)


# -- safetensors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt-oss-tiny", "qwen3-moe-tiny", "llama-tiny"])
def test_safetensors_round_trip(tmp_path, name):
    cfg = preset(name, context=16)
    graph = build_graph(cfg)
    weights = random_weights(graph, seed=3)
    save_safetensors(weights, graph, tmp_path / "model.safetensors")
    loaded = load_safetensors(graph, tmp_path)
    assert loaded.keys() == weights.keys()
    for k in weights:
        assert loaded[k].dtype == weights[k].dtype and np.array_equal(loaded[k], weights[k]), k


def test_safetensors_missing_or_misshaped_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    graph = build_graph(preset("gpt-oss-tiny", context=16))
    save_safetensors(random_weights(graph), graph, tmp_path / "full.safetensors")
    tensors = load_file(str(tmp_path / "full.safetensors"))
    name = "model.layers.1.mlp.experts.gate_up_proj"

    partial = {k: v for k, v in tensors.items() if k != name}
    save_file(partial, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ConfigError, match=rf"tensor '{name}' is missing \(expected shape \[8, 64, 64\]\)"):
        load_safetensors(graph, tmp_path / "partial.safetensors")

    bad = dict(tensors, **{"model.layers.0.mlp.experts.down_proj": np.zeros((8, 64, 32), np.float32)})
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ConfigError, match=r"'model.layers.0.mlp.experts.down_proj' has shape \[8, 64, 32\], "
                                          r"the graph expects \[8, 32, 64\]"):
        load_safetensors(graph, tmp_path / "bad.safetensors")


def test_preset_configs_do_not_share_nested_dicts():
    """transformers writes into the ``rope_scaling`` dict it is given; presets must not change."""
    cfg = preset("gpt-oss-tiny")
    cfg.hf["rope_scaling"]["rope_theta"] = 1.0
    cfg.with_(layers=1).hf["rope_scaling"]["factor"] = 2.0
    assert PRESETS["gpt-oss-tiny"]["rope_scaling"] == preset("gpt-oss-tiny").hf["rope_scaling"]
    assert "rope_theta" not in PRESETS["gpt-oss-tiny"]["rope_scaling"]


@pytest.mark.parametrize("name", ["llama-tiny", "gpt-oss-tiny"])
def test_step_inputs_are_written_in_place(name):
    """The cuda executor writes each token's inputs into the same staging views: every value
    (the sliding-window ring's included, past its wrap) is the fresh arrays', in the views
    themselves, with nothing of the previous token left."""
    graph = build_graph(preset(name, context=1024))  # gpt-oss: a ring of 768 rows, its own index
    names = step_input_names(graph)
    assert set(names) <= set(graph.inputs) and {"inp_tokens", "inp_pos", "kq_mask"} <= set(names)
    views = {k: np.full(graph.inputs[k].shape, 7, step_input_values(graph, 0, 0)[k].dtype) for k in names}
    ids = {k: id(v) for k, v in views.items()}
    for pos in (0, 5, 700, 900, 1023, 2):  # 900, 1023: past the ring's wrap
        write_step_inputs(graph, 11 + pos, pos, views)
        fresh = step_input_values(graph, 11 + pos, pos)
        assert {k: id(v) for k, v in views.items()} == ids
        for k in names:
            np.testing.assert_array_equal(views[k], fresh[k], err_msg=f"{name} {k} at {pos}")
