"""How interactive the lab is: time from a knob change to the redrawn timeline in the control
panel (run + trace + race check + figure), GPU memory over many toggles, and every notebook
top to bottom under nbclient. One process, on the backend a user gets (``cuda`` on a GPU).

Targets: llama-3.2-1b (6 tokens) first run <= 10 s and later toggles <= 2 s (median of 10
toggles across different knobs); llama-3.1-8b first <= 20 s, toggles <= 5 s; qwen3-next-80b-a3b
``--layers 4`` toggles <= 3 s; GPU memory after 100 toggles within 5 % of after the first; each
notebook <= 60 s. ``--backends cuda,llamacpp`` also times the panel on the real llama.cpp (a build
named by ``$WORKBENCH_LLAMACPP``) through llama.cpp's own switches (no target: every run is a fresh
llama.cpp process that loads the model).

    python benchmarks/lab_latency.py --out $OUT/lab_latency.json [--memory-toggles 100] [--notebooks]
        [--backends cuda,llamacpp]
    python benchmarks/lab_latency.py --report $OUT/lab_latency.json --md data/bench/lab_latency_h200.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from workbench.strategy import ALL_ON, Strategy

#: the knob changes of a toggle sequence: each differs from the one before in one or two knobs
TOGGLES = (
    Strategy(graphs=True),
    Strategy(graphs=True, pdl=True),
    Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware"),
    Strategy(graphs=True, pdl=True, streams="qkv", allocator="stream-aware", sync="implicit"),
    ALL_ON,
    Strategy(graphs=True, pdl=True, pdl_wait="start"),
    Strategy(graphs=True, pdl=True, pdl_trigger="end"),
    Strategy(graphs=True, fusion=frozenset({"rms-norm-mul"})),
    Strategy(sync="boundary"),
    Strategy(pdl=True),
)


def llamacpp_toggles() -> tuple[Strategy, ...]:
    """The toggle sequence on llama.cpp: its switch settings (``llamacpp_peer.CONFIGS``), each a
    knob or two away from the one before."""
    from llamacpp_peer import CONFIGS

    return tuple(CONFIGS[c][0] for c in ("graphs", "no_fusion", "default", "graph_opt", "graph_opt_sync_implicit",
                                         "sync_implicit", "pdl0", "no_graphs_pdl0", "eager", "default"))


#: (model, layers, tokens, first-run target s, toggle target s)
MODELS = (("llama-3.2-1b", None, 6, 10.0, 2.0), ("llama-3.1-8b", None, 6, 20.0, 5.0),
          ("qwen3-next-80b-a3b", 4, 6, None, 3.0))


def gpu_memory_used() -> dict[str, int]:
    """Device memory in use: by CuPy's pool and by the whole device (driver view)."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    pool = cupy.get_default_memory_pool()
    return {"pool_used": int(pool.used_bytes()), "pool_total": int(pool.total_bytes()),
            "device_used": int(total - free)}


def toggle_latency(model: str, layers: int | None, tokens: int, backend: str, memory_toggles: int) -> dict[str, Any]:
    from workbench.view.panel import ControlPanel

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        p = ControlPanel(model, layers=layers, tokens=tokens, backend=backend, out_dir=out)
        first = p.run()
        first_s = time.perf_counter() - t0
        if first is None:
            raise RuntimeError(f"{model}: {p.last_error}")
        toggles = []
        for st in llamacpp_toggles() if backend == "llamacpp" else TOGGLES:
            t = time.perf_counter()
            p.set_strategy(st)
            e = p.run()
            if e is None:
                raise RuntimeError(f"{model} {st.label()}: {p.last_error}")
            toggles.append({"strategy": st.label(), "seconds": time.perf_counter() - t,
                            "us_per_token": e.us_per_token})
        row: dict[str, Any] = {"model": model, "layers": layers, "tokens": tokens, "backend": backend,
                               "device": first.run.device, "first_s": first_s, "toggles": toggles,
                               "toggle_median_s": float(np.median([x["seconds"] for x in toggles])),
                               "toggle_max_s": float(np.max([x["seconds"] for x in toggles]))}
        if backend == "cuda" and memory_toggles:
            p.set_strategy(Strategy())
            p.run()
            after_first = gpu_memory_used()
            times = []
            for i in range(memory_toggles):
                p.set_strategy(TOGGLES[i % len(TOGGLES)])
                t = time.perf_counter()
                p.run()
                times.append(time.perf_counter() - t)
            after = gpu_memory_used()
            row["memory"] = {"toggles": memory_toggles, "after_first": after_first, "after": after,
                             "device_growth_pct": 100 * (after["device_used"] / after_first["device_used"] - 1),
                             "toggle_median_s": float(np.median(times))}
        print(f"{model}: first {first_s:.2f} s, toggles median {row['toggle_median_s']:.2f} s "
              f"(max {row['toggle_max_s']:.2f} s)" + (f", device memory {row['memory']['device_growth_pct']:+.2f} % "
                                                       f"after {memory_toggles} toggles" if "memory" in row else ""),
              file=sys.stderr, flush=True)
        return row


