"""Compose ``data/calibration/h100.json``: the H100's device and kernel model as measured on an
H100 (``data/bench/calibration_h100_measured.json``, `workbench calibrate` on 2026-11-27, raw in
``calibration_raw_h100_s18.json.gz``), the
Python host profile and the eager front-end parameters carried over from the measured H200 file.

Why the host half is carried over: the host costs fitted on the lent H100 machine were not
stable between two calls of the same day (eager minus graph replay on llama-3.2-1b: about 100 us
per layer in the calibration run, 33 us in the fidelity run; see ``data/bench/calibration_h100.md``),
while the H200 machine's host profile is the same Python executor on the same driver and CUDA
runtime. The eager front-end parameters (``eager_pdl_release_ns``, ``eager_channel_switch_ns``)
belong to the GH100 die's host interface, the same on both GPUs.

    python benchmarks/h100_calibration.py            # writes data/calibration/h100.json
    python benchmarks/sim_fidelity.py report data/bench/decode_matrix_h100_s18.jsonl --gpu h100 --out-dir data/bench
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
MEASURED = ROOT / "data" / "bench" / "calibration_h100_measured.json"
H200 = ROOT / "data" / "calibration" / "h200.json"
OUT = ROOT / "data" / "calibration" / "h100.json"
#: the H100's mmvq sweep (benchmarks/mmvq_sweep.py --out on the H100)
MMVQ_SWEEP = ROOT / "data" / "bench" / "mmvq_sweep_h100.json"
#: device fields of the H200 file carried over (the GH100 front end's eager launch behaviour)
CARRIED_DEVICE = ("eager_pdl_release_ns", "eager_channel_switch_ns")


def compose() -> dict:
    h100, h200 = json.loads(MEASURED.read_text()), json.loads(H200.read_text())
    out = {k: h100[k] for k in ("gpu", "name", "device", "default_host_profile", "host_profiles", "sources",
                                "families", "ops")}
    out["gpu"] = "h100"
    src = out["sources"]
    why = ("carried over from data/calibration/h200.json (measured on an H200: same GH100 die, same Python "
           "executor, driver and CUDA runtime); the H100 machine's own host fit was unstable between two calls "
           "of the same day (data/bench/calibration_h100.md). H200 source: ")
    out["host_profiles"]["python"] = dict(h200["host_profiles"]["python"])
    for k in h200["host_profiles"]["python"]:
        src[f"host_profiles.python.{k}"] = why + h200["sources"][f"host_profiles.python.{k}"]
    for k in CARRIED_DEVICE:
        out["device"][k] = h200["device"][k]
        src[f"device.{k}"] = ("carried over from data/calibration/h200.json (the GH100 host interface's eager "
                              "launch handling, the same die on both GPUs). H200 source: "
                              + h200["sources"][f"device.{k}"])
    from mmvq_sweep import fit_calibration

    fit_calibration(json.loads(MMVQ_SWEEP.read_text()), out)
    return out


if __name__ == "__main__":
    OUT.write_text(json.dumps(compose(), indent=2) + "\n")
    print(f"wrote {OUT}")
