STAGES=build bash benchmarks/llamacpp_gpu_run.sh > $OUT/build.log 2>&1; tail -1 $OUT/build.log
. benchmarks/device_env.sh
export WORKBENCH_LLAMACPP=/tmp/peer-build-cuda/bin LD_LIBRARY_PATH=/tmp/peer-build-cuda/shim/lib:${LD_LIBRARY_PATH:-}
M=/root/.cache/workbench/gguf/llama-tiny-2L-f16-s0-704660d47bf7.gguf
for pre in "" "import numpy" "import pandas" "import pyarrow"; do
  echo "=== pre: $pre"
  timeout 60 python3 -c "
$pre
import sys; sys.path.insert(0, 'workbench/llamacpp'); import ctypes_api
lib = ctypes_api.LibLlama('$WORKBENCH_LLAMACPP'); m = lib.load_model('$M', 999); print('loaded', m)
" 2>&1 | tail -3
done
echo "=== libstdc++ in use"; python3 -c "import pandas, os; print([l.split()[-1] for l in open('/proc/self/maps') if 'stdc++' in l][:2])"
echo "=== LD_PRELOAD system libstdc++ + worker"
SYS=$(g++ -print-file-name=libstdc++.so.6); echo $SYS
WORKBENCH_LLAMACPP_LOG=0 LD_PRELOAD=$SYS timeout 60 python3 -m workbench.llamacpp.worker /tmp/jgpu/job.json 2>&1 | tail -3; cat /tmp/jgpu/result.json | head -c 200; echo
