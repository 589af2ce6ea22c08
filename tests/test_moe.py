"""The MoE family (Qwen3-MoE, gpt-oss): llama.cpp's graph shape, expert views onto the Hugging
Face fused tensors, gpt-oss attention (sinks, alternating sliding window) and the expert FFN
against a direct NumPy formula."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.exec.memory import Memory
from workbench.exec.reference import execute_graph, load_static, run_reference
from workbench.exec.reference_ops import sigmoid, silu, softmax
from workbench.models import build_graph, preset
from workbench.models.blocks import step_input_values
from workbench.models.weights import hf_shape, random_weights, swap_hf_layout, to_float32

QWEN_ORDER = ["ffn_moe_logits", "ffn_moe_probs", "ffn_moe_topk", "ffn_moe_weights", "ffn_moe_weights_sum",
              "ffn_moe_weights_norm", "ffn_moe_up", "ffn_moe_gate", "ffn_moe_swiglu", "ffn_moe_down",
              "ffn_moe_weighted", "ffn_moe_out"]
OAI_ORDER = ["ffn_moe_logits", "ffn_moe_logits_biased", "ffn_moe_topk", "ffn_moe_weights",
             "ffn_moe_weights_softmax", "ffn_moe_up", "ffn_moe_up_biased", "ffn_moe_gate", "ffn_moe_gate_biased",
             "ffn_moe_swiglu_oai", "ffn_moe_down", "ffn_moe_down_biased", "ffn_moe_weighted", "ffn_moe_out"]


@pytest.mark.parametrize("name,order", [("qwen3-moe-tiny", QWEN_ORDER), ("gpt-oss-tiny", OAI_ORDER)])
def test_expert_ffn_nodes_follow_build_moe_ffn(name, order):
    graph = build_graph(preset(name, context=16))
    for il in range(2):
        got = [n.name.rsplit("-", 1)[0] for n in graph.nodes
               if n.name.startswith("ffn_moe_") and n.name.endswith(f"-{il}")]
        assert got == order
        ops = {n.name.rsplit("-", 1)[0]: n.op for n in graph.nodes if n.name.endswith(f"-{il}")}
        assert [ops[k] for k in ("ffn_moe_topk", "ffn_moe_weights", "ffn_moe_up", "ffn_moe_down")] == \
            ["ARGSORT_TOP_K", "GET_ROWS", "MUL_MAT_ID", "MUL_MAT_ID"]
        assert graph.node(f"ffn_moe_topk-{il}").dst.dtype == "i32"
        assert graph.node(f"ffn_moe_out-{il}").dst.shape == (1, 64)


def _loaded(name: str, seed: int = 0):
    cfg = preset(name, context=16, kv_dtype="f32")
    graph = build_graph(cfg)
    weights = random_weights(graph, seed)
    mem = Memory()
    load_static(graph, mem, weights)
    return cfg, graph, weights, mem


def test_qwen3_moe_expert_views_are_the_hf_fused_tensor():
    """gate/up are the first/second half of ``gate_up_proj`` [E, 2*ff, d]; no copies, no new names."""
    cfg, graph, weights, mem = _loaded("qwen3-moe-tiny")
    ff = cfg.get("moe_intermediate_size")
    fused = to_float32(weights["model.layers.0.mlp.experts.gate_up_proj"], "f16")
    gate, up = graph.node("ffn_moe_gate-0").srcs[0], graph.node("ffn_moe_up-0").srcs[0]
    assert gate.buffer.name == up.buffer.name == "model.layers.0.mlp.experts.gate_up_proj"
    np.testing.assert_array_equal(mem.read(gate), fused[:, :ff, :])
    np.testing.assert_array_equal(mem.read(up), fused[:, ff:, :])
    assert not any(".gate_proj" in w or ".up_proj" in w for w in graph.weights)


def test_gpt_oss_expert_views_deinterleave_the_output_major_tensors():
    """gpt-oss's experts are stored output-major (the GGUF's layout: unit K stride for the vector
    mat-vecs) with gate/up rows interleaved: gate is rows 0, 2, 4, ... of ``gate_up_proj``
    [E, 2*ff, d], up the odd ones; the HF input-major tensors are their transposes."""
    cfg, graph, weights, mem = _loaded("gpt-oss-tiny")
    pre = "model.layers.1.mlp.experts."
    w = to_float32(weights[pre + "gate_up_proj"], "f16")
    b = weights[pre + "gate_up_proj_bias"]
    down, down_b = to_float32(weights[pre + "down_proj"], "f16"), weights[pre + "down_proj_bias"]
    d, ff, n_exp = cfg.get("hidden_size"), cfg.get("intermediate_size"), cfg.get("num_local_experts")
    assert w.shape == (n_exp, 2 * ff, d) and down.shape == (n_exp, d, ff)
    assert hf_shape(graph, pre + "gate_up_proj") == (n_exp, d, 2 * ff)
    assert hf_shape(graph, pre + "down_proj") == (n_exp, ff, d)
    np.testing.assert_array_equal(swap_hf_layout(graph, pre + "gate_up_proj", w), w.transpose(0, 2, 1))
    gate, up, dn = (graph.node(f"ffn_moe_{k}-1") for k in ("gate", "up", "down"))
    for v in (gate.srcs[0], up.srcs[0], dn.srcs[0]):
        assert v.strides[-1] == v.itemsize  # K contiguous
    np.testing.assert_array_equal(mem.read(gate.srcs[0]), w[:, 0::2])
    np.testing.assert_array_equal(mem.read(up.srcs[0]), w[:, 1::2])
    np.testing.assert_array_equal(mem.read(dn.srcs[0]), down)
    np.testing.assert_array_equal(mem.read(graph.node("ffn_moe_gate_biased-1").srcs[1]), b[:, 0::2])
    np.testing.assert_array_equal(mem.read(graph.node("ffn_moe_up_biased-1").srcs[1]), b[:, 1::2])
    np.testing.assert_array_equal(mem.read(graph.node("ffn_moe_down_biased-1").srcs[1]), down_b)


def test_gpt_oss_attention_sinks_and_alternating_sliding_window():
    graph = build_graph(preset("gpt-oss-tiny", layers=4, context=16))
    assert graph.meta["sliding_window"] == 4 and "kq_mask_swa" in graph.inputs
    for il in range(4):
        attn = graph.node(f"kqv_out-{il}")
        assert len(attn.srcs) == 5 and attn.srcs[4].buffer.name == f"model.layers.{il}.self_attn.sinks"
        assert attn.srcs[3].buffer.name == ("kq_mask_swa" if il % 2 == 0 else "kq_mask")
        for proj in ("Qcur", "Kcur", "Vcur", "attn_out"):
            assert graph.node(f"{proj}-{il}_b").op == "ADD"
    qwen = build_graph(preset("qwen3-moe-tiny", context=16))
    assert "kq_mask_swa" not in qwen.inputs and len(qwen.node("kqv_out-0").srcs) == 4
    assert qwen.node("Qcur_normed-0").op == "MUL"


def _expected_moe(cfg, weights, x: np.ndarray, il: int) -> np.ndarray:
    """The expert FFN of one token written directly from the Hugging Face modules' formulas."""
    pre = f"model.layers.{il}.mlp."

    def f(name: str) -> np.ndarray:
        arr = weights[pre + name]
        return to_float32(arr, "f16") if arr.dtype == np.float16 else arr.astype(np.float32)

    k = cfg.get("num_experts_per_tok")
    if cfg.model_type == "gpt_oss":
        logits = f("router.weight") @ x + f("router.bias")
        top = np.argsort(-logits, kind="stable")[:k]
        scores = softmax(logits[top])
        out = np.zeros_like(x)
        limit = cfg.get("swiglu_limit")
        for e, s in zip(top, scores):
            gu = f("experts.gate_up_proj")[e] @ x + f("experts.gate_up_proj_bias")[e]  # stored [2*ff, d]
            g, u = np.minimum(gu[0::2], limit), np.clip(gu[1::2], -limit, limit)
            h = (u + 1) * g * sigmoid(1.702 * g)
            out += s * (f("experts.down_proj")[e] @ h + f("experts.down_proj_bias")[e])
        return out
    probs = softmax(f("gate.weight") @ x)
    top = np.argsort(-probs, kind="stable")[:k]
    scores = probs[top] / probs[top].sum()
    ff = cfg.get("moe_intermediate_size")
    out = np.zeros_like(x)
    for e, s in zip(top, scores):
        gu = f("experts.gate_up_proj")[e] @ x
        out += s * (f("experts.down_proj")[e] @ (silu(gu[:ff]) * gu[ff:]))
    return out


