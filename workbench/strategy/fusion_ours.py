"""The workbench's own fusions (llama.cpp has no kernel for them), each a pure rewrite like the
passes of ``fusion_chains``:

* ``qkv-rope-store``: one layer's Q, K and V mat-vecs of one activation (``MUL_MAT``, or with
  mul-mat-add the biased ``MUL_MAT_ADD`` of gpt-oss), RoPE of Q and K and the K/V stores into the
  KV cache (``SET_ROWS``, or ``ROPE_SET_ROWS`` after rope-set-rows) -> ``QKV_ROPE_SET_ROWS``
  (wq, wk, wv, x, pos, freqs, idx[, bq, bk, bv]) -> (q rotated, k cache, v cache): one grid over
  the three weights' rows, each warp group computing a rotation pair of rows (+ their biases) and
  storing K/V straight into their cache rows. Skipped where anything else sits between a
  projection and its RoPE or store: Qwen3's per-head q/k norm (and qwen3-next's gated q with it).
  Folding that norm in needs a head's whole output before its rotation: a block per head gives
  only Hq + 2 Hk blocks (40 on qwen3-30b-a3b, a third of an H200's 132 SMs), too few to stream
  the weights at full bandwidth, and a split-K version needs a cross-block reduction per head.
* ``norm-mat-vec``: an ``RMS_NORM`` times its weight (``RMS_NORM_MUL`` after rms-norm-mul, or the
  ``RMS_NORM`` + ``MUL`` pair) whose every reader is a mat-vec (``MUL_MAT``, ``MUL_MAT_GLU``,
  ``QKV_ROPE_SET_ROWS``) is folded into those readers: each recomputes sum(x^2) over the K
  elements it reads anyway and scales x by rsqrt(mean + eps) * w as it stages it. The readers
  become ``RMS_NORM_MUL_MAT`` (w, x, w_norm), ``RMS_NORM_MUL_MAT_GLU`` (wg, wu, x, w_norm) and
  ``QKV_ROPE_SET_ROWS`` with ``w_norm`` as an eighth source (params ``eps``).

  Before block-quantised mat-vecs, which read a q8_1 copy of the normed row (a
  ``QUANTIZE_Q8_1`` node per mat-vec, as llama.cpp's mmvq has it), the norm folds into that copy
  instead: a norm read only by ``QUANTIZE_Q8_1`` nodes becomes one ``RMS_NORM_MUL_Q8_1`` (x,
  w_norm) at the first of them, writing its q8_1 blocks (params ``eps``); the other copies go and
  their mat-vecs read that one. A Q/K/V norm then costs one kernel where it cost four.

Both take f16 / bf16 / f32 weights whose rows the fused kernels stream as 16-byte vectors
(contiguous rows of a multiple of 8 elements, 16-byte aligned) and a single f32 activation row
of at most ``FUSED_MAX_K`` elements (the kernels stage it in shared memory); qkv-rope-store leaves
block-quantised weights alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph import Graph, Node, View
from ..graph.tensor import is_quantized
from .deps import accesses_by_buffer, readers_of, touchers_between
from .fusion_chains import _writes_apart, fused_params, norm_mul_sites
from .rewrite import operand_slot, output_buffers, rebuild, same_elements, sole_reader, stable_between

#: elements of the activation row the fused mat-vecs stage in shared memory (kernels/fused_mat_vec.cu FMV_MAXK)
FUSED_MAX_K = 8192
#: weight dtypes whose rows the fused kernels stream as 16-byte vectors
VECTOR_DTYPES = {"f16": 8, "bf16": 8, "f32": 4}
#: mat-vec op -> (its norm-folded op, the source slot of the activation)
NORM_FOLDED = {"MUL_MAT": ("RMS_NORM_MUL_MAT", 1), "MUL_MAT_GLU": ("RMS_NORM_MUL_MAT_GLU", 2),
               "QKV_ROPE_SET_ROWS": ("QKV_ROPE_SET_ROWS", 3)}
#: QKV_ROPE_SET_ROWS's sources: (wq, wk, wv, x, pos, freqs, idx), then (bq, bk, bv) with params
#: ``bias``, then the norm weight with params ``eps`` (always last, as in every norm-folded op)
#: the projections qkv-rope-store takes: a plain mat-vec, or one with its bias added (mul-mat-add)
QKV_MAT_VECS = ("MUL_MAT", "MUL_MAT_ADD")


def vector_rows(w: View) -> bool:
    """The fused kernels' weight layout: contiguous rows of 16-byte vectors, 16-byte aligned."""
    vec = VECTOR_DTYPES.get(w.dtype)
    if vec is None or is_quantized(w.dtype) or not w.shape or w.shape[-1] % vec or w.shape[-1] > FUSED_MAX_K:
        return False
    if w.strides[-1] != w.itemsize or w.offset % 16:
        return False
    return all(s % 16 == 0 for n, s in zip(w.shape[:-1], w.strides[:-1]) if n > 1)


