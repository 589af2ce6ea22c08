"""Whole decode steps of the ``cuda`` backend under alternative kernel-launch policies: the work
split of the quantised mat-vecs (``cuda_quant_ops.mmvq_split``), the keys per block of decode
attention (``cuda_ops.attn_vec_launch``), the threads of the norm kernels
(``cuda_ops.norm_threads``) and the shared-memory carveout of every kernel
(``kernels.SMEM_CARVEOUT``). A micro-benchmark times a kernel alone; this times what a user runs,
so a policy that wins alone but loses beside its neighbours (L2 contention, concurrent Q/K/V
streams, PDL overlap) shows here.

Each policy replaces one binder function for its runs; rounds alternate the policy order, and
each run gets a Strategy no other run has (``max_streams``, unused by ``qkv`` streams), so a
fresh executor binds the Plan under that policy while sharing the model's device weights.
us/token: ``workbench.run`` over ``--tokens`` tokens from position 448 of a 512-row context,
after a 4-token warm-up; median with min..max over ``--rounds``.

Usage (GPU machine): ``python3 benchmarks/launch_policy.py --models llama-3.2-1b,qwen3-30b-a3b:8
--weight-dtype q4_0 --policies default,mmvq-w4,norm-256 --json $OUT/launch_policy.json --md
$OUT/launch_policy.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import workbench  # noqa: E402
from workbench.exec import cuda_ops, cuda_quant_ops, kernels  # noqa: E402
from workbench.exec.calibrate.specs import ModelSpec  # noqa: E402
from workbench.llamacpp.switches import LLAMACPP_FUSION  # noqa: E402
from workbench.models import preset  # noqa: E402
from workbench.strategy import WORKBENCH_FUSIONS, Strategy  # noqa: E402

#: every knob on, with llama.cpp's fusions and the workbench's own
BEST = Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware",
                fusion=frozenset(LLAMACPP_FUSION) | frozenset(WORKBENCH_FUSIONS))
#: mat-vecs with at least this many outputs (an lm_head) keep 4 rows a warp in every policy
TALL = 65536
_ORIG = {"mmvq_split": cuda_quant_ops.mmvq_split, "attn_vec_launch": cuda_ops.attn_vec_launch,
         "norm_threads": cuda_ops.norm_threads, "carveout": kernels.SMEM_CARVEOUT,
         "attn_cluster_max": cuda_ops.FA_CLUSTER_MAX, "attn_cluster_warps": cuda_ops.FAV_CLUSTER_WARPS,
         "fmv_max_blocks": cuda_ops.FMV_MAX_BLOCKS}


def _split(short: tuple[int, int]) -> Callable[[int, int], tuple[int, int]]:
    return lambda rows, K: (4, 1) if rows >= TALL else short


#: policy -> (what it changes, {binder function: replacement})
POLICIES: dict[str, tuple[str, dict[str, Callable]]] = {
    "default": ("the binders as they are", {}),
    "mmvq-w4": ("every mat-vec below an lm_head: 4 warps per row (llama.cpp's split)", {"mmvq_split": _split((1, 4))}),
    "mmvq-w2": ("every mat-vec below an lm_head: 2 warps per row", {"mmvq_split": _split((1, 2))}),
    "mmvq-r1": ("every mat-vec below an lm_head: a warp per row", {"mmvq_split": _split((1, 1))}),
    "mmvq-r2": ("every mat-vec below an lm_head: 2 rows a warp", {"mmvq_split": _split((2, 1))}),
    "attn-split": ("decode attention: every head split over blocks of 4 warps, merged by its last block "
                   "(the launch before one-block heads and clusters)",
                   {"attn_vec_launch": lambda d, isz, n, h: _ORIG["attn_vec_launch"](d, isz, n, h, solo=False),
                    "attn_cluster_max": 0}),
    **{f"attn-cw{w}": (f"decode attention: blocks of {w} warps in each cluster-merged head (fewer blocks a head)",
                       {"attn_cluster_warps": w}) for w in (4, 8, 16)},
    **{f"fmv-{b}": (f"the persistent fused mat-vecs: {b} resident blocks an SM, not 4 (the register file's "
                    f"other {4 - b} block slots free for the next kernel's blocks under PDL)",
                    {"fmv_max_blocks": b * 132}) for b in (2, 3)},
    "norm-256": ("norms: a thread per 8 elements (256 threads over 2048)",
                 {"norm_threads": lambda L, what="row": cuda_ops._row_threads(L, what=what)}),
    **{f"carveout-{c}": (f"every kernel prefers {c} % of L1 as shared memory" if c >= 0 else
                         "the driver picks each kernel's shared-memory carveout", {"carveout": c})
       for c in (-1, 0, 25, 50, 100)},
}


def apply(policy: str) -> None:
    """Install ``policy``'s binder functions (and the originals for the rest)."""
    repl = POLICIES[policy][1]
    cuda_quant_ops.mmvq_split = repl.get("mmvq_split", _ORIG["mmvq_split"])
    cuda_ops.attn_vec_launch = repl.get("attn_vec_launch", _ORIG["attn_vec_launch"])
    cuda_ops.FA_CLUSTER_MAX = repl.get("attn_cluster_max", _ORIG["attn_cluster_max"])
    cuda_ops.FAV_CLUSTER_WARPS = repl.get("attn_cluster_warps", _ORIG["attn_cluster_warps"])
    for mod in (cuda_ops, cuda_quant_ops):
        mod.norm_threads = repl.get("norm_threads", _ORIG["norm_threads"])
    kernels.SMEM_CARVEOUT = repl.get("carveout", _ORIG["carveout"])
    cuda_ops.FMV_MAX_BLOCKS = repl.get("fmv_max_blocks", _ORIG["fmv_max_blocks"])


