"""Graph replays before and after a process's first eager kernels on a non-default stream.

Measured on an H200 (``data/bench/launch_state_h200.md``): a process that has launched a few
dozen kernels outside a CUDA graph on any stream but the legacy default one replays its graphs
without PDL with longer gaps between kernels for the rest of its life. The cuda backend therefore
enters that state before its first run (``workbench/exec/launch_state.py``); this script turns
that off (``--fresh``) to show the effect, one fresh process per variant:

* ``none``: nothing between the two measurements;
* ``null<N>``: N one-element CuPy kernels on the legacy default stream;
* ``side<N>``: N such kernels on a new non-blocking stream;
* ``same<N>``: N such kernels on the stream the ``graphs`` executor replays its graph on;
* ``torch<N>``: N PyTorch kernels (runtime-API launches of a fatbin's kernels, as llama.cpp's are)
  on a PyTorch side stream;
* ``eager``: a 4-token run of the eager strategy (an executor sharing the weights).

Each variant times ``graphs`` and ``graphs+pdl`` (interleaved runs of 64 tokens, median) before
and after, and prints one JSON line. Without ``--fresh`` the backend settles the state itself,
so every variant should show no change.

    # GPU machine, about 15 s a variant on llama-3.2-1b
    python3 benchmarks/launch_state.py --fresh --variants none,null700,side16,side256,eager --jsonl OUT
    python3 benchmarks/launch_state.py --variants none,eager --jsonl OUT      # settled: no change

``--gaps`` reads recorded timelines instead (no GPU): per file, the median gap between
consecutive kernels of one stream in the last traced token, the number that tells the states
apart. A ``.csv.gz`` of ``kernel_fidelity.py record`` gives one row per model and strategy:

    python benchmarks/launch_state.py --gaps data/traces/llamacpp/h200_captures/*_pdl0.parquet \
        data/bench/kernel_timelines_h200_s29.csv.gz
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import pandas as pd  # noqa: E402

from workbench.trace import rebased  # noqa: E402
from workbench.trace.analysis import to_markdown  # noqa: E402
from workbench.trace.io import load_trace  # noqa: E402

NAMES = ("graphs", "graphs+pdl")


def one(model: str, variant: str, fresh: bool, runs: int) -> dict:
    """Measure ``variant`` in this process (call it in a fresh one)."""
    import cupy as cp
    import numpy as np
    from sim_fidelity import MODELS, STRATEGIES

    import workbench
    import workbench.exec.cuda as cuda_module
    from workbench.exec.calibrate.environment import warm_gpu
    from workbench.exec.launch_state import stream_kernels
    from workbench.strategy import Strategy

    if fresh:
        cuda_module.settle_launch_state = lambda device=0: 0
    spec = {s.model: s for s, _, _ in MODELS}[model]
    cfg = spec.config()
    warm_gpu()
    exs: list = []
    for n in NAMES:
        exs.append(cuda_module.CudaExecutor(cfg, STRATEGIES[n], "device", 0, share=exs[0] if exs else None))
        workbench.run(cfg, STRATEGIES[n], tokens=4, start_pos=spec.pos, backend="cuda", executor=exs[-1], quiet=True)

    def measure() -> dict[str, float]:
        us: dict[str, list[float]] = {n: [] for n in NAMES}
        for _ in range(runs):
            for ex, n in zip(exs, NAMES):
                us[n].append(workbench.run(cfg, STRATEGIES[n], tokens=64, start_pos=spec.pos, backend="cuda",
                                           executor=ex, quiet=True).stats["us_per_token"])
        return {n: round(float(np.median(v)), 1) for n, v in us.items()}

    before = measure()
    if variant.startswith("null"):
        stream_kernels(int(variant[4:]), stream=cp.cuda.Stream.null)
    elif variant.startswith("side"):
        stream_kernels(int(variant[4:]))
    elif variant.startswith("same"):  # the graphs executor's own launch stream: llama.cpp runs its eager
        stream_kernels(int(variant[4:]), stream=exs[0]._stream(0))  # first calls where its graphs replay
    elif variant.startswith("torch"):  # runtime-API kernels (a fatbin, as llama.cpp's) on a torch stream
        import torch

        t, s = torch.zeros(1, device="cuda"), torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(int(variant[5:])):
                t += 1
        s.synchronize()
    elif variant == "eager":
        ex = cuda_module.CudaExecutor(cfg, Strategy(), "device", 0, share=exs[0])
        workbench.run(cfg, Strategy(), tokens=4, start_pos=spec.pos, backend="cuda", executor=ex, quiet=True)
        ex.release()
    elif variant != "none":
        raise ValueError(f"unknown variant {variant!r}: none, null<N>, side<N>, same<N>, torch<N> or eager")
    cp.cuda.Device().synchronize()
    after = measure()
    for ex in reversed(exs):
        ex.release()
    return {"model": spec.label, "variant": variant, "fresh": fresh,
            **{f"{n} before": before[n] for n in NAMES}, **{f"{n} after": after[n] for n in NAMES},
            **{f"{n} change_pct": round(100 * (after[n] / before[n] - 1), 1) for n in NAMES}}


def kernel_gaps(kernels: pd.DataFrame) -> pd.Series:
    """Start of each kernel after the end of the one before it on its stream (ns), the gaps of
    0-20 us (longer ones wait for the host, not the launch path)."""
    k = rebased(kernels).sort_values("start_ns", kind="stable")
    g = (k["start_ns"] - k.groupby("stream")["end_ns"].shift(1)).dropna()
    return g[(g >= 0) & (g < 20_000)]


def gap_table(paths: list[str]) -> pd.DataFrame:
    """Per recorded timeline (and model / strategy in a ``kernel_fidelity`` csv), the kernels
    and the median and quartiles of the gaps of its last token."""
    rows = []
    for path in paths:
        if path.endswith(".csv.gz") or path.endswith(".csv"):
            d = pd.read_csv(path)
            groups = [(f"{m} {s}", g) for (m, s), g in d.groupby(["model", "strategy"], sort=False)]
        else:
            ev = load_trace(path).events
            k = ev[ev["kind"] == "kernel"]
            groups = [(Path(path).name, k[k["token"] == k["token"].max()])]
        for label, k in groups:
            g = kernel_gaps(k)
            rows.append({"timeline": label, "kernels": len(k), "gap_median_ns": g.median(),
                         "gap_p25_ns": g.quantile(0.25), "gap_p75_ns": g.quantile(0.75)})
    return pd.DataFrame(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b", help="a model of sim_fidelity.MODELS")
    ap.add_argument("--variants", default="none,null700,side16,side256,eager")
    ap.add_argument("--fresh", action="store_true", help="do not let the backend settle the launch state")
    ap.add_argument("--runs", type=int, default=5, help="runs of 64 tokens per strategy, before and after")
    ap.add_argument("--jsonl", help="append the results here")
    ap.add_argument("--gaps", nargs="+", metavar="TRACE", help="report kernel gaps of recorded timelines (no GPU)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this variant in this process
    a = ap.parse_args()
    if a.gaps:
        print(to_markdown(gap_table(a.gaps), digits=0))
        return 0
    if a.one:
        print(json.dumps(one(a.model, a.one, a.fresh, a.runs)), flush=True)
        return 0
    for v in a.variants.split(","):
        cmd = [sys.executable, __file__, "--model", a.model, "--one", v, "--runs", str(a.runs)]
        cmd += ["--fresh"] if a.fresh else []
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        print(out, flush=True)
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