def one_row(x: View, k: int) -> bool:
    """``x`` is one f32 row of ``k`` contiguous elements that the kernels load as float4 (16-byte
    aligned in its buffer; buffers are placed at 128-byte boundaries)."""
    return x.dtype == "f32" and x.numel == k and x.is_contiguous and x.offset % 16 == 0


# ---------------------------------------------------------------------------------------------
# qkv-rope-store
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Branch:
    """One projection of a Q/K/V triple and the nodes after it that the fused kernel absorbs."""

    role: str                 # "q", "k" or "v"
    nodes: tuple[int, ...]    # the mat-vec, then its ROPE / store nodes, in graph order
    out: View                 # what the fused kernel writes for it (rotated q, or the cache)
    rope: Node | None         # the ROPE (or ROPE_SET_ROWS) of q / k
    idx: View | None          # the row index of the store of k / v
    bias: View | None         # the bias a MUL_MAT_ADD projection adds


def _bias(m: Node) -> View | None:
    """The addend of a MUL_MAT_ADD projection when it is a bias: one f32 weight per output row."""
    if m.op != "MUL_MAT_ADD":
        return None
    b = m.srcs[2]
    ok = b.buffer.kind == "weight" and b.dtype == "f32" and b.numel == m.dst.numel and b.is_contiguous
    return b if ok else None


def _branch(nodes: list[Node], index: dict, outputs: set[str], i: int) -> _Branch | None:
    """What follows the mat-vec ``i``: ROPE read by something else (q), ROPE -> SET_ROWS or
    ROPE_SET_ROWS (k), SET_ROWS (v); None for anything else (or an addend that is no bias)."""
    bias = _bias(nodes[i])
    if nodes[i].op == "MUL_MAT_ADD" and bias is None:
        return None
    j = sole_reader(nodes, index, outputs, i)
    if j is None or operand_slot(nodes[j], nodes[i].dst) != 0:
        return None
    r = nodes[j]
    if r.op == "SET_ROWS":
        return _Branch("v", (i, j), r.dst, None, r.srcs[1], bias)
    if r.op == "ROPE_SET_ROWS":
        return _Branch("k", (i, j), r.dst, r, r.srcs[3], bias)
    if r.op != "ROPE" or r.params.get("mode", "neox") != "neox" or len(r.outs) != 1:
        return None
    s = sole_reader(nodes, index, outputs, j)
    if s is not None and nodes[s].op == "SET_ROWS" and operand_slot(nodes[s], r.dst) == 0:
        return _Branch("k", (i, j, s), nodes[s].dst, r, nodes[s].srcs[1], bias)
    if r.dst.buffer.kind != "act" or r.dst.buffer.name in outputs or not readers_of(nodes, index, r.dst, j):
        return None
    return _Branch("q", (i, j), r.dst, r, None, bias)


#: the ROPE params that define the rotation (a ROPE_SET_ROWS also carries its fusion bookkeeping)
ROTATION_PARAMS = ("n_rot", "attn_factor", "mode")


def _rotation(rope: Node) -> dict:
    return {k: rope.params[k] for k in ROTATION_PARAMS if k in rope.params}


