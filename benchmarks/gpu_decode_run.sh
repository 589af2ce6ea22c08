#!/usr/bin/env bash
# Issue 4's GPU stages in one call (the device machine keeps nothing between calls):
# versions, the mat-vec sweep, node-by-node kernel checks, error checks, the decode benchmark, the knob
# matrix (pytest-xdist workers).
# Logs and JSON results go to $OUT (default ./out); each stage has its own time limit.
# Usage: bash benchmarks/gpu_decode_run.sh [stages: sweep,nodes,errors,bench,matrix] [pytest -k expression for the matrix]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
STAGES=${1:-sweep,nodes,errors,bench,matrix}
KEXPR=${2:-}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/versions.log"
python3 -c "import cupy, numba, cuda.bindings, torch; print('cupy', cupy.__version__, 'numba', numba.__version__, 'cuda.bindings', cuda.bindings.__version__, 'torch', torch.__version__)" 2>&1 | tee -a "$OUT/versions.log"
has() { [[ ",$STAGES," == *",$1,"* ]]; }
if has sweep; then
  timeout ${SWEEP_TIMEOUT:-90} python3 benchmarks/matvec_sweep.py --out "$OUT/matvec_sweep.json" 2>&1 | tail -20
fi
if has nodes; then
  WORKBENCH_GPU_RESULTS=$OUT/nodes.jsonl timeout ${NODES_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -n ${WORKERS:-6} tests/gpu/test_cuda_nodes.py > "$OUT/nodes.log" 2>&1; tail -30 "$OUT/nodes.log"
fi
if has errors; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_errors.py 2>&1 | tail -30 | tee -a "$OUT/versions.log"
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/gpu_decode.py --out "$OUT/gpu_decode.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi
if has matrix; then
  WORKBENCH_GPU_RESULTS=$OUT/matrix.jsonl timeout ${MATRIX_TIMEOUT:-180} python3 -m pytest -q -p no:cacheprovider \
    -n ${WORKERS:-6} tests/gpu/test_cuda_matrix.py --maxfail=${MAXFAIL:-25} ${KEXPR:+-k "$KEXPR"} > "$OUT/matrix.log" 2>&1
  tail -25 "$OUT/matrix.log"
fi
