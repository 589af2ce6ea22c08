"""A cold NVRTC compile of every kernel source (``kernels/*.cu``) for one PDL placement: one source
after another, as the cuda executor compiled them until session 22, against side by side
(``ModuleCache.prefetch``). Each placement is compiled once, into an empty CuPy kernel cache.

    python benchmarks/compile_parallel.py $OUT/compile_parallel.json

Record: data/bench/compile_parallel_h100.json (lab_latency_h100.md).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp()  # before CuPy reads it: nothing compiled yet

#: (mode, wait, trigger): a placement per measurement, so no run finds another's modules
RUNS = (("serial", "first-read", "start"), ("parallel", "first-read", "end"),
        ("serial", "late", "end"), ("parallel", "late", "start"))


def main(out: str) -> int:
    import cupy

    from workbench.exec.kernels import SOURCES, ModuleCache

    major, minor = cupy.cuda.Device().compute_capability
    mc = ModuleCache((int(major), int(minor)))
    res = {}
    for mode, wait, trigger in RUNS:
        keys = {(s, wait, trigger) for s in SOURCES}
        t = time.perf_counter()
        if mode == "serial":
            for k in sorted(keys):
                mc._module(k).compile()
        else:
            mc.prefetch(keys)
        res[f"{mode}_{wait}_{trigger}"] = time.perf_counter() - t
        print(mode, wait, trigger, f"{res[f'{mode}_{wait}_{trigger}']:.2f} s", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
