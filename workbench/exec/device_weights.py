"""Random weights drawn on the GPU: ``random_weights``' distributions for models whose weights
would take minutes to draw on the host (Llama-3.2-1B: 1.2 G values; Qwen3-Next with 8 layers:
13 G). Small tensors (norms, biases, the GDN decay parameters with their builder overrides and
load-time folds) still come from ``random_weights`` itself; only plain linear weights and
embeddings, whose distribution is N(0, scale) by ``workbench.models.weights``' rules, are drawn
with CuPy. The numbers differ from the host's; the distributions do not. A block-quantised
weight is drawn the same way, quantised on the host by ``workbench.models.quant`` (chunks of
rows on all cores: ggml's own rounding, as the reference's weights) and uploaded as its blocks.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..graph import Graph, View, is_quantized
from ..models.quant import quantize, row_bytes
from ..models.weights import device_weight, random_weights

#: tensors up to this many values are drawn on the host
HOST_LIMIT = 1 << 22
#: values drawn per CuPy call (and per host quantisation job of a block-typed weight)
CHUNK = 1 << 26
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
    for name, view in sorted(graph.weights.items()):
        if name in small:
            continue
        scale = _scale(name, view.shape)
        base = addr[view.buffer.name] + view.offset
        if is_quantized(view.dtype):
            _fill_quantized(cp, rs, view, base, scale)
            continue
        item = view.itemsize
        done = 0
        while done < view.numel:
            n = min(CHUNK, view.numel - done)
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


def _fill_quantized(cp: Any, rs: Any, view: View, base: int, scale: float) -> None:
    """Draw ``view`` (contiguous rows of a block type) on the device, quantise chunks of rows on
    the host's cores, upload the blocks; at most two chunks per core are in flight."""
    if not view.is_contiguous:
        raise ValueError(f"weight {view.describe()}: a block-typed weight is drawn as contiguous rows")
    K = view.shape[-1]
    rows, step, nbytes = view.numel // K, max(1, CHUNK // K), row_bytes(K, view.dtype)
    workers = os.cpu_count() or 1
    with ThreadPoolExecutor(workers) as pool:
        pending: list = []
        for r0 in range(0, rows, step):
            r = min(step, rows - r0)
            host = cp.asnumpy(rs.standard_normal(r * K, dtype=cp.float32) * np.float32(scale)).reshape(r, K)
            pending.append((r0, pool.submit(quantize, host, view.dtype)))
            while len(pending) > 2 * workers or (pending and r0 + r >= rows):
                q0, job = pending.pop(0)
                blocks = job.result()
                cp.cuda.runtime.memcpy(base + q0 * nbytes, blocks.ctypes.data, blocks.nbytes, 1)