def measure(model: str, layers: int, dtype: str, policies: list[str], rounds: int, tokens: int,
            best: Strategy = BEST) -> dict:
    cfg = preset(model, context=512, weight_dtype=dtype, **({"layers": layers} if layers else {}))
    us: dict[str, list[float]] = {p: [] for p in policies}
    t0 = time.time()
    try:
        for rnd in range(rounds):
            for p in (policies if rnd % 2 == 0 else policies[::-1]):
                apply(p)
                s = best.with_(max_streams=4 + policies.index(p) + 100 * rnd)
                workbench.run(cfg, s, tokens=4, start_pos=448, backend="cuda", quiet=True)
                r = workbench.run(cfg, s, tokens=tokens, start_pos=448, backend="cuda", quiet=True)
                us[p].append(float(r.stats["us_per_token"]))
                print(f"[{time.time() - t0:4.0f}s] {model} {dtype} {p}: {us[p][-1]:.1f} us/token", flush=True)
    finally:
        apply("default")
    return {"model": model, "layers": layers or cfg.n_layer, "weight_dtype": dtype, "strategy": best.label(),
            "pdl_trigger": best.pdl_trigger, "tokens": tokens, "us": us}


def table(results: list[dict], device: str) -> str:
    label = results[0].get("strategy", BEST.label()) if results else BEST.label()
    out = [f"# Decode steps under kernel-launch policies ({device})", "",
           "Generated by `benchmarks/launch_policy.py`: the `cuda` backend, Strategy "
           f"`{label}`, context 512, tokens from position 448; "
           "median (min..max) over the rounds; "
           "the change against `default` in the same run.", "",
           "| model | weights | PDL trigger | policy | what it changes | us/token | min..max | vs default |",
           "|---|---|---|---|---|---:|---:|---:|"]
    for r in results:
        base = statistics.median(r["us"]["default"]) if "default" in r["us"] else None
        for p, xs in r["us"].items():
            m = statistics.median(xs)
            rel = f"{100 * (m / base - 1):+.1f} %" if base else ""
            out.append(f"| {r['model']} ({r['layers']} layers) | {r['weight_dtype']} | {r.get('pdl_trigger', '')} | "
                       f"`{p}` | {POLICIES[p][0]} | "
                       f"{m:.1f} | {min(xs):.0f}..{max(xs):.0f} | {rel} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b", help="comma-separated name[:layers]")
    ap.add_argument("--weight-dtype", default="q4_0")
    ap.add_argument("--policies", default="default,mmvq-w4,norm-256", help=", ".join(POLICIES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--pdl-trigger", default=BEST.pdl_trigger,
                    help="where every kernel signals PDL's launch (Strategy.pdl_trigger; the peer runs' best: "
                         "after-main-loop); a comma-separated list measures each in turn")
    ap.add_argument("--sync", default=BEST.sync, help="the host program's sync (Strategy.sync)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    from workbench.exec.device import device_info

    device = device_info().name
    results = []
    for spec in args.models.split(","):
        ms = ModelSpec.parse(spec)
        for trigger in args.pdl_trigger.split(","):
            results.append(measure(ms.model, ms.layers or 0, args.weight_dtype, policies, args.rounds, args.tokens,
                                   BEST.with_(pdl_trigger=trigger, sync=args.sync)))
    Path(args.json).write_text(json.dumps({"device": device, "date": time.strftime("%Y-%m-%d"), "results": results},
                                          indent=1))
    if args.md:
        Path(args.md).write_text(table(results, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
