"""Quantised weights in the graph: per-tensor storage types, the bytes the cost model sees, the
QUANTIZE_Q8_1 nodes, Plans, the GGUF round trip (write, read back, same logits) and clear errors."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pytest

from workbench.exec.backend import BackendError, RunRequest
from workbench.exec.cost import kernel_name
from workbench.exec.cuda_backend import CudaBackend
from workbench.exec.reference import run_reference
from workbench.models import TINY_PRESETS, ConfigError, build_graph, load_config, preset
from workbench.models.gguf_write import write_gguf
from workbench.models.weights import model_weights, random_weights
from workbench.strategy import Strategy, compile_plan

CONTEXT = 32
QTYPES = ("q8_0", "q4_0", "q4_k", "mxfp4")


def types(cfg) -> dict[str, str]:
    return {n: v.dtype for n, v in build_graph(cfg, n_kv=1).weights.items()}


def test_storage_types_follow_the_converter():
    t = types(preset("gpt-oss-tiny", weight_dtype="mxfp4"))
    assert t["model.layers.0.mlp.experts.gate_up_proj"] == "mxfp4"  # experts mxfp4 (MXFP4_MOE)
    assert t["model.layers.0.self_attn.q_proj.weight"] == "q8_0"      # other matrices q8_0
    assert t["model.layers.0.mlp.router.weight"] == "f32"             # routers f32
    assert t["model.layers.0.input_layernorm.weight"] == "f32"
    t = types(preset("llama-tiny", weight_dtype="q4_k"))             # rows of 64: not whole q4_k blocks
    assert t["model.layers.0.self_attn.q_proj.weight"] == "f16"
    t = types(preset("llama-3.2-1b", layers=1, weight_dtype="q4_k"))
    assert t["model.layers.0.mlp.down_proj.weight"] == "q4_k" and t["model.embed_tokens.weight"] == "q4_k"
    assert t["model.layers.0.post_attention_layernorm.weight"] == "f32"


@pytest.mark.parametrize("qtype,ratio", [("q8_0", 34 / 64), ("q4_0", 18 / 64), ("q4_k", 144 / 512)])
def test_mat_vec_bytes_shrink_by_the_block_ratio(qtype, ratio):
    """The cost model's bytes per mat-vec: the weight's blocks (vs f16), q8_1 activations in."""
    f16 = build_graph(preset("llama-3.2-1b", layers=1, context=CONTEXT))
    q = build_graph(preset("llama-3.2-1b", layers=1, context=CONTEXT, weight_dtype=qtype))
    a, b = f16.node("ffn_out-0"), q.node("ffn_out-0")
    w16, wq = a.srcs[0], b.srcs[0]
    assert wq.nbytes == pytest.approx(w16.nbytes * ratio)
    x = b.srcs[1]
    assert x.dtype == "q8_1" and x.nbytes == x.numel // 32 * 36
    assert b.bytes == pytest.approx(wq.nbytes + x.nbytes + b.dst.nbytes)
    assert kernel_name(b) == "mul_mat_vec_q" and kernel_name(a) == "mul_mat_vec_f"
    assert kernel_name(q.node("inp_embd")) == "k_get_rows" and kernel_name(f16.node("inp_embd")) == "k_get_rows_float"
    quantize = q.node("ffn_out-0_q8_1")
    assert quantize.op == "QUANTIZE_Q8_1" and kernel_name(quantize) == "quantize_q8_1"
    assert quantize.srcs[0].dtype == "f32" and quantize.srcs[0].shape == x.shape  # reads the f32 activation
    mm = [n for n in q.nodes if n.op in ("MUL_MAT", "MUL_MAT_ID")]
    assert all(n.srcs[1].dtype == "q8_1" for n in mm)  # every mat-mul of quantised weights


def test_moe_experts_cost_the_selected_experts_blocks():
    g = build_graph(preset("qwen3-30b-a3b", layers=1, context=CONTEXT, weight_dtype="q4_0"))
    n = g.node("ffn_moe_down-0")
    w = n.srcs[0]
    assert w.dtype == "q4_0" and n.bytes == pytest.approx(w.nbytes * 8 / 128 + n.srcs[1].nbytes + n.dst.nbytes)


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_plans_keep_the_reference_logits_and_qkv_still_forks(name):
    """Fusions, allocators and streams over graphs with QUANTIZE_Q8_1 nodes change no logit."""
    cfg = preset(name, context=CONTEXT, weight_dtype="q4_0")
    weights = random_weights(build_graph(cfg), 0)
    base = run_reference(cfg, weights, [3, 17]).logits
    fusions = (frozenset(), frozenset({"rms-norm-mul", "copy-elim"}), MMVQ_FUSIONS)
    for fusion, alloc in product(fusions, ("serial-reuse", "stream-aware")):
        s = Strategy(fusion=fusion, allocator=alloc, streams="qkv")
        got = run_reference(cfg, weights, [3, 17],
                            graph_for=lambda pos, s=s: compile_plan(build_graph(cfg, pos=pos), s).graph).logits
        assert np.max(np.abs(got - base)) <= 1e-5, (sorted(fusion), alloc)
    plan = compile_plan(build_graph(cfg, pos=0), Strategy(streams="qkv", graphs=True))
    assert plan.n_streams == 3


#: llama.cpp's fusions that take quantised mat-vecs (mmvq's bias and gate/up epilogues)
MMVQ_FUSIONS = frozenset({"mul-mat-add", "mul-mat-glu", "rms-norm-mul", "copy-elim", "add-chain"})


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_quantised_gate_and_up_fuse_over_one_q8_1_copy(name):
    """mul-mat-glu on quantised weights: the gate's and the up's mat-vecs become one fused node
    that reads the gate's q8_1 copy, and the up's QUANTIZE_Q8_1 goes with them (llama.cpp's fused
    mmvq quantises its input once); mul-mat-add folds the residual adds into the mat-vecs."""
    cfg = preset(name, context=CONTEXT, weight_dtype="q4_0")
    g = build_graph(cfg, pos=0)
    fused = compile_plan(g, Strategy(fusion=MMVQ_FUSIONS)).graph
    glus = [n for n in fused.nodes if n.op in ("MUL_MAT_GLU", "MUL_MAT_ID_GLU")]
    plain = sum(n.op == "GLU" for n in g.nodes if n.params.get("glu", "swiglu") == "swiglu")
    assert len(glus) == plain and (plain > 0 or name.startswith("gpt-oss"))  # swiglu_oai has no fused kernel
    for n in glus:
        q = n.srcs[2]
        assert q.dtype == "q8_1" and n.srcs[0].dtype == "q4_0"
        assert any(f.endswith("_q8_1") for f in n.params["fused"])  # the up's quantize was absorbed
    quantizes = [sum(n.op == "QUANTIZE_Q8_1" for n in x.nodes) for x in (g, fused)]
    assert quantizes[0] - quantizes[1] == len(glus)
    assert any(n.op == "MUL_MAT_ADD" and n.srcs[0].dtype == "q4_0" for n in fused.nodes)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_gguf_round_trip_reads_the_stored_blocks(tmp_path, name, qtype):
    """Write the quantised GGUF, read it back (config and weights): the same logits, bit for bit."""
    cfg = preset(name, context=CONTEXT, weight_dtype=qtype)
    path = write_gguf(cfg, tmp_path / "m.gguf", seed=3, qtype=qtype)
    back = load_config(str(path), context=CONTEXT)
    assert types(back) == types(cfg)
    g = build_graph(back)
    w = model_weights(back, g)
    want = run_reference(cfg, random_weights(build_graph(cfg), 3), [5, 9]).logits
    np.testing.assert_array_equal(run_reference(back, w, [5, 9]).logits, want)


def test_a_renamed_tensor_is_memory_mapped(tmp_path):
    path = write_gguf(preset("qwen3-tiny"), tmp_path / "m.gguf", qtype="q8_0")
    cfg = load_config(str(path))
    w = model_weights(cfg, build_graph(cfg))
    assert isinstance(w["model.layers.0.mlp.down_proj.weight"], np.memmap) or \
        isinstance(w["model.layers.0.mlp.down_proj.weight"].base, np.memmap)


def test_truncated_gguf_names_the_tensor(tmp_path):
    path = write_gguf(preset("llama-tiny"), tmp_path / "m.gguf", qtype="q4_0")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ConfigError, match=r"truncated: tensor 'output.weight' \(Q4_0\)"):
        load_config(str(cut))


def test_unsupported_tensor_type_names_type_and_tensor(tmp_path, monkeypatch):
    """IQ4_NL has q4_0's block size: a file of them configures (sim and llama.cpp run it) and its
    weights are refused by name."""
    import workbench.models.gguf_write as gw

    monkeypatch.setitem(gw.GGML_NAMES, "q4_0", "IQ4_NL")
    path = write_gguf(preset("llama-tiny"), tmp_path / "m.gguf", qtype="q4_0")
    cfg = load_config(str(path))
    with pytest.raises(ConfigError, match="tensor 'token_embd.weight' is stored as IQ4_NL, which the workbench"):
        model_weights(cfg, build_graph(cfg))


def test_cuda_backend_names_block_types_it_has_no_kernel_for(monkeypatch):
    """A block type without an mmvq kernel (q6_k of a Q4_K_M GGUF, say) is refused by name
    before any GPU work; here q8_0 stands in for it."""
    from workbench.exec import cuda_quant_ops

    monkeypatch.setattr(cuda_quant_ops, "MMVQ_TYPES", ("q4_0",))
    cfg = preset("llama-tiny", context=CONTEXT, weight_dtype="q8_0")
    plan = compile_plan(build_graph(cfg, pos=0), Strategy())
    with pytest.raises(BackendError, match="q8_0 weights have no cuda kernel"):
        CudaBackend().run(RunRequest(cfg, Strategy(), [plan], [1]))


def test_run_json_reports_argmax_tokens(capsys):
    from workbench.cli import main

    assert main(["run", "--model", "qwen3-tiny", "--weight-dtype", "q4_0", "--backend", "reference",
                 "--tokens", "3", "--context", str(CONTEXT), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cfg = preset("qwen3-tiny", context=CONTEXT, weight_dtype="q4_0")
    from workbench.api import run

    logits = run(cfg, Strategy(), tokens=3, backend="reference").logits
    assert out["argmax_tokens"] == [int(t) for t in logits.argmax(axis=1)] and out["weight_dtype"] == "q4_0"
