"""The raw tables of the calibration, from executor traces (pure: CUPTI traces of the GPU or
simulator traces in the tests): per-node kernel durations, host-call periods, PDL boundaries,
graph instantiation, and the untraced host-op periods."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ...trace import Trace, rebased
from .specs import GRAPHS, GRAPHS_PDL, ModelSpec

#: the API calls that launch one kernel (runtime and driver, plain and extended)
LAUNCH_APIS = ("cuLaunchKernelEx", "cuLaunchKernel", "cudaLaunchKernel", "cudaLaunchKernelExC")
#: the calls of a host program (what the simulator charges); others (cudaGetDevice, capture
#: queries...) are part of the Python time around them
PROGRAM_APIS = r"LaunchKernel|GraphLaunch|Memcpy|Synchronize|EventRecord|StreamWaitEvent"


def _steady(ev: pd.DataFrame) -> pd.DataFrame:
    """Events of the measured tokens (all but the first token)."""
    toks = sorted(t for t in ev["token"].unique() if t >= 0)
    return ev[ev["token"] >= (toks[1] if len(toks) > 1 else 0)] if toks else ev.iloc[0:0]


def api_periods(trace: Trace) -> pd.DataFrame:
    """Each host-program call (``PROGRAM_APIS``) of the measured tokens with its ``period_ns``
    (its start to the next such call's start on the same thread: the host time the call and the
    Python around it take),
    ``issue_ns`` (call start to the start of the device work it issued), ``wait_ns`` / ``resume_ns``
    (for calls that waited for device work: from that work's end to the call's return / to the
    next call; NaN otherwise). Stamps are from the trace's first event (``rebased``)."""
    ev = rebased(trace.events)
    host = ev[(ev["row"] == "CUDA API") & ev["name"].str.contains(PROGRAM_APIS)].sort_values("start_ns", kind="stable")
    host = host.assign(next_start=host.groupby("tid")["start_ns"].shift(-1),
                       next_token=host.groupby("tid")["token"].shift(-1))
    dev = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    first_start = dev[dev["corr_id"] >= 0].groupby("corr_id")["start_ns"].min()
    host = host.assign(device_start=host["corr_id"].map(first_start))
    dev_end = np.sort(dev["end_ns"].to_numpy())
    # the device work a blocking call waited for: the last device event ending inside the call
    k = np.searchsorted(dev_end, host["end_ns"].to_numpy(), side="right") - 1
    last_end = np.where(k >= 0, dev_end[np.clip(k, 0, None)], -1)
    waited = (last_end > host["start_ns"].to_numpy()) & host["kind"].isin(["sync"]).to_numpy()
    blocking_copy = (host["name"] == "cudaMemcpy").to_numpy() & (last_end > host["start_ns"].to_numpy())
    out = host.assign(period_ns=host["next_start"] - host["start_ns"], issue_ns=host["device_start"] - host["start_ns"],
                      wait_ns=np.where(waited | blocking_copy, host["end_ns"].to_numpy() - last_end, np.nan),
                      resume_ns=np.where(waited | blocking_copy, host["next_start"].to_numpy() - last_end, np.nan),
                      last_device_end=last_end)
    return _steady(out)


def kernel_table(trace: Trace) -> pd.DataFrame:
    """Median duration, start gap after the previous kernel on its stream, step (end after that
    kernel's end: what the kernel adds to its stream, whether or not PDL started it early), and
    count of each Plan node's kernel over the measured tokens."""
    ev = rebased(trace.events)
    k = _steady(ev)
    k = k[(k["kind"] == "kernel") & (k["node"] != "")].sort_values("start_ns", kind="stable")
    if k.empty:
        return pd.DataFrame(columns=["node", "name", "duration_ns", "gap_ns", "step_ns", "n"])
    prev_end = k.groupby(["stream", "token"])["end_ns"].shift(1)
    k = k.assign(dur=k["end_ns"] - k["start_ns"], gap=k["start_ns"] - prev_end, step=k["end_ns"] - prev_end)
    calls = ev[ev["row"] == "CUDA API"].drop_duplicates("corr_id").set_index("corr_id")["end_ns"]
    # how long after its launch call returned a kernel started (large: it was queued behind others)
    k = k.assign(queued=k["start_ns"] - k["corr_id"].map(calls))
    g = k.groupby("node", sort=False)
    return pd.DataFrame({"name": g["name"].first(), "duration_ns": g["dur"].median(), "gap_ns": g["gap"].median(),
                         "step_ns": g["step"].median(),
                         "queued_ns": g["queued"].median(), "n": g["dur"].size()}).reset_index()


