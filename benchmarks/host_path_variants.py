"""Would a cheaper host path make a token faster? Three variants of the cuda backend's per-token
host program, side by side with it in one process (``peer_best`` + ``--logits zero-copy``):

* ``step``: the backend's own host program (``CudaExecutor.step``): four input ``cudaMemcpyAsync``
  from pinned staging, ``cudaGraphLaunch``, the final sync;
* ``inputs_in_graph``: the four H2D copies captured into the CUDA graph as memcpy nodes (they
  read the pinned staging when the graph runs), so a token is one ``cudaGraphLaunch`` and a sync;
* ``launch_ahead``: token t+1's copies and graph are queued while token t runs, behind a
  ``cuStreamWaitValue32`` on a host-written flag; the host writes t+1's inputs and the flag once
  t's logits have landed (waiting on an event recorded after t's graph), so no launch API call
  sits between two graphs on the critical path.

Besides the host's us/token, ``events`` times the ``step`` program's parts on the GPU with CUDA
events: from before the input copies to the graph's start (``copies_us``: the copies plus the
launch's host latency) and the graph's replay (``graph_us``). Every variant's logits are compared
with ``step``'s over the same tokens (max abs difference; the same kernels, so 0 is expected).
Results: ``data/bench/host_path_variants_h200.{json,md}``.

Usage (GPU machine)::

    python benchmarks/host_path_variants.py --models llama-3.2-1b,llama-3.1-8b --json $OUT/hp.json --md $OUT/hp.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.cuda import CudaExecutor  # noqa: E402
from workbench.models import preset  # noqa: E402
from workbench.models.blocks import write_step_inputs  # noqa: E402
from workbench.strategy import ALL_ON_OURS  # noqa: E402

PEER_BEST = ALL_ON_OURS.with_(pdl_trigger="after-main-loop", logits="zero-copy")
START = 448


class InputsInGraph(CudaExecutor):
    """The step's H2D input copies recorded into the graph's capture instead of issued per token."""

    def bind_plan(self, plan: Any) -> Any:
        b = super().bind_plan(plan)
        if not hasattr(b, "copies"):
            b.copies = [fn for op, fn in b.host if op.kind == "memcpy_h2d"]
            b.host = [(op, fn) for op, fn in b.host if op.kind != "memcpy_h2d"]
        return b

    def _record_graph(self, b: Any) -> None:
        for fn in b.copies:
            fn()
        super()._record_graph(b)


def probe_tokens(n: int) -> list[int]:
    """The token ids a run of ``n`` steps feeds (fixed, so every variant decodes the same)."""
    return [(7 * i + 3) % 32000 for i in range(n)]


def step_run(ex: CudaExecutor, toks: list[int], start: int = START) -> tuple[np.ndarray, np.ndarray]:
    """The backend's loop from position ``start``: (us per token after the first, the tokens' logits)."""
    n0 = len(ex.times.start_ns)
    logits = [ex.step(t, start + i) for i, t in enumerate(toks)]
    return ex.times.us[n0:][1:], np.stack(logits)


def launch_ahead_runner(ex: CudaExecutor) -> Callable[[list[int]], tuple[np.ndarray, np.ndarray]]:
    """A loop that queues token t+1 behind cuStreamWaitValue32 while token t runs."""
    from cuda.bindings import driver as cu

    cp = ex.cp
    s0 = ex._stream(0)
    stream = cu.CUstream(s0.ptr)
    flag_mem = cp.cuda.alloc_pinned_memory(64)  # mapped by UVA: the GPU polls the host's word
    flag = np.frombuffer(flag_mem, np.uint32, 1)
    flag[0] = 0
    flag_ptr = cu.CUdeviceptr(flag_mem.ptr)
    done = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
    seq = [0]

    def enqueue(b: Any, value: int) -> None:
        (err,) = cu.cuStreamWaitValue32(stream, flag_ptr, value, cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuStreamWaitValue32: {err}")
        for op, fn in b.host:
            if op.kind != "stream_sync":
                fn()
        done[value % 2].record(s0)

    def run(toks: list[int]) -> tuple[np.ndarray, np.ndarray]:
        base, n = seq[0], len(toks)
        us, logits = [], []
        enqueue(ex.prepare(START), base + 1)
        for i, t in enumerate(toks):
            t0 = time.perf_counter_ns()
            b = ex.prepare(START + i)
            write_step_inputs(b.plan.graph, t, START + i, b.inputs)
            flag[0] = base + i + 1  # releases token i's queued copies and graph
            if i + 1 < n:
                enqueue(ex.prepare(START + i + 1), base + i + 2)
            done[(base + i + 1) % 2].synchronize()
            us.append((time.perf_counter_ns() - t0) / 1e3)
            logits.append(b.logits.copy())
        seq[0] = base + n
        return np.asarray(us[1:]), np.stack(logits)

    return run


def event_spans(ex: CudaExecutor, toks: list[int]) -> dict[str, float]:
    """Median over tokens of the host's time and the GPU spans of ``step``'s program: CUDA events
    recorded around its ops through the executor's ``host_op_hook``."""
    cp = ex.cp
    s0 = ex._stream(0)
    ev = [cp.cuda.Event() for _ in range(3)]

    def hook(b: Any, op: Any, call: Callable[[], Any]) -> None:
        if op is b.host[0][0]:
            ev[0].record(s0)
        if op.kind == "graph_launch":
            ev[1].record(s0)
            call()
            ev[2].record(s0)
        else:
            call()

    rows = []
    ex.host_op_hook = hook
    try:
        for i, t in enumerate(toks):
            ex.step(t, START + i)
            rows.append((ex.times.us[-1], cp.cuda.get_elapsed_time(ev[0], ev[1]) * 1e3,
                         cp.cuda.get_elapsed_time(ev[1], ev[2]) * 1e3))
    finally:
        ex.host_op_hook = None
    med = np.median(np.asarray(rows[1:]), axis=0)
    return dict(zip(("host_us", "copies_us", "graph_us"), (round(float(m), 1) for m in med)))


