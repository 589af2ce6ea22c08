#!/usr/bin/env bash
# Issue 20 on a GPU machine, in one call: the eager knob cells (llama-3.2-1b and qwen3-next-80b-a3b
# --layers 8, each knob alone on eager) and, on an H100, a fresh calibration and fidelity matrix.
# Results go to $OUT/results.tgz (re-packed after every stage) and the log to $OUT/log.txt.
#
#   bash benchmarks/gpu_eager_run.sh [eager] [calibrate] [fidelity]      (default: eager)
set -u
OUT=${OUT:-out}
R=$OUT/r
mkdir -p "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
. benchmarks/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$R/nvidia-smi.csv"
stages=${*:-eager}
pack() { tar czf "$OUT/results.tgz" -C "$OUT" r; }
t0=$(date +%s)
for st in $stages; do
    echo "=== $st ($(( $(date +%s) - t0 )) s)"
    case $st in
        eager) timeout 300 python3 benchmarks/eager_knobs.py measure --tokens 32 --repeats 5 --out "$R/eager_knobs.json" ;;
        calibrate) timeout 240 python3 -m workbench.cli calibrate --raw "$R/calibration_raw.json" \
                       --out "$R/calibration.json" ;;
        fidelity) timeout 300 python3 benchmarks/sim_fidelity.py measure --tokens 32 --repeats 4 \
                      --out "$R/fidelity_measured.json" ;;
        *) echo "unknown stage $st" ;;
    esac
    echo "=== $st exit $? ($(( $(date +%s) - t0 )) s)"
    pack
done
