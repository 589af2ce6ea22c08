"""Old vs new kernel variants at the full-size decode shapes, each checked against NumPy.

For every distinct mat-vec (MUL_MAT, MUL_MAT_ID) and decode-attention (FLASH_ATTN_EXT) node of
layer 0 and the head of llama-3.2-1b, llama-3.1-8b, qwen3-30b-a3b and gpt-oss-20b (f16 weights and
KV, 512 KV rows), the node is bound by ``workbench.exec.cuda_ops`` under each variant of its
selection constants (the current default, and what each constant would switch on: the GQA-shared
attention, 8- or 16-warp blocks in a cluster-merged attention head, the segmented short-row
mat-vecs with 16 or 8 lanes per row, the block or the row-streaming kernel for every N), run once
and compared with the node's NumPy twin (relative to
the largest reference value, 5e-3 as tests/gpu/test_cuda_nodes.py), then timed:
``--reps`` launches captured in one CUDA graph and replayed between CUDA events
(``graph_replay_seconds``: no host cost inside), median and min-max over ``--samples`` such
captures. The node's operands are replicated across enough copies (round robin) that the
replays read at least ``--cold-mb`` MB, so small weights come from HBM as in a decode step
rather than from L2. Bandwidth = the node's bytes (cost model) / time, and its fraction of the
device-to-device copy rate measured in the same run (read + write). A variant that binds the same
kernel and grid as an earlier one is not repeated.

Usage (GPU): ``python3 benchmarks/kernel_bench.py [--models ...] [--fusions ...] [--md OUT.md] [--json OUT.json]``;
``--fusions norm-mat-vec,qkv-rope-store,mul-mat-glu`` times the fused mat-vecs of those rewrites
(their default binding) instead of the nodes they absorbed.
The lead switches a default in cuda_ops (FA_VARIANT, MMV_SEG_K_MAX / MMV_SEG_LANES,
MMV_ROWS_MIN) where a variant is faster and correct on every shape it binds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Callable, Iterator
from math import ceil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_decode import copy_bandwidth  # noqa: E402

from workbench.exec import cuda_ops  # noqa: E402
from workbench.exec.memory import Memory  # noqa: E402
from workbench.exec.reference_ops import NUMPY_OPS  # noqa: E402
from workbench.graph import Node, View  # noqa: E402
from workbench.graph.ops import op_info  # noqa: E402
from workbench.models import build_graph, preset  # noqa: E402
from workbench.strategy import Strategy  # noqa: E402
from workbench.strategy.fusion import apply_fusions  # noqa: E402
from workbench.strategy.fusion_chains import FUSED_OPS  # noqa: E402
from workbench.strategy.knobs import parse_fusions  # noqa: E402

MODELS = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-20b")
OPS = ("MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT")
#: timed only when named in ``--ops`` (one kernel each, no selection constants): the MoE router
#: (after ``--fusions topk-moe``) and Qwen3-Next's delta rule
SINGLE_KERNEL_OPS = ("TOPK_MOE", "GATED_DELTA_NET")
N_KV = 512
TOL = 5e-3
SEG = {"MMV_SEG_K_MAX": 1 << 16}
#: op -> variant name -> cuda_ops constants it sets ("default": as the module has them)
VARIANTS: dict[str, dict[str, dict[str, object]]] = {
    "MUL_MAT": {"default": {}, "block": {"MMV_ROWS_MIN": 1 << 30}, "rows": {"MMV_ROWS_MIN": 0},
                "seg16": {**SEG, "MMV_SEG_MUL_MAT": True, "MMV_SEG_LANES": 16},
                "seg8": {**SEG, "MMV_SEG_MUL_MAT": True, "MMV_SEG_LANES": 8}},
    "MUL_MAT_ID": {"default": {}, "warp": {"MMV_SEG_K_MAX": 0}, "seg16": {**SEG, "MMV_SEG_LANES": 16},
                   "seg8": {**SEG, "MMV_SEG_LANES": 8}},
    "FLASH_ATTN_EXT": {"default": {}, "ticket": {"FA_CLUSTER_MAX": 0}, "gqa": {"FA_VARIANT": "gqa"},
                       "cw8": {"FAV_CLUSTER_WARPS": 8}, "cw16": {"FAV_CLUSTER_WARPS": 16}},
    **{op: {"default": {}} for op in SINGLE_KERNEL_OPS},
}


@contextlib.contextmanager
def variant(knobs: dict[str, object]) -> Iterator[None]:
    """cuda_ops' selection constants set to ``knobs`` for the bindings made inside."""
    old = {k: getattr(cuda_ops, k) for k in knobs}
    for k, v in knobs.items():
        setattr(cuda_ops, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(cuda_ops, k, v)


#: with ``--fusions``: the fused mat-vec ops timed too (their binding's default variant), so a
#: fused kernel's time stands beside the kernels it replaces (e.g. QKV_ROPE_SET_ROWS beside the
#: Q, K, V mat-vecs of the unfused run)
FUSED_MAT_VECS = tuple(op for op in FUSED_OPS if op_info(op).family == "mul_mat")
for _op in FUSED_MAT_VECS:
    VARIANTS.setdefault(_op, {"default": {}})


def bench_nodes(name: str, fusions: frozenset[str] = frozenset(), ops: tuple[str, ...] = (),
                n_kv: int = N_KV) -> list[Node]:
    """The distinct mat-vec and attention nodes of layer 0 and the head of ``name`` at full size
    (one per op and operand shapes: llama's gate and up are one), after the Strategy fusions
    ``fusions`` (their fused mat-vecs included); only ``ops`` where given; ``n_kv`` KV rows."""
    graph, _ = apply_fusions(build_graph(preset(name, layers=1, context=n_kv), n_kv), fusions)
    seen, out = set(), []
    for n in graph.nodes:
        timed = (*OPS, *FUSED_MAT_VECS, *(o for o in SINGLE_KERNEL_OPS if o in ops))
        if n.op not in timed or (ops and n.op not in ops):
            continue
        key = (n.op, tuple((v.shape, v.strides, v.dtype) for v in n.srcs))
        if key not in seen:
            seen.add(key)
            out.append(n)
    return out


def _views(node: Node) -> list[View]:
    return [*node.srcs, *node.outs]


class NodeSpace:
    """The buffers one node touches, on the device ``copies`` times (round robin for the timed
    replays), filled with decode-like values; ``addr(c)`` is copy ``c``'s view address."""

    def __init__(self, cp, node: Node, cold_bytes: int) -> None:
        self.cp, self.node = cp, node
        self.buffers = {v.buffer.name: (v.buffer, v.dtype) for v in _views(node)}
        total = sum(b.nbytes for b, _ in self.buffers.values())
        self.copies = max(1, min(64, ceil(cold_bytes / max(1, total))))
        self.dev = [{n: cp.empty(-(-b.nbytes // 256) * 256, cp.uint8) for n, (b, _) in self.buffers.items()}
                    for _ in range(self.copies)]
        self.ws: list[dict[str, object]] = [{} for _ in range(self.copies)]
        rs = cp.random.RandomState(7)
        for n, (b, dt) in self.buffers.items():
            for c in range(self.copies):
                self._fill(rs, self.dev[c][n], b, dt)

    def _fill(self, rs, arr, buf, dt: str) -> None:
        cp = self.cp
        raw = arr[: buf.nbytes]
        if dt in ("i32", "i64"):  # MUL_MAT_ID's expert ids: distinct experts
            ids = raw.view(cp.int32 if dt == "i32" else cp.int64)
            ids[...] = (cp.arange(ids.size) * 3 + 1) % self.node.srcs[0].shape[0]
        elif "mask" in buf.name:  # every one of the N_KV rows visible
            raw[...] = 0
        else:
            vals = rs.standard_normal(buf.nbytes // {"f32": 4, "f16": 2, "bf16": 2}[dt], dtype=cp.float32) * 0.5
            if dt == "f16":
                raw.view(cp.float16)[...] = vals.astype(cp.float16)
            elif dt == "bf16":
                u = vals.view(cp.uint32)
                raw.view(cp.uint16)[...] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
            else:
                raw.view(cp.float32)[...] = vals

    def addr(self, c: int):
        return lambda v: int(self.dev[c][v.buffer.name].data.ptr) + v.offset

    def workspace(self, c: int):
        def ws(key: str, nbytes: int) -> int:
            a = self.ws[c].get(key)
            if a is None or a.nbytes < nbytes:
                a = self.ws[c][key] = self.cp.zeros(nbytes, self.cp.uint8)
            return int(a.data.ptr)
        return ws

    def host_memory(self, views: list[View] | None = None) -> Memory:
        """Copy 0's buffers (of ``views``, default all) on the host."""
        names = {v.buffer.name for v in views} if views is not None else set(self.buffers)
        mem = Memory()
        for n in names:
            mem.arrays[n] = self.cp.asnumpy(self.dev[0][n][: self.buffers[n][0].nbytes])
        return mem


def rel_err(node: Node, gpu: Memory, ref: Memory) -> float:
    worst = 0.0
    for out in node.outs:
        r, g = ref.read(out).astype(np.float64), gpu.read(out).astype(np.float64)
        if not np.isfinite(g).all():
            return float("inf")
        worst = max(worst, float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-6)))
    return worst


def round_robin(handles: list) -> Callable[[], None]:
    """A launch that enqueues the next copy's kernel each call."""
    turn = itertools.count()
    return lambda: handles[next(turn) % len(handles)]()


def run_variants(cp, node: Node, space: NodeSpace, ref: Memory, reps: int, samples: int) -> list[dict]:
    from workbench.exec.kernels import LaunchHandle, graph_replay_seconds, module_cache

    cc = cp.cuda.Device().compute_capability
    modules = module_cache((int(cc[0]), int(cc[1])))
    stream = cp.cuda.Stream(non_blocking=True)
    rows, seen = [], set()
    for vname, knobs in VARIANTS[node.op].items():
        with variant(knobs):
            calls = [cuda_ops.bind(node, space.addr(c), space.workspace(c)) for c in range(space.copies)]
        key = (calls[0].name, calls[0].grid, calls[0].block, calls[0].cluster)
        if key in seen:
            continue
        seen.add(key)
        fn = modules.function(calls[0].source, calls[0].name)
        handles = [LaunchHandle(c.name, fn, c.grid, c.block, stream.ptr, c.args, pdl=False, cluster=c.cluster)
                   for c in calls]
        handles[0]()
        stream.synchronize()
        err = rel_err(node, space.host_memory(list(node.outs)), ref)
        n = max(reps, space.copies) // space.copies * space.copies
        launch = round_robin(handles)
        ts = np.asarray([graph_replay_seconds(cp, stream, launch, n) for _ in range(samples)])
        rows.append({"variant": vname, "kernel": calls[0].name, "grid": list(calls[0].grid),
                     "us_median": float(np.median(ts)) * 1e6, "us_min": float(ts.min()) * 1e6,
                     "us_max": float(ts.max()) * 1e6, "bytes": float(node.bytes), "copies": space.copies,
                     "rel_err": err, "ok": bool(err <= TOL)})
    base = rows[0]["us_median"]
    for r in rows:
        r["speedup_vs_default"] = base / r["us_median"]
    return rows


def shape_of(node: Node) -> str:
    w = node.srcs[0]
    if node.op == "FLASH_ATTN_EXT":
        q, k = node.srcs[0], node.srcs[1]
        return f"H={q.shape[-2]} Hkv={k.shape[1]} D={q.shape[-1]} kv={k.shape[0]}"
    if node.op == "GATED_DELTA_NET":
        return f"state {list(node.srcs[5].shape)}"
    if node.op == "MUL_MAT_ID":
        return f"{node.srcs[2].numel}x[{w.shape[1]}, {w.shape[2]}] of {w.shape[0]}"
    return f"[{w.numel // w.shape[-1]}, {w.shape[-1]}]"


def markdown(result: dict) -> str:
    bw = result["copy_bandwidth_GBps"]
    lines = [f"# Kernel variants at full-size decode shapes ({result['gpu']})", "",
             f"`python3 benchmarks/kernel_bench.py`, {result['date']}; device time per launch from "
             f"{result['reps']} launches per CUDA graph replay, median [min - max] of {result['samples']} "
             f"captures; operands replicated to read >= {result['cold_mb']} MB per replay (not L2-resident); "
             f"D2D copy {bw:.0f} GB/s (read + write); error vs NumPy relative to the largest value "
             f"(tolerance {TOL}).", "",
             "| model | node | op | shape | variant | kernel | grid | us | [min - max] | GB/s | % copy BW | "
             "x default | rel err |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        gbps = r["bytes"] / (r["us_median"] * 1e-6) / 1e9
        lines.append(f"| {r['model']} | {r['node']} | {r['op']} | {r['shape']} | {r['variant']} | `{r['kernel']}` | "
                     f"{tuple(r['grid'])} | {r['us_median']:.2f} | {r['us_min']:.2f} - {r['us_max']:.2f} | "
                     f"{gbps:.0f} | {100 * gbps / bw:.1f} | {r['speedup_vs_default']:.3f} | "
                     f"{r['rel_err']:.1e}{'' if r['ok'] else ' FAIL'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of presets")
    ap.add_argument("--reps", type=int, default=64, help="launches per captured graph")
    ap.add_argument("--samples", type=int, default=7, help="captures timed per variant")
    ap.add_argument("--cold-mb", type=int, default=256, help="MB of operands read per replay (defeats L2)")
    ap.add_argument("--fusions", default="", help="comma list of Strategy fusions applied first (e.g. "
                    "norm-mat-vec,qkv-rope-store,mul-mat-glu): their fused mat-vecs are timed too")
    ap.add_argument("--ops", default="", help="comma list of ops to time (default: every mat-vec and attention)")
    ap.add_argument("--contexts", default=str(N_KV), help="comma list of KV rows (attention's keys)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args(argv)
    Strategy(fusion=parse_fusions(args.fusions))  # names checked before the GPU is touched

    import cupy as cp

    from workbench.exec.device import device_info

    result: dict = {"gpu": device_info(0).name, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                    "reps": args.reps, "samples": args.samples, "cold_mb": args.cold_mb,
                    "copy_bandwidth_GBps": copy_bandwidth(cp) / 1e9, "rows": []}
    failed = 0
    ops = tuple(filter(None, args.ops.split(",")))
    runs = [(m, int(c)) for m in filter(None, args.models.split(",")) for c in args.contexts.split(",")]
    for model, n_kv in runs:
        for node in bench_nodes(model, parse_fusions(args.fusions), ops, n_kv):
            space = NodeSpace(cp, node, args.cold_mb << 20)
            ref = space.host_memory()
            NUMPY_OPS[node.op](node, ref)
            for r in run_variants(cp, node, space, ref, args.reps, args.samples):
                row = {"model": model, "node": node.name, "op": node.op, "shape": shape_of(node), **r}
                result["rows"].append(row)
                failed += not r["ok"]
                print(f"{model:14s} {node.name:18s} {row['shape']:30s} {r['variant']:8s} {r['kernel']:28s} "
                      f"{r['us_median']:8.2f} us [{r['us_min']:.2f}-{r['us_max']:.2f}] "
                      f"x{r['speedup_vs_default']:.3f} err {r['rel_err']:.1e}{'' if r['ok'] else ' FAIL'}",
                      flush=True)
            del space
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.md:
        Path(args.md).write_text(markdown(result))
    print(f"{len(result['rows'])} rows, {failed} outside the tolerance", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
