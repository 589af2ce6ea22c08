"""Buffers and tensor views: the byte-level vocabulary every later stage reasons in.

Stream assignment, copy elimination, the allocator and the race checker all ask the same
question ("which bytes of which buffer does this node touch?"), so a view is a first-class
value: buffer, byte offset, shape, byte strides and dtype, numpy order (last axis fastest).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np

#: dtype name -> (itemsize, numpy storage dtype). bf16 is stored as raw uint16.
DTYPES: dict[str, tuple[int, np.dtype]] = {
    "f32": (4, np.dtype(np.float32)),
    "f16": (2, np.dtype(np.float16)),
    "bf16": (2, np.dtype(np.uint16)),
    "i32": (4, np.dtype(np.int32)),
    "i64": (8, np.dtype(np.int64)),
}

#: ggml's block types: dtype name -> (values per block, bytes per block). A view of one has its
#: shape in values and its last stride in bytes per block (ggml's ``nb[0] = type_size``), so a
#: row of ``n`` values spans ``n / block * type_size`` bytes. q8_1 is the activation type
#: llama.cpp's CUDA mat-vec quantises its input to (``QUANTIZE_Q8_1``); q6_k is read from GGUF
#: files only (the output and some layers of a Q4_K_M file).
BLOCK_TYPES: dict[str, tuple[int, int]] = {
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_k": (256, 144),
    "mxfp4": (32, 17),
    "q6_k": (256, 210),
    "q8_1": (32, 36),
}

#: What a buffer holds; decides whether the allocator may place it in the reusable arena.
BUFFER_KINDS = ("weight", "const", "cache", "input", "output", "act")
PERSISTENT_KINDS = frozenset({"weight", "const", "cache", "input", "output"})


def itemsize(dtype: str) -> int:
    """Bytes per element of a workbench dtype name (per block of a block type: ggml_type_size)."""
    if dtype in BLOCK_TYPES:
        return BLOCK_TYPES[dtype][1]
    try:
        return DTYPES[dtype][0]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPES) + sorted(BLOCK_TYPES)}") from None


def block_size(dtype: str) -> int:
    """Values per storage unit: ggml's block size (1 for plain types)."""
    return BLOCK_TYPES[dtype][0] if dtype in BLOCK_TYPES else 1


def is_quantized(dtype: str) -> bool:
    return dtype in BLOCK_TYPES


