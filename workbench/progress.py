"""A heartbeat on stderr while a long run works: elapsed time against the estimate, so a run
that takes minutes is never silent (the backends report no per-step progress of their own).

A daemon thread, started only when the estimate is long; it stops when the block ends, also
on an error. Pure-Python backends hold the GIL, but the interpreter switches threads every few
milliseconds, so the beat arrives on time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Beat only for runs estimated longer than this, every EVERY seconds.
MIN_SECONDS = 10.0
EVERY = 10.0


@contextmanager
def heartbeat(emit: Callable[[str], None], estimate_s: float, what: str = "running",
              every: float = EVERY, min_seconds: float = MIN_SECONDS) -> Iterator[None]:
    """Within the block, ``emit("<what>: 20 s elapsed of about 45 s estimated")`` every
    ``every`` seconds, when ``estimate_s`` exceeds ``min_seconds``."""
    if estimate_s <= min_seconds:
        yield
        return
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            emit(f"{what}: {time.monotonic() - start:,.0f} s elapsed of about {estimate_s:,.0f} s estimated")

    thread = threading.Thread(target=beat, name="workbench-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
