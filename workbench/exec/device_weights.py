"""Random weights drawn on the GPU: ``random_weights``' distributions for models whose weights
would take minutes to draw on the host (Llama-3.2-1B: 1.2 G values; Qwen3-Next with 8 layers:
13 G). Small tensors (norms, biases, the GDN decay parameters with their builder overrides and
load-time folds) still come from ``random_weights`` itself; only plain linear weights and
embeddings, whose distribution is N(0, scale) by ``workbench.models.weights``' rules, are drawn
with CuPy. The numbers differ from the host's; the distributions do not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import Graph
from ..models.weights import device_weight, random_weights

#: tensors up to this many values are drawn on the host
HOST_LIMIT = 1 << 22
_DAMPED = ("o_proj", "down_proj", "out_proj")


def _scale(name: str, shape: tuple[int, ...]) -> float:
    leaf = name.rsplit(".", 2)[-2] if name.endswith((".weight", ".bias")) else name.rsplit(".", 1)[-1]
    if leaf == "embed_tokens":
        return 1.0
    s = 1.0 / np.sqrt(shape[-1])  # every graph matrix is stored [.., out, in]
    return s * 0.5 if leaf in _DAMPED or name.endswith("down_proj") else s


def fill_random(cp: Any, graph: Graph, addr: dict[str, int], seed: int) -> None:
    """Write every weight of ``graph`` into device memory at ``addr[buffer name]``."""
    special = set(graph.meta.get("weight_init", {})) | set(graph.meta.get("weight_folds", {}))
    small = {n: v for n, v in graph.weights.items() if v.numel <= HOST_LIMIT or n in special}
    sub = Graph(graph.name, [], {}, {}, small, {}, {}, dict(graph.meta))
    for name, host in random_weights(sub, seed).items():
        view = graph.weights[name]
        data = np.ascontiguousarray(device_weight(graph, name, host))
        cp.cuda.runtime.memcpy(addr[view.buffer.name] + view.offset, data.ctypes.data, data.nbytes, 1)
    rs = cp.random.RandomState(seed)
    chunk = 1 << 26
    for name, view in sorted(graph.weights.items()):
        if name in small:
            continue
        scale = _scale(name, view.shape)
        base = addr[view.buffer.name] + view.offset
        item = view.itemsize
        done = 0
        while done < view.numel:
            n = min(chunk, view.numel - done)
            vals = rs.standard_normal(n, dtype=cp.float32) * np.float32(scale)
            if view.dtype == "f16":
                out = vals.astype(cp.float16)
            elif view.dtype == "bf16":
                u = vals.view(cp.uint32)
                out = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
            else:
                out = vals
            cp.cuda.runtime.memcpy(base + done * item, out.data.ptr, n * item, 3)
            done += n
    cp.cuda.runtime.deviceSynchronize()
