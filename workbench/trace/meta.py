"""Trace metadata as JSON text that reads back to the same dict, for every trace file format.

``Trace.meta`` holds what produced a trace (model, strategy, GPU, calibration, host profile,
CUPTI settings) and the names of processes, threads and GPUs. JSON alone would turn the integer
keys of ``processes`` / ``threads`` / ``devices`` into strings and tuples into lists, so such
values are tagged (``{"__wb__": "dict" | "tuple", "items": [...]}``) and restored on reading.
NumPy scalars and arrays become Python numbers and lists; anything else is stored as its
``str`` (it comes back as that string).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from .table import TraceError

TAG = "__wb__"


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x) and TAG not in x:
            return {k: _plain(v) for k, v in x.items()}
        return {TAG: "dict", "items": [[_plain(k), _plain(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {TAG: "tuple", "items": [_plain(v) for v in x]}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if x is None or isinstance(x, bool | int | float | str):
        return x
    return str(x)


def _restore(x: Any) -> Any:
    if isinstance(x, list):
        return [_restore(v) for v in x]
    if not isinstance(x, dict):
        return x
    tag = x.get(TAG)
    if tag == "dict":
        return {_hashable(_restore(k)): _restore(v) for k, v in x["items"]}
    if tag == "tuple":
        return tuple(_restore(v) for v in x["items"])
    return {k: _restore(v) for k, v in x.items()}


def _hashable(k: Any) -> Any:
    return tuple(_hashable(v) for v in k) if isinstance(k, list) else k


def encode_meta(meta: dict[str, Any]) -> str:
    """``meta`` as compact JSON text (see the module docstring for what is kept exactly)."""
    return json.dumps(_plain(dict(meta)), separators=(",", ":"))


def decode_meta(text: str | bytes, where: str = "trace metadata") -> dict[str, Any]:
    """The dict ``encode_meta`` wrote; TraceError naming ``where`` when the text is not one."""
    try:
        obj = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{where} is not valid JSON ({e}); the file is damaged: write it again") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where} is a JSON {type(obj).__name__}, expected an object")
    return _restore(obj)
