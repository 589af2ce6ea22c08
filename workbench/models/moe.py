"""Mixture-of-experts decode step: Qwen3-MoE (``llm_build_qwen3moe``) and gpt-oss
(``llm_build_openai_moe_iswa``), with the expert FFN of llama.cpp's ``build_moe_ffn``.

Hugging Face stores each layer's experts fused (``mlp.experts.gate_up_proj`` [E, ...]); ggml's
MUL_MAT_ID wants one [E, out, in] tensor per projection. The graph keeps the HF tensor as the
weight and hands MUL_MAT_ID strided *views* of it, so parameter counts, safetensors names and
byte ranges are those of the real checkpoint and nothing is copied or renamed. gpt-oss's HF
tensors are input-major; the graph stores them transposed (output-major, ``HF_TRANSPOSED``) so
every expert mat-vec reads its weight rows contiguously, as llama.cpp's GGUF does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..graph import Graph, GraphBuilder, View
from .blocks import (
    StepInputs,
    dense_ffn,
    embed,
    ffn_norm,
    linear,
    lm_head,
    mat_input,
    model_builder,
    residual_layer_start,
    self_attention,
)
from .config import ModelConfig
from .weights import HF_TRANSPOSED

#: gpt-oss's clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants; HF ``swiglu_alpha``).
OAI_ALPHA = 1.702


@dataclass(frozen=True)
class Experts:
    """One layer's router and expert tensors as MUL_MAT_ID wants them: ``gate``/``up``
    [E, n_ff, d] and ``down`` [E, d, n_ff] (rows = outputs), biases [E, out]."""

    router: View
    gate: View
    up: View
    down: View
    router_bias: View | None = None
    gate_bias: View | None = None
    up_bias: View | None = None
    down_bias: View | None = None


def qwen3_moe_experts(b: GraphBuilder, cfg: ModelConfig, il: int) -> Experts:
    """HF Qwen3-MoE / Qwen3-Next layout: ``gate_up_proj`` [E, 2*n_ff, d] (gate rows, then up
    rows), ``down_proj`` [E, d, n_ff], router ``mlp.gate.weight`` [E, d]."""
    d, ff, n_exp = cfg.get("hidden_size"), cfg.get("moe_intermediate_size"), cfg.get("num_experts")
    pre = f"model.layers.{il}.mlp"
    router = b.weight(f"{pre}.gate.weight", (n_exp, d), cfg.weight_dtype)
    gate_up = b.weight(f"{pre}.experts.gate_up_proj", (n_exp, 2 * ff, d), cfg.weight_dtype)
    down = b.weight(f"{pre}.experts.down_proj", (n_exp, d, ff), cfg.weight_dtype)
    return Experts(router, gate_up.slice(1, 0, ff), gate_up.slice(1, ff, 2 * ff), down)


def gpt_oss_experts(b: GraphBuilder, cfg: ModelConfig, il: int) -> Experts:
    """gpt-oss's experts, stored output-major as the GGUF stores them and as MUL_MAT_ID reads
    with unit K stride (the vector mat-vec kernels): ``gate_up_proj`` [E, 2*n_ff, d] with gate
    and up rows interleaved (gate 0, up 0, gate 1, ...) and ``down_proj`` [E, d, n_ff]; biases
    ``*_bias`` [E, out], router with bias. HF keeps both input-major ([E, d, 2*n_ff] gate/up
    interleaved along the last axis, [E, n_ff, d]): they are declared ``HF_TRANSPOSED`` and
    swapped once where HF tensors are read or written (``weights.swap_hf_layout``); gate and up
    are every other row, views."""
    d, ff, n_exp = cfg.get("hidden_size"), cfg.get("intermediate_size"), cfg.get("num_local_experts")
    wdt = cfg.weight_dtype
    pre = f"model.layers.{il}.mlp"
    router = b.weight(f"{pre}.router.weight", (n_exp, d), wdt)
    router_b = b.weight(f"{pre}.router.bias", (n_exp,), "f32")
    gate_up_b = b.weight(f"{pre}.experts.gate_up_proj_bias", (n_exp, 2 * ff), "f32")
    down_b = b.weight(f"{pre}.experts.down_proj_bias", (n_exp, d), "f32")
    gate_up = b.weight(f"{pre}.experts.gate_up_proj", (n_exp, 2 * ff, d), wdt)
    down = b.weight(f"{pre}.experts.down_proj", (n_exp, d, ff), wdt)
    b.meta.setdefault(HF_TRANSPOSED, []).extend([f"{pre}.experts.gate_up_proj", f"{pre}.experts.down_proj"])
    gate, up = _every_other(gate_up, 0, 1), _every_other(gate_up, 1, 1)
    return Experts(router, gate, up, down, router_bias=router_b, gate_bias=_every_other(gate_up_b, 0, 1),
                   up_bias=_every_other(gate_up_b, 1, 1), down_bias=down_b)


def _every_other(v: View, which: int, axis: int) -> View:
    """Elements ``which, which + 2, ...`` along ``axis`` of ``v`` (a strided view, no copy)."""
    shape, strides = list(v.shape), list(v.strides)
    offset = v.offset + which * strides[axis]
    shape[axis] //= 2
    strides[axis] *= 2
    return replace(v, offset=offset, shape=tuple(shape), strides=tuple(strides))


def _mul_mat_id(b: GraphBuilder, w: View, x: View, ids: View, bias: View | None, name: str, il: int) -> View:
    """MUL_MAT_ID of the selected experts (+ ADD_ID of their biases, ggml's ``*_biased``)."""
    out = b.op("MUL_MAT_ID", f"{name}-{il}", [w, mat_input(b, w, x, f"{name}-{il}"), ids], (ids.numel, w.shape[1]))
    if bias is not None:
        out = b.op("ADD_ID", f"{name}_biased-{il}", [out, bias, ids], out.shape)
    return out


def build_moe_ffn(b: GraphBuilder, il: int, x: View, ex: Experts, n_expert_used: int, *,
                  gating: str = "softmax", norm_w: bool = True, glu: str = "swiglu",
                  glu_params: dict | None = None) -> View:
    """llama.cpp's ``build_moe_ffn`` for one token ``x`` [1, d]; returns ``ffn_moe_out`` [1, d].

    ``gating``: ``softmax`` (probabilities over all experts, Qwen3) or ``softmax_weight``
    (top-k on the raw logits, softmax over the k chosen ones, gpt-oss). ``norm_w``: renormalise
    the chosen weights to sum to one (SUM_ROWS + DIV).
    """
    n_expert, d = ex.router.shape
    k = n_expert_used
    logits = linear(b, x, ex.router, f"ffn_moe_logits-{il}")
    if ex.router_bias is not None:
        logits = b.op("ADD", f"ffn_moe_logits_biased-{il}", [logits, ex.router_bias.reshape((1, n_expert))],
                      logits.shape)
    if gating == "softmax":
        probs = b.op("SOFT_MAX", f"ffn_moe_probs-{il}", [logits], logits.shape)
    elif gating == "softmax_weight":
        probs = logits
    else:
        raise ValueError(f"unknown MoE gating {gating!r} (softmax, softmax_weight)")
    topk = b.op("ARGSORT_TOP_K", f"ffn_moe_topk-{il}", [probs], (1, k), dtype="i32", k=k)
    weights = b.op("GET_ROWS", f"ffn_moe_weights-{il}", [probs.reshape((n_expert, 1)), topk], (k, 1))
    if gating == "softmax_weight":
        weights = b.op("SOFT_MAX", f"ffn_moe_weights_softmax-{il}", [weights.reshape((1, k))], (1, k))
        weights = weights.reshape((k, 1))
    if norm_w:
        row = weights.reshape((1, k))
        total = b.op("SUM_ROWS", f"ffn_moe_weights_sum-{il}", [row], (1, 1))
        weights = b.op("DIV", f"ffn_moe_weights_norm-{il}", [row, total], (1, k)).reshape((k, 1))
    up = _mul_mat_id(b, ex.up, x, topk, ex.up_bias, "ffn_moe_up", il)
    gate = _mul_mat_id(b, ex.gate, x, topk, ex.gate_bias, "ffn_moe_gate", il)
    act_name = "ffn_moe_swiglu_oai" if glu == "swiglu_oai" else f"ffn_moe_{glu}"
    act = b.op("GLU", f"{act_name}-{il}", [gate, up], gate.shape, glu=glu, **(glu_params or {}))
    experts = _mul_mat_id(b, ex.down, act, topk, ex.down_bias, "ffn_moe_down", il)
    experts = b.op("MUL", f"ffn_moe_weighted-{il}", [experts, weights], experts.shape)
    # sum over the k experts: a [d, k] view of the [k, d] rows reduced along its last axis
    return b.op("SUM_ROWS", f"ffn_moe_out-{il}", [experts.permute(1, 0)], (1, d))


def _is_sparse_layer(cfg: ModelConfig, il: int) -> bool:
    """HF Qwen3-MoE: a layer uses experts unless listed in ``mlp_only_layers`` or off the
    ``decoder_sparse_step`` grid (then it has a dense llama FFN of ``intermediate_size``)."""
    return (il not in (cfg.get("mlp_only_layers", []) or []) and cfg.get("num_experts") > 0
            and (il + 1) % int(cfg.get("decoder_sparse_step", 1)) == 0)


def _dense_ffn(b: GraphBuilder, cfg: ModelConfig, il: int, x: View) -> View:
    return dense_ffn(b, cfg, il, x, cfg.get("intermediate_size"))


def build_moe(cfg: ModelConfig, n_kv: int) -> Graph:
    """One decode step of a Qwen3-MoE or gpt-oss model attending over ``n_kv`` cache rows."""
    oai = cfg.model_type == "gpt_oss"
    b = model_builder(cfg)
    d = cfg.get("hidden_size")
    inp = StepInputs(b, cfg, n_kv)
    x = embed(b, cfg, inp)
    for il in range(cfg.n_layer):
        cur = residual_layer_start(b, cfg, il, x)
        if oai:
            cur = self_attention(b, cfg, inp, il, cur, n_kv, bias=bool(cfg.get("attention_bias", True)), sinks=True)
        else:
            cur = self_attention(b, cfg, inp, il, cur, n_kv, qk_norm=True,
                                 bias=bool(cfg.get("attention_bias", False)))
        ffn_inp = b.op("ADD", f"ffn_inp-{il}", [cur, x], (1, d))
        cur = ffn_norm(b, cfg, il, ffn_inp)
        if oai:
            glu_params = dict(alpha=float(cfg.get("swiglu_alpha", OAI_ALPHA)), limit=float(cfg.get("swiglu_limit")))
            cur = build_moe_ffn(b, il, cur, gpt_oss_experts(b, cfg, il), int(cfg.get("num_experts_per_tok")),
                                gating="softmax_weight", norm_w=False, glu="swiglu_oai", glu_params=glu_params)
        elif _is_sparse_layer(cfg, il):
            cur = build_moe_ffn(b, il, cur, qwen3_moe_experts(b, cfg, il), int(cfg.get("num_experts_per_tok")),
                                gating="softmax", norm_w=bool(cfg.get("norm_topk_prob", True)))
        else:
            cur = _dense_ffn(b, cfg, il, cur)
        x = b.op("ADD", f"l_out-{il}", [cur, ffn_inp], (1, d))
    lm_head(b, cfg, x)
    b.meta.update(n_kv=n_kv, family=cfg.family)
    return b.build()
