"""The process's CUDA launch state, put where a serving process has it before anything is timed.

Measured on an H200 (``data/bench/launch_state_h200.md``): once a process has launched a few
dozen kernels outside a CUDA graph on a stream other than the legacy default stream, every later
graph replay without PDL runs with longer gaps between its kernels (CUPTI: median 96 ns before,
256 ns after), and ``cudaGraphLaunch`` costs the host about twice as long (traced). The change is
process-wide (it follows kernels launched on any non-default stream, by any module), it lasts
(20 s idle later it is still there), and replays with PDL do not show it. So a graph strategy
measured before the process's first eager run was several per cent faster per token than the
same strategy measured after it: the lab's speedup tables depended on the order the user ran
strategies in, and a decode matrix (eager cells first) disagreed with ``workbench run --graphs``.

The cuda backend enters the state after once per process, before its first run, with a burst
of tiny kernels on a side stream: every run is then timed in the same state whatever ran before
it (the state before cannot be restored once left). It is not llama.cpp's state: llama.cpp's
replays without PDL keep 96 ns gaps after its prefill (``launch_state_h200.md``, session 30), so
our graph cells without PDL carry 190-320 ns a kernel that llama.cpp's do not; replays with PDL,
the best configurations, are unaffected.
"""

from __future__ import annotations

from functools import cache
from typing import Any

#: kernels launched to enter the state: 16 already gave most of the slowdown on an H200, 64 to 700
#: all of it (``data/bench/launch_state_h200.md``)
SETTLE_KERNELS = 256


def stream_kernels(n: int, device: int = 0, stream: Any = None) -> int:
    """Launch ``n`` one-element kernels on ``stream`` (default: a new non-blocking stream of
    ``device``) and wait for them; returns ``n``."""
    import cupy as cp

    with cp.cuda.Device(device):
        x = cp.zeros(1, dtype=cp.float32)
        stream = cp.cuda.Stream(non_blocking=True) if stream is None else stream
        with stream:
            for _ in range(n):
                x += 1
        stream.synchronize()
    return n


@cache
def settle_launch_state(device: int = 0) -> int:
    """``SETTLE_KERNELS`` side-stream kernels on ``device`` (about a millisecond, once per process
    and device: the state is a CUDA context's); returns how many were launched."""
    return stream_kernels(SETTLE_KERNELS, device)
