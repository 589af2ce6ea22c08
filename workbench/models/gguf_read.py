"""Read a GGUF's tensors as the graph's weights: memory-mapped, in their stored types.

The writer's per-tensor rules (``gguf_write.tensor_rules``: renames, the Llama Q/K row
permutation, split and transposed expert tensors, Qwen3-Next's regrouped projections) are pure
rearrangements, so each is inverted by running it on an index array and scattering the file's
tensor back through the indices; a plain rename maps the memory-mapped data without a copy.
Quantised tensors keep their blocks (the rules move whole rows of them), so the reference
dequantises exactly the bytes llama.cpp reads. The values are those of the file, where the
converter has already applied its folds (Qwen3-Next's ``1 + w`` norms, ``A = -exp(A_log)``):
the dict is marked ``folded``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..graph import Graph, is_quantized
from .errors import ConfigError

#: ggml type name -> workbench dtype, for the types the workbench reads.
GGUF_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_K": "q4_k",
               "Q6_K": "q6_k", "MXFP4": "mxfp4"}


class GGUFWeights(dict):
    """HF name -> storage array, read from a GGUF: the load-time folds are already applied."""

    folded = True


def open_gguf(path: str | Path) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` (memory-mapped); a truncated file names the first tensor
    whose bytes run past its end, any other unreadable file says what the gguf package found."""
    import gguf

    path = Path(path)

    class Reader(gguf.GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list) -> None:
            size = len(self.data)
            for field in fields:
                _, name, _, dims, raw_type, offset = field.parts
                name = bytes(name).decode("utf-8", "replace")
                try:
                    ggml_type = gguf.GGMLQuantizationType(int(raw_type[0]))
                except ValueError:
                    raise ConfigError(f"GGUF {path}: tensor {name!r} has ggml type id {int(raw_type[0])}, "
                                      "unknown to the gguf package") from None
                block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
                start = int(start_offs + offset[0])
                end = start + int(np.prod(dims)) * type_size // block
                if end > size:
                    raise ConfigError(f"GGUF {path} is truncated: tensor {name!r} ({ggml_type.name}) needs bytes "
                                      f"{start}..{end} but the file has {size}")
            super()._build_tensors(start_offs, fields)

    try:
        return Reader(str(path))
    except ConfigError:
        raise
    except Exception as e:  # the gguf package raises plain ValueErrors for bad magic etc.
        raise ConfigError(f"{path} is not a readable GGUF file: {e}") from None


def dtype_of(path: str | Path, tensor: Any) -> str:
    """The workbench dtype of a GGUF tensor; an unsupported type names the type and the tensor."""
    name = tensor.tensor_type.name
    if name not in GGUF_DTYPES:
        raise ConfigError(f"GGUF {path}: tensor {tensor.name!r} is stored as {name}, which the workbench does "
                          f"not read; supported: {', '.join(GGUF_DTYPES)}")
    return GGUF_DTYPES[name]


def tensor_names(cfg, graph: Graph) -> dict[str, list[str]]:
    """HF weight name -> the GGUF tensors the converter writes for it (shapes only, no data)."""
    from .gguf_write import tensor_rules

    out = {}
    for name, rule in tensor_rules(cfg, graph).items():
        shape = graph.weights[name].shape
        out[name] = [g for g, _ in rule(np.broadcast_to(np.zeros(1, np.uint8), shape))]
    return out


def file_types(cfg, reader: Any, path: str | Path) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(the file's weight dtype, per HF weight its stored dtype) for a config read from ``reader``.

    The weight dtype is the type holding most of the matrices' bytes; a weight stored in a type
    the workbench does not read is left to that dtype's rules (so sim costs it and llama.cpp
    runs it), and reading its values (``load_gguf_weights``) names it."""
    from . import build_graph

    by_name = {t.name: t for t in reader.tensors}
    graph = build_graph(cfg, n_kv=1)
    types: dict[str, str] = {}
    weight_bytes: dict[str, int] = {}
    for hf_name, gnames in tensor_names(cfg, graph).items():
        found = [by_name[g] for g in gnames if g in by_name]
        if len(found) != len(gnames):
            continue  # reported when the weights are read
        kinds = {t.tensor_type.name for t in found}
        if len(kinds) == 1 and (kind := kinds.pop()) in GGUF_DTYPES:
            types[hf_name] = GGUF_DTYPES[kind]
            if len(graph.weights[hf_name].shape) >= 2:
                weight_bytes[types[hf_name]] = weight_bytes.get(types[hf_name], 0) + sum(int(t.n_bytes) for t in found)
    quantized = {k: v for k, v in weight_bytes.items() if is_quantized(k)}
    pool = quantized or {k: v for k, v in weight_bytes.items() if k != "f32"} or weight_bytes
    main = max(pool, key=pool.get) if pool else "f16"
    return main, tuple(sorted(types.items()))


def load_gguf_weights(graph: Graph, path: str | Path) -> GGUFWeights:
    """The weights of ``graph`` (built from the config ``from_gguf`` read from ``path``) as stored
    in the file: memory-mapped where a tensor is only renamed, gathered through the inverted
    rules otherwise. Clear errors name a missing, mis-typed or mis-shaped tensor."""
    cfg = graph.meta["config"]
    reader = open_gguf(path)
    by_name = {t.name: t for t in reader.tensors}
    from .gguf_write import tensor_rules

    out = GGUFWeights()
    for name, rule in tensor_rules(cfg, graph).items():
        view = graph.weights[name]
        shape = (*view.shape[:-1], view.counts[-1] * view.itemsize) if is_quantized(view.dtype) else view.shape
        index = None if getattr(rule, "identity", False) else \
            np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        parts = rule(index if index is not None else np.broadcast_to(np.zeros(1, np.uint8), shape))
        store = None
        for gname, idx in parts:
            t = by_name.get(gname)
            if t is None:
                raise ConfigError(f"GGUF {path}: tensor {gname!r} (the model's {name}) is missing")
            dtype = dtype_of(path, t)
            if dtype != view.dtype:
                raise ConfigError(f"GGUF {path}: tensor {gname!r} is {dtype} but the model reads {name} as "
                                  f"{view.dtype}")
            data = np.asarray(t.data)
            if dtype == "bf16":
                data = data.view(np.uint16)
            if data.shape != idx.shape:
                raise ConfigError(f"GGUF {path}: tensor {gname!r} has storage shape {data.shape}; the model's "
                                  f"{name} needs {idx.shape}")
            if index is None:
                store = data
                break
            if store is None:
                store = np.empty(shape, data.dtype)
            store.reshape(-1)[np.asarray(idx).reshape(-1)] = data.reshape(-1)
        out[name] = store
    return out