def _qkv_triple(nodes: list[Node], branches: list[_Branch]) -> dict[str, _Branch] | None:
    """The Q, K and V branches of one activation, when they fit the fused kernel: one of each,
    one weight dtype and K, q and k rotated alike with one head size, k and v stored at one index."""
    by_role: dict[str, list[_Branch]] = {}
    for b in branches:
        by_role.setdefault(b.role, []).append(b)
    if sorted(by_role) != ["k", "q", "v"] or any(len(v) != 1 for v in by_role.values()):
        return None
    q, k, v = (by_role[r][0] for r in "qkv")
    ws = [nodes[b.nodes[0]].srcs[0] for b in (q, k, v)]
    if len({(w.dtype, w.shape[-1]) for w in ws}) != 1 or not all(vector_rows(w) for w in ws):
        return None
    if len({b.bias is None for b in (q, k, v)}) != 1:  # all three biased, or none
        return None
    assert q.rope is not None and k.rope is not None and k.idx is not None and v.idx is not None
    if q.rope.srcs[1:3] != k.rope.srcs[1:3] or _rotation(q.rope) != _rotation(k.rope) or k.idx != v.idx:
        return None
    hd = q.rope.srcs[0].shape[-1]
    n_rot = int(q.rope.params["n_rot"])
    if k.rope.srcs[0].shape[-1] != hd or hd % 2 or n_rot % 2 or not 0 < n_rot <= hd:
        return None
    if q.out.numel != nodes[q.nodes[0]].dst.numel or nodes[v.nodes[0]].dst.numel % hd:
        return None
    if len(q.out.shape) != 2 or q.out.shape[-1] != hd:
        return None
    return {"q": q, "k": k, "v": v}


