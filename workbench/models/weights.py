"""Weights: seeded random at a realistic scale, or loaded from safetensors (HF tensor names).

Weights are a dict ``HF name -> numpy array`` in the graph's storage dtype (bf16 as raw
uint16, ggml's block types as their uint8 blocks ``[..., row bytes]``) and layout, so the same
dict feeds the reference and the GPU executor; a ``transformers`` model or a safetensors file
gets each float tensor through :func:`swap_hf_layout` (gpt-oss's experts are stored transposed).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ..graph import Graph, is_quantized
from .config import ConfigError
from .quant import dequantize, quantize

#: The largest finite f16 value: a checkpoint weight beyond it would become inf in f16 storage.
F16_MAX = 65504.0


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (round to nearest even), stored as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(u: np.ndarray) -> np.ndarray:
    return (u.astype(np.uint32) << 16).view(np.float32)


def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float array -> the storage numpy array of a workbench dtype."""
    if dtype == "bf16":
        return to_bf16(x)
    if is_quantized(dtype):
        return quantize(x, dtype)
    return np.asarray(x).astype({"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}[dtype])


def to_float32(x: np.ndarray, dtype: str) -> np.ndarray:
    if is_quantized(dtype):
        return dequantize(x, dtype)
    return from_bf16(x) if dtype == "bf16" else np.asarray(x, dtype=np.float32)


def _init(name: str, shape: tuple[int, ...], rng: np.random.Generator, fan_in: int) -> np.ndarray:
    """Scale chosen so activations stay O(1) through any depth: norm weights near 1, linear
    weights ~ N(0, 1/fan_in) damped for the residual-writing projections; drawn in ``shape``."""
    leaf = name.rsplit(".", 2)[-2] if name.endswith((".weight", ".bias")) else name.rsplit(".", 1)[-1]
    if name.endswith("norm.weight") or leaf.endswith("norm") or leaf.endswith("layernorm"):
        if "qwen3_next_norm_zero_centered" in name:  # pragma: no cover - hook for (1+w) norms
            return rng.normal(0, 0.02, shape)
        return 1.0 + rng.normal(0, 0.05, shape)
    if name.endswith((".bias", "_proj_bias")) or leaf == "sinks":
        return rng.normal(0, 0.1, shape)
    if leaf == "embed_tokens":
        return rng.normal(0, 1.0, shape)
    scale = 1.0 / np.sqrt(fan_in)
    if leaf in ("o_proj", "down_proj", "out_proj") or name.endswith("down_proj"):
        scale *= 0.5
    return rng.normal(0, scale, shape)


#: ``graph.meta`` key: the weights a builder stores with the last two axes of their HF tensor
#: swapped (gpt-oss's experts, kept output-major as the GGUF stores them).
HF_TRANSPOSED = "hf_transposed"


def is_hf_transposed(graph: Graph, name: str) -> bool:
    """Does the graph store ``name`` with the last two axes of its HF tensor swapped?"""
    return name in graph.meta.get(HF_TRANSPOSED, ())


def hf_shape(graph: Graph, name: str) -> tuple[int, ...]:
    """The shape of the HF tensor ``name`` (the graph's, last two axes swapped if transposed)."""
    shape = tuple(graph.weights[name].shape)
    return (*shape[:-2], shape[-1], shape[-2]) if is_hf_transposed(graph, name) else shape


def swap_hf_layout(graph: Graph, name: str, x: np.ndarray) -> np.ndarray:
    """A float array of ``name`` moved between the HF layout and the graph's (either way: the
    swap of the last two axes is its own inverse); unchanged for every other weight."""
    return np.ascontiguousarray(np.swapaxes(x, -1, -2)) if is_hf_transposed(graph, name) else x


def random_weights(graph: Graph, seed: int = 0, overrides=None) -> dict[str, np.ndarray]:
    """Seeded random weights for every weight tensor of ``graph`` in its storage dtype.

    ``overrides``: optional ``name -> float array`` for families whose parameters need a
    specific distribution (e.g. GDN's A_log); applied before the dtype cast. A builder may
    put its own in ``graph.meta["weight_init"]``; explicit ``overrides`` win."""
    return {name: random_weight(graph, name, seed, overrides) for name in sorted(graph.weights)}


def random_weight(graph: Graph, name: str, seed: int = 0, overrides=None) -> np.ndarray:
    """The one tensor ``name`` of :func:`random_weights` (each tensor has its own seeded stream,
    so writers of large models can produce them one at a time)."""
    overrides = {**graph.meta.get("weight_init", {}), **(overrides or {})}
    view = graph.weights[name]
    rng = np.random.default_rng([seed, _stable_hash(name)])
    shape = hf_shape(graph, name)  # drawn as the HF tensor, so a layout change keeps the values
    init = _init(name, shape, rng, fan_in=view.shape[-1])
    if name in overrides:
        init = overrides[name](rng, shape)
    return to_storage(swap_hf_layout(graph, name, np.asarray(init, np.float32)), view.dtype)


#: Load-time transforms llama.cpp's GGUF converter bakes into some tensors (Qwen3-Next stores
#: its zero-centred norm weights as ``1 + w`` and ``A_log`` as ``A = -exp(A_log)``), so the graph
#: runs plain RMS_NORM + MUL and ``softplus(..) * A`` while the weights dict keeps HF values.
WEIGHT_FOLDS = {
    "one_plus": lambda w: 1.0 + w,
    "neg_exp": lambda w: -np.exp(w),
}


def device_weight(graph: Graph, name: str, storage: np.ndarray) -> np.ndarray:
    """What the graph's tensor ``name`` holds for the HF-valued ``storage`` (storage dtype):
    the value with the fold of ``graph.meta["weight_folds"]`` applied, if any."""
    fold = graph.meta.get("weight_folds", {}).get(name)
    if fold is None:
        return storage
    dtype = graph.weights[name].dtype
    return to_storage(WEIGHT_FOLDS[fold](to_float32(storage, dtype)).astype(np.float32), dtype)


def _stable_hash(s: str) -> int:
    h = 2166136261
    for ch in s.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


def load_safetensors(graph: Graph, paths: str | Path | list[str | Path]) -> dict[str, np.ndarray]:
    """Weights for ``graph`` from safetensors files with Hugging Face names (any float dtype,
    per-expert or fused MoE layout: :mod:`workbench.models.checkpoint`), cast to the graph's
    storage dtypes. A missing or mis-shaped tensor is a clear error naming it and both shapes."""
    from .checkpoint import load

    files = [Path(p) for p in (paths if isinstance(paths, list) else [paths])]
    files = [f for p in files for f in (sorted(p.glob("*.safetensors")) if p.is_dir() else [p])]
    if not files:
        raise ConfigError(f"no .safetensors files found in {paths}")
    cfg = graph.meta.get("config")
    quant = cfg.hf.get("quantization_config") if cfg is not None else None
    if quant:
        raise ConfigError(f"{cfg.name}: the checkpoint is quantized (quantization_config, quant_method="
                          f"{quant.get('quant_method', '?')!r}); its safetensors are not read: use a "
                          "dequantized checkpoint or the GGUF")
    found, stored = load({name: hf_shape(graph, name) for name in graph.weights}, files)
    out = {}
    for name, view in graph.weights.items():
        found[name] = swap_hf_layout(graph, name, found[name])
        if view.dtype == "f16" and np.abs(found[name]).max(initial=0.0) > F16_MAX:
            raise ConfigError(f"safetensors tensor {name!r} holds values beyond f16's range (max |w| = "
                              f"{np.abs(found[name]).max():.3g}); keep the weights bf16 or f32 "
                              "(weight_dtype='bf16')")
        out[name] = to_storage(found[name], view.dtype)
    narrowed = sorted(d for d in stored if d in ("BF16", "F32", "F64"))
    kept = {graph.weights[n].dtype for n in out} - {"f32"}
    if narrowed and kept and cfg is not None:
        warnings.warn(f"{cfg.name}: {'/'.join(narrowed).lower()} checkpoint weights stored as "
                      f"{'/'.join(sorted(kept))} (weight_dtype={cfg.weight_dtype!r}; pass weight_dtype='bf16' "
                      "or 'f32' to keep more)", stacklevel=2)
    return out


def has_checkpoint(cfg) -> bool:
    """Was ``cfg`` read from a folder that holds safetensors (its weights)?"""
    return cfg.source is not None and Path(cfg.source).is_dir() and any(Path(cfg.source).glob("*.safetensors"))


def model_weights(cfg, graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """The weights a run of ``cfg`` uses: a GGUF's stored tensors (when read from one and kept
    in its types), the safetensors beside its config.json when it was read from a folder that
    has them, else ``random_weights(graph, seed)``."""
    if cfg.source is not None and cfg.source.endswith(".gguf") and cfg.tensor_types is not None:
        from .gguf_read import load_gguf_weights

        return load_gguf_weights(graph, cfg.source)
    if has_checkpoint(cfg):
        return load_safetensors(graph, Path(cfg.source))
    return random_weights(graph, seed)


def save_safetensors(weights: dict[str, np.ndarray], graph: Graph, path: str | Path) -> None:
    """Write weights as float32 safetensors with HF names and layouts (tests, notebooks)."""
    from safetensors.numpy import save_file

    save_file({k: swap_hf_layout(graph, k, to_float32(v, graph.weights[k].dtype)) for k, v in weights.items()},
              str(path))
