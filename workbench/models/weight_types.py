"""Which ggml type each weight is stored in when the model asks for a block type.

A quantised GGUF does not quantise everything: ``convert_hf_to_gguf.py`` and ``llama-quantize``
keep vectors (norms, biases), the MoE routers and the conv kernels in f32, and fall back to f16
(the converter's q8_0 fallback) where a row is not a whole number of blocks. With ``mxfp4`` only
the expert tensors are mxfp4 and the other matrices q8_0 (``llama-quantize``'s MXFP4_MOE, what
the gpt-oss GGUFs hold). Everything else is stored as asked, the token embeddings and the output
too (``llama-quantize --pure``; its default would make the output q6_k, a type not read here).
A config read from a GGUF carries the file's own type per tensor (``ModelConfig.tensor_types``),
which wins over these rules.
"""

from __future__ import annotations

from ..graph.tensor import block_size, is_quantized
from .config import ModelConfig
from .validate import WEIGHT_QTYPES

__all__ = ["F32_WEIGHTS", "WEIGHT_QTYPES", "weight_type", "weight_typer"]

#: Hugging Face weights the converter always stores in f32 (routers, the shared-expert gate, convs).
F32_WEIGHTS = ("mlp.gate.weight", "mlp.router.weight", "shared_expert_gate.weight", "conv1d.weight")


def weight_type(cfg: ModelConfig, name: str, shape: tuple[int, ...], dtype: str) -> str:
    """The type the weight ``name`` of ``shape`` is stored in when its builder asks for ``dtype``."""
    given = dict(cfg.tensor_types or ())
    if name in given:
        return given[name]
    if not is_quantized(dtype):
        return dtype
    if len(shape) < 2 or name.endswith(F32_WEIGHTS):
        return "f32"
    qtype = "q8_0" if dtype == "mxfp4" and len(shape) < 3 else dtype
    return qtype if shape[-1] % block_size(qtype) == 0 else "f16"


def weight_typer(cfg: ModelConfig):
    """The ``GraphBuilder.weight_type`` hook of ``cfg``."""
    return lambda name, shape, dtype: weight_type(cfg, name, shape, dtype)
