"""The GPU benchmarks' host side without a GPU: kernel_bench's node choice and variant bindings at
full size, gpu_decode's argument checks (both run on the GPU machine; see their docstrings)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from workbench.exec import cuda_ops

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bind(node, knobs: dict) -> str:
    kb = _load("kernel_bench")
    with kb.variant(knobs):
        return cuda_ops.bind(node, lambda v: 1 << 20, lambda key, n: 0).name


def test_kernel_bench_covers_each_op_and_restores_the_defaults():
    kb = _load("kernel_bench")
    before = {k: getattr(cuda_ops, k) for knobs in kb.VARIANTS.values() for v in knobs.values() for k in v}
    nodes = {n.name: n for n in kb.bench_nodes("gpt-oss-20b")}
    assert {n.op for n in nodes.values()} == set(kb.OPS)
    assert "ffn_moe_up-0" in nodes and "ffn_moe_gate-0" not in nodes  # gate and up: one shape
    names = {v: _bind(nodes["ffn_moe_up-0"], knobs) for v, knobs in kb.VARIANTS["MUL_MAT_ID"].items()}
    assert names == {"default": "k_mul_mat_id_seg_f16", "warp": "k_mul_mat_id_f16", "seg16": "k_mul_mat_id_seg_f16",
                     "seg8": "k_mul_mat_id_seg_f16"}
    assert _bind(nodes["kqv_out-0"], kb.VARIANTS["FLASH_ATTN_EXT"]["gqa"]) == "k_flash_attn_ext_gqa_f16"
    assert {k: getattr(cuda_ops, k) for k in before} == before


@pytest.mark.parametrize("argv,message", [(["--peers", "jax"], "--peers: unknown jax"),
                                          (["--skip", "lama"], "--skip: unknown lama"),
                                          (["--models", "gpt-oss-20b"], "llama-family presets")])
def test_gpu_decode_names_unknown_peers_and_parts(argv, message):
    gd = _load("gpu_decode")
    with pytest.raises(SystemExit, match=message):
        gd.main(argv)