def measure(spec: str, tokens: int, rounds: int, runs: int) -> dict:
    name, _, layers = spec.partition(":")
    cfg = preset(name, layers=int(layers) if layers else None, context=512)
    base = CudaExecutor(cfg, PEER_BEST, weights="device")
    in_graph = InputsInGraph(cfg, PEER_BEST, weights="device", share=base)
    variants = {"step": (base, lambda toks: step_run(base, toks)),
                "inputs_in_graph": (in_graph, lambda toks: step_run(in_graph, toks)),
                "launch_ahead": (base, launch_ahead_runner(base))}
    for ex in (base, in_graph):  # every Plan bound and captured before timing
        for i in range(tokens):
            ex.prepare(START + i)
    toks = probe_tokens(tokens)
    us: dict[str, list[float]] = {k: [] for k in variants}
    diff: dict[str, float] = {}
    ref = None
    for _ in range(rounds):
        for k, (ex, run) in variants.items():
            for _ in range(runs):
                ex.reset()
                t, logits = run(toks)
                us[k].append(float(np.mean(t)))
                ref = logits if k == "step" else ref
                diff[k] = float(np.max(np.abs(logits - ref)))
    base.reset()
    spans = event_spans(base, toks)
    in_graph.release()
    base.release()
    return {"model": spec, "us": us, "max_abs_diff": diff, "events": spans}


def markdown(result: dict) -> str:
    lines = [f"# Host-path variants of a token (cuda backend, {result['gpu']})", "",
             f"{result['gpu']}, driver {result['driver']}, {result['date']}; `peer_best` + `--logits zero-copy`, "
             f"{result['tokens']} tokens at positions {START}.., {result['rounds']} rounds x {result['runs']} runs "
             "interleaved in one process; us/token (host wall clock, mean over a run's tokens after the first): "
             "median [min..max] over runs. Written by `benchmarks/host_path_variants.py`.", "",
             "| model | step | inputs in graph | launch ahead | in graph / step | ahead / step | logits max abs diff |",
             "|---|---|---|---|---:|---:|---|"]

    def cell(v: list[float]) -> str:
        return f"{np.median(v):.1f} [{min(v):.1f}..{max(v):.1f}]"
    for r in result["results"]:
        u, s = r["us"], np.median(r["us"]["step"])
        lines.append(f"| {r['model']} | {cell(u['step'])} | {cell(u['inputs_in_graph'])} | {cell(u['launch_ahead'])} | "
                     f"{np.median(u['inputs_in_graph']) / s:.3f} | {np.median(u['launch_ahead']) / s:.3f} | "
                     f"{max(r['max_abs_diff'].values()):.1e} |")
    lines += ["", "`step`'s parts on the GPU (CUDA events, median over one run's tokens):", "",
              "| model | host us/token | input copies + launch latency (us) | graph replay (us) |",
              "|---|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['events']['host_us']} | {r['events']['copies_us']} | {r['events']['graph_us']} |"
              for r in result["results"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b", help="comma list of preset[:layers]")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--json", default="out/host_path_variants.json")
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    from workbench.exec.calibrate.environment import environment

    env = environment()
    result = {"gpu": env["gpu_name"], "driver": env["driver_version"] or env["driver"],
              "cuda_runtime": env["cuda_runtime"], "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "tokens": args.tokens, "rounds": args.rounds, "runs": args.runs, "results": []}
    for spec in args.models.split(","):
        r = measure(spec, args.tokens, args.rounds, args.runs)
        print(json.dumps(r), flush=True)
        result["results"].append(r)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    if args.md:
        Path(args.md).write_text(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
