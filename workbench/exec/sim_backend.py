"""The ``sim`` backend: the Plans of a run through the calibrated discrete-event simulator."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .backend import RunRequest
from .calibration import Calibration, default_gpu, load_calibration
from .floor import floor_stats
from .run import Run
from .sim import simulate

_said: set[str] = set()


@dataclass(frozen=True)
class SimOptions:
    """``gpu``: calibration name (None: the GPU present, else the best measured file, said on
    stderr); ``host``: host profile (None: the file's default); ``calibration``: a Calibration
    object, a calibration name (as ``gpu``) or a calibration file's path; ``memo``: replay
    memoised graph tokens (same result, faster)."""

    gpu: str | None = None
    host: str | None = None
    calibration: Calibration | str | Path | None = None
    memo: bool = True


def resolve_calibration(opts: SimOptions) -> Calibration:
    cal = opts.calibration
    if isinstance(cal, (str, Path)):
        named = not isinstance(cal, Path) and not str(cal).endswith(".json")
        return load_calibration(str(cal), opts.host) if named else load_calibration(host=opts.host, path=cal)
    if cal is not None:
        return cal if opts.host is None else cal.with_host(opts.host)
    gpu = opts.gpu
    if gpu is None:
        from .cuda_backend import present_gpu_name

        gpu, _ = default_gpu(present_gpu_name())
    return load_calibration(gpu, opts.host)


class SimBackend:
    """Simulated timing of the Plans; no values (``Run.logits`` is None)."""

    name = "sim"
    Options = SimOptions

    def available(self) -> tuple[bool, str]:
        return True, "the simulator runs anywhere"

    def compute_capability(self, options: SimOptions) -> tuple[int, int] | None:
        return resolve_calibration(options).compute_capability

    def notes(self, options: SimOptions) -> list[str]:
        """Which calibration a run without ``gpu`` uses, and why (said once per process)."""
        if options.gpu is not None or options.calibration is not None:
            return []
        from .cuda_backend import present_gpu_name

        gpu, why = default_gpu(present_gpu_name())
        note = f"simulating with the {gpu} calibration ({why}; choose with --gpu)"
        if note in _said:
            return []
        _said.add(note)
        return [note]

    def calibration_name(self, options: SimOptions) -> str:
        """The calibration this run simulates (the GPU whose memory the model must fit)."""
        return resolve_calibration(options).gpu

    def run(self, req: RunRequest) -> Run:
        from ..trace.stats import summarize

        opts: SimOptions = req.options
        cal = resolve_calibration(opts)
        plans = list(req.plans)
        if cal.executor == "llamacpp":  # llama.cpp's kernel list: its graph, fused as it fuses under these switches
            from .calibrate.llamacpp_schedule import llamacpp_plans_for_steps

            plans = llamacpp_plans_for_steps(req.cfg, req.strategy, len(plans), req.start_pos, cal.compute_capability)
        if cal.compute_capability:
            req.strategy.validate(cal.compute_capability)
        req.report("simulate", 0, len(plans))
        trace = simulate(plans, cal, memo=opts.memo)
        req.report("simulate", len(plans), len(plans))
        trace.meta.update(model=req.cfg.name, strategy=req.strategy.label(), calibration=cal.gpu)
        stats = summarize(trace)
        stats["memory_bytes"] = max(p.memory_bytes for p in plans)
        stats.update(floor_stats(plans, cal, stats["us_per_token"]))
        return Run("sim", cal.device_label, plans[-1], None, trace, stats,
                   {"calibration": cal, "plans": plans, "start_pos": req.start_pos})
