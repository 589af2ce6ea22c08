"""A Strategy as llama.cpp's runtime switches (environment variables read once per process).

| knob | llama.cpp switch (peer tree 0c1e570) |
|---|---|
| ``graphs`` off / on | ``GGML_CUDA_DISABLE_GRAPHS=1`` / unset (on) |
| ``pdl`` off / on | ``GGML_CUDA_PDL=0`` / unset (on, every kernel through ``ggml_cuda_kernel_launch``) |
| ``streams`` ``qkv`` | ``GGML_CUDA_GRAPH_OPT=1`` (acts only under CUDA graphs) |
| ``fusion`` any but ``copy-elim`` | llama.cpp's whole fusion set on; with none, ``GGML_CUDA_DISABLE_FUSION=1`` |
| ``fusion`` ``copy-elim`` (GDN) | on with the fusion set; off: ``PEER_DISABLE_GDN_FUSION=1`` (peer patch) |
| ``sync`` ``boundary`` / ``implicit`` | ``PEER_SCHED_SYNC=<mode>`` (peer patch emulating PR 17795) |
| ``fusion`` ``norm-mat-vec`` / ``qkv-rope-store`` | none: the workbench's own fusions (a SwitchError) |

A knob llama.cpp has no switch for (``allocator``, PDL wait/trigger placement, ``streams=auto``),
a GPU knob asked of a CPU-only build, or a patched switch the build lacks is a
:class:`SwitchError` naming the knob and what to do instead.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

from ..strategy import FUSIONS, WORKBENCH_FUSIONS, Strategy

#: llama.cpp's fusion pass as Strategy knobs: with ``GGML_CUDA_DISABLE_FUSION`` unset (its
#: default) its CUDA backend applies every fusion the workbench models, each where a family has
#: its pattern (``ggml_cuda_try_fuse``: rms_norm+mul(+add), mul_mat+add, mul_mat+glu,
#: rope+set_rows, add chains, the top-k MoE router; the GDN state copy removal). The workbench's
#: passes are structural too (a family without the pattern is left unchanged: ``copy-elim`` acts
#: on GDN layers only, ``topk-moe`` on MoE routers only), so one set means "fusion on" for every
#: family, for llama.cpp's switch and for our backends alike.
LLAMACPP_FUSION = frozenset(FUSIONS) - frozenset(WORKBENCH_FUSIONS)  # not the workbench's own (no llama.cpp kernel)

#: every variable this module may set: a worker's environment starts without them
SWITCH_VARS = ("GGML_CUDA_DISABLE_GRAPHS", "GGML_CUDA_PDL", "GGML_CUDA_GRAPH_OPT", "GGML_CUDA_DISABLE_FUSION",
               "PEER_DISABLE_GDN_FUSION", "PEER_SCHED_SYNC")


class SwitchError(ValueError):
    """A Strategy knob llama.cpp (or this build of it) cannot express."""


@dataclass(frozen=True)
class BuildInfo:
    """What a llama.cpp build folder can do, read from its libraries."""

    folder: Path
    cuda: bool
    sched_sync_patch: bool
    gdn_fusion_patch: bool

    @staticmethod
    def of(folder: str | Path) -> BuildInfo:
        folder = Path(folder)

        def has(lib: str, text: bytes) -> bool:  # the switch's getenv() name is in the library
            p = folder / lib
            if not p.exists():
                return False
            with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return m.find(text) >= 0

        return BuildInfo(folder, (folder / "libggml-cuda.so").exists(),
                         has("libggml-base.so", b"PEER_SCHED_SYNC"), has("libggml-cuda.so", b"PEER_DISABLE_GDN_FUSION"))


@dataclass(frozen=True)
class Switches:
    """The environment of one llama.cpp process and, per knob, how it was expressed."""

    env: dict[str, str]
    notes: tuple[str, ...] = field(default=())


def switches_for(strategy: Strategy, build: BuildInfo, has_gdn: bool = False) -> Switches:
    """The llama.cpp environment for ``strategy`` on ``build`` (``has_gdn``: the model has
    gated-delta-net layers, the only ones the GDN copy-removal switch acts on)."""
    s = strategy
    if s.allocator != "serial-reuse":
        raise SwitchError(f"llama.cpp has no switch for --allocator {s.allocator}: its graph allocator "
                          "(ggml-alloc) always reuses buffers in graph order (serial-reuse); drop --allocator")
    if s.pdl and ((s.pdl_wait, s.pdl_trigger) != ("first-read", "start") or s.pdl_families):
        raise SwitchError("llama.cpp has no switch for PDL placement (--pdl-wait/--pdl-trigger, per-family "
                          "placements): GGML_CUDA_PDL turns its own placement on or off; drop the placement "
                          "options")
    if s.streams == "auto":
        raise SwitchError("llama.cpp has no switch for --streams auto: GGML_CUDA_GRAPH_OPT forks only Q/K/V "
                          "(--streams qkv); use --streams qkv or single")
    if s.streams == "qkv" and not s.graphs:
        raise SwitchError("--streams qkv maps to GGML_CUDA_GRAPH_OPT, which acts only under CUDA graphs: "
                          "add --graphs")
    if s.logits != "copy":
        raise SwitchError(f"llama.cpp has no switch for --logits {s.logits}: llama_decode copies the logits to a "
                          "pinned host buffer after the graph (ggml_backend_tensor_get_async); drop --logits for "
                          "llamacpp (zero-copy runs on the cuda and sim backends)")
    ours = sorted(s.fusion & set(WORKBENCH_FUSIONS))
    if ours:
        raise SwitchError(f"llama.cpp has no kernel for --fusion {','.join(ours)}: the workbench's own fusions run "
                          "on the cuda, reference and sim backends only; drop them for llamacpp")
    fused = sorted(s.fusion - {"copy-elim"})  # llama.cpp's own set: one switch for all of it
    if "copy-elim" in s.fusion and not fused:
        raise SwitchError("llama.cpp removes the GDN state copy (--fusion copy-elim) only inside its fusion pass: "
                          "use --fusion copy-elim,rms-norm-mul")
    gpu_knobs = [k for k, on in (("--graphs", s.graphs), ("--pdl", s.pdl), ("--streams qkv", s.streams == "qkv"),
                                 (f"--sync {s.sync}", s.sync != "per-copy"), ("--fusion", bool(s.fusion))) if on]
    if gpu_knobs and not build.cuda:
        raise SwitchError(f"the llama.cpp build in {build.folder} is CPU-only: {', '.join(gpu_knobs)} "
                          "switch(es) act on its CUDA backend; point --llamacpp at a CUDA build "
                          "(python -m workbench.llamacpp.build --cuda-arch 90) or drop them")
    env: dict[str, str] = {}
    notes: list[str] = []
    if not s.graphs:
        env["GGML_CUDA_DISABLE_GRAPHS"] = "1"
    if not s.pdl:
        env["GGML_CUDA_PDL"] = "0"
    if s.streams == "qkv":
        env["GGML_CUDA_GRAPH_OPT"] = "1"
    if fused:
        notes.append("fusion: GGML_CUDA_DISABLE_FUSION unset turns on llama.cpp's whole fusion set "
                     f"({', '.join(sorted(LLAMACPP_FUSION))})")
        rest = sorted(LLAMACPP_FUSION - s.fusion - {"copy-elim"})
        if rest:
            notes.append(f"fusion: llama.cpp cannot turn its fusions on one by one: {', '.join(rest)} run as well")
        if has_gdn and "copy-elim" not in s.fusion:
            if not build.gdn_fusion_patch:
                raise SwitchError(f"keeping the GDN state copy while fusing (--fusion {','.join(fused)} without "
                                  f"copy-elim) needs the peer patch PEER_DISABLE_GDN_FUSION, which {build.folder} "
                                  "lacks; add copy-elim or rebuild from the patched peer tree")
            env["PEER_DISABLE_GDN_FUSION"] = "1"
    elif build.cuda:
        env["GGML_CUDA_DISABLE_FUSION"] = "1"
    if s.sync != "per-copy":
        if not build.sched_sync_patch:
            raise SwitchError(f"--sync {s.sync} maps to PEER_SCHED_SYNC (the peer patch emulating PR 17795), "
                              f"which the build in {build.folder} lacks; rebuild from the patched peer tree "
                              "or use --sync per-copy")
        env["PEER_SCHED_SYNC"] = s.sync
    return Switches(env, tuple(notes))


def describe(env: dict[str, str]) -> str:
    """``GGML_CUDA_PDL=0 GGML_CUDA_GRAPH_OPT=1`` (``(llama.cpp defaults)`` when empty)."""
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(llama.cpp defaults)"
