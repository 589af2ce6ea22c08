"""The ``reference`` backend: the Plans' graphs (fusions and allocation applied) in NumPy."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .backend import NoOptions, RunRequest
from .reference import run_reference
from .run import Run


class ReferenceBackend:
    """Logits, no timing: the numerical truth every other backend is checked against."""

    name = "reference"
    Options = NoOptions

    def available(self) -> tuple[bool, str]:
        return True, "NumPy runs anywhere"

    def compute_capability(self, options: NoOptions) -> tuple[int, int] | None:
        return None  # NumPy checks no device limits

    def run(self, req: RunRequest) -> Run:
        from ..models import build_graph
        from ..models.weights import model_weights
        from ..trace import COLUMNS, Trace

        plans = list(req.plans)
        req.report("weights")
        weights = model_weights(req.cfg, build_graph(req.cfg), req.seed)  # the checkpoint's, else random
        n = len(req.token_ids)

        def graph_for(pos: int):
            step = pos - req.start_pos
            req.report("tokens", step, n)
            return plans[step].graph

        ref = run_reference(req.cfg, weights, req.token_ids, start_pos=req.start_pos, graph_for=graph_for)
        stats = {"tokens": n, "memory_bytes": max(p.memory_bytes for p in plans),
                 "logits_finite": bool(np.isfinite(ref.logits).all())}
        empty = Trace(pd.DataFrame({c: [] for c in COLUMNS}), {"source": "reference"})
        return Run("reference", "CPU (NumPy reference executor)", plans[-1], ref.logits, empty, stats,
                   {"plans": plans, "start_pos": req.start_pos})
