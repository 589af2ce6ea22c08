#!/usr/bin/env bash
# One call after the fusion and quantisation merges: the new fused kernels node by node, the node
# checks and the knob matrix (every fusion in the fused case), then llama.cpp on quantised models
# through the llamacpp backend (builds llama.cpp first). Results and logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
. benchmarks/device_env.sh
t0=$(date +%s); stamp() { echo "=== $1 ($(( $(date +%s) - t0 )) s)"; }
stamp fused
WORKBENCH_GPU_RESULTS=$OUT/gpu_fusions.jsonl timeout 150 python3 -m pytest -q -p no:cacheprovider -n 6 \
  tests/gpu/test_cuda_fused.py tests/gpu/test_cuda_nodes.py 2>&1 | tail -6
stamp matrix
WORKBENCH_GPU_RESULTS=$OUT/gpu_matrix.jsonl timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 \
  tests/gpu/test_cuda_matrix.py --maxfail=20 > "$OUT/matrix.log" 2>&1; tail -4 "$OUT/matrix.log"
stamp build
STAGES=build bash benchmarks/llamacpp_gpu_run.sh > "$OUT/build.log" 2>&1; tail -1 "$OUT/build.log"
export WORKBENCH_LLAMACPP=/tmp/peer-build-cuda/bin LD_LIBRARY_PATH=/tmp/peer-build-cuda/shim/lib:${LD_LIBRARY_PATH:-}
stamp quant
for dt in q4_0 q8_0; do
  for st in "" "--graphs --pdl --fusion rms-norm-mul" "--graphs --pdl --streams qkv --allocator stream-aware --fusion rms-norm-mul"; do
    timeout 120 python3 -m workbench.cli run --model llama-3.2-1b --weight-dtype $dt --backend llamacpp \
      --tokens 64 --start-pos 448 $st --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('$dt', d['strategy_label'], round(d['us_per_token'],1))" \
      | tee -a "$OUT/quant_llamacpp.txt"
  done
done
stamp done
