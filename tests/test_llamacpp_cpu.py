"""The real llama.cpp on CPU: GGUF round trip for every family's tiny preset, and clear errors.

llama.cpp is built once from the peer tree (``python -m workbench.llamacpp.build``, cached under
``~/.cache/workbench/llama.cpp``); the tests that run it are ``slow`` but run in CI.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.exec.backend import BackendError, RunRequest
from workbench.exec.llamacpp import LlamaCppBackend, LlamaCppOptions
from workbench.models import TINY_PRESETS, build_graph, load_config, preset
from workbench.models.gguf_write import GGUFWriteError, add_metadata, cached_gguf, write_gguf
from workbench.models.tokens import token_ids
from workbench.models.weights import random_weight, random_weights
from workbench.strategy import Strategy

CONTEXT = 64
TOKENS = 8

#: llama.cpp's CPU backend multiplies f16 weights with activations it first rounds to f16
#: (ggml-cpu's vec_dot_type for F16 is F16), accumulating in f32; the reference keeps the
#: activations in f32. One rounding is a relative 2^-11 = 4.9e-4 per element, partly averaging
#: out over a dot product and compounding over layers: the worst cases on these presets are
#: 3.0e-4 .. 6.8e-4 of the largest logit (data/bench/llamacpp_cpu_parity.md). 4e-3 of the largest
#: logit (8 f16 ulps) leaves room for other CPUs' summation orders and still fails a layout error
#: (the Q/K permutation test: 0.27).
REL_TOL = 4e-3


def within_tolerance(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """(every token's logits within REL_TOL of its largest |logit|, worst relative error)."""
    err = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    return bool((err <= REL_TOL).all()), float(err.max())




def run_llamacpp(lib: str, cfg, strategy: Strategy | None = None, tokens=None, **opts):
    strategy = strategy or Strategy()
    ids = tokens if tokens is not None else ref_tokens(cfg)
    req = RunRequest(cfg, strategy, [], ids, options=LlamaCppOptions(build=lib, threads=2, **opts))
    return LlamaCppBackend().run(req)


def ref_tokens(cfg) -> list[int]:
    return token_ids(cfg, TOKENS, 7)


def reference_logits(cfg, tokens) -> np.ndarray:
    from workbench.exec.reference import run_reference

    return run_reference(cfg, random_weights(build_graph(cfg), 0), tokens).logits


def comparable(cfg):
    """The config the reference must run to match llama.cpp: llama.cpp's YaRN always rounds its
    correction range to whole dimensions (``ggml_rope_yarn_corr_dims`` floors/ceils), which is
    HF's ``truncate: true``; gpt-oss's config.json says ``false``."""
    if cfg.model_type == "gpt_oss":
        cfg = cfg.with_()
        cfg.hf["rope_scaling"]["truncate"] = True
    return cfg


# ------------------------------------------------------------------------------------------ writer (no llama.cpp)

def test_random_weight_is_random_weights_one_tensor_at_a_time():
    graph = build_graph(preset("qwen3-next-tiny", context=CONTEXT))
    all_w = random_weights(graph, 3)
    for name in list(graph.weights)[::7]:
        np.testing.assert_array_equal(random_weight(graph, name, 3), all_w[name])


def test_gguf_has_the_converters_names_and_reads_back_as_the_same_config(tmp_path):
    import gguf

    cfg = preset("llama-tiny", context=CONTEXT)
    path = write_gguf(cfg, tmp_path / "llama.gguf")
    r = gguf.GGUFReader(str(path))
    names = {t.name for t in r.tensors}
    assert {"token_embd.weight", "rope_freqs.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight",
            "output_norm.weight", "output.weight"} <= names
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == cfg.get("vocab_size")
    back = load_config(str(path), context=CONTEXT)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "tie_word_embeddings"):
        assert back.get(key) == cfg.get(key), key
    from workbench.models.rope import rope_params
    np.testing.assert_allclose(rope_params(back)[0], rope_params(cfg)[0], rtol=1e-6)


def test_writer_errors_name_the_fix(tmp_path):
    with pytest.raises(GGUFWriteError, match="--qtype 'q6_k' is not supported"):
        write_gguf(preset("llama-tiny"), tmp_path / "x.gguf", qtype="q6_k")


