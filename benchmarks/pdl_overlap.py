"""How much PDL lets llama.cpp's kernels overlap, from its recorded CUPTI captures.

For each capture of ``data/traces/llamacpp/<gpu>_captures`` (the llamacpp backend's traces, one
parquet per model and configuration), per token after the first: the sum of kernel durations, the
span from the first kernel's start to the last one's end, and the union of the intervals the GPU
runs a kernel. With PDL off, span ~ sum (kernels back to back); with PDL on, a kernel launched early
waits inside its duration, so the sum grows while the span shrinks. The span's drop against the
same model's ``pdl0`` capture is what PDL buys llama.cpp, and it is the target for our Plans' PDL
(``data/bench/pdl_placement_h200.md``: ours gains 0-4 % on the same models).
Medians over tokens. CPU only: ``python3 benchmarks/pdl_overlap.py [--gpu h200] [--md OUT.md]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.trace.stats import merged_intervals  # noqa: E402


def token_stats(kernels: pd.DataFrame) -> tuple[float, float, float, int]:
    """(kernel sum, span, busy union) in us and the kernel count of one token's kernels."""
    s, e = kernels.start_ns.to_numpy(), kernels.end_ns.to_numpy()
    m = merged_intervals(s, e)
    return (e - s).sum() / 1e3, (e.max() - s.min()) / 1e3, float((m[:, 1] - m[:, 0]).sum()) / 1e3, len(s)


def model_of(r: dict) -> str:
    """A capture row's stem without its configuration: "llama-3.1-8b-L32"."""
    return r["stem"][: -len(r["config"]) - 1]


def capture_rows(folder: Path) -> list[dict]:
    rows = []
    for line in (folder / "captures.jsonl").read_text().splitlines():
        cap = json.loads(line)
        df = pd.read_parquet(folder / cap["file"], columns=["kind", "token", "start_ns", "end_ns"])
        k = df[df.kind == "kernel"]
        per = np.array([token_stats(g) for t, g in k.groupby("token") if t != k.token.min()])
        if not len(per):
            continue
        s, span, busy, n = np.median(per, axis=0)
        rows.append({"stem": cap["stem"], "model": cap["model"], "config": cap["config"], "kernels": int(n),
                     "kernel_sum_us": s, "span_us": span, "busy_us": busy})
    pdl0 = {model_of(r): r["span_us"] for r in rows if r["config"] == "pdl0"}
    for r in rows:
        base = pdl0.get(model_of(r))
        r["span_vs_pdl0_pct"] = 100 * (r["span_us"] / base - 1) if base else None
    return rows


def markdown(rows: list[dict], gpu: str) -> str:
    out = [f"# PDL's overlap in llama.cpp's captures ({gpu})", "",
           "`benchmarks/pdl_overlap.py`: per token, medians; span vs the same model's `pdl0` capture.", "",
           "| capture | kernels | kernel sum us | span us | busy us | span vs pdl0 |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        d = "" if r["span_vs_pdl0_pct"] is None else f"{r['span_vs_pdl0_pct']:+.1f} %"
        out.append(f"| {r['stem']} | {r['kernels']} | {r['kernel_sum_us']:.0f} | {r['span_us']:.0f} | "
                   f"{r['busy_us']:.0f} | {d} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="h200", help="the captures folder's GPU (h200, h100)")
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    folder = ROOT / "data" / "traces" / "llamacpp" / f"{args.gpu}_captures"
    if not (folder / "captures.jsonl").exists():
        ap.error(f"no captures in {folder}: record them with benchmarks/llamacpp_capture.py on a GPU")
    text = markdown(capture_rows(folder), args.gpu)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
