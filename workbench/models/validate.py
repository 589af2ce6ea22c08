"""Check a ModelConfig before any builder reads it: the type and range of every field a family
builder reads and the relations between them (heads dividing the hidden size, KV heads
dividing heads, top-k within the expert count, ...).

Why here and not in the builders: a bad ``config.json`` used to surface as a ZeroDivisionError
deep in ``head_dim``, or worse, as a graph of negative shapes that simulated with plausible
timings. One pass at load time turns each into a one-line ``ConfigError`` naming the field,
its value and what is allowed. Fields are read through ``ModelConfig.get`` so that however the
Hugging Face keys are read, the values checked are the ones the builders will see.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .hf_keys import ROPE_TYPES

if TYPE_CHECKING:
    from .config import ModelConfig

#: Largest size a shape field may have: ggml and our kernels index a dimension with 32 bits.
MAX_DIM = 2**31 - 1
#: Storage dtypes a config may ask for (weights and KV cache).
FLOAT_DTYPES = ("f32", "f16", "bf16")
#: ggml block types the weights may be stored in (``workbench.models.weight_types``).
WEIGHT_QTYPES = ("q8_0", "q4_0", "q4_k", "mxfp4")
#: block types only read from GGUF files (no quantiser: ``--weight-dtype`` does not offer them)
READ_QTYPES = ("q6_k",)

#: Shape fields every family reads (integers >= 1).
COMMON_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
#: Per family (ModelConfig.family): further integer fields >= 1 the builder requires.
FAMILY_SIZES: dict[str, tuple[str, ...]] = {
    "llama": ("intermediate_size",),
    "qwen3": ("intermediate_size",),
    "moe": ("num_experts_per_tok",),
    "gdn": ("moe_intermediate_size", "shared_expert_intermediate_size", "num_experts_per_tok",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim"),
}
#: Optional boolean switches (a JSON string "false" would otherwise read as true).
BOOLS = ("tie_word_embeddings", "attention_bias", "norm_topk_prob")
#: Per HF model_type: the values ``layer_types`` may hold.
LAYER_TYPES = {"gpt_oss": ("sliding_attention", "full_attention"),
               "qwen3_next": ("linear_attention", "full_attention")}


class InvalidField(ConfigError):
    """A field of a config out of type or range; ``detail`` is the message without the config's
    name, for callers that name the input themselves (``--model path``)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"config {name}: {detail}")
        self.detail = detail


def validate_config(cfg: ModelConfig) -> None:
    """Raise ``ConfigError`` on the first field a builder could not use; return otherwise."""
    v = _Checker(cfg)
    v.choice("weight_dtype", cfg.weight_dtype, FLOAT_DTYPES + WEIGHT_QTYPES + READ_QTYPES)
    v.choice("kv_dtype", cfg.kv_dtype, FLOAT_DTYPES)
    v.integer("context", cfg.context, lo=1)
    family = cfg.family  # raises for an unsupported model_type
    for key in COMMON_SIZES + FAMILY_SIZES[family]:
        v.size(key)
    v.positive_float("rms_norm_eps", required=True, hi=1.0)
    for key in BOOLS:
        v.boolean(key)
    _attention(v)
    _rope(v)
    per_type = {"qwen3_moe": _sparse_layers, "gpt_oss": _gpt_oss, "qwen3_next": _qwen3_next}
    if cfg.model_type in per_type:
        per_type[cfg.model_type](v)


class _Checker:
    """Typed reads of a config's fields that raise ``ConfigError`` naming field, value and range."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def fail(self, key: str, value: Any, allowed: str) -> None:
        what = "is missing" if value is None else f"{_show(value)} is invalid"
        raise InvalidField(self.cfg.name, f"{key} {what}: {allowed}")

    def has(self, key: str) -> bool:
        return self.cfg.get(key, None) is not None

    def value(self, key: str, required: bool) -> Any:
        value = self.cfg.get(key, None)
        if value is None and required:
            self.fail(key, None, f"the {self.cfg.model_type} builder needs it; add it to config.json")
        return value

    def integer(self, key: str, value: Any, lo: int = 1, hi: int = MAX_DIM) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(key, value, f"must be an integer in [{lo}, {hi}]")
        return value

    def size(self, key: str, required: bool = True, lo: int = 1) -> int | None:
        value = self.value(key, required)
        return None if value is None else self.integer(key, value, lo)

    def number(self, key: str, required: bool = False) -> float | None:
        value = self.value(key, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self.fail(key, value, "must be a finite number")
        return float(value)

    def positive_float(self, key: str, required: bool = False, hi: float = math.inf) -> float | None:
        value = self.number(key, required)
        if value is not None and not 0 < value <= hi:
            self.fail(key, value, "must be a number > 0" if hi == math.inf else f"must be a number in (0, {hi:g}]")
        return value

    def boolean(self, key: str) -> None:
        value = self.value(key, False)
        if value is not None and not isinstance(value, bool):
            self.fail(key, value, "must be true or false")

    def choice(self, key: str, value: Any, allowed: tuple[str, ...]) -> None:
        if value not in allowed:
            self.fail(key, value, f"must be one of {', '.join(allowed)}")

    def int_list(self, key: str, lo: int, hi: int) -> list[int]:
        value = self.value(key, False)
        if value is None:
            return []
        if not isinstance(value, list | tuple) or any(isinstance(x, bool) or not isinstance(x, int) or
                                                       not lo <= x <= hi for x in value):
            self.fail(key, value, f"must be a list of integers in [{lo}, {hi}]")
        return list(value)


def _show(value: Any) -> str:
    """The value as the user wrote it, its type named when that is the problem, kept short."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return text if number else f"{text} ({type(value).__name__})"


