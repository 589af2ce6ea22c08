"""The ``llamacpp`` backend: the real llama.cpp, loaded from a build the user points to.

The model runs as llama.cpp builds it (its own graph, kernels, allocator, CUDA graphs, PDL and
fusions); the workbench's Plans are kept only as metadata. A preset (or config.json) runs from
its GGUF, written once with the seeded random weights every other backend uses
(``workbench.models.gguf_write``), so logits compare with ``reference``; a config loaded from a
``.gguf`` runs that file. The Strategy becomes llama.cpp's environment switches
(``workbench.llamacpp.switches``); since llama.cpp reads them once per process, every run is
its own worker process (``workbench.llamacpp.worker``), set up and timed as llama-bench's
``tg`` test (same context parameters, threadpool, warm-up, cached depth prefill, timed loop and
statistic: tokens/s per repetition) and, with ``trace``, recorded in-process by CUPTI.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..graph import is_quantized
from ..models import ModelConfig
from .backend import BackendError, RunRequest
from .run import Run

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Trace

#: environment variable naming the build folder (libllama.so, libggml*.so)
BUILD_ENV = "WORKBENCH_LLAMACPP"
#: llama-bench's defaults (``cmd_params_defaults``): logical batch and micro-batch (the depth
#: prefill's chunks, and the graph llama.cpp reserves its compute buffers for)
N_BATCH, N_UBATCH = 2048, 512


def physical_cores() -> int:
    """llama-bench's default thread count (``common_cpu_get_num_math`` on x86 Linux): one per
    physical core, counted as distinct ``thread_siblings`` sets in sysfs; half the logical CPUs
    (at least 4 of them) or all, as its fallback, when sysfs says nothing."""
    siblings: set[str] = set()
    cpu = 0
    while True:
        try:
            text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings").read_text()
        except OSError:
            break
        siblings.add(text.strip())
        cpu += 1
    if siblings:
        return len(siblings)
    n = os.cpu_count() or 1
    return n // 2 if n >= 4 else n


@dataclass(frozen=True)
class LlamaCppOptions:
    """``build``: folder with ``libllama.so`` and ``libggml*.so`` (default ``$WORKBENCH_LLAMACPP``);
    ``gpu_layers``: layers offloaded (-1: all when the build has CUDA, else 0); ``reps``: timed
    repetitions of the tokens (llama-bench's ``-r``; logits and trace come from the last);
    ``warmup``: one untimed token first (llama-bench does); ``threads``: CPU threads (0:
    llama-bench's default, :func:`physical_cores`); ``flash_attn``: llama-bench's ``-fa 1``;
    ``logits``: read the tokens' logits in one more, untimed repetition (off: the run's logits
    are None); ``fill``: how a preset's GGUF is written (``exact``: ``random_weights(seed)``, the
    logits compare with the reference; ``tiled``: a timing run's, written in seconds, see
    ``gguf_write.FILLS``); ``timeout_s``: per worker process."""

    build: str | None = None
    gpu_layers: int = -1
    reps: int = 1
    warmup: bool = True
    threads: int = 0
    flash_attn: bool = True
    logits: bool = True
    fill: str = "exact"
    timeout_s: float = 900.0


def build_folder(options: LlamaCppOptions) -> Path:
    """The build folder from the options or the environment; a clear error when there is none."""
    from ..llamacpp.ctypes_api import LlamaCppError, find_libs

    folder = options.build or os.environ.get(BUILD_ENV)
    if not folder:
        raise BackendError(f"no llama.cpp build given: pass --llamacpp DIR (build=...) or set {BUILD_ENV} to a "
                           "folder holding libllama.so and libggml*.so (python -m workbench.llamacpp.build makes a "
                           "CPU one)")
    try:
        find_libs(folder)
    except LlamaCppError as e:
        raise BackendError(str(e)) from None
    return Path(folder).resolve()


def model_file(cfg: ModelConfig, seed: int, fill: str = "exact") -> Path:
    """The GGUF llama.cpp runs: the user's file, or the config's written with seeded weights (in
    the config's block type when ``--weight-dtype`` names one: the blocks the reference runs)."""
    from ..models import from_gguf
    from ..models.gguf_write import cached_gguf

    src = cfg.source if cfg.source and cfg.source.endswith(".gguf") else None
    if src:
        n_file = from_gguf(src).n_layer
        if n_file != cfg.n_layer:
            raise BackendError(f"{src} has {n_file} layers and llama.cpp runs a GGUF as it is: drop --layers "
                               f"({cfg.n_layer}) or pass the preset name to write a {cfg.n_layer}-layer GGUF")
        return Path(src)
    return cached_gguf(cfg, seed=seed, qtype=cfg.weight_dtype if is_quantized(cfg.weight_dtype) else "f16", fill=fill)


def has_gdn(cfg: ModelConfig) -> bool:
    return cfg.family == "gdn"


class LlamaCppBackend:
    """Decode steps in the real llama.cpp (one worker process per run)."""

    name = "llamacpp"
    Options = LlamaCppOptions
    #: llama.cpp runs its own graph, allocator and streams: the workbench's Plans ride along as
    #: metadata, so a race check of them would prove nothing about this run (the lab says so)
    schedules_own_graph = True

    def configured(self) -> bool:
        """A build is named by ``$WORKBENCH_LLAMACPP`` and holds the libraries (what the lab offers)."""
        try:
            build_folder(LlamaCppOptions())
        except BackendError:
            return False
        return True

    def can_trace(self) -> bool:
        """CUPTI timelines need the configured build to have CUDA (a CPU build's runs are timed per token)."""
        from ..llamacpp.switches import BuildInfo

        return self.configured() and BuildInfo.of(build_folder(LlamaCppOptions())).cuda

    def available(self) -> tuple[bool, str]:
        """Always runnable here: which build is used is an option (``build`` / ``--llamacpp``),
        and ``run`` names a missing or unusable one."""
        try:
            folder = build_folder(LlamaCppOptions())
        except BackendError:
            return True, "a llama.cpp build given by --llamacpp DIR (no WORKBENCH_LLAMACPP is set)"
        from ..llamacpp.switches import BuildInfo

        info = BuildInfo.of(folder)
        return True, f"llama.cpp build in {folder} ({'CUDA' if info.cuda else 'CPU only'})"

    def compute_capability(self, options: Any) -> tuple[int, int] | None:
        return None  # llama.cpp checks its own device limits; the Plans are metadata here

    def run(self, req: RunRequest) -> Run:
        from ..llamacpp.switches import BuildInfo, SwitchError, describe, switches_for

        opts = req.options if isinstance(req.options, LlamaCppOptions) else LlamaCppOptions()
        folder = build_folder(opts)
        info = BuildInfo.of(folder)
        try:
            sw = switches_for(req.strategy, info, has_gdn(req.cfg))
        except SwitchError as e:
            raise BackendError(str(e)) from None
        if req.trace and not info.cuda:
            raise BackendError(f"--trace records llama.cpp's CUDA kernels with CUPTI; the build in {folder} is "
                               "CPU-only: point --llamacpp at a CUDA build")
        req.report("weights")
        path = model_file(req.cfg, req.seed, opts.fill)
        gpu_layers = opts.gpu_layers if opts.gpu_layers >= 0 else (999 if info.cuda else 0)
        rng = np.random.default_rng([req.seed, 1])
        prompt = [int(t) for t in rng.integers(0, req.cfg.get("vocab_size"), req.start_pos)]
        job = dict(lib=str(folder), model=str(path), n_gpu_layers=gpu_layers, n_ctx=req.cfg.context,
                   n_batch=N_BATCH, n_ubatch=N_UBATCH, n_threads=opts.threads or physical_cores(),
                   flash_attn=int(opts.flash_attn), token_ids=[int(t) for t in req.token_ids], prompt_ids=prompt,
                   warmup=opts.warmup, reps=opts.reps, logits=opts.logits, trace=req.trace)
        req.report("tokens", 0, len(req.token_ids))
        result, logits, trace = run_worker(job, sw.env, opts.timeout_s)
        req.report("tokens", len(req.token_ids), len(req.token_ids))
        per_tok = np.asarray(result["per_token_ns"], np.float64) / 1e3  # [reps, tokens] us
        rep_us = np.asarray(result["rep_ns"], np.float64) / 1e3  # llama-bench's samples_ns: the token loop
        n = per_tok.shape[1]
        stats = {
            "tokens": n,
            "us_per_token": float(np.mean(rep_us / n)),
            "us_per_token_median": float(np.median(per_tok)),
            "us_per_token_min": float(per_tok.min()),
            "us_per_token_max": float(per_tok.max()),
            "tokens_per_s": float(np.mean(n / (rep_us / 1e6))),  # llama-bench's avg_ts
            "tokens_per_s_sd": float(statistics.stdev(n / (rep_us / 1e6))) if len(rep_us) > 1 else 0.0,
            "reps": int(per_tok.shape[0]),
            "threads": int(result["n_threads"]),
        }
        if logits is not None:
            stats["logits_finite"] = bool(np.isfinite(logits).all())
        gpus = [d["description"] for d in result["devices"] if d["type"] == "gpu"]
        device = (f"{gpus[0]} (llama.cpp, CUDA)" if gpus and gpu_layers > 0
                  else "CPU (llama.cpp)")
        if trace is None:  # one host-timed span per token (decode + synchronize), as the cuda backend gives
            trace = token_trace(result["token_start_ns"], (per_tok[-1] * 1e3).astype(np.int64))
        meta = {"plans": list(req.plans), "start_pos": req.start_pos, "gguf": str(path), "build": str(folder),
                "switches": sw.env, "switches_text": describe(sw.env), "switch_notes": list(sw.notes),
                "per_token_us": per_tok.tolist(), "rep_us": rep_us.tolist(),
                "system_info": result.get("system_info", ""), "devices": result["devices"]}
        trace.meta.update(switches=describe(sw.env), model=req.cfg.name, layers=req.cfg.n_layer,
                          strategy=req.strategy.label(), strategy_knobs=req.strategy.to_dict(),
                          gpu_name=gpus[0] if gpus else "CPU", context=req.cfg.context,
                          us_per_token=stats["us_per_token"], start_pos=req.start_pos)
        return Run("llamacpp", device, req.plans[-1] if req.plans else None, logits, trace, stats, meta)


def token_trace(start_ns, dur_ns) -> Trace:
    """A coarse trace of an untraced run: one NVTX marker per token, its decode + synchronize."""
    from ..trace import MARKER_ROW, Trace

    rows = [dict(row=MARKER_ROW, kind="marker", name=f"token {i}", start_ns=int(s), end_ns=int(s) + int(d), token=i)
            for i, (s, d) in enumerate(zip(start_ns, dur_ns))]
    return Trace(pd.DataFrame(rows, columns=["row", "kind", "name", "start_ns", "end_ns", "token"]),
                 {"source": "host", "backend": "llamacpp"})


def linked_libstdcxx(lib: Path) -> str | None:
    """The ``libstdc++`` that ``lib`` resolves to (``ldd``), None when it cannot be told."""
    try:
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.startswith("libstdc++.so") and target.startswith("/"):
            return target.split(" (")[0]
    return None


def worker_env(switches: dict[str, str], folder: str | Path | None = None) -> dict[str, str]:
    """The worker's environment: ours without any llama.cpp switch, plus ``switches``; and the
    build's own ``libstdc++`` preloaded: the worker imports NumPy before it loads libllama, and a
    libstdc++ pulled in by NumPy's extensions first made llama.cpp's tokenizer set-up crash
    (seen on the H200 machine's Python; ``ldd`` named nothing there, so the soname is the fallback,
    resolved by the loader as the build's own link was)."""
    from ..llamacpp.switches import SWITCH_VARS

    env = {k: v for k, v in os.environ.items() if k not in SWITCH_VARS}
    env.update(switches)
    cxx = (linked_libstdcxx(Path(folder) / "libllama.so") if folder else None) or "libstdc++.so.6"
    if "libstdc++" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = cxx + (os.pathsep + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_worker(job: dict[str, Any], switches: dict[str, str], timeout_s: float):
    """Run one job in a fresh process; (result, logits, Trace or None). A failure inside llama.cpp
    (a file it cannot load, a refused context) comes back as a BackendError with llama.cpp's words."""
    from ..trace import Trace

    with tempfile.TemporaryDirectory(prefix="wb-llamacpp-") as tmp:
        out = Path(tmp)
        job = dict(job, out=str(out))
        (out / "job.json").write_text(json.dumps(job))
        try:
            proc = subprocess.run([sys.executable, "-m", "workbench.llamacpp.worker", str(out / "job.json")],
                                  env=worker_env(switches, job["lib"]), capture_output=True, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BackendError(f"the llama.cpp worker ran past {timeout_s:.0f} s (timeout_s) on {job['model']}") \
                from None
        res_path = out / "result.json"
        if not res_path.is_file():
            tail = "\n".join((proc.stderr or "").strip().splitlines()[-8:])
            raise BackendError(f"the llama.cpp worker died (exit {proc.returncode}) on {job['model']}:\n{tail}")
        result = json.loads(res_path.read_text())
        if "error" in result:
            raise BackendError(result["error"])
        logits = np.load(out / "logits.npy") if (out / "logits.npy").is_file() else None
        trace = None
        if (out / "trace.pkl").is_file():
            trace = Trace(pd.read_pickle(out / "trace.pkl"), json.loads((out / "trace.json").read_text()))
        return result, logits, trace
