"""llama.cpp's chain fusions (``ggml_cuda_try_fuse``) as pure graph rewrites.

Each pass finds an op whose only result is read by exactly one later node of the right kind
and replaces the pair (or chain) by one fused node at the position of the last node, writing
that node's result. A node in between must not write anything the fused node reads (it reads
it later than the first node did); everything is matched on ops and byte ranges.

* ``mul-mat-glu``: two MUL_MATs of the same activation feeding one ``swiglu`` GLU (FFN gate
  and up) -> ``MUL_MAT_GLU`` (ggml's fused gate/up mat-vec); two MUL_MAT_IDs of the same
  activation and expert ids (MoE gate and up) -> ``MUL_MAT_ID_GLU``.
* ``rms-norm-mul`` (+ add): an ``RMS_NORM_MUL`` whose result one ADD adds to a tensor of the
  same shape -> ``RMS_NORM_MUL_ADD`` (ggml's rms_norm + mul + add).
* ``mul-mat-add``: a MUL_MAT whose result one ADD adds to a tensor of the same shape (a bias,
  or the residual) -> ``MUL_MAT_ADD`` (ggml's mul_mat + add ``x_bias`` epilogue).
* ``rope-set-rows``: a ROPE whose result one SET_ROWS stores into a cache -> ``ROPE_SET_ROWS``
  (ggml's rope + view + set_rows: K is rotated straight into its KV-cache row).
* ``add-chain``: ADDs each adding one more operand to the previous sum -> ``ADD_CHAIN``
  (ggml's multi-add, up to ``MAX_ADD_OPERANDS`` operands).
* ``rms-norm-mul-rope``: ``rms_norm(x) * w`` (``RMS_NORM_MUL``, or the RMS_NORM + MUL pair) read
  only by a ROPE, or by a ROPE_SET_ROWS into a cache -> ``RMS_NORM_MUL_ROPE`` (x, w, pos,
  freqs[, idx]): Qwen3's per-head Q/K norm, rotated (and K stored) by the norm's kernel
  (ggml's ``rms_norm_mul_rope_f32``, rms_norm + mul + rope (+ view + set_rows)).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..graph import Graph, Node, View
from .deps import accesses_by_buffer
from .rewrite import last_writer, operand_slot, output_buffers, rebuild, same_elements, sole_reader, stable_between

#: fused op -> the Strategy fusion that creates it (the race report names the fusion)
FUSED_OPS = {"RMS_NORM_MUL_ADD": "rms-norm-mul",
             "MUL_MAT_ADD": "mul-mat-add", "MUL_MAT_GLU": "mul-mat-glu", "MUL_MAT_ID_GLU": "mul-mat-glu",
             "ROPE_SET_ROWS": "rope-set-rows", "ADD_CHAIN": "add-chain", "TOPK_MOE": "topk-moe",
             "RMS_NORM_MUL_ROPE": "rms-norm-mul-rope", "MUL_SUM_ROWS": "moe-weighted-reduction",
             # the workbench's own (fusion_ours)
             "RMS_NORM_MUL_MAT": "norm-mat-vec", "RMS_NORM_MUL_MAT_GLU": "norm-mat-vec",
             "RMS_NORM_MUL_Q8_1": "norm-mat-vec", "QKV_ROPE_SET_ROWS": "qkv-rope-store"}
#: operands of one ADD_CHAIN (the kernel's source limit, kernels/elementwise.cu k_add_chain)
MAX_ADD_OPERANDS = 4
#: the GLU kinds the fused mat-vec's epilogue computes (kernels/mul_mat.cu)
GLU_KINDS = ("swiglu",)


def fused_params(base: dict, absorbed: list[Node], inherited: tuple[int, ...]) -> dict:
    """A fused node's params: ``fused`` names the nodes it absorbed, ``inherited`` the indices of
    its sources that only those nodes read before (the race report blames the fusion for a race
    on one of them: the fused kernel reads it later, at the position of the last node)."""
    return {**base, "fused": tuple(n.name for n in absorbed), "inherited": inherited}


def _writes_apart(out: Node, srcs: tuple) -> bool:
    """The fused node's result overlaps none of its sources (no in-place fused kernels)."""
    return not any(o.overlaps(s) for o in out.outs for s in srcs)


