"""Model families: configs and presets, one graph builder per family, weights."""

from __future__ import annotations

from importlib import import_module

from ..graph import Graph
from .config import ConfigError, ModelConfig, from_gguf, from_hf_config
from .presets import PRESETS, PUBLISHED_PARAMS, TINY_PRESETS, load_config, preset

#: family -> "module:function" of its builder (imported on first use).
BUILDERS = {
    "llama": "workbench.models.llama:build_llama",
    "qwen3": "workbench.models.qwen3:build_qwen3",
    "moe": "workbench.models.moe:build_moe",
    "gdn": "workbench.models.qwen3next:build_qwen3next",
}


def build_graph(cfg: ModelConfig, n_kv: int | None = None, pos: int | None = None) -> Graph:
    """The decode-step graph of ``cfg`` attending over ``n_kv`` cache rows (or the padded
    length for a step at ``pos``; default: the whole context). Shapes only: nothing is allocated."""
    if n_kv is None:
        n_kv = cfg.kv_len(pos) if pos is not None else cfg.context
    mod, fn = BUILDERS[cfg.family].split(":")
    graph = getattr(import_module(mod), fn)(cfg, n_kv)
    graph.meta.setdefault("n_kv", n_kv)
    graph.meta["config"] = cfg
    return graph


__all__ = [
    "BUILDERS", "PRESETS", "PUBLISHED_PARAMS", "TINY_PRESETS", "ConfigError", "ModelConfig", "build_graph",
    "from_gguf", "from_hf_config", "load_config", "preset",
]
