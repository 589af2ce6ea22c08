"""Does a kernel stream its bytes slower when the model's weights span more device memory? (GPU)

Untraced, a decode layer takes 3-12 % longer at full depth than at 2 layers (qwen3-30b-a3b 102.6 ->
115.1 us, `data/bench/calibration_h200_s37_fullsize.md` section 5), with the same kernels a layer.
One reading: the GPU's address translation covers a few GB, and past that a kernel's loads wait on
page walks. This probe isolates the footprint: chains of one read kernel, each kernel reading the
next slice of a set of buffers, the set's total size (the footprint) swept from 0.5 to 64 GiB at a
fixed slice size, so the bytes a kernel reads stay the same and only how far apart they lie grows.

Per footprint, slice size and allocation (one buffer a slice, as a model's weights are allocated
tensor by tensor, or one buffer for all): a CUDA graph of ``max(slices, 64)`` kernels, replayed
(``kernels.graph_replay_samples``: CUDA events, 3 warm-up replays), median per kernel and the
bandwidth it reaches.

Usage (GPU)::

    python benchmarks/footprint_probe.py --out data/bench/footprint_probe_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from graph_step_probe import SRC, probe_environment  # noqa: E402  (its k_read: a grid-stride read)

GIB = 1 << 30
FOOTPRINTS_GIB = (0.5, 1, 2, 4, 8, 16, 32, 64)
SLICES_MIB = (4, 32)


def measure(cp: Any, reps: int, blocks: int) -> list[dict[str, Any]]:
    from workbench.exec.kernels import graph_replay_samples

    k_read = cp.RawModule(code=SRC).get_function("k_read")
    out = cp.zeros(1024, cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    rows = []
    for alloc in ("per_slice", "one_buffer"):
        for slice_mib in SLICES_MIB:
            nbytes = slice_mib << 20
            for fp in FOOTPRINTS_GIB:
                n_slices = int(fp * GIB) // nbytes
                if alloc == "per_slice":
                    bufs = ptrs = [cp.empty(nbytes, cp.uint8) for _ in range(n_slices)]
                else:
                    big = cp.empty(n_slices * nbytes, cp.uint8)
                    ptrs = [big[i * nbytes:(i + 1) * nbytes] for i in range(n_slices)]
                n4 = np.int64(nbytes // 16)
                nodes = max(n_slices, 64)
                nxt = iter(range(nodes)).__next__

                def launch(i: Any = nxt, ptrs: Any = ptrs, n4: Any = n4) -> None:
                    k_read((blocks,), (256,), (ptrs[i() % len(ptrs)], out, n4))

                with s:
                    t = np.asarray(graph_replay_samples(cp, s, launch, nodes, reps + 3, 3))
                us = float(np.median(t)) * 1e6
                rows.append({"alloc": alloc, "slice_MiB": slice_mib, "footprint_GiB": fp, "kernels": nodes,
                             "us_per_kernel": us, "us_min": float(t.min()) * 1e6, "GBps": nbytes / us / 1e3})
                print(rows[-1], flush=True)
                del ptrs
                if alloc == "per_slice":
                    del bufs
                else:
                    del big
                cp.get_default_memory_pool().free_all_blocks()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--blocks", type=int, default=528, help="read kernel blocks (4 an SM on 132 SMs)")
    args = p.parse_args()
    from workbench.exec.kernels import require_cupy

    cp, _ = require_cupy()
    rows = measure(cp, args.reps, args.blocks)
    data = {"environment": probe_environment(cp), "reps": args.reps, "blocks": args.blocks, "rows": rows}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
