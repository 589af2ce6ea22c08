"""``workbench calibrate --target llamacpp``: the simulator's cost model of llama.cpp, fitted
from CUPTI timelines of llama.cpp (``llamacpp_traces``), written as
``data/calibration/<gpu>-llamacpp.json``.

What the timelines show directly:

* **kernels**: ``fixed_ns + work_scale x roofline`` per ggml op on llama.cpp's kernel for it
  (``OP/kernel``, the kernel named as ``cost.kernel_name`` names llama.cpp's kernels), per op,
  and per kernel family, by ``kernel_fit.fit_groups`` (the cuda target's fit) on the nodes
  matched to llama.cpp's kernels. Durations come from the traces without PDL where the folder
  has them (a PDL kernel starts early and waits, which the simulator models apart); a kernel's
  time is what it adds to its stream (``exposed_ns``). Ops only the PDL traces show (llama.cpp's
  unfused ops: its ``no_fusion`` keeps PDL) come from those, with the prologue a PDL kernel runs
  early added back. Ops llama.cpp's traces do not show keep the base calibration's op and family
  fits.
* **host** (profile ``llama.cpp``): medians of llama.cpp's CUDA API calls (graph launch,
  kernel launch, async copy, event record / wait), a synchronize that finds its stream idle
  (``stream_sync_ns``) and the wake-up of one that waits (``sync_wakeup_ns``), ggml's blocking
  input copy (``memcpy_blocking_ns``: an async copy and the sync of its stream,
  ``blocking_copy_spans``); GRAPH_OPT's extra host time per forked stream (``graph_stream_ns``,
  pairs of traces without / with it).
* **device gaps**: between stream-ordered graph kernels without PDL (``dependency_gap_ns``)
  and from ``cudaGraphLaunch``'s return to the graph's first kernel (``graph_launch_latency_ns``).

What the timelines cannot show, fitted with the simulator in the loop against the us/token of
each run (untraced ones from ``llamacpp_peer.py --jsonl`` where given, else the traced token's
span in llama_decode): CUPTI's per-kernel excess (slope of the residuals over kernel counts),
the host work of a token outside CUDA calls (``token_overhead_ns``: llama_decode's graph build,
scheduling, graph-update checks), the traced graph launch's inflation where the untraced runs
are faster than it allows, the eager per-launch host work, the untraced blocking copy from the
sync patch's effect where it was measured (``memcpy_blocking_fit``), and ``pdl_release_ns``
(``griddepcontrol.wait`` leaves no record) from the PDL knob's effect. The PDL prologue comes
from pairs of traces without / with PDL (``capture_savings``: what PDL takes off each kernel
llama.cpp launches with it; ``data/bench/pdl_prologues.md``), not from the base, whose prologue
is the cuda executor's kernels'. Other PDL parameters stay the base calibration's probe values.

Every number carries its source; a field the traces cannot give says it comes from the base.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...graph.graph import Node
from ...models.blocks import MASK_INPUT
from ...strategy import Strategy
from ..calibration import FAMILY_FIELDS, Calibration, CalibrationError, parse_calibration
from ..cost import KERNEL_NAMES
from .decode_matrix import knob_effect
from .kernel_fit import MIN_OP_KERNELS, fit_groups, pdl_saving_ns, prologue_ceilings
from .llamacpp_schedule import llamacpp_graph, llamacpp_inputs, llamacpp_plan
from .llamacpp_traces import LlamaCppTrace, TraceFolderError, matched_kernels, read_traces
from .tables import nan_median

#: host profile the fit writes (and the file's default)
PROFILE = "llama.cpp"
#: fixed-point steps of the token-overhead fit (``host_residuals``)
RESIDUAL_STEPS = 4
#: the values ``pdl_release`` tries (ns; 0: the wait lets go as the predecessor completes)
PDL_RELEASE_GRID_NS = (0.0, 250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0)
#: the values ``graph_stream_ns`` tries with untraced GRAPH_OPT pairs (ns per extra stream)
GRAPH_STREAM_GRID_NS = (0.0, 2000.0, 5000.0, 10000.0, 15000.0, 20000.0, 30000.0, 40000.0, 60000.0)
#: the values ``memcpy_blocking_ns`` tries with untraced runs of the sync-reduction patch (ns)
MEMCPY_BLOCKING_GRID_NS = (0.0, 500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0, 4000.0, 5000.0, 6000.0, 8000.0)
#: ``llamacpp_peer.py``'s configs of the sync-reduction patch (PEER_SCHED_SYNC): the config it
#: patches -> {patched config: Strategy.sync}
SYNC_CONFIGS = {"default": {"sync_boundary": "boundary", "sync_implicit": "implicit"},
                "graph_opt": {"graph_opt_sync_implicit": "implicit"}}
#: CUDA API name -> host cost field it measures
#: (cudaGraphLaunch is not among them: CUPTI's node-level graph tracing makes a traced graph
#: launch cost 1-2 us per node, ``untraced_graph_launch``)
API_FIELDS = {"cudaLaunchKernel": "launch_ns",
              "cudaLaunchKernelExC": "launch_pdl_ns", "cudaMemcpyAsync": "memcpy_async_ns",
              "cudaEventRecord": "event_record_ns", "cudaStreamWaitEvent": "stream_wait_event_ns"}


def model_key(model: str, layers: int | None = None) -> tuple[str, int]:
    """(preset, layers) of a model, ``llamacpp_peer.py``'s labels included (``qwen3-30b-a3b (8
    layers)``, ``gpt-oss-20b (8 layers) @ 32736``: the start position a long-context row adds is
    the record's ``start_pos``; no count: all the preset's layers)."""
    from ...models import preset

    name, _, rest = model.split(" @ ", 1)[0].partition(" (")
    if rest.endswith(" layers)"):
        layers = int(rest.split()[0])
    return name, int(layers or preset(name).n_layer)


def measured_table(path: Path) -> pd.DataFrame:
    """Untraced llama.cpp us/token from ``llamacpp_peer.py --jsonl`` records, one row per (preset,
    layers, config, context, start position, tokens): the median and min..max of every
    repetition of one tool's records, and which tool it is. All cells of a model shape (preset,
    layers, window) take the tool that timed the shape in more processes (the ``llamacpp``
    backend on a tie; a cell only the other tool timed keeps its records): the two disagree by
    2-4 points on a knob (``data/bench/llamacpp_peer_f16_h200_s19a.md``), so a knob mixes them
    only where a cell lacks the shape's tool, and more processes average more of llama.cpp's
    process-to-process noise. Context, start position and tokens are the records' (-1 where an
    older record lacks them: the run's defaults). ``leases``: the machine leases the repetitions
    came from (``<date>/<session>``, comma-joined): a knob effect between cells of different
    leases carries their lease-to-lease drift. ``runs``: each process's median (a record: one
    llama.cpp process, one ``--reps`` series) by ``<date>/<session>/<run>/<round>/<pair>``, so
    that a knob's effect pairs two cells' processes of the same round
    (``decode_matrix.knob_effect``): one process of llama.cpp differs from the next by 1-5 %,
    which pooled repetitions would put into the effect."""
    per: dict[tuple, list[float]] = {}
    leases: dict[tuple, set[str]] = {}
    runs: dict[tuple, dict[str, float]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("tool") not in ("llamacpp", "llama-bench") or r.get("us") is None:
            continue
        us = r["us"] if isinstance(r["us"], list) else [r["us"]]
        window = tuple(int(r.get(k) if r.get(k) is not None else -1) for k in ("context", "start_pos", "tokens"))
        key = (r["tool"], *model_key(str(r["model"])), str(r["config"]), *window)
        per.setdefault(key, []).extend(map(float, us))
        lease = f"{r.get('date', '?')}/{r.get('session', '-')}"
        leases.setdefault(key, set()).add(lease)
        if us:
            runs.setdefault(key, {})[f"{lease}/{r.get('run', '')}/{r.get('round', 0)}/{r.get('pair', 0)}"] = \
                float(np.median(us))
    processes: dict[tuple, dict[str, int]] = {}  # model shape -> tool -> processes over its cells
    for (tool, model, layers, _config, *window), r in runs.items():
        shape = processes.setdefault((model, layers, *window), {})
        shape[tool] = shape.get(tool, 0) + len(r)
    chosen = {shape: max(n, key=lambda t: (n[t], t == "llamacpp")) for shape, n in processes.items()}
    rows = {}
    # the shape's tool comes last and replaces the other's rows; a cell only the other timed keeps it
    for key, us in sorted(per.items(), key=lambda kv: chosen.get((*kv[0][1:3], *kv[0][4:])) == kv[0][0]):
        tool, model, layers, config, *window = key
        if us:
            rows[(model, layers, config, *window)] = {
                "model": model, "layers": layers, "config": config, "context": window[0], "start_pos": window[1],
                "tokens": window[2], "tool": tool, "us_per_token": float(np.median(us)), "us_min": float(np.min(us)),
                "us_max": float(np.max(us)), "leases": ",".join(sorted(leases[key])), "runs": runs.get(key, {})}
    return pd.DataFrame(list(rows.values()), columns=["model", "layers", "config", "context", "start_pos", "tokens",
                                                      "tool", "us_per_token", "us_min", "us_max", "leases", "runs"])


class Measured(dict):
    """Untraced us/token by (preset, layers, config), with each cell's ``measured_table`` row, so
    that a knob fitted with the simulator in the loop is measured as the report measures it."""

    def __init__(self, data: Mapping[tuple[str, int, str], float] = (), rows: Mapping[tuple, Any] | None = None):
        super().__init__(data)
        self.rows = dict(rows or {})

    def speedup(self, a: tuple[str, int, str], b: tuple[str, int, str]) -> float:
        """``t(a) / t(b) - 1`` in % (the fits' convention): the report's effect of going from
        ``b`` to ``a`` (``decode_matrix.knob_effect``: the median of the rounds' own where both
        cells hold rounds, one llama.cpp process differing from the next by 1-5 %), else the
        ratio of the medians."""
        if a in self.rows and b in self.rows:
            return knob_effect(self.rows[b], self.rows[a])[0]
        return 100 * (self[a] / self[b] - 1)


def read_measured(path: Path | None, context: int | None = None) -> Measured:
    """Median untraced us/token by (preset, layers, config) (``measured_table``) of the runs in a
    ``context``-row context (records without one count as any); empty without a file."""
    if path is None:
        return Measured()
    t = measured_table(path)
    if context is not None:
        t = t[t["context"].isin([-1, context])]
    return Measured({(r.model, int(r.layers), r.config): r.us_per_token for r in t.itertuples()},
                    {(r.model, int(r.layers), r.config): r._asdict() for r in t.itertuples()})


def cell(t: LlamaCppTrace) -> tuple[str, int, str]:
    """The measured cell of trace ``t``: (preset, layers, config)."""
    return (*model_key(t.model, t.layers), t.config_label)


def cupti_from_residuals(traces: list[LlamaCppTrace], cal: dict[str, Any], measured_targets: Mapping[str, float]
                         ) -> tuple[float, str]:
    """What CUPTI adds per kernel: the traced durations the kernel fit used include it, the
    untraced us/token of ``llamacpp_peer.py`` do not. Over the CUDA-graph traces with an untraced
    us/token, the residual (untraced - predicted without token overhead) is fitted as ``a + b x
    kernels per token``; ``-b`` is the per-kernel excess (0 where the traces do not span at least
    two kernel counts, or where ``b`` is not negative)."""
    zero = parse_calibration(dict(cal, host_profiles={PROFILE: dict(cal["host_profiles"][PROFILE],
                                                                     token_overhead_ns=0.0)}), "llama.cpp fit")
    n, r = [], []
    for t in traces:
        if not t.strategy.graphs or t.name not in measured_targets:
            continue
        k = t.trace.events
        k = k[(k["kind"] == "kernel") & (k["token"] >= 0)]
        n.append(len(k) / max(1, k["token"].nunique()))
        r.append(measured_targets[t.name] - simulated_us(t, zero)[0])
    if len(set(np.round(n))) < 2 or len(n) < 3:
        return 0.0, f"0: fewer than two kernel counts among {len(n)} CUDA-graph traces with untraced us/token"
    slope, icpt = np.polyfit(n, r, 1)
    v = max(0.0, -float(slope) * 1e3)
    return v, (f"{v:.0f} ns: minus the slope of (untraced us/token - predicted) over kernels per token across "
               f"{len(n)} CUDA-graph traces ({icpt:+.1f} us + {slope * 1e3:+.0f} ns per kernel)")


def kernel_span_us(t: LlamaCppTrace) -> float:
    """A traced token's device span (first kernel's start to last kernel's end), median over tokens."""
    k = t.trace.events
    k = k[(k["kind"] == "kernel") & (k["token"] >= 0)]
    return nan_median([(g["end_ns"].max() - g["start_ns"].min()) / 1e3 for _, g in k.groupby("token")])


def cupti_from_fusion_pairs(traces: list[LlamaCppTrace], measured_targets: Mapping[str, float]
                            ) -> tuple[float, str] | None:
    """What CUPTI adds per kernel, from the fusion knob: GGML_CUDA_DISABLE_FUSION changes the
    kernels a token runs but not llama_decode's host work (the ggml graph is the same), so over
    pairs of CUDA-graph traces without / with fusion measured untraced, (traced device span's
    difference - untraced us/token's difference) / kernel difference is CUPTI's per-kernel
    excess (median, at least 0). Across models the residual's slope over kernels per token
    confounds it with host work that grows with the graph; None without such a pair."""
    from dataclasses import replace

    fused = {(t.model, t.layers, replace(t.strategy, fusion=frozenset())): t for t in traces
             if t.strategy.graphs and t.strategy.fusion and t.name in measured_targets}
    per = []
    for t in traces:
        a = fused.get((t.model, t.layers, t.strategy))
        if a is None or t.strategy.fusion or t.name not in measured_targets:
            continue
        k = [len(x.trace.events.query("kind == 'kernel' and token >= 0")) / max(1, len(x.trace.tokens()))
             for x in (t, a)]
        if k[0] - k[1] < 1:
            continue
        traced = kernel_span_us(t) - kernel_span_us(a)
        untraced = measured_targets[t.name] - measured_targets[a.name]
        per.append((traced - untraced) * 1e3 / (k[0] - k[1]))
    if not per:
        return None
    v = max(0.0, float(np.median(per)))
    return v, (f"{v:.0f} ns: median over {len(per)} model(s) of (traced device span - untraced us/token) "
               f"difference per kernel between CUDA-graph traces without / with fusion "
               f"({', '.join(f'{x:.0f}' for x in per)} "
               "ns; the fusion knob changes the kernels, not llama_decode's host work)")


def pdl_pairs(traces: list[LlamaCppTrace]) -> list[tuple[LlamaCppTrace, LlamaCppTrace]]:
    """(without PDL, with PDL) per pair of CUDA-graph traces of one model that differ only in PDL
    (``pdl0`` and ``default``)."""
    from dataclasses import replace

    plain = {(t.model, t.layers, t.strategy): t for t in traces if not t.strategy.pdl}
    return [(plain[k], t) for t in traces if t.strategy.pdl and t.strategy.graphs
            and (k := (t.model, t.layers, replace(t.strategy, pdl=False))) in plain]


def capture_savings(traces: list[LlamaCppTrace], cal: Calibration) -> list[tuple[Node, float]]:
    """(Plan node, ns) per kernel llama.cpp launches with PDL: what PDL takes off its time on its
    stream, over each of ``pdl_pairs``: its median exposed time over the tokens without PDL less
    that with PDL."""
    out = []
    for a, t in pdl_pairs(traces):
        without, with_ = (matched_kernels(x, cal)[0].groupby("node")["exposed_ns"].median() for x in (a, t))
        cfg = t.config()
        for la in llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos + 1)).launches:
            if la.pdl and la.node.name in without.index and la.node.name in with_.index:
                out.append((la.node, float(without[la.node.name] - with_[la.node.name])))
    return out


