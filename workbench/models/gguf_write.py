"""Write a model's seeded random weights as the GGUF llama.cpp's converter would write it.

The file holds exactly ``random_weights(graph, seed)`` (the values every workbench backend runs),
renamed and laid out as ``convert_hf_to_gguf.py`` does for the architecture, so llama.cpp and
``workbench run --model FILE`` compute the same logits:

- tensor names from gguf-py's ``TensorNameMap`` (``blk.N.attn_q.weight`` ...), metadata keys
  of the architecture (``llama.*``, ``qwen3.*``, ``qwen3moe.*``, ``gpt-oss.*``, ``qwen3next.*``);
- Llama: Q/K rows permuted for ggml's normal-mode RoPE (``LlamaModel.permute``), Llama-3 rope
  scaling as a ``rope_freqs`` tensor of per-dimension frequency factors;
- MoE: the fused HF expert tensors split into ``ffn_{gate,up,down}_exps`` [E, out, in]
  (gpt-oss: gate/up rows de-interleaved, biases too), routers in f32;
- Qwen3-Next: ``in_proj_qkvz`` regrouped into ``attn_qkv`` (all q | all k | all v) and
  ``attn_gate`` (z), ``in_proj_ba`` as ``ssm_ba``, the converter's folds (norms stored
  as ``1 + w``, ``A`` as ``-exp(A_log)``) applied;
- a working byte-level BPE vocabulary (the 256 GPT-2 byte tokens, filler pieces up to the
  model's vocabulary size, two control tokens where there is room);
- ``qtype`` q8_0, q4_0, q4_k, mxfp4: the graph's own quantised blocks (``--weight-dtype``, per
  tensor as ``workbench.models.weight_types`` says), written byte for byte, so llama.cpp reads
  exactly the blocks the reference dequantises; quantised rows are permuted and split as whole
  rows (the graph stores gpt-oss's experts output-major, as the GGUF does, in every dtype).

Tensors are produced one at a time, so the full-size presets stream to disk.

``fill="tiled"`` (``workbench gguf --fill tiled``) is for timing runs only: a tensor larger
than :data:`EXACT_ELEMS` repeats a few rows (:data:`POOL_ELEMS` values) drawn from its own seeded distribution
(same scale, quantised the same way) instead of drawing every row, so a 16 GB model is written
at disk speed rather than in minutes. The values differ from ``random_weights``, so logits no
longer match the other backends' runs of the preset; a backend that runs the *file*
(``workbench run --model FILE.gguf``) reads the same values as llama.cpp. Decode time does not
depend on the values, except MoE routing, which stays random-like: routers (and norms, biases,
every tensor up to the pool size) are drawn exactly, and the tokens differ row by row.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..graph import is_quantized
from .config import GGUF_ARCHS, ConfigError, ModelConfig
from .rope import rope_params
from .validate import WEIGHT_QTYPES

#: Hugging Face ``model_type`` -> GGUF ``general.architecture``.
ARCH_OF = {mt: arch for arch, mt in GGUF_ARCHS.items()}

#: ``--qtype`` -> how the matrices are stored: f16/f32, or a ggml block type (``--weight-dtype``).
QTYPES = ("f16", "f32", *WEIGHT_QTYPES)

#: Bumped when the file layout changes, so cached files are rewritten.
WRITER_VERSION = 2  # 2: gpt-oss's quantised experts drawn in the HF layout (new seeded values)

#: How weights are filled: ``exact`` = ``random_weights(seed)`` (logits compare with the other
#: backends); ``tiled`` = a seeded pool of rows repeated (timing runs; see the module docstring).
FILLS = ("exact", "tiled")
#: Tensors up to this many elements are drawn exactly by a ``tiled`` fill (norms, biases, and
#: every MoE router of the presets, so routing stays as random as the exact weights').
EXACT_ELEMS = 1 << 20
#: Elements (whole rows, at least one) a larger ``tiled`` tensor draws before repeating them.
POOL_ELEMS = 1 << 16

#: workbench dtype -> ggml type name (``gguf.GGMLQuantizationType``) and the file type it makes.
GGML_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_k": "Q4_K",
              "q6_k": "Q6_K", "mxfp4": "MXFP4"}
FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0",
              "q4_k": "MOSTLY_Q4_K_S", "mxfp4": "MOSTLY_MXFP4_MOE"}

Array = np.ndarray
Rule = Callable[[Array], list[tuple[str, Array]]]


class GGUFWriteError(ValueError):
    """A model or option the GGUF writer cannot write; the message names the fix."""


# ------------------------------------------------------------------------------------------
# vocabulary
# ------------------------------------------------------------------------------------------

def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode pieces, one per byte value (byte-level BPE's base vocabulary)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def vocabulary(n_vocab: int) -> tuple[list[str], list[int], dict[str, int]]:
    """(pieces, token types, special ids) of a byte-level BPE vocabulary of ``n_vocab`` pieces:
    any text tokenizes (every byte has a token) and every id decodes."""
    import gguf

    if n_vocab < 256:
        raise GGUFWriteError(f"vocab_size {n_vocab} is below the 256 byte tokens a working vocabulary needs")
    tokens = byte_tokens()
    types = [gguf.TokenType.NORMAL] * 256
    special: dict[str, int] = {}
    n_fill = n_vocab - 256 - (2 if n_vocab >= 258 else 0)
    tokens += [f"\u0120t{i}" for i in range(n_fill)]  # "Ġt<i>": a word piece
    types += [gguf.TokenType.NORMAL] * n_fill
    if n_vocab >= 258:
        special = {"bos": len(tokens), "eos": len(tokens) + 1}
        tokens += ["<|begin_of_text|>", "<|end_of_text|>"]
        types += [gguf.TokenType.CONTROL] * 2
    return tokens, [int(t) for t in types], special


# ------------------------------------------------------------------------------------------
# tensors
# ------------------------------------------------------------------------------------------

def llama_permute(w: Array, n_head: int) -> Array:
    """``convert_hf_to_gguf.LlamaModel.permute``: HF's rotate-half row order -> ggml's
    interleaved pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_freq_factors(cfg: ModelConfig) -> Array | None:
    """The ``rope_freqs`` tensor the converter writes for Llama-3 rope scaling (None otherwise)."""
    scaling = cfg.get("rope_scaling", None) or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    plain = ModelConfig(cfg.name, {k: v for k, v in cfg.hf.items() if k != "rope_scaling"})
    inv_plain, _ = rope_params(plain)
    factor = float(scaling["factor"])
    lo, hi = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    out = []
    for f in inv_plain.astype(np.float64):
        wavelen = 2 * np.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            s = (old / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - s) / factor + s))
    return np.asarray(out, np.float32)


