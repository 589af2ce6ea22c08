"""Hugging Face config keys of both ``transformers`` generations, read into one form.

transformers 5 writes RoPE settings under ``rope_parameters`` (``rope_theta``, ``rope_type``,
``partial_rotary_factor`` and the scaling fields in one dict), names Qwen3-MoE's expert count
``num_local_experts`` and spells out ``layer_types``; checkpoints on the Hub from before write
``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor`` at the top level and
``num_experts``. :func:`canonical` turns either into the older, flat form the builders (and
the presets) read, fills what a config leaves out with the value the ``transformers`` class
would use, and refuses (:class:`ConfigError` naming the field) any field that changes the
math and that the graphs do not model: a checkpoint runs as the same model or not at all.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ConfigError

#: RoPE types the graphs rotate with (:func:`workbench.models.rope.rope_params`).
ROPE_TYPES = ("default", "linear", "llama3", "yarn")

#: Fields a ``transformers`` config class fills when config.json leaves them out, per
#: model_type, for the fields our builders read with a default (the others are required).
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048, attention_bias=False,
                  mlp_bias=False, tie_word_embeddings=False, hidden_act="silu"),
    "qwen3": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768, head_dim=128,
                  attention_bias=False, use_sliding_window=False, sliding_window=4096, max_window_layers=28,
                  tie_word_embeddings=False, hidden_act="silu"),
    "qwen3_moe": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768, attention_bias=False,
                      use_sliding_window=False, sliding_window=4096, decoder_sparse_step=1, norm_topk_prob=False,
                      mlp_only_layers=[], tie_word_embeddings=False, hidden_act="silu"),
    "gpt_oss": dict(rms_norm_eps=1e-5, rope_theta=150000.0, max_position_embeddings=131072, head_dim=64,
                    sliding_window=128, attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0,
                    tie_word_embeddings=False,
                    rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                  "truncate": False, "original_max_position_embeddings": 4096}),
    "qwen3_next": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768, head_dim=256,
                       partial_rotary_factor=0.25, attention_bias=False, decoder_sparse_step=1, norm_topk_prob=True,
                       mlp_only_layers=[], tie_word_embeddings=False, hidden_act="silu"),
}

#: The expert-count name each family's builder reads; the other spelling is accepted too
#: (transformers 5 writes Qwen3-MoE's as ``num_local_experts``, older configs ``num_experts``).
_EXPERT_COUNT = {"qwen3_moe": "num_experts", "qwen3_next": "num_experts", "gpt_oss": "num_local_experts"}


def _rope_from_parameters(hf: dict[str, Any], name: str) -> None:
    """``rope_parameters`` (transformers 5) -> ``rope_theta`` / ``rope_scaling`` /
    ``partial_rotary_factor`` (flat, transformers 4), in place."""
    params = hf.pop("rope_parameters", None)
    if not params:
        return
    params = dict(params)
    kinds = set(hf.get("layer_types") or []) | {"full_attention", "sliding_attention", "linear_attention"}
    nested = [k for k in params if k in kinds and isinstance(params[k], dict)]
    if nested:  # one dict per layer type: fine while they are all the same
        first = params[nested[0]]
        if any(params[k] != first for k in nested):
            raise ConfigError(f"config {name!r}: rope_parameters differ per layer type ({', '.join(nested)}); "
                              "per-layer RoPE is not modelled")
        params = dict(first)
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in params:
            if hf.get(key) is not None and hf[key] != params[key]:
                raise ConfigError(f"config {name!r}: {key} is {hf[key]} but rope_parameters.{key} is "
                                  f"{params[key]}; keep one")
            hf[key] = params.pop(key)
    if hf.get("rope_scaling"):
        raise ConfigError(f"config {name!r} has both rope_scaling and rope_parameters; keep one")
    hf["rope_scaling"] = params  # {"rope_type": "default"} kept: it overrides gpt-oss's yarn default


def canonical(hf: dict[str, Any], name: str) -> dict[str, Any]:
    """The flat (transformers 4) form of a config dict of either generation, with the
    ``transformers`` defaults filled in; raises ConfigError for unmodelled math (see module doc)."""
    hf = copy.deepcopy(hf)
    mt = hf.get("model_type")
    _rope_from_parameters(hf, name)
    expert_key = _EXPERT_COUNT.get(mt)
    if expert_key:
        other = "num_local_experts" if expert_key == "num_experts" else "num_experts"
        if hf.get(other) is not None:
            if hf.get(expert_key) is not None and hf[expert_key] != hf[other]:
                raise ConfigError(f"config {name!r}: {expert_key} ({hf[expert_key]}) and {other} ({hf[other]}) "
                                  "disagree; keep one")
            hf[expert_key] = hf.pop(other)
    for key, value in HF_DEFAULTS.get(mt, {}).items():
        if hf.get(key) is None:
            hf[key] = copy.deepcopy(value)
    scaling = hf.get("rope_scaling")
    if scaling:
        scaling = hf["rope_scaling"] = dict(scaling)
        kind = scaling.pop("type", None)
        scaling.setdefault("rope_type", kind or "default")
        if scaling["rope_type"] not in ROPE_TYPES:
            raise ConfigError(f"config {name!r}: rope_scaling.rope_type {scaling['rope_type']!r} is not modelled "
                              f"(supported: {', '.join(ROPE_TYPES)})")
        elif scaling["rope_type"] in ("llama3", "yarn"):  # transformers 5 moves the pretraining length here
            scaling.setdefault("original_max_position_embeddings",
                               hf.get("original_max_position_embeddings") or hf.get("max_position_embeddings"))
    if hf.get("num_key_value_heads") is None and hf.get("num_attention_heads") is not None:
        hf["num_key_value_heads"] = hf["num_attention_heads"]
    if mt == "gpt_oss" and "experts_per_token" in hf and hf.get("num_experts_per_tok") is None:
        hf["num_experts_per_tok"] = hf["experts_per_token"]
    _refuse_unmodelled(hf, name)
    return hf


def _refuse_unmodelled(hf: dict[str, Any], name: str) -> None:
    mt = hf.get("model_type")
    if mt != "gpt_oss" and hf.get("hidden_act", "silu") != "silu":  # gpt-oss's experts ignore hidden_act
        raise ConfigError(f"config {name!r}: hidden_act {hf['hidden_act']!r} is not modelled (only 'silu')")
    scaling = hf.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3" and hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"config {name!r}: llama3 rope scaling with partial_rotary_factor is not modelled")
    types = hf.get("layer_types") if mt in ("qwen3", "gpt_oss", "qwen3_next") else None  # others ignore it
    allowed = {"qwen3_next": {"linear_attention", "full_attention"}}.get(mt, {"full_attention", "sliding_attention"})
    if types is not None:
        bad = sorted(set(types) - allowed)
        if bad:
            raise ConfigError(f"config {name!r}: layer_types has {bad}; {mt} layers are {sorted(allowed)}")
        n_layers = hf.get("num_hidden_layers")
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ConfigError(f"config {name!r}: layer_types must be a list of layer type names, got {types!r}")
        if isinstance(n_layers, int) and len(types) < n_layers:
            raise ConfigError(f"config {name!r}: layer_types lists {len(types)} layers, num_hidden_layers is "
                              f"{hf['num_hidden_layers']}")


def sliding_window(hf: dict[str, Any]) -> int | None:
    """The window of the sliding-attention layers, None when no layer slides (Qwen3's
    ``sliding_window`` only counts with ``use_sliding_window``, as in its config class)."""
    mt = hf.get("model_type")
    if mt in ("qwen3", "qwen3_moe") and not hf.get("use_sliding_window"):
        return None
    if mt not in ("qwen3", "qwen3_moe", "gpt_oss"):
        return None
    window = hf.get("sliding_window")
    return int(window) if window is not None else None


def sliding_layers(hf: dict[str, Any]) -> list[bool]:
    """Per layer: does it attend through the sliding-window mask? (HF: ``layer_types``; Qwen3
    without it: layers from ``max_window_layers`` on; Qwen3-MoE: every layer; gpt-oss: even layers.)"""
    n = int(hf["num_hidden_layers"])
    if sliding_window(hf) is None:
        return [False] * n
    mt, types = hf.get("model_type"), hf.get("layer_types")
    if mt == "qwen3_moe":  # its model builds one sliding mask for all layers
        return [True] * n
    if types is None:
        if mt == "qwen3":
            return [il >= int(hf.get("max_window_layers", 28)) for il in range(n)]
        types = ["sliding_attention" if il % 2 == 0 else "full_attention" for il in range(n)]
    return [t == "sliding_attention" for t in list(types)[:n]]
