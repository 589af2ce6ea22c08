"""Try to provoke, on the ``cuda`` backend, every kind of race the verifier reports.

For each seeded bug of ``workbench.verify.seeded`` that runs on a model (the hand-built ones
have no model weights and are listed as not attempted), on a model large enough for the racing
kernels to overlap:

1. the static verdict: ``verify`` of the broken Plan for that model (must report the race);
2. a control run: the same knobs made safe (stream-aware allocation, PDL wait first-read, no
   mutation) on the GPU, compared against the NumPy reference with the same weights;
3. ``--repeats`` runs of ``--tokens`` decode steps of the broken Plan (the executor compiles its
   Plans through a patched ``compile_plan`` that applies the bug's mutation, so graph capture,
   events, streams, PDL placements and the host program are the broken ones), each compared
   against the reference: a token whose logits differ by more than ``--tol`` (max abs error over
   max abs reference value) reproduces the race.

A race that CUDA itself refuses (e.g. a capture whose side stream never joins fails with
cudaErrorStreamCaptureUnjoined) is recorded with the error. Results go to
``$OUT/race_provoke.json`` (or ``--out``): per bug and per race kind, reproduced or not, with
error sizes, so a "not reproduced" is reported as such, never as "safe".

    python benchmarks/race_provoke.py [--repeats 20] [--tokens 16] [--bugs NAME ...] [--dry-run]

``--dry-run`` does only step 1 (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from workbench.models import build_graph, preset
from workbench.models.tokens import token_ids
from workbench.strategy import Strategy
from workbench.verify import verify
from workbench.verify.seeded import SEEDED_BUGS, SeededBug, compile_quietly

#: the GPU-sized model each seeded bug's small model stands for (long kernels, real overlap)
GPU_MODELS = {
    "llama-tiny": dict(model="llama-3.2-1b", layers=4, context=2048),
    "qwen3-next-tiny": dict(model="qwen3-next-80b-a3b", layers=4, context=512),
}


def safe(strategy: Strategy) -> Strategy:
    """The bug's knobs with the unsafe ones fixed: the control run."""
    s = strategy.with_(pdl_families=())
    if s.streams != "single" and s.allocator == "serial-reuse":
        s = s.with_(allocator="stream-aware")
    if s.pdl and s.pdl_wait == "late":
        s = s.with_(pdl_wait="first-read")
    return s


def gpu_config(bug: SeededBug, args: argparse.Namespace):
    spec = dict(GPU_MODELS.get(bug.model, dict(model=bug.model)))
    if args.model:
        spec.update(model=args.model)
    for key in ("layers", "context"):
        if getattr(args, key):
            spec[key] = getattr(args, key)
    return preset(spec.pop("model"), **spec)


@contextmanager
def mutated_compile(bug: SeededBug | None):
    """Make the cuda executor compile every Plan with the bug's mutation applied."""
    import workbench.exec.cuda as cuda_mod

    real = cuda_mod.compile_plan

    def broken(graph, strategy, device_cc=None):
        plan = compile_quietly(graph, strategy, device_cc)
        return bug.apply(plan) if bug is not None else plan

    cuda_mod.compile_plan = broken
    try:
        yield
    finally:
        cuda_mod.compile_plan = real


