"""One llama.cpp configuration in its own process: ``python -m workbench.llamacpp.worker JOB.json``.

llama.cpp reads its switches (``GGML_CUDA_*``) once per process, so the backend starts one
worker per strategy with the switches in its environment. The worker loads the build through
ctypes, sets the context up as llama-bench does (its n_batch/n_ubatch, a CPU threadpool
attached, the sliding-window cache as a ring) and times the job's tokens as llama-bench's
``tg`` test does (:func:`time_tokens`). Logits are read, and with ``trace`` each token marked,
in one more repetition after the timed ones, so the timed loop runs nothing llama-bench's does
not. With ``trace`` a CUPTI capture starts before the first decode (CUPTI must see llama.cpp's
CUDA graphs instantiated). Results go to the job's ``out`` folder:
``result.json`` (timings, facts, or ``error``), ``logits.npy``, ``trace.pkl`` + ``trace.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
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
                          n_batch=job["n_batch"], n_ubatch=job["n_ubatch"])
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
    timing = time_tokens(lib, ctx, tokens, list(job["prompt_ids"]), job["n_batch"], max(1, int(job["reps"])),
                         job["warmup"])
    logits = None
    if job["logits"] or cap is not None:  # after the timed repetitions: reading logits costs time
        logits = record_pass(lib, ctx, tokens, timing.depth_state, n_vocab, cap)
    result: dict[str, Any] = {
        "n_vocab": n_vocab, "per_token_ns": timing.per_token_ns.tolist(), "rep_ns": timing.rep_ns.tolist(),
        "token_start_ns": timing.token_start_ns.tolist(), "devices": devices, "system_info": lib.system_info(),
        "pid": os.getpid(), "n_threads": job["n_threads"],
    }
    if cap is not None:
        trace = finish_trace(cap, len(tokens))
        trace.events.to_pickle(out / "trace.pkl")
        (out / "trace.json").write_text(json.dumps(trace.meta, default=str))
    if logits is not None and job["logits"]:
        np.save(out / "logits.npy", logits)
    return result  # no llama_free: the process ends with os._exit, and CUDA teardown has nothing to add


@dataclass
class Timing:
    """llama-bench's samples: ``rep_ns[r]`` the wall time of repetition r's token loop (its
    ``samples_ns``), ``per_token_ns[r, i]`` each token's decode + synchronize inside it,
    ``token_start_ns`` the host clock at each token of the last repetition, ``depth_state`` the
    sequence state after the depth prefill (None without one)."""

    rep_ns: np.ndarray
    per_token_ns: np.ndarray
    token_start_ns: np.ndarray
    depth_state: bytes | None


def time_tokens(lib, ctx, tokens: list[int], prompt_ids: list[int], n_batch: int, reps: int,
                warmup: bool) -> Timing:
    """llama-bench's ``tg`` test, step for step (tools/llama-bench/llama-bench.cpp, main loop):
    the cache cleared (buffers kept), one warm-up token at position 0 (``test_gen(ctx, 1)``);
    per repetition the cache cleared, the depth prompt decoded in ``n_batch`` chunks on the first
    and its saved state restored on the others (``cstate``), then the clock started, each token
    decoded (a batch prepared before the loop) and synchronized, the clock stopped. Nothing else
    runs inside the timed loop (two host clock reads per token, as llama-bench's loop fills its
    batch between tokens)."""
    lib.clear_memory(ctx)
    if warmup:
        lib.decode(ctx, [tokens[0]])
        lib.synchronize(ctx)
    n = len(tokens)
    rep_ns = np.zeros(reps, np.int64)
    per_token = np.zeros((reps, n), np.int64)
    starts = np.zeros(n, np.int64)
    state = None
    clock = time.perf_counter_ns
    decode, sync = lib.decode_batch, lib.synchronize
    batches = [lib.batch([tok]) for tok in tokens]
    for r in range(reps):
        state = depth(lib, ctx, prompt_ids, n_batch, state)
        t_rep = clock()
        for i, batch in enumerate(batches):
            t0 = clock()
            decode(ctx, batch)
            sync(ctx)
            t1 = clock()
            per_token[r, i] = t1 - t0
            starts[i] = t0
        rep_ns[r] = clock() - t_rep
    return Timing(rep_ns, per_token, starts, state)


def depth(lib, ctx, prompt_ids: list[int], n_batch: int, state: bytes | None) -> bytes | None:
    """Clear the cache and put the depth prompt in it: decoded (``test_prompt``) the first time,
    restored from ``state`` after; returns the state to restore next time."""
    lib.clear_memory(ctx)
    if not prompt_ids:
        return None
    if state is not None:
        lib.restore_state(ctx, state)
        return state
    for i in range(0, len(prompt_ids), n_batch):
        lib.decode(ctx, prompt_ids[i:i + n_batch])
    lib.synchronize(ctx)
    return lib.save_state(ctx)


def record_pass(lib, ctx, tokens: list[int], state: bytes | None, n_vocab: int, cap) -> np.ndarray:
    """One more untimed repetition that reads each token's logits (and marks it in the trace)."""
    lib.clear_memory(ctx)
    if state is not None:
        lib.restore_state(ctx, state)
    logits = np.zeros((len(tokens), n_vocab), np.float32)
    for i, tok in enumerate(tokens):
        if cap is not None:
            cap.mark_token(i)
        lib.decode(ctx, [tok])
        lib.synchronize(ctx)
        logits[i] = lib.logits(ctx, n_vocab)
    return logits


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