def pdl_early_ns(savings: list[tuple[Node, float]], base: Calibration) -> tuple[float, str]:
    """What a kernel llama.cpp launches with PDL adds to its stream less than without PDL: the
    median of ``capture_savings``, else the base calibration's PDL boundary (prologue + setup -
    release, the gap aside)."""
    if savings:
        v = float(np.median([s for _, s in savings]))
        return v, f"the median PDL saving of {len(savings)} kernels (traces without / with PDL)"
    return pdl_saving_ns(base) - base.dependency_gap_ns, "the base calibration's prologue + setup - release"


def kernel_fits(traces: list[LlamaCppTrace], base: Calibration, cupti_ns: float, min_fixed: float,
                early: tuple[float, str] | None = None
                ) -> tuple[dict, dict, pd.DataFrame, pd.DataFrame, list[dict], list[dict]]:
    """(ops, families, fitted kernels, unmatched kernels, op report rows, family report rows):
    fits of ``fixed + scale x roofline`` on the matched kernels of the traces without PDL (all
    traces if none), less ``cupti_ns`` per kernel; ops only the PDL traces show take their
    exposed time plus ``early`` (ns, how: ``pdl_early_ns``)."""
    parts = [matched_kernels(t, base) for t in traces]
    kern = pd.concat([m for m, _ in parts], ignore_index=True) if parts else pd.DataFrame()
    unmatched = pd.concat([u for _, u in parts], ignore_index=True)
    if kern.empty:
        raise TraceFolderError("no kernel of the traces matched a Plan node; are they llama.cpp decode traces of "
                               "a workbench preset (meta model/layers/context)?")
    no_pdl = {t.name for t in traces if not t.strategy.pdl}
    use = kern[kern["trace"].isin(no_pdl)] if no_pdl else kern
    use = use.assign(duration_ns=(use["exposed_ns"] - cupti_ns).clip(lower=1.0))
    # ops only the PDL traces show (the unfused ops: llama.cpp's no_fusion keeps PDL on) are
    # fitted from them rather than left to the base: under PDL a kernel adds to its stream its
    # time less what PDL saves it (the prologue it ran early, less the wait's release)
    early_ns, early_how = early or pdl_early_ns([], base)
    pdl_only = kern[~kern["op"].isin(use["op"])]  # empty when every trace was taken (no trace without PDL)
    use = pd.concat([use, pdl_only.assign(duration_ns=(pdl_only["exposed_ns"] - cupti_ns + early_ns).clip(lower=1.0))],
                    ignore_index=True)
    pdl_ops = ", ".join(sorted(set(pdl_only["op"])))
    from_pdl = (f"; {pdl_ops} only in PDL traces: from those, plus {early_ns:.0f} ns, {early_how}"
                if pdl_ops else "")
    what = (f"on llama.cpp's CUPTI timelines ({'traces without PDL' if no_pdl else 'all traces'}{from_pdl}; a "
            f"kernel's time on its stream, less {cupti_ns:.0f} ns CUPTI adds per kernel)")
    by_key, rep_key = fit_groups(use, "key", "op", MIN_OP_KERNELS, min_fixed, what)
    by_op, rep_op = fit_groups(use, "op", "op", MIN_OP_KERNELS, min_fixed, what)
    # a family's fit is the fallback of its ops' kernels without a fit of their own: the expert
    # mat-mul's units are its grid's waves (cost.mmf_ids_geometry), not a mat-vec's rows, so it stays out
    fam_use = use[use["kernel"] != KERNEL_NAMES["MUL_MAT_ID"]]
    by_fam, rep_fam = fit_groups(fam_use, "family", "family", MIN_OP_KERNELS, min_fixed, what)
    # one kernel per op: its op/kernel entry says nothing the op's does not
    single = {op for op, g in use.groupby("op") if g["kernel"].nunique() == 1}
    ops = {**{k: v for k, v in by_key.items() if k.split("/", 1)[0] not in single}, **by_op}
    rep_key = [r for r in rep_key if r["op"] in ops]
    return ops, by_fam, use, unmatched, [*rep_key, *rep_op], rep_fam


