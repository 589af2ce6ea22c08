"""The seeded-bug suite: every deliberately broken Plan is flagged with the right nodes and
cause, and valid knob combinations on every family's tiny preset and on llama-3.2-1b are
race-free (no false positives). ``benchmarks/verify_sweep.py`` runs the full product of knobs;
here each preset gets every sync x graphs x streams x allocator combination with the PDL
placements and fusion sets cycled through them."""

from __future__ import annotations

import itertools
import warnings

import pytest

from workbench.models import TINY_PRESETS, build_graph, preset
from workbench.strategy import Strategy
from workbench.strategy.compile import compile_plan
from workbench.verify import CAUSES, verify
from workbench.verify.seeded import SEEDED_BUGS
from workbench.verify.sweep import valid_strategies


def test_the_suite_has_at_least_15_bugs_of_every_kind_the_issue_names():
    assert len(SEEDED_BUGS) >= 15
    names = {b.name for b in SEEDED_BUGS}
    assert {"qkv-serial-reuse", "auto-serial-reuse", "pdl-wait-late", "missing-join", "host-rewrite-no-sync",
            "copy-elim-cross-stream"} <= names


@pytest.mark.parametrize("bug", SEEDED_BUGS, ids=[b.name for b in SEEDED_BUGS])
def test_seeded_bug_is_flagged_with_the_right_nodes(bug):
    report = verify(bug.plan())
    assert not report.race_free
    found = {(r.cause, r.first.node, r.second.node) for r in report.races}
    assert bug.expect in found, sorted(found)[:10]
    race = next(r for r in report.races if (r.cause, r.first.node, r.second.node) == bug.expect)
    assert race.cause in CAUSES
    text = race.text()
    for word in (bug.expect[1], bug.expect[2], race.buffer, race.why, race.fix):
        assert word in text
    assert race.lo < race.hi


def test_fixes_named_in_the_report_make_the_plan_race_free():
    """The fix a report suggests for the allocator and PDL bugs is a knob: applying it verifies."""
    bug = next(b for b in SEEDED_BUGS if b.name == "qkv-serial-reuse")
    cfg = preset(bug.model)
    plan = bug.plan(cfg)
    assert "stream-aware" in verify(plan).races[0].fix
    fixed = compile_plan(build_graph(cfg), plan.strategy.with_(allocator="stream-aware"))
    assert verify(fixed).race_free
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        late = compile_plan(build_graph(cfg), Strategy(graphs=True, pdl=True, pdl_wait="late"))
    assert "first-read" in verify(late).races[0].fix
    assert verify(compile_plan(build_graph(cfg), late.strategy.with_(pdl_wait="first-read"))).race_free


def sampled_strategies() -> list[Strategy]:
    """Every sync x graphs x streams (x max_streams) x safe-allocator combination, cycling PDL
    placements, fusion sets and logits modes through them so each value of every knob appears
    (a stride coprime with a group's 9 PDL x 15 fusion/logits entries)."""
    full = list(valid_strategies())
    core = {}
    for s in full:
        core.setdefault((s.sync, s.graphs, s.streams, s.max_streams, s.allocator), []).append(s)
    return [group[(7 * k) % len(group)] for k, group in enumerate(core.values())]


def test_sample_covers_every_knob_value():
    sample = sampled_strategies()
    for knob in ("sync", "graphs", "streams", "max_streams", "allocator", "pdl", "pdl_wait", "pdl_trigger", "fusion",
                 "logits"):
        values = {getattr(s, knob) for s in valid_strategies()}
        assert values == {getattr(s, knob) for s in sample}, knob


@pytest.mark.parametrize("model", [*TINY_PRESETS, "llama-3.2-1b"])
def test_valid_knob_combinations_are_race_free(model):
    graph = build_graph(preset(model))
    for strategy in sampled_strategies():
        report = verify(compile_plan(graph, strategy))
        assert report.race_free, f"{strategy.label()}:\n{report.text(limit=3)}"
        assert report.checked_pairs > 0


def test_valid_strategies_exclude_only_the_unsafe_knobs():
    full = list(valid_strategies())
    assert len(full) == len(set(full))
    assert not any(s.pdl_wait == "late" and s.pdl for s in full)
    assert not any(s.streams != "single" and s.allocator == "serial-reuse" for s in full)
    combos = itertools.product(("per-copy", "boundary", "implicit"), (False, True))
    assert all(any(s.sync == a and s.graphs == b for s in full) for a, b in combos)