@pytest.mark.parametrize("name", ["qwen3-moe-tiny", "gpt-oss-tiny"])
def test_expert_ffn_matches_direct_formula(name):
    """Independent of torch: the graph's ``ffn_moe_out`` equals the formula applied to the
    graph's own ``ffn_norm`` output, for every layer, at a few positions."""
    cfg, graph, weights, mem = _loaded(name, seed=5)
    for pos, tok in enumerate([5, 99, 250]):
        for key, value in step_input_values(graph, tok, pos).items():
            mem.write(graph.inputs[key], value)
        execute_graph(graph, mem)
        for il in range(cfg.n_layer):
            x = mem.read(graph.node(f"ffn_norm-{il}").dst).reshape(-1)
            got = mem.read(graph.node(f"ffn_moe_out-{il}").dst).reshape(-1)
            np.testing.assert_allclose(got, _expected_moe(cfg, weights, x, il), rtol=1e-5, atol=1e-6)


def test_qwen3_moe_dense_layers_and_sparse_step():
    """``mlp_only_layers`` / ``decoder_sparse_step`` give llama FFN layers with HF names."""
    cfg = preset("qwen3-moe-tiny", layers=4, context=16)
    cfg = cfg.__class__(cfg.name, {**cfg.hf, "mlp_only_layers": [0], "decoder_sparse_step": 2}, cfg.context)
    graph = build_graph(cfg)
    dense = [il for il in range(4) if f"model.layers.{il}.mlp.gate_proj.weight" in graph.weights]
    sparse = [il for il in range(4) if f"model.layers.{il}.mlp.experts.gate_up_proj" in graph.weights]
    assert dense == [0, 2] and sparse == [1, 3]
    assert graph.node("ffn_swiglu-0").op == "GLU" and graph.node("ffn_moe_out-1").op == "SUM_ROWS"


def test_qwen3_moe_dense_layers_match_transformers():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_parity import hf_decode_logits, hf_model, max_rel_err, tiny_weights

    cfg = preset("qwen3-moe-tiny", layers=3, context=16, kv_dtype="f32")
    cfg = cfg.__class__(cfg.name, {**cfg.hf, "mlp_only_layers": [1]}, cfg.context, kv_dtype="f32")
    tokens = [3, 17, 250, 9, 42]
    weights = tiny_weights(cfg)
    err = max_rel_err(run_reference(cfg, weights, tokens).logits, hf_decode_logits(hf_model(cfg, weights), tokens))
    assert err <= 1e-4, err


def test_layers_override_repeats_the_sliding_pattern():
    cfg = preset("gpt-oss-tiny", layers=5)
    assert cfg.get("layer_types") == ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"]
    assert preset("gpt-oss-20b", layers=3).get("layer_types") == \
        ["sliding_attention", "full_attention", "sliding_attention"]
    assert build_graph(cfg).node("kqv_out-4").srcs[3].buffer.name == "kq_mask_swa"