def _api_table(t: LlamaCppTrace) -> pd.DataFrame:
    ev = t.trace.events
    return ev[ev["kind"].isin(["api", "sync"]) & (ev["token"] >= 0)]


def blocking_copy_spans(traces: list[LlamaCppTrace]) -> list[float]:
    """ns from each blocking input copy's ``cudaMemcpyAsync`` to the return of the
    ``cudaStreamSynchronize`` of the copy's stream that next follows it on the host (ggml's
    ``set_tensor``: upstream llama.cpp copies every split input so, after a sync of its stream)."""
    spans = []
    for t in traces:
        ev = t.trace.events
        ev = ev[ev["token"] >= 0]
        copy_stream = ev[(ev["kind"] == "memcpy") & (ev["copy_kind"] == "H2D")].set_index("corr_id")["stream"]
        calls = ev[ev["kind"].isin(["api", "sync"])].sort_values("start_ns")
        names, kinds = calls["name"].to_numpy(), calls["kind"].to_numpy()
        starts, ends = calls["start_ns"].to_numpy(), calls["end_ns"].to_numpy()
        streams, corrs = calls["stream"].to_numpy(), calls["corr_id"].to_numpy()
        for i in np.flatnonzero(names == "cudaMemcpyAsync"):
            stream = copy_stream.get(corrs[i])
            if stream is None:
                continue
            j = next((j for j in range(i + 1, min(i + 4, len(names))) if kinds[j] == "sync"), None)
            if j is not None and streams[j] == stream:
                spans.append(float(ends[j] - starts[i]))
    return spans


