"""Graph rewrites selected by ``Strategy.fusion``: llama.cpp's fusion set (``ggml_cuda_try_fuse``)
and generic copy elimination.

Each pass is a pure function Graph -> (Graph, removed node names), matching the graph's
structure (ops and byte ranges), never node names. Node names survive a rewrite: a fused node
takes the name of the node whose result it writes (the MUL of rms-norm-mul, the ADD of
mul-mat-add, the GLU of mul-mat-glu, the SET_ROWS of rope-set-rows, the last ADD of add-chain,
the router chain's last node of topk-moe), a copy-eliminated producer keeps its own, so stream
forks, traces and the race report still speak the model's vocabulary. The chain passes live in
``fusion_chains``, the router's in ``fusion_moe``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..graph import Graph, Node, View
from .deps import accesses_by_buffer, readers_of, touchers_between
from .fusion_chains import (
    fuse_add_chain,
    fuse_mul_mat_add,
    fuse_mul_mat_glu,
    fuse_norm_mul_add,
    fuse_norm_mul_rope,
    fuse_rope_set_rows,
)
from .fusion_moe import fuse_moe_weighted_reduction, fuse_topk_moe
from .fusion_ours import fuse_norm_mat_vec, fuse_qkv_rope_store
from .rewrite import output_buffers, rebuild, with_nodes

__all__ = ["PASSES", "apply_fusions", "eliminate_copies", "fuse_rms_norm_mul", "with_nodes"]


def fuse_rms_norm_mul(graph: Graph) -> tuple[Graph, list[str]]:
    """``RMS_NORM`` whose result is read only by one ``MUL`` -> one ``RMS_NORM_MUL`` (x, w).

    The fused node sits at the MUL's position and takes its name and output; it is skipped when
    a node in between writes the norm's input or the MUL's other operand (the fused kernel
    reads them later than the RMS_NORM did).
    """
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for i, n in enumerate(nodes):
        if n.op != "RMS_NORM" or len(n.outs) != 1:
            continue
        r = n.dst
        if r.buffer.kind != "act" or r.buffer.name in outputs:
            continue
        users = readers_of(nodes, index, r, i)
        if len(users) != 1 or nodes[users[0]].op != "MUL" or users[0] in replace:
            continue
        j = users[0]
        m = nodes[j]
        hits = [k for k, s in enumerate(m.srcs) if s.overlaps(r)]
        if len(hits) != 1 or m.srcs[hits[0]] != r:
            continue
        other = m.srcs[1 - hits[0]]
        x = n.srcs[0]
        if touchers_between(index, x, i, j, writes_only=True) or touchers_between(index, other, i, j, True):
            continue
        replace[j] = Node(m.name, "RMS_NORM_MUL", (x, other), m.outs, {**n.params, **m.params})
        drop.add(i)
    return rebuild(graph, replace, drop)


def _redirect(out: View, src: View, dst: View) -> View | None:
    """The view the producer must write so that ``CPY(src -> dst)`` becomes a no-op, or None.

    ``src`` must read the producer's output ``out`` element for element (the same view, or a
    contiguous reshape of it) and ``dst`` must hold the same dtype and element count.
    """
    if out.dtype != dst.dtype or out.numel != dst.numel or src.dtype != out.dtype:
        return None
    same = src == out or (src.buffer.name == out.buffer.name and src.offset == out.offset
                          and src.numel == out.numel and src.is_contiguous and out.is_contiguous)
    if not same:
        return None
    if dst.shape == out.shape:
        return dst
    if dst.is_contiguous:
        return dst.reshape(out.shape)
    return None


def eliminate_copies(graph: Graph) -> tuple[Graph, list[str]]:
    """The generic rule of PR #23940's review, for any op.

    An op output used exactly once, by a ``CPY`` into a view, is redirected: the op writes
    straight into that view with its strides and the CPY node disappears. Safe only when
    (a) the output is scratch and nothing else reads any of its bytes, (b) the destination
    has the same dtype and element count, (c) no node between the op and the CPY reads or
    writes the destination (the write moves earlier), and (d) the destination overlaps none
    of the op's other outputs and none of its inputs, except an input that is exactly the
    destination view: then the op updates those elements in place (a recurrent state read
    from and written back to its cache, as GATED_DELTA_NET and SSM_CONV do), with ggml's
    in-place semantics: every element is read before it is overwritten.

    The producer records the eliminated copies in ``params['cpy_eliminated']`` and in-place
    pairs in ``params['inplace']`` as ``(src index, out index)``, so a kernel knows that this
    input and output alias (no ``__restrict__``).
    """
    removed: list[str] = []
    nodes = list(graph.nodes)
    outputs = output_buffers(graph)
    changed = True
    while changed:
        changed = False
        index = accesses_by_buffer(nodes)
        touched: set[int] = set()
        replace: dict[int, Node] = {}
        drop: set[int] = set()
        for ci, c in enumerate(nodes):
            if c.op != "CPY" or len(c.srcs) != 1 or len(c.outs) != 1:
                continue
            src, dst = c.srcs[0], c.dst
            writers = sorted({a.node for a in index.get(src.buffer.name, ())
                              if a.write and a.node < ci and a.view.overlaps(src)})
            if len(writers) != 1:
                continue
            pi = writers[0]
            if pi in touched or ci in touched:
                changed = True  # revisit on the next pass with a fresh index
                continue
            p = replace.get(pi, nodes[pi])
            ks = [k for k, o in enumerate(p.outs) if o.overlaps(src)]
            if len(ks) != 1:
                continue
            k = ks[0]
            out = p.outs[k]
            if out.buffer.kind != "act" or out.buffer.name in outputs:
                continue
            if readers_of(nodes, index, out, pi) != [ci]:
                continue
            new_out = _redirect(out, src, dst)
            if new_out is None:
                continue
            if any(v != new_out and new_out.overlaps(v) for v in p.srcs):
                continue
            if any(new_out.overlaps(o) for j, o in enumerate(p.outs) if j != k):
                continue
            if touchers_between(index, dst, pi, ci):
                continue
            outs = tuple(new_out if j == k else o for j, o in enumerate(p.outs))
            params = {**p.params, "cpy_eliminated": (*p.params.get("cpy_eliminated", ()), c.name)}
            inplace = tuple((j, k) for j, v in enumerate(p.srcs) if v == new_out)
            if inplace:
                params["inplace"] = (*p.params.get("inplace", ()), *inplace)
            replace[pi] = Node(p.name, p.op, p.srcs, outs, params)
            drop.add(ci)
            touched.update((pi, ci))
            removed.append(c.name)
        if replace or drop:
            nodes = [replace.get(i, n) for i, n in enumerate(nodes) if i not in drop]
    return with_nodes(graph, nodes), removed


#: Strategy.fusion name -> rewrite, applied in this order: the mat-vec epilogues first (a GLU's
#: gate and up are plain MUL_MATs only before mul-mat-add takes their bias ADDs), copy
#: elimination last (it redirects whatever op the other passes left producing a copied tensor).
#: rms-norm-mul-rope takes the norm that rms-norm-mul made (or the RMS_NORM + MUL pair) and the
#: store that rope-set-rows made. The workbench's own fusions come after llama.cpp's:
#: qkv-rope-store takes the K store that rope-set-rows made, norm-mat-vec folds the norm that
#: rms-norm-mul made into the mat-vecs that mul-mat-glu and qkv-rope-store made.
PASSES: dict[str, Callable[[Graph], tuple[Graph, list[str]]]] = {
    "mul-mat-glu": fuse_mul_mat_glu,
    "mul-mat-add": fuse_mul_mat_add,
    "rope-set-rows": fuse_rope_set_rows,
    "add-chain": fuse_add_chain,
    "topk-moe": fuse_topk_moe,
    "rms-norm-mul": lambda g: _then(fuse_rms_norm_mul, fuse_norm_mul_add, g),
    "rms-norm-mul-rope": fuse_norm_mul_rope,
    "moe-weighted-reduction": fuse_moe_weighted_reduction,
    "qkv-rope-store": fuse_qkv_rope_store,
    "norm-mat-vec": fuse_norm_mat_vec,
    "copy-elim": eliminate_copies,
}


def _then(first: Callable[[Graph], tuple[Graph, list[str]]], second: Callable[[Graph], tuple[Graph, list[str]]],
          graph: Graph) -> tuple[Graph, list[str]]:
    """Two passes of one knob, in order; the removed names of both."""
    graph, a = first(graph)
    graph, b = second(graph)
    return graph, a + b


def apply_fusions(graph: Graph, names: Iterable[str]) -> tuple[Graph, list[str]]:
    """Run the selected passes in PASSES order; returns the graph and every removed node name."""
    wanted = set(names)
    removed: list[str] = []
    for name, fn in PASSES.items():
        if name in wanted:
            graph, gone = fn(graph)
            removed.extend(gone)
    return graph, removed
