"""Qwen3 decode step: Llama's layout plus per-head RMSNorm of q and k before RoPE."""

from __future__ import annotations

from ..graph import Graph
from .config import ModelConfig
from .llama import build_dense


def build_qwen3(cfg: ModelConfig, n_kv: int) -> Graph:
    return build_dense(cfg, n_kv, qk_norm=True)
