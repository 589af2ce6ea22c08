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


def test_blocks_cached_by_cupys_pool_count_as_free():
    """An executor released without emptying CuPy's pool left its blocks cached there, and the
    next model's fit check read only the driver's free memory: a second large model was refused
    though the GPU had room (seen running two full-size models in one process)."""
    import cupy as cp

    from workbench.exec.cuda import MEMORY_HEADROOM, memory_need
    from workbench.models import build_graph

    cfg = preset("llama-3.2-1b", layers=1)  # ~0.6 GiB: the driver keeps more than a tiny model's MBs
    need = memory_need(build_graph(cfg))
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    held, size = [], 1 << 30
    try:
        # fill the GPU in halving chunks (one block of all free memory is refused) until the
        # driver has less free than the model needs
        while size >= 1 << 16 and cp.cuda.runtime.memGetInfo()[0] * MEMORY_HEADROOM >= need:
            try:
                held.append(cp.empty(size, dtype=cp.uint8))
            except cp.cuda.memory.OutOfMemoryError:
                size //= 2
        if cp.cuda.runtime.memGetInfo()[0] * MEMORY_HEADROOM >= need:
            pytest.skip("this GPU would not hand out all but the model's size of its free memory")
        del held[:]  # cached by the pool, not handed back to the driver
        assert pool.free_bytes() > 0
        ex = CudaExecutor(cfg, Strategy(), "device")  # refused before: "needs ... GiB but ... has ... free"
        ex.release()
    finally:
        held.clear()
        pool.free_all_blocks()


def test_unknown_kernel_set():
    with pytest.raises(ValueError, match="--kernels"):
        CudaExecutor(preset("llama-tiny"), Strategy(), kernels="triton")


def test_trace_has_every_token():
    case = model_case("llama-tiny")
    run = workbench.run(case.cfg, Strategy(graphs=True), tokens=4, backend="cuda", trace=True)
    assert run.trace.tokens() == [0, 1, 2, 3]
    assert run.logits.shape == (4, case.cfg.get("vocab_size"))
