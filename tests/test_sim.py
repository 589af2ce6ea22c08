"""The simulator on small hand-built Plans (exact timings against the calibration), on real
models (trace schema, memoized replays equal full simulation) and the calibration files."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import workbench
from workbench.exec.calibration import CALIBRATION_DIR, CalibrationError, load_calibration, parse_calibration
from workbench.exec.cost import kernel_cost
from workbench.exec.sim import simulate
from workbench.graph import GraphBuilder
from workbench.models import TINY_PRESETS, preset
from workbench.strategy import ALL_ON, Allocation, HostOp, Launch, Plan, Strategy
from workbench.strategy.steps import plans_for_steps
from workbench.trace import API_ROW, COLUMNS
from workbench.trace.stats import device_gaps, summarize

#: the exact-timing tests are written against the datasheet-era H100 file's documented numbers
#: (reference/gpu-notes.md), kept verbatim in data/bench since h100.json became the measured one
CAL = load_calibration(path=CALIBRATION_DIR.parents[1] / "data" / "bench" / "calibration_h100_datasheet.json")


# -------------------------------------------------------------------------------------------
# hand-built plans
# -------------------------------------------------------------------------------------------
def _plan(nodes_streams, host, pdl=False, wait="first-read", trigger="start", events=None):
    """A Plan over the given (node, stream) pairs; ``events[i] = (wait_events, record_events)``."""
    b, launches = nodes_streams
    strategy = Strategy(pdl=pdl)
    graph = b.build()
    seen: set[int] = set()
    out = []
    for i, (node, s) in enumerate(launches):
        enrolled = pdl and s in seen
        seen.add(s)
        we, re_ = (events or {}).get(i, ((), ()))
        out.append(Launch(i, node, s, enrolled, wait if enrolled else "start", trigger if pdl else "none", we, re_))
    return Plan(graph=graph, source=graph, strategy=strategy, launches=out, host_program=host(out),
                allocation=Allocation("no-reuse", {}, 0, 0), n_streams=1 + max(s for _, s in launches))


def _tiny_chain(n: int):
    """``n`` ADDs on one f32: kernels whose work is negligible, like the probes' empty kernels."""
    b = GraphBuilder("chain")
    x = b.input("x", (1, 1), "f32")
    nodes = []
    for i in range(n):
        x = b.op("ADD", f"add-{i}", [x, x], (1, 1))
        nodes.append((b.nodes[-1], 0))
    return b, nodes


def _graph_program(launches):
    return [HostOp("graph_launch", "cudaGraphLaunch", 0), HostOp("stream_sync", "cudaStreamSynchronize", 0)]


def _eager_program(launches):
    ops = []
    for la in launches:
        ops += [HostOp("stream_wait_event", "cudaStreamWaitEvent", la.stream, event=e) for e in la.wait_events]
        ops.append(HostOp("launch", "cuLaunchKernelEx" if la.pdl else "cudaLaunchKernel", la.stream, launch=la.index))
        ops += [HostOp("event_record", "cudaEventRecord", la.stream, event=e) for e in la.record_events]
    return ops + [HostOp("stream_sync", "cudaStreamSynchronize", 0)]


def _kernels(trace, token=None):
    k = trace.events[trace.events["kind"] == "kernel"]
    if token is not None:
        k = k[k["token"] == token]
    return k.sort_values("start_ns", kind="stable")


def _per_kernel_ns(trace, token=1):
    k = _kernels(trace, token)
    return (k["end_ns"].iloc[-1] - k["start_ns"].iloc[0]) / len(k)


def test_graph_replay_reproduces_measured_chain_timings():
    """gpu-notes.md: 64-kernel chains of empty kernels take 1.08 us/kernel under graph replay and
    0.80 us/kernel under graph + PDL; the calibration must give these back."""
    plain = simulate([_plan(_tiny_chain(64), _graph_program)] * 3, CAL)
    pdl = simulate([_plan(_tiny_chain(64), _graph_program, pdl=True, wait="start")] * 3, CAL)
    assert _per_kernel_ns(plain) == pytest.approx(1080, abs=5)
    assert _per_kernel_ns(pdl) == pytest.approx(800, abs=10)
    k = _kernels(pdl, 1)
    starts = np.diff(k["start_ns"].to_numpy())
    # each PDL kernel starts pdl_launch_ns after its predecessor (trigger at start) and overlaps it
    assert starts[0] == pytest.approx(CAL.pdl_launch_ns, abs=2)
    assert (k["start_ns"].to_numpy()[1:] < k["end_ns"].to_numpy()[:-1]).all()


