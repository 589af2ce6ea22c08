"""What the calibration measures: the model shapes and the strategies of its executor runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ...llamacpp.switches import LLAMACPP_FUSION
from ...models import ModelConfig, load_config
from ...strategy import FUSIONS, Strategy


@dataclass(frozen=True)
class ModelSpec:
    """A model shape the calibration (or the fidelity report) runs: preset, layers, context, and
    the position of the first decode step (which sets the attended KV length)."""

    model: str
    layers: int | None = None
    context: int | None = None
    pos: int = 0

    @classmethod
    def from_columns(cls, model: str, layers: Any, context: Any, pos: Any = 0) -> ModelSpec:
        """A spec from the ``spec_*`` columns of a raw table, where a missing value is NaN."""
        return cls(model, None if layers != layers or layers is None else int(layers),
                   None if context != context or context is None else int(context), int(pos))

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``preset[:layers[:context[:pos]]]``, as ``--models`` options take it (an empty field:
        the preset's own; ``pos``: the first decode step's KV position, default 0)."""
        name, *sizes = text.strip().split(":")
        layers, context, pos = ([int(s) if s else None for s in sizes[:3]] + [None, None, None])[:3]
        return cls(name, layers, context, pos or 0)

    def config(self) -> ModelConfig:
        return load_config(self.model, layers=self.layers, context=self.context)

    @property
    def label(self) -> str:
        parts = [self.model]
        if self.layers:
            parts.append(f"L{self.layers}")
        if self.context:
            parts.append(f"ctx{self.context}")
        if self.pos:
            parts.append(f"pos{self.pos}")
        return "/".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "layers": self.layers, "context": self.context, "pos": self.pos}


#: dense Llama shapes at two sizes and three KV lengths (mat-vecs from 512 x 2048 to 14336 x 4096,
#: attention over 256, 600 and 1800 rows: the split decode attention needs two lengths for a fit
#: that grows with the keys, data/bench/calibration_h200_s27.md session 29), a top-8 MoE (expert
#: mat-vecs, routing) and Gated DeltaNet (three linear-attention layers and one full one); qwen3
#: dense and gpt-oss are left out, the families the fidelity report holds out
#: (benchmarks/sim_fidelity.py). Cut, not full-size: above ~2.9 GB read a token CUPTI's gap between
#: a graph's kernels rises from 256 to 416 ns, which untraced runs do not pay as such (their layer
#: grows 3-12 % with depth, gradually, and the cut models' fit lands near the deep end), and a
#: full-size calibration scores worse (data/bench/calibration_h200_s37_fullsize.md, sections 4-5)
CALIBRATION_MODELS = (
    ModelSpec("llama-3.2-1b", 4, 512),
    ModelSpec("llama-3.1-8b", 2, 2048, 1800),
    ModelSpec("llama-3.1-8b", 2, 1024, 600),
    ModelSpec("qwen3-30b-a3b", 2, 512, 448),
    ModelSpec("qwen3-next-80b-a3b", 4, 512, 448),
)

# The labels of the calibration runs: the ``strategy`` column of the raw tables (so recorded
# raw files keep reading), each naming one entry of CALIBRATION_STRATEGIES.
EAGER: Final = "eager"
EAGER_PDL: Final = "eager+pdl"
EAGER_QKV: Final = "eager+qkv+boundary"
GRAPHS: Final = "graphs+boundary"
GRAPHS_PDL: Final = "graphs+pdl+implicit"
FUSED: Final = "graphs+fusion+boundary"
FUSED_PDL: Final = "graphs+fusion+pdl+boundary"
FUSED_LLAMACPP: Final = "graphs+llamacpp-fusion+boundary"

#: the strategies whose traces give each host cost and the PDL boundaries
CALIBRATION_STRATEGIES: dict[str, Strategy] = {
    EAGER: Strategy(),
    EAGER_PDL: Strategy(pdl=True),
    EAGER_QKV: Strategy(streams="qkv", sync="boundary"),
    GRAPHS: Strategy(graphs=True, sync="boundary"),
    GRAPHS_PDL: Strategy(graphs=True, pdl=True, sync="implicit"),
    # every fusion: the fused kernels' own durations, and how much slower a kernel runs when PDL
    # launches it at its predecessor's start (its blocks placed as the predecessor's retire)
    FUSED: Strategy(graphs=True, sync="boundary", fusion=frozenset(FUSIONS)),
    FUSED_PDL: Strategy(graphs=True, pdl=True, sync="boundary", fusion=frozenset(FUSIONS)),
    # llama.cpp's fusion set: its fused kernels (norm + mul, rope + set_rows, mat-vec + add, gate +
    # up + GLU) at every calibration shape. Under every fusion the workbench's larger fusions take
    # most of them, which left fits of one size that priced llama-3.2-1b's fused step 4 % fast
    # (data/bench/fusion_trace_1b_h200_s28.csv.gz against the simulator, session 30)
    FUSED_LLAMACPP: Strategy(graphs=True, sync="boundary", fusion=LLAMACPP_FUSION),
}
#: the runs that replay CUDA graphs (what CUPTI's per-kernel cost is measured on)
GRAPH_RUNS = (GRAPHS, GRAPHS_PDL, FUSED, FUSED_PDL, FUSED_LLAMACPP)
#: the runs whose kernel durations the fits take (without fusion, with every fusion, with
#: llama.cpp's; PDL runs' kernels start early, so their durations include the wait)
DURATION_RUNS = (GRAPHS, FUSED, FUSED_LLAMACPP)
