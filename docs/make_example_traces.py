"""Write the example traces ``notebooks/06_bring_your_own_trace`` loads when the user gives none:
one decode run as an Nsight Systems SQLite export and as a PyTorch-profiler (Kineto) Chrome trace.

The events come from a real run: the recorded CUPTI trace ``data/traces/<SOURCE>.json.gz`` (an
H100/H200 run of the cuda executor, ``benchmarks/record_traces.py``). They are written in the
two formats by the schema-faithful writers the importer's tests use (``tests/fixtures``), so the
example exercises the same import path a user's ``nsys export --type sqlite`` file or
``torch.profiler`` JSON takes. ``data/traces/examples/README.md`` records where they came from.

Usage: ``python docs/make_example_traces.py [--source llama-3.2-1b-L2_graphs-qkv]``
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "traces"
OUT = TRACES / "examples"
NSYS = "decode_nsys.sqlite"
KINETO = "decode_pytorch_profiler.json.gz"


def with_step_markers(trace):
    """The trace with one marker range per decode step on the host thread (what an instrumented
    program's NVTX ``token N`` ranges or PyTorch's ``ProfilerStep#N`` are), where it has none:
    nsys and Kineto files know tokens only through such markers."""
    import pandas as pd

    from workbench.trace import MARKER_ROW, Trace

    ev = trace.events
    if (ev["kind"] == "marker").any():
        return trace
    host = ev[(ev["kind"].isin(["api", "sync"])) & (ev["token"] >= 0)]
    spans = host.groupby("token").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
                                      tid=("tid", "first"), pid=("pid", "first")).reset_index()
    marks = pd.DataFrame({"row": MARKER_ROW, "kind": "marker", "name": [f"token {t}" for t in spans["token"]],
                          "start_ns": spans["start_ns"], "end_ns": spans["end_ns"], "stream": -1, "corr_id": -1,
                          "token": spans["token"], "node": "", "bytes": 0, "copy_kind": "", "graph_id": 0,
                          "tid": spans["tid"], "pid": spans["pid"], "device": -1})
    return Trace(pd.concat([ev, marks], ignore_index=True), dict(trace.meta))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="llama-3.2-1b-L2_graphs-qkv", help="recorded trace in data/traces")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.kineto import kineto_json
    from fixtures.nsys_export import write_nsys_sqlite

    from workbench.trace.io import load_trace

    src = TRACES / f"{args.source}.json.gz"
    trace = with_step_markers(load_trace(src))
    meta = trace.meta
    gpu = str(meta.get("gpu_name") or meta.get("device") or "NVIDIA GPU")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / NSYS).unlink(missing_ok=True)
    write_nsys_sqlite(trace, OUT / NSYS, gpu_name=gpu)
    with gzip.GzipFile(OUT / KINETO, "wb", mtime=0) as f:  # mtime 0: the same run gives the same bytes
        f.write(json.dumps(kineto_json(trace), separators=(",", ":")).encode())
    facts = {k: meta.get(k) for k in ("recipe", "gpu_name", "driver", "cuda_runtime", "date", "tokens",
                                      "us_per_token", "strategy_knobs") if meta.get(k) is not None}
    (OUT / "README.md").write_text(
        "# Example traces for notebooks/06_bring_your_own_trace\n\n"
        f"`{NSYS}` (Nsight Systems SQLite export schema) and `{KINETO}` (PyTorch-profiler / Kineto Chrome trace) "
        f"hold the same events: the recorded CUPTI trace `data/traces/{src.name}`, a measured run of the workbench's "
        "cuda executor, written in each format by `docs/make_example_traces.py` with the writers the importer's "
        "tests use (`tests/fixtures/nsys_export.py`, `tests/fixtures/kineto.py`). They were not produced by nsys or "
        "torch.profiler themselves; a file from either tool loads the same way. Each decode step is marked by a "
        "host range (`token N` in NVTX, `ProfilerStep#N` in the profiler trace), as an instrumented program marks "
        "them; the importers take token indices from those ranges.\n\n"
        f"Source run: `{json.dumps(facts, default=str)}`\n")
    for name in (NSYS, KINETO):
        print(f"{(OUT / name).relative_to(ROOT)}: {(OUT / name).stat().st_size / 1024:.0f} KiB, {len(trace)} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
