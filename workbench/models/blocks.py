"""Graph pieces shared by the family builders: norms, attention over the KV cache, FFNs.

Each helper appends ggml-named nodes to a GraphBuilder exactly as llama.cpp's ``build_*``
helpers do, so every family reads like its llama.cpp graph.
"""

from __future__ import annotations

import numpy as np

from ..graph import GraphBuilder, View, is_quantized
from ..graph.tensor import DTYPES
from .config import KV_PAD, ModelConfig
from .hf_keys import sliding_layers, sliding_window
from .rope import rope_params, rotary_dims
from .weight_types import weight_typer


def model_builder(cfg: ModelConfig) -> GraphBuilder:
    """A GraphBuilder whose weights take the storage types of ``cfg`` (block types per tensor)."""
    b = GraphBuilder(cfg.name)
    b.weight_type = weight_typer(cfg)
    return b


def mat_input(b: GraphBuilder, w: View, x: View, name: str) -> View:
    """What a mat-mul of ``w`` reads as its activation: ``x``, or for a block-quantised ``w``
    ``x`` quantised to q8_1 by a node of its own (``name_q8_1``), as llama.cpp's CUDA mat-vec
    (mmvq) launches ``quantize_q8_1`` before each quantised mat-vec and then takes integer
    dot products. Its own node, so PDL, streams and fusions see the kernel llama.cpp runs."""
    if not is_quantized(w.dtype):
        return x
    return b.op("QUANTIZE_Q8_1", f"{name}_q8_1", [x], x.shape, dtype="q8_1")


def rms_norm(b: GraphBuilder, x: View, weight: View, eps: float, name: str, rms_name: str | None = None) -> View:
    """``norm = rms_norm(x); name = norm * weight`` (two nodes; `rms-norm-mul` may fuse them)."""
    shape = x.shape
    normed = b.op("RMS_NORM", rms_name or f"{name}_rms", [x], shape, eps=eps)
    return b.op("MUL", name, [normed, weight], shape)


def linear(b: GraphBuilder, x: View, w: View, name: str, bias: View | None = None) -> View:
    """``MUL_MAT`` of a [out, in] weight with a [1, in] activation (+ a bias ``ADD``)."""
    out = b.op("MUL_MAT", name, [w, mat_input(b, w, x, name)], (1, w.shape[0]))
    if bias is not None:
        out = b.op("ADD", f"{name}_b", [out, bias.reshape((1, bias.numel))], out.shape)
    return out


#: the attention mask input of a step (a sliding-window model adds ``<MASK_INPUT>_swa``): the
#: host fills it every token, a cell per cached KV row
MASK_INPUT = "kq_mask"


class StepInputs:
    """The host-side inputs of one decode step and the graph's views for them."""

    def __init__(self, b: GraphBuilder, cfg: ModelConfig, n_kv: int) -> None:
        self.tokens = b.input("inp_tokens", (1,), "i32")
        self.pos = b.input("inp_pos", (1,), "i32")
        self.kv_idx = b.input("inp_kv_idx", (1,), "i64")
        self.mask = b.input(MASK_INPUT, (n_kv,), "f32")
        #: per layer: attends through the sliding-window mask (llama.cpp's ``kq_mask_swa``)
        self.sliding = sliding_layers(cfg.hf)
        #: rows of a sliding layer's cache, and how many of them a step at this n_kv reads
        self.swa_rows = swa_cache_rows(cfg)
        self.n_kv_swa = min(self.swa_rows, n_kv)
        self.mask_swa = self.kv_idx_swa = None
        if any(self.sliding):
            self.mask_swa = b.input(f"{MASK_INPUT}_swa", (self.n_kv_swa,), "f32")
            ring = self.swa_rows < cfg.context
            self.kv_idx_swa = b.input("inp_kv_idx_swa", (1,), "i64") if ring else self.kv_idx
            b.meta.update(sliding_window=sliding_window(cfg.hf), swa_rows=self.swa_rows)
        inv_freq, attn_factor = rope_params(cfg)
        self.rope_freqs = b.const("rope_freqs", inv_freq.shape, "f32")
        b.meta["consts"] = {"rope_freqs": inv_freq}
        self.rope_attn_factor = attn_factor
        self.n_rot = rotary_dims(cfg)


    def mask_for(self, il: int) -> View:
        """The KQ mask layer ``il`` attends through."""
        return self.mask_swa if self.sliding[il] else self.mask


