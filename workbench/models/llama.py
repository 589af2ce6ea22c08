"""Dense Llama decode step (llama.cpp's ``llm_build_llama``), also the base of Qwen3.

``attention_bias`` / ``mlp_bias`` add the projections' biases (ADD after MUL_MAT, which
llama.cpp's mul_mat+bias fusion may fold); sliding-window layers (Qwen3) use ``kq_mask_swa``.
"""

from __future__ import annotations

from ..graph import Graph
from .blocks import (
    StepInputs,
    dense_ffn,
    embed,
    ffn_norm,
    lm_head,
    model_builder,
    residual_layer_start,
    self_attention,
)
from .config import ModelConfig


def build_dense(cfg: ModelConfig, n_kv: int, qk_norm: bool) -> Graph:
    """One decode step attending over ``n_kv`` cache rows."""
    b = model_builder(cfg)
    d, ff = cfg.get("hidden_size"), cfg.get("intermediate_size")
    inp = StepInputs(b, cfg, n_kv)
    x = embed(b, cfg, inp)
    for il in range(cfg.n_layer):
        cur = residual_layer_start(b, cfg, il, x)
        cur = self_attention(b, cfg, inp, il, cur, n_kv, qk_norm=qk_norm, bias=bool(cfg.get("attention_bias", False)))
        ffn_inp = b.op("ADD", f"ffn_inp-{il}", [cur, x], (1, d))
        cur = ffn_norm(b, cfg, il, ffn_inp)
        cur = dense_ffn(b, cfg, il, cur, ff, bias=bool(cfg.get("mlp_bias", False)))
        x = b.op("ADD", f"l_out-{il}", [cur, ffn_inp], (1, d))
    lm_head(b, cfg, x)
    b.meta.update(n_kv=n_kv, family=cfg.family)
    return b.build()


def build_llama(cfg: ModelConfig, n_kv: int) -> Graph:
    return build_dense(cfg, n_kv, qk_norm=False)
