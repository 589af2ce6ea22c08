"""Qwen3-Next decode step (llama.cpp's ``llama_model_qwen3next::graph``).

A hybrid: every ``full_attention_interval``-th layer is gated full attention (q_proj yields the
query and a per-head gate, output * sigmoid(gate), partial RoPE), the others are gated-delta-net
linear attention with a short causal conv and a recurrent state; every layer ends in an MoE FFN
with a sigmoid-gated shared expert. Norms are zero-centred (``1 + w``).

Two recurrent caches per linear layer, as llama.cpp's ``llama_memory_recurrent`` keeps them:
``cache_r_l{il}`` (conv state, the last ``d_conv - 1`` inputs per channel) and ``cache_s_l{il}``
(delta-rule state [H_v, d_k, d_v]). SSM_CONV and GATED_DELTA_NET write their result *and* the
new state into one buffer (``outs[0]`` at the head, ``outs[1]`` a view of the tail) and a CPY
then copies that tail into the cache: the op -> view -> CPY pattern that PR #23940 removes.

Weights keep their Hugging Face names and shapes; the fused ``in_proj_qkvz`` / ``in_proj_ba``
(rows grouped per key head: [q | k | v | z] and [b | a]) are read through strided views, so
nothing is copied or renamed. Where llama.cpp's graph only moves data (``ggml_cont``,
``ggml_concat``, ``ggml_repeat`` of q/k to the value heads) this graph uses views instead:
the conv window concat happens inside SSM_CONV and q/k reach GATED_DELTA_NET as stride-0
broadcast views [H_k, H_v/H_k, d_k]. The GGUF converter's folds (norm weights stored as
``1 + w``, ``A_log`` stored as ``-exp(A_log)``) are declared in ``meta['weight_folds']`` and
applied when weights are loaded (:func:`workbench.models.weights.device_weight`).
"""

from __future__ import annotations

import numpy as np

from ..graph import Buffer, Graph, GraphBuilder, View
from .blocks import (
    StepInputs,
    attention,
    embed,
    linear,
    lm_head,
    mat_input,
    model_builder,
    residual_layer_start,
    rms_norm,
    swiglu_ffn,
)
from .config import ConfigError, ModelConfig
from .moe import _dense_ffn, _is_sparse_layer, build_moe_ffn, qwen3_moe_experts

F32 = 4  # bytes per f32 element; the recurrent states and GDN activations are f32 as in llama.cpp


def layer_types(cfg: ModelConfig) -> list[str]:
    """``linear_attention`` / ``full_attention`` per layer (HF ``layer_types``, else every
    ``full_attention_interval``-th layer is full attention)."""
    types = cfg.get("layer_types", None)
    if types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        types = ["full_attention" if (il + 1) % interval == 0 else "linear_attention" for il in range(cfg.n_layer)]
    return list(types)[: cfg.n_layer]


def gated_attention(b: GraphBuilder, cfg: ModelConfig, inp: StepInputs, il: int, x: View, n_kv: int) -> View:
    """llama.cpp's ``build_layer_attn``: Q and gate from one q_proj, q/k RMSNorm, partial RoPE,
    attention over the KV cache, ``* sigmoid(gate)``, o_proj."""
    d, eps = cfg.get("hidden_size"), cfg.get("rms_norm_eps")
    n_head, n_kv_head, hd = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"), cfg.head_dim
    wdt, pre = cfg.weight_dtype, f"model.layers.{il}.self_attn"
    bias = bool(cfg.get("attention_bias", False))

    def proj(name: str, out: int, inp: int) -> tuple[View, View | None]:
        w = b.weight(f"{pre}.{name}.weight", (out, inp), wdt)
        return w, (b.weight(f"{pre}.{name}.bias", (out,), "f32") if bias else None)

    wq, bq = proj("q_proj", n_head * hd * 2, d)
    wk, bk = proj("k_proj", n_kv_head * hd, d)
    wv, bv = proj("v_proj", n_kv_head * hd, d)
    wo, bo = proj("o_proj", d, n_head * hd)
    q_norm = b.weight(f"{pre}.q_norm.weight", (hd,), "f32")
    k_norm = b.weight(f"{pre}.k_norm.weight", (hd,), "f32")

    q_full = linear(b, x, wq, f"Qcur_full-{il}", bq).reshape((n_head, 2 * hd))  # per head [query | gate]
    q, gate = q_full.slice(1, 0, hd), q_full.slice(1, hd, 2 * hd)
    k = linear(b, x, wk, f"Kcur-{il}", bk).reshape((n_kv_head, hd))
    v = linear(b, x, wv, f"Vcur-{il}", bv).reshape((n_kv_head, hd))
    q = rms_norm(b, q, q_norm, eps, f"Qcur_normed-{il}")
    k = rms_norm(b, k, k_norm, eps, f"Kcur_normed-{il}")
    att = attention(b, cfg, inp, il, q, k, v, n_kv, inp.mask)
    gate = b.op("SIGMOID", f"gate_sigmoid-{il}", [gate], gate.shape)
    att = b.op("MUL", f"attn_gated-{il}", [att, gate.reshape(att.shape)], att.shape)
    return linear(b, att, wo, f"attn_output-{il}", bo)


