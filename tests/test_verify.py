"""Happens-before semantics of the verifier on small hand-built Plans, the interval sweep
against a naive all-pairs check, and the ``workbench verify`` command."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import pytest

from workbench.cli import main as cli_main
from workbench.graph import GraphBuilder, View
from workbench.models import build_graph, preset
from workbench.strategy import Strategy
from workbench.strategy.compile import compile_plan
from workbench.strategy.plan import HOST_OPS, HostOp, Plan
from workbench.verify import PlanFormatError, build, collect, find_races, verify
from workbench.verify.seeded import hand_plan, on_stream, seeded_bug, with_host_program


def races_of(plan: Plan) -> set[tuple[str, str, str]]:
    return {(r.cause, r.first.node, r.second.node) for r in verify(plan).races}


@pytest.fixture(scope="module")
def tiny():
    return build_graph(preset("llama-tiny"))


def compiled(graph, **knobs) -> Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_plan(graph, Strategy(**knobs))


# -- PDL ----------------------------------------------------------------------------------------
def abc_plan() -> Plan:
    """A and B independent, C = A + B; all on stream 0 in order A, B, C."""
    b = GraphBuilder("abc")
    x = b.input("inp_x", (1, 64), "f32")
    a = b.op("MUL", "A", [x, b.weight("w1", (64,), "f32")], (1, 64))
    bb = b.op("MUL", "B", [x, b.weight("w2", (64,), "f32")], (1, 64))
    b.output("logits", b.op("ADD", "C", [a, bb], (1, 64), kind="output"))
    return hand_plan(b.build(), [(0, (), ())] * 3, Strategy(pdl=True))


def with_pdl(plan: Plan, **per_node: dict) -> Plan:
    return replace(plan, launches=[replace(la, **per_node.get(la.node.name, {})) for la in plan.launches])


@pytest.mark.parametrize("trigger_b, expected", [
    ("start", {("pdl-trigger", "A", "C"), ("pdl-early-read", "B", "C")}),
    ("after-main-loop", {("pdl-early-read", "B", "C")}),
    ("end", {("pdl-early-read", "B", "C")}),
    ("none", {("pdl-early-read", "B", "C")}),
])
def test_pdl_late_wait_races_depend_on_the_predecessors_trigger(trigger_b, expected):
    plan = with_pdl(abc_plan(), B=dict(pdl=True, wait="first-read", trigger=trigger_b),
                    C=dict(pdl=True, wait="late", trigger="none"))
    assert races_of(plan) == expected


def test_pdl_first_read_and_start_waits_are_race_free_whatever_the_trigger():
    for wait in ("start", "first-read"):
        for trig in ("start", "after-main-loop", "end", "none"):
            plan = with_pdl(abc_plan(), A=dict(trigger=trig), B=dict(pdl=True, wait=wait, trigger=trig),
                            C=dict(pdl=True, wait=wait, trigger=trig))
            assert races_of(plan) == set(), (wait, trig)


def test_a_plain_launch_between_orders_the_non_predecessor():
    # B launched without PDL starts after A completes, so C's early read of A is ordered even
    # though B triggers at start; C's early read of B still races.
    plan = with_pdl(abc_plan(), B=dict(pdl=False, trigger="start"), C=dict(pdl=True, wait="late"))
    assert races_of(plan) == {("pdl-early-read", "B", "C")}


# -- events -------------------------------------------------------------------------------------
def event_plan(rerecord: bool) -> Plan:
    """K1 and K3 on stream 0 both record event 0; K2 on stream 1 waits on it and reads K3's output."""
    b = GraphBuilder("events")
    x = b.input("inp_x", (1, 64), "f32")
    w = b.weight("w", (64, 64), "f16")
    a = b.op("MUL_MAT", "K1", [w, x], (1, 64))
    c = b.op("MUL_MAT", "K3", [w, a], (1, 64))
    d = b.op("ADD", "K2", [c, x], (1, 64))
    b.output("logits", b.op("ADD", "K4", [d, a], (1, 64), kind="output"))
    placed = [(0, (), (0,)), (0, (), (0,) if rerecord else ()), (1, (0,), (1,)), (0, (1,), ())]
    return hand_plan(b.build(), placed, Strategy(streams="auto"))


def test_a_wait_binds_to_the_latest_record_issued_before_it():
    assert races_of(event_plan(rerecord=True)) == set()
    assert races_of(event_plan(rerecord=False)) == {("missing-event", "K3", "K2")}


def test_waiting_on_a_never_recorded_event_is_a_noted_no_op():
    plan = event_plan(rerecord=True)
    plan = replace(plan, host_program=[h for h in plan.host_program if not (h.kind == "event_record" and h.event == 1)])
    report = verify(plan)
    assert any("never recorded" in n for n in report.notes)
    assert ("missing-event", "K2", "K4") in races_of(plan)