def host_costs(traces: list[LlamaCppTrace], copy_ns: float = 0.0) -> dict[str, tuple[float, str]]:
    """{host field: (ns, source)} of what the traces show; ``copy_ns``: a 16-byte copy's device
    time (the base calibration's), which a blocking copy's span includes."""
    out: dict[str, tuple[float, str]] = {}
    api = pd.concat([_api_table(t).assign(trace=t.name) for t in traces], ignore_index=True)
    api = api.assign(dur=api["end_ns"] - api["start_ns"])
    for name, fld in API_FIELDS.items():
        d = api.loc[api["name"] == name, "dur"]
        if len(d):
            out[fld] = (float(d.median()), f"median duration of {len(d)} {name} calls in llama.cpp's CUPTI "
                                           "timelines (traced: CUPTI's API callbacks included)")
    idle, wake = [], []
    for t in traces:
        ev = t.trace.events
        dev = ev[ev["kind"].isin(["kernel", "memcpy"])]
        for s in _api_table(t).query("kind == 'sync'").itertuples():
            d = dev[(dev["stream"] == s.stream) & (dev["start_ns"] < s.end_ns)]
            # int: CUPTI's ~1.8e18 ns stamps as float64 would round the wake-up to 256 ns
            last = int(d["end_ns"].max()) if len(d) else s.start_ns
            if last <= s.start_ns:
                idle.append(s.end_ns - s.start_ns)
            elif last <= s.end_ns:
                wake.append(s.end_ns - last)
    if idle:
        out["stream_sync_ns"] = (float(np.median(idle)), f"median of {len(idle)} cudaStreamSynchronize calls that "
                                                         "found their stream idle (llama.cpp's CUPTI timelines)")
    if wake:
        out["sync_wakeup_ns"] = (float(np.median(wake)), f"median of {len(wake)} waiting cudaStreamSynchronize calls: "
                                                         "last device work on the stream to the call's return")
    blocking = blocking_copy_spans(traces)
    if blocking and wake:
        out["memcpy_blocking_ns"] = (
            max(0.0, float(np.median(blocking)) - copy_ns - float(np.median(wake))),
            f"median of {len(blocking)} blocking input copies (ggml's set_tensor: cudaMemcpyAsync on its copy "
            "stream, then cudaStreamSynchronize of it; the call's start to the sync's return), less the copy "
            f"({copy_ns:.0f} ns: the base's memcpy latency and PCIe time of 16 B) and the wake-up (sync_wakeup_ns) "
            "the simulator adds to a blocking copy")
    over = []
    for t in traces:
        if not t.strategy.graphs:
            continue
        ev = t.trace.events
        for _, g in ev[ev["token"] >= 0].groupby("token"):
            mk = g[g["kind"] == "marker"]
            calls = g[g["kind"].isin(["api", "sync"])]
            if len(mk) and len(calls):  # the marker outlasts the token's last call by the tracer's own work
                span = calls["end_ns"].max() - mk["start_ns"].min()
                over.append(float(span - (calls["end_ns"] - calls["start_ns"]).sum()))
    if over:
        out["token_overhead_ns"] = (max(0.0, float(np.median(over))),
                                    f"median over {len(over)} tokens under CUDA graphs of the token's span (its "
                                    "marker's start to its last CUDA call's return) less its CUDA API calls "
                                    "(llama_decode's host work outside CUDA)")
    return out


def device_gaps(traces: list[LlamaCppTrace]) -> dict[str, tuple[float, str]]:
    """{device field: (ns, source)}: graph kernel-to-kernel gap (no PDL) and graph launch latency."""
    gaps, lat = [], []
    for t in traces:
        if not t.strategy.graphs:
            continue
        ev = t.trace.events
        for _, g in ev[ev["token"] >= 0].groupby("token"):
            k = g[g["kind"] == "kernel"].sort_values("start_ns")
            launch = g[g["name"] == "cudaGraphLaunch"]
            if len(launch) and len(k):
                lat.append(float(k["start_ns"].iloc[0] - launch["end_ns"].iloc[0]))
            if t.strategy.pdl:
                continue
            for _, ks in k.groupby("stream"):
                d = ks["start_ns"].to_numpy()[1:] - ks["end_ns"].to_numpy()[:-1]
                gaps.extend(float(x) for x in d if 0 <= x < 20_000)
    out = {}
    if gaps:
        out["dependency_gap_ns"] = (float(np.median(gaps)), f"median of {len(gaps)} gaps between stream-ordered "
                                                            "kernels of llama.cpp's CUDA graphs without PDL")
    lat = [x for x in lat if x >= 0]
    if lat:
        out["graph_launch_latency_ns"] = (float(np.median(lat)), f"median over {len(lat)} tokens of cudaGraphLaunch's "
                                                                 "return to the graph's first kernel (llama.cpp)")
    return out


def marker_span_us(t: LlamaCppTrace, calls: Callable[[pd.DataFrame], pd.DataFrame],
                   edge: Callable[[pd.DataFrame], float]) -> float:
    """Median over ``t``'s tokens of the time from the token's marker to ``edge`` of its
    ``calls`` (a token's events -> the calls that matter); tokens without either are skipped."""
    ev = t.trace.events
    spans = []
    for _, g in ev[ev["token"] >= 0].groupby("token"):
        mk, c = g[g["kind"] == "marker"], calls(g)
        if len(mk) and len(c):
            spans.append(float(edge(c) - mk["start_ns"].min()) / 1e3)
    return nan_median(spans)


def _cuda_calls(g: pd.DataFrame) -> pd.DataFrame:
    return g[g["kind"].isin(["api", "sync"])]


def prelaunch_us(t: LlamaCppTrace) -> float:
    """A graph token's host time up to its graph launch's return (marker start to the end of
    ``cudaGraphLaunch``), median over its tokens."""
    return marker_span_us(t, lambda g: g[g["name"] == "cudaGraphLaunch"], lambda c: c["end_ns"].max())


def first_call_us(t: LlamaCppTrace) -> float:
    """A token's host time before its first CUDA call (marker start to that call's start: what
    llama_decode does first, its inputs' values among it), median over the trace's tokens."""
    return marker_span_us(t, _cuda_calls, lambda c: c["start_ns"].min())


def mask_bytes(t: LlamaCppTrace) -> int:
    """Bytes of attention mask llama.cpp fills and copies per token in ``t``'s run (its split
    inputs, ``llamacpp_inputs``: an f16 cell per cached KV row, per mask)."""
    cfg = t.config()
    return sum(n for name, n in llamacpp_inputs(llamacpp_graph(cfg, cfg.kv_len(t.start_pos)), cfg)
               if name.startswith(MASK_INPUT))


