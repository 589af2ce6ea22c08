"""The registry of NumPy ops (``NUMPY_OPS``, filled by ``@numpy_op``), the view helpers every
op uses, and the float32 math shared by the dense and the gated-delta-net ops."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..graph import Node
from .memory import Memory

NUMPY_OPS: dict[str, Callable[[Node, Memory], None]] = {}


def numpy_op(name: str):
    def deco(fn: Callable[[Node, Memory], None]) -> Callable[[Node, Memory], None]:
        NUMPY_OPS[name] = fn
        return fn
    return deco


def _src(node: Node, mem: Memory, i: int) -> np.ndarray:
    v = node.srcs[i]
    return mem.read_const(v) if v.buffer.kind in ("weight", "const") else mem.read(v)


def _out(node: Node, mem: Memory, values: np.ndarray, i: int = 0) -> None:
    v = node.outs[i]
    mem.write(v, np.asarray(values, np.float32).reshape(v.shape) if v.dtype not in ("i32", "i64")
              else np.asarray(values).reshape(v.shape))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=axis, keepdims=True)


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
