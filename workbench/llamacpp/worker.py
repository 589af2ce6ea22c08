"""One llama.cpp configuration in its own process: ``python -m workbench.llamacpp.worker JOB.json``.

llama.cpp reads its switches (``GGML_CUDA_*``) once per process, so the backend starts one
worker per strategy with the switches in its environment. The worker loads the build through
ctypes, decodes the job's tokens one at a time and times each as llama-bench does
(``llama_decode`` + ``llama_synchronize``: a warm-up token first, then per repetition the cache
cleared, the depth prompt decoded untimed, the tokens timed). With ``trace`` a CUPTI capture
starts before the first decode (CUPTI must see llama.cpp's CUDA graphs instantiated) and each
timed token of the last repetition is marked. Results go to the job's ``out`` folder:
``result.json`` (timings, facts, or ``error``), ``logits.npy``, ``trace.pkl`` + ``trace.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    from .ctypes_api import LibLlama

    out = Path(job["out"])
    lib = LibLlama(job["lib"])
    devices = lib.devices()
    if job["n_gpu_layers"] > 0 and not any(d["type"] == "gpu" for d in devices):
        raise RuntimeError(f"the llama.cpp build in {job['lib']} sees no GPU (devices: "
                           f"{', '.join(d['name'] for d in devices) or 'none'}); run on a machine with a GPU "
                           "or use a CPU build with n_gpu_layers=0")
    model = lib.load_model(job["model"], job["n_gpu_layers"])
    ctx = lib.new_context(model, n_ctx=job["n_ctx"], n_threads=job["n_threads"], flash_attn=job["flash_attn"],
                          n_batch=job["n_batch"])
    n_vocab = lib.n_vocab(model)
    tokens = [int(t) for t in job["token_ids"]]
    bad = [t for t in tokens + list(job["prompt_ids"]) if not 0 <= t < n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the model's vocabulary (0..{n_vocab - 1})")
    cap = None
    if job["trace"]:
        from ..trace.cupti import CuptiCapture, cupti_available

        if not cupti_available():
            raise RuntimeError("tracing llama.cpp needs cupti-python (pip install cupti-python, or the gpu extra)")
        cap = CuptiCapture(backend="llamacpp").start()  # before the first decode: see the module docstring

    def prompt() -> None:
        ids = list(job["prompt_ids"])
        for i in range(0, len(ids), job["n_batch"]):
            lib.decode(ctx, ids[i:i + job["n_batch"]])
        lib.synchronize(ctx)

    if job["warmup"]:
        lib.decode(ctx, [tokens[0]])
        lib.synchronize(ctx)
    reps = max(1, int(job["reps"]))
    per_token = np.zeros((reps, len(tokens)), np.int64)
    token_start = np.zeros(len(tokens), np.int64)  # host clock, last repetition
    logits = np.zeros((len(tokens), n_vocab), np.float32) if job["logits"] else None
    for r in range(reps):
        lib.clear_memory(ctx)
        prompt()
        last = r == reps - 1
        for i, tok in enumerate(tokens):
            if cap is not None and last:
                cap.mark_token(i)
            t0 = time.perf_counter_ns()
            lib.decode(ctx, [tok])
            lib.synchronize(ctx)
            per_token[r, i] = time.perf_counter_ns() - t0
            token_start[i] = t0
            if logits is not None and last:
                logits[i] = lib.logits(ctx, n_vocab)
    result: dict[str, Any] = {
        "n_vocab": n_vocab, "per_token_ns": per_token.tolist(), "token_start_ns": token_start.tolist(),
        "devices": devices, "system_info": lib.system_info(), "pid": os.getpid(),
    }
    if cap is not None:
        trace = finish_trace(cap, len(tokens))
        trace.events.to_pickle(out / "trace.pkl")
        (out / "trace.json").write_text(json.dumps(trace.meta, default=str))
    if logits is not None:
        np.save(out / "logits.npy", logits)
    return result  # no llama_free: the process ends with os._exit, and CUDA teardown has nothing to add


def finish_trace(cap, n_tokens: int):
    """Stop the capture; name each kernel by its ggml op and add one ``NVTX`` marker per token."""
    import pandas as pd

    from ..trace.table import MARKER_ROW, Trace
    from .kernels import kernel_op, op_family

    trace = cap.stop()
    ev = trace.events
    names = ev["name"].astype(str)
    ops = {n: kernel_op(n) for n in names[ev["kind"] == "kernel"].unique()}
    ev["op"] = [ops.get(n, "") if k == "kernel" else "" for n, k in zip(names, ev["kind"])]
    ev["family"] = [op_family(o) if k == "kernel" else "" for o, k in zip(ev["op"], ev["kind"])]
    marks = sorted(cap.marks, key=lambda m: m[1])
    ends = [ts for _, ts in marks[1:]] + [cap.end_mark]
    markers = pd.DataFrame([dict(row=MARKER_ROW, kind="marker", name=f"token {t}", start_ns=ts, end_ns=end,
                                 token=t, op="", family="") for (t, ts), end in zip(marks, ends)])
    meta = dict(trace.meta, source="cupti", backend="llamacpp", tokens=n_tokens)
    return Trace(pd.concat([ev, markers], ignore_index=True), meta)


def main(argv: list[str] | None = None) -> int:
    import faulthandler

    faulthandler.enable()  # a crash inside libllama prints the Python frame that called it
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    out = Path(job["out"])
    try:
        result = run_job(job)
        rc = 0
    except Exception as e:  # reported to the parent, which raises a clear error
        result = {"error": str(e), "error_type": type(e).__name__, "traceback": traceback.format_exc()}
        rc = 3
    (out / "result.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(rc)  # skip llama.cpp's and CUDA's atexit teardown: the results are written


if __name__ == "__main__":
    sys.exit(main())
