"""The handful of ``libllama`` functions the workbench calls, through ctypes.

Mirrors ``include/llama.h`` of the llama.cpp the project measures (the peer tree, 0c1e570):
the two parameter structs are passed by value, so their fields are declared here in the
header's order. Only what a decode loop timed as llama-bench times it needs: backend init,
model load, context, a CPU threadpool attached to it (llama-bench's; without one ggml starts
and joins its threads on every graph compute), one-token batches, decode, synchronize, logits,
memory clear, a sequence's state saved and restored (llama-bench's cached depth prefill),
free; plus the log hook so a failed load can say why.
"""

from __future__ import annotations

import ctypes as C
import os
import sys
from pathlib import Path

#: The shared libraries of a build, in load order (each needs the ones before it).
LIB_ORDER = ("libggml-base.so", "libggml-cpu.so", "libggml-cuda.so", "libggml.so", "libllama.so")


class LlamaCppError(RuntimeError):
    """libllama could not be loaded or refused a model/context; the message says why."""


class ModelParams(C.Structure):
    _fields_ = [
        ("devices", C.c_void_p),
        ("tensor_buft_overrides", C.c_void_p),
        ("n_gpu_layers", C.c_int32),
        ("split_mode", C.c_int),
        ("load_mode", C.c_int),
        ("lazy_mode", C.c_int),
        ("main_gpu", C.c_int32),
        ("tensor_split", C.c_void_p),
        ("progress_callback", C.c_void_p),
        ("progress_callback_user_data", C.c_void_p),
        ("kv_overrides", C.c_void_p),
        ("vocab_only", C.c_bool),
        ("check_tensors", C.c_bool),
        ("use_extra_bufts", C.c_bool),
        ("no_host", C.c_bool),
        ("no_alloc", C.c_bool),
        ("load_mtp", C.c_bool),
    ]


class ContextParams(C.Structure):
    _fields_ = [
        ("n_ctx", C.c_uint32),
        ("n_batch", C.c_uint32),
        ("n_ubatch", C.c_uint32),
        ("n_seq_max", C.c_uint32),
        ("n_rs_seq", C.c_uint32),
        ("n_outputs_max", C.c_uint32),
        ("n_outputs_max_per_seq", C.c_uint32),
        ("n_threads", C.c_int32),
        ("n_threads_batch", C.c_int32),
        ("ctx_type", C.c_int),
        ("rope_scaling_type", C.c_int),
        ("pooling_type", C.c_int),
        ("attention_type", C.c_int),
        ("flash_attn_type", C.c_int),
        ("rope_freq_base", C.c_float),
        ("rope_freq_scale", C.c_float),
        ("yarn_ext_factor", C.c_float),
        ("yarn_attn_factor", C.c_float),
        ("yarn_beta_fast", C.c_float),
        ("yarn_beta_slow", C.c_float),
        ("yarn_orig_ctx", C.c_uint32),
        ("defrag_thold", C.c_float),
        ("cb_eval", C.c_void_p),
        ("cb_eval_user_data", C.c_void_p),
        ("type_k", C.c_int),
        ("type_v", C.c_int),
        ("abort_callback", C.c_void_p),
        ("abort_callback_data", C.c_void_p),
        ("embeddings", C.c_bool),
        ("offload_kqv", C.c_bool),
        ("no_perf", C.c_bool),
        ("op_offload", C.c_bool),
        ("swa_full", C.c_bool),
        ("kv_unified", C.c_bool),
        ("samplers", C.c_void_p),
        ("n_samplers", C.c_size_t),
        ("ctx_other", C.c_void_p),
    ]


class Batch(C.Structure):
    _fields_ = [
        ("n_tokens", C.c_int32),
        ("token", C.POINTER(C.c_int32)),
        ("embd", C.POINTER(C.c_float)),
        ("pos", C.POINTER(C.c_int32)),
        ("n_seq_id", C.POINTER(C.c_int32)),
        ("seq_id", C.POINTER(C.POINTER(C.c_int32))),
        ("logits", C.POINTER(C.c_int8)),
    ]


#: ggml.h's GGML_MAX_N_THREADS (the length of a threadpool's cpumask)
GGML_MAX_N_THREADS = 512


class ThreadpoolParams(C.Structure):
    _fields_ = [
        ("cpumask", C.c_bool * GGML_MAX_N_THREADS),
        ("n_threads", C.c_int),
        ("prio", C.c_int),
        ("poll", C.c_uint32),
        ("strict_cpu", C.c_bool),
        ("paused", C.c_bool),
    ]


LogCallback = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)

