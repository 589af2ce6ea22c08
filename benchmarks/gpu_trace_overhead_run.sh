#!/usr/bin/env bash
# Issue 6, tracing overhead on a GPU machine, in one call: two passes of
# benchmarks/trace_overhead.py over the tracing modes (each mode in its own process), the
# graph-level recorded trace, and the CUPTI GPU tests. Results under $OUT.
#
#   bash benchmarks/gpu_trace_overhead_run.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT/traces"
exec > >(tee -a "$OUT/log.txt") 2>&1
. benchmarks/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
for pass in 1 2; do
    timeout 200 python3 benchmarks/trace_overhead.py --rounds 7 --modes node,graph,graph+node-window \
        --out "$OUT/trace_overhead_pass$pass.json"
done
timeout 100 python3 benchmarks/record_traces.py --only llama-3.2-1b_all-on_graph-level --out-dir "$OUT/traces"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cupti.py tests/gpu/test_cuda_errors.py