def test_eager_launches_are_host_bound():
    """gpu-notes.md: eager Python launches cost ~6.4 us each, so kernels are spaced by the launch
    cost, and PDL makes eager chains slower (7.6 us per launch), not faster."""
    plain = simulate([_plan(_tiny_chain(32), _eager_program)] * 2, CAL)
    pdl = simulate([_plan(_tiny_chain(32), _eager_program, pdl=True)] * 2, CAL)
    gaps = np.diff(_kernels(plain, 1)["start_ns"].to_numpy())
    assert np.allclose(gaps, CAL.host.launch_ns, atol=2)
    assert _per_kernel_ns(pdl) > _per_kernel_ns(plain)
    api = plain.events[plain.events["row"] == API_ROW]
    assert (api[api["token"] == 1]["name"] == "cudaLaunchKernel").sum() == 32


def test_pdl_trigger_placement_orders_the_gain():
    """Trigger at start overlaps most; after-main-loop less; none gives nothing (the next kernel
    launches when its predecessor completes, as without PDL)."""
    b = GraphBuilder("mv")
    x = b.input("x", (1, 2048), "f16")
    nodes = []
    for i in range(16):
        w = b.weight(f"w{i}", (2048, 2048), "f16")
        x = b.op("MUL_MAT", f"mv-{i}", [w, x], (1, 2048))
        nodes.append((b.nodes[-1], 0))
    t = {}
    for trig in ("start", "after-main-loop", "end", "none"):
        tr = simulate([_plan((b, nodes), _graph_program, pdl=True, trigger=trig)] * 2, CAL)
        t[trig] = _per_kernel_ns(tr)
    base = _per_kernel_ns(simulate([_plan((b, nodes), _graph_program)] * 2, CAL))
    assert t["start"] <= t["after-main-loop"] <= t["end"] < base
    assert t["none"] == pytest.approx(base, abs=1)


def test_concurrent_kernels_share_the_gpu():
    """Fork/join: two small-grid kernels on two streams overlap almost fully (their caps fit the
    GPU, like gpu-notes' 3 x 8-block fork/join: 146 -> 53 us); two bandwidth-bound full-grid
    mat-vecs share the DRAM bandwidth, so together they take about the sum of their work."""
    def fork(shape, blocks_note):
        b = GraphBuilder(blocks_note)
        x = b.input("x", (1, shape[1]), "f16")
        root = b.op("SCALE", "root", [x], x.shape, dtype="f16")
        w0, w1 = b.weight("w0", shape, "f16"), b.weight("w1", shape, "f16")
        b.op("MUL_MAT", "left", [w0, root], (1, shape[0]))
        b.op("MUL_MAT", "right", [w1, root], (1, shape[0]))
        nodes = [(b.nodes[0], 0), (b.nodes[1], 0), (b.nodes[2], 1)]
        return b, nodes

    for shape, note in (((8, 1 << 20), "small"), ((8192, 8192), "big")):
        bn = fork(shape, note)
        ev = {0: ((), (0,)), 2: ((0,), ())}
        plan = _plan(bn, _graph_program, events=ev)
        k = _kernels(simulate([plan] * 2, CAL), 1).set_index("node")
        cost = kernel_cost(bn[0].nodes[1], CAL)
        alone = cost.duration_ns
        left, right = k.loc["left"], k.loc["right"]
        assert right["start_ns"] < left["end_ns"] and left["start_ns"] < right["end_ns"], note
        span = max(left["end_ns"], right["end_ns"]) - min(left["start_ns"], right["start_ns"])
        if note == "small":
            assert cost.cap < 0.5
            assert span < 1.1 * alone
        else:
            assert cost.cap == 1.0
            assert span == pytest.approx(cost.fixed_ns + 2 * cost.work_ns, rel=0.05)