def notebook_times() -> list[dict[str, Any]]:
    from workbench.view.lab import NOTEBOOKS, execute_notebook

    rows = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        with tempfile.TemporaryDirectory() as work:
            try:
                seconds, nb = execute_notebook(path, Path(work), 60.0)
                errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
                rows.append({"notebook": path.stem, "seconds": seconds, "ok": not errors})
            except Exception as e:  # noqa: BLE001 - a failing notebook is a result to record
                rows.append({"notebook": path.stem, "seconds": None, "ok": False,
                             "error": f"{type(e).__name__}: {e}"[:300]})
        print(f"notebook {path.stem}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def environment() -> dict[str, Any]:
    from workbench.exec.cuda_backend import cuda_available

    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if cuda_available()[0]:
        from workbench.exec.calibrate.environment import environment as gpu_env

        env.update(gpu_env())
    return env


def report(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [f"# Lab latency ({env.get('gpu_name', 'no GPU')})", "",
             f"Measured {env.get('date', '')[:10]} with `python benchmarks/lab_latency.py` on "
             f"{env.get('gpu_name', 'CPU')} (driver {env.get('driver_version', '-')}, CuPy {env.get('cupy', '-')}). "
             "Time from a knob change to the redrawn timeline in `ControlPanel` (run + CUPTI trace + race check + "
             "figure), one process. A toggle to a PDL placement this process has not compiled yet pays for NVRTC "
             "(CuPy's on-disk cache serves later processes): that is the largest toggle time.", "",
             "| model | backend | first run s (target) | toggle median s (target) | toggle max s | memory growth |",
             "|---|---|---|---|---|---|"]
    targets = {m: (f, t) for m, _, _, f, t in MODELS}
    for r in data["toggle_latency"]:
        f, t = targets.get(r["model"], (None, None)) if r["backend"] != "llamacpp" else (None, None)
        mem = r.get("memory")
        lines.append(f"| {r['model']}{' --layers ' + str(r['layers']) if r['layers'] else ''} | {r['backend']} | "
                     f"{r['first_s']:.2f} ({'<= ' + str(f) if f else '-'}) | {r['toggle_median_s']:.2f} "
                     f"({'<= ' + str(t) if t else '-'}) | "
                     f"{r['toggle_max_s']:.2f} | "
                     + (f"{mem['device_growth_pct']:+.2f} % after {mem['toggles']} toggles" if mem else "-") + " |")
    lines += ["", "Per toggle:", "", "| model | backend | strategy | s | us/token |", "|---|---|---|---|---|"]
    for r in data["toggle_latency"]:
        for x in r["toggles"]:
            lines.append(f"| {r['model']} | {r.get('backend', '-')} | `{x['strategy']}` | {x['seconds']:.2f} | "
                         f"{x['us_per_token']:.1f} |")
    for e in data.get("errors", ()):
        lines.append(f"\n{e['model']} on {e['backend']} failed: {e['error']}")
    if data.get("notebooks"):
        lines += ["", "Notebooks top to bottom under nbclient (budget 60 s each):", "",
                  "| notebook | s | ok |", "|---|---|---|"]
        for n in data["notebooks"]:
            s = f"{n['seconds']:.1f}" if n["seconds"] is not None else n.get("error", "-")
            lines.append(f"| {n['notebook']} | {s} | {n['ok']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the measurements here (JSON)")
    ap.add_argument("--models", default=",".join(m for m, *_ in MODELS))
    ap.add_argument("--backends", help="comma-separated (default: the backend a user gets here, cuda on a GPU)")
    ap.add_argument("--llamacpp-models", default="llama-3.2-1b,llama-3.1-8b",
                    help="the models --backends llamacpp runs")
    ap.add_argument("--memory-toggles", type=int, default=100)
    ap.add_argument("--notebooks", action="store_true", help="also run every notebook under nbclient")
    ap.add_argument("--report", type=Path, help="JSON from an earlier run: write the markdown only")
    ap.add_argument("--md", type=Path, help="markdown output (default: beside --out)")
    args = ap.parse_args()
    if args.report:
        data = json.loads(args.report.read_text())
    else:
        from workbench.api import default_backend

        backends = args.backends.split(",") if args.backends else [default_backend()[0]]
        data = {"environment": environment(), "toggle_latency": [], "notebooks": []}
        for backend in backends:
            wanted = set((args.llamacpp_models if backend == "llamacpp" else args.models).split(","))
            for model, layers, tokens, _, _ in MODELS:
                if model not in wanted:
                    continue
                try:
                    row = toggle_latency(model, layers, tokens, backend,
                                         args.memory_toggles if model == "llama-3.2-1b" else 0)
                except (RuntimeError, ValueError) as e:  # a failing backend is a result: the rest still runs
                    print(f"{model} on {backend}: {e}", file=sys.stderr, flush=True)
                    data.setdefault("errors", []).append({"model": model, "backend": backend, "error": str(e)})
                    continue
                data["toggle_latency"].append(row)
                if args.out:
                    args.out.write_text(json.dumps(data, indent=1))
        if args.notebooks:
            data["notebooks"] = notebook_times()
        if args.out:
            args.out.write_text(json.dumps(data, indent=1))
    md = args.md or (args.out.with_suffix(".md") if args.out else None)
    text = report(data)
    if md:
        md.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
