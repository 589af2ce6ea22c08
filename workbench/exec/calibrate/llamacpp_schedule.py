"""The Plan llama.cpp really runs when it is given a Strategy's switches.

llama.cpp cannot turn its fusions on one by one (``workbench.llamacpp.switches``): with
``GGML_CUDA_DISABLE_FUSION`` unset its whole fusion pass runs (rms_norm+mul(+add), mat-vec +
bias / + GLU, rope+set_rows, add chains, top-k MoE), and the GDN state copy goes with it unless
the peer patch keeps it. Simulating llama.cpp therefore plans the model under the fusion set
llama.cpp applies, not the one the Strategy names; every other knob maps one to one.

Its kernel list differs from the workbench graph's in two more ways, read from the CUPTI
captures (``kernel_counts``) and modelled here, on a copy of the graph, for the llama.cpp
schedule only (the workbench's own graphs and fusion passes are untouched):

* fusions ``ggml_cuda_can_fuse`` does not form for a pattern: the MoE gate/up ``MUL_MAT_ID``
  pair stays two kernels and a GLU (``UNFUSED_OPS``); gpt-oss keeps ROPE / SET_ROWS and its
  top-k / softmax routing apart (``UNFUSED_BY_MODEL``);
* the ``inp_out_ids`` row selection llama.cpp's builders put in the last layer (``OUT_IDS_MODELS``):
  one GET_ROWS of the attention output, which also keeps that output's residual ADD apart;
* without fusion, the MoE expert sum is ``n_expert_used - 1`` ADDs of one expert's row each
  (``build_moe_ffn``), not one SUM_ROWS (``expert_sum_as_adds``), and the expert weights' sum
  is clamped before the DIV (``clamp_expert_weight_sum``);
* under GGML_CUDA_GRAPH_OPT, Qwen3-Next's Q/K norms stay RMS_NORM and MUL, apart from the rope
  (rms-norm-mul-rope undone, then ``split_norms_before_rope``);
* Qwen3-Next's GDN and gated-attention layers run llama.cpp's state GET_ROWS, CONCAT / CPY /
  REPEAT and merged projections (``llamacpp_gdn``);
* every decode attention is two kernels: the attention over its split keys, then the pass that
  merges the splits (``attention_passes``).

Under GGML_CUDA_GRAPH_OPT its fork puts each Q/K/V branch on a stream of its own, the Q
projection included, and the forking stream waits for all three at the join, so neither the
norm -> Q nor the last branch kernel -> attention edge is a PDL one (the captures: four streams,
Q on another than the attention); the workbench's own ``qkv`` keeps Q on the forking
stream. On Qwen3-Next it runs one stream (``ONE_STREAM_UNDER_GRAPH_OPT``).

Under PDL, the kernels llama.cpp launches with ``<<<...>>>`` instead of ``ggml_cuda_kernel_launch``
run without the launch attribute (``launched_plainly``): they wait for their predecessor to end
and let their successor start only when they end.

Its host program copies llama.cpp's split inputs (``llamacpp_inputs``), not the workbench
graph's: the token's embedding row (llama.cpp keeps ``token_embd`` on the CPU), the K and V
cache row indices apart (and again for the sliding-window cache), the output-row and recurrent
state indices: 6 copies a token on llama, 7 on qwen3-next, 9 on gpt-oss, as the captures show.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ...graph import Graph, Node
from ...graph.tensor import Buffer, View, nbytes_of
from ...models import ModelConfig, build_graph
from ...strategy import FUSIONS, WORKBENCH_FUSIONS, Plan, Strategy, compile_plan
from ...strategy.deps import accesses_by_buffer
from ...strategy.fusion import PASSES
from ...strategy.host import host_program
from ...strategy.rewrite import output_buffers, sole_reader, with_nodes
from ...strategy.steps import config_key
from ..cost import ATTN_COMBINE_PASS, fattn_vec_blocks_per_sm, quantized_weight
from .llamacpp_gdn import GDN_MODELS, STATE_IDS, gdn_as_llamacpp

#: fused ops llama.cpp never forms (ggml_cuda_can_fuse has no MoE gate/up + GLU mat-vec)
UNFUSED_OPS = frozenset({"MUL_MAT_ID_GLU"})
#: per HF ``model_type``: fused ops llama.cpp does not form for that model's op pattern
UNFUSED_BY_MODEL: dict[str, frozenset[str]] = {
    "gpt_oss": frozenset({"ROPE_SET_ROWS", "TOPK_MOE"}),
}
#: per HF ``model_type``: fused ops llama.cpp forms for that model although ``UNFUSED_OPS`` lists
#: them (qwen3-next's merged ``gate_up_exps`` mat-vec takes its GLU, as its captures show)
FUSED_BY_MODEL: dict[str, frozenset[str]] = {"qwen3_next": frozenset({"MUL_MAT_ID_GLU"})}
#: HF ``model_type`` -> the last layer's attention output node llama.cpp's builder selects the
#: output rows of (``ggml_get_rows(cur, inp_out_ids)``) before the residual ADD
OUT_IDS_MODELS: dict[str, str] = {"llama": "attn_out", "qwen3_moe": "attn_out"}


def llamacpp_strategy(strategy: Strategy) -> Strategy:
    """``strategy`` with the fusions llama.cpp applies under its switches: all of them when any
    fusion but ``copy-elim`` is asked (``copy-elim`` kept as asked: the peer patch's switch), none
    otherwise. (At one token the GDN copy is gone either way: ``gdn_copy_elided``.)"""
    if not (strategy.fusion - {"copy-elim"}):
        return replace(strategy, fusion=frozenset())
    full = set(FUSIONS) - set(WORKBENCH_FUSIONS) - {"copy-elim"} | (strategy.fusion & {"copy-elim"})
    return replace(strategy, fusion=frozenset(full))


def gdn_copy_elided(cfg: ModelConfig) -> frozenset[str]:
    """``{"copy-elim"}`` for a GDN model: llama.cpp's decode step has no copy of the recurrent
    state outside its GATED_DELTA_NET kernel, whatever its switches. Its captures under
    ``GGML_CUDA_DISABLE_FUSION=1`` (which turns the GDN cache fusion off with the rest) run the
    same copy kernels as the fused ones, 14 CPY, 6 CONCAT and 12 REPEAT a token at 8 layers
    (h200_captures/ and h100_captures/ qwen3-next ``no_fusion``, ``graphs``, ``eager`` against
    ``default``): the fusion's snapshot copy is not in a one-token graph. So the schedule keeps the
    workbench graph's state copy eliminated, and the GDN knob changes no kernel there."""
    return frozenset({"copy-elim"}) if model_type(cfg) in GDN_MODELS else frozenset()


def model_type(cfg: ModelConfig) -> str:
    return str(cfg.hf.get("model_type", ""))


def select_output_rows(graph: Graph, cfg: ModelConfig) -> Graph:
    """``graph`` with llama.cpp's ``inp_out_ids`` GET_ROWS after the last layer's attention
    output (models in ``OUT_IDS_MODELS``): one row of the f32 output, indexed by a one-element
    i32 index; its readers read the selected row."""
    stem = OUT_IDS_MODELS.get(model_type(cfg))
    if stem is None:
        return graph
    name = f"{stem}-{cfg.n_layer - 1}"
    nodes = list(graph.nodes)
    i = next((k for k, n in enumerate(nodes) if n.name == name), None)
    if i is None:
        raise ValueError(f"llama.cpp schedule: {cfg.name} has no node {name!r} to select the output rows of; "
                         f"update OUT_IDS_MODELS in {__name__} to the model's attention output node")
    src = nodes[i].dst
    ids = View.of(Buffer("inp_out_ids", nbytes_of((1,), "i32"), "const"), (1,), "i32")
    out = View.of(Buffer(f"{name}_out_ids", src.nbytes, "act"), src.shape, src.dtype)
    sel = Node(f"{name}_out_ids", "GET_ROWS", (src, ids), (out,))
    rest = [replace(n, srcs=tuple(out if s == src else s for s in n.srcs)) for n in nodes[i + 1:]]
    g = with_nodes(graph, [*nodes[:i + 1], sel, *rest])
    return replace(g, consts={**graph.consts, "inp_out_ids": ids})


def attention_passes(graph: Graph) -> Graph:
    """``graph`` with each FLASH_ATTN_EXT as the two kernels llama.cpp launches for one token
    (``launch_fattn``): the attention, whose blocks each walk a split of a head's keys and write a
    partial result (``parallel_blocks`` > 1 whenever the keys span more than one tile of
    ``head_dim``: a block an SM already splits them), then the pass that merges the partials into
    the node's result (``cost.ATTN_COMBINE_PASS``: ``flash_attn_combine_results``, or the stream-k
    fixup after the mma kernel). Every attention of every capture at 512-32768 keys runs both
    (data/traces/llamacpp/). The partials are sized at the fewest splits llama.cpp makes (the
    blocks an SM holds, at most a split per tile; it raises them to fill the last wave of the
    GPU's SMs, which the schedule does not know): the merge reads a few KiB, and its time follows
    the partial values a block of it merges (``cost.fattn_combine_values``, the fit's per-unit
    term), which the cost model counts at the GPU's own split."""
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.op != "FLASH_ATTN_EXT":
            nodes.append(n)
            continue
        q, k = n.srcs[0], n.srcs[1]
        hd, n_kv = q.shape[-1], k.shape[0]
        tiles = -(-n_kv // hd)
        if tiles < 2:
            nodes.append(n)
            continue
        splits = min(tiles, fattn_vec_blocks_per_sm(hd))
        shape = (splits, n.dst.numel)
        part = View.of(Buffer(f"{n.name}_splits", nbytes_of(shape, "f32"), "act"), shape, "f32")
        nodes += [replace(n, outs=(part, *n.outs[1:])),
                  Node(f"{n.name}_combine", "FLASH_ATTN_EXT", (part,), (n.dst,),
                       {"pass": ATTN_COMBINE_PASS, "head_dim": hd, "heads": q.shape[-2], "keys": n_kv})]
    return with_nodes(graph, nodes)


#: our MoE builders' SUM_ROWS over the weighted expert outputs (``ffn_moe_out-<layer>``)
EXPERT_SUM = "ffn_moe_out"


def expert_sum_as_adds(graph: Graph) -> Graph:
    """``graph`` with each MoE expert sum (``EXPERT_SUM``: SUM_ROWS over the transposed
    ``[n_used, n_embd]`` weighted outputs) as llama.cpp's unfused chain of ADDs of one expert's
    row each, the last writing the sum's result."""
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.op != "SUM_ROWS" or not n.name.startswith(EXPERT_SUM):
            nodes.append(n)
            continue
        src = n.srcs[0]
        n_embd, n_used = src.shape
        rows = View.of(src.buffer, (n_used, n_embd), src.dtype, src.offset)
        acc = rows.slice(0, 0, 1)
        for e in range(1, n_used):
            out = n.dst if e == n_used - 1 else View.of(
                Buffer(f"{n.name}_add{e}", nbytes_of((1, n_embd), "f32"), "act"), (1, n_embd), "f32")
            nodes.append(Node(f"{n.name}_add{e}" if e < n_used - 1 else n.name, "ADD",
                              (acc, rows.slice(0, e, e + 1)), (out,)))
            acc = out
    return with_nodes(graph, nodes)


#: our MoE builders' SUM_ROWS of the chosen expert weights (``ffn_moe_weights_sum-<layer>``)
WEIGHT_SUM = "ffn_moe_weights_sum"
#: the op standing in for ggml's CLAMP (no op of the workbench): a unary element-wise kernel over
#: the same bytes; the node's ``ggml_op`` param names the kernel llama.cpp runs
CLAMP_AS = "SCALE"


def clamp_expert_weight_sum(graph: Graph) -> Graph:
    """``graph`` with llama.cpp's ``ggml_clamp`` of each MoE expert weight sum before the DIV
    (``build_moe_ffn``: ``ffn_moe_weights_sum_clamped``, unfused schedule only: fused, the
    top-k MoE kernel absorbs it), modelled as a ``CLAMP_AS`` node of the sum's bytes."""
    nodes: list[Node] = []
    swap: dict[View, View] = {}
    for n in graph.nodes:
        if swap:
            n = replace(n, srcs=tuple(swap.get(s, s) for s in n.srcs))
        nodes.append(n)
        if n.op == "SUM_ROWS" and n.name.startswith(WEIGHT_SUM):
            name = n.name.replace(WEIGHT_SUM, f"{WEIGHT_SUM}_clamped", 1)
            out = View.of(Buffer(name, n.dst.nbytes, "act"), n.dst.shape, n.dst.dtype)
            nodes.append(Node(name, CLAMP_AS, (n.dst,), (out,), {"ggml_op": "CLAMP"}))
            swap[n.dst] = out
    return with_nodes(graph, nodes)


#: HF ``model_type``s whose Q/K norm llama.cpp leaves as RMS_NORM and MUL, apart from the rope,
#: under GGML_CUDA_GRAPH_OPT (``streams="qkv"`` under graphs): its reordering for the Q/K/V
#: streams breaks the fusion's adjacency there (the qwen3-next captures; qwen3-30b's keep it)
NORM_APART_UNDER_GRAPH_OPT = frozenset({"qwen3_next"})
#: HF ``model_type``s whose Q/K/V branches llama.cpp reorders for its streams but still runs on
#: one stream: ``ggml_cuda_concurrent_event::is_valid`` finds two branches writing overlapping
#: bytes (ggml-alloc's reuse), and one invalid fork drops them all (the qwen3-next captures
#: show one stream under GGML_CUDA_GRAPH_OPT; llama, qwen3-30b and gpt-oss show four)
ONE_STREAM_UNDER_GRAPH_OPT = frozenset({"qwen3_next"})


def split_norms_before_rope(graph: Graph) -> Graph:
    """``graph`` with each RMS_NORM_MUL read only by a ROPE / ROPE_SET_ROWS as its RMS_NORM and
    MUL again (the latter keeps the node's name and result)."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    out: list[Node] = []
    for i, n in enumerate(nodes):
        j = sole_reader(nodes, index, outputs, i) if n.op == "RMS_NORM_MUL" else None
        if j is None or nodes[j].op not in ("ROPE", "ROPE_SET_ROWS"):
            out.append(n)
            continue
        x, w = n.srcs
        rms = View.of(Buffer(f"{n.name}_rms", n.dst.nbytes, "act"), n.dst.shape, n.dst.dtype)
        params = {k: v for k, v in n.params.items() if k != "fused"}
        out += [Node(f"{n.name}_rms", "RMS_NORM", (x,), (rms,), params), Node(n.name, "MUL", (rms, w), n.outs)]
    return with_nodes(graph, out)


def _unfuse(before: Graph, after: Graph, ops: frozenset[str]) -> tuple[Graph, set[str]]:
    """``after`` (one fusion pass over ``before``) with every fused node of ``ops`` put back as
    the nodes it absorbed and its own; the names put back."""
    by_name = {n.name: n for n in before.nodes}
    nodes, back = [], set()
    for n in after.nodes:
        if n.op not in ops:
            nodes.append(n)
            continue
        absorbed = [by_name[a] for a in n.params.get("fused", ())]
        nodes.extend(sorted(absorbed, key=before.nodes.index))
        nodes.append(by_name[n.name])
        back.update(a.name for a in absorbed)
    return with_nodes(after, nodes), back


def llamacpp_fusions(graph: Graph, fusion: frozenset[str], cfg: ModelConfig,
                     also_apart: frozenset[str] = frozenset()) -> tuple[Graph, list[str]]:
    """The Strategy fusion passes of ``fusion`` (PASSES order) with the fused ops llama.cpp does
    not form for ``cfg`` (and ``also_apart``) undone; the graph and the removed node names."""
    mt = model_type(cfg)
    keep_apart = ((UNFUSED_OPS - FUSED_BY_MODEL.get(mt, frozenset())) | UNFUSED_BY_MODEL.get(mt, frozenset())
                  | also_apart)
    removed: list[str] = []
    for name, fn in PASSES.items():
        if name in fusion:
            fused, gone = fn(graph)
            fused, back = _unfuse(graph, fused, keep_apart)
            graph = fused
            removed.extend(g for g in gone if g not in back)
    return graph, removed


#: ggml ops whose llama.cpp kernel is launched plainly (``<<<...>>>``, no PDL attribute): soft_max_f32,
#: k_argsort_f32_i32, mul_mat_f (the f16 MoE expert mat-vec; quantized experts run mul_mat_vec_q, which
#: takes PDL), moe_weighted_reduction_f32 (MUL+SUM_ROWS) and add_id_kernel
PLAIN_LAUNCH_OPS = frozenset({"SOFT_MAX", "ARGSORT_TOP_K", "MUL_MAT_ID", "MUL_MAT_ID_GLU", "MUL_SUM_ROWS", "ADD_ID"})
#: HF ``model_type``s whose rope is ggml's NORM mode: rope_norm (and its set_rows fusion) is launched plainly,
#: rope_neox (the other families) through ggml_cuda_kernel_launch
ROPE_NORM_MODELS = frozenset({"llama"})
#: GLU variants whose kernel is launched plainly (swiglu_oai_kernel)
PLAIN_GLU = frozenset({"swiglu_oai"})


def launched_plainly(node: Node, cfg: ModelConfig) -> bool:
    """True if llama.cpp launches ``node``'s kernel without the PDL attribute (``<<<...>>>``)."""
    op = node.op
    if op in ("MUL_MAT_ID", "MUL_MAT_ID_GLU"):
        return not quantized_weight(node)
    if op in ("ROPE", "ROPE_SET_ROWS"):
        return model_type(cfg) in ROPE_NORM_MODELS
    if op == "GLU":
        return node.params.get("glu") in PLAIN_GLU
    if op == CLAMP_AS:
        return node.params.get("ggml_op") == "CLAMP"  # op_clamp_kernel
    return op in PLAIN_LAUNCH_OPS


#: the sliding-window cache's KV length is padded to this many rows (llama.cpp's ``n_pad``)
SWA_KV_PAD = 256


def llamacpp_inputs(graph: Graph, cfg: ModelConfig) -> list[tuple[str, int]]:
    """(name, bytes) of the host tensors llama.cpp copies to the GPU before each decode step,
    as ``ggml_backend_sched`` copies its split inputs: the embedding row the CPU's GET_ROWS
    gathered (``token_embd`` stays in host memory), the position, the recurrent state index
    (GDN models), the K and V cache row indices (i64 each; twice on an iSWA model), the f16
    attention mask(s) and the output-row index."""
    swa = "kq_mask_swa" in graph.inputs
    n_kv = graph.inputs["kq_mask"].shape[-1]
    window = int(cfg.get("sliding_window", 0) or 0)
    out = [("inp_embd", nbytes_of((int(cfg.get("hidden_size")),), "f32")), ("inp_pos", graph.inputs["inp_pos"].nbytes)]
    if model_type(cfg) in GDN_MODELS:
        out.append((STATE_IDS, nbytes_of((1,), "i32")))
    for suffix in ("", "_swa") if swa else ("",):
        out += [(f"k_idxs{suffix}", nbytes_of((1,), "i64")), (f"v_idxs{suffix}", nbytes_of((1,), "i64"))]
    out.append(("kq_mask", nbytes_of((n_kv,), "f16")))
    if swa:
        out.append(("kq_mask_swa", nbytes_of((min(n_kv, -(-window // SWA_KV_PAD) * SWA_KV_PAD) or n_kv,), "f16")))
    return [*out, ("inp_out_ids", nbytes_of((1,), "i32"))]


def llamacpp_graph(cfg: ModelConfig, n_kv: int) -> Graph:
    """The workbench graph of one step with llama.cpp's extra kernels (``select_output_rows``,
    ``attention_passes``)."""
    return attention_passes(select_output_rows(build_graph(cfg, n_kv), cfg))


@lru_cache(maxsize=64)
def _plan(key: tuple, cfg: ModelConfig, strategy: Strategy, n_kv: int, device_cc: tuple[int, int] | None) -> Plan:
    ran = llamacpp_strategy(strategy)
    graph = llamacpp_graph(cfg, n_kv)
    if not ran.fusion - {"copy-elim"}:
        graph = clamp_expert_weight_sum(expert_sum_as_adds(graph))
    norms_apart = ran.graphs and ran.streams == "qkv" and model_type(cfg) in NORM_APART_UNDER_GRAPH_OPT
    graph, removed = llamacpp_fusions(graph, ran.fusion | gdn_copy_elided(cfg), cfg,
                                      frozenset({"RMS_NORM_MUL_ROPE"}) if norms_apart else frozenset())
    if norms_apart and ran.fusion - {"copy-elim"}:
        graph = split_norms_before_rope(graph)
    if model_type(cfg) in GDN_MODELS:
        graph = gdn_as_llamacpp(graph, fused=bool(ran.fusion - {"copy-elim"}))
    # llama.cpp's fork: every Q/K/V branch on a stream of its own (streams.assign_streams)
    streams = "single" if model_type(cfg) in ONE_STREAM_UNDER_GRAPH_OPT else ran.streams
    plan = compile_plan(graph, replace(ran, fusion=frozenset(), streams=streams), device_cc, fork_keeps_branch=False)
    launches = [replace(la, pdl=False, wait="start", trigger="none") if ran.pdl and launched_plainly(la.node, cfg)
                else la for la in plan.launches]
    host = host_program(plan.graph, launches, ran, llamacpp_inputs(graph, cfg))
    return replace(plan, strategy=ran, removed=removed, launches=launches, host_program=host)


def llamacpp_plan(cfg: ModelConfig, strategy: Strategy, n_kv: int | None = None,
                  device_cc: tuple[int, int] | None = None) -> Plan:
    """The Plan of llama.cpp's schedule for one step over ``n_kv`` rows (default: the whole
    context): llama.cpp's graph, fused as llama.cpp fuses it under ``strategy``'s switches."""
    n_kv = cfg.context if n_kv is None else n_kv
    return _plan((config_key(cfg), strategy, n_kv, device_cc), cfg, strategy, n_kv,
                 tuple(device_cc) if device_cc else None)


def llamacpp_plans_for_steps(cfg: ModelConfig, strategy: Strategy, n_tokens: int, start_pos: int = 0,
                             device_cc: tuple[int, int] | None = None) -> list[Plan]:
    """One llama.cpp Plan per decode step from ``start_pos`` (steps of one padded KV length share one)."""
    return [llamacpp_plan(cfg, strategy, cfg.kv_len(start_pos + s), device_cc) for s in range(n_tokens)]
