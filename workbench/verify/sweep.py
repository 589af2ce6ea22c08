"""The knob space the verifier must prove race-free: every valid Strategy.

Two knob values are unsafe by design and excluded: PDL wait ``late`` (offered only to study
the race) and concurrent streams (``qkv``/``auto``) with ``serial-reuse`` allocation (seed
001's bug: ggml-alloc recycles bytes another stream still uses). Everything else must verify.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from ..strategy.strategy import ALLOCATORS, FUSIONS, LOGITS_MODES, PDL_TRIGGERS, STREAM_MODES, SYNC_MODES, Strategy

SAFE_WAITS = ("start", "first-read")
#: ``auto`` streams are swept at these stream limits (qkv always uses 3)
AUTO_MAX_STREAMS = (2, 3, 4)


def fusion_sets() -> list[frozenset[str]]:
    """No fusion, each fusion alone and all of them: every rewrite is checked by itself and in
    the company of all the others, without the 2^n subsets (each pass rewrites only its own
    pattern; where passes compete for a node, the full set is the case that combines them)."""
    return [frozenset(), *(frozenset({f}) for f in FUSIONS), frozenset(FUSIONS)]


def pdl_options() -> list[dict]:
    return [dict(pdl=False)] + [dict(pdl=True, pdl_wait=w, pdl_trigger=t)
                                for w in SAFE_WAITS for t in PDL_TRIGGERS]


def valid_strategies() -> Iterator[Strategy]:
    """Every combination of sync x graphs x streams (x max_streams for auto) x allocator x PDL
    placement x fusion set that is meant to be race-free; zero-copy logits with no fusion and
    with every fusion (a rewrite changes the kernels, not who writes the logits or when the
    host reads them)."""
    for sync, graphs, streams, allocator in itertools.product(SYNC_MODES, (False, True), STREAM_MODES, ALLOCATORS):
        if streams != "single" and allocator == "serial-reuse":
            continue
        for max_streams in AUTO_MAX_STREAMS if streams == "auto" else (4,):
            for pdl, fusion in itertools.product(pdl_options(), fusion_sets()):
                for logits in LOGITS_MODES if fusion in (frozenset(), frozenset(FUSIONS)) else ("copy",):
                    yield Strategy(sync=sync, graphs=graphs, streams=streams, max_streams=max_streams,
                                   allocator=allocator, fusion=fusion, logits=logits, **pdl)
