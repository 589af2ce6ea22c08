"""The result every backend returns (sim, cuda, reference), so views and comparisons take any."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..strategy import Plan
from ..trace import Trace


@dataclass
class Run:
    """One run of decode steps.

    ``backend``: ``sim``, ``cuda`` or ``reference``; ``device``: what ran it, in words;
    ``plan``: the Plan of the last step (the largest KV length; its ``memory_bytes`` is the
    footprint); ``logits``: ``[tokens, vocab]`` (None where the backend computes no values, the
    simulator); ``trace``: the event table; ``stats``: ``workbench.trace.stats.summarize`` of
    the trace plus backend facts.
    """

    backend: str
    device: str
    plan: Plan | None
    logits: np.ndarray | None
    trace: Trace
    stats: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return int(self.stats.get("tokens", 0))
