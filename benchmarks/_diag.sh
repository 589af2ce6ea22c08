STAGES=build bash benchmarks/llamacpp_gpu_run.sh > $OUT/build.log 2>&1; tail -1 $OUT/build.log
. benchmarks/device_env.sh
export WORKBENCH_LLAMACPP=/tmp/peer-build-cuda/bin LD_LIBRARY_PATH=/tmp/peer-build-cuda/shim/lib:${LD_LIBRARY_PATH:-}
python3 -c "
from workbench.exec.llamacpp import linked_libstdcxx, worker_env
print('ldd ->', linked_libstdcxx('$WORKBENCH_LLAMACPP/libllama.so'))
print('LD_PRELOAD ->', worker_env({}, '$WORKBENCH_LLAMACPP').get('LD_PRELOAD'))
"
ldd $WORKBENCH_LLAMACPP/libllama.so | grep -i "stdc\|not found" | head
timeout 60 python3 -c "
import workbench
r = workbench.run('llama-tiny', tokens=3, backend='llamacpp')
print('backend OK', r.stats['us_per_token'])
" 2>&1 | tail -4
export LD_PRELOAD=libstdc++.so.6
echo "=== with LD_PRELOAD=libstdc++.so.6 exported"
timeout 60 python3 -c "
import workbench
r = workbench.run('llama-tiny', tokens=3, backend='llamacpp')
print('backend OK', r.stats['us_per_token'])
" 2>&1 | tail -4
STAGES=tests,traces,bench MODELS=llama-3.2-1b TOTAL_S=430 bash benchmarks/llamacpp_gpu_run.sh > $OUT/run.log 2>&1
grep -E "passed|failed|worst|traces done|best us|^\| (CUDA|PDL|Q/K|fusion|sync|stack|best)" $OUT/run.log | tail -30
ls $OUT/traces
