"""Does a CUDA graph's kernel-to-kernel step depend on how many kernels the graph holds, untraced
and under CUPTI? (GPU; the answer decides which graphs `workbench calibrate` may time.)

`workbench calibrate` times its kernels and the gap between them from CUPTI traces of graph
replays. Its default models are cut to 2-4 layers (40-170 kernels a graph), and they give a gap of
256 ns. The same calibration on the report's full-size models (300-1500 kernels,
`data/bench/calibration_h200_s37_fullsize.md`) gives 416 ns from 600 kernels up, and scores worse
against the untraced decode matrix. This probe separates the two readings of that (the GPU steps
slower through a big graph, or only CUPTI's records do) on chains of identical kernels, one chain
per node count:

* untraced: each chain's graph replay timed with CUDA events, per kernel;
* traced: the same chains captured again while a CUPTI capture records every graph node; the
  median gap (a kernel's start after its predecessor's end) and duration per node count.

Kernels: ``empty`` (one block and a full wave of 132) and ``read`` (132 blocks reading 4 MiB, a
small mat-vec's traffic): every kernel the same slice, each of 16 slices in turn (distinct
parameters, 64 MiB), or each of 4096 slices in turn (distinct parameters over 16 GiB, a full-size
model's weights).

Usage (GPU)::

    python benchmarks/graph_step_probe.py --out data/bench/graph_step_probe_h200.json \\
        [--md data/bench/graph_step_probe_h200.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODES = (32, 64, 128, 256, 384, 512, 640, 768, 1024, 1536, 2048)
#: the ``read`` chains' buffer: 4096 slices of 4 MiB (16 GiB)
SLICES, SLICE_FLOATS = 4096, 1 << 20
SRC = r"""
extern "C" __global__ void k_empty(float* p) { }
extern "C" __global__ void k_read(const float4* __restrict__ p, float* out, long long n) {
    float s = 0.f;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += step) {
        float4 v = p[j]; s += v.x + v.y + v.z + v.w;
    }
    if (s == 1234.5f) out[0] = s;
}
"""


def _chains(cp: Any) -> dict[str, Any]:
    """name -> a function launching kernel ``i`` of that chain on the current stream."""
    mod = cp.RawModule(code=SRC)
    k_empty, k_read = mod.get_function("k_empty"), mod.get_function("k_read")
    out = cp.zeros(1024, cp.float32)
    big = cp.zeros(SLICES * SLICE_FLOATS, cp.float32)  # 16 GiB: a full-size model's weights
    n4 = np.int64(SLICE_FLOATS // 4)

    def read(i: int, slices: int) -> None:  # kernel i reads 4 MiB slice i % slices of `big`
        k_read((132,), (256,), (big[(i % slices) * SLICE_FLOATS:], out, n4))

    return {"empty_1block": lambda i: k_empty((1,), (128,), (out,)),
            "empty_132blocks": lambda i: k_empty((132,), (128,), (out,)),
            "read4MB_132blocks": lambda i: read(i, 1),
            "read4MB_16_slices": lambda i: read(i, 16),
            "read4MB_4096_slices": lambda i: read(i, SLICES)}


def _graph(cp: Any, stream: Any, n: int, launch: Any) -> Any:
    with stream:
        stream.begin_capture()
        for i in range(n):
            launch(i)
        return stream.end_capture()


def untraced(cp: Any, reps: int) -> list[dict[str, Any]]:
    """Per-kernel step of each chain's graph replay (``kernels.graph_replay_samples``: CUDA
    events, 3 warm-up replays), median of ``reps``."""
    from workbench.exec.kernels import graph_replay_samples

    s = cp.cuda.Stream(non_blocking=True)
    rows = []
    for name, launch in _chains(cp).items():
        for n in NODES:
            nxt = iter(range(n)).__next__  # the capture launches kernels 0..n-1 of the chain
            with s:
                us = np.asarray(graph_replay_samples(cp, s, lambda f=launch, i=nxt: f(i()), n, reps + 3, 3)) * n * 1e6
            rows.append({"mode": "untraced", "kernel": name, "nodes": n, "replay_us": float(np.median(us)),
                         "replay_us_min": float(np.min(us)), "step_ns": float(np.median(us)) * 1e3 / n})
            print(rows[-1], flush=True)
    return rows


def traced(cp: Any, reps: int) -> list[dict[str, Any]]:
    """Gap and duration of each chain's kernels under CUPTI (graphs captured while it records)."""
    from workbench.trace.cupti import CuptiCapture

    s = cp.cuda.Stream(non_blocking=True)
    cap = CuptiCapture(kinds=("CONCURRENT_KERNEL",)).start()
    order = []  # (name, n, timed): every replay in launch order, one stream, synchronized between
    for name, launch in _chains(cp).items():
        for n in NODES:
            g = _graph(cp, s, n, launch)
            for r in range(reps + 1):  # the first replay warms up
                g.launch(s)
                s.synchronize()
                order.append((name, n, r > 0))
    ev = cap.stop().events
    k = ev[ev["kind"] == "kernel"].sort_values("start_ns")
    expected = sum(n for _, n, _ in order)
    if len(k) != expected:
        raise RuntimeError(f"traced chains: {len(k)} kernel records, expected {expected}")
    st_all, en_all = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
    rows = []
    per: dict[tuple[str, int], dict[str, list[float]]] = {}
    i = 0
    for name, n, timed in order:
        st, en = st_all[i:i + n], en_all[i:i + n]
        i += n
        if not timed:
            continue
        d = per.setdefault((name, n), {"gap": [], "dur": [], "span": []})
        d["gap"].append(float(np.median(st[1:] - en[:-1])))
        d["dur"].append(float(np.median(en - st)))
        d["span"].append(float(en[-1] - st[0]) / n)
    for (name, n), d in per.items():
        rows.append({"mode": "cupti", "kernel": name, "nodes": n, "gap_ns": float(np.median(d["gap"])),
                     "duration_ns": float(np.median(d["dur"])), "step_ns": float(np.median(d["span"]))})
        print(rows[-1], flush=True)
    return rows


