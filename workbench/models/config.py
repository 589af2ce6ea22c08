"""Model configurations: presets, Hugging Face ``config.json`` and GGUF metadata.

A ModelConfig keeps the Hugging Face config dict as the single source of truth (so the same
dict builds our graph and the ``transformers`` model of the parity tests) plus the run-time
choices the workbench adds: context length, a layer override and storage dtypes.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .hf_keys import canonical
from .validate import validate_config

#: Hugging Face ``model_type`` -> workbench family.
MODEL_TYPES = {
    "llama": "llama",
    "qwen3": "qwen3",
    "qwen3_moe": "moe",
    "gpt_oss": "moe",
    "qwen3_next": "gdn",
}

#: GGUF ``general.architecture`` -> Hugging Face ``model_type``.
GGUF_ARCHS = {"llama": "llama", "qwen3": "qwen3", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
              "qwen3next": "qwen3_next"}

#: ggml pads the KV length it attends over to this many rows so graphs keep their shape.
KV_PAD = 256


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hf: dict[str, Any] = field(hash=False, compare=False)
    context: int = 512
    weight_dtype: str = "f16"
    kv_dtype: str = "f16"
    #: ggml's ``rope_freqs`` tensor (a Llama-3 GGUF's rope scaling): per rotated pair, the
    #: divisor of the base frequency; None: the frequencies follow ``rope_scaling``.
    rope_freq_factors: tuple[float, ...] | None = None
    #: the folder the config was read from (its safetensors are the weights), if any.
    source: str | None = None
    #: llama.cpp's ``--swa-full``: sliding-window layers keep a full-context KV cache instead
    #: of the iSWA ring of ``window + n_ubatch`` rows (padded to 256) llama.cpp keeps by default.
    swa_full: bool = False
    #: llama.cpp's ``-ub`` (micro-batch), which sizes the iSWA ring.
    n_ubatch: int = 512
    #: per weight (HF name), the ggml type a GGUF stores it in; None: ``weight_dtype`` and the
    #: rules of ``workbench.models.weight_types``.
    tensor_types: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        validate_config(self)  # every way of making a config (preset, config.json, GGUF, with_) passes here

    @property
    def model_type(self) -> str:
        return self.get("model_type")

    @property
    def family(self) -> str:
        mt = self.model_type
        if mt not in MODEL_TYPES:
            raise ConfigError(f"{self.name}: model_type {mt!r} is not supported; supported: {sorted(MODEL_TYPES)}")
        return MODEL_TYPES[mt]

    def get(self, key: str, default: Any = ...) -> Any:
        """A field of the HF config; a clear error names a missing required one."""
        if key in self.hf and self.hf[key] is not None:
            return self.hf[key]
        if default is ...:
            raise ConfigError(f"config {self.name!r} is missing field {key!r} (needed by the "
                              f"{self.hf.get('model_type', '?')} builder); add it to config.json")
        return default

    @property
    def n_layer(self) -> int:
        return int(self.get("num_hidden_layers"))

    @property
    def head_dim(self) -> int:
        return int(self.get("head_dim", self.get("hidden_size") // self.get("num_attention_heads")))

    def kv_len(self, pos: int) -> int:
        """Rows of the KV cache a step at ``pos`` attends over (ggml's padded n_kv)."""
        if pos >= self.context:
            raise ConfigError(f"position {pos} is past the context ({self.context}); raise --context")
        return min(self.context, -(-(pos + 1) // KV_PAD) * KV_PAD)

    def with_(self, *, layers: int | None = None, context: int | None = None,
              weight_dtype: str | None = None, kv_dtype: str | None = None,
              swa_full: bool | None = None, n_ubatch: int | None = None) -> ModelConfig:
        """A copy with run-time overrides (``--layers``, ``--context``, ``--swa-full``, ``-ub``)."""
        hf = copy.deepcopy(self.hf)
        if layers is not None:
            if layers < 1:
                raise ConfigError(f"--layers must be >= 1, got {layers}")
            hf["num_hidden_layers"] = int(layers)
            for key in ("layer_types",):  # a periodic per-layer pattern: cut or repeat it
                if hf.get(key):
                    pattern = list(hf[key])
                    hf[key] = [pattern[i % len(pattern)] for i in range(layers)]
        new = replace(self, hf=hf)
        if context is not None:
            if context < 1:
                raise ConfigError(f"--context must be >= 1, got {context}")
            new = replace(new, context=int(context))
        if weight_dtype is not None and weight_dtype != new.weight_dtype:
            new = replace(new, weight_dtype=weight_dtype, tensor_types=None)  # a GGUF's own types no more
        if kv_dtype is not None:
            new = replace(new, kv_dtype=kv_dtype)
        if swa_full is not None:
            new = replace(new, swa_full=bool(swa_full))
        if n_ubatch is not None:
            if n_ubatch < 1:
                raise ConfigError(f"n_ubatch must be >= 1, got {n_ubatch}")
            new = replace(new, n_ubatch=int(n_ubatch))
        return new


def from_hf_config(source: str | Path | dict[str, Any], name: str | None = None, **runtime: Any) -> ModelConfig:
    """A ModelConfig from a Hugging Face ``config.json`` (path or dict)."""
    if isinstance(source, dict):
        hf = copy.deepcopy(source)
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        try:
            hf = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"no config.json at {path}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(hf, dict):
            raise ConfigError(f"{path} holds a JSON {type(hf).__name__}; expected an object of config fields")
        name = name or path.parent.name
    if "model_type" not in hf:
        raise ConfigError(f"config {name or '?'} has no 'model_type'; expected one of {sorted(MODEL_TYPES)}")
    if hf.get("model_type") not in MODEL_TYPES:
        raise ConfigError(f"model_type {hf['model_type']!r} is not supported; supported: {sorted(MODEL_TYPES)}")
    hf.pop("architectures", None)
    name = name or hf["model_type"]
    source = None if isinstance(source, dict) else str(path.parent)
    cfg = ModelConfig(name, canonical(hf, name), source=source)
    return cfg.with_(**runtime) if runtime else cfg


def from_gguf(path: str | Path, **runtime: Any) -> ModelConfig:
    """A ModelConfig from a GGUF file's metadata (shapes only; the ``gguf`` package reads it).

    The inverse of llama.cpp's ``convert_hf_to_gguf.py`` for the supported architectures: the
    keys it writes become the Hugging Face fields our builders (and ``transformers``) read, and
    what it leaves implicit is filled the way llama.cpp's loader does (gpt-oss: every other
    layer sliding-window, YaRN rope; qwen3moe: renormalised top-k; a missing ``output.weight``
    means tied embeddings). Llama-3 GGUFs carry their rope scaling as a ``rope_freqs`` tensor
    rather than metadata: its values become ``ModelConfig.rope_freq_factors`` (ggml's frequency
    factors, applied by ``workbench.models.rope``), so the config rotates exactly as llama.cpp does.
    ``ModelConfig.source`` is the file, for backends that run it (``llamacpp``) and read its
    weights (``reference``: ``workbench.models.gguf_read``); ``weight_dtype`` and
    ``tensor_types`` are the file's storage types.
    """
    import numpy as np

    from .gguf_read import file_types, open_gguf

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no GGUF file at {path}")
    reader = open_gguf(path)

    def value(key: str, default: Any = ...) -> Any:
        f = reader.fields.get(key)
        if f is None:
            if default is ...:
                raise ConfigError(f"GGUF {path}: metadata key {key!r} is missing")
            return default
        v = f.contents()
        if isinstance(v, list):  # per-layer arrays (hybrid models): the attention layers' value
            v = max((x for x in v if x), default=0)
        return v

    def f32(key: str, default: Any = ...) -> float:
        """A float32 metadata value as the decimal it was written from (1e-06, not 9.99e-07)."""
        return float(str(np.float32(value(key, default))))

    arch = value("general.architecture")
    if arch not in GGUF_ARCHS:
        raise ConfigError(f"GGUF {path}: architecture {arch!r} is not supported; "
                          f"supported: {', '.join(sorted(GGUF_ARCHS))}")
    p = f"{arch}."
    n_head = int(value(p + "attention.head_count"))
    hidden = int(value(p + "embedding_length"))
    head_dim = int(value(p + "attention.key_length", hidden // n_head))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if p + "vocab_size" in reader.fields or tokens is None:
        vocab = int(value(p + "vocab_size"))
    else:
        vocab = len(tokens.data)
    tensor_names = {t.name for t in reader.tensors}
    hf: dict[str, Any] = {
        "model_type": GGUF_ARCHS[arch],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": int(value(p + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(value(p + "attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "rms_norm_eps": f32(p + "attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": f32(p + "rope.freq_base", 10000.0),
        "max_position_embeddings": int(value(p + "context_length", 4096)),
        "tie_word_embeddings": "token_embd.weight" in tensor_names and "output.weight" not in tensor_names,
    }
    if p + "feed_forward_length" in reader.fields:
        hf["intermediate_size"] = int(value(p + "feed_forward_length"))
    elif arch in ("llama", "qwen3"):
        value(p + "feed_forward_length")  # raises: a dense model needs it
    n_rot = int(value(p + "rope.dimension_count", head_dim))
    if n_rot != head_dim:
        hf["partial_rotary_factor"] = n_rot / head_dim
    scaling = value(p + "rope.scaling.type", "none")
    if scaling == "yarn":
        hf["rope_scaling"] = {
            "rope_type": "yarn", "factor": f32(p + "rope.scaling.factor"),
            "original_max_position_embeddings": int(value(p + "rope.scaling.original_context_length")),
            "beta_fast": f32(p + "rope.scaling.yarn_beta_fast", 32.0),
            "beta_slow": f32(p + "rope.scaling.yarn_beta_slow", 1.0),
        }
    elif scaling not in ("none", ""):
        hf["rope_scaling"] = {"rope_type": scaling, "factor": f32(p + "rope.scaling.factor")}
    if arch in ("qwen3moe", "qwen3next"):
        hf["num_experts"] = int(value(p + "expert_count"))
        hf["num_experts_per_tok"] = int(value(p + "expert_used_count"))
        hf["moe_intermediate_size"] = int(value(p + "expert_feed_forward_length"))
        hf["norm_topk_prob"] = bool(value(p + "expert_weights_norm", True))
        hf["decoder_sparse_step"] = 1
        hf["mlp_only_layers"] = []
    if arch == "gpt-oss":
        hf["num_local_experts"] = int(value(p + "expert_count"))
        hf["num_experts_per_tok"] = hf["experts_per_token"] = int(value(p + "expert_used_count"))
        hf["intermediate_size"] = int(value(p + "expert_feed_forward_length"))
        hf["sliding_window"] = int(value(p + "attention.sliding_window"))
        hf["layer_types"] = ["sliding_attention" if il % 2 == 0 else "full_attention"
                             for il in range(hf["num_hidden_layers"])]  # llama.cpp: swa pattern 2
        hf["attention_bias"] = True
        hf["swiglu_limit"] = 7.0
        if "rope_scaling" in hf:
            hf["rope_scaling"]["truncate"] = False  # gpt-oss's config.json
    if arch == "qwen3next":
        hf["linear_conv_kernel_dim"] = int(value(p + "ssm.conv_kernel"))
        hf["linear_key_head_dim"] = int(value(p + "ssm.state_size"))
        hf["linear_num_key_heads"] = int(value(p + "ssm.group_count"))
        hf["linear_num_value_heads"] = int(value(p + "ssm.time_step_rank"))
        hf["linear_value_head_dim"] = int(value(p + "ssm.inner_size")) // hf["linear_num_value_heads"]
        hf["shared_expert_intermediate_size"] = int(value(p + "expert_shared_feed_forward_length"))
        hf["full_attention_interval"] = int(value(p + "full_attention_interval", 4))
    factors = None
    if "rope_freqs.weight" in tensor_names:  # Llama-3: rope scaling baked into per-pair divisors
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        factors = tuple(float(x) for x in np.asarray(t.data, np.float32).reshape(-1))
    name = str(value("general.name", path.stem))
    cfg = ModelConfig(name, canonical(hf, name), rope_freq_factors=factors, source=str(path.resolve()))
    weight_dtype, types = file_types(cfg, reader, path)  # the file's storage, per tensor
    cfg = replace(cfg, weight_dtype=weight_dtype, tensor_types=types)
    return cfg.with_(**runtime) if runtime else cfg