def boundary_table(plain: Trace, pdl: Trace) -> pd.DataFrame:
    """Per pair of consecutive kernels on one stream, the time from the first one's end to the
    second one's end without and with PDL (medians over the measured tokens), and the saving."""
    def ends(tr: Trace) -> pd.DataFrame:
        k = _steady(rebased(tr.events))
        k = k[(k["kind"] == "kernel") & (k["node"] != "")].sort_values("start_ns", kind="stable")
        k = k.assign(prev=k.groupby(["stream", "token"])["node"].shift(1),
                     step=k["end_ns"] - k.groupby(["stream", "token"])["end_ns"].shift(1),
                     overlap=k.groupby(["stream", "token"])["end_ns"].shift(1) - k["start_ns"])
        k = k.dropna(subset=["prev"])
        g = k.groupby(["prev", "node"], sort=False)
        return pd.DataFrame({"step_ns": g["step"].median(), "overlap_ns": g["overlap"].median()})

    a, b = ends(plain), ends(pdl)
    t = a.add_suffix("_plain").join(b.add_suffix("_pdl"), how="inner").reset_index()
    return t.assign(saving_ns=t["step_ns_plain"] - t["step_ns_pdl"])


def host_op_table(ops: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Periods of host ops timed by ``time_host_ops``: ``period_ns`` to the next op of the same
    token, and for a token's last op ``to_next_token_ns`` (its end to the next token's first op)."""
    df = pd.DataFrame(list(ops))
    if df.empty:
        return df
    df = df.sort_values("start_ns", kind="stable")
    nxt = df["start_ns"].shift(-1)
    same = df["token"].shift(-1) == df["token"]
    df["period_ns"] = np.where(same, nxt - df["start_ns"], np.nan)
    df["duration_ns"] = df["end_ns"] - df["start_ns"]
    df["to_next_token_ns"] = np.where(~same & df["token"].shift(-1).notna(), nxt - df["end_ns"], np.nan)
    first = df["token"].min()
    return df[df["token"] > first]  # steady tokens


def trace_tables(runs: Sequence[tuple[ModelSpec, str, Trace, Mapping[str, Any]]]) -> dict[str, Any]:
    """The raw tables of the fit from (model, strategy label, trace, info) runs: per-node
    kernel durations, host call periods, graph instantiation, PDL boundaries. ``info`` holds
    ``nodes`` (launches per token) and ``host_us_per_token``. Pure: the tests feed it
    simulator traces and check that the fit gives the simulator's parameters back."""
    kernels, periods, bounds, instantiate, rows, hostops = [], [], [], [], [], []
    by_spec: dict[ModelSpec, dict[str, Trace]] = {}
    for spec, label, tr, info in runs:
        by_spec.setdefault(spec, {})[label] = tr
        spec_cols = {f"spec_{k}": v for k, v in spec.to_dict().items()}
        kernels.append(kernel_table(tr).assign(model=spec.label, strategy=label, **spec_cols))
        ap = api_periods(tr)
        periods.append(ap[["name", "kind", "token", "start_ns", "end_ns", "period_ns", "issue_ns", "wait_ns",
                           "resume_ns", "next_token"]].assign(model=spec.label, strategy=label))
        if info.get("host_ops"):
            ho = host_op_table(info["host_ops"])
            hostops.append(ho.drop(columns=["start_ns", "end_ns"]).assign(model=spec.label, strategy=label))
        host = tr.events[tr.events["row"] == "CUDA API"]
        inst = host[host["name"].str.contains("GraphInstantiate|GraphUpload")]
        if len(inst):  # instantiate + upload of the one capture
            instantiate.append({"model": spec.label, "strategy": label, "nodes": int(info["nodes"]),
                                "ns": float((inst["end_ns"] - inst["start_ns"]).sum())})
        cap_calls = host[host["name"].str.contains("StreamBeginCapture|StreamEndCapture")]
        rows.append({"model": spec.label, "strategy": label, "host_us_per_token": info.get("host_us_per_token"),
                     **{f"spec_{k}": v for k, v in spec.to_dict().items()},
                     "tokens": int(tr.events.loc[tr.events["token"] >= 0, "token"].nunique()),
                     "untraced_us_per_token": info.get("untraced_us_per_token"),
                     "hooked_us_per_token": info.get("hooked_us_per_token"),
                     "calls_per_token": float(ap.groupby("token").size().median()) if len(ap) else 0.0,
                     "capture_call_ns": float((cap_calls["end_ns"] - cap_calls["start_ns"]).median())
                     if len(cap_calls) else float("nan"), "events": len(tr), "device": info.get("device", "")})
    for spec, traces in by_spec.items():
        if GRAPHS in traces and GRAPHS_PDL in traces:
            bt = boundary_table(traces[GRAPHS], traces[GRAPHS_PDL])
            bounds.append(bt.assign(model=spec.label, **{f"spec_{k}": v for k, v in spec.to_dict().items()}))
    return {
        "kernels": _records(pd.concat(kernels, ignore_index=True)) if kernels else [],
        "api": _records(pd.concat(periods, ignore_index=True)) if periods else [],
        "boundaries": _records(pd.concat(bounds, ignore_index=True)) if bounds else [],
        "instantiate": instantiate,
        "runs": rows,
        "host_ops": _records(pd.concat(hostops, ignore_index=True)) if hostops else [],
    }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return json.loads(df.to_json(orient="records"))


def nan_median(x: Iterable[float]) -> float:
    """Median of the values that are not None or NaN (NaN when none is left)."""
    a = np.asarray([v for v in x if v is not None and v == v], dtype=float)
    return float(np.median(a)) if len(a) else float("nan")
