"""Where the host time of a decode step goes on the ``cuda`` backend (GPU): each HostOp kind's
time per token, the step's host time, and the GPU's own span of one graph replay beside it.

A step's us/token is host time: writing the step's inputs, the host program's copies, syncs and
launches, and the wait for the GPU. What the GPU takes is one replay timed with CUDA events; the
difference is what the host adds per token, which llama.cpp's C++ ``llama_decode`` keeps to a few
tens of us. Each HostOp is timed through the executor's ``host_op_hook`` on every other token
only, so the untimed tokens give the step time without the hook's own cost.

Usage on the GPU machine::

    python benchmarks/host_program.py --model qwen3-30b-a3b:8 --weight-dtype q4_0 --out $OUT/host_program.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fusion_effects import model_config  # noqa: E402
from launch_policy import BEST  # noqa: E402

import workbench  # noqa: E402
from workbench.exec.device import device_info  # noqa: E402

STRATEGIES = {"best": BEST, "best+implicit": BEST.with_(sync="implicit"),
              "best-qkv": BEST.with_(streams="single")}


def profile(cfg, strategy, tokens: int, start_pos: int = 448) -> dict:
    """Per HostOp kind: median time per op and per token (timed tokens); the median step time of
    the untimed tokens; one graph replay's GPU span (CUDA events) and its launch call's time."""
    ex = workbench.run(cfg, strategy, tokens=8, start_pos=start_pos, backend="cuda", quiet=True).meta["executor"]
    per_kind: dict[str, list[list[int]]] = {}
    current: dict[str, list[int]] = {}

    def timed(b, op, call) -> None:
        t0 = time.perf_counter_ns()
        call()
        current.setdefault(op.kind, []).append(time.perf_counter_ns() - t0)

    steps = []
    for i in range(2 * tokens):
        pos = start_pos + i % 60
        ex.prepare(pos)
        ex.host_op_hook = timed if i % 2 else None
        t0 = time.perf_counter_ns()
        ex.step(1000 + i, pos)
        if i % 2:
            for k, v in current.items():
                per_kind.setdefault(k, []).append(v)
            current = {}
        else:
            steps.append(time.perf_counter_ns() - t0)
    ex.host_op_hook = None
    b, stream, cp = ex.prepare(start_pos), ex._stream(0), ex.cp
    out = {"step_us": float(np.median(steps)) / 1e3, "ops": {}}
    for k, v in per_kind.items():
        a = np.asarray(v, float) / 1e3
        out["ops"][k] = {"per_token": int(a.shape[1]), "op_us": float(np.median(a)),
                         "token_us": float(np.median(a.sum(1)))}
    if b.graph is not None:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        spans, launches = [], []
        for _ in range(10):
            stream.synchronize()
            e0.record(stream)
            t0 = time.perf_counter_ns()
            b.graph.launch(stream)
            launches.append(time.perf_counter_ns() - t0)
            e1.record(stream)
            e1.synchronize()
            spans.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        out["graph_replay_gpu_us"] = float(np.median(spans))
        out["graph_launch_call_us"] = float(np.median(launches)) / 1e3
        out["host_added_us"] = out["step_us"] - out["graph_replay_gpu_us"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-30b-a3b:8", help="preset[:layers]")
    p.add_argument("--weight-dtype", default="q4_0")
    p.add_argument("--tokens", type=int, default=32, help="timed and untimed tokens each")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help=f"subset of {', '.join(STRATEGIES)}")
    p.add_argument("--out", type=Path, help="JSON results")
    args = p.parse_args(argv)
    cfg = model_config(args.model, args.weight_dtype)
    gpu = device_info().label
    results = {"model": args.model, "weight_dtype": args.weight_dtype, "gpu": gpu, "date": time.strftime("%Y-%m-%d"),
               "strategies": {}}
    for name in args.strategies.split(","):
        r = profile(cfg, STRATEGIES[name], args.tokens)
        results["strategies"][name] = {"strategy": STRATEGIES[name].label(), **r}
        ops = ", ".join(f"{k} {v['per_token']}x {v['op_us']:.1f} us" for k, v in r["ops"].items())
        gpu_us, added = r.get("graph_replay_gpu_us", float("nan")), r.get("host_added_us", float("nan"))
        print(f"{args.model} {args.weight_dtype} {name}: step {r['step_us']:.1f} us, GPU replay {gpu_us:.1f} us, "
              f"host adds {added:.1f} us; {ops}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
