"""``measure``: everything the fit needs, measured on this GPU, in the one order that keeps
the untraced runs free of CUPTI."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...strategy import Strategy
from ...trace import Trace
from ..calibration import gpu_key
from .environment import environment, warm_gpu
from .probes import measure_device
from .runs import measure_models, prepare_models
from .specs import CALIBRATION_MODELS, CALIBRATION_STRATEGIES, ModelSpec


def measure(specs: Sequence[ModelSpec] = CALIBRATION_MODELS,
            strategies: Mapping[str, Strategy] | None = None, tokens: int = 12,
            log: Callable[[str], None] = print, keep: Callable[[str, Trace], None] | None = None) -> dict[str, Any]:
    """Everything the fit needs, measured on this GPU."""
    env = environment()
    log(f"calibrating {env['gpu_name']} (driver {env['driver_version']}, CUDA runtime {env['cuda_runtime']})")
    raw: dict[str, Any] = {"format": 1, "environment": env, "gpu": gpu_key(env["gpu_name"]),
                           "models": [s.to_dict() for s in specs]}
    log(f"GPU warm-up {warm_gpu():.1f} s")
    log("executor runs, untraced (before CUPTI is first enabled)")
    prepared = prepare_models(specs, strategies or CALIBRATION_STRATEGIES, tokens, log=log)
    log("device probes")
    raw["device"] = measure_device(log)
    log("executor traces")
    raw.update(measure_models(prepared, log=log, keep=keep))
    return raw
