"""Where our kernels' PDL launch signal pays, per model: the `cuda` backend's us/token under CUDA
graphs and every fusion (llama.cpp's and the workbench's own), with PDL off and with its signal at
each of `start` (the Strategy default, llama.cpp's placement), `after-main-loop` and `end`, each
with and without Q/K/V streams. Each variant runs `--runs` times 64 tokens over 512 KV rows after
one warm-up run; median [min..max]. Usage (GPU): ``python3 benchmarks/pdl_placement.py --models
llama-3.2-1b,llama-3.1-8b:8 --md data/bench/pdl_placement_h200.md`` (``name:L`` keeps L layers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.llamacpp.switches import LLAMACPP_FUSION  # noqa: E402
from workbench.strategy import WORKBENCH_FUSIONS, Strategy  # noqa: E402

BASE = Strategy(graphs=True, allocator="stream-aware", fusion=frozenset(LLAMACPP_FUSION) | frozenset(WORKBENCH_FUSIONS))


def variants() -> dict[str, Strategy]:
    out = {}
    for streams in ("single", "qkv"):
        s = BASE.with_(streams=streams)
        out[f"pdl off, {streams}"] = s
        for trig in ("start", "after-main-loop", "end"):
            out[f"pdl {trig}, {streams}"] = s.with_(pdl=True, pdl_trigger=trig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b:8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    import workbench
    from workbench.exec.device import device_info
    from workbench.models import preset

    gpu = device_info(0).name
    lines = [f"# PDL launch-signal placement per model ({gpu})", "",
             f"`python3 benchmarks/pdl_placement.py --models {args.models}`, "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}; `cuda` backend, f16 weights, CUDA graphs, every fusion, "
             f"64 tokens over 512 KV rows, median [min..max] of {args.runs} runs after a warm-up; `x start` is the "
             "variant's median over PDL at `start` with the same streams.",
             "", "| model | variant | us/token | [min..max] | x start |", "|---|---|---:|---|---:|"]
    for spec in filter(None, args.models.split(",")):
        name, _, layers = spec.partition(":")
        cfg = preset(name, context=512, weight_dtype="f16", **({"layers": int(layers)} if layers else {}))
        workbench.run(cfg, BASE, tokens=4, start_pos=448, backend="cuda", quiet=True)
        res = {}
        for label, s in variants().items():
            us = sorted(workbench.run(cfg, s, tokens=64, start_pos=448, backend="cuda", quiet=True)
                        .stats["us_per_token"] for _ in range(args.runs))
            res[label] = us
            ref = res.get(f"pdl start, {s.streams}")
            rel = f"{statistics.median(us) / statistics.median(ref):.3f}" if ref and s.pdl else ""
            lines.append(f"| {spec} | {label} | {statistics.median(us):.1f} | {us[0]:.1f}..{us[-1]:.1f} | {rel} |")
            print(lines[-1], flush=True)
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
