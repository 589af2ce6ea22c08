"""CUPTI timelines of llama.cpp, read back and lined up with the Plans the simulator runs.

A trace recorded through the ``llamacpp`` backend with ``trace`` (``benchmarks/
llamacpp_capture.py``) names each kernel by the ggml op it computes (``op``, ``+``-joined for a
fusion) and carries in its meta the model, layers, context, first position and Strategy it
ran. Its kernels carry no Plan node, so they are matched to the nodes of the Plan of llama.cpp's
schedule (``llamacpp_plan``) per token and per kernel family, in launch order: where a token
has as many kernels of a family as the Plan has nodes, the i-th kernel is the i-th node; where
not (llama.cpp runs a kernel the workbench graph has not, e.g. the ``inp_out_ids`` row
selection), the family is left unmatched in that token and its kernel time reported.
A split attention's merge pass (``flash_attn_combine_results``) is a node of its own there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ...models import preset
from ...strategy import Strategy
from ...trace import Trace
from ..calibration import Calibration
from ..cost import kernel_cost, kernel_name, serial_units
from .llamacpp_schedule import llamacpp_plan

#: trace file suffixes read from a folder
TRACE_SUFFIXES = (".parquet", ".json.gz", ".json")


class TraceFolderError(ValueError):
    """A trace folder the llama.cpp fit cannot use; the message names the file and the fix."""


@dataclass(frozen=True)
class LlamaCppTrace:
    """One recorded run: its file, events, model spec and the Strategy llama.cpp ran."""

    path: Path
    trace: Trace
    model: str
    layers: int | None
    context: int
    start_pos: int
    strategy: Strategy

    @property
    def name(self) -> str:
        return next(self.path.name[:-len(s)] for s in TRACE_SUFFIXES if self.path.name.endswith(s))

    @property
    def config_label(self) -> str:
        """The capture's config name: the meta's, else the ``<config>`` of a file named
        ``<model>-L<layers>_<config>``, else the file's stem."""
        m = re.search(r"-L\d+_(.+)$", self.name)
        return str(self.trace.meta.get("config") or (m.group(1) if m else self.name))

    def config(self):
        return preset(self.model, layers=self.layers, context=self.context)


def trace_files(folder: Path) -> list[Path]:
    """The trace files of ``folder`` (sorted), or a clear error when there are none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceFolderError(f"trace folder {folder} does not exist; record one with "
                               "benchmarks/llamacpp_capture.py --out-dir DIR (GPU)")
    files = sorted(p for p in folder.iterdir() if p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceFolderError(f"trace folder {folder} holds no trace ({', '.join(TRACE_SUFFIXES)}); record "
                               "them with benchmarks/llamacpp_capture.py --out-dir DIR on the GPU")
    return files


def strategy_of(meta: dict, origin: str) -> Strategy:
    """The Strategy a trace's meta says it ran (``strategy_knobs``)."""
    knobs = meta.get("strategy_knobs")
    if not isinstance(knobs, dict):
        raise TraceFolderError(f"{origin}: meta has no strategy_knobs; it was not recorded through the llamacpp "
                               "backend with trace=True (benchmarks/llamacpp_capture.py)")
    knobs = dict(knobs)  # as Strategy.to_dict writes them: lists for the sets
    knobs["fusion"] = frozenset(knobs.get("fusion") or ())
    knobs["pdl_families"] = frozenset(tuple(x) if isinstance(x, list) else x for x in knobs.get("pdl_families") or ())
    try:
        return Strategy(**knobs)
    except (TypeError, ValueError) as e:
        raise TraceFolderError(f"{origin}: strategy_knobs {knobs} is not a Strategy ({e})") from None


def read_traces(folder: Path) -> list[LlamaCppTrace]:
    """Every llama.cpp trace of ``folder``; a file of another backend is a clear error."""
    from ...trace.io import load_trace

    out = []
    for p in trace_files(folder):
        tr = load_trace(p)
        m = tr.meta
        if m.get("backend") != "llamacpp":
            raise TraceFolderError(f"{p}: a trace of backend {m.get('backend')!r}, not llamacpp; the llama.cpp fit "
                                   "reads only traces recorded through the llamacpp backend")
        cols = [c for c in ("op", "family") if c not in tr.events.columns]
        if cols:
            raise TraceFolderError(f"{p}: events lack the {cols} column(s) the llamacpp backend writes (each kernel's "
                                   "ggml op and family); re-record it with benchmarks/llamacpp_capture.py")
        missing = [k for k in ("model", "context", "start_pos") if k not in m]
        if missing:
            raise TraceFolderError(f"{p}: meta lacks {missing}; re-record it with benchmarks/llamacpp_capture.py")
        out.append(LlamaCppTrace(p, tr, str(m["model"]), m.get("layers"), int(m["context"]), int(m["start_pos"]),
                                 strategy_of(m, str(p))))
    return out