def _rows(w: View, offset_rows: int, shape: tuple[int, ...], row_strides: tuple[int, ...]) -> View:
    """A view of rows of the [rows, in] weight ``w``: ``shape`` = (..., in), strides given in rows."""
    row = w.strides[0]
    return View(w.buffer, w.offset + offset_rows * row, shape, (*(s * row for s in row_strides), w.strides[1]),
                w.dtype)


def _broadcast_heads(x: View, rep: int) -> View:
    """[H_k, d] -> a stride-0 view [H_k, rep, d]: value head ``h * rep + j`` reads key head ``h``
    (HF's ``repeat_interleave``; llama.cpp materialises it with ``ggml_repeat_4d``)."""
    (n, dim), (s0, s1) = x.shape, x.strides
    return View(x.buffer, x.offset, (n, rep, dim), (s0, 0, s1), x.dtype)


def gated_delta_net(b: GraphBuilder, cfg: ModelConfig, il: int, x: View) -> View:
    """llama.cpp's ``build_layer_attn_linear`` for one token ``x`` [1, d]; returns [1, d]."""
    d, eps, wdt = cfg.get("hidden_size"), cfg.get("rms_norm_eps"), cfg.weight_dtype
    h_k, h_v = int(cfg.get("linear_num_key_heads")), int(cfg.get("linear_num_value_heads"))
    dk, dv = int(cfg.get("linear_key_head_dim")), int(cfg.get("linear_value_head_dim"))
    kern = int(cfg.get("linear_conv_kernel_dim"))
    if h_v % h_k:
        raise ConfigError(f"{cfg.name}: linear_num_value_heads ({h_v}) must be a multiple of "
                         f"linear_num_key_heads ({h_k})")
    rep = h_v // h_k
    key_dim, value_dim = h_k * dk, h_v * dv
    conv_dim = 2 * key_dim + value_dim
    group = 2 * dk + 2 * rep * dv  # in_proj_qkvz rows per key head: q, k, v, z
    pre = f"model.layers.{il}.linear_attn"
    w_qkvz = b.weight(f"{pre}.in_proj_qkvz.weight", (h_k * group, d), wdt)
    w_ba = b.weight(f"{pre}.in_proj_ba.weight", (2 * h_v, d), wdt)
    conv_w = b.weight(f"{pre}.conv1d.weight", (conv_dim, 1, kern), "f32")
    dt_bias = b.weight(f"{pre}.dt_bias", (h_v,), "f32")
    ssm_a = b.weight(f"{pre}.A_log", (h_v,), "f32")  # holds A = -exp(A_log) once loaded (weight_folds)
    norm_w = b.weight(f"{pre}.norm.weight", (dv,), "f32")
    w_out = b.weight(f"{pre}.out_proj.weight", (d, value_dim), wdt)

    # qkv_mixed = [q of all key heads | k of all key heads | v of all value heads], the conv's
    # channel order, written by two MUL_MATs over views of the head-grouped in_proj_qkvz rows
    qkv = b.scratch(f"linear_attn_qkv_mixed-{il}", (1, conv_dim))
    w_qk = _rows(w_qkvz, 0, (2, h_k, dk, d), (dk, group, 1))
    w_v = _rows(w_qkvz, 2 * dk, (h_k, rep * dv, d), (group, 1))
    w_z = _rows(w_qkvz, 2 * dk + rep * dv, (h_k, rep * dv, d), (group, 1))
    b.node("MUL_MAT", f"linear_attn_qk-{il}", [w_qk, mat_input(b, w_qk, x, f"linear_attn_qk-{il}")],
           [qkv.slice(1, 0, 2 * key_dim)])
    b.node("MUL_MAT", f"linear_attn_v-{il}", [w_v, mat_input(b, w_v, x, f"linear_attn_v-{il}")],
           [qkv.slice(1, 2 * key_dim, conv_dim)])
    z = b.op("MUL_MAT", f"z-{il}", [w_z, mat_input(b, w_z, x, f"z-{il}")], (1, value_dim))

    # beta = sigmoid(b), g = A * softplus(a + dt_bias); in_proj_ba rows per key head: [b | a]
    ba = linear(b, x, w_ba, f"linear_attn_mixed_ba-{il}").reshape((h_k, 2 * rep))
    beta = b.op("SIGMOID", f"beta-{il}", [ba.slice(1, 0, rep)], (h_k, rep))
    alpha = b.op("ADD", f"alpha_biased-{il}", [ba.slice(1, rep, 2 * rep), dt_bias.reshape((h_k, rep))], (h_k, rep))
    alpha = b.op("SOFTPLUS", f"a_softplus-{il}", [alpha], alpha.shape)
    g = b.op("MUL", f"gate-{il}", [alpha, ssm_a.reshape((h_k, rep))], alpha.shape)

    # short causal conv over [conv state | x]; the new conv state lands in the output tail
    conv_state = b.cache(f"cache_r_l{il}", (conv_dim, kern - 1), "f32")
    conv_buf = Buffer(f"conv_output_raw-{il}", (conv_dim + conv_dim * (kern - 1)) * F32)
    conv_out = View.of(conv_buf, (1, conv_dim), "f32")
    conv_tail = View.of(conv_buf, (conv_dim, kern - 1), "f32", offset=conv_dim * F32)
    b.node("SSM_CONV", f"conv_output_raw-{il}", [conv_state, qkv, conv_w.reshape((conv_dim, kern))],
           [conv_out, conv_tail])
    b.node("CPY", f"conv_state_cpy-{il}", [conv_tail], [conv_state])
    conv = b.op("SILU", f"conv_output_silu-{il}", [conv_out], conv_out.shape).reshape((conv_dim,))

    q = b.op("L2_NORM", f"q_conv_normed-{il}", [conv.slice(0, 0, key_dim).reshape((h_k, dk))], (h_k, dk), eps=eps)
    k = b.op("L2_NORM", f"k_conv_normed-{il}", [conv.slice(0, key_dim, 2 * key_dim).reshape((h_k, dk))], (h_k, dk),
             eps=eps)
    v = conv.slice(0, 2 * key_dim, conv_dim).reshape((h_v, dv))

    # the delta rule: output at the head of the buffer, the new state [H_v, d_k, d_v] in its tail
    state = b.cache(f"cache_s_l{il}", (h_v, dk, dv), "f32")
    gdn_buf = Buffer(f"gated_delta_net-{il}", (h_v * dv + h_v * dk * dv) * F32)
    out = View.of(gdn_buf, (h_v, dv), "f32")
    new_state = View.of(gdn_buf, (h_v, dk, dv), "f32", offset=h_v * dv * F32)
    b.node("GATED_DELTA_NET", f"gated_delta_net-{il}",
           [_broadcast_heads(q, rep), _broadcast_heads(k, rep), v, g, beta, state], [out, new_state],
           scale=float(dk) ** -0.5)
    b.node("CPY", f"ssm_state_cpy-{il}", [new_state], [state])

    normed = b.op("NORM_GATED", f"attn_out_norm-{il}", [out, norm_w, z.reshape((h_v, dv))], (h_v, dv), eps=eps)
    return linear(b, normed.reshape((1, value_dim)), w_out, f"linear_attn_out-{il}")


