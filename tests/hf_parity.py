"""Shared helpers for parity tests against Hugging Face ``transformers`` (CPU, float32)."""

from __future__ import annotations

import numpy as np

from workbench.models import ModelConfig, build_graph
from workbench.models.weights import random_weights, swap_hf_layout, to_float32


def hf_model(cfg: ModelConfig, weights: dict[str, np.ndarray]):
    """The transformers model of ``cfg`` in float32 holding exactly ``weights``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.for_model(**cfg.hf)
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_cfg, torch_dtype=torch.float32)
    model.eval()
    graph = build_graph(cfg)
    state = {k: torch.from_numpy(np.ascontiguousarray(swap_hf_layout(graph, k, to_float32(v, graph.weights[k].dtype))))
             for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if cfg.get("tie_word_embeddings", False):
        missing = [m for m in missing if m != "lm_head.weight"]
    assert not missing and not unexpected, (missing, unexpected)
    return model


def hf_decode_logits(model, tokens: list[int], cache=None) -> np.ndarray:
    """Feed ``tokens`` one at a time with the model's cache; logits per step. Pass ``cache``
    (a ``DynamicCache``) to inspect the states it holds afterwards."""
    import torch
    from transformers import DynamicCache

    cache = cache if cache is not None else DynamicCache(config=model.config)
    out = []
    with torch.no_grad():
        for pos, t in enumerate(tokens):
            r = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True,
                      position_ids=torch.tensor([[pos]]), cache_position=torch.tensor([pos]))
            cache = r.past_key_values
            out.append(r.logits[0, -1].numpy().astype(np.float32))
    return np.stack(out)


def max_rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a-b| / max |b| per step, worst step (scale-aware relative error of logits)."""
    return float(max(np.max(np.abs(x - y)) / np.max(np.abs(y)) for x, y in zip(a, b)))


def tiny_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    return random_weights(build_graph(cfg), seed)