def fuse_qkv_rope_store(graph: Graph) -> tuple[Graph, list[str]]:
    """Q, K, V mat-vecs of one activation + RoPE(Q), RoPE(K) + the K/V cache stores ->
    ``QKV_ROPE_SET_ROWS`` at the position (and with the name) of the last node it absorbs."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    groups: dict[View, list[int]] = {}
    for i, n in enumerate(nodes):
        if n.op in QKV_MAT_VECS and len(n.outs) == 1 and one_row(n.srcs[1], n.srcs[0].shape[-1]):
            groups.setdefault(n.srcs[1], []).append(i)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for x, members in groups.items():
        branches = [b for b in (_branch(nodes, index, outputs, i) for i in members) if b is not None]
        t = _qkv_triple(nodes, branches)
        if t is None:
            continue
        q, k, v = t["q"], t["k"], t["v"]
        absorbed = sorted({*q.nodes, *k.nodes, *v.nodes})
        first, last = absorbed[0], absorbed[-1]
        assert q.rope is not None and k.idx is not None
        ws = tuple(nodes[b.nodes[0]].srcs[0] for b in (q, k, v))
        biases = tuple(b.bias for b in (q, k, v) if b.bias is not None)
        srcs = (*ws, x, q.rope.srcs[1], q.rope.srcs[2], k.idx, *biases)
        outs = (q.out, k.out, v.out)
        if not stable_between(index, srcs, first, last):
            continue
        # each result is now written at ``last``: nothing in between may touch it
        if any(touchers_between(index, b.out, b.nodes[-1], last) for b in (q, k, v)):
            continue
        end = nodes[last]
        fused = Node(end.name, "QKV_ROPE_SET_ROWS", srcs, outs,
                     fused_params({**_rotation(q.rope), "head_dim": q.out.shape[-1], "bias": bool(biases)},
                                  [nodes[a] for a in absorbed if a != last], tuple(range(len(srcs)))))
        if not _writes_apart(fused, srcs) or len({o.buffer.name for o in outs}) != 3:
            continue
        replace[last] = fused
        drop.update(a for a in absorbed if a != last)
    return rebuild(graph, replace, drop)


# ---------------------------------------------------------------------------------------------
# norm-mat-vec
# ---------------------------------------------------------------------------------------------
def _folded(reader: Node, normed: View, x: View, w: View, eps: float, absorbed: list[Node]) -> Node | None:
    """``reader`` with the norm folded in, or None where it is no mat-vec reading ``normed``."""
    if reader.op not in NORM_FOLDED or len(reader.outs) not in (1, 3):
        return None
    op, slot = NORM_FOLDED[reader.op]
    if "eps" in reader.params:
        return None  # already normed
    hits = [k for k, s in enumerate(reader.srcs) if s.overlaps(normed)]
    if hits != [slot] or not same_elements(normed, reader.srcs[slot]):
        return None
    if not all(vector_rows(reader.srcs[k]) for k in range(slot)):
        return None
    srcs = tuple(x if k == slot else s for k, s in enumerate(reader.srcs)) + (w,)
    params = fused_params({**reader.params, "eps": eps}, absorbed, ())
    params["fused"] = (*reader.params.get("fused", ()), *params["fused"])
    params["inherited"] = tuple(sorted({*reader.params.get("inherited", ()), slot, len(srcs) - 1}))
    return Node(reader.name, op, srcs, reader.outs, params)


def _q8_1_copies(nodes: list[Node], index: dict, outputs: set[str], normed: View, readers: list[int],
                 x: View, w: View, eps: float, absorbed: list[Node]) -> dict[int, Node | None] | None:
    """The rewrite of a norm read only by ``QUANTIZE_Q8_1`` nodes (each the q8_1 copy of one
    quantised mat-vec's activation), or None: the first copy becomes ``RMS_NORM_MUL_Q8_1``
    (x, w), the others go (``None`` values) and their readers read the first one's blocks,
    which must hold until the last of those reads."""
    qs = [nodes[r] for r in readers]
    if not qs or any(q.op != "QUANTIZE_Q8_1" or len(q.outs) != 1 or not same_elements(normed, q.srcs[0])
                     or q.dst.shape != qs[0].dst.shape for q in qs):
        return None
    if any(q.dst.buffer.kind != "act" or q.dst.buffer.name in outputs for q in qs):
        return None
    keep, kept = readers[0], qs[0].dst
    params = fused_params({"eps": eps}, absorbed, (0, 1))
    new: dict[int, Node | None] = {keep: Node(qs[0].name, "RMS_NORM_MUL_Q8_1", (x, w), qs[0].outs, params)}
    for r in readers[1:]:
        new[r] = None
        for u in readers_of(nodes, index, nodes[r].dst, r):
            n = nodes[u]
            slot = operand_slot(n, nodes[r].dst)
            if slot is None or u in new or touchers_between(index, kept, keep, u, writes_only=True):
                return None
            new[u] = Node(n.name, n.op, tuple(kept.reshape(v.shape) if k == slot else v
                                              for k, v in enumerate(n.srcs)), n.outs, n.params)
    return new


def fuse_norm_mat_vec(graph: Graph) -> tuple[Graph, list[str]]:
    """``rms_norm(x) * w`` read only by mat-vecs -> each mat-vec normalises x itself; the norm
    nodes disappear. Read only by q8_1 copies for quantised mat-vecs -> one normed q8_1 copy
    (``_q8_1_copies``). Skipped when any reader is neither, when x and w change before a reader,
    or when x is no single f32 row of at most ``FUSED_MAX_K`` elements."""
    nodes = graph.nodes
    index = accesses_by_buffer(nodes)
    outputs = output_buffers(graph)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for i, absorbed, x, w in norm_mul_sites(nodes, index, outputs, drop):
        end = nodes[absorbed[-1]]
        normed = end.dst
        if normed.buffer.kind != "act" or normed.buffer.name in outputs or absorbed[-1] in replace:
            continue
        k = x.shape[-1] if x.shape else 0
        if not one_row(x, k) or k > FUSED_MAX_K or not one_row(w, k):
            continue
        readers = readers_of(nodes, index, normed, absorbed[-1])
        if not readers or any(r in replace or r in drop for r in readers):
            continue
        eps = float(nodes[i].params["eps"])
        copies = _q8_1_copies(nodes, index, outputs, normed, readers, x, w, eps, [nodes[a] for a in absorbed])
        if copies is not None:
            if any(r in replace or r in drop for r in copies) or not stable_between(index, (x, w), i, readers[0]):
                continue
            replace.update({r: f for r, f in copies.items() if f is not None})
            drop.update([*absorbed, *(r for r, f in copies.items() if f is None)])
            continue
        new = {r: _folded(nodes[r], normed, x, w, eps, [nodes[a] for a in absorbed]) for r in readers}
        if any(f is None for f in new.values()):
            continue
        if any(not stable_between(index, (x, w), i, r) or not _writes_apart(f, f.srcs) for r, f in new.items()):
            continue
        replace.update(new)  # type: ignore[arg-type]
        drop.update(absorbed)
    return rebuild(graph, replace, drop)
