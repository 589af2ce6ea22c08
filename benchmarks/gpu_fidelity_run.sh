#!/usr/bin/env bash
# Issue 6 on a GPU machine, in one call: recorded traces, calibration (raw +
# fitted), the fidelity matrix, tracing overhead. Results go to $OUT/results.tgz (re-packed
# after every stage, so a stage that runs out of time still leaves the earlier ones) and the
# whole log to $OUT/log.txt. Stages to run: arguments (default: all, in this order).
# `fidelity` measures, in one interleaved run (benchmarks/decode_matrix.py, about 4-5 min on an
# H200; it starts no model after 270 s), the fidelity matrix on full-size models and the eager
# knob cells, alone and stacked, that the simulator's eager PDL / multi-stream costs are fitted
# and checked against: $R/decode_matrix.jsonl, read by benchmarks/sim_fidelity.py report,
# benchmarks/eager_knobs.py report --measured and python -m workbench.exec.fit_eager --measured.
#
#   bash benchmarks/gpu_fidelity_run.sh [traces] [calibrate] [fidelity] [overhead] [gputests]
set -u
OUT=${OUT:-out}
R=$OUT/r
mkdir -p "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
. benchmarks/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$R/nvidia-smi.csv"
python3 -c "import cupy, cupti; print('cupy', cupy.__version__, 'cupti-python ok')"
stages=${*:-traces calibrate fidelity overhead gputests}
pack() { tar czf "$OUT/results.tgz" -C "$OUT" r; }
t0=$(date +%s)
for st in $stages; do
    echo "=== $st ($(( $(date +%s) - t0 )) s)"
    case $st in
        traces) timeout 150 python3 benchmarks/record_traces.py --out-dir "$R" ;;
        gputests) timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cupti.py ;;
        calibrate) timeout 240 python3 -m workbench.cli calibrate --raw "$R/calibration_raw.json" \
                       --out "$R/calibration.json" ;;
        overhead) timeout 150 python3 benchmarks/trace_overhead.py --rounds 5 --kinds-sweep --out "$R/trace_overhead.json" ;;
        fidelity|eager) timeout 360 python3 benchmarks/decode_matrix.py --tokens 32 --repeats 3 --budget 270 \
                      --out "$R/decode_matrix.jsonl" ;;
        *) echo "unknown stage $st" ;;
    esac
    echo "=== $st exit $? ($(( $(date +%s) - t0 )) s)"
    pack
done