def shared_expert_ffn(b: GraphBuilder, cfg: ModelConfig, il: int, x: View) -> View:
    """The shared expert, gated per token by ``sigmoid(shared_expert_gate(x))``."""
    d, ff, wdt = cfg.get("hidden_size"), cfg.get("shared_expert_intermediate_size"), cfg.weight_dtype
    pre = f"model.layers.{il}.mlp"
    for proj, shape in (("gate_proj", (ff, d)), ("up_proj", (ff, d)), ("down_proj", (d, ff))):
        b.weight(f"{pre}.shared_expert.{proj}.weight", shape, wdt)
    shexp = swiglu_ffn(b, x, f"{pre}.shared_expert", il, sfx="_shexp")
    gate = linear(b, x, b.weight(f"{pre}.shared_expert_gate.weight", (1, d), wdt), f"shared_expert_gate-{il}")
    gate = b.op("SIGMOID", f"shared_expert_gate_sigmoid-{il}", [gate], gate.shape)
    return b.op("MUL", f"ffn_shexp_gated-{il}", [shexp, gate], shexp.shape)


def _zero_centred_norm(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.normal(0.0, 0.05, shape)  # HF initialises zeros; the norm scales by 1 + w


def _a_log(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # A log-uniform over HF's init range [0.01, 16]: fast- and slow-forgetting heads both occur
    return rng.uniform(np.log(0.01), np.log(16.0), shape)


def _dt_bias(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return 1.0 + rng.normal(0.0, 0.1, shape)  # HF initialises ones


def _declare_weight_handling(b: GraphBuilder) -> None:
    """Folds applied at load (convert_hf_to_gguf's Qwen3-Next rules) and random-init overrides."""
    folds, init = b.meta.setdefault("weight_folds", {}), b.meta.setdefault("weight_init", {})
    for name in b.weights:
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            folds[name], init[name] = "one_plus", _zero_centred_norm
        elif name.endswith(".A_log"):
            folds[name], init[name] = "neg_exp", _a_log
        elif name.endswith(".dt_bias"):
            init[name] = _dt_bias


def build_qwen3next(cfg: ModelConfig, n_kv: int) -> Graph:
    """One decode step of a Qwen3-Next model attending over ``n_kv`` cache rows (full layers)."""
    b = model_builder(cfg)
    d, eps = cfg.get("hidden_size"), cfg.get("rms_norm_eps")
    inp = StepInputs(b, cfg, n_kv)
    x = embed(b, cfg, inp)
    for il, kind in enumerate(layer_types(cfg)):
        cur = residual_layer_start(b, cfg, il, x)
        if kind == "linear_attention":
            cur = gated_delta_net(b, cfg, il, cur)
        elif kind == "full_attention":
            cur = gated_attention(b, cfg, inp, il, cur, n_kv)
        else:
            raise ConfigError(f"{cfg.name}: layer {il} has layer type {kind!r}; expected linear_attention "
                             "or full_attention")
        res = b.op("ADD", f"attn_residual-{il}", [cur, x], (1, d))
        post_w = b.weight(f"model.layers.{il}.post_attention_layernorm.weight", (d,), "f32")
        cur = rms_norm(b, res, post_w, eps, f"attn_post_norm-{il}")
        if _is_sparse_layer(cfg, il):
            moe = build_moe_ffn(b, il, cur, qwen3_moe_experts(b, cfg, il), int(cfg.get("num_experts_per_tok")),
                                gating="softmax", norm_w=bool(cfg.get("norm_topk_prob", True)))
            shexp = shared_expert_ffn(b, cfg, il, cur)
            cur = b.op("ADD", f"ffn_out-{il}", [moe, shexp], (1, d))
        else:
            cur = _dense_ffn(b, cfg, il, cur)
        x = b.op("ADD", f"l_out-{il}", [cur, res], (1, d))
    lm_head(b, cfg, x)
    _declare_weight_handling(b)
    b.meta.update(n_kv=n_kv, family=cfg.family)
    return b.build()
