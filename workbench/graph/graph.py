"""Nodes and graphs: a ggml-style decode step, nodes in execution order over tensor views."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .ops import op_info
from .tensor import Buffer, View, contiguous_strides, nbytes_of


@dataclass(frozen=True, eq=False)
class Node:
    """One op application. ``outs[0]`` is the result (ggml's dst); ops with more than one
    result (the GDN state snapshot in the output tail) list the others after it."""

    name: str
    op: str
    srcs: tuple[View, ...]
    outs: tuple[View, ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dst(self) -> View:
        return self.outs[0]

    @property
    def family(self) -> str:
        return op_info(self.op).family

    @property
    def flops(self) -> float:
        return op_info(self.op).flops(self)

    @property
    def bytes(self) -> float:
        return op_info(self.op).bytes(self)

    def reads(self) -> tuple[View, ...]:
        return self.srcs

    def writes(self) -> tuple[View, ...]:
        return self.outs

    def __repr__(self) -> str:  # short, for error messages and notebooks
        return f"<{self.op} {self.name}>"


@dataclass
class Graph:
    """A decode step. ``inputs`` are filled by the host before each token (token id, position,
    KV row, masks); ``outputs`` are read back (logits)."""

    name: str
    nodes: list[Node]
    inputs: dict[str, View]
    outputs: dict[str, View]
    weights: dict[str, View]
    caches: dict[str, View]
    consts: dict[str, View] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in graph {self.name}")

    def index(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    def buffers(self) -> dict[str, Buffer]:
        """Every buffer a node or an input/output touches, by name."""
        out: dict[str, Buffer] = {}
        views: list[View] = [
            *self.inputs.values(), *self.outputs.values(), *self.weights.values(),
            *self.caches.values(), *self.consts.values(),
        ]
        for n in self.nodes:
            views.extend(n.srcs)
            views.extend(n.outs)
        for v in views:
            out.setdefault(v.buffer.name, v.buffer)
        return out

    def producers(self) -> dict[int, list[int]]:
        """For each node index, the indices of earlier nodes whose writes it reads (the last
        writer of each byte range it reads, ggml's src edges)."""
        deps: dict[int, list[int]] = {}
        last_writers: dict[str, list[tuple[int, View]]] = {}
        for i, n in enumerate(self.nodes):
            d: list[int] = []
            for r in n.srcs:
                for j, w in reversed(last_writers.get(r.buffer.name, [])):
                    if w.overlaps(r) and j not in d:
                        d.append(j)
            deps[i] = sorted(d)
            for w in n.outs:
                lst = last_writers.setdefault(w.buffer.name, [])
                lst[:] = [(j, v) for j, v in lst if not _covers(w, v)]
                lst.append((i, w))
        return deps

    def consumers(self) -> dict[int, list[int]]:
        """For each node index, the later nodes that read what it wrote."""
        cons: dict[int, list[int]] = {i: [] for i in range(len(self.nodes))}
        for i, ds in self.producers().items():
            for j in ds:
                cons[j].append(i)
        return cons

    def summary(self) -> dict[str, float]:
        """Parameter count and bytes/flops per decode step (shapes only, nothing allocated)."""
        params = sum(v.numel for v in self.weights.values())
        weight_bytes = sum(v.nbytes for v in self.weights.values())
        return {
            "nodes": len(self.nodes),
            "params": params,
            "weight_bytes": weight_bytes,
            "bytes_per_token": sum(n.bytes for n in self.nodes),
            "flops_per_token": sum(n.flops for n in self.nodes),
        }


def _covers(a: View, b: View) -> bool:
    """True if view ``a`` covers every byte of ``b`` (so ``b``'s writer is no longer last)."""
    return a.buffer.name == b.buffer.name and a.is_contiguous and a.start <= b.start and b.end <= a.end


class GraphBuilder:
    """Builds a Graph the way ggml's graph builders do: weights, caches and inputs are
    persistent buffers; every op result gets a fresh scratch buffer named after its node."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[Node] = []
        self.inputs: dict[str, View] = {}
        self.outputs: dict[str, View] = {}
        self.weights: dict[str, View] = {}
        self.caches: dict[str, View] = {}
        self.consts: dict[str, View] = {}
        self.meta: dict[str, Any] = {}
        self._names: set[str] = set()
        #: ``(name, shape, dtype) -> dtype`` a model sets to store some weights in another type
        #: than the one asked for (which tensors a quantised GGUF keeps in f32 or f16)
        self.weight_type: Callable[[str, tuple[int, ...], str], str] | None = None

    # -- persistent tensors --------------------------------------------------------------------
    def _persistent(self, table: dict[str, View], kind: str, name: str, shape: Iterable[int], dtype: str) -> View:
        shape = tuple(int(s) for s in shape)
        nbytes = nbytes_of(shape, dtype)
        v = View(Buffer(name, nbytes, kind), 0, shape, contiguous_strides(shape, dtype), dtype)
        table[name] = v
        return v

    def weight(self, name: str, shape: Iterable[int], dtype: str) -> View:
        """A model weight, named with its Hugging Face tensor name."""
        shape = tuple(int(s) for s in shape)
        if self.weight_type is not None:
            dtype = self.weight_type(name, shape, dtype)
        return self._persistent(self.weights, "weight", name, shape, dtype)

    def const(self, name: str, shape: Iterable[int], dtype: str = "f32") -> View:
        """A constant the builder computes from the config (rope frequencies)."""
        return self._persistent(self.consts, "const", name, shape, dtype)

    def cache(self, name: str, shape: Iterable[int], dtype: str) -> View:
        return self._persistent(self.caches, "cache", name, shape, dtype)

    def input(self, name: str, shape: Iterable[int], dtype: str) -> View:
        return self._persistent(self.inputs, "input", name, shape, dtype)

    # -- nodes --------------------------------------------------------------------------------
    def op(self, op: str, name: str, srcs: Iterable[View], shape: Iterable[int], dtype: str = "f32",
           kind: str = "act", **params: Any) -> View:
        """Append ``op`` writing a fresh tensor of ``shape`` (scratch unless ``kind`` says
        otherwise, e.g. ``output`` for the logits); returns its view."""
        out = self.scratch(name, shape, dtype, kind)
        self.node(op, name, srcs, (out,), **params)
        return out

    def scratch(self, name: str, shape: Iterable[int], dtype: str = "f32", kind: str = "act") -> View:
        shape = tuple(int(s) for s in shape)
        nbytes = nbytes_of(shape, dtype)
        return View(Buffer(name, nbytes, kind), 0, shape, contiguous_strides(shape, dtype), dtype)

    def node(self, op: str, name: str, srcs: Iterable[View], outs: Iterable[View], **params: Any) -> Node:
        """Append a node with explicit output views (in-place writes into caches, multi-output ops)."""
        op_info(op)
        if name in self._names:
            raise ValueError(f"duplicate node name {name!r}")
        self._names.add(name)
        n = Node(name, op, tuple(srcs), tuple(outs), dict(params))
        self.nodes.append(n)
        return n

    def output(self, name: str, view: View) -> None:
        if not view.buffer.persistent:
            raise ValueError(f"graph output {name!r} must live in a persistent buffer (kind='output')")
        self.outputs[name] = view

    def build(self) -> Graph:
        return Graph(self.name, self.nodes, self.inputs, self.outputs, self.weights, self.caches,
                     self.consts, self.meta)
