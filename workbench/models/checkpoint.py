"""Hugging Face safetensors checkpoints read as the graph's weights, whatever layout they use.

The file format is read directly (an 8-byte header length, a JSON header, raw little-endian
data) so every float dtype a checkpoint ships in loads: F32, F16, F64 and BF16 (widened to
f32 by its bit pattern; NumPy has no bfloat16). MoE experts come in two layouts: one tensor
per expert and projection (``mlp.experts.{e}.gate_proj.weight``, what ``save_pretrained`` of
transformers 5 writes and what older checkpoints hold) or fused per layer
(``mlp.experts.gate_up_proj`` [E, 2*n_ff, d], gate rows then up rows, and
``mlp.experts.down_proj`` [E, d, n_ff], transformers 5's in-memory layout). The graph keeps the
fused layout; per-expert tensors are stacked into it here. gpt-oss's fused tensors are stored
input-major ([E, d, 2*n_ff], gate/up interleaved); they are read in that shape and
``weights.load_safetensors`` transposes them once into the graph's output-major layout.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ConfigError

#: safetensors dtype -> (NumPy dtype of the stored bits, widening to float32)
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
}


@dataclass(frozen=True)
class Entry:
    """Where one tensor's bytes lie."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def index(files: list[Path]) -> dict[str, Entry]:
    """Tensor name -> Entry over all ``files`` (a malformed header is a ConfigError)."""
    out: dict[str, Entry] = {}
    for f in files:
        with open(f, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ConfigError(f"{f} is not a safetensors file (shorter than its header length)")
            (n,) = struct.unpack("<Q", raw)
            try:
                header = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ConfigError(f"{f} is not a safetensors file (bad header: {e})") from None
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            out[name] = Entry(f, info["dtype"], tuple(info["shape"]), base + start, base + end)
    return out


def read(name: str, e: Entry) -> np.ndarray:
    """One tensor as float32."""
    if e.dtype not in DTYPES:
        raise ConfigError(f"safetensors tensor {name!r} in {e.file} has dtype {e.dtype}; the workbench reads "
                          f"{', '.join(DTYPES)} (dequantize or convert the checkpoint)")
    dt = np.dtype(DTYPES[e.dtype]).newbyteorder("<")
    count = int(np.prod(e.shape)) if e.shape else 1
    if e.end - e.start != count * dt.itemsize:
        raise ConfigError(f"safetensors tensor {name!r} in {e.file}: {e.end - e.start} bytes for shape "
                          f"{list(e.shape)} of {e.dtype}")
    with open(e.file, "rb") as fh:
        fh.seek(e.start)
        arr = np.frombuffer(fh.read(e.end - e.start), dt).reshape(e.shape)
    if e.dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


_FUSED = re.compile(r"^(?P<pre>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")


def _per_expert(name: str, entries: dict[str, Entry]) -> np.ndarray | None:
    """A fused expert tensor stacked from per-expert ones, or None when the checkpoint has none."""
    m = _FUSED.match(name)
    if not m:
        return None
    pre, proj = m["pre"], m["proj"]
    n_exp = 0
    while f"{pre}.{n_exp}.down_proj.weight" in entries:
        n_exp += 1
    if n_exp == 0:
        return None

    def get(e: int, p: str) -> np.ndarray:
        key = f"{pre}.{e}.{p}.weight"
        if key not in entries:
            raise ConfigError(f"safetensors: expert tensor {key!r} is missing (expert {e} of {n_exp})")
        return read(key, entries[key])

    if proj == "down_proj":
        return np.stack([get(e, "down_proj") for e in range(n_exp)])
    return np.stack([np.concatenate([get(e, "gate_proj"), get(e, "up_proj")], axis=0) for e in range(n_exp)])


def load(names: dict[str, tuple[int, ...]], files: list[Path]) -> tuple[dict[str, np.ndarray], set[str]]:
    """float32 arrays for every ``name -> shape`` wanted, from the files of a checkpoint, and
    the safetensors dtypes they were stored in."""
    entries = index(files)
    where = ", ".join(map(str, files))
    out: dict[str, np.ndarray] = {}
    for name, shape in names.items():
        if name in entries:
            arr = read(name, entries[name])
        else:
            arr = _per_expert(name, entries)
            if arr is None:
                raise ConfigError(f"safetensors {where}: tensor {name!r} is missing (expected shape {list(shape)})")
        if tuple(arr.shape) != tuple(shape):
            raise ConfigError(f"safetensors tensor {name!r} has shape {list(arr.shape)}, the graph expects "
                              f"{list(shape)}")
        out[name] = arr
    return out, {e.dtype for e in entries.values()}
