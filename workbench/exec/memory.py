"""Host memory for the NumPy executors: one byte array per buffer, views read and written
through strides, so aliasing done by the allocator or by copy elimination behaves as on a GPU.
A view of a ggml block type reads as its dequantised values and is written by quantising."""

from __future__ import annotations

import numpy as np

from ..graph import DTYPES, Buffer, View, is_quantized
from ..models.quant import dequantize, quantize
from ..models.weights import from_bf16, to_bf16


def decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A storage array (as :meth:`Memory.raw` gives it) as float32 values (ints stay ints)."""
    if is_quantized(dtype):
        return dequantize(raw.reshape(*raw.shape[:-2], raw.shape[-2] * raw.shape[-1]), dtype)
    if dtype == "bf16":
        return from_bf16(raw)
    if dtype in ("i32", "i64"):
        return raw.copy()
    return raw.astype(np.float32)


class Memory:
    """Byte arrays keyed by buffer name, created on first touch (zero-filled)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._f32_cache: dict[tuple, np.ndarray] = {}

    def buffer(self, buf: Buffer) -> np.ndarray:
        a = self.arrays.get(buf.name)
        if a is None:
            a = self.arrays[buf.name] = np.zeros(buf.nbytes, np.uint8)
        elif a.size < buf.nbytes:  # the same input at a larger KV length (kq_mask grows with n_kv)
            grown = np.zeros(buf.nbytes, np.uint8)
            grown[: a.size] = a
            a = self.arrays[buf.name] = grown
        return a

    def raw(self, v: View) -> np.ndarray:
        """The storage-typed strided ndarray aliasing the view's bytes (a block type's: uint8
        ``[..., blocks, block bytes]``)."""
        base = self.buffer(v.buffer)
        if is_quantized(v.dtype):
            return np.ndarray((*v.counts, v.itemsize), np.uint8, buffer=base, offset=v.offset,
                              strides=(*v.strides, 1))
        return np.ndarray(v.shape, DTYPES[v.dtype][1], buffer=base, offset=v.offset, strides=v.strides)

    def read(self, v: View) -> np.ndarray:
        """The view's values as float32 (ints stay ints); a copy, safe to modify."""
        return decode(self.raw(v), v.dtype)

    def read_const(self, v: View) -> np.ndarray:
        """Like :meth:`read` for weights: the float32 conversion is cached."""
        key = (v.buffer.name, v.offset, v.shape, v.strides)
        a = self._f32_cache.get(key)
        if a is None:
            a = self._f32_cache[key] = self.read(v)
        return a

    def write(self, v: View, values: np.ndarray) -> None:
        r = self.raw(v)
        values = np.broadcast_to(np.asarray(values), v.shape)
        if v.dtype == "bf16":
            r[...] = to_bf16(np.asarray(values, np.float32))
        elif is_quantized(v.dtype):
            r[...] = quantize(np.asarray(values, np.float32), v.dtype).reshape(r.shape)
        else:
            r[...] = values

    def load(self, v: View, storage: np.ndarray) -> None:
        """Put an array already in the view's storage dtype (weights)."""
        r = self.raw(v)
        r[...] = storage.reshape(r.shape)
        self._f32_cache = {k: a for k, a in self._f32_cache.items() if k[0] != v.buffer.name}