def test_host_syncs_and_blocking_copies_wait_for_the_device():
    b, nodes = _tiny_chain(4)

    def program(launches):
        return [HostOp("memcpy_h2d", "cudaMemcpy", 0, tensor="x", nbytes=4096, blocking=True, host_buffer="pageable"),
                *(HostOp("launch", "cudaLaunchKernel", 0, launch=la.index) for la in launches),
                HostOp("memcpy_d2h", "cudaMemcpyAsync", 0, tensor="x", nbytes=4, host_buffer="pinned"),
                HostOp("device_sync", "cudaDeviceSynchronize", -1)]

    tr = simulate([_plan((b, nodes), program)] * 2, CAL)
    ev = tr.events[tr.events["token"] == 1]
    api, cp = ev[ev["row"] == API_ROW].set_index("name"), ev[ev["kind"] == "memcpy"].set_index("copy_kind")
    h2d = cp.loc["H2D"]
    assert h2d["bytes"] == 4096 and h2d["node"] == "x" and h2d["name"].startswith("[CUDA memcpy Host-to-Device]")
    # gpu-notes: 4 KB pageable H2D + sync 8.2 us, here as one blocking copy
    assert api.loc["cudaMemcpy", "end_ns"] - api.loc["cudaMemcpy", "start_ns"] == pytest.approx(8200, abs=10)
    assert api.loc["cudaMemcpy", "end_ns"] == h2d["end_ns"] + CAL.host.sync_wakeup_ns
    sync = api.loc["cudaDeviceSynchronize"]
    assert sync["kind"] == "sync"
    assert sync["end_ns"] == cp.loc["D2H", "end_ns"] + CAL.host.sync_wakeup_ns
    assert cp.loc["D2H", "start_ns"] >= _kernels(tr, 1)["end_ns"].max()


