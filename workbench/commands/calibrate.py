"""The ``workbench calibrate`` command: measure (or read raw measurements), fit, write the
calibration file, report the fits. ``--target cuda`` (default) calibrates the workbench's own
executor; ``--target llamacpp`` calibrates llama.cpp from its CUPTI timelines
(``exec/calibrate/llamacpp_fit.py``), recorded now on this GPU or read with ``--from-traces``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..exec.calibrate.check import calibration_run_errors
from ..exec.calibrate.fit import fit
from ..exec.calibrate.measure import measure
from ..exec.calibrate.raw import read_json, write_json
from ..exec.calibrate.specs import CALIBRATION_MODELS, ModelSpec
from ..exec.calibration import CALIBRATION_DIR, EXECUTORS, gpu_key, parse_calibration
from ..exec.fit_eager import fit as fit_eager
from ..exec.fit_eager import has_eager_runs
from ..preflight import calibrate_checks
from ..validate import OptionError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", choices=EXECUTORS, default="cuda",
                   help="whose costs to fit: cuda (the workbench's executor, default) or llamacpp (llama.cpp, from "
                        "CUPTI timelines; writes data/calibration/<gpu>-llamacpp.json)")
    p.add_argument("--out", help="calibration file to write (default data/calibration/<gpu>.json of this GPU, "
                                 "<gpu>-llamacpp.json for --target llamacpp)")
    p.add_argument("--raw", help="also write the raw measurements (JSON, gzip'd if it ends in .gz) here")
    p.add_argument("--from-raw", metavar="RAW", help="fit a calibration from raw measurements (.json or .json.gz); "
                                                     "no GPU needed")
    p.add_argument("--base", help="calibration to start from (default: the shipped one of the same GPU)")
    p.add_argument("--tokens", type=int, default=12, help="decode steps per traced executor run (default 12)")
    p.add_argument("--check", action="store_true", help="after fitting, predict every calibration run of the raw "
                                                        "measurements with the fitted file and print the errors")
    default = ",".join(f"{s.model}:{s.layers}:{s.context}:{s.pos}" for s in CALIBRATION_MODELS)
    p.add_argument("--models", help=f"comma-separated preset[:layers[:context[:pos]]] to measure (default {default})")
    g = p.add_argument_group("--target llamacpp")
    g.add_argument("--from-traces", metavar="DIR", help="fit from llama.cpp timelines recorded before (a folder of "
                                                         ".parquet / .json.gz traces, benchmarks/llamacpp_capture.py); "
                                                         "no GPU needed")
    g.add_argument("--trace-dir", metavar="DIR", help="keep the timelines recorded now here (default: a temporary "
                                                      "folder)")
    g.add_argument("--measured", metavar="JSONL", help="untraced llama.cpp us/token (benchmarks/llamacpp_peer.py "
                                                       "--jsonl) to take CUPTI's per-kernel cost off the durations")
    g.add_argument("--hold-out", metavar="MODELS", help="comma-separated model presets left out of the fit (to "
                                                         "report the error on a family the fit has not seen)")


def parse_models(text: str | None) -> list[ModelSpec]:
    if not text:
        return list(CALIBRATION_MODELS)
    return [ModelSpec.parse(part) for part in text.split(",")]


def main(args: argparse.Namespace) -> int:
    calibrate_checks(vars(args))
    if args.target == "llamacpp":
        return main_llamacpp(args)
    for flag in ("from_traces", "trace_dir", "measured", "hold_out"):
        if getattr(args, flag) is not None:
            raise OptionError(f"--{flag.replace('_', '-')} applies to --target llamacpp only; add --target llamacpp")
    if args.from_raw:
        raw = read_json(Path(args.from_raw))
    else:
        from ..exec.kernels import require_cupy

        require_cupy()
        raw = measure(parse_models(args.models), tokens=args.tokens, log=lambda s: print(s, file=sys.stderr))
        if args.raw:
            write_json(Path(args.raw), raw)
    gpu = raw.get("gpu", "gpu")
    base_path = Path(args.base) if args.base else CALIBRATION_DIR / f"{gpu}.json"
    if not base_path.exists():
        base_path = CALIBRATION_DIR / "h100.json"
    cal = fit(raw, json.loads(base_path.read_text()))
    if has_eager_runs(raw):  # the eager PDL / multi-stream front-end parameters (simulator in the loop)
        cal = fit_eager(raw, cal, log=lambda s: print(s, file=sys.stderr))
    parsed = parse_calibration(cal, "fitted calibration")  # the simulator must be able to read it
    out = Path(args.out) if args.out else CALIBRATION_DIR / f"{gpu}.json"
    out.write_text(json.dumps(cal, indent=2) + "\n")
    print(f"wrote {out} ({cal['name']}); {len(cal['ops'])} ggml ops (or op/kernel pairs) and "
          f"{len(cal['families'])} kernel families fitted", file=sys.stderr)
    for f in [*cal["measured"]["op_fits"], *cal["measured"]["family_fits"]]:
        name = f.get("op", f.get("family"))
        print(f"  {name:34s} {f['kernels']:4d} kernels {f['sizes']:3d} sizes  fixed {f['fixed_ns']:7.0f} ns  "
              f"scale {f['work_scale']:.3f}  median error {100 * f['median_rel_err']:5.1f}%", file=sys.stderr)
    if args.check:
        t = calibration_run_errors(raw, parsed)
        print("calibration runs predicted with the fitted file (untraced us/token; kernels: graph replay, per token)",
              file=sys.stderr)
        print(t.to_string(index=False, float_format=lambda v: f"{v:.1f}"), file=sys.stderr)
    return 0


def main_llamacpp(args: argparse.Namespace) -> int:
    """``--target llamacpp``: record llama.cpp's timelines on this GPU (or read ``--from-traces``),
    fit, write ``<gpu>-llamacpp.json``."""
    from ..exec.calibrate.llamacpp_fit import fit_folder
    from ..exec.calibrate.llamacpp_traces import read_traces

    for flag in ("from_raw", "raw"):
        if getattr(args, flag) is not None:
            raise OptionError(f"--{flag.replace('_', '-')} applies to --target cuda; for llama.cpp use "
                              "--from-traces DIR")
    if args.measured is not None and not Path(args.measured).is_file():
        raise OptionError(f"--measured {args.measured}: no such file (a llamacpp_peer.py --jsonl file)")
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    if args.from_traces:
        folder = Path(args.from_traces)
    else:
        folder = record_llamacpp(args, log)
    gpu = gpu_key(str(read_traces(folder)[0].trace.meta.get("gpu_name", ""))) or "gpu"
    base_path = Path(args.base) if args.base else CALIBRATION_DIR / f"{gpu}.json"
    if not base_path.exists():
        base_path = CALIBRATION_DIR / "h200.json"
    held = [m.strip() for m in (args.hold_out or "").split(",") if m.strip()]
    cal = fit_folder(folder, json.loads(base_path.read_text()), Path(args.measured) if args.measured else None,
                     held, log)
    out = Path(args.out) if args.out else CALIBRATION_DIR / f"{gpu}-llamacpp.json"
    out.write_text(json.dumps(cal, indent=2) + "\n")
    m = cal["measured"]
    log(f"wrote {out} ({cal['name']}) from {len(m['traces'])} traces of {', '.join(m['models'])}"
        f"{'; held out: ' + ', '.join(held) if held else ''}")
    for f in [*m["op_fits"], *m["family_fits"]]:
        name = f.get("op", f.get("family"))
        row = f"  row {f['row_ns']:.3f} ns" if f.get("row_ns") else ""
        log(f"  {name:40s} {f['kernels']:4d} kernels {f['sizes']:3d} sizes  fixed {f['fixed_ns']:7.0f} ns  "
            f"scale {f['work_scale']:.3f}{row}  median error {100 * f['median_rel_err']:5.1f}%")
    for u in m["unmatched"]:
        log(f"  unmatched in {u['trace']}: {u['family']} kernels, {u['exposed_ns_per_token'] / 1e3:.1f} us/token "
            "(llama.cpp's kernel count differs from the Plan's: not fitted)")
    return 0


def record_llamacpp(args: argparse.Namespace, log) -> Path:
    """Record the default llama.cpp captures on this GPU into ``--trace-dir`` (or a temporary folder)."""
    import tempfile

    from ..exec.calibrate.llamacpp_record import CALIBRATION_CAPTURES, record

    folder = Path(args.trace_dir) if args.trace_dir else Path(tempfile.mkdtemp(prefix="llamacpp-traces-"))
    folder.mkdir(parents=True, exist_ok=True)
    for cap in CALIBRATION_CAPTURES:
        path, run = record(cap, folder)
        log(f"recorded {path}: {run['stats']['us_per_token']:.0f} us/token traced")
    return folder
