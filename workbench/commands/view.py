"""``workbench view``: draw, summarise, analyse or convert a trace file (workbench Parquet,
Perfetto JSON or protobuf, nsys SQLite export, PyTorch-profiler / Kineto JSON)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from .. import preflight
from ..trace import analysis
from ..trace.io import DRAWN_SUFFIXES, SAVE_SUFFIXES, load_trace, save_format, save_trace

ANALYSES = {
    "gaps": lambda t: analysis.idle_summary(analysis.gpu_idle_gaps(t)),
    "sync": analysis.sync_calls_per_token,
    "launch": analysis.launch_overhead,
    "overlap": analysis.kernel_overlap,
    "critical": lambda t: analysis.critical_path_summary(analysis.critical_path(t)),
    "kernels": analysis.kernel_summary,
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE_FILE", help="workbench .parquet / .json[.gz] / .pftrace, nsys .sqlite "
                   "export or Kineto .json[.gz]")
    p.add_argument("--out", metavar="FILE", help="write FILE.html, .png, .svg, .pdf (timeline) or convert the trace: "
                   f"{', '.join(s for s in SAVE_SUFFIXES if s not in DRAWN_SUFFIXES)}; "
                   "default without --summary/--analysis: <trace name>.html here")
    p.add_argument("--summary", action="store_true", help="print event counts, links and span as JSON")
    p.add_argument("--analysis", choices=sorted(ANALYSES), action="append", default=[],
                   help="print an analysis table (repeatable)")
    p.add_argument("--compare", nargs="+", metavar="TRACE_FILE", default=[],
                   help="more runs to stack under the first, on one time axis")
    p.add_argument("--align-token", type=int, help="token the runs are aligned at (default: the second common one)")
    p.add_argument("--title", help="figure title")


def main(args: argparse.Namespace) -> int:
    path = Path(args.trace)
    out = args.out or (None if args.summary or args.analysis else f"{path.name.split('.')[0]}.html")
    labels = preflight.view_checks(path, out, vars(args), preflight.stderr("view"))
    trace = load_trace(path)
    if args.summary:
        print(json.dumps(analysis.trace_summary(trace)))
    for name in args.analysis:
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(f"# {name}\n{ANALYSES[name](trace).to_string(index=False)}")
    if out is None:
        return 0
    fmt = save_format(out)
    if args.compare:
        from ..view.compare import compare
        from ..view.export import export

        if fmt not in DRAWN_SUFFIXES:
            raise ValueError(f"--compare draws a figure: write it as .html, .png or .svg, not {fmt}")
        runs = {labels[0]: trace}
        for label, other in zip(labels[1:], args.compare):
            runs[label] = load_trace(other)
        common = sorted(set.intersection(*(set(t.tokens()) for t in runs.values())))
        if not common:
            raise ValueError("the runs share no token to align at: every run needs per-token events")
        align = args.align_token if args.align_token is not None else common[min(1, len(common) - 1)]
        written = export(compare(runs, align_token=align, title=args.title), out)
    elif fmt in DRAWN_SUFFIXES:
        from ..view.export import export
        from ..view.timeline import timeline

        written = export(timeline(trace, title=args.title or path.name), out)
    else:
        written = save_trace(trace, out)
    print(f"wrote {written} ({written.stat().st_size / 1024:,.0f} KiB)")
    return 0