#: name -> (restype, argtypes)
SIGNATURES: dict[str, tuple] = {
    "llama_backend_init": (None, []),
    "llama_backend_free": (None, []),
    "llama_log_set": (None, [LogCallback, C.c_void_p]),
    "llama_print_system_info": (C.c_char_p, []),
    "llama_supports_gpu_offload": (C.c_bool, []),
    "llama_model_default_params": (ModelParams, []),
    "llama_context_default_params": (ContextParams, []),
    "llama_model_load_from_file": (C.c_void_p, [C.c_char_p, ModelParams]),
    "llama_model_free": (None, [C.c_void_p]),
    "llama_model_get_vocab": (C.c_void_p, [C.c_void_p]),
    "llama_vocab_n_tokens": (C.c_int32, [C.c_void_p]),
    "llama_init_from_model": (C.c_void_p, [C.c_void_p, ContextParams]),
    "llama_free": (None, [C.c_void_p]),
    "llama_get_memory": (C.c_void_p, [C.c_void_p]),
    "llama_memory_clear": (None, [C.c_void_p, C.c_bool]),
    "llama_batch_get_one": (Batch, [C.POINTER(C.c_int32), C.c_int32]),
    "llama_decode": (C.c_int32, [C.c_void_p, Batch]),
    "llama_synchronize": (None, [C.c_void_p]),
    "llama_get_logits_ith": (C.POINTER(C.c_float), [C.c_void_p, C.c_int32]),
    "llama_set_n_threads": (None, [C.c_void_p, C.c_int32, C.c_int32]),
    "llama_attach_threadpool": (None, [C.c_void_p, C.c_void_p, C.c_void_p]),
    "llama_state_seq_get_size": (C.c_size_t, [C.c_void_p, C.c_int32]),
    "llama_state_seq_get_data": (C.c_size_t, [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32]),
    "llama_state_seq_set_data": (C.c_size_t, [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int32]),
    # ggml's CPU threadpool (libggml-base / libggml-cpu, loaded globally)
    "ggml_threadpool_params_default": (ThreadpoolParams, [C.c_int]),
    "ggml_threadpool_new": (C.c_void_p, [C.POINTER(ThreadpoolParams)]),
    "ggml_threadpool_free": (None, [C.c_void_p]),
    # ggml's device registry (libggml, loaded globally): which devices the build sees
    "ggml_backend_dev_count": (C.c_size_t, []),
    "ggml_backend_dev_get": (C.c_void_p, [C.c_size_t]),
    "ggml_backend_dev_name": (C.c_char_p, [C.c_void_p]),
    "ggml_backend_dev_description": (C.c_char_p, [C.c_void_p]),
    "ggml_backend_dev_type": (C.c_int, [C.c_void_p]),
}

#: enum ggml_backend_dev_type
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel", "meta")


