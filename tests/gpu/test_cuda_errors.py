"""Clear errors of the cuda backend on a real GPU, and its trace."""

from __future__ import annotations

import pytest
from gpu_cases import model_case

import workbench
from workbench.exec.cuda import CudaExecutor
from workbench.exec.kernels import CudaBackendError
from workbench.models import preset
from workbench.strategy import Strategy


def test_model_too_large_names_it_and_suggests_layers():
    with pytest.raises(CudaBackendError, match=r"qwen3-next-80b-a3b.*--layers \d+"):
        CudaExecutor(preset("qwen3-next-80b-a3b"), Strategy(), weights="device")


def test_unknown_kernel_set():
    with pytest.raises(ValueError, match="--kernels"):
        CudaExecutor(preset("llama-tiny"), Strategy(), kernels="triton")


def test_trace_has_every_token():
    case = model_case("llama-tiny")
    run = workbench.run(case.cfg, Strategy(graphs=True), tokens=4, backend="cuda", trace=True)
    assert run.trace.tokens() == [0, 1, 2, 3]
    assert run.logits.shape == (4, case.cfg.get("vocab_size"))