def _kernel_groups(k: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel of one token, in start order; ``exposed_ns``: what the kernel adds to
    its stream's timeline, from the later of its start and the previous kernel's end on the
    stream to its own end (a PDL kernel's early start waiting on its predecessor does not count).
    Each kernel is a node of llama.cpp's Plan, the second pass of a split attention included
    (``llamacpp_schedule.attention_passes``)."""
    rows = []
    for stream, g in k.sort_values("start_ns").groupby("stream", sort=False):
        prev_end = -np.inf
        for r in g.itertuples():
            rows.append({"stream": stream, "op": r.op, "family": r.family, "start_ns": r.start_ns, "end_ns": r.end_ns,
                         "exposed_ns": r.end_ns - max(r.start_ns, prev_end)})
            prev_end = max(prev_end, r.end_ns)
    df = pd.DataFrame(rows, columns=["stream", "op", "family", "start_ns", "end_ns", "exposed_ns"])
    return df.sort_values("start_ns").reset_index(drop=True)


def device_calibration(cal: Calibration) -> Calibration:
    """``cal`` without measured kernel corrections: the plain roofline the fit scales, on
    llama.cpp's launch geometry (the base may be a cuda calibration fitted on the executor's)."""
    return replace(cal, ops={}, families={}, executor="llamacpp", grids="llamacpp")


def matched_kernels(t: LlamaCppTrace, cal: Calibration) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(matched, unmatched) kernels of one trace. Matched: one row per token and Plan node with
    its op, family, llama.cpp kernel name (``cost.kernel_name``: the key of the fit), measured
    ``duration_ns`` (first start to last end of the node's kernels) and ``exposed_ns``, and its
    ``roofline_ns`` on ``cal``'s device (alone, at its cap) and its mat-vec ``rows`` (0 for
    other kernels). Unmatched: per token and family,
    the kernels no node took and their exposed time."""
    cfg = t.config()
    dev = device_calibration(cal)
    ev = t.trace.events
    kern = ev[(ev["kind"] == "kernel") & (ev["token"] >= 0)]
    matched, unmatched = [], []
    for token, k in kern.groupby("token"):
        plan = llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos + int(token)))
        nodes = [la.node for la in plan.launches]
        groups = _kernel_groups(k)
        for fam, g in groups.groupby("family", sort=False):
            fam_nodes = [n for n in nodes if n.family == fam]
            if len(fam_nodes) != len(g):
                unmatched.append({"trace": t.name, "token": int(token), "family": fam, "kernels": len(g),
                                  "nodes": len(fam_nodes), "exposed_ns": float(g["exposed_ns"].sum())})
                continue
            for node, r in zip(fam_nodes, g.itertuples()):
                c = kernel_cost(node, dev)
                matched.append({"trace": t.name, "model": t.model, "token": int(token), "node": node.name,
                                "op": node.op, "family": fam, "kernel": kernel_name(node),
                                "key": f"{node.op}/{kernel_name(node)}", "trace_op": r.op,
                                "duration_ns": float(r.end_ns - r.start_ns), "exposed_ns": float(r.exposed_ns),
                                "roofline_ns": c.work_ns / c.cap if c.work_ns > 0 else 0.0,
                                "rows": serial_units(node, dev)})
    return pd.DataFrame(matched), pd.DataFrame(unmatched, columns=["trace", "token", "family", "kernels", "nodes",
                                                                   "exposed_ns"])



def kernel_counts(t: LlamaCppTrace, token: int = 1) -> pd.DataFrame:
    """Kernels per family in one token: the capture's (each kernel, by the
    ggml ops llama.cpp named them by) beside the Plan of llama.cpp's schedule the simulator runs
    (its ops, by the ggml op a stand-in node names). Where the counts differ, llama.cpp's fusion
    set or graph differs from the workbench's for that family (and the fit leaves the family
    unmatched in that trace)."""
    cfg = t.config()
    plan = llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos + token))
    ev = t.trace.events
    groups = _kernel_groups(ev[(ev["kind"] == "kernel") & (ev["token"] == token)])
    fams = sorted(set(groups["family"]) | {la.node.family for la in plan.launches})
    rows = []
    for fam in fams:
        g = groups[groups["family"] == fam]
        nodes = [la.node.params.get("ggml_op", la.node.op) for la in plan.launches if la.node.family == fam]
        rows.append({"trace": t.name, "family": fam, "captured": len(g), "simulated": len(nodes),
                     "captured_ops": ", ".join(f"{op} x{n}" for op, n in g["op"].value_counts().sort_index().items()),
                     "simulated_ops": ", ".join(f"{op} x{n}" for op, n in pd.Series(nodes, dtype=str).value_counts()
                                                .sort_index().items())})
    return pd.DataFrame(rows)
