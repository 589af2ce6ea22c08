"""Logits of the real llama.cpp (CPU build) against the workbench reference, per family (CPU).

For every family's tiny preset: the GGUF the writer makes, decoded by llama.cpp's CPU backend
through the ``llamacpp`` backend, against ``reference`` on the same weights; the worst
relative error (max |difference| / max |logit|, per token). Also the two cases that show what
the comparison can catch: the Llama GGUF written without the converter's Q/K permutation, and
gpt-oss against HF's un-rounded YaRN (``truncate: false``). Writes
``data/bench/llamacpp_cpu_parity.md``.

Usage: ``python benchmarks/llamacpp_cpu_parity.py [--tokens 8] [--out FILE]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.backend import RunRequest  # noqa: E402
from workbench.exec.llamacpp import LlamaCppBackend, LlamaCppOptions  # noqa: E402
from workbench.exec.reference import run_reference  # noqa: E402
from workbench.llamacpp.build import build  # noqa: E402
from workbench.models import TINY_PRESETS, build_graph, preset  # noqa: E402
from workbench.models.tokens import token_ids  # noqa: E402
from workbench.models.weights import random_weights  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return f"{platform.machine()} CPU"


def worst(got: np.ndarray, want: np.ndarray) -> float:
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--out", default=str(ROOT / "data" / "bench" / "llamacpp_cpu_parity.md"))
    args = p.parse_args()
    lib = str(build())
    rows = []

    def compare(name: str, cfg, ref_cfg, note: str = "") -> None:
        ids = token_ids(cfg, args.tokens, 7)
        run = LlamaCppBackend().run(RunRequest(cfg, Strategy(), [], ids, options=LlamaCppOptions(build=lib)))
        want = run_reference(ref_cfg, random_weights(build_graph(ref_cfg), 0), ids).logits
        same = int((run.logits.argmax(1) == want.argmax(1)).sum())
        rows.append(f"| {name} | {note} | {worst(run.logits, want):.2e} | {same} of {len(ids)} |")
        print(rows[-1], flush=True)

    for name in TINY_PRESETS:
        cfg = preset(name, context=64)
        ref = cfg
        note = "as written"
        if cfg.model_type == "gpt_oss":
            ref = cfg.with_()
            ref.hf["rope_scaling"]["truncate"] = True
            note = "reference with YaRN's correction range rounded, as ggml does"
        compare(name, cfg, ref, note)
    compare("gpt-oss-tiny", preset("gpt-oss-tiny", context=64), preset("gpt-oss-tiny", context=64),
            "reference with HF's `truncate: false` (gpt-oss's config.json)")
    import workbench.models.gguf_write as gw

    gw.llama_permute = lambda w, n_head: w
    os.environ["WORKBENCH_CACHE"] = tempfile.mkdtemp()
    compare("llama-tiny", preset("llama-tiny", context=64), preset("llama-tiny", context=64),
            "GGUF written WITHOUT the Q/K permutation")
    text = "\n".join([
        "# llama.cpp (CPU) vs the workbench reference: logits on the same weights", "",
        f"{datetime.date.today().isoformat()}, {cpu_name()}, llama.cpp of the peer tree (shared/peer/llama.cpp), "
        f"built by `python -m workbench.llamacpp.build` (GGML_NATIVE=OFF); {args.tokens} tokens from position 0, "
        "f16 weights. Error: the worst over tokens of max |llama.cpp - reference| / max |reference logit|. "
        "Written by `benchmarks/llamacpp_cpu_parity.py`; `tests/test_llamacpp_cpu.py` holds the first five "
        "rows to 4e-3.", "",
        "| preset | case | worst relative error | same argmax |", "|---|---|---:|---:|", *rows, ""])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
