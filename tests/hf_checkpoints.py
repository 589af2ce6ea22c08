"""Tiny checkpoints written by the installed ``transformers`` (``save_pretrained``), for the
parity suite: a table of configs covering every field the graphs model, helpers to rewrite a
checkpoint into the older config keys, the fused expert layout or bf16, and the decode of
both sides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}
_BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)

#: name -> kwargs of ``AutoConfig.for_model`` (transformers 5 keys: ``rope_parameters``).
CHECKPOINTS: dict[str, dict] = {
    "llama-llama3-rope": dict(_BASE, model_type="llama", hidden_size=96, num_attention_heads=6,
                              rope_parameters={"rope_theta": 1e6, **_LLAMA3}),
    "llama-attention-bias": dict(_BASE, model_type="llama", attention_bias=True),
    "llama-mlp-bias": dict(_BASE, model_type="llama", mlp_bias=True, tie_word_embeddings=True),
    "llama-linear-rope": dict(_BASE, model_type="llama", rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                          "rope_theta": 5e5}),
    "llama-yarn-rope": dict(_BASE, model_type="llama",
                            rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                             "original_max_position_embeddings": 64, "beta_fast": 16.0,
                                             "mscale": 0.8, "mscale_all_dim": 0.5}),
    "qwen3-head-dim": dict(_BASE, model_type="qwen3", head_dim=24, rope_parameters={"rope_theta": 1e6,
                                                                                   "rope_type": "default"}),
    "qwen3-sliding": dict(_BASE, model_type="qwen3", head_dim=16, use_sliding_window=True, sliding_window=3,
                          max_window_layers=1, attention_bias=True),
    "qwen3-moe": dict(_BASE, model_type="qwen3_moe", head_dim=16, moe_intermediate_size=32, num_local_experts=6,
                      num_experts_per_tok=3, norm_topk_prob=False, num_hidden_layers=3, mlp_only_layers=[1],
                      decoder_sparse_step=1),
    "qwen3-moe-sparse-step": dict(_BASE, model_type="qwen3_moe", head_dim=16, moe_intermediate_size=32,
                                  num_local_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                                  decoder_sparse_step=2, use_sliding_window=True, sliding_window=4),
    "gpt-oss-sliding": dict(_BASE, model_type="gpt_oss", head_dim=16, intermediate_size=32, num_local_experts=4,
                            num_experts_per_tok=2, sliding_window=5,
                            rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                             "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                             "original_max_position_embeddings": 64}),
    "qwen3-next": dict(_BASE, model_type="qwen3_next", head_dim=32, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, num_hidden_layers=4, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                       num_experts_per_tok=2, attention_bias=True, mlp_only_layers=[2]),
}

#: A decode longer than every sliding window above.
TOKENS = [3, 17, 95, 9, 42, 7, 60, 1, 33, 5]


def randomize(model, seed: int = 0) -> None:
    """Every parameter drawn at a scale that keeps activations O(1) (transformers initialises
    biases to zero and linear weights tiny, which would hide an ignored bias or rope)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                base = 0.0 if "qwen3_next" in model.config.model_type else 1.0  # zero-centred norms
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                fan_in = min(p.shape[-2:]) if p.ndim == 3 and "experts" in name else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def save_checkpoint(name: str, folder: Path, dtype: str = "float32") -> Path:
    """``save_pretrained`` of a randomized ``CHECKPOINTS[name]`` model into ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**json.loads(json.dumps(CHECKPOINTS[name])))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder)
    return folder


def hf_logits(folder: Path, tokens: list[int] = TOKENS) -> np.ndarray:
    """transformers' logits per decode step for the checkpoint in ``folder`` (float32, eager)."""
    import torch
    from hf_parity import hf_decode_logits
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return hf_decode_logits(model, tokens)


def workbench_logits(folder: Path, tokens: list[int] = TOKENS) -> np.ndarray:
    """The reference executor's logits for the checkpoint in ``folder``, read by path."""
    from workbench.exec.reference import run_reference
    from workbench.models import build_graph, load_config
    from workbench.models.weights import model_weights

    cfg = load_config(str(folder), context=32, weight_dtype="f32", kv_dtype="f32")
    return run_reference(cfg, model_weights(cfg, build_graph(cfg)), tokens).logits


def to_old_keys(src: Path, dst: Path) -> Path:
    """The checkpoint with config.json rewritten to transformers 4's keys (``rope_theta`` /
    ``rope_scaling`` / ``partial_rotary_factor`` at the top, ``num_experts``, no ``layer_types``
    where the older config derived them) and the same safetensors."""
    dst.mkdir(parents=True, exist_ok=True)
    hf = json.loads((src / "config.json").read_text())
    rope = hf.pop("rope_parameters", None) or {}
    hf["rope_theta"] = rope.pop("rope_theta", 10000.0)
    if "partial_rotary_factor" in rope:
        hf["partial_rotary_factor"] = rope.pop("partial_rotary_factor")
    if rope.get("rope_type", "default") != "default":
        hf["rope_scaling"] = rope
    if hf["model_type"] == "qwen3_moe":
        hf["num_experts"] = hf.pop("num_local_experts")
    if hf["model_type"] in ("qwen3", "qwen3_next"):
        hf.pop("layer_types", None)  # derived from max_window_layers / full_attention_interval (default 4)
    (dst / "config.json").write_text(json.dumps(hf, indent=2))
    for f in src.glob("*.safetensors"):
        shutil.copy(f, dst / f.name)
    return dst


def to_fused_experts(src: Path, dst: Path) -> Path:
    """The checkpoint with per-expert tensors fused as transformers 5 holds them in memory
    (``experts.gate_up_proj`` [E, 2*n_ff, d], ``experts.down_proj`` [E, d, n_ff])."""
    import re

    from safetensors.numpy import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(str(src / "model.safetensors"))
    out, experts = {}, {}
    for k, v in tensors.items():
        m = re.match(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", k)
        if m:
            experts.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = v
        else:
            out[k] = v
    assert experts, "no per-expert tensors to fuse"
    for pre, by_e in experts.items():
        order = [by_e[e] for e in sorted(by_e)]
        out[f"{pre}.gate_up_proj"] = np.stack([np.concatenate([p["gate_proj"], p["up_proj"]]) for p in order])
        out[f"{pre}.down_proj"] = np.stack([p["down_proj"] for p in order])
    save_file(out, str(dst / "model.safetensors"))
    return dst
