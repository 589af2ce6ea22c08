"""RoPE inverse frequencies per config (default, linear, llama3, yarn), as Hugging Face computes them.

ggml passes such frequencies to its rope kernel as ``rope_freqs``; the graph carries them as a
constant tensor so that every executor rotates with exactly the same numbers. A Llama-3 GGUF
carries its rope scaling only as that tensor (per-pair divisors of the base frequencies, see
``ModelConfig.rope_freq_factors``), which then replaces the ``rope_scaling`` of the config.
"""

from __future__ import annotations

import math

import numpy as np

from .config import ConfigError, ModelConfig


def rotary_dims(cfg: ModelConfig) -> int:
    """How many leading dims of each head are rotated (partial rotary for Qwen3-Next)."""
    return int(cfg.head_dim * float(cfg.get("partial_rotary_factor", 1.0)))


def rope_params(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """``(inv_freq[n_rot/2], attention_scaling)`` for the config's rope type, or the base
    frequencies divided by ``ModelConfig.rope_freq_factors`` where the config has them."""
    return _scaled_inv_freq(cfg)


def _scaled_inv_freq(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    n_rot = rotary_dims(cfg)
    base = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
    scaling = cfg.get("rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if cfg.rope_freq_factors is not None:  # ggml: theta = pos * base_freq / freq_factor
        factors = np.asarray(cfg.rope_freq_factors, np.float64)
        if factors.shape != inv.shape:
            raise ConfigError(f"{cfg.name}: rope_freqs has {factors.size} factors, the model rotates "
                              f"{n_rot} dims ({inv.size} pairs)")
        return (inv / factors).astype(np.float32), 1.0
    if kind == "default":
        return inv.astype(np.float32), 1.0
    if kind == "linear":
        return (inv / float(scaling["factor"])).astype(np.float32), 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        out = np.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wl >= hi_wl) & (wl <= lo_wl)
        return np.where(medium, smoothed, out).astype(np.float32), 1.0
    if kind == "yarn":
        old = scaling.get("original_max_position_embeddings") or cfg.get("max_position_embeddings")
        factor = scaling.get("factor") or cfg.get("max_position_embeddings") / old
        beta_fast, beta_slow = scaling.get("beta_fast") or 32.0, scaling.get("beta_slow") or 1.0

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 0.1 * m * math.log(scale) + 1.0 if scale > 1 else 1.0

        mscale = scaling.get("attention_factor")
        if mscale is None:
            m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
            mscale = get_mscale(factor, m) / get_mscale(factor, m_all) if m and m_all else get_mscale(factor)

        def corr_dim(rot: float) -> float:
            return (n_rot * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, n_rot - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(n_rot // 2, dtype=np.float32) - low) / (high - low), 0, 1)
        extrap = 1.0 - ramp
        pos_freqs = base ** (np.arange(0, n_rot, 2, dtype=np.float32) / n_rot)
        inv_inter, inv_extra = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
        inv = inv_inter * (1 - extrap) + inv_extra * extrap
        return inv.astype(np.float32), float(mscale)
    raise ConfigError(f"{cfg.name}: rope_scaling.rope_type {kind!r} is not modelled (default, linear, llama3, yarn)")
