"""Presets: the published ``config.json`` fields of real models, and tiny twins for tests.

Full-size presets copy the shape-defining fields of the models' Hugging Face configs; the
published parameter counts are kept beside them so a test can check the graph against them.
"""

from __future__ import annotations

from typing import Any

from .config import ConfigError, ModelConfig
from .hf_keys import canonical

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict[str, Any]] = {
    # -- dense Llama ---------------------------------------------------------------------------
    "llama-3.2-1b": dict(
        model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={**_LLAMA3_ROPE, "factor": 32.0}, tie_word_embeddings=True),
    "llama-3.1-8b": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={**_LLAMA3_ROPE, "factor": 8.0}, tie_word_embeddings=False),
    "llama-tiny": dict(
        model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=160,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=2048,
        rope_scaling={**_LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 256},
        tie_word_embeddings=False),
    # -- Qwen3 (q/k RMSNorm) -------------------------------------------------------------------
    "qwen3-0.6b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=True),
    "qwen3-8b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False),
    "qwen3-tiny": dict(
        model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=2048, tie_word_embeddings=True),
    # -- MoE -----------------------------------------------------------------------------------
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
        tie_word_embeddings=False),
    "qwen3-moe-tiny": dict(
        model_type="qwen3_moe", vocab_size=256, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=2048,
        tie_word_embeddings=False),
    "gpt-oss-20b": dict(
        model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
        num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        num_local_experts=32, num_experts_per_tok=4, experts_per_token=4, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12, attention_bias=True, swiglu_limit=7.0,
        rms_norm_eps=1e-5, rope_theta=150000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 4096},
        tie_word_embeddings=False),
    "gpt-oss-tiny": dict(
        model_type="gpt_oss", vocab_size=256, hidden_size=64, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=8, num_experts_per_tok=2, experts_per_token=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], attention_bias=True, swiglu_limit=7.0,
        rms_norm_eps=1e-5, rope_theta=150000.0, max_position_embeddings=2048,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "original_max_position_embeddings": 64},
        tie_word_embeddings=False),
    # -- hybrid gated delta net ----------------------------------------------------------------
    "qwen3-next-80b-a3b": dict(
        model_type="qwen3_next", vocab_size=151936, hidden_size=2048, intermediate_size=5120,
        moe_intermediate_size=512, shared_expert_intermediate_size=512, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, partial_rotary_factor=0.25,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
        num_experts=512, num_experts_per_tok=10, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=10000000.0, max_position_embeddings=262144,
        tie_word_embeddings=False),
    "qwen3-next-tiny": dict(
        model_type="qwen3_next", vocab_size=256, hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.25,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=4,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, rope_theta=10000000.0, max_position_embeddings=2048,
        tie_word_embeddings=False),
}

#: Published total parameter counts (model cards), for the 2 % check.
PUBLISHED_PARAMS: dict[str, float] = {
    "llama-3.2-1b": 1.24e9,
    "llama-3.1-8b": 8.03e9,
    "qwen3-0.6b": 0.6e9,
    "qwen3-8b": 8.2e9,
    "qwen3-30b-a3b": 30.5e9,
    "gpt-oss-20b": 20.91e9,
    "qwen3-next-80b-a3b": 80e9,
}

TINY_PRESETS = ("llama-tiny", "qwen3-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "qwen3-next-tiny")


def preset(name: str, *, layers: int | None = None, context: int | None = None,
           weight_dtype: str | None = None, kv_dtype: str | None = None, swa_full: bool | None = None,
           n_ubatch: int | None = None) -> ModelConfig:
    """A preset by name with optional ``--layers`` / ``--context`` (etc.) overrides."""
    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)} "
                          "(or pass a config.json / .gguf path)")
    cfg = ModelConfig(name, canonical(PRESETS[name], name))  # a copy: callers (transformers) may mutate it
    return cfg.with_(layers=layers, context=context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                     swa_full=swa_full, n_ubatch=n_ubatch)


def load_config(spec: str, **overrides) -> ModelConfig:
    """Resolve ``--model``: a preset name, a ``config.json`` (or folder holding one), or a ``.gguf``."""
    from pathlib import Path

    from .config import from_gguf, from_hf_config

    overrides = {k: v for k, v in overrides.items() if v is not None}
    if spec in PRESETS:
        return preset(spec, **overrides)
    p = Path(spec)
    if p.suffix == ".gguf":
        return from_gguf(p, **overrides)
    if p.suffix == ".json" or p.is_dir():
        return from_hf_config(p, **overrides)
    return preset(spec, **overrides)  # raises the "unknown preset" error with the list
