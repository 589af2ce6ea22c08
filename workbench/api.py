"""``workbench.run``: the one library entry point the CLI, the panel and the notebooks share.

model name/config -> ModelConfig -> Plans built once (``strategy.steps``) -> a registered
Backend -> Run. Options that belong to one backend (the simulator's calibration, the cuda
backend's kernel set, ...) are passed as keywords and checked against that backend's
``Options`` dataclass, so a misspelt or misplaced option is an error, not ignored.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import preflight, validate
from .exec.backend import Progress, RunRequest, get_backend
from .exec.run import Run
from .models import ModelConfig
from .models.tokens import token_ids
from .resources import MAX_SECONDS
from .strategy import Strategy
from .strategy.steps import plans_for_steps


def default_backend() -> tuple[str, str]:
    """(backend, why): ``cuda`` when a CUDA GPU and CuPy are present, else ``sim``."""
    ok, why = get_backend("cuda").available()
    return ("cuda" if ok else "sim"), why


def resolve_model(model: str | ModelConfig, layers: int | None = None, context: int | None = None) -> ModelConfig:
    """A ModelConfig from a name/path (``layers``/``context`` range-checked before loading) or
    a ModelConfig with those overrides."""
    if isinstance(model, ModelConfig):
        if layers is None and context is None:
            return model
        validate.check_model_options(layers, context)
        return model.with_(layers=layers, context=context)
    return preflight.load_model({"model": model, "layers": layers, "context": context})


def backend_options(backend: str, options: dict[str, Any]) -> Any:
    """The backend's Options dataclass from keywords; an unknown keyword names the valid ones."""
    cls = get_backend(backend).Options
    names = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(options) - names)
    if bad:
        raise ValueError(f"backend {backend!r} has no option {', '.join(bad)}; its options: "
                         f"{', '.join(sorted(names)) or '(none)'}")
    return cls(**options)


def run(model: str | ModelConfig, strategy: Strategy | None = None, *, tokens: int | Sequence[int] = 8,
        backend: str | None = None, layers: int | None = None, context: int | None = None, start_pos: int = 0,
        seed: int = 0, trace: bool = False, progress: Progress | None = None, quiet: bool = False,
        max_seconds: float = MAX_SECONDS, notice: Callable[[str], None] | None = None, **options: Any) -> Run:
    """Run decode steps of ``model`` (a preset name, a config.json/folder/.gguf path or a
    ModelConfig) under ``strategy`` (default: llama.cpp's behaviour before the four changes).

    ``tokens``: a count of seeded random token ids or the ids themselves; ``backend``: a name
    from ``workbench.backends()`` (default: ``cuda`` with a GPU, else ``sim``); ``trace``: record
    a device timeline where the backend can (the simulator always does); ``progress(stage,
    done, total)`` is called as the run advances; ``max_seconds``: refuse a run estimated to take
    longer (``resources.estimate``); ``notice``: where warnings and notices go (default stderr);
    other keywords go to the backend's options (e.g. ``gpu="h200"``, ``host="llama.cpp"`` for
    ``sim``; ``kernels="numba"`` for ``cuda``). Bad input raises a ValueError naming it.
    """
    strategy = strategy or Strategy()
    if backend is None:
        backend, why = default_backend()
        if not quiet:
            print(f"workbench: backend {backend} ({why}; choose with backend=... / --backend)", file=sys.stderr)
    emit = notice or (lambda text: print(f"workbench: {text}", file=sys.stderr))
    impl = get_backend(backend)
    opts = backend_options(backend, options)
    cfg = resolve_model(model, layers, context)
    n = tokens if isinstance(tokens, int) else len(tokens)
    preflight.run_options(cfg, {"tokens": n, "start_pos": start_pos, "seed": seed, "max_seconds": max_seconds})
    ids = token_ids(cfg, tokens, seed) if isinstance(tokens, int) else [int(t) for t in tokens]
    ok, why = impl.available()
    if not ok:
        raise RuntimeError(f"backend {backend!r} cannot run here: {why}. Use --backend sim (backend='sim') to "
                           "simulate the run on a calibrated GPU instead")
    cc = impl.compute_capability(opts)
    est = preflight.resource_checks(cfg, strategy, backend, len(ids), start_pos, max_seconds, emit,
                                    gpu=getattr(impl, "calibration_name", lambda o: None)(opts),
                                    held_device_bytes=getattr(impl, "held_bytes", lambda o: 0)(opts))
    for note in getattr(impl, "notes", lambda o: [])(opts):  # after the checks: an error stays one line
        emit(note)
    if progress is not None:
        progress("plan", 0, len(ids))
    plans = plans_for_steps(cfg, strategy, len(ids), start_pos, cc)
    req = RunRequest(cfg, strategy, plans, ids, start_pos=start_pos, seed=seed, trace=trace, options=opts,
                     progress=progress)
    result = impl.run(req)
    result.stats.update(preflight.result_flags(est))
    result.meta.setdefault("plans", plans)
    result.meta["notes"] = sorted({n for p in plans for n in p.warnings})
    return result
