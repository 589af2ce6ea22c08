"""Record CUPTI timelines of llama.cpp for ``workbench calibrate --target llamacpp --from-traces``
and the llama.cpp fidelity report (GPU), then bundle them into one tar.

Each model x config (``llamacpp_peer.py``'s MODELS and CONFIGS, reused) is one run of the
``llamacpp`` backend with ``trace`` (``workbench.exec.calibrate.llamacpp_record.record``):
``--tokens`` tokens (default 6) at positions 448.. of a 512-row context (``--context`` and
``--start-pos`` for a long-context capture), written as ``<model>-L<layers>_<config>.parquet``
(``_ctx<N>`` added for another context) in ``--out-dir``. A file already there is kept (a call cut
by ``--budget-s`` or the machine's time limit resumes where it stopped); a config llama.cpp or
this build cannot run is reported and skipped. Then ``--out-dir`` is packed into
``<out-dir>.tar`` (the GPU machine returns few files) with a ``captures.jsonl`` listing each
capture (traced us/token, switches, or the error).

Usage on the GPU machine (``WORKBENCH_LLAMACPP`` = a CUDA build); the folder on a path that
survives between calls of a warm machine, the bundle where the call's files come back from::

    python benchmarks/llamacpp_capture.py --out-dir /tmp/lcap/llamacpp_h200 --tar $OUT/llamacpp_h200.tar \
        --budget-s 480

then, anywhere: ``tar xf llamacpp_h200.tar`` and ``workbench calibrate --target llamacpp
--from-traces llamacpp_h200 --measured peer.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from llamacpp_peer import CONFIGS, MODELS  # noqa: E402

from workbench.exec.calibrate.llamacpp_record import CONTEXT, START, TOKENS, Capture, record  # noqa: E402
from workbench.exec.calibrate.specs import ModelSpec  # noqa: E402

#: configs a plain build runs (the patched ones need the peer tree's patches)
PLAIN_CONFIGS = [name for name, (_, models, patch) in CONFIGS.items() if patch is None and models == "all"]


def captures(models: list[str], configs: list[str], tokens: int, context: int = CONTEXT,
             start_pos: int | None = None) -> list[Capture]:
    """Model specs (``preset[:layers]``, default layers from MODELS) x config names, in a
    ``context``-row context from ``start_pos`` (default: the last 64 rows, as 448 of 512)."""
    start = start_pos if start_pos is not None else context - (CONTEXT - START)
    out = []
    for spec in models:
        ms = ModelSpec.parse(spec)
        n = ms.layers or MODELS.get(ms.model)
        out += [Capture(ms.model, n, c, CONFIGS[c][0], context, start, tokens) for c in configs]
    return out


def bundle(out_dir: Path, tar: Path | None = None) -> Path:
    """``out_dir`` as one uncompressed tar (Parquet is compressed already), beside it by default."""
    tar = tar or out_dir.with_suffix(".tar")
    tar.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar, "w") as tf:
        tf.add(out_dir, arcname=out_dir.name)
    return tar


def drop_tiled(model: str) -> None:
    """Delete the cached tiled GGUFs of ``model`` (what the captures' timing runs wrote)."""
    from workbench.models.gguf_write import cache_dir

    for f in cache_dir().glob(f"{model}-*-tiled-*.gguf"):
        f.unlink(missing_ok=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=" ".join(f"{m}:{n}" if n else m for m, n in MODELS.items()),
                   help="space/comma-separated preset[:layers] (default: llamacpp_peer.py's MODELS)")
    p.add_argument("--configs", default=",".join(PLAIN_CONFIGS),
                   help=f"comma-separated llamacpp_peer.py configs (default {','.join(PLAIN_CONFIGS)})")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--tokens", type=int, default=TOKENS, help=f"timed tokens per capture (default {TOKENS})")
    p.add_argument("--context", type=int, default=CONTEXT,
                   help=f"context rows (default {CONTEXT}); another context is a long-context capture, whose kernels "
                        "(attention over many keys) the fit adds to its kernel fits only; its file ends _ctx<N>")
    p.add_argument("--start-pos", type=int, help="first timed position (default: context - 64)")
    p.add_argument("--budget-s", type=float, default=1e9, help="stop starting captures after this many seconds")
    p.add_argument("--tar", type=Path, help="where to write the bundle (default <out-dir>.tar); e.g. $OUT/x.tar "
                                            "with --out-dir on a path that survives between calls")
    p.add_argument("--no-tar", action="store_true", help="leave the folder unbundled")
    p.add_argument("--drop-gguf", action="store_true",
                   help="delete a model's tiled GGUF after its captures (rewritten in seconds; a 64 GiB disk holds "
                        "few big ones)")
    args = p.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        p.error(f"unknown config(s) {unknown}; choose from {', '.join(CONFIGS)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log = args.out_dir / "captures.jsonl"
    t0, rc = time.time(), 0
    todo = captures(args.models.replace(",", " ").split(), configs, args.tokens, args.context, args.start_pos)
    start = todo[0].start_pos if todo else 0
    if not 0 <= start <= args.context - args.tokens:
        p.error(f"positions {start}..{start + args.tokens - 1} do not fit a {args.context}-row context "
                "(--context, --start-pos, --tokens)")
    for i, cap in enumerate(todo):
        if args.drop_gguf and i and todo[i - 1].model != cap.model:
            drop_tiled(todo[i - 1].model)
        if (args.out_dir / f"{cap.stem}.parquet").exists():
            continue
        if time.time() - t0 > args.budget_s:
            print(f"time budget reached before {cap.stem}; run again to continue", flush=True)
            rc = 3
            break
        rec = {"stem": cap.stem, "model": cap.model, "layers": cap.layers, "config": cap.config,
               "strategy": cap.strategy.label()}
        t = time.time()
        try:
            path, run = record(cap, args.out_dir)
            rec.update(file=path.name, traced_us_per_token=run["stats"]["us_per_token"],
                       switches=run["meta"].get("switches_text", ""))
        except Exception as e:  # one config failing leaves the others recorded
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        rec["seconds"] = round(time.time() - t, 1)
        with open(log, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)
    if args.drop_gguf and todo:
        drop_tiled(todo[-1].model)
    if not args.no_tar:
        print(f"bundled {bundle(args.out_dir, args.tar)}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
