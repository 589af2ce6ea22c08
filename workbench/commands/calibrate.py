"""The ``workbench calibrate`` command: measure (or read raw measurements), fit, write the
calibration file, report the fits."""

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
from ..exec.calibration import CALIBRATION_DIR, parse_calibration
from ..exec.fit_eager import fit as fit_eager
from ..exec.fit_eager import has_eager_runs
from ..preflight import calibrate_checks


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="calibration file to write (default data/calibration/<gpu>.json of this GPU)")
    p.add_argument("--raw", help="also write the raw measurements (JSON, gzip'd if it ends in .gz) here")
    p.add_argument("--from-raw", metavar="RAW", help="fit a calibration from raw measurements (.json or .json.gz); "
                                                     "no GPU needed")
    p.add_argument("--base", help="calibration to start from (default: the shipped one of the same GPU)")
    p.add_argument("--tokens", type=int, default=12, help="decode steps per traced executor run (default 12)")
    p.add_argument("--check", action="store_true", help="after fitting, predict every calibration run of the raw "
                                                        "measurements with the fitted file and print the errors")
    default = ",".join(f"{s.model}:{s.layers}:{s.context}" for s in CALIBRATION_MODELS)
    p.add_argument("--models", help=f"comma-separated preset[:layers[:context]] to measure (default {default})")


def parse_models(text: str | None) -> list[ModelSpec]:
    if not text:
        return list(CALIBRATION_MODELS)
    out = []
    for part in text.split(","):
        bits = part.strip().split(":")
        out.append(ModelSpec(bits[0], int(bits[1]) if len(bits) > 1 and bits[1] else None,
                             int(bits[2]) if len(bits) > 2 and bits[2] else None))
    return out


def main(args: argparse.Namespace) -> int:
    calibrate_checks(vars(args))
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
