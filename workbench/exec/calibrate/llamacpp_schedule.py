"""The Strategy llama.cpp really runs when it is given a Strategy's switches.

llama.cpp cannot turn its fusions on one by one (``workbench.llamacpp.switches``): with
``GGML_CUDA_DISABLE_FUSION`` unset its whole fusion pass runs (rms_norm+mul(+add), mat-vec +
bias / + GLU, rope+set_rows, add chains, top-k MoE), and the GDN state copy goes with it unless
the peer patch keeps it. Simulating llama.cpp therefore plans the model under the fusion set
llama.cpp applies, not the one the Strategy names; every other knob maps one to one.
"""

from __future__ import annotations

from dataclasses import replace

from ...strategy import FUSIONS, WORKBENCH_FUSIONS, Strategy


def llamacpp_strategy(strategy: Strategy) -> Strategy:
    """``strategy`` with the fusions llama.cpp applies under its switches: all of them when any
    fusion but ``copy-elim`` is asked (``copy-elim`` kept as asked: the peer patch can keep the
    GDN copy), none otherwise."""
    if not (strategy.fusion - {"copy-elim"}):
        return replace(strategy, fusion=frozenset())
    full = set(FUSIONS) - set(WORKBENCH_FUSIONS) - {"copy-elim"} | (strategy.fusion & {"copy-elim"})
    return replace(strategy, fusion=frozenset(full))
