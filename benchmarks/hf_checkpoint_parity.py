"""Parity of checkpoints saved by the installed transformers and read by path (issue 19): per
checkpoint of ``tests/hf_checkpoints.CHECKPOINTS``, the max relative logit error against
transformers over the decode, with the config in transformers 5 keys and rewritten to the older
keys, beside what ignoring the row's field would cost (the silent error the suite now rules out).

Usage: ``python benchmarks/hf_checkpoint_parity.py [--out data/bench/hf_checkpoint_parity.md]`` (CPU).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from hf_checkpoints import CHECKPOINTS, TOKENS, hf_logits, save_checkpoint, to_old_keys, workbench_logits  # noqa: E402
from hf_parity import max_rel_err  # noqa: E402

#: per checkpoint: the field that matters and the config change that ignores it
IGNORED = {
    "llama-llama3-rope": ("rope_parameters (llama3, theta 1e6)", {"rope_scaling": None, "rope_theta": 10000.0}),
    "llama-attention-bias": ("attention_bias", {"attention_bias": False}),
    "llama-mlp-bias": ("mlp_bias", {"mlp_bias": False}),
    "llama-linear-rope": ("rope_parameters (linear)", {"rope_scaling": None}),
    "llama-yarn-rope": ("yarn mscale / mscale_all_dim", {"rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 16.0}}),
    "qwen3-head-dim": ("rope_parameters.rope_theta", {"rope_theta": 10000.0}),
    "qwen3-sliding": ("use_sliding_window / max_window_layers", {"use_sliding_window": False}),
    "qwen3-moe": ("norm_topk_prob false", {"norm_topk_prob": True}),
    "qwen3-moe-sparse-step": ("use_sliding_window (Qwen3-MoE)", {"use_sliding_window": False}),
    "gpt-oss-sliding": ("rope_parameters (yarn)", {"rope_scaling": {"rope_type": "default"}}),
    "qwen3-next": ("attention_bias", {"attention_bias": False}),
}


def ignored_error(folder: Path, change: dict, theirs) -> float:
    from workbench.exec.reference import run_reference
    from workbench.models import build_graph, load_config
    from workbench.models.weights import load_safetensors

    cfg = load_config(str(folder), context=32, weight_dtype="f32", kv_dtype="f32")
    cfg = replace(cfg, hf={**cfg.hf, **change})
    graph = build_graph(cfg)
    return max_rel_err(run_reference(cfg, load_safetensors(graph, folder), TOKENS).logits, theirs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "data" / "bench" / "hf_checkpoint_parity.md"))
    args = ap.parse_args(argv)
    import torch
    import transformers

    lines = [f"# Checkpoints saved by transformers, read by path ({datetime.date.today()}, CPU "
             f"{platform.machine()}, transformers {transformers.__version__}, torch {torch.__version__})", "",
             f"Max relative logit error over {len(TOKENS)} decode steps (reference executor, f32). Produced by "
             "`benchmarks/hf_checkpoint_parity.py`; the same checks run in `tests/test_hf_checkpoints.py`.", "",
             "| checkpoint | transformers 5 keys | older keys | field | error if that field were ignored |",
             "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in CHECKPOINTS:
            folder = save_checkpoint(name, Path(tmp) / name)
            theirs = hf_logits(folder)
            new = max_rel_err(workbench_logits(folder), theirs)
            old = max_rel_err(workbench_logits(to_old_keys(folder, Path(tmp) / f"{name}-old")), theirs)
            field, change = IGNORED[name]
            lines.append(f"| {name} | {new:.1e} | {old:.1e} | {field} | {ignored_error(folder, change, theirs):.2f} |")
            print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
