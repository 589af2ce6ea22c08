# Sourced by the benchmarks/gpu_*_run.sh scripts on a lent GPU machine (no package index there):
# install the wheels carried in .whl/ (cupti-python, plotly, ipywidgets, ...) into /tmp/site and
# put them and the checkout on PYTHONPATH.
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD  # absolute: notebook kernels start in other folders
else
    export PYTHONPATH=$PWD
fi
