"""Qwen3-Next (hybrid gated delta net): full-size shapes, the op -> tail view -> CPY state
pattern of PR #23940, recurrent states against transformers, and copy elimination."""

import numpy as np
import pytest
from hf_parity import hf_decode_logits, hf_model, tiny_weights

from workbench.exec.reference import run_reference
from workbench.graph import Graph
from workbench.models import PUBLISHED_PARAMS, ConfigError, build_graph, preset
from workbench.models.qwen3next import layer_types
from workbench.strategy.fusion import eliminate_copies

TOKENS = [3, 17, 250, 9, 42, 7, 100, 1]
#: (producer op, CPY name, cache name) of each linear-attention layer's two recurrent states
STATE_COPIES = (("SSM_CONV", "conv_state_cpy", "cache_r_l"), ("GATED_DELTA_NET", "ssm_state_cpy", "cache_s_l"))


@pytest.fixture(scope="module")
def full_graph() -> Graph:
    return build_graph(preset("qwen3-next-80b-a3b"))


def test_full_size_builds_shapes_only_with_published_param_count(full_graph):
    cfg = full_graph.meta["config"]
    kinds = layer_types(cfg)
    assert kinds.count("full_attention") == 12 and kinds[3] == kinds[47] == "full_attention"
    assert {f"cache_s_l{il}" for il, k in enumerate(kinds) if k == "linear_attention"} <= set(full_graph.caches)
    assert {f"cache_k_l{il}" for il, k in enumerate(kinds) if k == "full_attention"} <= set(full_graph.caches)
    s = full_graph.summary()
    published = PUBLISHED_PARAMS["qwen3-next-80b-a3b"]
    assert abs(s["params"] - published) / published < 0.02, s["params"]
    assert 0 < s["bytes_per_token"] < s["weight_bytes"] / 10  # 10 of 512 experts are read


def test_state_snapshot_is_copied_to_the_cache_by_a_lone_cpy(full_graph):
    """Each state leaves its op as ``outs[1]``, a view of the tail of the op's own output
    buffer, and its only reader is a CPY into the state cache: the pattern a generic
    copy-elimination rule must find."""
    nodes, found = full_graph.nodes, 0
    for i, n in enumerate(nodes):
        for op, cpy_name, cache_name in STATE_COPIES:
            if n.op != op:
                continue
            il = int(n.name.rsplit("-", 1)[1])
            head, tail = n.outs
            assert tail.buffer == head.buffer and tail.buffer.kind == "act"
            assert tail.offset == head.offset + head.nbytes and tail.end == tail.buffer.nbytes
            readers = [j for j, m in enumerate(nodes) if any(s.overlaps(tail) for s in m.srcs)]
            assert [nodes[j].name for j in readers] == [f"{cpy_name}-{il}"]
            cpy = nodes[readers[0]]
            assert cpy.op == "CPY" and cpy.srcs == (tail,) and readers[0] == i + 1
            cache = full_graph.caches[f"{cache_name}{il}"]
            assert cpy.outs == (cache,) and cache in n.srcs and cache.buffer.kind == "cache"
            found += 1
    assert found == 2 * layer_types(full_graph.meta["config"]).count("linear_attention")


def test_gdn_op_costs_follow_the_src_order(full_graph):
    cfg = full_graph.meta["config"]
    h_k, h_v = cfg.get("linear_num_key_heads"), cfg.get("linear_num_value_heads")
    dk, dv = cfg.get("linear_key_head_dim"), cfg.get("linear_value_head_dim")
    gdn = full_graph.node("gated_delta_net-0")
    state = h_v * dk * dv
    assert gdn.flops == 7 * state
    # q/k are broadcast to the value heads by stride-0 views and read once
    assert gdn.bytes == 4 * (2 * h_k * dk + h_v * dv + 2 * h_v + state) + 4 * (h_v * dv + state)
    conv = full_graph.node("conv_output_raw-0")
    channels = 2 * h_k * dk + h_v * dv
    assert conv.flops == 2 * channels * cfg.get("linear_conv_kernel_dim")


@pytest.fixture(scope="module")
def tiny_runs():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import DynamicCache

    cfg = preset("qwen3-next-tiny", context=16, kv_dtype="f32")
    weights = tiny_weights(cfg)
    model = hf_model(cfg, weights)
    cache = DynamicCache(config=model.config)
    hf_logits = hf_decode_logits(model, TOKENS, cache)
    return cfg, weights, run_reference(cfg, weights, TOKENS), hf_logits, cache


def test_recurrent_states_match_transformers(tiny_runs):
    cfg, _, ours, _, cache = tiny_runs
    linear = [il for il, k in enumerate(layer_types(cfg)) if k == "linear_attention"]
    assert linear
    for il in linear:
        theirs_s = cache.get_recurrent_state(il)[0].numpy()  # [H_v, d_k, d_v]
        theirs_r = cache.get_conv_state(il)[0].numpy()[:, 1:]  # HF keeps d_conv columns, ggml d_conv - 1
        for name, theirs in ((f"cache_s_l{il}", theirs_s), (f"cache_r_l{il}", theirs_r)):
            mine = ours.caches[name]
            assert mine.shape == theirs.shape, name
            err = np.max(np.abs(mine - theirs)) / np.max(np.abs(theirs))
            assert err <= 1e-4, f"{name}: max relative error {err:.2e}"


def test_copy_elimination_keeps_logits_and_states(tiny_runs):
    cfg, weights, ours, _, _ = tiny_runs
    removed: list[str] = []

    def graph_for(pos: int) -> Graph:
        g, names = eliminate_copies(build_graph(cfg, cfg.kv_len(pos)))
        removed[:] = names
        return g

    elim = run_reference(cfg, weights, TOKENS, graph_for=graph_for)
    n_linear = layer_types(cfg).count("linear_attention")
    assert sorted(removed) == sorted(f"{c}-{il}" for _, c, _ in STATE_COPIES for il in range(n_linear))
    np.testing.assert_array_equal(elim.logits, ours.logits)
    for name, value in ours.caches.items():
        np.testing.assert_array_equal(elim.caches[name], value)


def test_value_heads_must_be_a_multiple_of_key_heads():
    cfg = preset("qwen3-next-tiny")
    bad = cfg.__class__(cfg.name, {**cfg.hf, "linear_num_value_heads": 3})
    with pytest.raises(ConfigError, match="multiple of linear_num_key_heads"):
        build_graph(bad)
