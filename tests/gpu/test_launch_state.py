"""The cuda backend enters the settled launch state once per process, before its first run
(workbench/exec/launch_state.py; why: data/bench/launch_state_h200.md)."""

from __future__ import annotations

from workbench.exec.launch_state import SETTLE_KERNELS, settle_launch_state
from workbench.models import preset
from workbench.strategy import Strategy


def test_settled_once_per_process_by_the_executor():
    from workbench.exec.cuda import CudaExecutor
    from workbench.exec.device import device_info

    cfg = preset("llama-tiny")
    ex = CudaExecutor(cfg, Strategy(graphs=True), "device")
    try:
        info = settle_launch_state.cache_info()
        assert info.currsize == 1  # the executor settled it
        hits = info.hits
        assert settle_launch_state(device_info().index) == SETTLE_KERNELS
        assert settle_launch_state.cache_info().hits == hits + 1  # not launched again
        CudaExecutor(cfg, Strategy(), "device", share=ex).release()
        assert settle_launch_state.cache_info().misses == 1
    finally:
        ex.release()