def mask_fill_cost(traces: Iterable[LlamaCppTrace]) -> tuple[float, str] | None:
    """``mask_fill_ns_per_byte``: llama.cpp fills its KQ mask(s) on the CPU before every step
    (``llm_graph_input_attn_kq_mask::set_input``: a cell per cached KV row), so the host time
    before a token's first CUDA call grows with the context. Over captures of one model shape and
    config at two or more mask sizes (the long-context captures beside the 512-row ones), the
    least-squares slope of that time (``first_call_us``) against the mask's bytes, each group
    about its own mean; None without such captures."""
    groups: dict[tuple, list[tuple[int, float]]] = {}
    for t in traces:
        if t.strategy.graphs:
            y = first_call_us(t)
            if y == y:
                groups.setdefault((t.model, t.layers, t.config_label), []).append((mask_bytes(t), y))
    xs, ys, used = [], [], []
    for key, pts in groups.items():
        b = np.array(pts, float)
        if len(np.unique(b[:, 0])) >= 2:
            xs += list(b[:, 0] - b[:, 0].mean())
            ys += list(b[:, 1] - b[:, 1].mean())
            used.append(f"{key[0]} ({key[1]} layers, {key[2]}: {', '.join(f'{int(x)} B' for x in sorted(b[:, 0]))})")
    if not used:
        return None
    x, y = np.array(xs), np.array(ys)
    slope = max(0.0, float(x @ y / (x @ x))) * 1e3  # us per byte -> ns per byte
    return slope, (f"least-squares slope of the host time before a token's first CUDA call (median over a capture's "
                   f"tokens) against the bytes of f16 attention mask the token fills, over captures of one shape and "
                   f"config at several contexts: {'; '.join(used)}: llama.cpp fills its KQ mask on the CPU every "
                   "step, a cell per cached KV row")


#: issue 17's bound on a knob effect (points): the host-cost grids fitted on knob effects take the
#: value with the fewest effects off by more (``grid_score``)
KNOB_BOUND_PP = 2.0


def grid_score(diffs: Iterable[float]) -> tuple[int, float]:
    """How a grid value of a knob-effect fit ranks (lower first): the effects it predicts more than
    ``KNOB_BOUND_PP`` off the measured ones, then the median absolute difference. A median alone
    lets the well-fitted majority hide a model the value misses by several points."""
    d = np.abs(np.asarray(list(diffs), float))
    return int((d > KNOB_BOUND_PP).sum()), float(np.median(d))


def grid_how(off: int, err: float, n: int) -> str:
    return f"{off} of {n} more than {KNOB_BOUND_PP:g} points off, median difference {err:.2f} points"


def graph_stream_cost(traces: list[LlamaCppTrace]) -> tuple[float, str] | None:
    """``graph_stream_ns``: over pairs of graph traces of one model that differ only in Q/K/V
    streams (GGML_CUDA_GRAPH_OPT), the extra host time up to the graph launch's return per
    stream the multi-stream Plan adds; None without such a pair."""
    from dataclasses import replace

    single = {(t.model, t.layers, t.strategy): t for t in traces
              if t.strategy.graphs and t.strategy.streams == "single"}
    per = []
    for t in traces:
        a = single.get((t.model, t.layers, replace(t.strategy, streams="single")))
        if a is None or t.strategy.streams == "single" or not t.strategy.graphs:
            continue
        cfg = t.config()
        extra = llamacpp_plan(cfg, t.strategy, cfg.kv_len(t.start_pos)).n_streams - 1
        d = prelaunch_us(t) - prelaunch_us(a)
        if extra > 0 and d == d:
            per.append(max(0.0, d * 1e3 / extra))
    if not per:
        return None
    return float(np.median(per)), (f"median over {len(per)} pairs of CUDA-graph traces without / with "
                                   "GGML_CUDA_GRAPH_OPT of the extra host time up to cudaGraphLaunch's return per "
                                   "stream the Plan adds (llama.cpp reorders and forks the graph every token)")


def untraced_graph_launch(base: dict[str, Any]) -> tuple[float, str]:
    """``graph_launch_ns``: the base calibration's untraced cudaGraphLaunch on the same GPU and
    driver (host clock). llama.cpp's traced calls cannot give it: CUPTI's node-level graph
    tracing (needed to see the graph's kernels) makes a traced launch cost 1-2 us per node
    (150-1250 us in the captures), which the untraced runs do not pay."""
    name = base["default_host_profile"]
    v = float(base["host_profiles"][name]["graph_launch_ns"])
    how = base["sources"].get(f"host_profiles.{name}.graph_launch_ns", "")
    return v, (f"the {base.get('gpu', '?')} base calibration's untraced cudaGraphLaunch ({name} profile: {how}); "
               "llama.cpp's traced calls take 1-2 us per graph node under CUPTI's node-level graph tracing")


def graph_stream_fit(traces: list[LlamaCppTrace], cal: dict[str, Any], untraced: Mapping[str, float],
                     by_cell: Measured) -> tuple[float, str] | None:
    """``graph_stream_ns`` fitted with the simulator in the loop where the GRAPH_OPT knob was
    measured untraced: over pairs of graph traces of one model without / with Q/K/V streams, the
    grid value whose predicted knob effects come closest (median absolute difference, points)
    to the untraced ones (``by_cell``, the measured cells: paired round by round, ``Measured.speedup``).
    The traced host time (``graph_stream_cost``) carries CUPTI's per-node cost of the fork's extra
    event nodes; None without an untraced pair."""
    from dataclasses import replace

    single = {(t.model, t.layers, t.strategy): t for t in traces
              if t.strategy.graphs and t.strategy.streams == "single" and t.name in untraced}
    pairs = [(single[k], t) for t in traces if t.strategy.graphs and t.strategy.streams != "single"
             and t.name in untraced and (k := (t.model, t.layers, replace(t.strategy, streams="single"))) in single]
    if not pairs:
        return None
    measured = [by_cell.speedup(cell(a), cell(b)) for a, b in pairs]
    prof = cal["host_profiles"][PROFILE]
    best = (np.inf, 0.0)
    for v in GRAPH_STREAM_GRID_NS:
        trial = parse_calibration(dict(cal, host_profiles={PROFILE: dict(prof, graph_stream_ns=v)}), "llama.cpp fit")
        pred = [100 * (simulated_us(a, trial)[0] / simulated_us(b, trial)[0] - 1) for a, b in pairs]
        best = min(best, (*grid_score(np.subtract(pred, measured)), v))
    off, err, v = best
    return v, (f"simulator in the loop: the value of {list(GRAPH_STREAM_GRID_NS)} ns whose predicted GRAPH_OPT "
               f"effects (graphs + PDL without / with Q/K/V streams, {len(pairs)} pairs, untraced us/token, "
               "paired by round where both cells have rounds) come "
               f"closest to llama.cpp's measured ones ({grid_how(off, err, len(pairs))}): the host's per-token "
               "graph reorder and fork; the traced host time also carries CUPTI's cost of the fork's event nodes")


