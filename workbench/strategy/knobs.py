"""Every Strategy knob declared once: its field, CLI flag, values, help and what it needs.

The CLI flags (``commands.flags``), the panel's widgets (``view.panel``) and the verifier's
sweep (``verify.sweep``) are all checked against this table (tests/test_knobs.py), so a new
knob cannot reach one consumer and silently miss another. ``needs`` names the knob that must be
on for this one to change anything, so an inert setting is reported instead of ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

from ..graph import KERNEL_FAMILIES
from .strategy import ALLOCATORS, FUSIONS, LOGITS_MODES, PDL_TRIGGERS, PDL_WAITS, STREAM_MODES, SYNC_MODES, Strategy


@dataclass(frozen=True)
class Knob:
    """One Strategy field. ``kind``: ``choice`` (one of ``values``), ``flag`` (bool), ``int``,
    ``set`` (a subset of ``values``) or ``families`` (per kernel family PDL overrides)."""

    field: str
    flag: str
    kind: str
    values: tuple = ()
    help: str = ""
    #: (knob, predicate on the Strategy): the knob this one acts through
    needs: tuple[str, Callable[[Strategy], bool]] | None = None

    def active(self, s: Strategy) -> bool:
        """Whether this knob's value can change anything under ``s``."""
        return self.needs is None or self.needs[1](s)


_PDL = ("--pdl", lambda s: s.pdl)

KNOBS: tuple[Knob, ...] = (
    Knob("sync", "--sync", "choice", SYNC_MODES,
         "host syncs around the per-token input copies (llama.cpp PR #17795): per-copy, boundary, implicit"),
    Knob("graphs", "--graphs", "flag", (False, True), "capture a CUDA graph once, replay it per token"),
    Knob("streams", "--streams", "choice", STREAM_MODES,
         "single stream, Q/K/V on three streams (PR #16991), or any independent branches (auto)"),
    Knob("max_streams", "--max-streams", "int", (1, 16), "stream limit of --streams auto",
         ("--streams auto", lambda s: s.streams == "auto")),
    Knob("pdl", "--pdl", "flag", (False, True), "Programmatic Dependent Launch (Hopper+, compute capability 9.0)"),
    Knob("pdl_wait", "--pdl-wait", "choice", PDL_WAITS,
         "where kernels wait for their predecessor (griddepcontrol.wait); late = a deliberate race", _PDL),
    Knob("pdl_trigger", "--pdl-trigger", "choice", PDL_TRIGGERS,
         "where kernels let their successor launch (griddepcontrol.launch_dependents)", _PDL),
    Knob("pdl_families", "--pdl-family", "families", KERNEL_FAMILIES,
         "per kernel family placement FAMILY=WAIT[/TRIGGER], repeatable", _PDL),
    Knob("fusion", "--fusion", "set", FUSIONS, "comma-separated graph rewrites"),
    Knob("allocator", "--allocator", "choice", ALLOCATORS,
         "scratch reuse: serial-reuse (ggml-alloc), stream-aware, no-reuse"),
    Knob("logits", "--logits", "choice", LOGITS_MODES,
         "logits to the host: copy (an async D2H copy after the step, llama.cpp) or zero-copy (written by "
         "their kernel into mapped pinned host memory: no copy on the critical path)"),
)

KNOB_BY_FIELD = {k.field: k for k in KNOBS}


def strategy_fields() -> list[str]:
    return [f.name for f in fields(Strategy)]


def parse_family_placements(items: Iterable[str]) -> tuple[tuple[str, str, str], ...]:
    """``["mul_mat=start/end", "norm=first-read"]`` -> ((family, wait, trigger), ...); a missing
    trigger is the global default ``start``."""
    out = []
    for item in items:
        fam, sep, rest = item.partition("=")
        if not sep or not fam or not rest:
            raise ValueError(f"--pdl-family {item!r}: give FAMILY=WAIT or FAMILY=WAIT/TRIGGER, e.g. mul_mat=start/end")
        if fam not in KERNEL_FAMILIES:
            raise ValueError(f"--pdl-family {item!r}: unknown kernel family {fam!r}; one of "
                             f"{', '.join(KERNEL_FAMILIES)}")
        wait, _, trigger = rest.partition("/")
        out.append((fam, wait, trigger or "start"))
    return tuple(out)


def parse_fusions(text: str | Iterable[str] | None) -> frozenset[str]:
    """``"copy-elim,rms-norm-mul"`` -> frozenset (empty entries dropped; Strategy checks the names)."""
    if text is None:
        return frozenset()
    items = text.split(",") if isinstance(text, str) else list(text)
    return frozenset(i.strip() for i in items if i.strip())


def inert_settings(s: Strategy, given: Iterable[str]) -> list[str]:
    """For the knob fields the user set explicitly (``given``), a notice for each that cannot
    change anything under ``s`` (e.g. ``--pdl-wait late`` without ``--pdl``)."""
    notes = []
    for name in given:
        k = KNOB_BY_FIELD[name]
        if k.needs is not None and not k.active(s):
            value = getattr(s, name)
            shown = ",".join("=".join(x) for x in value) if k.kind == "families" else value
            notes.append(f"{k.flag} {shown} has no effect without {k.needs[0]}")
    return notes
