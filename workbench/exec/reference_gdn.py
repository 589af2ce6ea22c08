"""NumPy twins of the gated-delta-net ops (Qwen3-Next linear attention)."""

from __future__ import annotations
