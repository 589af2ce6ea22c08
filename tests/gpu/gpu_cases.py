"""Models, weights and reference logits shared by the GPU tests (computed once per session).

Why the tolerance is 2e-2 (max |gpu - ref| / max |ref| over a token's logits): both executors
use the same fp16 weights and fp16 KV cache and compute in fp32, so they differ only by fp32
summation order (mat-vec over up to 8192 terms, split-context attention, block reductions:
relative ~1e-6 per op) and by where an fp16 rounding of a K/V cache entry then lands on the
other side of a half-ulp (relative 2^-11 ~ 4.9e-4 per affected entry), then propagates through
a few layers, RMS norms and the lm_head. Measured on an H200 over the whole knob matrix: at most
1.4e-6 of the largest logit (gpt-oss-20b at full width; data/bench/gpu_correctness_s15.csv),
because the fp16 roundings rarely flip; 2e-2 is the bound for the worst case of many flipped
cache entries amplified through the layers, and still fails a wrong index, a missed stride or a
race (errors of order 1).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache

import numpy as np

from workbench.exec.reference import run_reference
from workbench.models import ModelConfig, build_graph, preset
from workbench.models.tokens import token_ids
from workbench.models.weights import random_weights

TOL = 2e-2
#: decode from here: steps 254, 255 (256 KV rows) then 256 (512 rows): every run crosses a KV
#: length boundary, so graphs re-capture and eager re-binds inside each test
START = 254
N_TOKENS = 3

#: test model id -> (preset, overrides)
MODELS = {
    "llama-tiny": ("llama-tiny", {}),
    "qwen3-tiny": ("qwen3-tiny", {}),
    "qwen3-moe-tiny": ("qwen3-moe-tiny", {}),
    "gpt-oss-tiny": ("gpt-oss-tiny", {}),
    "qwen3-next-tiny": ("qwen3-next-tiny", {}),
    "llama-3.2-1b-L2": ("llama-3.2-1b", {"layers": 2}),
    # the MoE families at full width (issue 15): gpt-oss-20b's K = 2880 mat-vecs, 32 experts with
    # biases, sliding-window and full layers; qwen3-30b-a3b's 128 experts of 768 rows
    "gpt-oss-20b-L2": ("gpt-oss-20b", {"layers": 2}),
    "qwen3-30b-a3b-L2": ("qwen3-30b-a3b", {"layers": 2}),
}
TINY = tuple(m for m in MODELS if m.endswith("tiny"))


@dataclass
class Case:
    name: str
    cfg: ModelConfig
    weights: dict[str, np.ndarray]
    tokens: list[int]
    ref: np.ndarray  # [N_TOKENS, vocab] reference logits from START


@cache
def model_case(name: str) -> Case:
    """The case's config, seeded weights, tokens and reference logits. With $WORKBENCH_GPU_CASES
    set to a folder, they are kept there as ``<name>.npz`` and read back by later processes: the
    full-width MoE cases take a minute or more of NumPy each, which every pytest-xdist worker
    would otherwise repeat. The file is keyed by the case's name only: use a fresh folder per
    checkout (a scratch folder of the GPU run)."""
    base, over = MODELS[name]
    cfg = preset(base, **over)
    tokens = token_ids(cfg, N_TOKENS + 1, 1)
    folder = os.environ.get("WORKBENCH_GPU_CASES")
    path = os.path.join(folder, f"{name}.npz") if folder else None
    if path and os.path.exists(path):
        with np.load(path) as z:
            weights = {k[2:]: z[k] for k in z.files if k.startswith("w:")}
            return Case(name, cfg, weights, tokens, z["ref"])
    weights = random_weights(build_graph(cfg), 0)
    ref = run_reference(cfg, weights, tokens[:N_TOKENS], start_pos=START).logits
    if path:
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.npz"
        np.savez(tmp, ref=ref, **{f"w:{k}": v for k, v in weights.items()})
        os.replace(tmp, path)  # whole or absent for a concurrent reader
    return Case(name, cfg, weights, tokens, ref)


_BASE: dict[str, object] = {}


def executor(case: Case, strategy, kernels: str = "cupy"):
    """A CudaExecutor for ``strategy`` sharing the case's device weights (caches zeroed)."""
    from workbench.exec.cuda import CudaExecutor
    from workbench.strategy import Strategy

    base = _BASE.get(case.name)
    if base is None:
        base = _BASE[case.name] = CudaExecutor(case.cfg, Strategy(), case.weights)
    return CudaExecutor(case.cfg, strategy, kernels=kernels, share=base)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Max over tokens of max |got - ref| / max |ref| (inf when anything is not finite)."""
    got, ref = np.atleast_2d(got), np.atleast_2d(ref)
    if not np.isfinite(got).all():
        return float("inf")
    return float(max(np.abs(g - r).max() / np.abs(r).max() for g, r in zip(got, ref)))


RESULTS: list[dict] = []


def record(**row) -> None:
    """Keep a measured row; with $WORKBENCH_GPU_RESULTS set, also append it there as a JSON line
    (so a run cut short by a time limit still leaves its numbers)."""
    RESULTS.append(row)
    path = os.environ.get("WORKBENCH_GPU_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
