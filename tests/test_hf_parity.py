"""Reference executor vs Hugging Face transformers on every family's tiny preset."""

import numpy as np
import pytest
from hf_parity import hf_decode_logits, hf_model, max_rel_err, tiny_weights

from workbench.exec.reference import run_reference
from workbench.models import TINY_PRESETS, preset

TOKENS = [3, 17, 250, 9, 42, 7, 100, 1]


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_reference_matches_transformers(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg = preset(name, context=16, kv_dtype="f32")
    weights = tiny_weights(cfg)
    ours = run_reference(cfg, weights, TOKENS).logits
    theirs = hf_decode_logits(hf_model(cfg, weights), TOKENS)
    assert np.all(np.isfinite(ours))
    err = max_rel_err(ours, theirs)
    assert err <= 1e-4, f"{name}: max relative error {err:.2e}"
