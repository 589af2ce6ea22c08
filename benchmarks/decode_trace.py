"""Where a decode step's time goes on the ``cuda`` backend, per Strategy variant: untraced
us/token (``--runs`` runs of 64 tokens from position 448 of a 512-row context), then one traced
run whose last token is recorded node by node (CUPTI): that token's GPU span, its kernels by
name (count, sum, median duration) and one layer's kernels in launch order (start offset +
duration). With ``pdl`` off the durations are the kernels' own; with PDL on a kernel starts
early and waits, so its duration includes its predecessor's tail.

Variants (every one with graphs, the stream-aware allocator and llama.cpp's fusion set):
``best`` (+ PDL, Q/K/V streams, the workbench's own fusions), ``best_pdl0`` (PDL off),
``llamacpp_fus`` (llama.cpp's fusions only), ``best_noqkv`` (one stream).

Usage (GPU machine): ``python3 benchmarks/decode_trace.py --model llama-3.2-1b --weight-dtype q4_0
--out $OUT`` writes ``decode_trace_<model>_<dtype>.json`` and the traced tokens as
``trace_<model>_<dtype>_<variant>.csv.gz``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import workbench  # noqa: E402
from benchmarks.launch_policy import BEST  # noqa: E402
from workbench.llamacpp.switches import LLAMACPP_FUSION  # noqa: E402
from workbench.models import preset  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402

VARIANTS = {"best": BEST, "best_pdl0": BEST.with_(pdl=False),
            "llamacpp_fus": BEST.with_(fusion=frozenset(LLAMACPP_FUSION)),
            "best_noqkv": BEST.with_(streams="single")}
#: tokens of the traced run; the last one is recorded node by node
TRACED = 12


def measure(cfg, name: str, strategy: Strategy, runs: int, layer: int, out: Path) -> dict:
    us = [float(workbench.run(cfg, strategy, tokens=64, start_pos=448, backend="cuda", quiet=True)
                .stats["us_per_token"]) for _ in range(runs)]
    rt = workbench.run(cfg, strategy, tokens=TRACED, start_pos=448, backend="cuda", trace=True, quiet=True)
    ev = rt.trace.events
    k = ev[(ev["kind"] == "kernel") & (ev["token"] == TRACED - 1)]
    d = (k["end_ns"] - k["start_ns"]) / 1e3
    span = float((k["end_ns"].max() - k["start_ns"].min()) / 1e3) if len(k) else float("nan")
    tab = k.assign(d=d).groupby("name")["d"].agg(["count", "sum", "median"]).sort_values("sum", ascending=False)
    print(f"== {name} {strategy.label()}: untraced {[round(x, 1) for x in us]} us/token; traced "
          f"{rt.stats['us_per_token']:.0f}, last token span {span:.0f} us, {len(k)} kernels summing {d.sum():.0f} us",
          flush=True)
    print(tab.head(20).round(2).to_string(), flush=True)
    lay = k[k["node"].astype(str).str.contains(rf"-{layer}(?:_q8_1)?$")].sort_values("start_ns")
    t0 = lay["start_ns"].min()
    steps = [f"{r.node}:{(r.start_ns - t0) / 1e3:.1f}+{(r.end_ns - r.start_ns) / 1e3:.1f}" for r in lay.itertuples()]
    print(f"  layer {layer}: " + " | ".join(steps), flush=True)
    ev[ev["token"] >= TRACED - 2].to_csv(out / f"trace_{cfg.name}_{cfg.weight_dtype}_{name}.csv.gz", index=False)
    return {"label": strategy.label(), "us": us, "traced": float(rt.stats["us_per_token"]), "span": span,
            "kernels": {str(n): {"count": int(r["count"]), "sum_us": float(r["sum"]), "median_us": float(r["median"])}
                        for n, r in tab.iterrows()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--layers", type=int, default=0, help="0: all")
    ap.add_argument("--weight-dtype", default="q4_0")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=", ".join(VARIANTS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--layer", type=int, default=3, help="the layer whose kernels are listed in order")
    ap.add_argument("--out", required=True, help="folder for the JSON and the traces")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = preset(args.model, context=512, weight_dtype=args.weight_dtype,
                 **({"layers": args.layers} if args.layers else {}))
    names = args.variants.split(",")
    workbench.run(cfg, VARIANTS[names[0]], tokens=4, start_pos=448, backend="cuda", quiet=True)  # weights, compile
    res = {n: measure(cfg, n, VARIANTS[n], args.runs, args.layer, out) for n in names}
    (out / f"decode_trace_{cfg.name}_{cfg.weight_dtype}.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
