"""Progress on stderr while a long command works: a tqdm bar driven by ``workbench.run``'s
``progress(stage, done, total)`` callback (shown only past 2 s, on a terminal), and a heartbeat
of elapsed time against the estimate for work that reports no steps (the race check).

The heartbeat is a daemon thread, started only when the estimate is long; it stops when the block ends, also
on an error. Pure-Python backends hold the GIL, but the interpreter switches threads every few
milliseconds, so the beat arrives on time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

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


class ProgressBar:
    """One bar per run: the description is the current stage, the count the tokens done."""

    def __init__(self, delay: float = 2.0, disable: bool | None = None) -> None:
        self.bar: Any = tqdm(total=0, delay=delay, disable=disable, unit="token", leave=False, dynamic_ncols=True)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if total and self.bar.total != total:  # a new counted stage; the delay still runs from the start
            self.bar.total, self.bar.n, self.bar.last_print_n = total, 0, 0
        self.bar.set_description_str(stage, refresh=False)
        self.bar.update(max(0, done - self.bar.n) if total else 0)  # update() honours the delay

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
