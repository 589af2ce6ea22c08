"""llama.cpp's iSWA cache: sliding-window layers keep a ring of ``window + n_ubatch`` rows
(padded to 256), so what they store and read follows the window, not the context; the full
cache (``swa_full``, llama.cpp's ``--swa-full``) stays available to compare."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.exec.reference import run_reference
from workbench.models import build_graph, load_config, preset
from workbench.models.blocks import swa_cache_rows
from workbench.strategy import ALL_ON, compile_plan
from workbench.verify import verify


def _sliding_bytes(cfg) -> float:
    """Bytes the sliding layers' cache store and attention move in one decode step."""
    g = build_graph(cfg)
    sliding = {il for il in range(cfg.n_layer) if il % 2 == 0}  # gpt-oss: even layers slide
    return sum(n.bytes for n in g.nodes if n.op in ("FLASH_ATTN_EXT", "SET_ROWS")
               and int(n.name.rsplit("-", 1)[1]) in sliding)


def test_gpt_oss_20b_sliding_bytes_follow_the_window_not_the_context():
    ring32k = preset("gpt-oss-20b", context=32768)
    assert swa_cache_rows(ring32k) == 768  # GGML_PAD(128 + 512, 256), as llama.cpp sizes it
    assert _sliding_bytes(ring32k) == _sliding_bytes(ring32k.with_(context=65536))
    wide = ring32k.with_(n_ubatch=1536 - 128)  # a ring twice as long: twice the KV bytes
    kv = build_graph(ring32k).caches["cache_k_l0"].nbytes
    assert build_graph(wide).caches["cache_k_l0"].nbytes == 2 * kv
    full = ring32k.with_(swa_full=True)
    assert _sliding_bytes(full) > 20 * _sliding_bytes(ring32k)
    assert _sliding_bytes(full.with_(context=65536)) > 1.9 * _sliding_bytes(full)


def test_ring_is_faster_in_the_simulator_and_race_free():
    import workbench

    cfg = preset("gpt-oss-20b", context=32768, layers=2)
    ring = workbench.run(cfg, ALL_ON, tokens=2, start_pos=32000, backend="sim", quiet=True)
    full = workbench.run(cfg.with_(swa_full=True), ALL_ON, tokens=2, start_pos=32000, backend="sim", quiet=True)
    assert ring.stats["us_per_token"] < full.stats["us_per_token"]
    assert ring.stats["memory_bytes"] < full.stats["memory_bytes"]
    assert verify(compile_plan(build_graph(cfg, cfg.kv_len(32000)), ALL_ON)).race_free


def test_ring_matches_the_full_cache_after_it_wraps():
    """A ring of 256 rows (window 4, n_ubatch 1) past position 256 gives the full cache's logits."""
    from workbench.models.weights import random_weights

    cfg = preset("gpt-oss-tiny", context=512, kv_dtype="f32").with_(n_ubatch=1)
    assert swa_cache_rows(cfg) == 256
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 256, 262)]
    weights = random_weights(build_graph(cfg))
    ring = run_reference(cfg, weights, tokens).logits
    full = run_reference(cfg.with_(swa_full=True), weights, tokens).logits
    assert np.abs(ring - full).max() <= 1e-5 * np.abs(full).max()


def test_ring_matches_transformers_past_the_wrap(tmp_path):
    """A checkpoint saved by transformers, read by path, decoded past the ring's end (Qwen3:
    transformers' gpt-oss decodes 10x slower on CPU; its ring is the same code, checked above)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_checkpoints import hf_logits, save_checkpoint
    from hf_parity import max_rel_err

    from workbench.models.weights import model_weights

    folder = save_checkpoint("qwen3-sliding", tmp_path / "qwen3")
    cfg = load_config(str(folder), context=512, weight_dtype="f32", kv_dtype="f32", n_ubatch=1)
    assert swa_cache_rows(cfg) == 256
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 96, 259)]
    ours = run_reference(cfg, model_weights(cfg, build_graph(cfg)), tokens).logits
    assert max_rel_err(ours, hf_logits(folder, tokens)) <= 1e-4
