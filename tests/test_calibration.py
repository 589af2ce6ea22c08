

def test_model_spec_parses_layers_context_and_pos():
    """``--models preset[:layers[:context[:pos]]]``: empty fields keep the preset's own, pos is the
    first decode step (a second KV length of one model, e.g. for decode attention's fit)."""
    from workbench.exec.calibrate.specs import ModelSpec

    assert ModelSpec.parse("llama-3.1-8b:2:1024:600") == ModelSpec("llama-3.1-8b", 2, 1024, 600)
    assert ModelSpec.parse("llama-3.1-8b::1024") == ModelSpec("llama-3.1-8b", None, 1024, 0)
    assert ModelSpec.parse("qwen3-8b") == ModelSpec("qwen3-8b", None, None, 0)
    assert ModelSpec.parse("llama-3.1-8b:2:1024:600").label == "llama-3.1-8b/L2/ctx1024/pos600"
