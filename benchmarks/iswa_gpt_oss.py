"""gpt-oss-20b decode at long context on the cuda backend: llama.cpp's iSWA ring for the
sliding layers (its default) against the full-context cache (``--swa-full``), beside the
simulator's prediction of the same cells (issue 21).

Each cell: the median over ``--runs`` runs of the mean time per token of ``--tokens`` steps
ending at the context's last row, eager and with the four seeds stacked (``ALL_ON``), and the
bytes per token of the sliding layers' cache store and attention from the ops' cost model.
Weights are drawn on the GPU; the two cache modes run one after the other (each holds its own
weights: the whole model twice would not fit an 80 GB GPU).

Usage: ``python benchmarks/iswa_gpt_oss.py [--context 32768] [--layers 24] [--out $OUT/iswa_gpt_oss.json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from workbench.models import build_graph, preset  # noqa: E402
from workbench.models.blocks import swa_cache_rows  # noqa: E402
from workbench.strategy import ALL_ON, Strategy  # noqa: E402


def sliding_bytes(cfg, n_kv: int) -> float:
    """Bytes per token of the sliding layers' SET_ROWS and FLASH_ATTN_EXT (cost model)."""
    from workbench.models.hf_keys import sliding_layers

    slide = sliding_layers(cfg.hf)
    return float(sum(n.bytes for n in build_graph(cfg, n_kv).nodes if n.op in ("SET_ROWS", "FLASH_ATTN_EXT")
                     and slide[int(n.name.rsplit("-", 1)[1])]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--layers", type=int, default=None, help="default: all 24")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", default=None, help="default: $OUT/iswa_gpt_oss.json or ./iswa_gpt_oss.json")
    args = ap.parse_args(argv)
    import os

    import cupy as cp
    from gpu_decode import device_info, time_strategy

    import workbench
    from workbench.exec.cuda import CudaExecutor

    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "iswa_gpt_oss.json")
    start = args.context - args.tokens
    result: dict = {"device": device_info(cp), "context": args.context, "tokens": args.tokens, "runs": args.runs,
                    "cells": []}
    for swa_full in (False, True):
        cfg = preset("gpt-oss-20b", context=args.context, layers=args.layers).with_(swa_full=swa_full)
        mode = "full (--swa-full)" if swa_full else f"iSWA ring ({swa_cache_rows(cfg)} rows)"
        base = CudaExecutor(cfg, Strategy(), weights="device")
        for label, strategy in (("eager", Strategy()), ("all-on", ALL_ON)):
            row = time_strategy(cfg, strategy, base, args.tokens, args.runs, start)
            sim = workbench.run(cfg, strategy, tokens=args.tokens, start_pos=start, backend="sim", quiet=True,
                                gpu="h200" if "H200" in result["device"]["gpu"] else "h100")
            row.update(cache=mode, cell=label, sim_us_per_token=sim.stats["us_per_token"],
                       sliding_bytes_per_token=sliding_bytes(cfg, cfg.kv_len(start)))
            result["cells"].append(row)
            print(f"{mode:24s} {label:7s} {row['us_per_token_median']:8.1f} us/token (sim "
                  f"{row['sim_us_per_token']:.1f}), sliding layers {row['sliding_bytes_per_token'] / 1e9:.3f} GB/token",
                  flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
        del base
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