def test_gguf_command(tmp_path, capsys):
    from workbench.cli import main

    out = tmp_path / "q.gguf"
    assert main(["gguf", "--model", "qwen3-moe-tiny", "--qtype", "f32", "--seed", "2", "--out", str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().err
    assert main(["gguf", "--model", "qwen3-tiny", "--qtype", "q6_k", "--out", str(out)]) == 2
    assert "--qtype 'q6_k' is not supported" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ real llama.cpp

@pytest.mark.slow
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_llamacpp_decodes_our_gguf_to_the_reference_logits(llamacpp_lib, name):
    """Every family's tiny preset: llama.cpp's logits of our GGUF equal the reference's."""
    cfg = preset(name, context=CONTEXT)
    run = run_llamacpp(llamacpp_lib, cfg)
    want = reference_logits(comparable(cfg), ref_tokens(cfg))
    assert run.logits.shape == want.shape
    ok, worst = within_tolerance(run.logits, want)
    assert ok, f"{name}: worst relative logit error {worst:.2e} > {REL_TOL}"
    assert (run.logits.argmax(axis=1) == want.argmax(axis=1)).all()
    s = run.stats
    assert s["tokens"] == TOKENS and 0 < s["us_per_token_min"] <= s["us_per_token_median"] <= s["us_per_token_max"]
    assert s["tokens_per_s"] > 0 and run.device == "CPU (llama.cpp)"
    ev = run.trace.events  # untraced: one host-timed marker per token, its decode + synchronize
    assert list(ev["token"]) == list(range(TOKENS)) and (ev["kind"] == "marker").all()
    np.testing.assert_allclose((ev["end_ns"] - ev["start_ns"]) / 1e3, run.meta["per_token_us"][-1], atol=1e-3)


@pytest.mark.slow
def test_a_gguf_path_runs_that_file_and_its_reference_matches(llamacpp_lib, tmp_path):
    """``--model FILE.gguf``: llama.cpp runs the file, and the reference on the config read back
    from it (rope factors from its ``rope_freqs`` tensor) computes the same logits."""
    path = write_gguf(preset("llama-tiny"), tmp_path / "tiny.gguf", seed=5)
    cfg = load_config(str(path), context=CONTEXT)
    from workbench.exec.reference import run_reference

    tokens = ref_tokens(cfg)
    want = run_reference(cfg, random_weights(build_graph(cfg), 5), tokens).logits
    run = LlamaCppBackend().run(RunRequest(cfg, Strategy(), [], tokens, seed=5,
                                           options=LlamaCppOptions(build=llamacpp_lib, threads=2)))
    assert run.meta["gguf"] == str(path.resolve())
    ok, worst = within_tolerance(run.logits, want)
    assert ok, worst


@pytest.mark.slow
def test_the_tolerance_catches_a_layout_error(llamacpp_lib, tmp_path, monkeypatch):
    """Without the converter's Q/K row permutation llama.cpp rotates the wrong pairs: from the
    second position on, the logits leave the tolerance (so the comparison above can fail)."""
    import workbench.models.gguf_write as gw

    monkeypatch.setattr(gw, "llama_permute", lambda w, n_head: w)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    cfg = preset("llama-tiny", context=CONTEXT)
    run = run_llamacpp(llamacpp_lib, cfg)
    ok, worst = within_tolerance(run.logits, reference_logits(cfg, ref_tokens(cfg)))
    assert not ok and worst > 3 * REL_TOL


@pytest.mark.slow
def test_gpt_oss_yarn_in_llamacpp_rounds_the_correction_range(llamacpp_lib):
    """llama.cpp's gpt-oss differs from HF's (``truncate: false``) beyond the tolerance: the
    comparison above needs the rounded YaRN ramp, and this says why."""
    cfg = preset("gpt-oss-tiny", context=CONTEXT)
    run = run_llamacpp(llamacpp_lib, cfg)
    ok, _ = within_tolerance(run.logits, reference_logits(cfg, ref_tokens(cfg)))
    assert not ok


@pytest.mark.slow
def test_reps_and_start_pos(llamacpp_lib):
    cfg = preset("qwen3-tiny", context=CONTEXT)
    run = run_llamacpp(llamacpp_lib, cfg, reps=3, tokens=[1, 2, 3])
    assert run.stats["reps"] == 3 and np.asarray(run.meta["per_token_us"]).shape == (3, 3)
    deep = LlamaCppBackend().run(RunRequest(cfg, Strategy(), [], [1, 2, 3], start_pos=40,
                                            options=LlamaCppOptions(build=llamacpp_lib, threads=2)))
    assert deep.logits.shape == (3, cfg.get("vocab_size")) and not np.allclose(deep.logits, run.logits)


# ------------------------------------------------------------------------------------------ clear errors

def test_no_build_given_or_a_folder_without_libllama(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBENCH_LLAMACPP", raising=False)
    cfg = preset("llama-tiny", context=CONTEXT)
    with pytest.raises(BackendError, match="WORKBENCH_LLAMACPP"):
        LlamaCppBackend().run(RunRequest(cfg, Strategy(), [], [1]))
    ok, why = LlamaCppBackend().available()  # runnable: the build is an option, named by run's error
    assert ok and "--llamacpp" in why
    with pytest.raises(BackendError, match="does not exist"):
        run_llamacpp(str(tmp_path / "nope"), cfg)
    with pytest.raises(BackendError, match="no libllama.so"):
        run_llamacpp(str(tmp_path), cfg)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, words", [
    (Strategy(graphs=True), "CPU-only: --graphs"),
    (Strategy(pdl=True), "CPU-only: --pdl"),
    (Strategy(graphs=True, streams="qkv"), "--streams qkv"),
    (Strategy(streams="qkv"), "acts only under CUDA graphs: add --graphs"),
    (Strategy(streams="auto"), "no switch for --streams auto"),
    (Strategy(allocator="stream-aware"), "no switch for --allocator stream-aware"),
    (Strategy(pdl=True, pdl_trigger="end"), "no switch for PDL placement"),
    (Strategy(fusion={"copy-elim"}), "only inside its fusion pass"),
])
def test_knobs_without_a_switch_name_the_knob(llamacpp_lib, strategy, words):
    with pytest.raises(BackendError, match=words.replace("(", r"\(")):
        run_llamacpp(llamacpp_lib, preset("llama-tiny", context=CONTEXT), strategy)


@pytest.mark.slow
def test_trace_needs_a_cuda_build(llamacpp_lib):
    cfg = preset("llama-tiny", context=CONTEXT)
    with pytest.raises(BackendError, match="CPU-only"):
        LlamaCppBackend().run(RunRequest(cfg, Strategy(), [], [1], trace=True,
                                         options=LlamaCppOptions(build=llamacpp_lib)))


@pytest.mark.slow
def test_a_gguf_llamacpp_cannot_load_says_why(llamacpp_lib, tmp_path):
    """A GGUF whose metadata the workbench reads but whose tensors llama.cpp misses."""
    import gguf

    cfg = preset("llama-tiny")
    path = tmp_path / "broken.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    add_metadata(w, cfg, "f16")
    w.add_tensor("token_embd.weight", np.zeros((cfg.get("vocab_size"), cfg.get("hidden_size")), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(BackendError, match=r"cannot load .*broken.gguf.*tensor 'output_norm.weight' not found"):
        LlamaCppBackend().run(RunRequest(load_config(str(path), context=CONTEXT), Strategy(), [], [1],
                                         options=LlamaCppOptions(build=llamacpp_lib, threads=2)))


@pytest.mark.slow
def test_layers_override_of_a_gguf_and_bad_token_ids(llamacpp_lib):
    cfg = preset("llama-tiny", context=CONTEXT)
    path = cached_gguf(cfg)
    with pytest.raises(BackendError, match="drop --layers"):
        run_llamacpp(llamacpp_lib, load_config(str(path), layers=1, context=CONTEXT), tokens=[1])
    with pytest.raises(BackendError, match="outside the model's vocabulary"):
        run_llamacpp(llamacpp_lib, cfg, tokens=[cfg.get("vocab_size") + 5])