def _fuse_into_reader(graph: Graph, is_producer: Callable[[Node], bool], reader_op: str, fused_op: str,
                      operands: Callable[[Node, Node], tuple | None], inherited: tuple[int, ...]
                      ) -> tuple[Graph, list[str]]:
    """Every producer node whose result one ``reader_op`` node alone reads is folded into that
    reader as ``fused_op``, with the sources ``operands(producer, reader)`` gives (None: this
    pair does not fuse), provided they stay unwritten in between and the result overlaps none."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for i, n in enumerate(nodes):
        if not is_producer(n):
            continue
        j = sole_reader(nodes, index, outputs, i)
        if j is None or j in replace or nodes[j].op != reader_op or len(nodes[j].outs) != 1:
            continue
        r = nodes[j]
        srcs = operands(n, r)
        if srcs is None or not stable_between(index, srcs, i, j) or not _writes_apart(r, srcs):
            continue
        replace[j] = Node(r.name, fused_op, srcs, r.outs, fused_params({**n.params, **r.params}, [n], inherited))
        drop.add(i)
    return rebuild(graph, replace, drop)


def fuse_norm_mul_add(graph: Graph) -> tuple[Graph, list[str]]:
    """``RMS_NORM_MUL(x, w)`` read only by ``ADD(normed, y)`` with ``y`` of the same shape ->
    ``RMS_NORM_MUL_ADD`` (x, w, y): llama.cpp's rms_norm + mul + add (a post-norm added to the
    residual), the second step of ``rms-norm-mul``."""

    def operands(n: Node, a: Node) -> tuple | None:
        k = operand_slot(a, n.dst)
        if k is None or a.srcs[k].shape != n.srcs[0].shape or a.srcs[1 - k].shape != a.srcs[k].shape:
            return None
        return (*n.srcs, a.srcs[1 - k])

    return _fuse_into_reader(graph, lambda n: n.op == "RMS_NORM_MUL", "ADD", "RMS_NORM_MUL_ADD", operands, (0, 1))


def fuse_mul_mat_add(graph: Graph) -> tuple[Graph, list[str]]:
    """``MUL_MAT(w, x)`` read only by ``ADD(mm, y)`` with ``y`` of the same shape -> ``MUL_MAT_ADD``
    (w, x, y): the addend is added in the mat-vec's epilogue (llama.cpp requires the same shape
    too, which covers a projection's bias and the residual add after attn_out / ffn_out; its
    quantised mat-vec, mmvq, takes the same epilogue)."""

    def operands(n: Node, a: Node) -> tuple | None:
        k = operand_slot(a, n.dst)
        if k is None:
            return None
        other = a.srcs[1 - k]
        if other.shape != a.srcs[k].shape or other.numel != a.dst.numel:
            return None
        return (n.srcs[0], n.srcs[1], other)

    return _fuse_into_reader(graph, lambda n: n.op == "MUL_MAT", "ADD", "MUL_MAT_ADD", operands, (0, 1))


#: the mat-vec op of a GLU's gate and up -> the fused op (``ids`` of MUL_MAT_ID shared by both)
GLU_FUSED = {"MUL_MAT": "MUL_MAT_GLU", "MUL_MAT_ID": "MUL_MAT_ID_GLU"}


def _shared_activation(nodes: list[Node], index, outputs: set[str], mms: list[Node],
                       prods: list[int]) -> tuple[bool, int | None]:
    """Whether the gate and up mat-vecs ``mms`` read one activation, and the up's own
    QUANTIZE_Q8_1 node to drop: quantised weights read a q8_1 copy each (``mat_input``), and the
    fused kernel reads the gate's, as llama.cpp's fused mmvq quantises its input once. That copy
    must be of the same float view, unchanged in between, and read by the up mat-vec alone."""
    xg, xu = mms[0].srcs[1], mms[1].srcs[1]
    if xg == xu:
        return True, None
    if xg.dtype != "q8_1" or xu.dtype != "q8_1":
        return False, None
    qg, qu = last_writer(index, xg, prods[0]), last_writer(index, xu, prods[1])
    if qg is None or qu is None or qg == qu:
        return False, None
    a, b = nodes[qg], nodes[qu]
    if a.op != "QUANTIZE_Q8_1" or b.op != "QUANTIZE_Q8_1" or a.srcs != b.srcs or a.dst.shape != b.dst.shape:
        return False, None
    if sole_reader(nodes, index, outputs, qu) != prods[1] or not stable_between(index, a.srcs, min(qg, qu),
                                                                                  max(qg, qu)):
        return False, None
    return True, qu


def fuse_mul_mat_glu(graph: Graph) -> tuple[Graph, list[str]]:
    """``GLU(MUL_MAT(wg, x), MUL_MAT(wu, x))`` whose two products are read by the GLU only ->
    ``MUL_MAT_GLU`` (wg, wu, x): one kernel streams both weight rows of an output and applies the
    GLU in its epilogue (llama.cpp's gate/up mat-vec fusion, for the kinds in ``GLU_KINDS``). The
    MoE form, two ``MUL_MAT_ID`` of the same activation and expert ids, -> ``MUL_MAT_ID_GLU``
    (wg, wu, x, ids). Quantised weights: the up's QUANTIZE_Q8_1 goes too (``_shared_activation``)."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for j, g in enumerate(nodes):
        if g.op != "GLU" or g.params.get("glu", "swiglu") not in GLU_KINDS or len(g.srcs) != 2:
            continue
        prods = [last_writer(index, s, j) for s in g.srcs]
        if None in prods or prods[0] == prods[1] or any(p in drop for p in prods):
            continue
        mms = [nodes[p] for p in prods]
        op = mms[0].op
        if op not in GLU_FUSED or mms[1].op != op:
            continue
        if any(sole_reader(nodes, index, outputs, p) != j for p in prods):
            continue
        if [operand_slot(g, m.dst) for m in mms] != [0, 1]:
            continue
        wg, wu = mms[0].srcs[0], mms[1].srcs[0]
        if mms[0].srcs[2:] != mms[1].srcs[2:] or wg.shape != wu.shape or wg.dtype != wu.dtype \
                or g.srcs[0].shape != g.srcs[1].shape:
            continue
        shared, up_quantize = _shared_activation(nodes, index, outputs, mms, prods)
        if not shared or up_quantize in drop:
            continue
        srcs = (wg, wu, *mms[0].srcs[1:])
        # the gate's own q8_1 copy may be written after the up's mat-vec: it must hold from the
        # gate's read on; everything else from the first mat-vec's
        held = [(v, prods[0] if up_quantize is not None and k == 2 else min(prods)) for k, v in enumerate(srcs)]
        if any(not stable_between(index, (v, ), lo, j) for v, lo in held) or not _writes_apart(g, srcs):
            continue
        absorbed = mms if up_quantize is None else [*mms, nodes[up_quantize]]
        replace[j] = Node(g.name, GLU_FUSED[op], srcs, g.outs,
                          fused_params(dict(g.params), absorbed, tuple(range(len(srcs)))))
        drop.update(prods)
        if up_quantize is not None:
            drop.add(up_quantize)
    return rebuild(graph, replace, drop)


def fuse_rope_set_rows(graph: Graph) -> tuple[Graph, list[str]]:
    """``ROPE(x, pos, freqs)`` read only by ``SET_ROWS(rope, idx) -> cache`` -> ``ROPE_SET_ROWS``
    (x, pos, freqs, idx) -> cache: the rotated row is written straight into the cache row."""

    def operands(n: Node, s: Node) -> tuple | None:
        return (*n.srcs, s.srcs[1]) if operand_slot(s, n.dst) == 0 else None

    return _fuse_into_reader(graph, lambda n: n.op == "ROPE", "SET_ROWS", "ROPE_SET_ROWS", operands, (0, 1, 2))


def fuse_add_chain(graph: Graph) -> tuple[Graph, list[str]]:
    """``ADD(ADD(a, b), c)`` ... where each sum is read only by the next ADD, all of one shape
    -> ``ADD_CHAIN`` (a, b, c, ...), summed left to right as the ADDs did (ggml's multi-add)."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for i, n in enumerate(nodes):
        if n.op != "ADD" or i in drop or i in replace or len(n.outs) != 1:
            continue
        srcs, chain = list(n.srcs), [i]
        last = i
        while len(srcs) < MAX_ADD_OPERANDS:
            j = sole_reader(nodes, index, outputs, last)
            if j is None or nodes[j].op != "ADD" or len(nodes[j].outs) != 1:
                break
            a = nodes[j]
            k = operand_slot(a, nodes[last].dst)
            if k is None or a.srcs[k].shape != nodes[last].dst.shape or a.dst.shape != n.dst.shape:
                break
            if not stable_between(index, srcs, last, j):
                break
            srcs.append(a.srcs[1 - k])
            chain.append(j)
            last = j
        if last == i or not _writes_apart(nodes[last], tuple(srcs)):
            continue
        end = nodes[last]
        inherited = tuple(range(len(srcs) - 1))  # all but the last ADD's own operand
        replace[last] = Node(end.name, "ADD_CHAIN", tuple(srcs), end.outs,
                             fused_params(dict(end.params), [nodes[k] for k in chain[:-1]], inherited))
        drop.update(chain[:-1])
    return rebuild(graph, replace, drop)


def norm_mul_of(nodes: list[Node], index: dict, outputs: set[str], i: int) -> tuple[list[int], View, View] | None:
    """(absorbed nodes, x, norm weight) when node ``i`` starts ``rms_norm(x) * w`` (fused or not)."""
    n = nodes[i]
    if n.op == "RMS_NORM_MUL" and len(n.outs) == 1:
        x, w = n.srcs
        return [i], x, w
    if n.op != "RMS_NORM" or len(n.outs) != 1:
        return None
    j = sole_reader(nodes, index, outputs, i)
    if j is None or nodes[j].op != "MUL" or len(nodes[j].outs) != 1:
        return None
    m = nodes[j]
    slot = operand_slot(m, n.dst)
    if slot is None or m.dst.shape != n.dst.shape:
        return None
    return [i, j], n.srcs[0], m.srcs[1 - slot]


def norm_mul_sites(nodes: list[Node], index: dict, outputs: set[str],
                   drop: set[int]) -> Iterator[tuple[int, list[int], View, View]]:
    """(i, absorbed nodes, x, norm weight) for each node ``i`` not in ``drop`` that starts
    ``rms_norm(x) * w``: the loop of every pass that fuses such a chain into its readers (the pass
    adds what it absorbs to ``drop`` as it goes, and later sites skip it)."""
    for i in range(len(nodes)):
        found = None if i in drop else norm_mul_of(nodes, index, outputs, i)
        if found is not None:
            yield (i, *found)


#: head sizes the fused norm + rope kernel takes (a thread per pair of a head's elements: at most
#: 128 threads a block, kernels/norm.cu k_rms_norm_mul_rope); heads and n_rot are even
NORM_ROPE_MAX_HEAD = 256


def fuse_norm_mul_rope(graph: Graph) -> tuple[Graph, list[str]]:
    """``rms_norm(x) * w`` read only by ``ROPE`` (or ``ROPE_SET_ROWS``) of the same rows ->
    ``RMS_NORM_MUL_ROPE`` (x, w, pos, freqs[, idx]) at the ROPE's position, writing its result (the
    rotated rows, or the cache). ``w`` is one f32 weight per element of a row (the kernel reads
    it so), x's rows are contiguous f32, of an even length up to ``NORM_ROPE_MAX_HEAD``."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for i, absorbed, x, w in norm_mul_sites(nodes, index, outputs, drop):
        normed = nodes[absorbed[-1]].dst
        j = sole_reader(nodes, index, outputs, absorbed[-1])
        if j is None or j in replace or nodes[j].op not in ("ROPE", "ROPE_SET_ROWS") or len(nodes[j].outs) != 1:
            continue
        r = nodes[j]
        hd = x.shape[-1] if x.shape else 0
        if operand_slot(r, normed) != 0 or not same_elements(normed, r.srcs[0]) or r.srcs[0].shape[-1] != hd:
            continue
        if r.params.get("mode", "neox") != "neox" or x.dtype != "f32" or x.strides[-1] != x.itemsize:
            continue
        if not 0 < hd <= NORM_ROPE_MAX_HEAD or hd % 2 or r.params.get("n_rot", hd) % 2 or w.dtype != "f32" \
                or w.numel != hd or not w.is_contiguous:
            continue
        srcs = (x, w, *r.srcs[1:])
        if not stable_between(index, srcs, i, j) or not _writes_apart(r, srcs):
            continue
        norm = nodes[i]
        # the rope's own inherited sources (pos, freqs of a ROPE_SET_ROWS) move one slot on
        inherited = (0, 1, *(k + 1 for k in r.params.get("inherited", ()) if k > 0))
        params = fused_params({**{k: v for k, v in r.params.items() if k not in ("fused", "inherited")},
                               "eps": norm.params["eps"]}, [nodes[a] for a in absorbed], inherited)
        replace[j] = Node(r.name, "RMS_NORM_MUL_ROPE", srcs, r.outs, params)
        drop.update(absorbed)
    return rebuild(graph, replace, drop)
