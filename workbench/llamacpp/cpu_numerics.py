"""ggml-cpu's numerics where they differ from the CUDA path the reference models, in NumPy, so a
comparison with the llama.cpp CPU build can take the differences out (tests and
``benchmarks/quant_cpu_parity.py``): its flash attention over an f16 cache, and the q8_K
activations its k-quant dot products use (CUDA's mmvq uses q8_1 for every type).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


def cpu_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
               sinks: np.ndarray | None = None) -> np.ndarray:
    """ggml-cpu's flash attention over an f16 cache: Q rounded to f16, online softmax with the
    V sum kept in f16 (``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16``), sinks and 1/S in f32."""
    n_head = q.shape[0]
    rep = n_head // k.shape[1]
    out = np.empty((n_head, v.shape[2]), np.float32)
    qh = q.astype(np.float16).astype(np.float64)
    f32 = np.float32
    for h in range(n_head):
        kh, vh = k[:, h // rep].astype(np.float64), v[:, h // rep].astype(np.float32)
        m, s_sum = -np.inf, f32(0)
        acc = np.zeros(vh.shape[1], np.float16)
        for i in np.flatnonzero(mask != -np.inf):
            s = f32(qh[h] @ kh[i]) * f32(scale) + f32(mask[i])
            ms = vs = f32(1)
            if s > m:
                ms, m = f32(np.exp(f32(m - s))), s
                acc = (acc.astype(f32) * ms).astype(np.float16)
            else:
                vs = f32(np.exp(f32(s - m)))
            acc = (acc.astype(f32) + vh[i] * vs).astype(np.float16)
            s_sum = f32(s_sum * ms + vs)
        acc = acc.astype(f32)
        if sinks is not None:
            s, ms, vs = f32(sinks.reshape(-1)[h]), f32(1), f32(1)
            if s > m:
                ms = f32(np.exp(f32(m - s)))
                acc = acc * ms
            else:
                vs = f32(np.exp(f32(s - m)))
            s_sum = f32(s_sum * ms + vs)
        out[h] = acc * (f32(1) / s_sum)
    return out


def q8_k(x: np.ndarray) -> np.ndarray:
    """ggml's ``quantize_row_q8_K_ref`` and back: per 256 values ``q = nearest(-127 / max * x)``
    with ``max`` the signed value of the largest magnitude, ``d = 1 / iscale`` in f32."""
    b = np.asarray(x, np.float32).reshape(-1, 256)
    i = np.abs(b).argmax(axis=1)[:, None]
    mx = np.take_along_axis(b, i, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(mx == 0, np.float32(0), np.float32(-127) / mx).astype(np.float32)
        d = np.where(iscale == 0, np.float32(0), np.float32(1) / iscale).astype(np.float32)
    q = np.minimum(127, np.rint((iscale * b).astype(np.float32)))
    return (q * d).reshape(np.shape(x))


@contextmanager
def ggml_cpu_numerics(q8_k_activations: bool = False) -> Iterator[None]:
    """While open, the reference attends as ggml-cpu does (``cpu_attend``) and, with
    ``q8_k_activations``, its mat-muls read q8_K of what each QUANTIZE_Q8_1 node was given (the
    CPU's activations for k-quants) instead of the q8_1 blocks."""
    from ..exec import reference_ops
    from ..exec.memory import Memory

    given: dict[tuple[str, int], np.ndarray] = {}
    attend, read, write = reference_ops.attend, Memory.read, Memory.write

    def keep(self: Memory, v, values) -> None:
        if v.dtype == "q8_1":
            given[v.buffer.name, v.offset] = np.array(np.broadcast_to(values, v.shape), np.float32)
        write(self, v, values)

    def read_q8_k(self: Memory, v) -> np.ndarray:
        return q8_k(given[v.buffer.name, v.offset]) if v.dtype == "q8_1" else read(self, v)

    reference_ops.attend = cpu_attend
    if q8_k_activations:
        Memory.write, Memory.read = keep, read_q8_k
    try:
        yield
    finally:
        reference_ops.attend, Memory.read, Memory.write = attend, read, write
