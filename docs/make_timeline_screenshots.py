"""Regenerate the timeline screenshots of docs/timeline.md from simulated runs (H200 calibration).

    python docs/make_timeline_screenshots.py
"""

from __future__ import annotations

from pathlib import Path

import workbench
from workbench.models import preset
from workbench.strategy import Strategy
from workbench.trace.analysis import token_spans
from workbench.view.compare import compare
from workbench.view.export import write_image
from workbench.view.timeline import show_window, timeline

OUT = Path(__file__).parent / "img"
MODEL = "llama-3.2-1b"
BASELINE = Strategy()
OPTIMIZED = Strategy(graphs=True, pdl=True, streams="qkv", sync="boundary")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    cfg = preset(MODEL)
    base = workbench.run(cfg, BASELINE, tokens=4, backend="sim", gpu="h200").trace
    opt = workbench.run(cfg, OPTIMIZED, tokens=4, backend="sim", gpu="h200").trace

    # one steady-state token of the optimized run, zoomed to its first layers: PDL lanes, Q/K/V streams
    fig = timeline(opt, title=f"{MODEL} · CUDA graph + PDL + Q/K/V streams + boundary sync (simulated H200)")
    t0 = opt.events["start_ns"].min()
    tok = token_spans(opt).set_index("token").loc[2]
    lo = (tok["start_ns"] - t0) / 1e3
    rng = [lo, lo + 160.0]
    show_window(fig, *rng)
    fig.update_xaxes(range=rng)
    write_image(fig, OUT / "timeline_graph_pdl_qkv.png", width=1500, scale=1.5)
    write_image(fig, OUT / "timeline_graph_pdl_qkv.svg", width=1500)

    fig = compare({"baseline (eager, per-copy syncs)": base, "graph + PDL + qkv + boundary": opt}, align_token=1,
                  title=MODEL + " (simulated H200)")
    write_image(fig, OUT / "compare_baseline_vs_optimized.png", width=1500, scale=1.5)


if __name__ == "__main__":
    main()