# -- host program -------------------------------------------------------------------------------
def test_blocking_pageable_copy_returns_before_its_dma_lands(tiny):
    """cudaMemcpy from pageable memory syncs its stream, stages the buffer and returns: on
    another stream the last copy's DMA (the mask) is unordered with the kernels; from pinned
    memory the call waits for the copy."""
    plan = with_host_program(compiled(tiny), on_stream(("memcpy_h2d",), 1))
    assert races_of(plan) == {("missing-event", "memcpy_h2d kq_mask", "kqv_out-0"),
                              ("missing-event", "memcpy_h2d kq_mask", "kqv_out-1")}
    pinned = with_host_program(plan, lambda ops: [replace(h, host_buffer="pinned") if h.kind == "memcpy_h2d" else h
                                                  for h in ops])
    assert races_of(pinned) == set()


def test_per_copy_without_final_sync_only_races_on_the_logits(tiny):
    # blocking copies stage the pageable inputs before returning: rewriting them is safe
    plan = with_host_program(compiled(tiny), lambda ops: ops[:-1])
    assert {c for c, _, _ in races_of(plan)} == {"host-read"}


def test_device_sync_joins_every_stream():
    plan = seeded_bug("side-stream-not-joined").plan()
    assert races_of(plan)
    fixed = with_host_program(plan, lambda ops: [HostOp("device_sync", HOST_OPS["device_sync"][0])
                                                 if h.kind == "stream_sync" else h for h in ops])
    assert races_of(fixed) == set()


def test_unknown_host_op_is_a_clear_error(tiny):
    plan = with_host_program(compiled(tiny), lambda ops: [HostOp("memset", "cudaMemsetAsync"), *ops])
    with pytest.raises(PlanFormatError, match="unknown host op kind 'memset'"):
        verify(plan)


# -- byte ranges --------------------------------------------------------------------------------
def strided_plan(rows_b: tuple[int, int]) -> Plan:
    """After a fork, W1 on stream 0 writes cache rows 0 and 2 (one strided view) and W2 on
    stream 1 rows ``rows_b``; both join before the output."""
    b = GraphBuilder("strided")
    x = b.input("inp_x", (1, 64), "f32")
    cache = b.cache("cache", (4, 64), "f32")
    buf, row = cache.buffer, 64 * 4
    even = View(buf, 0, (2, 64), (2 * row, 4), "f32")
    other = View(buf, rows_b[0] * row, (2, 64), ((rows_b[1] - rows_b[0]) * row, 4), "f32")
    f = b.op("ADD", "fork", [x, x], (1, 64))
    b.node("ADD", "W1", [x, x], [even])
    b.node("ADD", "W2", [f, x], [other])
    b.output("logits", b.op("ADD", "result_output", [x, x], (1, 64), kind="output"))
    placed = [(0, (), (0,)), (0, (), ()), (1, (0,), (1,)), (0, (1,), ())]
    return hand_plan(b.build(), placed, Strategy(streams="auto"))


def test_strided_views_conflict_only_on_shared_bytes():
    assert races_of(strided_plan((1, 3))) == set()
    assert races_of(strided_plan((1, 2))) == {("missing-event", "W1", "W2")}


def naive_races(plan: Plan, tokens: int = 2):
    """All pairs, no sweep: the definition the fast path must match."""
    hb = build(plan, tokens)
    acc = collect(hb).accesses
    races, checked = set(), 0
    for i in range(len(acc)):
        for j in range(i + 1, len(acc)):
            a, b = acc[i], acc[j]
            if a.op == b.op or not (a.write or b.write) or not a.view.overlaps(b.view):
                continue
            checked += 1
            if a.op > b.op:
                a, b = b, a
            if not hb.before(a.end, b.begin):
                races.add((a.op, b.op, a.view.buffer.name, a.role, b.role))
    return races, checked


@pytest.mark.parametrize("knobs", [
    dict(), dict(streams="qkv", graphs=True), dict(streams="auto", allocator="stream-aware", pdl=True),
    dict(pdl=True, graphs=True, pdl_wait="late", fusion={"copy-elim", "rms-norm-mul"}, sync="implicit"),
])
def test_interval_sweep_matches_all_pairs(tiny, knobs):
    plan = compiled(tiny, **knobs)
    hb = build(plan, 2)
    table = collect(hb)
    pairs, checked = find_races(hb, table)
    fast = {(table.accesses[p.first].op, table.accesses[p.second].op, table.accesses[p.first].view.buffer.name,
             table.accesses[p.first].role, table.accesses[p.second].role) for p in pairs}
    slow, slow_checked = naive_races(plan)
    assert fast == slow
    assert checked == slow_checked


def test_three_tokens_find_what_two_find(tiny):
    plan = seeded_bug("host-rewrite-no-sync").plan()
    two, three = verify(plan, tokens=2), verify(plan, tokens=3)
    assert {(r.cause, r.first.node) for r in two.races} == {(r.cause, r.first.node) for r in three.races}
    assert len(three.races) > len(two.races)


# -- the command --------------------------------------------------------------------------------
def test_cli_exit_codes_and_json(capsys):
    assert cli_main(["verify", "--model", "llama-tiny", "--graphs", "--streams", "qkv",
                     "--allocator", "stream-aware", "--pdl"]) == 0
    assert "race-free" in capsys.readouterr().out
    assert cli_main(["verify", "--model", "llama-tiny", "--streams", "qkv", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["checked_pairs"] > 0 and out["races"]
    race = out["races"][0]
    assert race["cause"] == "allocator-reuse" and "stream-aware" in race["fix"]
    assert {"node", "stream", "token", "role", "view"} <= set(race["first"])
