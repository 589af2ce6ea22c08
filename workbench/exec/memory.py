"""Host memory for the NumPy executors: one byte array per buffer, views read and written
through strides, so aliasing done by the allocator or by copy elimination behaves as on a GPU."""

from __future__ import annotations

import numpy as np

from ..graph import DTYPES, Buffer, View
from ..models.weights import from_bf16, to_bf16


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
        """The storage-typed strided ndarray aliasing the view's bytes."""
        base = self.buffer(v.buffer)
        return np.ndarray(v.shape, DTYPES[v.dtype][1], buffer=base, offset=v.offset, strides=v.strides)

    def read(self, v: View) -> np.ndarray:
        """The view's values as float32 (ints stay ints); a copy, safe to modify."""
        r = self.raw(v)
        if v.dtype == "bf16":
            return from_bf16(r)
        if v.dtype in ("i32", "i64"):
            return r.copy()
        return r.astype(np.float32)

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
        else:
            r[...] = values

    def load(self, v: View, storage: np.ndarray) -> None:
        """Put an array already in the view's storage dtype (weights)."""
        self.raw(v)[...] = storage.reshape(v.shape)
        self._f32_cache = {k: a for k, a in self._f32_cache.items() if k[0] != v.buffer.name}
