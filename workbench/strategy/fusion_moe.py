"""The MoE fusions of llama.cpp as pure rewrites: the top-k routing (``topk-moe``, llama.cpp's
``topk_moe_cuda``) and the weighted sum of the experts' outputs (``moe-weighted-reduction``).

The router's chain ``SOFT_MAX -> ARGSORT_TOP_K -> GET_ROWS [-> SUM_ROWS -> DIV]`` (Qwen3 MoE:
probabilities over all experts, the chosen ones renormalised) or ``ARGSORT_TOP_K -> GET_ROWS ->
SOFT_MAX`` (gpt-oss: softmax over the k chosen logits) becomes one ``TOPK_MOE`` node reading the
router logits and writing the weights and the expert ids. Matched on ops and byte ranges: every
intermediate is scratch read only inside the chain, and nothing reads the ids before the chain
ends (the fused node writes them there).

``moe-weighted-reduction``: ``MUL(experts [k, d], weights [k, 1])`` read only by the ``SUM_ROWS``
of its transpose (the sum over the k experts) -> one ``MUL_SUM_ROWS`` (experts, weights) -> [1, d]
(ggml's ``moe_weighted_reduction``, which takes 2 <= k <= ``MOE_WEIGHTED_REDUCTION_MAX_EXPERTS``).
"""

from __future__ import annotations

from ..graph import Graph, Node
from .deps import accesses_by_buffer, readers_of
from .fusion_chains import _fuse_into_reader, fused_params
from .rewrite import last_writer, operand_slot, output_buffers, rebuild, same_elements, sole_reader, stable_between


def _match(nodes: list[Node], index, outputs: set[str], t: int) -> tuple[list[int], dict] | None:
    """The chain around ``ARGSORT_TOP_K`` node ``t``: (its node indices in order, params)."""
    top = nodes[t]
    p = top.srcs[0]
    if len(top.outs) != 1:
        return None
    users = readers_of(nodes, index, p, t)
    if len(users) != 1 or nodes[users[0]].op != "GET_ROWS":
        return None
    g = users[0]
    rows, ids = nodes[g].srcs
    if ids != top.dst or not same_elements(p, rows):
        return None
    params: dict = dict(k=top.params["k"], gating="softmax_weight", norm=False)
    s = last_writer(index, p, t)
    if (s is not None and nodes[s].op == "SOFT_MAX" and same_elements(nodes[s].dst, p)
            and p.buffer.kind == "act" and p.buffer.name not in outputs
            and readers_of(nodes, index, p, s) == [t, g]):
        params["gating"], chain, logits = "softmax", [s, t, g], nodes[s].srcs[0]
    else:
        chain, logits = [t, g], p
    last = g
    nxt = sole_reader(nodes, index, outputs, last)
    if params["gating"] == "softmax_weight":
        if nxt is None or nodes[nxt].op != "SOFT_MAX" or operand_slot(nodes[nxt], nodes[last].dst) != 0:
            return None
        chain.append(nxt)
        last = nxt
    elif nxt is None and len(readers_of(nodes, index, nodes[g].dst, g)) == 2:
        w = nodes[g].dst
        sr, div = readers_of(nodes, index, w, g)
        if (nodes[sr].op == "SUM_ROWS" and nodes[div].op == "DIV" and sole_reader(nodes, index, outputs, sr) == div
                and operand_slot(nodes[sr], w) == 0 and operand_slot(nodes[div], w) == 0
                and operand_slot(nodes[div], nodes[sr].dst) == 1):
            chain += [sr, div]
            last = div
            params["norm"] = True
    if any(r <= last and r not in chain for r in readers_of(nodes, index, top.dst, t)):
        return None
    if not stable_between(index, (logits,), chain[0], last):
        return None
    params["logits"] = logits
    return chain, params


def fuse_topk_moe(graph: Graph) -> tuple[Graph, list[str]]:
    """Each MoE router chain -> one ``TOPK_MOE`` (logits) -> (weights, ids) at its last node,
    named after it; params ``k``, ``gating`` (softmax | softmax_weight) and ``norm``."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for t, n in enumerate(nodes):
        if n.op != "ARGSORT_TOP_K" or t in drop:
            continue
        found = _match(nodes, index, outputs, t)
        if found is None:
            continue
        chain, params = found
        logits = params.pop("logits")
        end = nodes[chain[-1]]
        replace[chain[-1]] = Node(end.name, "TOPK_MOE", (logits,), (end.dst, n.dst),
                                  fused_params(params, [nodes[k] for k in chain[:-1]], (0,)))
        drop.update(chain[:-1])
    return rebuild(graph, replace, drop)


#: experts llama.cpp's moe_weighted_reduction fuses at most (its MOE_WEIGHTED_REDUCTION_MAX_EXPERTS)
MOE_WEIGHTED_REDUCTION_MAX_EXPERTS = 15


def fuse_moe_weighted_reduction(graph: Graph) -> tuple[Graph, list[str]]:
    """Each ``SUM_ROWS(MUL(experts, weights).T)`` -> ``MUL_SUM_ROWS`` (experts, weights) at the sum's
    position, named after it: experts a contiguous f32 [k, d], weights one contiguous f32 per expert."""

    def operands(n: Node, r: Node) -> tuple | None:
        if len(n.dst.shape) != 2 or not n.dst.is_contiguous or n.dst.dtype != "f32":
            return None
        k, d = n.dst.shape
        e, w = sorted(n.srcs, key=lambda v: v.shape != n.dst.shape)  # (experts, weights)
        if e.shape != (k, d) or w.numel != k or e.dtype != "f32" or w.dtype != "f32":
            return None
        if not 2 <= k <= MOE_WEIGHTED_REDUCTION_MAX_EXPERTS or not e.is_contiguous or not w.is_contiguous:
            return None
        return (e, w) if r.srcs[0] == n.dst.permute(1, 0) and r.dst.numel == d else None

    return _fuse_into_reader(graph, lambda n: n.op == "MUL" and len(n.outs) == 1 and len(n.srcs) == 2,
                             "SUM_ROWS", "MUL_SUM_ROWS", operands, (0, 1))
