"""Record small CUPTI timelines of the real llama.cpp for ``data/traces/llamacpp/`` (GPU).

llama-3.2-1b with 2 layers, 6 tokens at positions 448..453 of a 512-row context, llama.cpp's
fusions on, under three switch settings: CUDA graphs with PDL off, graphs + PDL (llama.cpp's
default), and graphs + PDL + ``GGML_CUDA_GRAPH_OPT`` (Q/K/V on three streams). Each run is the
``llamacpp`` backend with ``trace``: the capture starts before llama.cpp's first decode, every
kernel is recorded (CUPTI CONCURRENT_KERNEL, graph nodes included) and named by its ggml op.
Only the timed tokens are kept (the warm-up and the 448-token prompt are dropped). Files are
gzip'd workbench Perfetto JSON (``workbench.trace.io.load_trace`` reads them back).

Also writes ``README.md`` in the output folder: one row per file with what it holds, from the
files themselves.

Usage (``WORKBENCH_LLAMACPP`` = a CUDA build): ``python benchmarks/llamacpp_record_trace.py --out-dir DIR``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.calibrate.llamacpp_record import CONTEXT, START, TOKENS, Capture, record  # noqa: E402
from workbench.llamacpp.switches import LLAMACPP_FUSION  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402

FUSIONS = LLAMACPP_FUSION  # llama.cpp's fusion pass on (its default)
MODEL, LAYERS = "llama-3.2-1b", 2
RECIPES: dict[str, Capture] = {c.stem: c for c in (
    Capture(MODEL, LAYERS, "graphs", Strategy(graphs=True, fusion=FUSIONS)),
    Capture(MODEL, LAYERS, "graphs-pdl", Strategy(graphs=True, pdl=True, fusion=FUSIONS)),
    Capture(MODEL, LAYERS, "graphs-pdl-qkv", Strategy(graphs=True, pdl=True, streams="qkv", fusion=FUSIONS)),
)}


def record_one(cap: Capture, out_dir: Path, suffix: str = ".json.gz") -> Path:
    """``record`` one capture and say what it holds."""
    path, run = record(cap, out_dir, suffix)
    from workbench.trace.io import load_trace

    ev = load_trace(path).events
    k = ev[ev["kind"] == "kernel"]
    print(f"{path}: {len(ev)} events, {len(k)} kernels on {k['stream'].nunique()} stream(s), "
          f"{run['stats']['us_per_token']:.0f} us/token traced, switches {run['meta'].get('switches_text', '')}")
    return path


def overlaps(k) -> tuple[int, int]:
    """(boundaries where the next kernel starts before its predecessor ends, boundaries) on the
    busiest stream of the last token."""
    import numpy as np

    k = k[k["token"] == k["token"].max()]
    k = k[k["stream"] == k["stream"].mode().iloc[0]].sort_values("start_ns")
    s, e = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
    return int((s[1:] < np.maximum.accumulate(e)[:-1]).sum()), max(len(s) - 1, 0)


def readme(out_dir: Path, paths: list[Path]) -> Path:
    """A table of the recorded files, computed from them."""
    from workbench.trace.io import load_trace

    rows = []
    for p in paths:
        tr = load_trace(p)
        m, ev = tr.meta, tr.events
        k = ev[ev["kind"] == "kernel"]
        n, b = overlaps(k)
        rows.append(f"| `{p.name}` | `{m['switches']}` | {m['strategy']} | {len(tr.tokens())} | {len(ev)} | {len(k)} | "
                    f"{k['stream'].nunique()} | {n} of {b} | {m['us_per_token']:.0f} |")
    m = load_trace(paths[0]).meta if paths else {}
    text = "\n".join([
        "# Recorded CUPTI timelines of llama.cpp", "",
        f"Recorded by `benchmarks/llamacpp_record_trace.py` on {m.get('gpu_name', '?')}, "
        f"{datetime.date.today().isoformat()}: {MODEL} with {LAYERS} layers, f16, {TOKENS} tokens at positions "
        f"{START}..{START + TOKENS - 1} of a {CONTEXT}-row context, llama.cpp's fusions on, through the `llamacpp` "
        "backend with `trace` (every kernel recorded, CUDA-graph nodes included, each named by its ggml op in "
        "the `op` column). Gzip'd workbench Perfetto JSON: `workbench.trace.io.load_trace` reads them. The "
        "us/token are traced values (CUPTI's per-kernel records slow graph replays down). "
        "`tests/test_llamacpp_traces.py` checks what each shows; `notebooks/07_llamacpp.ipynb` draws them.", "",
        "| file | llama.cpp switches | strategy | tokens | events | kernels | streams | PDL overlap (last token, "
        "main stream) | us/token traced |", "|---|---|---|---:|---:|---:|---:|---:|---:|", *rows, ""])
    path = out_dir / "README.md"
    path.write_text(text)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=str(ROOT / "data" / "traces" / "llamacpp"))
    p.add_argument("--only", help="comma-separated recipe names")
    args = p.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(RECIPES)
    rc, paths = 0, []
    for name in names:
        try:
            paths.append(record_one(RECIPES[name], out))
        except Exception as e:  # one recipe failing leaves the others recorded
            print(f"{name}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
    if paths:
        print(readme(out, paths).read_text())
    return rc


if __name__ == "__main__":
    sys.exit(main())
