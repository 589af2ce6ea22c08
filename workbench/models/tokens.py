"""The seeded token ids every backend, benchmark and test decodes: same seed, same ids."""

from __future__ import annotations

import numpy as np

from .config import ModelConfig


def token_ids(cfg: ModelConfig, n: int, seed: int = 0) -> list[int]:
    """``n`` token ids drawn uniformly from the vocabulary with ``seed``."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, cfg.get("vocab_size"), n)]