# -------------------------------------------------------------------------------------------
# real models
# -------------------------------------------------------------------------------------------
def test_trace_schema_correlation_tokens_and_nodes():
    run = workbench.run(preset("llama-3.2-1b", layers=2), ALL_ON.with_(sync="per-copy"), tokens=3, backend="sim",
                        gpu="h100")
    ev = run.trace.events
    assert list(ev.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert (ev["token"] >= 0).all() and sorted(ev["token"].unique()) == [0, 1, 2]
    assert set(ev["kind"]) == {"api", "sync", "kernel", "memcpy"}
    assert set(ev.loc[ev["kind"] != "kernel", "row"]) >= {API_ROW, "Stream 0"}
    assert set(ev.loc[ev["kind"] == "kernel", "row"]) == {"Stream 0", "Stream 1", "Stream 2"}
    dev = ev[ev["kind"].isin(["kernel", "memcpy"])]
    api = ev[ev["row"] == API_ROW]
    assert set(dev["corr_id"]) <= set(api["corr_id"])
    # one cudaGraphLaunch per token owns all of that token's kernels
    for t in (1, 2):
        k = dev[(dev["kind"] == "kernel") & (dev["token"] == t)]
        (corr,) = k["corr_id"].unique()
        assert api.set_index("corr_id").loc[corr, "name"] == "cudaGraphLaunch"
        assert len(k) == len(run.plan.launches) and (k["node"] != "").all() and (k["graph_id"] > 0).all()
    memcpy = ev[ev["kind"] == "memcpy"]
    assert set(memcpy["copy_kind"]) == {"H2D", "D2H"} and (memcpy["bytes"] > 0).all()
    assert run.stats["syncs_per_token"] == 5  # per-copy: 4 input syncs + the final one
    assert run.stats["launches_per_token"] == 1


def test_memoized_replays_equal_full_simulation():
    """Reusing a replay's timings is exact: the same table as simulating every kernel
    (up to float rounding of 1 ns), across a KV-length change (re-capture) too."""
    cfg = preset("llama-3.2-1b", layers=3, context=600)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for st in (ALL_ON, Strategy(graphs=True, pdl=True, pdl_wait="late", pdl_trigger="after-main-loop"),
                   Strategy(graphs=True, streams="auto", sync="boundary")):
            plans = plans_for_steps(cfg, st, 12, start_pos=250, device_cc=CAL.compute_capability)
            a = simulate(plans, CAL, memo=True).events
            b = simulate(plans, CAL, memo=False).events
            assert len(a) == len(b)
            for col in a.columns:
                if col in ("start_ns", "end_ns"):
                    assert np.abs(a[col].to_numpy() - b[col].to_numpy()).max() <= 1, (st.label(), col)
                else:
                    assert (a[col].to_numpy() == b[col].to_numpy()).all(), (st.label(), col)


def test_kv_growth_recaptures_the_graph():
    cfg = preset("llama-3.2-1b", layers=2, context=1024)
    # n_kv 256, 256, 512, 512
    run = workbench.run(cfg, Strategy(graphs=True), tokens=4, backend="sim", gpu="h100", start_pos=254)
    ev = run.trace.events
    inst = ev[ev["name"] == "cudaGraphInstantiate"]
    assert list(inst["token"]) == [0, 2]
    assert sorted(ev.loc[ev["kind"] == "kernel", "graph_id"].unique()) == [1, 2]


@pytest.mark.parametrize("model", TINY_PRESETS)
def test_tiny_presets_simulate_under_knob_combinations(model):
    cfg = preset(model)
    combos = [Strategy(), ALL_ON, Strategy(streams="auto", pdl=True, pdl_trigger="after-main-loop", sync="boundary"),
              Strategy(graphs=True, streams="qkv", fusion=frozenset({"copy-elim"}), allocator="no-reuse")]
    for st in combos:
        run = workbench.run(cfg, st, tokens=3, backend="sim", gpu="h100")
        s = run.stats
        assert s["us_per_token"] > 0 and 0 < s["gpu_busy_fraction"] <= 1
        assert s["kernels_per_token"] == len(run.plan.launches)


def test_stats_gaps_name_the_host_cause():
    run = workbench.run(preset("llama-3.2-1b", layers=2), Strategy(), tokens=3, backend="sim", calibration=CAL)
    gaps = device_gaps(run.trace)
    host = gaps[gaps["cause"] == "host"]
    # eager: kernels wait for their launches; the gap after each is a launch minus a kernel
    assert len(host) > 0 and set(host["api"]) >= {"cudaLaunchKernel"}
    s = summarize(run.trace)
    assert s["largest_host_gaps"][0]["gap_us"] >= s["largest_host_gaps"][-1]["gap_us"]
    assert s["host_gap_us_per_token"] > 0.3 * s["us_per_token"]


def test_h200_is_faster_and_host_profiles_apply():
    cfg = preset("llama-3.2-1b", layers=2)
    # the H200's faster HBM streams the lm_head mat-vec sooner
    from workbench.models import build_graph

    lm_head = build_graph(cfg).node("result_output")
    h100, h200 = (kernel_cost(lm_head, load_calibration(g)).duration_ns for g in ("h100", "h200"))
    assert h200 < h100
    eager = Strategy()
    py = workbench.run(cfg, eager, tokens=3, backend="sim", gpu="h100").stats["us_per_token"]
    cpp = workbench.run(cfg, eager, tokens=3, backend="sim", gpu="h100", host="llama.cpp").stats["us_per_token"]
    assert cpp < py


# -------------------------------------------------------------------------------------------
# calibration files
# -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_calibration_files_source_every_field(gpu):
    data = json.loads((CALIBRATION_DIR / f"{gpu}.json").read_text())
    cal = parse_calibration(data)
    assert cal.compute_capability == (9, 0) and cal.sm_count == 132
    assert set(cal.host_profiles) >= {"python", "llama.cpp", "llama.cpp-windows"}
    for key, text in data["sources"].items():
        assert any(w in text for w in ("measured", "derived", "datasheet", "assumed", "issue 3", "same as",
                                       "CUDA C++", "public measurement", "not measured")), key
    broken = json.loads(json.dumps(data))
    del broken["sources"]["device.kernel_fixed_ns"]
    with pytest.raises(CalibrationError, match="without a source"):
        parse_calibration(broken)
    broken = json.loads(json.dumps(data))
    broken["device"]["dram_efficiency"] = 1.5
    with pytest.raises(CalibrationError, match="dram_efficiency"):
        parse_calibration(broken)


def test_unknown_gpu_and_profile_errors_list_the_known_ones():
    with pytest.raises(CalibrationError, match="known GPUs: h100, h100-llamacpp, h200, h200-llamacpp"):
        load_calibration("a100")
    with pytest.raises(CalibrationError, match="llama.cpp-windows"):
        load_calibration("h100", host="macos")
    cal = CAL.with_host("llama.cpp-windows", launch_ns=9000)
    assert cal.host.launch_ns == 9000 and cal.host.sync_wakeup_ns > CAL.host.sync_wakeup_ns
    assert math.isclose(CAL.dram_Bpns, 3350 * 0.84)


def test_stats_work_on_traces_the_simulator_did_not_make():
    """The same statistics on a hand-laid trace (the timeline fixture): eager launches vs one
    graph launch per token, syncs from the API rows, and a trace without token indices."""
    from fixtures.synthetic import synthetic_trace

    eager, graphs = summarize(synthetic_trace(4, 2, graphs=False)), summarize(synthetic_trace(4, 2, graphs=True))
    assert eager["tokens"] == graphs["tokens"] == 4 and eager["measured_tokens"] == 3
    assert eager["kernels_per_token"] == graphs["kernels_per_token"] == 34
    assert eager["launches_per_token"] == 34 and graphs["launches_per_token"] == 1
    assert graphs["us_per_token"] < eager["us_per_token"]
    tr = synthetic_trace(4, 2, graphs=True)
    tr.events["token"] = -1
    whole = summarize(tr)
    assert whole["measured_tokens"] == 1 and whole["kernels_per_token"] == 4 * 34
