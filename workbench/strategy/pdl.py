"""Programmatic Dependent Launch placement (llama.cpp's PDL change (b9254)), per kernel family.

With ``Strategy.pdl`` every kernel is enrolled: it executes ``griddepcontrol.launch_dependents``
at its family's trigger point (``start``, ``after-main-loop``, ``end``; ``none`` never lets the
next kernel start early) and ``griddepcontrol.wait`` at its wait point (``start``,
``first-read``, or ``late``: after the first dependent read, a deliberate race).

PDL only relaxes the edge between a kernel and the previous kernel *on the same stream*; a
launch that is the first kernel of its stream in the token (after the H2D copies, or a fresh
side stream) has no kernel to overlap and is launched plainly (``pdl=False``). Cross-stream
edges always go through events, which are full dependencies.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..graph import KERNEL_FAMILIES, Node
from .strategy import Strategy, StrategyError


def check_families(strategy: Strategy) -> None:
    """``pdl_families`` may only name kernel families the graph IR knows."""
    for fam, _, _ in strategy.pdl_families:
        if fam not in KERNEL_FAMILIES:
            raise StrategyError(f"pdl_families names unknown kernel family {fam!r}; "
                                f"known families: {', '.join(KERNEL_FAMILIES)}")


def place_pdl(nodes: Sequence[Node], streams: Sequence[int], strategy: Strategy) -> list[tuple[bool, str, str]]:
    """(pdl, wait, trigger) per node; (False, 'start', 'none') when PDL is off."""
    if not strategy.pdl:
        return [(False, "start", "none")] * len(nodes)
    seen: set[int] = set()
    out: list[tuple[bool, str, str]] = []
    for n, s in zip(nodes, streams):
        wait, trigger = strategy.placement(n.family)
        enrolled = s in seen  # a kernel precedes it on this stream
        seen.add(s)
        out.append((enrolled, wait if enrolled else "start", trigger))
    return out