def memcpy_blocking_fit(traces: list[LlamaCppTrace], cal: dict[str, Any],
                        measured: Measured) -> tuple[float, str] | None:
    """``memcpy_blocking_ns`` fitted with the simulator in the loop where the sync-reduction
    patch was measured untraced: for each graph trace of the upstream host path (a sync and a
    blocking copy per input) whose model was also run under ``SYNC_CONFIGS``, the grid value
    whose predicted effects (upstream -> patched, the same trace's model and switches) come
    closest (median absolute difference, points) to the measured ones. CUPTI's API callbacks
    lengthen the traced copy and its sync (``blocking_copy_spans``), and what the patch saves is
    their untraced cost; None without such a run."""
    from dataclasses import replace

    runs = []
    for t in traces:
        here = cell(t)
        if not (t.strategy.graphs and t.strategy.sync == "per-copy" and here in measured):
            continue
        runs += [(t, mode, measured.speedup(here, (*here[:2], name)))
                 for name, mode in SYNC_CONFIGS.get(t.config_label, {}).items() if (*here[:2], name) in measured]
    if not runs:
        return None

    prof = cal["host_profiles"][PROFILE]
    traced = float(prof["memcpy_blocking_ns"])  # CUPTI only lengthens a call: the traced cost bounds the grid
    grid = sorted({v for v in MEMCPY_BLOCKING_GRID_NS if v < traced} | {traced})
    best = (np.inf, 0.0)
    for v in grid:
        trial = parse_calibration(dict(cal, host_profiles={PROFILE: dict(prof, memcpy_blocking_ns=v)}),
                                  "llama.cpp fit")
        upstream = {t.name: simulated_us(t, trial)[0] for t, _, _ in runs}  # once per trace, not per mode
        diff = [100 * (upstream[t.name] / simulated_us(t, trial, replace(t.strategy, sync=mode))[0] - 1) - m
                for t, mode, m in runs]
        best = min(best, (*grid_score(diff), v))
    off, err, v = best
    models = sorted({t.model for t, _, _ in runs})
    return v, (f"simulator in the loop: the value of {[round(g) for g in grid]} ns (up to the traced cost) whose "
               "predicted effects of "
               f"the sync-reduction patch (each config against the upstream host path it patches, {len(runs)} "
               f"runs of {', '.join(models)}, untraced us/token, paired by round where both cells have rounds) come "
               "closest to llama.cpp's measured ones "
               f"({grid_how(off, err, len(runs))}); the traced blocking copy ({traced:.0f} ns by the same "
               "definition) carries CUPTI's callbacks on its two calls")


def token_span_us(t: LlamaCppTrace) -> float:
    """A traced token's time inside llama_decode, median over its tokens: its marker's start to
    the return of its last CUDA call (the marker outlasts it by the tracer's own work, and the
    run's us/token by CUPTI's buffer handling between tokens)."""
    return marker_span_us(t, _cuda_calls, lambda c: c["end_ns"].max())


def simulated_us(t: LlamaCppTrace, cal: Calibration, strategy: Strategy | None = None) -> tuple[float, float]:
    """(us/token, launches/token) the simulator predicts for the run of trace ``t`` under ``cal``
    (under ``strategy`` instead of the trace's own, the same model and decode window)."""
    from ...api import run

    r = run(t.config(), strategy or t.strategy, tokens=max(2, len(t.trace.tokens())), backend="sim",
            start_pos=t.start_pos, calibration=cal, quiet=True)
    return float(r.stats["us_per_token"]), float(r.stats["launches_per_token"])


def fit_targets(traces: list[LlamaCppTrace], measured: Mapping[tuple[str, int, str], float]
                ) -> tuple[dict[str, float], set[str]]:
    """({trace: us/token the simulator should predict for its run}, what they are): the untraced
    us/token of ``measured`` where it has the run, else the traced token's span."""
    targets, what = {}, set()
    for t in traces:
        us = measured.get(cell(t))
        what.add("untraced us/token (llamacpp_peer.py)" if us is not None else "traced token spans")
        target = us if us is not None else token_span_us(t)
        if target == target:
            targets[t.name] = target
    return targets, what


def host_residuals(traces: list[LlamaCppTrace], cal: dict[str, Any],
                   measured: Mapping[tuple[str, int, str], float]) -> dict[str, tuple[float, str]]:
    """The host work the API medians miss, fitted with the simulator in the loop: under CUDA
    graphs, ``token_overhead_ns`` = median over the traces of (target - predicted with no token
    overhead); launched one by one, ``launch_ns`` and ``launch_pdl_ns`` grow by the median of
    what is left per launch. The target is the untraced us/token of ``measured`` where it has
    the run (what the fidelity report compares), else the traced token's span (``token_span_us``)."""
    prof = cal["host_profiles"][PROFILE]
    out: dict[str, tuple[float, str]] = {}
    targets, what = fit_targets(traces, measured)
    # untraced us/token where llamacpp_peer.py measured the run: a traced span carries CUPTI's cost
    untraced = {t.name for t in traces if cell(t) in measured}
    graph = ([t for t in traces if t.strategy.graphs and t.name in untraced]
             or [t for t in traces if t.strategy.graphs and t.name in targets])
    if graph:
        # part of the host's time overlaps the device's work, so the overhead does not add one to
        # one: a few fixed-point steps of overhead += median residual
        over = 0.0
        for _ in range(RESIDUAL_STEPS):
            trial = parse_calibration(dict(cal, host_profiles={PROFILE: dict(prof, token_overhead_ns=over)}),
                                      "llama.cpp fit")
            res = float(np.median([targets[t.name] - simulated_us(t, trial)[0] for t in graph]))
            over = max(0.0, over + res * 1e3)
            if abs(res) < 0.5:
                break
        out["token_overhead_ns"] = (over, f"simulator in the loop: the token overhead at which the median over "
                                          f"{len(graph)} CUDA-graph traces of ({' / '.join(sorted(what))} - "
                                          f"predicted) is {res:+.1f} us: llama_decode's host work outside CUDA "
                                          "calls")
        prof = dict(prof, token_overhead_ns=over)
        if over == 0 and res < -0.5:  # predicted slower with no overhead: traced API calls overstate the host
            traced = prof["graph_launch_ns"]
            for _ in range(RESIDUAL_STEPS):
                prof["graph_launch_ns"] = max(0.1 * traced, prof["graph_launch_ns"] + res * 1e3)
                trial = parse_calibration(dict(cal, host_profiles={PROFILE: prof}), "llama.cpp fit")
                res = float(np.median([targets[t.name] - simulated_us(t, trial)[0] for t in graph]))
                if abs(res) < 0.5 or prof["graph_launch_ns"] <= 0.1 * traced:
                    break
            out["graph_launch_ns"] = (prof["graph_launch_ns"], f"the median of traced cudaGraphLaunch calls "
                                      f"({traced:.0f} ns) lowered, with the simulator in the loop, until the "
                                      f"CUDA-graph traces' median residual is {res:+.1f} us (at least a tenth of "
                                      "the traced value): CUPTI's graph-launch callbacks inflate the traced call")
    cur = parse_calibration(dict(cal, host_profiles={PROFILE: prof}), "llama.cpp fit")
    eager = []
    use = [t for t in traces if not t.strategy.graphs and t.name in untraced] or traces
    for t in use:
        if t.strategy.graphs or t.name not in targets:
            continue
        pred, launches = simulated_us(t, cur)
        if launches:
            eager.append((targets[t.name] - pred) * 1e3 / launches)
    if eager:
        extra = float(np.median(eager))
        for fld in ("launch_ns", "launch_pdl_ns"):
            v = max(0.0, prof[fld] + extra)
            out[fld] = (v, f"{fld} median of llama.cpp's traced calls ({prof[fld]:.0f} ns) plus the simulator-in-the-"
                           f"loop residual per launch over {len(eager)} eager traces ({extra:+.0f} ns: ggml's "
                           "per-node host work between launches)")
    return out


