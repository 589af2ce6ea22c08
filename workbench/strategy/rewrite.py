"""Shared vocabulary of the fusion passes: a graph over new nodes, and the "single consumer"
test every fusion starts from (ggml_can_fuse's "the intermediate has one use and is no output")."""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import Graph, Node, View
from .deps import Access, readers_of, touchers_between


def with_nodes(graph: Graph, nodes: list[Node]) -> Graph:
    """The same graph (tables shared, meta copied) over a new node list."""
    return Graph(graph.name, nodes, graph.inputs, graph.outputs, graph.weights, graph.caches,
                 graph.consts, dict(graph.meta))


def rebuild(graph: Graph, replace: dict[int, Node], drop: set[int]) -> tuple[Graph, list[str]]:
    """A fusion pass's result: ``graph`` with node ``k`` replaced by ``replace[k]`` and the nodes
    in ``drop`` removed, and the removed nodes' names."""
    nodes = graph.nodes
    new = [replace.get(k, n) for k, n in enumerate(nodes) if k not in drop]
    return with_nodes(graph, new), [nodes[k].name for k in sorted(drop)]


def output_buffers(graph: Graph) -> set[str]:
    return {v.buffer.name for v in graph.outputs.values()}


def sole_reader(nodes: Sequence[Node], index: dict[str, list[Access]], outputs: set[str], i: int) -> int | None:
    """The one later node that reads node ``i``'s only result, when that result is scratch (no
    graph output) and no other node reads any of its bytes; else None."""
    n = nodes[i]
    if len(n.outs) != 1:
        return None
    r = n.dst
    if r.buffer.kind != "act" or r.buffer.name in outputs:
        return None
    users = readers_of(nodes, index, r, i)
    return users[0] if len(users) == 1 else None


def last_writer(index: dict[str, list[Access]], view: View, before: int) -> int | None:
    """The last node before ``before`` that writes any byte of ``view``, or None."""
    ws = [a.node for a in index.get(view.buffer.name, ()) if a.write and a.node < before and a.view.overlaps(view)]
    return max(ws) if ws else None


def same_elements(a: View, b: View) -> bool:
    """``b`` reads exactly the elements of ``a`` in the same order (the view itself, or a
    contiguous reshape of it: ggml_reshape / ggml_view of the whole tensor)."""
    if a == b:
        return True
    return (a.buffer.name == b.buffer.name and a.offset == b.offset and a.numel == b.numel
            and a.dtype == b.dtype and a.is_contiguous and b.is_contiguous)


def operand_slot(consumer: Node, produced: View) -> int | None:
    """The one source of ``consumer`` that reads ``produced`` (all of it, in order), else None."""
    hits = [k for k, s in enumerate(consumer.srcs) if s.overlaps(produced)]
    if len(hits) != 1 or not same_elements(produced, consumer.srcs[hits[0]]):
        return None
    return hits[0]


def stable_between(index: dict[str, list[Access]], views: Sequence[View], lo: int, hi: int) -> bool:
    """No node strictly between ``lo`` and ``hi`` writes any of ``views``: a fused node at ``hi``
    reads them later than the node at ``lo`` did, and must read the same bytes."""
    return not any(touchers_between(index, v, lo, hi, writes_only=True) for v in views)