def find_libs(folder: str | Path) -> list[Path]:
    """The build's libraries in load order; a clear error when ``libllama.so`` is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise LlamaCppError(f"llama.cpp build folder {folder} does not exist; point --llamacpp / "
                            "WORKBENCH_LLAMACPP at the folder holding libllama.so and libggml*.so")
    libs = [folder / n for n in LIB_ORDER if (folder / n).exists()]
    if not any(p.name == "libllama.so" for p in libs) or not any(p.name == "libggml-base.so" for p in libs):
        raise LlamaCppError(f"{folder} has no libllama.so / libggml-base.so; point --llamacpp / "
                            "WORKBENCH_LLAMACPP at a llama.cpp build's library folder "
                            "(python -m workbench.llamacpp.build makes one)")
    return libs


class LibLlama:
    """``libllama.so`` of one build, loaded once per process (llama.cpp reads its environment
    switches when its backends initialise, so a process runs one configuration)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.libs = find_libs(self.folder)
        self._handles = []
        try:
            for p in self.libs:
                self._handles.append(C.CDLL(str(p), mode=os.RTLD_NOW | C.RTLD_GLOBAL))
        except OSError as e:
            raise LlamaCppError(f"cannot load the llama.cpp build in {self.folder}: {e}") from None
        self.lib = self._handles[-1]
        for name, (res, args) in SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise LlamaCppError(f"{self.libs[-1]} has no {name}(): it is not the llama.cpp this workbench "
                                    "binds (include/llama.h of the peer tree)")
            fn.restype, fn.argtypes = res, args
        self._pools: list[int] = []  # threadpools attached to contexts (freed with the process)
        self.log: list[str] = []
        self.echo = os.environ.get("WORKBENCH_LLAMACPP_LOG", "") not in ("", "0")
        self.n_logged = 0  # messages ever logged (``log`` keeps the last 400)
        self._log_cb = LogCallback(self._on_log)  # kept alive: libllama holds the pointer
        if os.environ.get("WORKBENCH_LLAMACPP_NOLOG", "") in ("", "0"):
            self.lib.llama_log_set(self._log_cb, None)
        self.lib.llama_backend_init()

    @property
    def has_cuda(self) -> bool:
        return any(p.name == "libggml-cuda.so" for p in self.libs)

    def _on_log(self, level: int, text: bytes, _user: int) -> None:
        msg = text.decode(errors="replace") if text else ""
        if self.echo:  # WORKBENCH_LLAMACPP_LOG=1: llama.cpp's own log on stderr (a crash keeps its last words)
            sys.stderr.write(msg)
            sys.stderr.flush()
        if self.log and level == 5:  # GGML_LOG_LEVEL_CONT
            self.log[-1] += msg
        else:
            self.log.append(msg)
            self.n_logged += 1
        del self.log[:-400]

    def log_since(self, n_logged: int) -> list[str]:
        """The messages logged after the count was ``n_logged``."""
        return self.log[len(self.log) - min(self.n_logged - n_logged, len(self.log)):]

    def devices(self) -> list[dict[str, str]]:
        """The devices ggml registered: name (``CUDA0``, ``CPU``), description (the GPU's name), type."""
        out = []
        for i in range(self.lib.ggml_backend_dev_count()):
            dev = self.lib.ggml_backend_dev_get(i)
            kind = self.lib.ggml_backend_dev_type(dev)
            out.append({"name": (self.lib.ggml_backend_dev_name(dev) or b"").decode(),
                        "description": (self.lib.ggml_backend_dev_description(dev) or b"").decode(),
                        "type": DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else str(kind)})
        return out

    def system_info(self) -> str:
        return (self.lib.llama_print_system_info() or b"").decode()

    def load_model(self, path: str | Path, n_gpu_layers: int) -> int:
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        n_log = self.n_logged
        model = self.lib.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            why = "".join(self.log_since(n_log)).strip().splitlines()
            errors = [line for line in why if "error" in line.lower() or "failed" in line.lower()] or why[-3:]
            raise LlamaCppError(f"llama.cpp cannot load {path}: " + " | ".join(e.strip() for e in errors[-3:]))
        return model

    def new_context(self, model: int, *, n_ctx: int, n_threads: int, flash_attn: int = 1,
                    n_batch: int = 2048, n_ubatch: int = 512) -> int:
        """A context set up as llama-bench's ``to_llama_cparams`` does (defaults otherwise, the
        sliding-window cache as a ring: ``swa_full`` off), with a CPU threadpool of ``n_threads``
        attached as llama-bench attaches one."""
        params = self.lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_ubatch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads
        params.flash_attn_type = flash_attn
        params.offload_kqv = True
        params.op_offload = True
        params.swa_full = False
        params.no_perf = True
        ctx = self.lib.llama_init_from_model(model, params)
        if not ctx:
            raise LlamaCppError("llama.cpp cannot create a context: " + " | ".join(self.log[-3:]).strip())
        tpp = self.lib.ggml_threadpool_params_default(n_threads)
        pool = self.lib.ggml_threadpool_new(C.byref(tpp))
        if not pool:
            raise LlamaCppError(f"ggml_threadpool_new failed for {n_threads} threads")
        self.lib.llama_attach_threadpool(ctx, pool, None)
        self.lib.llama_set_n_threads(ctx, n_threads, n_threads)
        self._pools.append(pool)
        return ctx

    def n_vocab(self, model: int) -> int:
        return int(self.lib.llama_vocab_n_tokens(self.lib.llama_model_get_vocab(model)))

    def decode(self, ctx: int, tokens: list[int]) -> None:
        """Decode ``tokens`` as one batch continuing the sequence (positions follow the cache)."""
        self.decode_batch(ctx, self.batch(tokens))

    def batch(self, tokens: list[int]) -> tuple[Batch, C.Array]:
        """``tokens`` as a ready batch (and the array it points into, kept alive with it): a
        timed loop decodes prepared batches, so it spends no host time building them."""
        arr = (C.c_int32 * len(tokens))(*tokens)
        return self.lib.llama_batch_get_one(arr, len(tokens)), arr

    def decode_batch(self, ctx: int, batch: tuple[Batch, C.Array]) -> None:
        rc = self.lib.llama_decode(ctx, batch[0])
        if rc != 0:
            raise LlamaCppError(f"llama_decode returned {rc}: " + " | ".join(self.log[-2:]).strip())

    def synchronize(self, ctx: int) -> None:
        self.lib.llama_synchronize(ctx)

    def logits(self, ctx: int, n_vocab: int, i: int = -1):
        import numpy as np

        ptr = self.lib.llama_get_logits_ith(ctx, i)
        if not ptr:
            raise LlamaCppError("llama_get_logits_ith returned NULL (no logits for that batch row)")
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    def clear_memory(self, ctx: int, data: bool = False) -> None:
        """Forget every cached token (``data``: zero the buffers too; llama-bench does not)."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(ctx), data)

    def save_state(self, ctx: int, seq: int = 0) -> bytes:
        """Sequence ``seq``'s cache and state, as llama-bench keeps its depth prefill."""
        n = self.lib.llama_state_seq_get_size(ctx, seq)
        buf = (C.c_uint8 * n)()
        got = self.lib.llama_state_seq_get_data(ctx, buf, n, seq)
        if got == 0:
            raise LlamaCppError("llama_state_seq_get_data saved nothing")
        return bytes(buf)[:got]

    def restore_state(self, ctx: int, state: bytes, seq: int = 0) -> None:
        buf = (C.c_uint8 * len(state)).from_buffer_copy(state)
        if self.lib.llama_state_seq_set_data(ctx, buf, len(state), seq) == 0:
            raise LlamaCppError("llama_state_seq_set_data refused the saved state")

    def free(self, ctx: int | None = None, model: int | None = None) -> None:
        if ctx:
            self.lib.llama_free(ctx)
        if model:
            self.lib.llama_model_free(model)


