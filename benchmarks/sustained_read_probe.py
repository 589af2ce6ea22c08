"""Does a GPU stream bytes slower after seconds of sustained reading? (GPU)

A decode layer takes longer at full depth than at 2 layers, untraced (3-12 %,
`data/bench/calibration_h200_s37_fullsize.md` section 5), though neither the weights' footprint
(`footprint_probe.py`) nor a graph's node count (`graph_step_probe.py`) slows a kernel. A deeper
token keeps the GPU busy with fewer idle gaps between tokens; if the GPU slows down under sustained
load (clocks, HBM temperature), per-layer time grows with depth. This probe replays one CUDA graph
(128 kernels each reading a 32 MiB slice of 4 GiB) back to back for ``--seconds``, with a pause
every ``--period`` replays when asked (``--idle-us``), and reports the bandwidth per second of the
run beside the GPU's clocks, temperature and power (``nvidia-smi``) before and after.

Usage (GPU)::

    python benchmarks/sustained_read_probe.py --out data/bench/sustained_read_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graph_step_probe import SRC  # noqa: E402  (its k_read: a grid-stride read)

QUERY = "temperature.gpu,temperature.memory,clocks.sm,clocks.mem,power.draw"


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--idle-us", type=float, default=0.0, help="host sleep after each replay (0: back to back)")
    args = p.parse_args()
    from workbench.exec.kernels import require_cupy

    cp, _ = require_cupy()
    k_read = cp.RawModule(code=SRC).get_function("k_read")
    out = cp.zeros(1024, cp.float32)
    nbytes, n = 32 << 20, 128
    bufs = [cp.empty(nbytes, cp.uint8) for _ in range(n)]
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        for b in bufs:
            k_read((528,), (256,), (b, out, np.int64(nbytes // 16)))
        g = s.end_capture()
    g.upload(s)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    before = smi()
    t_start, samples = time.perf_counter(), []
    while time.perf_counter() - t_start < args.seconds:
        e0.record(s)
        g.launch(s)
        e1.record(s)
        e1.synchronize()
        samples.append((time.perf_counter() - t_start, cp.cuda.get_elapsed_time(e0, e1) * 1e3))
        if args.idle_us:
            time.sleep(args.idle_us / 1e6)
    after = smi()
    per_s: dict[int, list[float]] = {}
    for t, us in samples:
        per_s.setdefault(int(t), []).append(n * nbytes / us / 1e3)
    rows = [{"second": k, "replays": len(v), "GBps_median": float(np.median(v))} for k, v in sorted(per_s.items())]
    for r in rows:
        print(r, flush=True)
    print("before:", before, "| after:", after, f"({QUERY})", flush=True)
    args.out.write_text(json.dumps({"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                                    "date": time.strftime("%Y-%m-%d"), "query": QUERY, "before": before,
                                    "after": after, "idle_us": args.idle_us, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
