"""A tqdm bar on stderr for the ``progress(stage, done, total)`` callback of ``workbench.run``:
shown only when a run lasts longer than ``delay`` seconds and stderr is a terminal, so quick
runs and pipelines print nothing extra."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm


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
