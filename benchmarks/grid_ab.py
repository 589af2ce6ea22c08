"""Whole decode steps under the binder's launch-grid rules and alternatives, side by side: each
variant patches ``cuda_ops`` (a grid cap, a kernel threshold, the warps a fused mat-vec gives a
row) before its executor binds, on the peer's best strategy (``ALL_ON_OURS``, PDL signalling
after the main loop, zero-copy logits) and without PDL; the executors share device weights and
run in interleaved rounds (the order reversed every other round); the logits are compared with
the default's. A variant's ``DEFINES`` (extra ``-D`` options) recompile the mat-vec kernels for
its executor only.

Why whole steps: a grid that is slower in isolation can be faster under PDL and the reverse
(``data/bench/kernels_s26_h200.md`` section 5: llama-3.1-8b's gate/up at 448 against 598 blocks),
so the rules must be checked where they run.

    python3 benchmarks/grid_ab.py --models llama-3.1-8b,llama-3.2-1b --variants grid --json $OUT/grid_ab.json
    python3 benchmarks/grid_ab.py --models llama-3.2-1b,llama-3.1-8b,qwen3-8b,gpt-oss-20b:8,qwen3-30b-a3b:8 \\
        --variants splits --json $OUT/splits_ab.json
    python3 benchmarks/grid_ab.py --models llama-3.1-8b,llama-3.2-1b --variants rows --json $OUT/rows_ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from math import ceil
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fusion_effects import model_config  # noqa: E402
from host_path_variants import probe_tokens, step_run  # noqa: E402

from workbench.exec import cuda_ops  # noqa: E402
from workbench.exec.kernels import ModuleCache  # noqa: E402
from workbench.strategy import ALL_ON_OURS, Strategy  # noqa: E402

BEST = ALL_ON_OURS.with_(pdl_trigger="after-main-loop", logits="zero-copy")


def _forced(warps: int) -> Callable[[int, int], int]:
    return lambda items, nvec: warps


def _chain_fused_splits(items: int, nvec: int) -> int:
    """The fused mat-vecs' warps per row before 2026-11-29: the shortest load chain, the grid's
    rounds times a lane's vectors of a row, fewer warps on a tie."""
    def chain(s: int) -> int:
        return ceil(ceil(items / (cuda_ops.MMV_WARPS // s)) / cuda_ops.FMV_MAX_BLOCKS) * ceil(nvec / (32 * s))
    return min((1, 2, 4), key=chain)


def _one_warp_qkv_splits(pairs: int, nvec: int) -> int:
    """The Q/K/V kernel's warps per pair before 2026-11-29: one while the pairs fit one round."""
    return 1 if pairs <= cuda_ops.FMV_MAX_BLOCKS * cuda_ops.MMV_WARPS else _chain_fused_splits(pairs, nvec)


OLD_RULES = {"fused_splits": _chain_fused_splits, "qkv_splits": _one_warp_qkv_splits}

#: the kernel sources a variant's ``DEFINES`` (extra NVRTC ``-D`` options) are compiled into: the
#: mat-vec kernels (``kernels/mat_vec.cuh`` is inlined into both)
DEFINED_SOURCES = ("mul_mat", "fused_mat_vec")


def _rows_kernel_from(k_min: Callable[[int], int | None]) -> dict[str, Any]:
    """The binders with MUL_MAT's row-streaming threshold (``MMV_ROWS_MIN``) set per input width
    K (``k_min(K)``, None: unchanged): ``lambda K: 8193 if K == 4096 else None`` puts
    llama-3.1-8b's o_proj (4096 x 4096) on the block kernel and leaves its down projection
    (K = 14336) and lm_head (N = 128256) on the row-streaming one."""
    def mul_mat(node: Any, addr: Any, ws: Any) -> Any:
        saved = cuda_ops.MMV_ROWS_MIN
        v = k_min(node.srcs[0].shape[-1])
        cuda_ops.MMV_ROWS_MIN = saved if v is None else v
        try:
            return cuda_ops._mul_mat(node, addr, ws)
        finally:
            cuda_ops.MMV_ROWS_MIN = saved
    return {**cuda_ops._BINDERS, "MUL_MAT": mul_mat, "MUL_MAT_ADD": mul_mat}


#: mat-vecs of K >= 8192 under 8193 rows on the block kernel
_BLOCK_LONGK = _rows_kernel_from(lambda K: 8193 if K >= 8192 else None)


class _Every:
    """A shape table that holds every shape."""

    def __contains__(self, _: object) -> bool:
        return True


#: the binder without its measured shape tables (cuda_ops.HEAD_DEEP_RING, MMV_BLOCK_SHAPES)
NO_TABLES = {"HEAD_DEEP_RING": frozenset(), "MMV_BLOCK_SHAPES": frozenset()}

#: graph replay with PDL signalling at each kernel's start (the fidelity report's ``pdl`` knob)
GRAPHS_PDL = Strategy(graphs=True, pdl=True)


def _rows_per_warp_at(rows: int, rpw: int) -> Callable[[int], int]:
    """``cuda_ops._rows_per_warp`` with ``rpw`` rows a warp for mat-vecs of ``rows`` output rows."""
    default = cuda_ops._rows_per_warp
    return lambda n: rpw if n == rows else default(n)


#: variant sets: name -> (strategy, {cuda_ops attribute: value})
VARIANTS: dict[str, dict[str, tuple[Strategy, dict[str, Any]]]] = {
    "grid": {"base": (BEST, {}),
             # blocks of the fused mat-vecs at most: 3, 5, 6, 8 a SM instead of 4
             **{f"fmv{b}": (BEST, {"FMV_MAX_BLOCKS": b}) for b in (396, 660, 792, 1056)},
             # mat-vecs of 4096 rows on the block kernel (2 warps a row) instead of the row-streaming one
             "blockmv": (BEST, {"MMV_ROWS_MIN": 8193}),
             "qkv2": (BEST, {"qkv_splits": _forced(2)})},
    "splits": {"base": (BEST, {}),
               **{f"qkv{w}": (BEST, {"qkv_splits": _forced(w)}) for w in (1, 2, 4)},
               **{f"glu{w}": (BEST, {"fused_splits": _forced(w)}) for w in (1, 2, 4)},
               "nopdl_base": (BEST.with_(pdl=False), {}),
               **{f"nopdl_qkv{w}": (BEST.with_(pdl=False), {"qkv_splits": _forced(w)}) for w in (1, 2)}},
    # the binder's rules against the ones before them, with and without PDL
    "rules": {"base": (BEST, {}), "old_rules": (BEST, OLD_RULES),
              "nopdl_base": (BEST.with_(pdl=False), {}), "nopdl_old_rules": (BEST.with_(pdl=False), OLD_RULES)},
    # the row-streaming mat-vec's loads in flight per lane (MMV_ROWS_UNROLL, default 2), and the
    # 4096-row mat-vecs of llama-3.1-8b one at a time on the block kernel (o_proj: K = 4096, down:
    # 14336), on the binder before the shape tables: data/bench/grid_ab_h200_rows.json
    "rows": {"base": (BEST, dict(NO_TABLES)),
             **{f"rows_u{u}": (BEST, {**NO_TABLES, "DEFINES": (f"-DMMV_ROWS_UNROLL={u}",)}) for u in (1, 3, 4, 6)},
             "block_o": (BEST, {**NO_TABLES, "_BINDERS": _rows_kernel_from(lambda K: 8193 if K == 4096 else None)}),
             "block_down": (BEST, {**NO_TABLES,
                                   "_BINDERS": _rows_kernel_from(lambda K: 8193 if K == 14336 else None)}),
             "nopdl_base": (BEST.with_(pdl=False), dict(NO_TABLES)),
             "nopdl_rows_u4": (BEST.with_(pdl=False), {**NO_TABLES, "DEFINES": ("-DMMV_ROWS_UNROLL=4",)})},
    # the fused lm_head's ring depth on every model, on the binder before the shape tables below
    # (both emptied): data/bench/grid_ab_h200_head_defines.json
    "ring": {"base": (BEST, dict(NO_TABLES)),
             **{f"head_u{u}": (BEST, {**NO_TABLES, "HEAD_DEEP_RING": _Every(), "DEFINES": (f"-DMMV_HEAD_UNROLL={u}",)})
                for u in (3, 4)},
             "block_longk": (BEST, {**NO_TABLES, "_BINDERS": _BLOCK_LONGK}),
             "block_longk_head_u4": (BEST, {**NO_TABLES, "HEAD_DEEP_RING": _Every(), "_BINDERS": _BLOCK_LONGK}),
             "nopdl_base": (BEST.with_(pdl=False), dict(NO_TABLES)),
             "nopdl_head_u4": (BEST.with_(pdl=False), {**NO_TABLES, "HEAD_DEEP_RING": _Every()})},
    # the grids that lose time when PDL launches them early (data/bench/pdl_saving_by_model_h200.md:
    # gpt-oss-20b's 360-block expert and o_proj mat-vecs, qwen3-8b's 512-block gate/up), each with
    # PDL signalling at the start and without PDL: the expert mat-vecs' lanes a row (360 blocks at
    # 8; 16: 720, 4: 180) or the whole-warp kernel, o_proj (2880 rows) on the block kernel, and
    # qwen3-8b's 12288-row mat-vecs at 2 or 4 rows a warp (768, 384 blocks) instead of 3 (512)
    "pdl_early": {name: (GRAPHS_PDL if pdl else Strategy(graphs=True), patch)
                  for base, patch in (("base", {}), ("seg16", {"MMV_SEG_LANES": 16}), ("seg4", {"MMV_SEG_LANES": 4}),
                                      ("noseg", {"MMV_SEG_K_MAX": 0}), ("block_o", {"MMV_ROWS_MIN": 2881}),
                                      ("rpw2", {"_rows_per_warp": _rows_per_warp_at(12288, 2)}),
                                      ("rpw4", {"_rows_per_warp": _rows_per_warp_at(12288, 4)}))
                  for pdl in (True, False) for name in [base if pdl else f"nopdl_{base}"]},
    # gpt-oss-20b's expert mat-vecs on the whole-warp kernel and its o_proj on the block kernel
    # (each faster under PDL signalling at the start in "pdl_early"), together, under that, the
    # peer's best strategy (PDL signalling after the main loop, every fusion) and no PDL
    "gptoss_grids": {name: (st, patch)
                     for base, patch in (("base", {}), ("noseg_block_o", {"MMV_SEG_K_MAX": 0, "MMV_ROWS_MIN": 2881}))
                     for prefix, st in (("", GRAPHS_PDL), ("best_", BEST), ("nopdl_", Strategy(graphs=True)))
                     for name in [prefix + base]},
    # qwen3-8b's gate/up (12288 x 4096) on the block kernel (1536 blocks) instead of the
    # row-streaming one (512), under PDL signalling at the start, the best strategy and no PDL
    "qwen3_gate_up": {name: (st, patch)
                      for base, patch in (("base", {}),
                                          ("block_gate_up", {"MMV_BLOCK_SHAPES": cuda_ops.MMV_BLOCK_SHAPES
                                                             | {(12288, 4096)}}))
                      for prefix, st in (("", GRAPHS_PDL), ("best_", BEST), ("nopdl_", Strategy(graphs=True)))
                      for name in [prefix + base]},
    # the measured shape tables (cuda_ops.HEAD_DEEP_RING, MMV_BLOCK_SHAPES) against each emptied,
    # both emptied (the binder before them), every fused lm_head on the deep ring, and mat-vecs of
    # K >= 8192 under 8193 rows on the block kernel
    "head": {"base": (BEST, {}),
             "before": (BEST, dict(NO_TABLES)),
             "head_shallow": (BEST, {"HEAD_DEEP_RING": frozenset()}),
             "down_rows": (BEST, {"MMV_BLOCK_SHAPES": frozenset()}),
             "head_deep_all": (BEST, {"HEAD_DEEP_RING": _Every()}),
             "block_longk": (BEST, {"_BINDERS": _BLOCK_LONGK}),
             "nopdl_base": (BEST.with_(pdl=False), {}),
             "nopdl_before": (BEST.with_(pdl=False), dict(NO_TABLES))},
}


class _DefinedModules(ModuleCache):
    """A module cache that compiles ``DEFINED_SOURCES`` with extra ``-D`` options and takes every
    other source from the process's shared cache (one NVRTC compile of each)."""

    def __init__(self, shared: ModuleCache, defines: tuple[str, ...]) -> None:
        super().__init__(shared.cc)
        self.shared, self.extra_options = shared, defines

    def _module(self, mkey: tuple[str, str, str]) -> Any:
        return super()._module(mkey) if mkey[0] in DEFINED_SOURCES else self.shared._module(mkey)

    def prefetch(self, keys: set[tuple[str, str, str]]) -> None:
        for k in sorted(keys):
            self._module(k)


def measure(model: str, variants: dict[str, tuple[Strategy, dict[str, Any]]], tokens: int, rounds: int,
            start: int) -> dict[str, dict[str, Any]]:
    """us/token (median of each round's steady tokens) per variant, its ratio to its strategy's
    ``base`` and the largest logit difference from ``base``; the grids of layer 3's fused mat-vecs."""
    from workbench.exec.cuda import CudaExecutor

    cfg = model_config(model, "f16")
    saved = {k: getattr(cuda_ops, k) for _, patch in variants.values() for k in patch if k != "DEFINES"}
    exs, share, grids = {}, None, {}
    try:
        for name, (st, patch) in variants.items():
            for k, v in saved.items():
                setattr(cuda_ops, k, v)
            for k, v in patch.items():
                if k != "DEFINES":
                    setattr(cuda_ops, k, v)
            ex = CudaExecutor(cfg, st, weights="device", share=share)
            if patch.get("DEFINES"):
                ex.modules = _DefinedModules(ex.modules, patch["DEFINES"])
            share = share or ex
            for p in range(start, start + tokens):
                ex.prepare(p)
            exs[name] = ex
            b = ex.bound(cfg.kv_len(start))
            grids[name] = {la.node.name: [c.name, list(c.grid)] for la, c in zip(b.plan.launches, b.calls)
                           if la.node.name.endswith("-3") or la.node.name == "result_output"}
    finally:
        for k, v in saved.items():
            setattr(cuda_ops, k, v)
    runs: dict[str, list[float]] = {k: [] for k in exs}
    logits: dict[str, np.ndarray] = {}
    toks = probe_tokens(tokens)
    for r in range(rounds):
        for name, ex in (list(exs.items()) if r % 2 == 0 else list(exs.items())[::-1]):
            ex.reset()
            us, lg = step_run(ex, toks, start)
            logits[name] = lg[-1]
            runs[name].append(float(np.median(us)))
    for ex in exs.values():
        ex.release()
    out = {}
    for name, v in runs.items():
        base = "nopdl_base" if name.startswith("nopdl") else "base"
        med = float(np.median(v))
        out[name] = {"us": v, "median": med, "ratio": med / float(np.median(runs[base])),
                     "max_dlogit": float(np.max(np.abs(logits[name] - logits["base"]))), "grids": grids[name]}
        print(f"{model:16s} {name:11s} {med:8.1f} us/token [{min(v):.1f}-{max(v):.1f}] x{out[name]['ratio']:.4f} "
              f"max|dlogit| {out[name]['max_dlogit']:.2e}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-3.1-8b,llama-3.2-1b", help="preset[:layers], comma-separated")
    ap.add_argument("--variants", choices=sorted(VARIANTS), default="grid")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--start", type=int, default=448, help="first position (context 512)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    from llamacpp_peer import gpu_info

    gpu = gpu_info()
    res = {"device": gpu["gpu"], "driver": gpu["driver"], "date": time.strftime("%Y-%m-%d"), "variants": a.variants,
           "tokens": a.tokens, "rounds": a.rounds, "start": a.start,
           "models": {m: measure(m, VARIANTS[a.variants], a.tokens, a.rounds, a.start) for m in a.models.split(",")}}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
