"""The one interface every executor implements, and the registry that names them.

A backend takes Plans that were built once (``workbench.strategy.steps.plans_for_steps``) and
the token ids to decode, and returns a ``Run``. Adding a backend is one module with a class
that has ``name``, ``Options``, ``available()`` and ``run()``, plus one line in ``REGISTRY``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Protocol

from ..models import ModelConfig
from ..strategy import Plan, Strategy
from .run import Run

#: (stage, done, total): a backend reports its stages ("weights", "compile", "tokens", ...) and
#: per-token progress through this, so the panel and the CLI can show it.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class NoOptions:
    """For backends without options of their own."""


@dataclass(frozen=True)
class RunRequest:
    """What every backend gets: the model, the strategy, one Plan per decode step (steps with
    the same padded KV length share a Plan object), the token ids, and the backend's options."""

    cfg: ModelConfig
    strategy: Strategy
    plans: Sequence[Plan]
    token_ids: Sequence[int]
    start_pos: int = 0
    seed: int = 0
    trace: bool = False
    options: Any = field(default_factory=NoOptions)
    progress: Progress | None = None

    def report(self, stage: str, done: int = 0, total: int = 0) -> None:
        if self.progress is not None:
            self.progress(stage, done, total)


class BackendError(RuntimeError):
    """A backend cannot run here (no GPU, no build, a knob it has no switch for)."""


class Backend(Protocol):
    """An executor of Plans."""

    name: str
    #: frozen dataclass of the backend's own options, every field defaulted
    Options: type

    def available(self) -> tuple[bool, str]:
        """(usable here, why or why not, in words)."""
        ...

    def run(self, req: RunRequest) -> Run:
        ...


#: name -> "module:Class"; the classes are imported on first use, so a backend whose
#: dependencies are missing (CuPy, a llama.cpp build) costs nothing until asked for.
REGISTRY: dict[str, str] = {
    "sim": "workbench.exec.sim_backend:SimBackend",
    "reference": "workbench.exec.reference_backend:ReferenceBackend",
    "cuda": "workbench.exec.cuda_backend:CudaBackend",
    "llamacpp": "workbench.exec.llamacpp:LlamaCppBackend",
}

_instances: dict[str, Backend] = {}


def backends() -> list[str]:
    """The registered backend names."""
    return list(REGISTRY)


def get_backend(name: str) -> Backend:
    """The backend registered as ``name`` (one instance per process, so a backend may keep
    device state such as weights and compiled modules across runs)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(REGISTRY)}")
    inst = _instances.get(name)
    if inst is None:
        mod_name, cls_name = REGISTRY[name].split(":")
        inst = _instances[name] = getattr(import_module(mod_name), cls_name)()
    return inst
