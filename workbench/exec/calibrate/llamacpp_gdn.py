"""Qwen3-Next's layers as llama.cpp's CUDA backend runs them, for the simulated llama.cpp schedule.

The workbench's GDN graph computes what llama.cpp's ``build_layer_attn_linear`` computes with
fewer kernels; the CUPTI captures (``kernel_counts``) show llama.cpp's per GDN layer:

* the recurrent states read through ``build_rs`` (a GET_ROWS of the conv state and of the SSM
  state), the conv input built by a CONCAT of the conv state and the new column, the conv
  state stored back by a CPY, the Q/K heads REPEATed to the value heads, the beta half of the
  ``ba`` projection made contiguous (CPY);
* one mat-vec of the merged ``wqkv`` (not a Q/K and a V one), the ``z`` mat-vec just before the
  gated norm, and the output mat-vec apart from its residual ADD;
* the L2 norms as ``scale(rms_norm(x))`` (``build_gdn_l2_norm``: one kernel with fusion);
* with fusion, ggml's unary + MUL fusion (softplus x A, silu(z) x the normed output: one GLU-
  family kernel each), the conv's SILU inside SSM_CONV and the gated norm's RMS_NORM+MUL; without
  it, each of those ops alone;

and per attention layer the output gate made contiguous (CPY) before its sigmoid x MUL (one GLU
kernel with fusion). The MoE's gate and up stay two MUL_MAT_IDs without fusion (the H100's
``no_fusion`` capture: three expert mat-vecs per layer) and one ``MUL_MAT_ID_GLU`` with it.
Nodes without an op of the workbench stand in as the op of their family that moves the same
bytes (CONCAT / REPEAT as CPY), named by ``params['ggml_op']``.
The rewrite works on a copy of the graph for the llama.cpp schedule only.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ...graph import Graph, Node
from ...graph.tensor import Buffer, View, nbytes_of
from ...strategy.rewrite import with_nodes

#: HF ``model_type`` of the models rewritten here
GDN_MODELS = frozenset({"qwen3_next"})
#: llama.cpp's recurrent-state row index (``inp_s_copy``): one i32 per sequence
STATE_IDS = "inp_s_copy"

#: a GDN layer's ``ba`` projection and the beta / gate ops reading it
BA_CHAIN = frozenset({"linear_attn_mixed_ba", "beta", "alpha_biased", "a_softplus", "gate"})

_LAYER = re.compile(r"^(.+)-(\d+)$")


def _scratch(name: str, shape: tuple[int, ...], dtype: str = "f32") -> View:
    return View.of(Buffer(name, nbytes_of(shape, dtype), "act"), shape, dtype)


def _whole(v: View) -> View:
    """The buffer ``v`` lives in as one contiguous row (the bytes a state GET_ROWS reads)."""
    return View.of(v.buffer, (1, v.buffer.nbytes // v.itemsize), v.dtype)


def _stand_in(name: str, ggml_op: str, srcs: tuple[View, ...], out: View) -> Node:
    """A copy-family kernel of llama.cpp (CONCAT, REPEAT, CPY / CONT) as a CPY node of its bytes."""
    return Node(name, "CPY", srcs, (out,), {"ggml_op": ggml_op})


def _with_srcs(n: Node, swap: dict[View, View]) -> Node:
    return Node(n.name, n.op, tuple(swap.get(s, s) for s in n.srcs), n.outs, n.params) if swap else n


def gdn_as_llamacpp(graph: Graph, fused: bool) -> Graph:
    """``graph`` (a Qwen3-Next step after llama.cpp's fusions) with llama.cpp's kernel list for
    its GDN and gated-attention layers and its merged MoE gate/up (module docstring)."""
    by = {n.name: n for n in graph.nodes}
    gdn = {int(m.group(2)) for n in graph.nodes if n.op == "GATED_DELTA_NET" and (m := _LAYER.match(n.name))}
    ids = View.of(Buffer(STATE_IDS, nbytes_of((1,), "i32"), "const"), (1,), "i32")
    out: list[Node] = []
    swap: dict[View, View] = {}
    deferred: dict[str, Node] = {}
    gates: dict[str, View] = {}

    later: list[Node] = []  # the beta / gate chain, run after the Q/K repeats (llama.cpp's order)

    def emit(n: Node) -> None:
        (later if stem in BA_CHAIN else out).append(_with_srcs(n, swap))

    for n in graph.nodes:
        m = _LAYER.match(n.name)
        stem, il = (m.group(1), int(m.group(2))) if m else (n.name, -1)
        if il in gdn:
            if stem == "linear_attn_qk":
                v, conv = by[f"linear_attn_v-{il}"], by[f"conv_output_raw-{il}"]
                state, qkv_row = conv.srcs[0], conv.srcs[1]
                w = View.of(n.srcs[0].buffer, (qkv_row.numel, n.srcs[0].shape[-1]), n.srcs[0].dtype,
                            min(n.srcs[0].offset, v.srcs[0].offset))
                emit(Node(f"conv_states-{il}", "GET_ROWS", (_whole(state), ids),
                          (_scratch(f"conv_states-{il}", (1, state.numel)),)))
                emit(Node(f"linear_attn_qkv_mixed-{il}", "MUL_MAT", (w, n.srcs[1]), (qkv_row,)))
                kern = state.shape[1] + 1
                conv_in = _scratch(f"conv_input-{il}", (state.shape[0], kern))
                emit(_stand_in(f"conv_input-{il}", "CONCAT", (state, qkv_row), conv_in))
                emit(_stand_in(f"conv_state_store-{il}", "CPY", (conv_in.slice(1, 1, kern),),
                               _scratch(f"conv_state_store-{il}", state.shape)))
                continue
            if stem in ("linear_attn_v", "z", "conv_state_cpy", "beta") or (fused and stem in (
                    "a_softplus", "conv_output_silu")):
                continue
            if stem == "linear_attn_mixed_ba":
                emit(n)
                beta = by[f"beta-{il}"]
                b = _scratch(f"b_cont-{il}", beta.srcs[0].shape)
                emit(_stand_in(f"b_cont-{il}", "CONT", (beta.srcs[0],), b))
                deferred[f"beta-{il}"] = Node(beta.name, beta.op, (b,), beta.outs, beta.params)
                continue
            if stem == "gate":
                if fused:  # softplus(alpha) x A: ggml's unary + mul fusion
                    sp = by[f"a_softplus-{il}"]
                    emit(Node(n.name, "GLU", (sp.srcs[0], n.srcs[1]), n.outs))
                else:
                    emit(n)
                emit(deferred.pop(f"beta-{il}"))
                continue
            if stem == "conv_output_raw":
                ssm = by[f"gated_delta_net-{il}"].srcs[5]
                emit(Node(f"ssm_states-{il}", "GET_ROWS", (_whole(ssm), ids),
                          (_scratch(f"ssm_states-{il}", (1, ssm.numel)),)))
                if fused:  # the conv's SILU runs in the SSM_CONV kernel
                    silu = by[f"conv_output_silu-{il}"]
                    emit(Node(n.name, n.op, n.srcs, (silu.dst, *n.outs[1:]), n.params))
                else:
                    emit(n)
                continue
            if stem in ("q_conv_normed", "k_conv_normed"):
                if fused:  # build_gdn_l2_norm: scale(rms_norm(x)), one RMS_NORM+SCALE kernel fused
                    emit(n)
                else:
                    rms = _scratch(f"{n.name}_rms", n.dst.shape)
                    emit(Node(f"{n.name}_rms", "RMS_NORM", n.srcs, (rms,), n.params))
                    emit(Node(n.name, "SCALE", (rms,), n.outs))
                g = by[f"gated_delta_net-{il}"]
                bcast = g.srcs[0 if stem[0] == "q" else 1]
                rep = _scratch(f"{stem[0]}_conv_predelta-{il}", bcast.shape)
                emit(_stand_in(rep.buffer.name, "REPEAT", (n.dst,), rep))
                swap[bcast] = rep
                if stem[0] == "k":
                    out.extend(later)
                    later.clear()
                continue
            if stem == "attn_out_norm":
                o, norm_w, z_view = n.srcs
                z = by[f"z-{il}"]
                normed = _scratch(f"attn_out_normed-{il}", o.shape)
                if fused:
                    emit(Node(f"{n.name}_rms", "RMS_NORM_MUL", (o, norm_w), (normed,), n.params))
                    emit(z)
                    emit(Node(n.name, "GLU", (z_view, normed), n.outs))
                else:
                    rms = _scratch(f"attn_out_rms-{il}", o.shape)
                    emit(Node(f"{n.name}_rms", "RMS_NORM", (o,), (rms,), n.params))
                    emit(Node(f"{n.name}_w", "MUL", (rms, norm_w), (normed,)))
                    emit(z)
                    gate = _scratch(f"z_silu-{il}", z_view.shape)
                    emit(Node(f"z_silu-{il}", "SILU", (z_view,), (gate,)))
                    emit(Node(n.name, "MUL", (normed, gate), n.outs))
                continue
            if stem == "attn_residual" and n.op == "MUL_MAT_ADD":
                proj = _scratch(f"linear_attn_out-{il}", n.dst.shape)
                emit(Node(f"linear_attn_out-{il}", "MUL_MAT", n.srcs[:2], (proj,)))
                emit(Node(n.name, "ADD", (proj, n.srcs[2]), n.outs))
                continue
        if stem == "gate_sigmoid":  # the attention output gate: a strided view, made contiguous
            g = _scratch(f"gate_cont-{il}", n.srcs[0].shape)
            emit(_stand_in(f"gate_cont-{il}", "CONT", n.srcs, g))
            if fused:
                gates[f"attn_gated-{il}"] = g
            else:
                emit(Node(n.name, n.op, (g,), n.outs, n.params))
            continue
        if stem == "attn_gated" and fused:
            sig = by[f"gate_sigmoid-{il}"].dst
            attn = next(s for s in n.srcs if s != sig)
            emit(Node(n.name, "GLU", (gates.pop(n.name), attn), n.outs))
            continue
        emit(n)
    return replace(with_nodes(graph, out), consts={**graph.consts, STATE_IDS: ids})