def markdown(data: dict[str, Any]) -> str:
    import pandas as pd

    from workbench.trace.analysis import to_markdown

    df = pd.DataFrame(data["rows"])
    un = df[df["mode"] == "untraced"].pivot(index="nodes", columns="kernel", values="step_ns")
    tr = df[df["mode"] == "cupti"]
    gap = tr.pivot(index="nodes", columns="kernel", values="gap_ns").add_suffix(" gap")
    dur = tr.pivot(index="nodes", columns="kernel", values="duration_ns").add_suffix(" duration")
    env = data["environment"]
    return "\n".join([
        "# A CUDA graph's kernel-to-kernel step against its node count\n",
        f"Measured {env['date']} on {env['gpu']} (driver {env['driver']}, CUDA runtime {env['runtime']}, CuPy "
        f"{env['cupy']}) by `benchmarks/graph_step_probe.py`: chains of one kernel (the read chains over 1, 16 or "
        "4096 4-MiB slices of a 16-GiB buffer), one graph per node count, "
        f"median of {data['reps']} replays.\n",
        "## Untraced: replay time per kernel (ns, CUDA events)\n",
        to_markdown(un.round(0).reset_index()), "",
        "## Under CUPTI (every graph node recorded): median gap and duration (ns)\n",
        to_markdown(gap.join(dur).round(0).reset_index()), ""])


def probe_environment(cp: Any) -> dict[str, Any]:
    """The GPU, driver, CUDA runtime, CuPy and date the probes of this folder record."""
    return {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "driver": cp.cuda.runtime.driverGetVersion(), "runtime": cp.cuda.runtime.runtimeGetVersion(),
            "cupy": cp.__version__, "date": time.strftime("%Y-%m-%d")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON of the measured rows")
    p.add_argument("--md", type=Path, help="also write the tables as markdown")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    from workbench.exec.kernels import require_cupy

    cp, _ = require_cupy()
    rows = untraced(cp, args.reps) + traced(cp, max(3, args.reps // 4))
    data = {"environment": probe_environment(cp), "reps": args.reps, "nodes": list(NODES), "rows": rows}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    if args.md:
        args.md.write_text(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