def _attention(v: _Checker) -> None:
    """Head counts and head_dim: the relations ``ModelConfig.head_dim`` and the KV cache rely on."""
    hidden, heads, kv_heads = (v.cfg.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    head_dim = v.size("head_dim", required=False)
    if head_dim is None and hidden % heads:
        v.fail("num_attention_heads", heads, f"must divide hidden_size {hidden} when no head_dim is given "
               f"({hidden} / {heads} = {hidden / heads:.3g}); set head_dim or change the head count")
    if heads % kv_heads:
        v.fail("num_key_value_heads", kv_heads, f"must divide num_attention_heads {heads} (grouped-query attention)")


def _rope(v: _Checker) -> None:
    """RoPE fields: the rotated dims must be a positive even count and each scaling complete."""
    theta = v.positive_float("rope_theta")
    if theta is not None and theta <= 1:
        v.fail("rope_theta", theta, "must be a number > 1 (the RoPE base)")
    factor = v.positive_float("partial_rotary_factor", hi=1.0)
    v.size("max_position_embeddings", required=False)
    head_dim = v.cfg.head_dim
    n_rot = int(head_dim * (factor if factor is not None else 1.0))
    if n_rot < 2 or n_rot % 2:
        v.fail("partial_rotary_factor" if factor is not None else "head_dim", factor or head_dim,
               f"rotates {n_rot} of {head_dim} head dims; RoPE needs an even count >= 2")
    scaling = v.value("rope_scaling", False)
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        v.fail("rope_scaling", scaling, "must be an object such as {\"rope_type\": \"yarn\", \"factor\": 32}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        v.fail("rope_scaling.rope_type", kind, f"must be one of {', '.join(ROPE_TYPES)}")
    if kind == "default":
        return
    needed = {"llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
              "yarn": ("factor",), "linear": ("factor",)}[kind]
    for key in needed + ("beta_fast", "beta_slow", "attention_factor"):
        value = scaling.get(key)
        if value is None and key in needed:
            v.fail(f"rope_scaling.{key}", None, f"rope_type {kind} needs it")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not math.isfinite(value) or value <= 0):
            v.fail(f"rope_scaling.{key}", value, "must be a number > 0")
    if kind == "llama3" and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        v.fail("rope_scaling.high_freq_factor", scaling["high_freq_factor"],
               f"must be greater than low_freq_factor {scaling['low_freq_factor']}")
    if kind == "yarn" and scaling.get("original_max_position_embeddings") is None and \
            not v.has("max_position_embeddings"):
        v.fail("rope_scaling.original_max_position_embeddings", None,
               "rope_type yarn needs it when max_position_embeddings is not given")


def _experts(v: _Checker, count_key: str, lo: int) -> None:
    """An expert count and its top-k: 1 <= num_experts_per_tok <= experts."""
    n = v.size(count_key, lo=lo)
    k = v.cfg.get("num_experts_per_tok")
    if n is not None and n > 0 and k > n:
        v.fail("num_experts_per_tok", k, f"must be in [1, {count_key} {n}]")
    other = v.value("experts_per_token", False)  # gpt-oss writes its top-k twice; both must agree
    if other is not None and other != k:
        v.fail("experts_per_token", other, f"must equal num_experts_per_tok {k}")


def _sparse_layers(v: _Checker) -> None:
    """Qwen3-MoE style layer selection; a dense layer needs ``intermediate_size``."""
    _experts(v, "num_experts", lo=0)
    v.size("moe_intermediate_size")
    step = v.size("decoder_sparse_step", required=False)
    dense_layers = v.int_list("mlp_only_layers", 0, MAX_DIM)  # entries past a --layers cut are harmless
    if dense_layers or (step or 1) > 1 or v.cfg.get("num_experts") == 0:
        v.size("intermediate_size")


def _layer_types(v: _Checker) -> None:
    types = v.value("layer_types", False)
    if types is None:
        return
    allowed = LAYER_TYPES[v.cfg.model_type]
    n_layer = v.cfg.get("num_hidden_layers")
    if not isinstance(types, list | tuple) or any(t not in allowed for t in types):
        v.fail("layer_types", types, f"must be a list of {' / '.join(allowed)}")
    if len(types) != n_layer:
        v.fail("layer_types", types, f"has {len(types)} entries; give one per layer (num_hidden_layers {n_layer})")


def _gpt_oss(v: _Checker) -> None:
    v.size("intermediate_size")
    _experts(v, "num_local_experts", lo=1)
    v.size("sliding_window")
    v.positive_float("swiglu_limit", required=True)
    v.positive_float("swiglu_alpha")
    _layer_types(v)


def _qwen3_next(v: _Checker) -> None:
    _sparse_layers(v)
    v.size("full_attention_interval", required=False)
    h_k, h_v = v.cfg.get("linear_num_key_heads"), v.cfg.get("linear_num_value_heads")
    if h_v % h_k:
        v.fail("linear_num_value_heads", h_v, f"must be a multiple of linear_num_key_heads {h_k}")
    _layer_types(v)
