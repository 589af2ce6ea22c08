"""Plans for the decode steps of a run, built once and handed to every backend and the verifier.

llama.cpp pads the KV length a step attends over (``ModelConfig.kv_len``), so consecutive
steps share one graph shape and one CUDA graph until the padded length grows: steps with the
same padded length share one Plan object here too. Plans are pure values of (config, strategy,
KV length, compute capability), so they are cached for the life of the process: a lab toggle
back to an earlier strategy recompiles nothing.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from threading import Lock

from ..models import ModelConfig, build_graph
from .compile import compile_plan
from .plan import Plan
from .strategy import Strategy

#: compiled Plans kept per process (each holds its graph: a few MB for a full-size model)
CACHE_SIZE = 64

_cache: OrderedDict[tuple, Plan] = OrderedDict()
_lock = Lock()


def config_key(cfg: ModelConfig) -> tuple:
    """Everything of a ModelConfig that shapes its graph (the HF dict is not part of its hash)."""
    return (cfg.name, json.dumps(cfg.hf, sort_keys=True, default=str), cfg.context, cfg.weight_dtype, cfg.kv_dtype,
            cfg.swa_full, cfg.n_ubatch, cfg.rope_freq_factors, cfg.source, cfg.tensor_types)


def plan_for(cfg: ModelConfig, strategy: Strategy, n_kv: int | None = None,
             device_cc: tuple[int, int] | None = None) -> Plan:
    """The Plan of one step attending over ``n_kv`` rows (default: the whole context)."""
    n_kv = cfg.context if n_kv is None else n_kv
    key = (config_key(cfg), strategy, n_kv, tuple(device_cc) if device_cc else None)
    with _lock:
        plan = _cache.get(key)
        if plan is not None:
            _cache.move_to_end(key)
            return plan
    plan = compile_plan(build_graph(cfg, n_kv), strategy, device_cc)
    with _lock:
        _cache[key] = plan
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return plan


def plans_for_steps(cfg: ModelConfig, strategy: Strategy, n_tokens: int, start_pos: int = 0,
                    device_cc: tuple[int, int] | None = None) -> list[Plan]:
    """One Plan per decode step from ``start_pos``; steps with the same padded KV length share
    one Plan object (and so one CUDA graph)."""
    return [plan_for(cfg, strategy, cfg.kv_len(start_pos + step), device_cc) for step in range(n_tokens)]


def clear_plan_cache() -> None:
    with _lock:
        _cache.clear()
