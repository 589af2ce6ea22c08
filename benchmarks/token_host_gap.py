"""Where a replayed token's time goes outside its CUDA graph, on the cuda backend.

For each Strategy (``peer_best`` and variants without PDL, with one stream, and bare graphs), a
model runs 64 untraced tokens (us/token), then 24 tokens under CUPTI with graph-level spans only
(``node_tokens=0``: no per-kernel records, so the replay is not slowed). Per token, the median of:
``launch_api`` (the host time of ``cudaGraphLaunch``), ``before_graph`` (from the token's first
CUDA call, its input copies, to the graph's first GPU work), ``graph_span`` (the replay on the
GPU) and ``after_graph`` (from the replay's end to the token's last event: the logits' D2H copy and
the final sync). The GPU idles during ``before_graph`` and ``after_graph``. CUPTI's API tracing
adds host time to every CUDA call, so ``launch_api`` and ``before_graph`` read longer here than in an
untraced token: ``benchmarks/host_path_variants.py`` times the same spans with CUDA events
(``data/bench/host_path_variants_h200.md``).

Usage (GPU machine)::

    python benchmarks/token_host_gap.py --models llama-3.2-1b,llama-3.1-8b --json $OUT/token_host_gap.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import workbench  # noqa: E402
from workbench.models import preset  # noqa: E402
from workbench.strategy import ALL_ON_OURS, Strategy  # noqa: E402

PEER_BEST = ALL_ON_OURS.with_(pdl_trigger="after-main-loop")
STRATEGIES = {"peer_best": PEER_BEST, "no_pdl": PEER_BEST.with_(pdl=False),
              "single_stream": PEER_BEST.with_(streams="single"),
              "single_no_pdl": PEER_BEST.with_(streams="single", pdl=False),
              "graphs_only": Strategy(graphs=True, sync="implicit")}


def token_spans(events: pd.DataFrame) -> dict[str, float]:
    """Median per traced token (us) of the four spans named in the module docstring."""
    rows = []
    for _, t in events[events["token"] >= 0].groupby("token"):
        g = t[t["kind"] == "graph"]
        if g.empty:
            continue
        api = t[t["kind"] == "api"]
        launch = api[api["name"].str.contains("GraphLaunch")]
        rows.append({"launch_api": (launch["end_ns"] - launch["start_ns"]).sum() / 1e3,
                     "before_graph": (g["start_ns"].min() - t["start_ns"].min()) / 1e3,
                     "graph_span": (g["end_ns"].max() - g["start_ns"].min()) / 1e3,
                     "after_graph": (t["end_ns"].max() - g["end_ns"].max()) / 1e3})
    return pd.DataFrame(rows).median().round(1).to_dict()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b", help="comma list of preset[:layers]")
    ap.add_argument("--logits", default="copy", choices=("copy", "zero-copy"))
    ap.add_argument("--json", default="out/token_host_gap.json")
    args = ap.parse_args()
    results = []
    for spec in args.models.split(","):
        name, _, layers = spec.partition(":")
        cfg = preset(name, layers=int(layers) if layers else None, context=512)
        for label, s in STRATEGIES.items():
            s = s.with_(logits=args.logits)
            workbench.run(cfg, s, tokens=4, start_pos=448, backend="cuda", quiet=True)
            us = workbench.run(cfg, s, tokens=64, start_pos=448, backend="cuda", quiet=True).stats["us_per_token"]
            r = workbench.run(cfg, s, tokens=24, start_pos=448, backend="cuda", quiet=True, trace=True, node_tokens=0)
            row = {"model": spec, "strategy": label, "label": s.label(), "us_per_token": round(us, 1),
                   **token_spans(r.trace.events)}
            results.append(row)
            print(json.dumps(row), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
