"""--logits zero-copy: the logits' kernel writes them into mapped pinned host memory, so the host
program has no D2H copy; the simulator, the verifier, the CLI and the llamacpp backend honour it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import workbench
from workbench.cli import main
from workbench.exec import cuda_backend
from workbench.exec.calibration import load_calibration
from workbench.exec.cost import memcpy_ns
from workbench.llamacpp.switches import BuildInfo, SwitchError, switches_for
from workbench.models import build_graph, preset
from workbench.strategy import ALL_ON, Strategy, StrategyError, compile_plan
from workbench.strategy.host import mapped_outputs, pattern
from workbench.verify import verify

ZC = ALL_ON.with_(logits="zero-copy")


def test_host_program_drops_only_the_d2h_copy():
    g = build_graph(preset("llama-tiny"))
    copy, zc = (compile_plan(g, s) for s in (ALL_ON, ZC))
    assert pattern(copy.host_program) == "a a a a g d s" and pattern(zc.host_program) == "a a a a g s"
    assert mapped_outputs(g, copy.host_program) == [] and mapped_outputs(g, zc.host_program) == ["logits"]
    assert zc.strategy.label() == ALL_ON.label() + "+logits-zero-copy"
    with pytest.raises(StrategyError, match="--logits 'mapped' is not one of copy, zero-copy"):
        Strategy(logits="mapped")


def test_simulator_saves_the_logits_copy():
    """The simulated token is shorter by about what the calibration charges the D2H copy of a
    vocabulary of float32 logits (llama-3.2-1b: 128256 x 4 bytes over PCIe)."""
    copy_ns = memcpy_ns(128256 * 4, load_calibration("h200"))
    us = {s.logits: workbench.run("llama-3.2-1b", s, tokens=6, layers=2, backend="sim", gpu="h200",
                                  quiet=True).stats["us_per_token"] for s in (ALL_ON, ZC)}
    assert us["copy"] - us["zero-copy"] == pytest.approx(copy_ns / 1e3, rel=0.5)


def test_verifier_reads_the_mapped_output_after_the_final_sync():
    """Race-free as compiled; without the final sync the host reads the logits while the kernel
    that writes them into mapped memory may still run: a host-read race on the output."""
    g = build_graph(preset("llama-tiny"))
    plan = compile_plan(g, ZC)
    assert verify(plan).race_free
    broken = replace(plan, host_program=plan.host_program[:-1])
    races = verify(broken).races
    assert any(r.cause == "host-read" and "zero-copy output" in r.why and r.second.node.startswith("host reads logits")
               for r in races), races


def test_llamacpp_has_no_switch_for_it(tmp_path: Path):
    build = BuildInfo(tmp_path, True, True, True)
    with pytest.raises(SwitchError, match="--logits zero-copy"):
        switches_for(ZC.with_(fusion=frozenset(), allocator="serial-reuse", pdl=False, streams="single"), build)


def test_cli_flag(capsys, monkeypatch):
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (False, "no CUDA GPU found"))
    assert main(["run", "--model", "llama-tiny", "--tokens", "3", "--graphs", "--logits", "zero-copy", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"]["logits"] == "zero-copy"