def storage_counts(shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """Units per axis: the last axis of a block type counts blocks (it must hold whole ones)."""
    b = block_size(dtype)
    if b == 1 or not shape:
        return tuple(shape)
    if shape[-1] % b:
        raise ValueError(f"a {dtype} row of {shape[-1]} values is not a whole number of blocks of {b}")
    return (*shape[:-1], shape[-1] // b)


def nbytes_of(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a contiguous tensor (ggml_nbytes)."""
    return prod(storage_counts(tuple(shape), dtype)) * itemsize(dtype)


def contiguous_strides(shape: tuple[int, ...], dtype: str) -> tuple[int, ...]:
    """Row-major byte strides for ``shape`` (a block type's last stride is its block's bytes)."""
    strides, acc = [], itemsize(dtype)
    for n in reversed(storage_counts(tuple(shape), dtype)):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def runs_overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """True when two sorted lists of ``[lo, hi)`` byte runs share a byte (one merge pass)."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
            return True
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return False


@dataclass(frozen=True)
class Buffer:
    """A named allocation. ``kind`` says whether it lives across tokens (weights, caches,
    inputs, outputs) or is scratch that an allocator may recycle (``act``)."""

    name: str
    nbytes: int
    kind: str = "act"

    def __post_init__(self) -> None:
        if self.kind not in BUFFER_KINDS:
            raise ValueError(f"buffer {self.name!r}: kind {self.kind!r} not in {BUFFER_KINDS}")

    @property
    def persistent(self) -> bool:
        return self.kind in PERSISTENT_KINDS


@dataclass(frozen=True)
class View:
    """A strided window onto a buffer (ggml's tensor view)."""

    buffer: Buffer
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @staticmethod
    def of(buffer: Buffer, shape: tuple[int, ...], dtype: str, offset: int = 0) -> View:
        """A contiguous view of ``shape`` starting at ``offset`` bytes into ``buffer``."""
        v = View(buffer, offset, tuple(int(s) for s in shape), contiguous_strides(tuple(shape), dtype), dtype)
        if v.end > buffer.nbytes:
            raise ValueError(f"view of {shape} {dtype} at +{offset} overflows {buffer.name} ({buffer.nbytes} B)")
        return v

    # -- geometry -----------------------------------------------------------------------------
    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)

    @property
    def counts(self) -> tuple[int, ...]:
        """Storage units per axis (blocks along the last axis of a block type)."""
        return storage_counts(self.shape, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of data in the view (not of the span it covers)."""
        return prod(self.counts) * self.itemsize

    @property
    def start(self) -> int:
        return self.offset + sum((n - 1) * s for n, s in zip(self.counts, self.strides) if s < 0)

    @property
    def end(self) -> int:
        """One past the last byte the view can touch."""
        if self.numel == 0:
            return self.offset
        return self.offset + sum((n - 1) * s for n, s in zip(self.counts, self.strides) if s > 0) + self.itemsize

    @property
    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape, self.dtype)

    def intervals(self, limit: int = 4096) -> list[tuple[int, int]]:
        """Exact byte intervals ``[lo, hi)`` the view touches, merged; falls back to the
        conservative span when the view has more than ``limit`` disjoint runs."""
        if self.numel == 0:
            return []
        dims = [(n, s) for n, s in zip(self.counts, self.strides) if n > 1]
        run = self.itemsize
        # Fold innermost dims that are contiguous with the run into one run.
        while dims and dims[-1][1] == run:
            n, _ = dims.pop()
            run *= n
        count = prod(n for n, _ in dims) if dims else 1
        if count > limit:
            return [(self.start, self.end)]
        starts = np.zeros(1, dtype=np.int64) + self.offset
        for n, s in dims:
            starts = (starts[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
        starts.sort()
        out: list[tuple[int, int]] = []
        for lo in starts.tolist():
            hi = lo + run
            if out and lo <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], hi))
            else:
                out.append((lo, hi))
        return out

    def overlaps(self, other: View) -> bool:
        """True when the two views share at least one byte of the same buffer."""
        if self.buffer.name != other.buffer.name:
            return False
        if self.end <= other.start or other.end <= self.start:
            return False
        return runs_overlap(self.intervals(), other.intervals())

    # -- derived views ------------------------------------------------------------------------
    def reshape(self, shape: tuple[int, ...]) -> View:
        """Reinterpret a contiguous view with a new shape (ggml_reshape)."""
        if not self.is_contiguous:
            raise ValueError(f"reshape of a non-contiguous view of {self.buffer.name}")
        if prod(shape) != self.numel:
            raise ValueError(f"reshape {self.shape} -> {shape} changes the element count")
        return replace(self, shape=tuple(shape), strides=contiguous_strides(tuple(shape), self.dtype))

    def slice(self, axis: int, start: int, stop: int) -> View:
        """Sub-range ``[start, stop)`` along ``axis`` (ggml_view with an offset)."""
        if not 0 <= start <= stop <= self.shape[axis]:
            raise ValueError(f"slice [{start}:{stop}] out of range for axis {axis} of {self.shape}")
        b = block_size(self.dtype) if axis in (-1, len(self.shape) - 1) else 1
        if start % b or stop % b:
            raise ValueError(f"slice [{start}:{stop}] of a {self.dtype} row must keep whole blocks of {b}")
        shape = list(self.shape)
        shape[axis] = stop - start
        return replace(self, offset=self.offset + start // b * self.strides[axis], shape=tuple(shape))

    def permute(self, *axes: int) -> View:
        """Permuted axes, no data movement (ggml_permute / ggml_transpose)."""
        if is_quantized(self.dtype) and axes[-1] != len(self.shape) - 1:
            raise ValueError(f"a {self.dtype} view keeps its rows of blocks last; cannot permute {axes}")
        return replace(self, shape=tuple(self.shape[a] for a in axes), strides=tuple(self.strides[a] for a in axes))

    def rebase(self, buffer: Buffer, offset_delta: int) -> View:
        """The same window moved onto another buffer (used by the allocator)."""
        return replace(self, buffer=buffer, offset=self.offset + offset_delta)

    def describe(self) -> str:
        return f"{self.buffer.name}[{self.start}:{self.end}) {self.dtype}{list(self.shape)}"
