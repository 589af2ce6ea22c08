"""llama-bench's ``tg`` test on a GGUF, set up as the ``llamacpp`` backend sets up its worker.

The backend's timing is checked against this tool (same build, same GGUF, same switches,
threads, batch sizes, depth and tokens), so both the peer benchmark and the tests call it here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def run_llama_bench(exe: str | Path, gguf: str | Path, *, tokens: int, depth: int, reps: int, threads: int,
                    env: dict[str, str], gpu_layers: int = 99, timeout_s: float = 600) -> tuple[list[float], dict]:
    """(us/token per repetition, llama-bench's JSON record) of ``-p 0 -n tokens -d depth``."""
    from ..exec.llamacpp import N_BATCH, N_UBATCH, worker_env

    cmd = [str(exe), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-d", str(depth), "-r", str(reps),
           "-fa", "1", "-ngl", str(gpu_layers), "-t", str(threads), "-b", str(N_BATCH), "-ub", str(N_UBATCH),
           "-o", "jsonl"]
    p = subprocess.run(cmd, env=worker_env(env), capture_output=True, text=True, timeout=timeout_s)
    recs: list[dict[str, Any]] = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not recs:
        raise RuntimeError(f"llama-bench exit {p.returncode}: {(p.stderr or '').strip().splitlines()[-1:]}")
    rec = recs[-1]
    return [1e6 / ts for ts in rec["samples_ts"]], rec
