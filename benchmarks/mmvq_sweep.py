"""The quantised mat-vec's work split (``kernels/mmvq.cu``): output rows per warp and warps per
row (split-K; the kernels' ``rpw`` and ``wpr`` arguments) times block passes in flight
(``MMVQ_UNROLL``; 0: the kernel's default, each compiled as its own module), on the decode shapes
of Llama-3.2-1B, Llama-3.1-8B, Qwen3-30B-A3B's experts and gpt-oss-20b's, for every block type.

The weights are cold, as in a decode step (the model streams through L2 once per token): the
launches cycle through copies of the matrix (for MoE, through disjoint sets of selected experts)
that together span at least ``COLD_BYTES``. Device time of those launches in one CUDA graph
(median of 7 replays); GB/s = the bytes one mat-vec must move (weight blocks + q8_1 activation +
f32 output) / time; each output checked against the float64 product of the dequantised blocks.
Picks the defaults of ``cuda_quant_ops.mmvq_split`` (the ``binder`` rows).

Usage (on the GPU machine): ``python3 benchmarks/mmvq_sweep.py --out $OUT/mmvq_sweep.json``.

``--fit SWEEP.json --calibration data/calibration/h200.json`` (no GPU) fits the simulator's cost
of each mmvq kernel from the sweep's rows under the binder's split (``fixed + scale x roofline``,
plus a per-row term where identifiable: ``kernel_fit.fit_groups``, as ``workbench calibrate``
fits its kernels) and writes them into the calibration file as ``MUL_MAT/k_mul_mat_vec_q_<type>``
and ``MUL_MAT_ID/k_mul_mat_vec_q_id_<type>`` (the fused ``_add`` / ``_glu`` kernels take their
base kernel's fit, ``cost.FUSED_BASE``). A sweep row's time is one launch of a graph of
back-to-back launches, so the calibration's ``dependency_gap_ns`` comes off it.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import sys
import time
from math import ceil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.cuda_ops import bind  # noqa: E402
from workbench.exec.cuda_quant_ops import MMVQ_THREADS, MMVQ_WARPS  # noqa: E402
from workbench.exec.device import device_info  # noqa: E402
from workbench.exec.kernels import (  # noqa: E402
    LaunchHandle,
    compile_options,
    graph_replay_seconds,
    kernel_source,
    module_cache,
)
from workbench.graph import GraphBuilder  # noqa: E402
from workbench.models.quant import dequantize, quantize  # noqa: E402

#: (what, N outputs, K inputs, experts stored, experts selected: 0 for a plain MUL_MAT)
SHAPES = [("1b q/o", 2048, 2048, 0, 0), ("1b k/v", 512, 2048, 0, 0), ("1b gate/up", 8192, 2048, 0, 0),
          ("1b down", 2048, 8192, 0, 0), ("1b lm_head", 128256, 2048, 0, 0), ("8b gate/up", 14336, 4096, 0, 0),
          ("30b-a3b expert gate/up", 768, 2048, 128, 8), ("30b-a3b expert down", 2048, 768, 128, 8),
          ("gpt-oss expert", 2880, 2880, 32, 4)]
QTYPES = ("q8_0", "q4_0", "q4_k", "mxfp4")
#: (rows per warp, warps per row, unroll)
VARIANTS = [(r, w, u) for (r, w), u in itertools.product(((1, 1), (2, 1), (4, 1), (1, 2), (1, 4)), (0, 4))]
TILE_ROWS = 64
#: kernels a fit needs before it takes a per-row term (--fit): 3 parameters on 3 shapes fit exactly
ROW_FIT_MIN = 5
#: bytes the launches of one timing cycle through (an H200's L2 holds 50 MB)
COLD_BYTES = 256 << 20


def sweep_graph(qtype: str, N: int, K: int, E: int, n_ids: int):
    """x (f32) -> QUANTIZE_Q8_1 -> the mat-vec (MUL_MAT_ID over E stored experts when E)."""
    b = GraphBuilder("sweep")
    w = b.weight("w", (E, N, K) if E else (N, K), qtype)
    xq = b.op("QUANTIZE_Q8_1", "x_q8_1", [b.input("x", (1, K), "f32")], (1, K), dtype="q8_1")
    if E:
        b.op("MUL_MAT_ID", "out", [w, xq, b.input("ids", (n_ids,), "i32")], (n_ids, N))
    else:
        b.op("MUL_MAT", "out", [w, xq], (1, N))
    return b.build()


def build(cp, qtype: str, N: int, K: int, E: int, n_ids: int, rng):
    """The quantize + mat-vec graph on device buffers: (the quantize launch's call, one mat-vec
    call per cold copy, the device arrays by buffer name, the tile's dequantised float64 rows,
    the first copy's selected experts, the bytes one mat-vec moves)."""
    g = sweep_graph(qtype, N, K, E, n_ids)
    w = g.nodes[-1].srcs[0]
    nbytes = float(g.nodes[-1].bytes)
    wsize = -(-w.nbytes // 256) * 256
    # cold copies: whole matrices for a plain mat-vec, disjoint expert sets for MUL_MAT_ID
    copies = max(1, E // n_ids) if E else max(1, -(-COLD_BYTES // wsize))
    dev = {name: cp.zeros(buf.nbytes, cp.uint8) for name, buf in g.buffers().items()}
    dev["w"] = cp.zeros(wsize * (1 if E else copies), cp.uint8)
    rows = (rng.standard_normal((TILE_ROWS, K)) / np.sqrt(K)).astype(np.float32)
    tile = quantize(rows, qtype)
    one = cp.tile(cp.asarray(tile.reshape(-1)), -(-(max(E, 1) * N) // TILE_ROWS))[: w.nbytes]
    for c in range(1 if E else copies):
        dev["w"][c * wsize: c * wsize + w.nbytes] = one
    dev["x"][:] = cp.asarray(rng.standard_normal(K).astype(np.float32).view(np.uint8))
    sets = [((np.arange(n_ids) + c * n_ids) % max(E, 1)).astype(np.int32) for c in range(copies)]
    ids_dev = [cp.asarray(sel.view(np.uint8)) for sel in sets] if E else []
    cp.cuda.Device().synchronize()  # the copies above ran on the default stream

    def addr(c: int):
        def at(v):
            if v.buffer.name == "w":
                return int(dev["w"].data.ptr) + (0 if E else c * wsize) + v.offset
            if v.buffer.name == "ids":
                return int(ids_dev[c].data.ptr) + v.offset
            return int(dev[v.buffer.name].data.ptr) + v.offset
        return at

    qcall = bind(g.nodes[0], addr(0), lambda key, n: 0)
    mcalls = [bind(g.nodes[-1], addr(c), lambda key, n: 0) for c in range(copies)]
    wt = dequantize(tile, qtype).reshape(TILE_ROWS, K).astype(np.float64)
    return qcall, mcalls, dev, wt, sets[0], nbytes


def binder_rows(sweep: dict):
    """The sweep's rows timed under the binder's split (``mmvq_split``, default unroll), each with
    the mat-vec node it timed and its kernel's fit key (``op/kernel``)."""
    from workbench.exec.cuda_quant_ops import mmvq_split

    experts = {s[0]: s[3] for s in SHAPES}
    for r in sweep["rows"]:
        n_ids = r["experts"]
        if r["unroll"] or (r["rows_per_warp"], r["warps_per_row"]) != mmvq_split(r["N"] * max(1, n_ids), r["K"]):
            continue
        node = sweep_graph(r["qtype"], r["N"], r["K"], experts[r["shape"]], n_ids).nodes[-1]
        yield r, node, f"{node.op}/k_mul_mat_vec_q_{'id_' if n_ids else ''}{r['qtype']}"


def fit_calibration(sweep: dict, data: dict) -> dict[str, tuple[dict[str, float], str]]:
    """Fits of the mmvq kernels from a sweep, on the calibration ``data`` (modified in place):
    {op/kernel: (fields, source)}."""
    import pandas as pd

    from workbench.exec.calibrate.kernel_fit import MIN_OP_KERNELS, fit_groups
    from workbench.exec.calibration import parse_calibration
    from workbench.exec.cost import kernel_cost, serial_units

    for key in [k for k in data["ops"] if "/k_mul_mat_vec_q_" in k]:  # the fit starts from the plain roofline
        del data["ops"][key]
        for field in [f for f in data["sources"] if f.startswith(f"ops.{key}.")]:
            del data["sources"][field]
    cal = parse_calibration(data, "calibration")
    rows = []
    for r, node, key in binder_rows(sweep):
        c = kernel_cost(node, cal)
        rows.append({"key": key, "duration_ns": r["us"] * 1e3 - cal.dependency_gap_ns,
                     "roofline_ns": c.work_ns / c.cap if c.work_ns > 0 else 0.0,
                     "rows": serial_units(node, cal)})
    counts = pd.Series([r["key"] for r in rows]).value_counts()
    for r in rows:  # a per-row term only where the kernels outnumber the parameters well
        if counts[r["key"]] < ROW_FIT_MIN:
            r["rows"] = 0
    what = (f"timed as cold-L2 graph replays (the binder's split; per launch less dependency_gap_ns "
            f"{cal.dependency_gap_ns:.0f} ns)")
    fits, _ = fit_groups(pd.DataFrame(rows), "key", "op", MIN_OP_KERNELS, 0.0, what)
    where = (f"measured by benchmarks/mmvq_sweep.py on an {sweep['device']} (driver {sweep.get('driver', '?')}, "
             f"{sweep.get('date', '?')})")
    for key, (vals, how) in list(fits.items()):
        how = f"{where}: {how}"
        fits[key] = (vals, how)
        data["ops"][key] = vals
        for field in vals:
            data["sources"][f"ops.{key}.{field}"] = how
    parse_calibration(data, "fitted calibration")  # every field still valid and sourced
    return fits


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON rows to write")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--fit", metavar="SWEEP_JSON", help="fit the mmvq kernels' costs from a sweep (no GPU)")
    ap.add_argument("--calibration", help="with --fit: the calibration file to update")
    args = ap.parse_args(argv)
    if args.fit:
        if not args.calibration:
            ap.error("--fit needs --calibration FILE")
        data = json.loads(Path(args.calibration).read_text())
        for key, (vals, how) in fit_calibration(json.loads(Path(args.fit).read_text()), data).items():
            print(f"{key}: {vals}  ({how})")
        Path(args.calibration).write_text(json.dumps(data, indent=2) + "\n")
        return 0
    if not args.out:
        ap.error("--out FILE (or --fit)")
    import cupy as cp

    cc = device_info().compute_capability
    base = module_cache(cc)
    mods = {u: cp.RawModule(code=kernel_source("mmvq"), options=compile_options("none", "none", cc) + (
        (f"-DMMVQ_UNROLL={u}",) if u else ())) for u in {v[2] for v in VARIANTS}}
    s = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(0)
    rows = []
    for (what, N, K, E, n_ids), qtype in itertools.product(SHAPES, QTYPES):
        if K % (256 if qtype == "q4_k" else 32):
            continue
        qcall, mcalls, dev, wt, sel, nbytes = build(cp, qtype, N, K, E, n_ids, rng)
        LaunchHandle(qcall.name, base.function(qcall.source, qcall.name), qcall.grid, qcall.block, s.ptr,
                     qcall.args, pdl=False)()
        s.synchronize()
        xq = dequantize(cp.asnumpy(dev["x_q8_1"]), "q8_1").astype(np.float64)
        flat = (sel[:, None] * N + np.arange(N)[None, :]) if E else np.arange(N)[None, :]
        ref = (wt @ xq)[flat % TILE_ROWS]
        copies = len(mcalls)
        reps = copies * -(-args.reps // copies)  # a whole number of cycles per replay
        binder = (mcalls[0].args[-2].value, mcalls[0].args[-1].value)
        for v in VARIANTS:
            rpw, wpr, u = v
            grid = (ceil(N * wpr / (MMVQ_WARPS * rpw)), mcalls[0].grid[1])
            hs = [LaunchHandle(c.name, mods[u].get_function(c.name), grid, (MMVQ_THREADS,), s.ptr,
                               (*c.args[:-2], ctypes.c_int(rpw), ctypes.c_int(wpr)), pdl=False) for c in mcalls]
            with s:
                dev["out"].fill(255)
            hs[0]()
            s.synchronize()
            got = cp.asnumpy(dev["out"]).view(np.float32).reshape(ref.shape).astype(np.float64)
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            turn = itertools.cycle(hs)
            t = graph_replay_seconds(cp, s, lambda turn=turn: next(turn)(), reps)
            rows.append({"shape": what, "N": N, "K": K, "experts": n_ids, "qtype": qtype, "rows_per_warp": rpw,
                         "warps_per_row": wpr, "unroll": u, "binder": (rpw, wpr) == binder and not u,
                         "cold_copies": copies, "us": t * 1e6, "GBps": nbytes / t / 1e9, "rel_err": err})
        mine = sorted((r for r in rows if r["shape"] == what and r["qtype"] == qtype), key=lambda r: r["us"])
        dflt = next(r for r in mine if r["binder"])
        best = " | ".join(f"r{r['rows_per_warp']} w{r['warps_per_row']} u{r['unroll']} {r['us']:.2f} us "
                          f"{r['GBps']:.0f}" for r in mine[:3])
        print(f"{what:24s} {qtype:5s} binder (r{binder[0]} w{binder[1]}) {dflt['us']:7.2f} us "
              f"{dflt['GBps']:5.0f} GB/s | best {best}", flush=True)
        bad = [(r["rows_per_warp"], r["warps_per_row"], r["unroll"], r["rel_err"]) for r in mine
               if not r["rel_err"] < 1e-4]
        if bad:
            print("  WRONG:", bad, flush=True)
        del dev, mcalls
    # the variant whose worst slowdown against each row's best is smallest
    def key(r):
        return r["rows_per_warp"], r["warps_per_row"], r["unroll"]

    score = {v: max(r["us"] / min(q["us"] for q in rows if q["shape"] == r["shape"] and q["qtype"] == r["qtype"])
                    for r in rows if key(r) == v) for v in VARIANTS}
    total = {v: sum(r["us"] for r in rows if key(r) == v) for v in VARIANTS}
    for v in sorted(VARIANTS, key=lambda v: total[v])[:6]:
        print(f"r{v[0]} w{v[1]} u{v[2]}: sum {total[v]:.1f} us, worst {score[v]:.2f}x the row's best", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from benchmarks.llamacpp_peer import gpu_info

    Path(args.out).write_text(json.dumps({"device": device_info().name, "driver": gpu_info()["driver"],
                                          "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