def without_first_read_setup(base: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``pdl_first_read_setup_ns`` 0 and its PDL release less it: llama.cpp's
    kernels wait before any work (``ggml_cuda_pdl_sync()`` at their top), so none of theirs
    overlaps the predecessor, whatever the executor's kernels do before a first-read wait (the
    base file's releases, graph and eager, absorbed that overlap: ``fit._fit_pdl``, ``fit_eager``)."""
    dev, src = dict(base["device"]), dict(base["sources"])
    setup = float(dev.get("pdl_first_read_setup_ns", 0.0))
    if setup:
        for fld in ("pdl_release_ns", "eager_pdl_release_ns"):
            if float(dev.get(fld, -1.0)) >= 0:
                dev[fld] = max(0.0, float(dev[fld]) - setup)
                src[f"device.{fld}"] = (f"the base's less its pdl_first_read_setup_ns ({setup:.0f} ns): "
                                        f"{src[f'device.{fld}']}")
        dev["pdl_first_read_setup_ns"] = 0.0
        src["device.pdl_first_read_setup_ns"] = ("0: llama.cpp's kernels wait before any work (ggml_cuda_pdl_sync() "
                                                 "at the top of each kernel), nothing of theirs precedes the wait")
    return {**base, "device": dev, "sources": src}


def pdl_release(traces: list[LlamaCppTrace], cal: dict[str, Any], targets: Mapping[str, float]
                ) -> tuple[float, str] | None:
    """``pdl_release_ns`` fitted with the simulator in the loop: CUPTI cannot see when a PDL
    kernel's ``griddepcontrol.wait`` lets go, but the PDL knob's effect shows what PDL saves.
    Over pairs of graph traces of one model that differ only in PDL, the grid value whose
    predicted effects are closest (median absolute difference, points) to the measured ones;
    None without such a pair."""
    pairs = [(a, b) for a, b in pdl_pairs(traces) if a.name in targets and b.name in targets]
    if not pairs:
        return None
    measured = [100 * (targets[a.name] / targets[b.name] - 1) for a, b in pairs]
    best = (np.inf, 0.0)
    for v in PDL_RELEASE_GRID_NS:
        trial = parse_calibration(dict(cal, device=dict(cal["device"], pdl_release_ns=v)), "llama.cpp fit")
        pred = [100 * (simulated_us(a, trial)[0] / simulated_us(b, trial)[0] - 1) for a, b in pairs]
        err = float(np.median(np.abs(np.subtract(pred, measured))))
        best = min(best, (err, v))
    err, v = best
    return v, (f"simulator in the loop: the value of {list(PDL_RELEASE_GRID_NS)} ns whose predicted PDL effects "
               f"(graphs without / with PDL, {len(pairs)} model(s)) come closest to llama.cpp's measured ones "
               f"(median difference {err:.2f} points); CUPTI does not record griddepcontrol.wait's release")


def hold_out(traces: list[LlamaCppTrace], models: Iterable[str]) -> list[LlamaCppTrace]:
    """The traces of models not in ``models`` (the held-out ones stay out of the fit)."""
    held = set(models)
    return [t for t in traces if t.model not in held]


def _set_kernel_fits(cal: dict[str, Any], traces: list[LlamaCppTrace], base_cal: Calibration, base: dict[str, Any],
                     cupti: float, early: tuple[float, str] | None = None
                     ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict], list[dict]]:
    """Write the kernel fits into ``cal`` (ops and families; the base's ops llama.cpp's traces
    lack stay, its op/kernel fits of the cuda executor's kernels go)."""
    min_fixed = base_cal.pdl_prologue_ns + base_cal.pdl_first_read_setup_ns
    ops, fams, used, unmatched, op_rep, fam_rep = kernel_fits(traces, base_cal, cupti, min_fixed, early)
    src = cal["sources"]
    cal["ops"] = copy.deepcopy(base.get("ops", {}))
    cal["families"] = copy.deepcopy(base.get("families", {}))
    fitted_ops = {o.split("/")[0] for o in ops}
    for k in [k for k in cal["ops"] if "/" in k or k.split("/", 1)[0] in fitted_ops]:
        del cal["ops"][k]
        for f in FAMILY_FIELDS:
            src.pop(f"ops.{k}.{f}", None)
    for section in ("ops", "families"):  # how the cuda executor's kernels take an early PDL launch is theirs
        for k, fc in cal[section].items():
            for f in ("early_ns", "early_scale", "pdl_prologue_ns"):
                if fc.pop(f, None) is not None:
                    src.pop(f"{section}.{k}.{f}", None)
    for section, fits in (("ops", ops), ("families", fams)):
        for name, (vals, how) in fits.items():
            cal[section][name] = vals
            for f in vals:
                src[f"{section}.{name}.{f}"] = how
    return used, unmatched, op_rep, fam_rep


def _set_prologues(cal: dict[str, Any], savings: list[tuple[Node, float]]) -> None:
    """llama.cpp's own device PDL prologue from ``capture_savings`` (none without a pair of
    traces that differ only in PDL: the base's stays): the median saving less what the
    simulator's boundary saves besides the prologue, at most what every fit allows. The base's
    prologue is the cuda executor's, whose mat-vecs issue their weight loads before the wait;
    llama.cpp's kernels mostly call ``cudaGridDependencySynchronize`` first. One device value, not
    one per fit: per-fit prologues (``kernel_fit.boundary_prologues``) fitted on these pairs left
    the fitted families' knob effects unchanged and moved two held-out ones past 2 points
    (session 20, ``data/bench/pdl_prologues.md``)."""
    if not savings:
        return
    c = parse_calibration(cal, "llama.cpp fit")
    rest = pdl_saving_ns(c, 0.0)
    saving = float(np.median([v for _, v in savings]))
    cap = min(prologue_ceilings(c).values(), default=np.inf)
    cal["device"]["pdl_prologue_ns"] = round(float(np.clip(saving - rest, 0.0, cap)), 1)
    cal["sources"]["device.pdl_prologue_ns"] = (
        f"llama.cpp's CUPTI timelines: median PDL saving {saving:.0f} ns over {len(savings)} kernels launched with PDL "
        f"(CUDA-graph traces without / with PDL) less the {rest:.0f} ns the simulator's boundary saves besides the "
        f"prologue (gap + first-read setup - release), at most {cap:.0f} ns (the smallest fixed part less setup of "
        "the fits): the kernels' work before cudaGridDependencySynchronize")