def rel_errors(logits: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per token: max |difference| / max |reference|."""
    scale = np.maximum(np.abs(ref).max(axis=1), 1e-30)
    return np.abs(logits - ref).max(axis=1) / scale


def run_on_gpu(cfg, strategy: Strategy, bug: SeededBug | None, ids: list[int], weights, ref: np.ndarray,
               repeats: int, tol: float, start_pos: int = 0) -> dict:
    import workbench
    from workbench.exec.cuda import CudaExecutor

    out = {"strategy": strategy.label(), "runs": 0, "mismatching_runs": 0, "mismatching_tokens": 0,
           "max_rel_error": 0.0, "errors_per_run": []}
    t0 = time.perf_counter()
    try:
        with mutated_compile(bug):
            ex = CudaExecutor(cfg, strategy, weights)
            for _ in range(repeats):
                ex.reset()  # a fresh sequence: recurrent (GDN) states would otherwise carry over between runs
                run = workbench.run(cfg, strategy, tokens=ids, backend="cuda", executor=ex, start_pos=start_pos)
                err = rel_errors(run.logits, ref)
                bad = int((err > tol).sum() + (~np.isfinite(err)).sum())
                out["runs"] += 1
                out["mismatching_runs"] += int(bad > 0)
                out["mismatching_tokens"] += bad
                out["max_rel_error"] = float(np.nanmax([out["max_rel_error"], *err]))
                out["errors_per_run"].append(float(np.nanmax(err)))
            out["device"] = ex.device
    except Exception as e:  # a race CUDA refuses (capture errors) is a result, not a crash
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc(limit=4)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def provoke(bug: SeededBug, args: argparse.Namespace) -> dict:
    rec: dict = {"bug": bug.name, "kind": bug.expect[0], "description": bug.description,
                 "expected_race": list(bug.expect)}
    if bug.hand_built is not None:
        rec.update(status="not attempted", why="hand-built Plan over its own small graph: no model, weights or "
                   "reference to run it against on the cuda backend")
        return rec
    cfg = gpu_config(bug, args)
    rec["model"] = {"name": cfg.name, "layers": cfg.n_layer, "context": cfg.context}
    graph = build_graph(cfg)
    report = verify(bug.apply(compile_quietly(graph, bug.strategy)))
    found = {(r.cause, r.first.node, r.second.node) for r in report.races}
    rec["static"] = {"races": len(report.races), "by_cause": report.by_cause(), "expected_found": bug.expect in found}
    if args.dry_run:
        rec["status"] = "static only (--dry-run)"
        return rec
    from workbench.exec.reference import run_reference
    from workbench.models.weights import random_weights

    ids = token_ids(cfg, args.tokens, args.seed)
    weights = random_weights(graph, args.seed)
    ref = run_reference(cfg, weights, ids, start_pos=args.start_pos).logits
    rec["control"] = run_on_gpu(cfg, safe(bug.strategy), None, ids, weights, ref, max(1, args.repeats // 4),
                                args.tol, args.start_pos)
    rec["broken"] = run_on_gpu(cfg, bug.strategy, bug, ids, weights, ref, args.repeats, args.tol, args.start_pos)
    control_ok = "error" not in rec["control"] and rec["control"]["mismatching_runs"] == 0
    broken = rec["broken"]
    if not control_ok:
        rec["status"] = "inconclusive (the control run itself fails or mismatches)"
    elif "error" in broken:
        rec["status"] = "refused by CUDA"
    elif broken["mismatching_runs"]:
        rec["status"] = "reproduced"
    else:
        rec["status"] = "not reproduced"
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bugs", nargs="*", help="seeded bug names (default: all)")
    p.add_argument("--model", help="run every bug on this preset instead of the GPU_MODELS default")
    p.add_argument("--layers", type=int)
    p.add_argument("--context", type=int)
    p.add_argument("--tokens", type=int, default=16, help="decode steps per run")
    p.add_argument("--start-pos", type=int, default=0,
                   help="first position (a later one makes attention, a long predecessor, read more rows)")
    p.add_argument("--repeats", type=int, default=20, help="runs of the broken Plan per bug")
    p.add_argument("--tol", type=float, default=2e-2, help="relative logits error counted as a mismatch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="static analysis only (no GPU)")
    p.add_argument("--out", type=Path, help="JSON path (default: $OUT/race_provoke.json)")
    args = p.parse_args()
    out = args.out or Path(os.environ.get("OUT", ".")) / "race_provoke.json"
    bugs = [b for b in SEEDED_BUGS if not args.bugs or b.name in args.bugs]
    results = []
    for bug in bugs:
        rec = provoke(bug, args)
        results.append(rec)
        extra = ""
        if "broken" in rec:
            b = rec["broken"]
            extra = (f" mismatching runs {b['mismatching_runs']}/{b['runs']}, max rel error "
                     f"{b['max_rel_error']:.3g}" + (f", error {b['error']}" if "error" in b else ""))
            extra += f"; control max rel error {rec['control']['max_rel_error']:.3g}"
        static = rec.get("static", {})
        print(f"{bug.name:28s} {rec['kind']:15s} {rec['status']:20s} static races {static.get('races', '-')}"
              f"{extra}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(_document(args, results), indent=1) + "\n")  # keep partial results
    print(f"wrote {out}")


def _document(args: argparse.Namespace, results: list[dict]) -> dict:
    kinds: dict[str, dict] = {}
    for r in results:
        k = kinds.setdefault(r["kind"], {"reproduced": [], "not_reproduced": [], "other": []})
        key = {"reproduced": "reproduced", "not reproduced": "not_reproduced"}.get(r["status"], "other")
        k[key].append(r["bug"])
    return {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "tokens": args.tokens,
            "start_pos": args.start_pos,
            "repeats": args.repeats, "tol": args.tol, "seed": args.seed,
            "note": "a race not reproduced here is not proven absent: kernels may not overlap on this GPU, "
                    "or a compiler may sink loads past griddepcontrol.wait",
            "by_kind": kinds, "bugs": results}


if __name__ == "__main__":
    main()
