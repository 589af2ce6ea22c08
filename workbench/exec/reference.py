"""The reference executor: NumPy, float32 compute, nodes in graph order. The numerical truth.

It runs any Graph (the model's own, or a Plan's rewritten and allocated one) over byte-level
Memory, so a fusion or an allocation that changes results shows up here first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..graph import Graph
from ..models import ModelConfig, build_graph
from ..models.blocks import step_input_values
from ..models.weights import device_weight
from .memory import Memory
from .reference_ops import NUMPY_OPS


def execute_graph(graph: Graph, mem: Memory) -> None:
    """Run every node of ``graph`` in order."""
    for node in graph.nodes:
        fn = NUMPY_OPS.get(node.op)
        if fn is None:
            raise NotImplementedError(f"reference executor has no NumPy op for {node.op} ({node.name})")
        fn(node, mem)


def load_static(graph: Graph, mem: Memory, weights: dict[str, np.ndarray]) -> None:
    """Weights and constants into memory (once); weights read from a GGUF hold the load-time
    folds already (``folded``)."""
    folded = getattr(weights, "folded", False)
    for name, view in graph.weights.items():
        if name not in weights:
            raise KeyError(f"no weight {name!r} supplied")
        mem.load(view, weights[name] if folded else device_weight(graph, name, weights[name]))
    for name, value in graph.meta.get("consts", {}).items():
        mem.write(graph.consts[name], value)


@dataclass
class ReferenceRun:
    """Logits per step ``[tokens, vocab]`` and the final cache contents as float32."""

    logits: np.ndarray
    caches: dict[str, np.ndarray]


def run_reference(cfg: ModelConfig, weights: dict[str, np.ndarray], tokens: Sequence[int],
                  start_pos: int = 0, graph_for: Callable[[int], Graph] | None = None) -> ReferenceRun:
    """Decode ``tokens`` one at a time from ``start_pos``; returns per-step logits and caches.

    ``graph_for(pos)`` may supply the graph to run at each position (a Plan's graph); by
    default the model's graph with ggml's padded KV length."""
    mem = Memory()
    if graph_for is None:
        graphs: dict[int, Graph] = {}

        def graph_for(pos: int) -> Graph:
            n_kv = cfg.kv_len(pos)
            if n_kv not in graphs:
                graphs[n_kv] = build_graph(cfg, n_kv)
            return graphs[n_kv]

    logits = []
    graph = None
    for step, tok in enumerate(tokens):
        pos = start_pos + step
        graph = graph_for(pos)
        if step == 0:
            load_static(graph, mem, weights)
        for name, value in step_input_values(graph, int(tok), pos).items():
            mem.write(graph.inputs[name], value)
        execute_graph(graph, mem)
        logits.append(mem.read(graph.outputs["logits"]).reshape(-1))
    caches = {name: mem.read(v) for name, v in (graph.caches.items() if graph else [])}
    return ReferenceRun(np.stack(logits), caches)
