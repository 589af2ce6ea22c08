#!/usr/bin/env bash
# Issue 13's GPU stages in one call (the device machine keeps nothing between cold calls):
#   build   llama.cpp with CUDA from the carried peer tree (.peer/device_build.sh: llama-bench and
#           libllama.so / libggml*.so for sm_90, ~3.5 min on 16 cores; resumes while the machine is warm)
#   tests   the llamacpp backend's GPU tests (tests/gpu/test_llamacpp.py: logits per family and knob,
#           a trace, and the backend within 3 % of llama-bench)
#   traces  three small CUPTI timelines of llama.cpp (benchmarks/llamacpp_record_trace.py) -> $OUT/traces/
#   bench   benchmarks/llamacpp_peer.py on $MODELS with what is left of TOTAL_S (tiled GGUFs, each
#           deleted when its model is done: the disk holds few big ones); BENCH_ARGS adds options
#           (--context 32768 --start-pos 32736 --tokens 32, --configs ..., --config-s ...);
#           WEIGHT_DTYPES="q4_0 q8_0" runs one pass per block type (default f16)
# Everything goes to $OUT (default ./out), at most 8 files: log.txt, peer_build.log, gpu_tests.log,
# llamacpp_peer.jsonl, llamacpp_peer_<gpu><TAG>.md, and traces/ (3 files) when that stage runs.
# Carry the peer folder as .peer/ (git-ignored) and the wheels as .whl/:
#   STAGES=build,tests,bench MODELS="llama-3.2-1b qwen3-30b-a3b:8" TOTAL_S=560 bash benchmarks/llamacpp_gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT/traces"
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
STAGES=${STAGES:-build,tests,traces,bench}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
. benchmarks/device_env.sh
python3 -c "import gguf" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/.peer/gguf
if ! python3 -c "import yaml" 2>/dev/null; then  # gguf-py imports yaml for model cards only
  mkdir -p /tmp/yamlstub && : > /tmp/yamlstub/yaml.py && export PYTHONPATH=$PYTHONPATH:/tmp/yamlstub
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE "h100|h200" | head -1 | tr 'A-Z' 'a-z')
GPU=${GPU:-gpu}
export PEER_BUILD=${PEER_BUILD:-/tmp/peer-build-cuda}

if has build; then
  [ -f .peer/device_build.sh ] || { echo "no .peer/device_build.sh: copy ../shared/peer to .peer/ and carry it"; exit 2; }
  OUT=$OUT BUILD_TIMEOUT=${BUILD_TIMEOUT:-360} bash .peer/device_build.sh
  rc=$?
  [ $rc -eq 0 ] || { echo "[+$(elapsed)s] build not finished (rc=$rc): run again while the machine is warm"; exit 3; }
fi
export WORKBENCH_LLAMACPP=$PEER_BUILD/bin
export LD_LIBRARY_PATH=$PEER_BUILD/shim/lib:${LD_LIBRARY_PATH:-}
[ -f "$WORKBENCH_LLAMACPP/libllama.so" ] || { echo "no libllama.so in $WORKBENCH_LLAMACPP: run the build stage"; exit 3; }
echo "[+$(elapsed)s] llama.cpp build: $WORKBENCH_LLAMACPP"

if has tests; then
  timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_llamacpp.py \
    > "$OUT/gpu_tests.log" 2>&1
  grep -E "worst relative|kernels without|passed|failed|error" "$OUT/gpu_tests.log" | tail -30
  echo "[+$(elapsed)s] tests done"
fi
if has traces; then
  timeout ${TRACES_TIMEOUT:-120} python3 benchmarks/llamacpp_record_trace.py --out-dir "$OUT/traces"
  echo "[+$(elapsed)s] traces done"
fi
if has bench; then
  # one pass per weight dtype (WEIGHT_DTYPES="q4_0 q8_0": issue 16's table), all into one jsonl and
  # one markdown; each pass gets an equal share of the time left
  dtypes=(${WEIGHT_DTYPES:-f16})
  for i in "${!dtypes[@]}"; do
    wd=${dtypes[$i]}
    left=$(( ${TOTAL_S:-540} - $(elapsed) - 20 ))
    share=$(( left / (${#dtypes[@]} - i) ))
    if [ $share -lt 60 ]; then echo "[+$(elapsed)s] ${share}s left: too little for the $wd benchmark; run STAGES=bench"; break; fi
    timeout $(( share + 15 )) python3 benchmarks/llamacpp_peer.py --models "${MODELS:-llama-3.2-1b}" --budget-s $share \
      --weight-dtype "$wd" --reps ${REPS:-5} --pairs ${PAIRS:-2} --rounds ${ROUNDS:-2} --drop-gguf ${BENCH_ARGS:-} \
      --jsonl "$OUT/llamacpp_peer.jsonl" --md "$OUT/llamacpp_peer_${GPU}${TAG:-}.md" 2>&1 | grep -v "^workbench: " | tail -60
    echo "[+$(elapsed)s] bench ($wd) done"
  done
fi
