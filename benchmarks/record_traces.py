"""Record the small CUPTI traces kept in ``data/traces/`` (CPU tests and notebooks read them).

    python benchmarks/record_traces.py --out-dir data/traces

Each recipe is a short cuda-executor run traced with CUPTI and written as a gzip'd workbench
Perfetto JSON (``workbench.trace.load_trace`` reads it back exactly):

- ``llama-3.2-1b-L2_graphs-pdl``: graph replay + PDL (consecutive kernels overlap on a stream);
- ``llama-3.2-1b-L2_graphs-qkv``: graph replay with Q, K and V on three streams;
- ``llama-3.2-1b-L2_eager-per-copy``: eager launches, a sync before every input copy;
- ``llama-3.2-1b_all-on``: all 16 layers, every knob of the four seeds on (a full-size timeline);
- ``llama-3.2-1b_all-on_graph-level``: the same, traced as ``workbench run --trace`` does by
  default: graph replays as one GRAPH_TRACE span per launch, the last 2 tokens kernel by kernel.

``--only NAME[,NAME]`` records some recipes (the others' files stay as they are).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from workbench.exec.calibrate.specs import ModelSpec
from workbench.strategy import Strategy

RECIPES: dict[str, tuple[ModelSpec, Strategy, int]] = {
    "llama-3.2-1b-L2_graphs-pdl": (ModelSpec("llama-3.2-1b", 2), Strategy(graphs=True, pdl=True, sync="implicit"), 4),
    "llama-3.2-1b-L2_graphs-qkv": (ModelSpec("llama-3.2-1b", 2), Strategy(graphs=True, streams="qkv",
                                                                          sync="boundary"), 4),
    "llama-3.2-1b-L2_eager-per-copy": (ModelSpec("llama-3.2-1b", 2), Strategy(), 4),
    "llama-3.2-1b_all-on": (ModelSpec("llama-3.2-1b"), Strategy(graphs=True, pdl=True, streams="qkv",
                                                                sync="implicit", allocator="stream-aware"), 3),
    "llama-3.2-1b_all-on_graph-level": (ModelSpec("llama-3.2-1b"), Strategy(graphs=True, pdl=True, streams="qkv",
                                                                            sync="implicit", allocator="stream-aware"),
                                        6),
}
#: cuda backend tracing options of a recipe (default: every token kernel by kernel)
TRACE_OPTIONS: dict[str, dict] = {"llama-3.2-1b_all-on_graph-level": {"node_tokens": 2}}


def record(out_dir: Path, seed: int = 0, only: set[str] | None = None) -> list[Path]:
    import workbench
    from workbench.exec.calibrate.environment import environment
    from workbench.exec.cuda import CudaExecutor
    from workbench.trace.perfetto import to_perfetto

    env = environment()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (spec, st, tokens) in RECIPES.items():
        if only and name not in only:
            continue
        cfg = spec.config()
        ex = CudaExecutor(cfg, st, "device", seed)
        workbench.run(cfg, st, tokens=2, backend="cuda", seed=seed, executor=ex)  # compile, capture before tracing
        run = workbench.run(cfg, st, tokens=tokens, backend="cuda", seed=seed, executor=ex, trace=True,
                            **{"node_tokens": None, **TRACE_OPTIONS.get(name, {})})
        tr = run.trace
        tr.meta.update(recipe=name, tokens=tokens, strategy_knobs=st.to_dict(), gpu_name=env["gpu_name"],
                       driver=env.get("driver_version", ""), cuda_runtime=env.get("cuda_runtime", ""),
                       cupy=env.get("cupy", ""), cupti=env.get("cupti", ""), date=env["date"],
                       us_per_token=run.stats["us_per_token"])
        path = out_dir / f"{name}.json.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(to_perfetto(tr), f, separators=(",", ":"))
        written.append(path)
        k = tr.events[tr.events["kind"] == "kernel"]
        print(f"{path.name}: {len(tr)} events, {len(k)} kernels ({(k['node'] == '').sum()} unmatched), "
              f"{path.stat().st_size / 1024:.0f} KB", file=sys.stderr, flush=True)
        del ex
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "traces")
    p.add_argument("--only", help=f"comma-separated recipes: {', '.join(RECIPES)}")
    args = p.parse_args()
    only = set(args.only.split(",")) if args.only else None
    unknown = sorted((only or set()) - set(RECIPES))
    if unknown:
        p.error(f"unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    record(args.out_dir, only=only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
