"""Checkpoints saved by transformers and loaded by path on the ``cuda`` backend: the fields the
tiny presets do not exercise (llama's attention and MLP biases, Qwen3's sliding-window layers
through ``kq_mask_swa``, Qwen3-Next's attention biases, gpt-oss's window of 5) and bf16 weights
kept bf16 match the reference executor over more steps than the window, eager and under every
optimization."""

from __future__ import annotations

import pytest
from gpu_cases import TOL, rel_err

import workbench
from workbench.exec.reference import run_reference
from workbench.models import build_graph, load_config
from workbench.models.weights import model_weights
from workbench.strategy import ALL_ON, Strategy

pytest.importorskip("torch")
pytest.importorskip("transformers")

def run_cuda(cfg, strategy, tokens, weights):
    return workbench.run(cfg, strategy, tokens=tokens, backend="cuda", quiet=True, weights=weights)


NAMES = ["llama-mlp-bias", "llama-attention-bias", "qwen3-sliding", "gpt-oss-sliding", "qwen3-next"]


@pytest.mark.parametrize("strategy", [Strategy(), ALL_ON], ids=["default", "all-on"])
@pytest.mark.parametrize("name", NAMES)
def test_saved_checkpoint_on_cuda(tmp_path, name, strategy):
    from hf_checkpoints import TOKENS, save_checkpoint

    folder = save_checkpoint(name, tmp_path / name)
    cfg = load_config(str(folder), context=32)
    ref = run_reference(cfg, model_weights(cfg, build_graph(cfg)), TOKENS).logits
    run = workbench.run(cfg, strategy, tokens=TOKENS, backend="cuda", quiet=True)  # the folder's safetensors
    err = rel_err(run.logits, ref)
    assert err <= TOL, f"{name} {strategy.label()}: {err:.2e}"


def test_bf16_checkpoint_kept_bf16_on_cuda(tmp_path):
    """A bf16 checkpoint with weight_dtype bf16: the MUL_MAT kernels read the bf16 bits as saved."""
    from hf_checkpoints import TOKENS, save_checkpoint

    folder = save_checkpoint("qwen3-sliding", tmp_path / "bf16", dtype="bfloat16")
    cfg = load_config(str(folder), context=32, weight_dtype="bf16")
    weights = model_weights(cfg, build_graph(cfg))
    ref = run_reference(cfg, weights, TOKENS).logits
    for strategy in (Strategy(), ALL_ON):
        err = rel_err(run_cuda(cfg, strategy, TOKENS, weights).logits, ref)
        assert err <= TOL, f"bf16 {strategy.label()}: {err:.2e}"


@pytest.mark.parametrize("strategy", [Strategy(), ALL_ON], ids=["default", "all-on"])
def test_iswa_ring_wraps_on_cuda(strategy):
    """gpt-oss with llama.cpp's iSWA ring (256 rows: window 4, n_ubatch 1) decoded past the
    wrap: the ring index and the ring mask reach the cuda kernels as inputs."""
    import numpy as np

    from workbench.models import preset
    from workbench.models.blocks import swa_cache_rows
    from workbench.models.weights import random_weights

    cfg = preset("gpt-oss-tiny", context=512).with_(n_ubatch=1)
    assert swa_cache_rows(cfg) == 256
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 256, 262)]
    weights = random_weights(build_graph(cfg))
    ref = run_reference(cfg, weights, tokens).logits
    err = rel_err(run_cuda(cfg, strategy, tokens, weights).logits, ref)
    assert err <= TOL, f"iSWA ring {strategy.label()}: {err:.2e}"