def tensor_rules(cfg: ModelConfig, graph) -> dict[str, Rule]:
    """HF weight name -> function from its (folded, storage-dtype) array to the GGUF tensors."""
    import gguf

    arch = ARCH_OF[cfg.model_type]
    tmap = gguf.get_tensor_name_map(_arch_enum(arch), cfg.n_layer)
    mt = cfg.model_type
    rules: dict[str, Rule] = {}
    for name in graph.weights:
        rules[name] = _rule(name, cfg, mt, tmap)
    return rules


def _arch_enum(arch: str):
    import gguf

    for k, v in gguf.MODEL_ARCH_NAMES.items():
        if v == arch:
            return k
    raise GGUFWriteError(f"gguf-py does not know the architecture {arch!r}; upgrade the gguf package")


def _rule(name: str, cfg: ModelConfig, mt: str, tmap) -> Rule:
    """The rule of one weight, given in the graph's layout ([.., out, in], blocks along ``in``)."""
    parts = name.split(".")
    il = int(parts[2]) if name.startswith("model.layers.") else None
    blk = f"blk.{il}"
    n_head, n_kv = int(cfg.get("num_attention_heads")), int(cfg.get("num_key_value_heads"))

    def mapped(suffix: str = "") -> str:
        base = name[: -len(".weight")] if name.endswith(".weight") else \
            name[: -len(".bias")] if name.endswith(".bias") else name
        out = tmap.get_name(base)
        if out is None:
            raise GGUFWriteError(f"no GGUF name for the weight {name!r} of {cfg.model_type} in gguf-py's "
                                 "TensorNameMap; upgrade the gguf package")
        return out + (suffix or (".bias" if name.endswith(".bias") else ".weight"))

    def one(target: str) -> Rule:
        """The tensor as it is, renamed (``identity``: the reader maps it without an index)."""
        fn = lambda a: [(target, a)]  # noqa: E731
        fn.identity = True  # type: ignore[attr-defined]
        return fn

    if mt == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = n_head if "q_proj" in name else n_kv
        target = mapped()
        return lambda a: [(target, llama_permute(a, heads))]
    if name.endswith("self_attn.sinks"):
        return one(f"{blk}.attn_sinks.weight")
    if name.endswith("experts.gate_up_proj"):
        if mt == "gpt_oss":  # [E, 2*ff, d] output-major (the graph's layout), gate/up rows interleaved
            return lambda a: [(f"{blk}.ffn_gate_exps.weight", a[:, 0::2]), (f"{blk}.ffn_up_exps.weight", a[:, 1::2])]
        return lambda a: [(f"{blk}.ffn_gate_exps.weight", a[:, : a.shape[1] // 2]),
                          (f"{blk}.ffn_up_exps.weight", a[:, a.shape[1] // 2:])]
    if name.endswith("experts.gate_up_proj_bias"):
        return lambda a: [(f"{blk}.ffn_gate_exps.bias", a[:, 0::2]), (f"{blk}.ffn_up_exps.bias", a[:, 1::2])]
    if name.endswith("experts.down_proj"):  # [E, d, ff] (gpt-oss's too: the graph stores it output-major)
        return one(f"{blk}.ffn_down_exps.weight")
    if name.endswith("experts.down_proj_bias"):
        return one(f"{blk}.ffn_down_exps.bias")
    if name.endswith("shared_expert_gate.weight"):
        return lambda a: [(f"{blk}.ffn_gate_inp_shexp.weight", a.reshape(-1))]
    if ".linear_attn." in name:
        return _gdn_rule(name, cfg, blk, mapped)
    return one(mapped())


def _gdn_rule(name: str, cfg: ModelConfig, blk: str, mapped: Callable[..., str]) -> Rule:
    """Qwen3-Next's linear-attention tensors in llama.cpp's (non-legacy) layout."""
    h_k, h_v = int(cfg.get("linear_num_key_heads")), int(cfg.get("linear_num_value_heads"))
    dk, dv = int(cfg.get("linear_key_head_dim")), int(cfg.get("linear_value_head_dim"))
    if dk != dv:
        raise GGUFWriteError(f"{cfg.name}: llama.cpp's qwen3next needs linear_key_head_dim == "
                             f"linear_value_head_dim (got {dk} and {dv})")
    rep = h_v // h_k
    if name.endswith("in_proj_qkvz.weight"):
        def qkvz(a: Array) -> list[tuple[str, Array]]:
            g = a.reshape(h_k, 2 * dk + 2 * rep * dv, a.shape[-1])  # rows per key head: q, k, v, z
            q, k = g[:, :dk], g[:, dk:2 * dk]
            v, z = g[:, 2 * dk:2 * dk + rep * dv], g[:, 2 * dk + rep * dv:]
            d = a.shape[-1]
            qkv = np.concatenate([q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)])
            return [(f"{blk}.attn_qkv.weight", qkv), (f"{blk}.attn_gate.weight", z.reshape(-1, d))]
        return qkvz
    if name.endswith("in_proj_ba.weight"):
        return lambda a: [(f"{blk}.ssm_ba.weight", a)]  # llama.cpp's LLM_TENSOR_SSM_BETA_ALPHA
    if name.endswith("conv1d.weight"):
        return lambda a: [(f"{blk}.ssm_conv1d.weight", a.reshape(a.shape[0], a.shape[-1]))]
    if name.endswith("dt_bias"):
        return lambda a: [(f"{blk}.ssm_dt.bias", a)]
    if name.endswith("A_log"):
        return lambda a: [(f"{blk}.ssm_a", a)]
    target = mapped()
    fn = lambda a: [(target, a)]  # noqa: E731
    fn.identity = True  # type: ignore[attr-defined]
    return fn


#: GGUF tensors the converter always stores in f32 (routers, norms, biases, recurrent params).
F32_SUFFIXES = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight")


def ggml_type(gguf_name: str, arr: Array, qtype: str, dtype: str | None = None):
    """The ggml type a tensor is stored as: a quantised graph tensor (``dtype``) in its block
    type, other matrices in ``qtype`` (or, in a quantised file, as the graph keeps them), the
    rest f32."""
    import gguf

    T = gguf.GGMLQuantizationType
    if dtype is not None and is_quantized(dtype):
        return T[GGML_NAMES[dtype]]
    if arr.ndim < 2 or gguf_name.endswith(F32_SUFFIXES) or arr.dtype == np.float32 and gguf_name.endswith(".bias"):
        return T.F32
    if is_quantized(qtype):
        return T.F32 if dtype == "f32" else T.F16  # what weight_types kept unquantised
    return T[GGML_NAMES[qtype]]


def gguf_tensors(cfg: ModelConfig, graph, weight: Callable[[str], Array]) -> Iterator[tuple[str, Array, str]]:
    """(GGUF name, array, graph dtype) for every tensor, in the converter's order (embeddings,
    rope factors, blocks, output). ``weight(hf_name)`` gives a graph weight's storage array; the
    array is float, or for a quantised tensor its uint8 blocks ``[..., row bytes]``."""
    from .weights import device_weight, to_float32

    rules = tensor_rules(cfg, graph)

    def key(name: str) -> tuple[int, int, str]:
        if name.startswith("model.layers."):
            return (1, int(name.split(".")[2]), name)
        return (0 if "embed_tokens" in name else 2, 0, name)

    factors = llama3_freq_factors(cfg) if cfg.model_type == "llama" else None
    names = sorted(graph.weights, key=key)
    for i, name in enumerate(names):
        if factors is not None and key(name)[0] == 1 and (i == 0 or key(names[i - 1])[0] == 0):
            yield "rope_freqs.weight", factors, "f32"
        dtype = graph.weights[name].dtype
        arr = device_weight(graph, name, weight(name))
        if not is_quantized(dtype) and arr.dtype not in (np.float16, np.float32):
            arr = to_float32(arr, dtype)
        for gname, a in rules[name](arr):
            yield gname, np.ascontiguousarray(a), dtype


# ------------------------------------------------------------------------------------------
# metadata
# ------------------------------------------------------------------------------------------

def add_metadata(w, cfg: ModelConfig, qtype: str) -> None:
    """The keys ``convert_hf_to_gguf.py`` writes for the architecture (and that ``from_gguf``
    reads back into the same config)."""
    import gguf

    mt = cfg.model_type
    hd = cfg.head_dim
    w.add_name(cfg.name)
    w.add_file_type(gguf.LlamaFileType[FILE_TYPES[qtype]])
    w.add_context_length(int(cfg.get("max_position_embeddings")))
    w.add_embedding_length(int(cfg.get("hidden_size")))
    w.add_block_count(cfg.n_layer)
    w.add_head_count(int(cfg.get("num_attention_heads")))
    w.add_head_count_kv(int(cfg.get("num_key_value_heads")))
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(cfg.get("rope_theta")))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps")))
    w.add_rope_dimension_count(int(hd * float(cfg.get("partial_rotary_factor", 1.0))))
    w.add_vocab_size(int(cfg.get("vocab_size")))
    if mt in ("llama", "qwen3"):
        w.add_feed_forward_length(int(cfg.get("intermediate_size")))
    if mt in ("qwen3_moe", "qwen3_next"):
        w.add_feed_forward_length(int(cfg.get("intermediate_size")))
        w.add_expert_count(int(cfg.get("num_experts")))
        w.add_expert_used_count(int(cfg.get("num_experts_per_tok")))
        w.add_expert_feed_forward_length(int(cfg.get("moe_intermediate_size")))
        w.add_expert_weights_norm(bool(cfg.get("norm_topk_prob", True)))
    if mt == "gpt_oss":
        w.add_expert_count(int(cfg.get("num_local_experts")))
        w.add_expert_used_count(int(cfg.get("num_experts_per_tok")))
        w.add_expert_feed_forward_length(int(cfg.get("intermediate_size")))
        w.add_sliding_window(int(cfg.get("sliding_window")))
        rs = cfg.get("rope_scaling", None) or {}
        if rs.get("rope_type") == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(rs["factor"]))
            w.add_rope_scaling_orig_ctx_len(int(rs["original_max_position_embeddings"]))
    if mt == "qwen3_next":
        w.add_expert_shared_feed_forward_length(int(cfg.get("shared_expert_intermediate_size")))
        w.add_ssm_conv_kernel(int(cfg.get("linear_conv_kernel_dim")))
        w.add_ssm_state_size(int(cfg.get("linear_key_head_dim")))
        w.add_ssm_group_count(int(cfg.get("linear_num_key_heads")))
        w.add_ssm_time_step_rank(int(cfg.get("linear_num_value_heads")))
        w.add_ssm_inner_size(int(cfg.get("linear_value_head_dim")) * int(cfg.get("linear_num_value_heads")))
        w.add_full_attention_interval(int(cfg.get("full_attention_interval", 4)))
    tokens, types, special = vocabulary(int(cfg.get("vocab_size")))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["\u0120 t"])  # llama.cpp's BPE loader needs the key; one merge suffices
    if special:
        w.add_bos_token_id(special["bos"])
        w.add_eos_token_id(special["eos"])
    w.add_add_bos_token(False)


# ------------------------------------------------------------------------------------------
# the file
# ------------------------------------------------------------------------------------------

def tiled_weight(graph, name: str, seed: int = 0, scratch: dict | None = None) -> Array:
    """``random_weight(graph, name, seed)`` for a tensor of up to :data:`EXACT_ELEMS` elements;
    a larger one (its rows: every axis but the last) repeats the rows of :data:`POOL_ELEMS` values drawn at the
    tensor's own scale from its own seeded stream, stored (quantised) as the tensor is.

    With ``scratch`` (a dict the caller keeps) a large result lives in a buffer the next call
    reuses: a writer that writes each tensor before drawing the next skips the page faults of a
    fresh allocation, most of a tiled write's time."""
    from .weights import _init, _stable_hash, random_weight, to_storage

    view = graph.weights[name]
    if view.numel <= EXACT_ELEMS or len(view.shape) < 2:
        return random_weight(graph, name, seed)
    k = view.shape[-1]
    n_rows = view.numel // k
    pool_rows = max(1, POOL_ELEMS // k)
    rng = np.random.default_rng([seed, _stable_hash(name)])
    pool = to_storage(np.asarray(_init(name, (pool_rows, k), rng, fan_in=k), np.float32), view.dtype)
    rows = _empty((n_rows, pool.shape[-1]), pool.dtype, scratch)
    done = min(pool_rows, n_rows)
    rows[:done] = pool[:done]
    while done < n_rows:  # doubling copies: memcpy speed (np.tile goes through repeat, 10x slower)
        k = min(done, n_rows - done)
        rows[done:done + k] = rows[:k]
        done += k
    return rows.reshape(*view.shape[:-1], pool.shape[-1])


def _empty(shape: tuple[int, int], dtype, scratch: dict | None) -> Array:
    """``np.empty(shape, dtype)``, or a view of ``scratch``'s buffer (grown as needed)."""
    if scratch is None:
        return np.empty(shape, dtype)
    n = shape[0] * shape[1] * np.dtype(dtype).itemsize
    buf = scratch.get("buf")
    if buf is None or buf.nbytes < n:
        buf = scratch["buf"] = np.empty(n, np.uint8)
    return buf[:n].view(dtype).reshape(shape)


def write_gguf(cfg: ModelConfig, path: str | Path, *, seed: int = 0, qtype: str = "f16",
               fill: str = "exact") -> Path:
    """Write ``cfg`` with ``random_weights(build_graph(cfg), seed)`` as a GGUF at ``path``
    (a block ``qtype``: of ``cfg.with_(weight_dtype=qtype)``, the weights a run with
    ``--weight-dtype qtype`` draws; ``fill="tiled"``: :func:`tiled_weight` instead, for timing)."""
    import gguf

    from . import build_graph
    from .weights import random_weight

    if fill not in FILLS:
        raise GGUFWriteError(f"--fill {fill!r} is not supported; choose one of {', '.join(FILLS)} (exact: the "
                             "seeded weights every backend runs; tiled: fast, for timing only)")
    if qtype not in QTYPES:
        raise GGUFWriteError(f"--qtype {qtype!r} is not supported; choose one of {', '.join(QTYPES)}")
    if cfg.model_type not in ARCH_OF:
        raise GGUFWriteError(f"{cfg.name}: model_type {cfg.model_type!r} has no GGUF architecture here; "
                             f"supported: {', '.join(sorted(ARCH_OF))}")
    if is_quantized(qtype) and cfg.weight_dtype in ("f16", qtype):
        cfg = cfg.with_(weight_dtype=qtype)
    elif cfg.weight_dtype != "f16":
        raise GGUFWriteError(f"{cfg.name}: weight dtype {cfg.weight_dtype!r}: the GGUF writer takes f16 weights "
                             "(or the --qtype's own)")
    graph = build_graph(cfg, n_kv=1)  # weights do not depend on the KV length
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.part")  # concurrent writers of one cache entry

    # pass 1: names, shapes and types (zeros: calloc'd pages, no weights generated)
    def shape_only(name: str) -> Array:
        v = graph.weights[name]
        if is_quantized(v.dtype):
            return np.zeros((*v.counts, v.itemsize), np.uint8).reshape(*v.shape[:-1], -1)
        return np.zeros(v.shape, np.float16 if v.dtype == "f16" else np.float32)

    w = gguf.GGUFWriter(str(tmp), ARCH_OF[cfg.model_type])
    add_metadata(w, cfg, qtype)
    infos = []
    for gname, a, dtype in gguf_tensors(cfg, graph, shape_only):
        tt = ggml_type(gname, a, qtype, dtype)
        dt = np.uint8 if is_quantized(dtype) else np.float16 if tt == gguf.GGMLQuantizationType.F16 else np.float32
        w.add_tensor_info(gname, a.shape, np.dtype(dt), a.size * np.dtype(dt).itemsize, raw_dtype=tt)
        infos.append((gname, dt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # pass 2: the values, one HF tensor at a time
    scratch: dict = {}  # each tensor is written before the next is drawn

    def draw(name: str) -> Array:
        return random_weight(graph, name, seed) if fill == "exact" else tiled_weight(graph, name, seed, scratch)

    for (gname, dt), (gname2, a, _) in zip(infos, gguf_tensors(cfg, graph, draw), strict=True):
        assert gname == gname2
        w.write_tensor_data(np.ascontiguousarray(a.astype(dt, copy=False)))
    w.close()
    os.replace(tmp, path)
    return path


def cache_dir() -> Path:
    return Path(os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench") / "gguf"


def cached_gguf(cfg: ModelConfig, *, seed: int = 0, qtype: str = "f16", fill: str = "exact") -> Path:
    """The GGUF of ``cfg`` (seeded random weights, or ``fill="tiled"``), written on first use and
    kept in the cache (``$WORKBENCH_CACHE``, default ``~/.cache/workbench``) under a hash of the
    config."""
    spec = {"hf": cfg.hf, "seed": seed, "qtype": qtype, "v": WRITER_VERSION}
    if fill != "exact":  # exact files keep their old names
        spec["fill"] = fill
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    tag = "" if fill == "exact" else f"-{fill}"
    path = cache_dir() / f"{cfg.name}-{cfg.n_layer}L-{qtype}{tag}-s{seed}-{digest}.gguf"
    if not path.is_file():
        write_gguf(cfg, path, seed=seed, qtype=qtype, fill=fill)
    return path


__all__ = ["FILLS", "QTYPES", "ConfigError", "GGUFWriteError", "cached_gguf", "gguf_tensors", "tiled_weight",
           "vocabulary", "write_gguf"]
