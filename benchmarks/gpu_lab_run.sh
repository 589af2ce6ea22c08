#!/usr/bin/env bash
# The lab and the backends on a GPU machine, in one call: GPU tests (errors, CUPTI, node checks,
# the knob matrix with pytest-xdist), the lab latency benchmark and every notebook under nbclient.
# Logs and JSON results go to $OUT (default ./out); each stage has its own time limit.
#   bash benchmarks/gpu_lab_run.sh [stages: tests,nodes,matrix,lab,notebooks]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
. benchmarks/device_env.sh
STAGES=${1:-tests,nodes,matrix,lab,notebooks}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "=== $1 ($(( $(date +%s) - t0 )) s)"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import cupy, cupti, plotly, ipywidgets, nbclient; print('cupy', cupy.__version__, 'plotly', plotly.__version__, 'ipywidgets', ipywidgets.__version__)"
} 2>&1 | tee "$OUT/versions.log"
if has tests; then
  stamp tests
  timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_errors.py \
    tests/gpu/test_cupti.py 2>&1 | tail -15
fi
if has nodes; then
  stamp nodes
  WORKBENCH_GPU_RESULTS=$OUT/nodes.jsonl timeout ${NODES_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider \
    -n ${WORKERS:-6} tests/gpu/test_cuda_nodes.py 2>&1 | tail -8
fi
if has matrix; then
  stamp matrix
  WORKBENCH_GPU_RESULTS=$OUT/matrix.jsonl timeout ${MATRIX_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider \
    -n ${WORKERS:-8} tests/gpu/test_cuda_matrix.py --maxfail=25 > "$OUT/matrix.log" 2>&1
  tail -8 "$OUT/matrix.log"
fi
if has lab; then
  stamp lab
  timeout ${LAB_TIMEOUT:-300} python3 benchmarks/lab_latency.py --out "$OUT/lab_latency.json" \
    ${LAB_ARGS:-} 2>&1 | tail -40
fi
if has notebooks; then
  stamp notebooks
  WORKBENCH_GPU_RESULTS=$OUT/notebooks.jsonl timeout ${NB_TIMEOUT:-480} python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_notebooks_gpu.py 2>&1 | tail -15
fi
stamp done