def fit(traces: list[LlamaCppTrace], base: dict[str, Any],
        measured: Mapping[tuple[str, int, str], float] | None = None,
        log: Callable[[str], None] = lambda s: None,
        kernel_traces: Iterable[LlamaCppTrace] = ()) -> dict[str, Any]:
    """The llama.cpp calibration dict from ``traces`` on top of ``base`` (a cuda calibration
    dict of the same GPU: device roofline, PDL probes, ops llama.cpp's traces lack);
    ``kernel_traces`` add their kernels to the kernel fits only (captures of another context)."""
    if not traces:
        raise TraceFolderError("no trace left to fit (every trace held out?)")
    measured = measured if isinstance(measured, Measured) else Measured(measured or {})
    base = without_first_read_setup(base)
    base_cal = parse_calibration(base, "base calibration")
    cal = copy.deepcopy(base)
    base_name = f"{base.get('gpu', '?')} base calibration"
    src = {k: f"from the {base_name} (not observable in llama.cpp's timelines): {v}"  # inherited numbers say so
           for k, v in base["sources"].items() if not k.startswith("host_profiles.")}
    cal["sources"] = src
    prof = dict(cal["host_profiles"].get(PROFILE) or cal["host_profiles"][cal["default_host_profile"]])
    was = PROFILE if PROFILE in base["host_profiles"] else base["default_host_profile"]
    for fld in prof:
        src[f"host_profiles.{PROFILE}.{fld}"] = (f"from the {base_name}'s {was} profile: "
                                                 f"{base['sources'].get(f'host_profiles.{was}.{fld}', '')}")
    fork = graph_stream_cost(traces)
    copy_ns = base_cal.memcpy_latency_ns + 16 / base_cal.pcie_GBps
    for fld, (v, how) in {**host_costs(traces, copy_ns), **({"graph_stream_ns": fork} if fork else {})}.items():
        prof[fld] = round(v, 1)
        src[f"host_profiles.{PROFILE}.{fld}"] = how
    prof["graph_launch_ns"], src[f"host_profiles.{PROFILE}.graph_launch_ns"] = untraced_graph_launch(base)
    mask = mask_fill_cost([*traces, *kernel_traces])  # the long-context captures give the slope
    if mask is not None:
        prof["mask_fill_ns_per_byte"] = round(mask[0], 4)
        src[f"host_profiles.{PROFILE}.mask_fill_ns_per_byte"] = mask[1]
    cal["host_profiles"] = {PROFILE: prof}
    cal["default_host_profile"] = PROFILE
    cal["executor"] = "llamacpp"
    cal.pop("grids", None)  # llama.cpp's kernels: its own launch geometry (cost.launch_geometry)
    for fld, (v, how) in device_gaps(traces).items():
        cal["device"][fld] = round(v, 1)
        src[f"device.{fld}"] = how
    savings = capture_savings(traces, base_cal)
    early = pdl_early_ns(savings, base_cal)
    every = [*traces, *kernel_traces]  # the kernel fits' traces
    used, unmatched, op_rep, fam_rep = _set_kernel_fits(cal, every, base_cal, base, 0.0, early)
    targets, _ = fit_targets(traces, measured)
    untraced = {t.name: targets[t.name] for t in traces if cell(t) in measured}
    by_fusion = cupti_from_fusion_pairs(traces, untraced)
    cupti, cupti_how = (by_fusion if by_fusion is not None else cupti_from_residuals(traces, cal, untraced)
                        if untraced else (0.0, "0: no untraced us/token"))
    if cupti > 0:
        used, unmatched, op_rep, fam_rep = _set_kernel_fits(cal, every, base_cal, base, cupti, early)
    _set_prologues(cal, savings)
    blocking = memcpy_blocking_fit(traces, cal, measured)
    if blocking is not None:
        prof["memcpy_blocking_ns"], src[f"host_profiles.{PROFILE}.memcpy_blocking_ns"] = blocking
    for fld, (v, how) in host_residuals(traces, cal, measured).items():
        prof[fld] = round(v, 1)
        src[f"host_profiles.{PROFILE}.{fld}"] = how
    pdl = pdl_release(traces, cal, targets)
    if pdl is not None:
        cal["device"]["pdl_release_ns"], src["device.pdl_release_ns"] = pdl
    fork = graph_stream_fit(traces, cal, untraced, measured)
    if fork is not None:
        prof["graph_stream_ns"], src[f"host_profiles.{PROFILE}.graph_stream_ns"] = fork
    cal["name"] = f"{base.get('name', base.get('gpu'))}, llama.cpp"
    models = sorted({t.model for t in traces})
    per_tok = unmatched.groupby(["trace", "family"]).agg(ns=("exposed_ns", "sum"), tokens=("token", "nunique"))
    cal["measured"] = {
        "target": "llamacpp", "traces": [t.name for t in every], "models": models, "cupti_kernel_ns": cupti,
        "cupti_kernel_how": cupti_how, "kernels_fitted": int(len(used)), "op_fits": op_rep, "family_fits": fam_rep,
        "unmatched": [{"trace": tr, "family": fam, "exposed_ns_per_token": round(float(r.ns / r.tokens))}
                      for (tr, fam), r in per_tok.iterrows()],
    }
    try:
        parse_calibration(cal, "fitted llama.cpp calibration")
    except CalibrationError as e:  # a bug of this fit, not of the user's input
        raise RuntimeError(f"the llama.cpp fit wrote an unusable calibration: {e}") from e
    log(f"llama.cpp fit: {len(traces)} traces of {', '.join(models)}; {len(used)} kernels fitted, "
        f"{len(cal['ops'])} ops (or op/kernel pairs), {len(cal['families'])} families; CUPTI per kernel {cupti_how}")
    return cal


def main_context(traces: list[LlamaCppTrace]) -> int | None:
    """The context most of ``traces`` ran in (the smallest of a tie; None without traces): the
    captures whose cells the untraced runs measure."""
    counts = Counter(t.context for t in traces)
    return min(counts, key=lambda c: (-counts[c], c)) if counts else None


def fit_folder(folder: Path, base: dict[str, Any], measured_path: Path | None = None,
               held_out: Iterable[str] = (), log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """``fit`` of the traces in ``folder`` less the ``held_out`` models. The traces of
    ``main_context`` fit everything; those of other contexts (long-context captures:
    ``llamacpp_capture.py --context``) add their kernels to the kernel fits only, since the
    untraced cells are matched by model, layers and config."""
    traces = hold_out(read_traces(folder), held_out)
    ctx = main_context(traces)
    main = [t for t in traces if t.context == ctx]
    return fit(main, base, read_measured(measured_path, ctx), log,
               kernel_traces=[t for t in traces if t.context != ctx])
