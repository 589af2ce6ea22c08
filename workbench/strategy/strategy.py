"""The Strategy: every scheduling knob of the four seeds in one frozen value.

Defaults are llama.cpp's behaviour before the four changes, so each optimization is a visible
toggle. ``validate`` turns an impossible combination into a clear error naming the knob.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any

SYNC_MODES = ("per-copy", "boundary", "implicit")          # PR #17795
STREAM_MODES = ("single", "qkv", "auto")                   # PR #16991
PDL_WAITS = ("start", "first-read", "late")                # PDL (b9254); late = a race, to study it
PDL_TRIGGERS = ("start", "after-main-loop", "end", "none")  # llama.cpp's PDL change (b9254)
#: PR #23940's copy removal, then llama.cpp's fusion set (ggml_cuda_try_fuse), each its own knob
#: the workbench's own fusions (llama.cpp has no kernel for them): the norm folded into the mat-vecs
#: that read it, and a layer's Q/K/V mat-vecs + RoPE + KV-cache stores in one kernel
WORKBENCH_FUSIONS = ("norm-mat-vec", "qkv-rope-store")
FUSIONS = ("copy-elim", "rms-norm-mul", "mul-mat-add", "mul-mat-glu", "rope-set-rows", "add-chain", "topk-moe",
           "rms-norm-mul-rope", "moe-weighted-reduction", *WORKBENCH_FUSIONS)
ALLOCATORS = ("serial-reuse", "stream-aware", "no-reuse")  # PR #16991's buffer-lifetime discussion
#: how the logits reach the host: llama.cpp's async D2H copy after the step, or zero-copy (the
#: kernel that writes them stores into pinned host memory mapped into the GPU's address space)
LOGITS_MODES = ("copy", "zero-copy")


class StrategyError(ValueError):
    """An impossible knob combination; the message names the knob and the fix."""


class UnsafeStrategyWarning(UserWarning):
    """A knob value offered only to study races (PDL wait ``late``)."""


@dataclass(frozen=True)
class Strategy:
    sync: str = "per-copy"
    graphs: bool = False
    streams: str = "single"
    max_streams: int = 4
    pdl: bool = False
    pdl_wait: str = "first-read"
    pdl_trigger: str = "start"
    #: per kernel family overrides: ((family, wait, trigger), ...)
    pdl_families: tuple[tuple[str, str, str], ...] = ()
    fusion: frozenset[str] = field(default_factory=frozenset)
    allocator: str = "serial-reuse"
    logits: str = "copy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "fusion", frozenset(self.fusion))
        object.__setattr__(self, "pdl_families", tuple(tuple(x) for x in self.pdl_families))
        _check("sync", self.sync, SYNC_MODES)
        _check("streams", self.streams, STREAM_MODES)
        _check("pdl-wait", self.pdl_wait, PDL_WAITS)
        _check("pdl-trigger", self.pdl_trigger, PDL_TRIGGERS)
        _check("allocator", self.allocator, ALLOCATORS)
        _check("logits", self.logits, LOGITS_MODES)
        for f in self.fusion:
            _check("fusion", f, FUSIONS)
        for fam, wait, trig in self.pdl_families:
            _check(f"pdl-wait ({fam})", wait, PDL_WAITS)
            _check(f"pdl-trigger ({fam})", trig, PDL_TRIGGERS)
        if self.max_streams < 1:
            raise StrategyError(f"--max-streams {self.max_streams!r} is out of range: must be an integer >= 1")
        if self.streams == "qkv" and self.max_streams < 3:
            raise StrategyError(f"--max-streams {self.max_streams} is out of range for --streams qkv: it forks Q, K "
                                "and V onto 3 streams, so it must be >= 3")

    def placement(self, family: str) -> tuple[str, str]:
        """PDL (wait, trigger) for a kernel family."""
        for fam, wait, trig in self.pdl_families:
            if fam == family:
                return wait, trig
        return self.pdl_wait, self.pdl_trigger

    def validate(self, compute_capability: tuple[int, int] | None = None) -> Strategy:
        """Check against a device; warn for unsafe placements. Returns self for chaining."""
        if self.pdl and compute_capability is not None and tuple(compute_capability) < (9, 0):
            cc = ".".join(map(str, compute_capability))
            raise StrategyError(f"--pdl needs compute capability >= 9.0 (Hopper); this GPU is {cc}. "
                                "Drop --pdl or run on an H100/H200.")
        if self.pdl and ("late" == self.pdl_wait or any(w == "late" for _, w, _ in self.pdl_families)):
            warnings.warn("PDL wait 'late' reads inputs before griddepcontrol.wait: a deliberate race, "
                          "offered only to study it", UnsafeStrategyWarning, stacklevel=2)
        return self

    def with_(self, **changes: Any) -> Strategy:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fusion"] = sorted(self.fusion)
        d["pdl_families"] = [list(x) for x in self.pdl_families]
        return d

    def label(self) -> str:
        """Short human label, e.g. ``graphs+pdl+qkv+implicit``."""
        parts = ["graphs" if self.graphs else "eager"]
        if self.pdl:
            parts.append("pdl" if (self.pdl_wait, self.pdl_trigger) == ("first-read", "start")
                         else f"pdl({self.pdl_wait},{self.pdl_trigger})")
        if self.streams != "single":
            parts.append(self.streams)
        if self.sync != "per-copy":
            parts.append(self.sync)
        parts.extend(sorted(self.fusion))
        if self.allocator != "serial-reuse":
            parts.append(self.allocator)
        if self.logits != "copy":
            parts.append(f"logits-{self.logits}")
        return "+".join(parts)


def _check(knob: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise StrategyError(f"--{knob} {value!r} is not one of {', '.join(allowed)}")


#: The stack of the four seeds, all on (safe placements), with llama.cpp's whole fusion set (what
#: llama.cpp can run too; the workbench's own fusions are added by name, e.g. ``ALL_ON_OURS``).
ALL_ON = Strategy(sync="implicit", graphs=True, streams="qkv", pdl=True,
                  fusion=frozenset(FUSIONS) - frozenset(WORKBENCH_FUSIONS), allocator="stream-aware")
#: ALL_ON plus the workbench's own fusions: every fusion on
ALL_ON_OURS = ALL_ON.with_(fusion=frozenset(FUSIONS))
