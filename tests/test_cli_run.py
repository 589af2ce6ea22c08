"""``workbench run``: backends, --json fields, trace files, clear errors."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.exec import cuda_backend
from workbench.strategy import Strategy
from workbench.trace.io import load_trace

JSON_KEYS = {"model", "backend", "device", "strategy", "tokens", "us_per_token", "tokens_per_s", "kernels_per_token",
             "launches_per_token", "syncs_per_token", "gpu_busy_fraction", "memory_bytes"}


def run_json(capsys, *argv: str) -> dict:
    assert main(["run", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_json_has_every_field_and_knob(capsys, monkeypatch):
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (False, "no CUDA GPU found"))
    out = run_json(capsys, "--model", "llama-tiny", "--tokens", "3", "--graphs", "--pdl", "--streams", "qkv",
                   "--sync", "implicit", "--fusion", "rms-norm-mul,copy-elim", "--allocator", "stream-aware",
                   "--pdl-wait", "start", "--pdl-trigger", "after-main-loop", "--gpu", "h200")
    assert JSON_KEYS <= set(out)
    assert out["backend"] == "sim" and "H200" in out["device"] and out["gpu"] == "h200"
    assert set(out["strategy"]) == set(Strategy().to_dict())
    assert out["strategy"]["fusion"] == ["copy-elim", "rms-norm-mul"] and out["strategy"]["pdl_trigger"] == \
        "after-main-loop"
    assert out["tokens"] == 3 and out["launches_per_token"] == 1 and out["syncs_per_token"] == 1
    assert out["us_per_token"] > 0 and out["tokens_per_s"] == pytest.approx(1e6 / out["us_per_token"])
    assert 0 < out["gpu_busy_fraction"] <= 1 and out["memory_bytes"] > 0


def test_default_backend_is_announced_on_stderr(capsys, monkeypatch):
    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (False, "CuPy is not installed"))
    assert main(["run", "--model", "llama-tiny", "--tokens", "2"]) == 0
    cap = capsys.readouterr()
    assert "backend sim (CuPy is not installed" in cap.err
    assert "us/token" in cap.out and "llama-tiny" in cap.out


def test_trace_files_round_trip(capsys, tmp_path):
    pj, pc = tmp_path / "t.json", tmp_path / "t.csv"
    out = run_json(capsys, "--model", "llama-tiny", "--tokens", "2", "--backend", "sim", "--trace", str(pj))
    assert out["trace"] == str(pj)
    back = load_trace(pj)
    kernels = back.events[back.events["kind"] == "kernel"]
    assert len(kernels) == 2 * out["kernels_per_token"]
    run_json(capsys, "--model", "llama-tiny", "--tokens", "2", "--backend", "sim", "--trace", str(pc))
    head = pc.read_text().splitlines()[0].split(",")
    assert head[:5] == ["row", "kind", "name", "start_ns", "end_ns"]


def test_reference_backend_runs_the_plan_graph(capsys):
    out = run_json(capsys, "--model", "llama-tiny", "--tokens", "2", "--backend", "reference", "--graphs",
                   "--fusion", "rms-norm-mul", "--allocator", "stream-aware")
    assert out["backend"] == "reference" and out["logits_finite"] is True and out["us_per_token"] is None


@pytest.mark.parametrize("argv, message", [
    (["--backend", "cuda"], "--backend sim"),
    (["--backend", "sim", "--gpu", "a100"], "known GPUs: h100, h100-llamacpp, h200, h200-llamacpp"),
    (["--backend", "sim", "--host-profile", "amiga"], "known: python, llama.cpp, llama.cpp-windows"),
    (["--backend", "sim", "--trace", "t.txt"], "unknown format '.txt'"),
    (["--backend", "sim", "--tokens", "0"], "--tokens 0 is out of range"),
    (["--backend", "sim", "--tokens", "600"], "raise --context"),
])
def test_errors_name_the_problem_and_the_fix(capsys, monkeypatch, argv, message):
    if argv[:2] == ["--backend", "cuda"]:
        monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (False, "CuPy is not installed"))
    assert main(["run", "--model", "llama-tiny", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cuda_backend_gets_the_plans_and_token_ids(monkeypatch):
    """With a GPU present, ``--backend cuda`` hands the backend one Plan per step (built once,
    for the device's compute capability) and the seeded token ids."""
    seen = {}

    def run(self, req):
        seen.update(cfg=req.cfg.name, strategy=req.strategy, tokens=req.token_ids, plans=req.plans)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cuda_backend, "cuda_available", lambda: (True, "1 CUDA device(s)"))
    monkeypatch.setattr(cuda_backend.CudaBackend, "compute_capability", lambda self, opts: (9, 0))
    monkeypatch.setattr(cuda_backend.CudaBackend, "run", run)
    assert main(["run", "--model", "llama-tiny", "--tokens", "3", "--backend", "cuda", "--pdl"]) == 2
    assert seen["cfg"] == "llama-tiny" and seen["strategy"].pdl and len(seen["tokens"]) == 3
    assert len(seen["plans"]) == 3 and seen["plans"][0] is seen["plans"][2]  # one Plan per padded KV length


@pytest.mark.parametrize("text, tokens, expected", [
    ("2", 8, ("graph", (6, 7))), ("0", 8, ("graph", ())), ("all", 8, ("node", ())), ("8", 8, ("node", ())),
])
def test_node_tokens_flag_picks_graph_level_tracing(text, tokens, expected):
    from workbench.validate import node_tokens_arg

    assert cuda_backend.graph_trace_mode(node_tokens_arg(text), tokens) == expected


@pytest.mark.parametrize("text", ["-1", "some"])
def test_node_tokens_flag_errors_name_the_fix(text):
    from workbench.validate import node_tokens_arg

    with pytest.raises(ValueError, match="--node-tokens"):
        node_tokens_arg(text)
