"""Strategies (every knob) and their compilation to a Plan."""

from .compile import compile_plan
from .plan import HOST_OPS, Allocation, HostOp, Launch, Plan
from .strategy import (
    ALL_ON,
    ALL_ON_OURS,
    ALLOCATORS,
    FUSIONS,
    LOGITS_MODES,
    PDL_TRIGGERS,
    PDL_WAITS,
    STREAM_MODES,
    SYNC_MODES,
    WORKBENCH_FUSIONS,
    Strategy,
    StrategyError,
    UnsafeStrategyWarning,
)

__all__ = [
    "ALLOCATORS", "ALL_ON", "ALL_ON_OURS", "FUSIONS", "HOST_OPS", "LOGITS_MODES", "PDL_TRIGGERS", "PDL_WAITS",
    "STREAM_MODES", "SYNC_MODES",
    "Allocation", "HostOp", "Launch", "Plan", "Strategy", "StrategyError", "UnsafeStrategyWarning", "WORKBENCH_FUSIONS",
    "compile_plan",
]
