"""Record one CUPTI timeline of llama.cpp (GPU) in the form the llama.cpp fit reads.

One model x Strategy through the ``llamacpp`` backend with ``trace``: the capture starts before
llama.cpp's first decode, every kernel is recorded (CUDA-graph nodes included) and named by its
ggml op. Only the timed tokens are kept (the warm-up and the prompt are dropped), and the meta
gains what the fit needs to rebuild the Plan: model, layers, context, first position, the
config's name. A few tokens deep in a context are enough: the fit needs each kernel a few
times, and every token of a decode runs the same kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...llamacpp.switches import LLAMACPP_FUSION as FUSED  # llama.cpp's fusion pass on (its default)
from ...strategy import Strategy

#: the decode window a capture records by default: 6 tokens at positions 448..453 of a 512 context
CONTEXT, START, TOKENS = 512, 448, 6


@dataclass(frozen=True)
class Capture:
    """What to record: model preset and layers (None: all), config name and its Strategy."""

    model: str
    layers: int | None
    config: str
    strategy: Strategy
    context: int = CONTEXT
    start_pos: int = START
    tokens: int = TOKENS

    @property
    def stem(self) -> str:
        """``<model>-L<layers>_<config>``, the file name the fit reads (``_ctx<context>`` added
        outside the default context: the fit takes a long-context capture's kernels only)."""
        from ...models import preset

        ctx = f"_ctx{self.context}" if self.context != CONTEXT else ""
        return f"{self.model}-L{self.layers or preset(self.model).n_layer}_{self.config}{ctx}"


def record(cap: Capture, out_dir: Path, suffix: str = ".parquet") -> tuple[Path, dict]:
    """Record ``cap`` into ``out_dir/<stem><suffix>``; returns the path and the run's stats
    (``us_per_token`` traced) and meta (``switches_text``, ``system_info``)."""
    from ...models import preset
    from ...trace import Trace
    from ...trace.io import save_trace
    from ..backend import RunRequest
    from ..llamacpp import LlamaCppBackend, LlamaCppOptions

    cfg = preset(cap.model, layers=cap.layers, context=cap.context)
    ids = [int(t) for t in range(1000, 1000 + 37 * cap.tokens, 37)]
    # timing only: a tiled GGUF (written in seconds) and no logits pass
    run = LlamaCppBackend().run(RunRequest(cfg, cap.strategy, [], ids, start_pos=cap.start_pos, trace=True,
                                           options=LlamaCppOptions(fill="tiled", logits=False)))
    ev = run.trace.events
    ev = ev[ev["token"] >= 0].reset_index(drop=True)
    meta = dict(run.trace.meta, recipe=cap.stem, config=cap.config, model=cap.model,
                layers=cap.layers or run.trace.meta.get("layers"),
                tokens=cap.tokens, context=cap.context, start_pos=cap.start_pos, device=run.device,
                system_info=run.meta.get("system_info", ""), us_per_token=run.stats["us_per_token"])
    path = save_trace(Trace(ev, meta), Path(out_dir) / f"{cap.stem}{suffix}")
    return path, {"stats": run.stats, "meta": run.meta}


def _captures(models: tuple[tuple[str, int | None], ...]) -> tuple[Capture, ...]:
    configs = (("pdl0", Strategy(graphs=True, fusion=FUSED)),
               ("default", Strategy(graphs=True, pdl=True, fusion=FUSED)),
               ("graph_opt", Strategy(graphs=True, pdl=True, streams="qkv", fusion=FUSED)),
               ("no_graphs_pdl0", Strategy(fusion=FUSED)), ("no_fusion", Strategy(graphs=True, pdl=True)))
    return tuple(Capture(m, n, c, s) for m, n in models for c, s in configs)


#: what ``workbench calibrate --target llamacpp`` records on the GPU: Llama shapes under the
#: switch settings whose costs differ (graphs without / with PDL, GRAPH_OPT's streams, eager
#: launches, the unfused kernels); config names as ``benchmarks/llamacpp_peer.py`` names them
CALIBRATION_CAPTURES = _captures((("llama-3.2-1b", None), ("llama-3.1-8b", 4)))