def swa_cache_rows(cfg: ModelConfig) -> int:
    """Rows of a sliding-window layer's KV cache: llama.cpp's iSWA ring,
    ``GGML_PAD(min(context, window + n_ubatch), 256)`` capped at the context, or the whole
    context with ``swa_full`` (and for models without sliding layers)."""
    window = sliding_window(cfg.hf)
    if cfg.swa_full or window is None:
        return cfg.context
    return min(cfg.context, -(-(window + cfg.n_ubatch) // KV_PAD) * KV_PAD)


def step_input_values(graph, token: int, pos: int) -> dict[str, np.ndarray]:
    """Values the host copies into the graph's inputs before the step at ``pos``."""
    out = {name: np.empty(graph.inputs[name].shape, DTYPES[graph.inputs[name].dtype][1])
           for name in step_input_names(graph)}
    write_step_inputs(graph, token, pos, out)
    return out


def step_input_names(graph) -> tuple[str, ...]:
    """The inputs :func:`write_step_inputs` fills, in the order it fills them."""
    names = ["inp_tokens", "inp_pos", "inp_kv_idx", "kq_mask"]
    if "kq_mask_swa" in graph.inputs:
        names.append("kq_mask_swa")
        if "inp_kv_idx_swa" in graph.inputs:
            names.append("inp_kv_idx_swa")
    return tuple(names)


def write_step_inputs(graph, token: int, pos: int, out: dict[str, np.ndarray]) -> None:
    """Write the step's input values into ``out``'s arrays in place (the inputs' shapes and
    dtypes): the cuda executor fills its staging memory this way, with no allocation per token."""
    out["inp_tokens"][...] = token
    out["inp_pos"][...] = pos
    out["inp_kv_idx"][...] = pos
    mask = out["kq_mask"].reshape(-1)
    mask[: pos + 1] = 0.0  # row j is visible while j <= pos
    mask[pos + 1:] = -np.inf
    if "kq_mask_swa" in out:
        # row r of a ring of R rows holds the latest position p <= pos with p % R == r (the
        # full cache is the ring with R = context): visible while p >= 0 and pos - p < window
        window, rows = graph.meta["sliding_window"], graph.meta["swa_rows"]
        swa = out["kq_mask_swa"].reshape(-1)
        held = pos - (pos - np.arange(swa.size)) % rows
        swa[...] = np.where((held >= 0) & (pos - held < window), 0.0, -np.inf)
        if "inp_kv_idx_swa" in out:
            out["inp_kv_idx_swa"][...] = pos % rows


def attention(b: GraphBuilder, cfg: ModelConfig, inp: StepInputs, il: int, q: View, k: View, v: View,
              n_kv: int, mask: View, sinks: View | None = None) -> View:
    """RoPE on q/k, store k/v rows into the layer's cache (SET_ROWS), attend over ``n_kv`` rows
    (a sliding layer: its own cache of ``inp.swa_rows`` rows, ``inp.n_kv_swa`` of them read).

    ``q``: [n_head, hd]; ``k``/``v``: [n_kv_head, hd] (already normed where the family does).
    Returns the attention output [1, n_head * hd].
    """
    n_head, hd = q.shape
    n_kv_head = k.shape[0]
    rope = dict(n_rot=inp.n_rot, attn_factor=inp.rope_attn_factor)
    q = b.op("ROPE", f"Qcur_rope-{il}", [q, inp.pos, inp.rope_freqs], q.shape, **rope)
    k = b.op("ROPE", f"Kcur_rope-{il}", [k, inp.pos, inp.rope_freqs], k.shape, **rope)
    row = n_kv_head * hd
    rows, idx = (inp.swa_rows, inp.kv_idx_swa) if inp.sliding[il] else (cfg.context, inp.kv_idx)
    n_kv = inp.n_kv_swa if inp.sliding[il] else n_kv
    k_cache = b.cache(f"cache_k_l{il}", (rows, row), cfg.kv_dtype)
    v_cache = b.cache(f"cache_v_l{il}", (rows, row), cfg.kv_dtype)
    b.node("SET_ROWS", f"k_cache_store-{il}", [k.reshape((1, row)), idx], [k_cache])
    b.node("SET_ROWS", f"v_cache_store-{il}", [v.reshape((1, row)), idx], [v_cache])
    k_view = k_cache.slice(0, 0, n_kv)
    v_view = v_cache.slice(0, 0, n_kv)
    k_view = k_view.__class__(k_view.buffer, k_view.offset, (n_kv, n_kv_head, hd),
                              (k_view.strides[0], hd * k_view.itemsize, k_view.itemsize), k_view.dtype)
    v_view = v_view.__class__(v_view.buffer, v_view.offset, (n_kv, n_kv_head, hd),
                              (v_view.strides[0], hd * v_view.itemsize, v_view.itemsize), v_view.dtype)
    srcs = [q, k_view, v_view, mask] + ([sinks] if sinks is not None else [])
    return b.op("FLASH_ATTN_EXT", f"kqv_out-{il}", srcs, (1, n_head * hd), scale=float(hd) ** -0.5)


def swiglu_ffn(b: GraphBuilder, x: View, prefix: str, il: int, sfx: str = "") -> View:
    """llama's FFN: ``down(silu(gate(x)) * up(x))`` with HF tensor names under ``prefix``
    (each projection's ``.bias`` added where the builder declared one: llama's ``mlp_bias``)."""
    def proj(name: str) -> tuple[View, View | None]:
        return b.weights[f"{prefix}.{name}.weight"], b.weights.get(f"{prefix}.{name}.bias")

    gate = linear(b, x, proj("gate_proj")[0], f"ffn_gate{sfx}-{il}", proj("gate_proj")[1])
    up = linear(b, x, proj("up_proj")[0], f"ffn_up{sfx}-{il}", proj("up_proj")[1])
    act = b.op("GLU", f"ffn_swiglu{sfx}-{il}", [gate, up], gate.shape, glu="swiglu")
    return linear(b, act, proj("down_proj")[0], f"ffn_out{sfx}-{il}", proj("down_proj")[1])


def dense_ffn(b: GraphBuilder, cfg: ModelConfig, il: int, x: View, ff: int, prefix: str | None = None,
              sfx: str = "", bias: bool = False) -> View:
    """Declare a SwiGLU FFN's weights ([ff, d], [ff, d], [d, ff], + biases) and build it."""
    d, pre = cfg.get("hidden_size"), prefix or f"model.layers.{il}.mlp"
    for proj, shape in (("gate_proj", (ff, d)), ("up_proj", (ff, d)), ("down_proj", (d, ff))):
        b.weight(f"{pre}.{proj}.weight", shape, cfg.weight_dtype)
        if bias:
            b.weight(f"{pre}.{proj}.bias", shape[:1], "f32")
    return swiglu_ffn(b, x, pre, il, sfx)


def lm_head(b: GraphBuilder, cfg: ModelConfig, x: View) -> View:
    """Final norm and the output projection; logits live in an ``output`` buffer."""
    d, vocab = cfg.get("hidden_size"), cfg.get("vocab_size")
    norm_w = b.weight("model.norm.weight", (d,), "f32")
    x = rms_norm(b, x, norm_w, cfg.get("rms_norm_eps"), "result_norm")
    if cfg.get("tie_word_embeddings", False):
        w = b.weights["model.embed_tokens.weight"]
    else:
        w = b.weight("lm_head.weight", (vocab, d), cfg.weight_dtype)
    logits = b.op("MUL_MAT", "result_output", [w, mat_input(b, w, x, "result_output")], (1, vocab), kind="output")
    b.output("logits", logits)
    return logits


def self_attention(b: GraphBuilder, cfg: ModelConfig, inp: StepInputs, il: int, x: View, n_kv: int,
                   qk_norm: bool = False, bias: bool = False, mask: View | None = None,
                   sinks: bool = False) -> View:
    """The attention half of a Llama-style layer on the normed input ``x`` ([1, d]).

    ``qk_norm``: Qwen3's per-head RMSNorm of q and k before RoPE; ``bias``: q/k/v/o biases and
    ``sinks``: learned per-head sink logits (gpt-oss).
    """
    d = cfg.get("hidden_size")
    n_head, n_kv_head, hd = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"), cfg.head_dim
    wdt = cfg.weight_dtype
    pre = f"model.layers.{il}.self_attn"

    def proj(name: str, out: int) -> tuple[View, View | None]:
        w = b.weight(f"{pre}.{name}.weight", (out, d if name != "o_proj" else n_head * hd), wdt)
        bb = b.weight(f"{pre}.{name}.bias", (out,), "f32") if bias else None
        return w, bb

    (wq, bq), (wk, bk), (wv, bv) = proj("q_proj", n_head * hd), proj("k_proj", n_kv_head * hd), \
        proj("v_proj", n_kv_head * hd)
    q = linear(b, x, wq, f"Qcur-{il}", bq).reshape((n_head, hd))
    k = linear(b, x, wk, f"Kcur-{il}", bk).reshape((n_kv_head, hd))
    v = linear(b, x, wv, f"Vcur-{il}", bv).reshape((n_kv_head, hd))
    if qk_norm:
        eps = cfg.get("rms_norm_eps")
        q = rms_norm(b, q, b.weight(f"{pre}.q_norm.weight", (hd,), "f32"), eps, f"Qcur_normed-{il}")
        k = rms_norm(b, k, b.weight(f"{pre}.k_norm.weight", (hd,), "f32"), eps, f"Kcur_normed-{il}")
    sink = b.weight(f"{pre}.sinks", (n_head,), "f32") if sinks else None
    att = attention(b, cfg, inp, il, q, k, v, n_kv, mask if mask is not None else inp.mask_for(il), sink)
    wo, bo = proj("o_proj", d)
    return linear(b, att, wo, f"attn_out-{il}", bo)


def residual_layer_start(b: GraphBuilder, cfg: ModelConfig, il: int, x: View) -> View:
    """``attn_norm`` of the layer input."""
    w = b.weight(f"model.layers.{il}.input_layernorm.weight", (cfg.get("hidden_size"),), "f32")
    return rms_norm(b, x, w, cfg.get("rms_norm_eps"), f"attn_norm-{il}")


def ffn_norm(b: GraphBuilder, cfg: ModelConfig, il: int, x: View) -> View:
    w = b.weight(f"model.layers.{il}.post_attention_layernorm.weight", (cfg.get("hidden_size"),), "f32")
    return rms_norm(b, x, w, cfg.get("rms_norm_eps"), f"ffn_norm-{il}")


def embed(b: GraphBuilder, cfg: ModelConfig, inp: StepInputs) -> View:
    d, vocab = cfg.get("hidden_size"), cfg.get("vocab_size")
    table = b.weight("model.embed_tokens.weight", (vocab, d), cfg.weight_dtype)
    return b.op("GET_ROWS", "inp_embd", [table, inp.tokens], (1, d))
