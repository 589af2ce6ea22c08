"""``--check``: how well a calibration predicts the very runs it was measured on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..calibration import Calibration
from .kernel_fit import cupti_kernel_ns, measured_kernels
from .specs import CALIBRATION_STRATEGIES, GRAPHS, ModelSpec


def calibration_run_errors(raw: Mapping[str, Any], cal: Calibration) -> pd.DataFrame:
    """Self-consistency of a calibration: the simulator with ``cal`` predicts every calibration
    run of ``raw`` (same model, strategy, start position and tokens as measured). Per run:
    measured (untraced) and predicted us/token and the error; and, for the graph-replay run of
    each model, its kernels' time per token measured (CUPTI durations less what tracing adds)
    and predicted, which separates the kernel-duration model from the rest of the simulator."""
    from ...trace.stats import us_per_token
    from ..sim import simulate_steps

    runs = pd.DataFrame(raw["runs"])
    inflation = cupti_kernel_ns(raw)
    kern = measured_kernels(raw, cal, inflation).groupby("model")[["duration_ns", "predicted_ns"]].sum() / 1e3
    rows = []
    for r in runs.itertuples():
        spec = ModelSpec.from_columns(r.spec_model, r.spec_layers, r.spec_context, r.spec_pos)
        us = us_per_token(simulate_steps(spec.config(), CALIBRATION_STRATEGIES[r.strategy], int(r.tokens), cal,
                                         spec.pos))
        row = {"model": r.model, "strategy": r.strategy, "measured_us": float(r.untraced_us_per_token),
               "predicted_us": us, "error_pct": 100 * (us / r.untraced_us_per_token - 1)}
        if r.strategy == GRAPHS and r.model in kern.index:
            m, p = kern.loc[r.model, "duration_ns"], kern.loc[r.model, "predicted_ns"]
            row.update(kernel_measured_us=m, kernel_predicted_us=p, kernel_error_pct=100 * (p / m - 1))
        rows.append(row)
    return pd.DataFrame(rows)
