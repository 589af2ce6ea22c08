"""llama.cpp beside the workbench on one GPU: each knob alone and stacked (issue 13, item 4).

For each model (f16 by default, context 512, 64 tokens at positions 448..511 = llama-bench's
``tg64 @ d448``) and each switch configuration, four numbers of us/token:

- **llama.cpp** through the ``llamacpp`` backend (its worker process, set up and timed as
  llama-bench's ``tg`` test, ``--reps`` repetitions per call);
- **llama-bench** of the same build, same GGUF, environment and parameters (``-p 0 -n 64 -d 448
  -fa 1 -t T -b 2048 -ub 512``), to show the backend times llama.cpp as llama-bench does
  (acceptance: within 3 %). The two run interleaved, A B A B (``--pairs``), and each pair's
  ratio is kept, so the GPU's drift between calls does not count as disagreement;
- **ours**: the workbench's ``cuda`` backend under the same Strategy (``qkv`` with the
  stream-aware allocator, which our executor needs for concurrent streams);
- **sim**: the simulator with this GPU's calibration, same Strategy as ours.

"fusion on" is llama.cpp's whole fusion set, ``switches.LLAMACPP_FUSION``, for both sides.
``--fill tiled`` (default) writes the GGUF at disk speed (``gguf_write.tiled_weight``) and
both llama.cpp and ours run that file (ours reads its values, ``weights="host"``, unless the GPU
cannot hold ours beside llama.cpp's copy: then GPU-drawn weights of the same distributions,
``--ours-weights``): the table compares time only, so no logits are read or compared; ``--fill
exact`` writes the seeded weights (minutes for the big models) and ours runs the preset with
device-drawn weights. Decode time does not depend on the values, except MoE routing, which is
random-like with any of these weights.
``--weight-dtype q4_0|q8_0`` writes the GGUF in that block type and runs ours in it (the
``cuda`` column shows the backend's error where it has no kernels for it). ``--context 32768
--start-pos 32736 --tokens 32`` times tokens at the end of a 32k context (issue 21's gpt-oss
row: llama.cpp's depth prefill is decoded once per call and its state restored per
repetition, as llama-bench does; ours runs the iSWA ring, the config's default).

Configurations run in ``--rounds`` passes (every other one in reverse order); medians and
min..max over all repetitions of all rounds. Results are appended to a JSONL file as they come
(a call cut by its time budget keeps what it measured) and summarised as markdown; several
JSONL files (calls on different models) summarise together with ``--summarize``.

Usage on a GPU machine with ``WORKBENCH_LLAMACPP`` = a CUDA build that has ``llama-bench``::

    python benchmarks/llamacpp_peer.py --models llama-3.2-1b --budget-s 240 \\
        --jsonl out/llamacpp_peer.jsonl --md out/llamacpp_peer_h100.md
    python benchmarks/llamacpp_peer.py --summarize a.jsonl b.jsonl --md data/bench/llamacpp_peer_h100.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics as st
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exec.calibrate.decode_matrix import effect_pct  # noqa: E402
from workbench.exec.calibrate.specs import ModelSpec  # noqa: E402
from workbench.llamacpp.switches import LLAMACPP_FUSION as FUSIONS  # noqa: E402
from workbench.strategy import LOGITS_MODES, PDL_TRIGGERS, PDL_WAITS, WORKBENCH_FUSIONS, Strategy  # noqa: E402

#: name -> (Strategy as llama.cpp switches, which models: "all" / "gdn", needs a peer patch)
CONFIGS: dict[str, tuple[Strategy, str, str | None]] = {
    "default": (Strategy(graphs=True, pdl=True, fusion=FUSIONS), "all", None),
    "pdl0": (Strategy(graphs=True, fusion=FUSIONS), "all", None),
    "no_graphs": (Strategy(pdl=True, fusion=FUSIONS), "all", None),
    "no_graphs_pdl0": (Strategy(fusion=FUSIONS), "all", None),
    "graph_opt": (Strategy(graphs=True, pdl=True, streams="qkv", fusion=FUSIONS), "all", None),
    "no_fusion": (Strategy(graphs=True, pdl=True), "all", None),
    "eager": (Strategy(), "all", None),
    "graphs": (Strategy(graphs=True), "all", None),
    "graphs_pdl_qkv": (Strategy(graphs=True, pdl=True, streams="qkv"), "all", None),
    "gdn_unfused": (Strategy(graphs=True, pdl=True, fusion=FUSIONS - {"copy-elim"}), "gdn", "gdn_fusion_patch"),
    "sync_boundary": (Strategy(graphs=True, pdl=True, fusion=FUSIONS, sync="boundary"), "all", "sched_sync_patch"),
    "sync_implicit": (Strategy(graphs=True, pdl=True, fusion=FUSIONS, sync="implicit"), "all", "sched_sync_patch"),
    # every switch at its fastest: the best-against-best row of issue 16 (both sides may take the sync knob)
    "graph_opt_sync_implicit": (Strategy(graphs=True, pdl=True, streams="qkv", fusion=FUSIONS, sync="implicit"), "all",
                                "sched_sync_patch"),
}
#: the issue's table: (knob step, from config, to config)
STEPS: list[tuple[str, str, str]] = [
    ("CUDA graphs (PDL off)", "no_graphs_pdl0", "pdl0"),
    ("PDL under graphs", "pdl0", "default"),
    ("Q/K/V streams on top of graphs + PDL", "default", "graph_opt"),
    ("fusion on vs off", "no_fusion", "default"),
    ("GDN copy removal", "gdn_unfused", "default"),
    ("sync boundary (PR 17795 emulation)", "default", "sync_boundary"),
    ("sync implicit (PR 17795 emulation)", "default", "sync_implicit"),
    ("sync implicit on top of graph_opt", "graph_opt", "graph_opt_sync_implicit"),
    ("stack: + graphs", "eager", "graphs"),
    ("stack: + PDL", "graphs", "no_fusion"),
    ("stack: + Q/K/V streams", "no_fusion", "graphs_pdl_qkv"),
    ("stack: + fusion", "graphs_pdl_qkv", "graph_opt"),
]
#: model spec -> layers (None: all); full-size shapes, f16
MODELS = {"llama-3.2-1b": None, "llama-3.1-8b": None, "qwen3-30b-a3b": 8, "qwen3-next-80b-a3b": 8,
          "gpt-oss-20b": None}
TOOLS = ("llamacpp", "llama-bench", "cuda", "sim")
#: GGUF block types the table can be written in (issue 16's acceptance table: q4_0 and q8_0)
WEIGHT_DTYPES = ("f16", "q4_0", "q8_0")


def ours(strategy: Strategy, own_fusions: bool = False, pdl_trigger: str | None = None,
         logits: str = "copy", pdl_wait: str | None = None) -> Strategy:
    """The workbench's equivalent: concurrent streams need our stream-aware allocator; with
    ``own_fusions`` (``--ours-fusion all``) a config with llama.cpp's fusions on also runs the
    workbench's own (norm-mat-vec, qkv-rope-store), ``pdl_trigger`` (``--ours-pdl-trigger``)
    moves our kernels' PDL launch signal where PDL is on, ``pdl_wait`` (``--ours-pdl-wait``) their
    wait (``start``: no weight loads before it, as llama.cpp's kernels), and ``logits``
    (``--ours-logits``) is how our logits reach the host: our best against llama.cpp's best."""
    strategy = strategy.with_(logits=logits)
    if own_fusions and strategy.fusion:
        strategy = strategy.with_(fusion=strategy.fusion | frozenset(WORKBENCH_FUSIONS))
    if pdl_trigger and strategy.pdl:
        strategy = strategy.with_(pdl_trigger=pdl_trigger)
    if pdl_wait and strategy.pdl:
        strategy = strategy.with_(pdl_wait=pdl_wait)
    return strategy.with_(allocator="stream-aware") if strategy.streams == "qkv" else strategy


def gpu_info() -> dict[str, str]:
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        name, driver, mem = (x.strip() for x in q.split(","))
        return {"gpu": name, "driver": driver, "memory": mem}
    except Exception as e:  # no nvidia-smi: say so in the table rather than fail
        return {"gpu": f"unknown ({type(e).__name__})", "driver": "?", "memory": "?"}


def gpu_calibration(name: str) -> str:
    """The simulator calibration of the GPU named ``name`` (h100 / h200)."""
    return "h200" if "H200" in name.upper() else "h100"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from workbench.exec.llamacpp import LlamaCppOptions, build_folder, physical_cores
        from workbench.llamacpp.build import llama_bench
        from workbench.llamacpp.switches import BuildInfo

        self.args = args
        self.folder = build_folder(LlamaCppOptions(build=args.llamacpp))
        self.build = BuildInfo.of(self.folder)
        self.llama_bench = llama_bench(self.folder)
        if args.no_backend and not self.llama_bench:
            raise SystemExit(f"--no-backend times llama-bench alone, and the llama.cpp build in {self.folder} has "
                             "none: build it with llama-bench (.peer/device_build.sh does)")
        self.t0 = time.time()
        self.run_id = datetime.datetime.now(datetime.UTC).strftime("%H%M%S")
        self.info = gpu_info()
        self.jsonl = Path(args.jsonl)
        self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        # both tools get the same, explicitly: llama-bench's default, but no more than this process
        # may run on (sysfs lists the host's cores, a container may get fewer)
        self.threads = args.threads or min(physical_cores(), len(os.sched_getaffinity(0)))
        self.release_ours = False
        self.ours_weights = args.ours_weights

    def left(self) -> float:
        return self.args.budget_s - (time.time() - self.t0)

    def emit(self, **rec: Any) -> None:
        # ``run``: this invocation, so that rounds of two calls on one day stay apart when a knob's
        # effect pairs its cells' processes round by round (``llamacpp_fit.measured_table``)
        rec.update(self.info, date=datetime.date.today().isoformat(), run=self.run_id)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        us = rec.get("us", [])
        print(f"[{time.time() - self.t0:5.0f}s] {rec['model']:22s} {rec['config']:15s} {rec['tool']:11s} "
              + (f"{st.median(us):8.1f} us/token" if us else rec.get("error", "")), flush=True)

    def configs_for(self, cfg) -> list[str]:
        out = []
        for name, (_, models, patch) in CONFIGS.items():
            if self.args.configs and name not in self.args.configs:
                continue
            if models == "gdn" and cfg.family != "gdn":
                continue
            if patch and not getattr(self.build, patch):
                continue
            out.append(name)
        return out

    def run_model(self, spec: str) -> None:
        from workbench.models import load_config
        from workbench.models.gguf_write import cached_gguf

        ms = ModelSpec.parse(spec)
        name, layers = ms.model, ms.layers or MODELS.get(ms.model)
        args = self.args
        cfg = load_config(name, layers=layers, context=args.context)
        if args.weight_dtype != "f16":
            cfg = cfg.with_(weight_dtype=args.weight_dtype)
        label = f"{name}" + (f" ({layers} layers)" if layers else "") + (
            f" {args.weight_dtype}" if args.weight_dtype != "f16" else "") + (
            f" @ {args.start_pos}" if args.start_pos != 448 else "")
        t = time.time()
        gguf = cached_gguf(cfg, qtype=args.weight_dtype, fill=args.fill)
        size = gguf.stat().st_size
        print(f"GGUF {gguf} ({size / 2**30:.1f} GiB, {args.fill} fill) ready in {time.time() - t:.0f} s", flush=True)
        if args.fill == "tiled":  # both sides run the file: the values llama.cpp reads
            cfg = load_config(str(gguf), context=args.context)
        # ours keeps the model's weights on the GPU across configurations, unless the GPU cannot
        # hold them beside llama.cpp's copy (the llama.cpp processes run in between)
        self.release_ours = 2.2 * size > gpu_bytes(self.info)
        self.ours_weights = args.ours_weights
        if self.ours_weights == "auto":  # the file's values, unless they would be read again per configuration
            self.ours_weights = "file" if args.fill == "tiled" and not self.release_ours else "device"
        print(f"ours: {self.ours_weights} weights" + (" (freed after each configuration)" if self.release_ours
                                                      else ""), flush=True)
        ids = self.token_ids(cfg)
        names = self.configs_for(cfg)
        try:
            for rnd in range(args.rounds):
                for cname in (names if rnd % 2 == 0 else names[::-1]):
                    if self.left() < args.config_s:
                        print(f"time budget reached: stopping before {label} {cname} round {rnd + 1}", flush=True)
                        return
                    self.run_config(cfg, label, cname, rnd, gguf, ids)
                    if self.args.md:  # a call cut by its time limit keeps the table so far
                        Path(self.args.md).write_text(summarize(load([str(self.jsonl)])))
        finally:
            if args.drop_gguf and args.fill == "tiled":  # rewritten in seconds; the disk holds few big ones
                if not args.no_ours:
                    release_cuda()  # ours read the file memory-mapped
                gguf.unlink(missing_ok=True)

    def token_ids(self, cfg) -> list[int]:
        from workbench.api import token_ids

        return token_ids(cfg, self.args.tokens, 0)

    def run_config(self, cfg, label: str, cname: str, rnd: int, gguf: Path, ids: list[int]) -> None:
        from workbench.llamacpp.switches import SwitchError, switches_for

        strategy = CONFIGS[cname][0]
        common = dict(model=label, config=cname, round=rnd, strategy=strategy.label(),
                      weight_dtype=self.args.weight_dtype, fill=self.args.fill, context=self.args.context,
                      start_pos=self.args.start_pos, tokens=self.args.tokens, threads=self.threads)
        try:
            env = switches_for(strategy, self.build, cfg.family == "gdn").env
        except SwitchError as e:
            self.emit(tool="llamacpp", error=str(e), env={}, **common)
            return
        common["env"] = env
        for pair in range(self.args.pairs):  # A B A B: each pair's ratio is the agreement measure
            if not self.args.no_backend:
                self.measure("llamacpp", dict(common, pair=pair), lambda: self.llamacpp(cfg, strategy, ids))
            if self.llama_bench:
                self.measure("llama-bench", dict(common, pair=pair), lambda: self.bench_tool(gguf, env))
        if not self.args.no_ours:
            mine = ours(strategy, self.args.ours_fusion == "all", self.args.ours_pdl_trigger, self.args.ours_logits,
                        self.args.ours_pdl_wait)
            tag = {"ours_fusion": self.args.ours_fusion} if self.args.ours_fusion != "llamacpp" else {}
            if mine.pdl and mine.pdl_trigger != strategy.pdl_trigger:
                tag["ours_pdl_trigger"] = mine.pdl_trigger
            if mine.pdl and mine.pdl_wait != strategy.pdl_wait:
                tag["ours_pdl_wait"] = mine.pdl_wait
            if mine.logits != "copy":
                tag["ours_logits"] = mine.logits
            self.measure("cuda", dict(common, **tag), lambda: self.workbench(cfg, mine, ids, "cuda"))
            if rnd == 0:
                self.measure("sim", dict(common, **tag), lambda: self.workbench(cfg, mine, ids, "sim"))

    def measure(self, tool: str, common: dict, fn) -> None:
        try:
            us, extra = fn()
            self.emit(tool=tool, us=us, **extra, **common)
        except Exception as e:  # a failing config is a row of the table, not the end of the run
            self.emit(tool=tool, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", **common)

    def llamacpp(self, cfg, strategy, ids) -> tuple[list[float], dict]:
        """Per repetition us/token as llama-bench computes it (its timed loop / tokens)."""
        import workbench

        r = workbench.run(cfg, strategy, tokens=ids, backend="llamacpp", start_pos=self.args.start_pos,
                          build=str(self.folder), reps=self.args.reps, threads=self.threads, logits=False,
                          quiet=True)
        n = len(ids)
        return [x / n for x in r.meta["rep_us"]], {"device": r.device,
                                                   "per_token_us_median": r.stats["us_per_token_median"]}

    def bench_tool(self, gguf: Path, env: dict[str, str]) -> tuple[list[float], dict]:
        from workbench.llamacpp.llama_bench import run_llama_bench

        us, r = run_llama_bench(self.llama_bench, gguf, tokens=self.args.tokens, depth=self.args.start_pos,
                                reps=self.args.reps, threads=self.threads, env=env)
        return us, {"build_commit": r.get("build_commit"), "avg_ts": r.get("avg_ts"), "stddev_ts": r.get("stddev_ts")}

    def workbench(self, cfg, strategy, ids, backend: str) -> tuple[list[float], dict]:
        import workbench

        opts: dict[str, Any] = {"gpu": gpu_calibration(self.info["gpu"])} if backend == "sim" else {}
        if backend == "cuda":
            opts["weights"] = "host" if self.ours_weights == "file" else "device"
        runs = 1 if backend == "sim" else self.args.ours_runs
        us = []
        try:
            for _ in range(runs):
                r = workbench.run(cfg, strategy, tokens=ids, backend=backend, start_pos=self.args.start_pos,
                                  quiet=True, **opts)
                us.append(float(r.stats["us_per_token"]))
        finally:
            if backend == "cuda" and self.release_ours:
                release_cuda()
        return us, {"device": r.device, **({"ours_weights": self.ours_weights} if backend == "cuda" else {})}


def release_cuda() -> None:
    """Free the cuda backend's device weights and executors (llama.cpp's processes need the room)."""
    from workbench.exec.backend import get_backend

    impl = get_backend("cuda")
    if impl.available()[0]:
        impl.release()


def gpu_bytes(info: dict[str, str]) -> float:
    """The GPU's memory from nvidia-smi's ``memory.total`` (``81559 MiB``); inf when unknown."""
    try:
        return float(info["memory"].split()[0]) * 2**20
    except (KeyError, ValueError, IndexError):
        return float("inf")


# --------------------------------------------------------------------------- summary

def load(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def cell(us: list[float]) -> str:
    if not us:
        return "-"
    return f"{st.median(us):.0f} [{min(us):.0f}..{max(us):.0f}]" if len(us) > 1 else f"{us[0]:.0f}"


def pair_ratios(recs: list[dict]) -> dict[tuple[str, str], list[float]]:
    """(model, config) -> per A/B pair, the backend's median us/token over llama-bench's, each
    pair measured back to back (records with a ``pair`` field; older records have none)."""
    halves: dict[tuple, dict[str, list[float]]] = {}
    for r in recs:
        if "pair" in r and r.get("us") and r["tool"] in ("llamacpp", "llama-bench"):
            halves.setdefault((r["model"], r["config"], r["round"], r["pair"]), {})[r["tool"]] = r["us"]
    out: dict[tuple[str, str], list[float]] = {}
    for (model, config, _, _), h in sorted(halves.items(), key=lambda kv: str(kv[0])):
        if "llamacpp" in h and "llama-bench" in h:
            out.setdefault((model, config), []).append(st.median(h["llamacpp"]) / st.median(h["llama-bench"]))
    return out


def agreement(ratios: dict[tuple[str, str], list[float]], by: dict[tuple[str, str, str], list[float]],
              bound_pct: float = 3.0) -> list[str]:
    """The backend-vs-llama-bench summary: in how many configurations the median over A/B pairs is
    within ``bound_pct``, and for each one that is not, beside it how far llama-bench's own
    repetitions spread (max over min), which says whether the two tools can be told apart there."""
    meds = {k: (st.median(v) - 1) * 100 for k, v in ratios.items() if v}
    if not meds:
        return []
    out = [k for k, m in meds.items() if abs(m) > bound_pct]
    lines = [f"**Backend vs llama-bench:** within {bound_pct:.0f} % (median over A/B pairs) in "
             f"{len(meds) - len(out)} of {len(meds)} configurations."]
    if out:
        def spread(k: tuple[str, str]) -> str:
            v = by.get((*k, "llama-bench"), [])
            return f"{(max(v) / min(v) - 1) * 100:.0f} %" if v else "-"
        lines[-1] += " Outside it: " + "; ".join(
            f"{m} {c} {meds[(m, c)]:+.1f} % (llama-bench's repetitions spread {spread((m, c))})"
            for m, c in out) + "."
    return lines + [""]


def summarize(recs: list[dict]) -> str:
    """The markdown: per model, every configuration's four numbers, then the knob steps."""
    if not recs:
        return "no results\n"
    first = recs[0]
    commit = next((r["build_commit"] for r in recs if r.get("build_commit")), "?")
    setups = sorted({(r.get("weight_dtype", "f16"), r.get("context", 512), r.get("start_pos", 448),
                       r.get("tokens", 64), r.get("fill", "exact"), r.get("threads", "?")) for r in recs}, key=str)
    setup = "; ".join(f"{wd} weights ({fill} fill), context {ctx}, {n} tokens at positions {pos}..{pos + n - 1} "
                      f"(llama-bench's tg{n} @ d{pos}), {th} CPU threads" for wd, ctx, pos, n, fill, th in setups)
    lines = [f"# llama.cpp beside the workbench on an {first['gpu']}", "",
             f"{first['gpu']} ({first['memory']}), driver {first['driver']}, {first['date']}; llama.cpp "
             f"{commit} (the peer tree); {setup}; flash attention on. us/token: median [min..max] over all "
             "repetitions of all rounds. `llama.cpp` is the `llamacpp` backend (set up and timed as "
             "llama-bench's tg test: per repetition, its token loop's time over the tokens), `llama-bench` "
             "the same build's tool, `backend vs llama-bench` the median [min..max] over A/B pairs (each "
             "measured back to back) of the backend's median over llama-bench's, `ours` the `cuda` backend "
             "under the same Strategy, `sim` the simulator with this GPU's calibration. \"fusion on\" is "
             "llama.cpp's whole fusion set for both" + (
                 "; with `--ours-fusion all`, ours and sim also run the workbench's own fusions "
                 f"({', '.join(WORKBENCH_FUSIONS)}) where fusion is on (the `strategy` column names llama.cpp's)"
                 if any(r.get("ours_fusion") == "all" for r in recs) else "")
             + "".join(sorted({f"; with `--ours-pdl-trigger {r['ours_pdl_trigger']}`, ours and sim place their "
                               f"kernels' PDL launch signal at `{r['ours_pdl_trigger']}` where PDL is on "
                               "(llama.cpp keeps its own placement)" for r in recs if r.get("ours_pdl_trigger")}))
             + "".join(sorted({f"; with `--ours-pdl-wait {r['ours_pdl_wait']}`, ours and sim wait for the previous "
                               f"kernel at `{r['ours_pdl_wait']}` where PDL is on" for r in recs
                               if r.get("ours_pdl_wait")}))
             + "".join(sorted({f"; with `--ours-logits {r['ours_logits']}`, ours and sim have their logits written "
                               "into mapped pinned host memory by their kernel (no D2H copy; llama.cpp copies them)"
                               for r in recs if r.get("ours_logits")}))
             + ". Written by `benchmarks/llamacpp_peer.py`.", ""]
    by: dict[tuple[str, str, str], list[float]] = {}
    ratios = pair_ratios(recs)
    errors: dict[tuple[str, str, str], str] = {}
    envs: dict[str, str] = {}
    labels: dict[tuple[str, str], str] = {}
    models: list[str] = []
    for r in recs:
        key = (r["model"], r["config"], r["tool"])
        if r["model"] not in models:
            models.append(r["model"])
        envs.setdefault(r["config"], " ".join(f"{k}={v}" for k, v in sorted(r.get("env", {}).items())) or "-")
        if r.get("strategy"):  # as measured (older records: a smaller "fusion on" set)
            labels.setdefault((r["model"], r["config"]), r["strategy"])
        if "us" in r:
            by.setdefault(key, []).extend(r["us"])
        else:
            errors[key] = r.get("error", "?")
    lines += agreement(ratios, by)
    for model in models:
        configs = [c for c in CONFIGS if any(k[0] == model and k[1] == c for k in (*by, *errors))]
        lines += [f"## {model}", "", "| config | strategy | llama.cpp switches | llama.cpp | llama-bench | "
                  "backend vs llama-bench | ours (cuda) | sim |", "|---|---|---|---:|---:|---:|---:|---:|"]
        for c in configs:
            vals = {t: by.get((model, c, t), []) for t in TOOLS}
            ratio = "-"
            if ratios.get((model, c)):
                rs = [(x - 1) * 100 for x in ratios[(model, c)]]
                ratio = f"{st.median(rs):+.1f} %" + (f" [{min(rs):+.1f}..{max(rs):+.1f}]" if len(rs) > 1 else "")
            elif vals["llamacpp"] and vals["llama-bench"]:
                ratio = f"{(st.median(vals['llamacpp']) / st.mean(vals['llama-bench']) - 1) * 100:+.1f} %"
            cells = [cell(vals[t]) if vals[t] else (f"error: {errors[(model, c, t)]}" if (model, c, t) in errors
                                                    else "-") for t in TOOLS]
            label = labels.get((model, c), CONFIGS[c][0].label())
            lines.append(f"| {c} | {label} | `{envs.get(c, '-')}` | {cells[0]} | {cells[1]} | "
                         f"{ratio} | {cells[2]} | {cells[3]} |")
        lines += ["", "| knob (step) | from -> to | llama.cpp | llama-bench | ours (cuda) | sim |",
                  "|---|---|---:|---:|---:|---:|"]
        for label, a, b in STEPS:
            row = []
            for t in TOOLS:
                x, y = by.get((model, a, t)), by.get((model, b, t))
                row.append(f"{effect_pct(st.median(x), st.median(y)):+.1f} %" if x and y else "-")
            if any(v != "-" for v in row):
                lines.append(f"| {label} | {a} -> {b} | " + " | ".join(row) + " |")
        best = []
        for t in TOOLS:
            cands = [(st.median(v), c) for (m, c, tt), v in by.items() if m == model and tt == t and v]
            best.append(f"{min(cands)[0]:.0f} ({min(cands)[1]})" if cands else "-")
        lines += [f"| best us/token | | {' | '.join(best)} |", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="llama-3.2-1b",
                   help="space/comma-separated preset[:layers] (default llama-3.2-1b; the issue's set: "
                        + " ".join(f"{m}:{n}" if n else m for m, n in MODELS.items()) + ")")
    p.add_argument("--configs", help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--llamacpp", help="build folder (default $WORKBENCH_LLAMACPP)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--start-pos", type=int, default=448)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=5, help="repetitions per llama.cpp call (llama-bench -r)")
    p.add_argument("--pairs", type=int, default=2,
                   help="backend / llama-bench calls per configuration and round, interleaved A B A B")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads of both llama.cpp tools (default: llama-bench's, one per physical core, "
                        "at most the CPUs this process may use)")
    p.add_argument("--weight-dtype", default="f16", choices=WEIGHT_DTYPES,
                   help="the GGUF's weights (and ours); q4_0/q8_0: issue 16's table")
    p.add_argument("--fill", default="tiled", choices=("tiled", "exact"),
                   help="tiled: GGUF written at disk speed, both sides run the file (timing only, default); "
                        "exact: the seeded weights (minutes for the big models)")
    p.add_argument("--ours-weights", default="auto", choices=("auto", "file", "device"),
                   help="file: ours reads the tiled GGUF's values (what llama.cpp runs; gathering MoE experts "
                        "takes up to minutes per model); device: drawn on the GPU in seconds, same distributions; "
                        "auto (default): file, unless the GPU cannot keep ours beside llama.cpp's copy")
    p.add_argument("--drop-gguf", action="store_true",
                   help="delete each model's tiled GGUF when its configurations are done (a small disk)")
    p.add_argument("--config-s", type=float, default=45,
                   help="seconds one configuration may take: none starts with less budget left (default 45)")
    p.add_argument("--ours-runs", type=int, default=3, help="cuda backend runs per round")
    p.add_argument("--no-ours", action="store_true", help="llama.cpp and llama-bench only")
    p.add_argument("--no-backend", action="store_true",
                   help="llama-bench alone, without the llamacpp backend: a process in ~2 s instead of ~6, so "
                        "more rounds fit a lease (a knob's effect pairs its cells' processes round by round, and "
                        "one llama.cpp process differs from the next by 1-5 %%)")
    p.add_argument("--ours-fusion", default="llamacpp", choices=("llamacpp", "all"),
                   help="ours with llama.cpp's fusion set (default), or with the workbench's own fusions added")
    p.add_argument("--ours-pdl-trigger", choices=PDL_TRIGGERS, default=None,
                   help="ours (and sim) with their PDL launch signal at this position where PDL is on "
                        "(default: the Strategy's, which maps llama.cpp's placement)")
    p.add_argument("--ours-pdl-wait", choices=PDL_WAITS, default=None,
                   help="ours (and sim) with their PDL wait at this position where PDL is on (default: the "
                        "Strategy's, first-read: weight loads issued before it; start: none, as llama.cpp's kernels)")
    p.add_argument("--ours-logits", choices=LOGITS_MODES, default="copy",
                   help="ours (and sim) with their logits copied to the host (default, as llama.cpp) or written "
                        "there by their kernel (zero-copy)")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("BUDGET_S", 1e9)))
    p.add_argument("--jsonl", default="out/llamacpp_peer.jsonl")
    p.add_argument("--md", help="markdown summary (default: the jsonl's name with .md)")
    p.add_argument("--summarize", nargs="+", metavar="JSONL", help="only summarise these result files")
    args = p.parse_args()
    if args.configs:
        args.configs = set(args.configs.split(","))
        unknown = args.configs - set(CONFIGS)
        if unknown:
            p.error(f"unknown config(s) {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    md = Path(args.md or Path(args.jsonl).with_suffix(".md"))
    args.md = str(md)
    if not args.summarize and args.context != args.start_pos + args.tokens:
        print(f"note: llama-bench sizes its context as depth + tokens = {args.start_pos + args.tokens}; the "
              f"backend and ours use --context {args.context} (set --context to match for identical set-ups)",
              flush=True)
    if not args.summarize:
        bench = Bench(args)
        for spec in args.models.replace(",", " ").split():
            if bench.left() < 30:
                print(f"time budget reached before {spec}", flush=True)
                break
            bench.run_model(spec)
    recs = load(args.summarize or [args.jsonl])
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(summarize(recs))
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
