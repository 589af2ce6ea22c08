"""A catalogue of deliberately broken Plans (seeded bugs), each with the race it must produce.

Each bug is a compiled Plan for a model (``llama-tiny`` unless it needs another family) under
a Strategy, optionally followed by one surgical mutation: drop an event, move a launch to the
wrong stream, remove a sync from the host program, an unsafe copy elimination. ``expect`` names
the race that must be reported (cause, first node, second node). The same catalogue drives
the seeded-bug tests and the GPU provocation script (``benchmarks/race_provoke.py``), which
builds the bugs on larger models so that the racing kernels run long enough to collide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..graph import Graph, GraphBuilder
from ..models import ModelConfig, build_graph, preset
from ..strategy.compile import compile_plan
from ..strategy.host import host_program
from ..strategy.plan import Allocation, HostOp, Launch, Plan
from ..strategy.strategy import Strategy
from .seeded_fusions import FUSION_GRAPHS, fusion_of, stale_events

# -- mutations (pure: Plan -> Plan) -------------------------------------------------------------


def with_launch(plan: Plan, node: str, **changes) -> Plan:
    """``plan`` with the launch of ``node`` changed (stream, pdl, wait, trigger, events); the
    eager host program is regenerated so that its event ops match the launches."""
    launches = [replace(la, **changes) if la.node.name == node else la for la in plan.launches]
    if all(la.node.name != node for la in plan.launches):
        raise KeyError(f"no launch for node {node!r}")
    out = replace(plan, launches=launches)
    if not plan.strategy.graphs:
        out = replace(out, host_program=host_program(plan.graph, launches, plan.strategy))
    return out


def with_host_program(plan: Plan, edit: Callable[[list[HostOp]], list[HostOp]]) -> Plan:
    """``plan`` with its per-token host program rewritten by ``edit``."""
    return replace(plan, host_program=edit(list(plan.host_program)))


def drop_last(kind: str) -> Callable[[list[HostOp]], list[HostOp]]:
    """Edit: remove the last host op of ``kind`` (e.g. the final ``stream_sync``)."""
    def edit(ops: list[HostOp]) -> list[HostOp]:
        k = max(i for i, h in enumerate(ops) if h.kind == kind)
        return ops[:k] + ops[k + 1:]
    return edit


def on_stream(kinds: tuple[str, ...], stream: int, last_only: bool = False) -> Callable[[list[HostOp]], list[HostOp]]:
    """Edit: issue the host ops of ``kinds`` (all, or the last one) on ``stream``."""
    def edit(ops: list[HostOp]) -> list[HostOp]:
        hits = [i for i, h in enumerate(ops) if h.kind in kinds]
        hits = hits[-1:] if last_only else hits
        return [replace(h, stream=stream) if i in hits else h for i, h in enumerate(ops)]
    return edit


def wait_after_launch(plan: Plan, node: str) -> Callable[[list[HostOp]], list[HostOp]]:
    """Edit (eager): issue the stream waits that precede ``node``'s launch just after it."""
    index = plan.launch_of(node).index

    def edit(ops: list[HostOp]) -> list[HostOp]:
        k = next(i for i, h in enumerate(ops) if h.kind == "launch" and h.launch == index)
        j = k
        while j > 0 and ops[j - 1].kind == "stream_wait_event":
            j -= 1
        return ops[:j] + [ops[k]] + ops[j:k] + ops[k + 1:]
    return edit


# -- hand-built plans ---------------------------------------------------------------------------


def hand_plan(graph: Graph, placed: list[tuple[int, tuple[int, ...], tuple[int, ...]]], strategy: Strategy) -> Plan:
    """A Plan over ``graph`` (no arena: every scratch tensor keeps its own buffer) with each
    node placed as (stream, wait events, record events); eager host program from compile."""
    launches = [Launch(i, n, s, False, "start", "none", w, r)
                for i, (n, (s, w, r)) in enumerate(zip(graph.nodes, placed))]
    persistent = sum(b.nbytes for b in graph.buffers().values() if b.persistent)
    alloc = Allocation("no-reuse", {}, 0, persistent)
    return Plan(graph, graph, strategy, launches, host_program(graph, launches, strategy), alloc,
                n_streams=1 + max(s for s, _, _ in placed),
                n_events=1 + max((e for _, w, r in placed for e in (*w, *r)), default=-1))


def copy_elim_cross_stream() -> Plan:
    """An unsafe copy elimination. Before it, ``state_new`` wrote a scratch tensor and a CPY
    stored it into the recurrent state row after the join with stream 1, where ``state_read``
    reads the old state. Eliminated, ``state_new`` writes the state row directly, concurrently
    with ``state_read``."""
    b = GraphBuilder("copy-elim-bug")
    x = b.input("inp_x", (1, 64), "f32")
    w = b.weight("w", (64, 64), "f16")
    state = b.cache("cache_state", (4, 64), "f32")
    row = state.slice(0, 0, 1)
    xn = b.op("RMS_NORM", "x_norm", [x], (1, 64), eps=1e-6)
    b.node("MUL_MAT", "state_new", [w, xn], [row], cpy_eliminated=("state_cpy",))
    y = b.op("ADD", "state_read", [row, xn], (1, 64))
    out = b.op("ADD", "result_output", [y, row], (1, 64), kind="output")
    b.output("logits", out)
    placed = [(0, (), (0,)), (0, (), ()), (1, (0,), (1,)), (0, (1,), ())]
    return hand_plan(b.build(), placed, Strategy(streams="auto", fusion=frozenset({"copy-elim"})))


def side_stream_not_joined() -> Plan:
    """``side`` on stream 1 reads ``x_proj`` (forked by an event) but never joins stream 0:
    the token's final sync waits for stream 0 only, so the next token's ``x_proj`` overwrites
    the bytes ``side`` may still be reading."""
    b = GraphBuilder("unjoined-bug")
    x = b.input("inp_x", (1, 64), "f32")
    w = b.weight("w", (64, 64), "f16")
    h = b.op("MUL_MAT", "x_proj", [w, x], (1, 64))
    cache = b.cache("cache_side", (4, 64), "f32")
    b.node("ADD", "side", [h, x], [cache.slice(0, 0, 1)])
    out = b.op("MUL_MAT", "result_output", [w, h], (1, 64), kind="output")
    b.output("logits", out)
    placed = [(0, (), (0,)), (1, (0,), ()), (0, (), ())]
    return hand_plan(b.build(), placed, Strategy(streams="auto"))


# -- the catalogue ------------------------------------------------------------------------------


def compile_quietly(graph: Graph, strategy: Strategy, device_cc: tuple[int, int] | None = None) -> Plan:
    """compile_plan without the UnsafeStrategyWarning of PDL wait ``late`` (seeded on purpose)."""
    import warnings

    from ..strategy.strategy import UnsafeStrategyWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsafeStrategyWarning)
        return compile_plan(graph, strategy, device_cc)


@dataclass(frozen=True)
class SeededBug:
    """A broken Plan and the race (cause, first node, second node) it must be reported with.

    Most bugs are ``strategy`` compiled for ``model`` and then ``mutate``d (both also usable on
    larger models, e.g. by an executor that compiles its own Plans); ``hand_built`` ones are
    small Plans over their own graph."""

    name: str
    description: str
    expect: tuple[str, str, str]
    strategy: Strategy | None = None
    mutate: Callable[[Plan], Plan] | None = None
    hand_built: Callable[[], Plan] | None = None
    model: str = "llama-tiny"

    def apply(self, plan: Plan) -> Plan:
        """The seeded mutation applied to a Plan compiled under ``strategy``."""
        return self.mutate(plan) if self.mutate is not None else plan

    def plan(self, cfg: ModelConfig | None = None) -> Plan:
        if self.hand_built is not None:
            return self.hand_built()
        return self.apply(compile_quietly(build_graph(cfg or preset(self.model)), self.strategy))


def _no_final_sync(plan: Plan) -> Plan:
    return with_host_program(plan, drop_last("stream_sync"))


QKV = Strategy(graphs=True, streams="qkv", allocator="stream-aware")
QKV_EAGER = Strategy(streams="qkv", allocator="stream-aware")

def _early_fork(plan: Plan) -> Plan:
    """The fork event of layer 0 recorded after attn_norm-0_rms instead of after attn_norm-0."""
    events = plan.launch_of("attn_norm-0").record_events
    return with_launch(with_launch(plan, "attn_norm-0", record_events=()), "attn_norm-0_rms", record_events=events)


SEEDED_BUGS: tuple[SeededBug, ...] = (
    SeededBug("qkv-serial-reuse", "qkv streams with ggml-alloc's serial-reuse allocator (PR #16991's bug)",
              ("allocator-reuse", "Kcur-0", "Qcur_rope-0"), Strategy(graphs=True, streams="qkv")),
    SeededBug("auto-serial-reuse", "auto streams with serial-reuse on the hybrid GDN model",
              ("allocator-reuse", "Kcur-3", "Qcur_rope-3"), Strategy(graphs=True, streams="auto"),
              model="qwen3-next-tiny"),
    SeededBug("pdl-wait-late", "PDL with the wait after the first dependent read",
              ("pdl-early-read", "attn_norm-0", "Qcur-0"),
              Strategy(graphs=True, pdl=True, pdl_wait="late", pdl_trigger="end")),
    SeededBug("pdl-late-eager", "PDL wait late without graphs (eager cuLaunchKernelEx)",
              ("pdl-early-read", "attn_norm-0", "Qcur-0"),
              Strategy(pdl=True, pdl_wait="late", pdl_trigger="after-main-loop")),
    SeededBug("pdl-trigger-non-predecessor",
              "elementwise kernels wait late; the kernels before them trigger at start, so ffn_inp-0 reads "
              "inp_embd (not its predecessor) while it may still be written",
              ("pdl-trigger", "inp_embd", "ffn_inp-0"),
              Strategy(graphs=True, pdl=True, pdl_families=(("elementwise", "late", "start"),))),
    SeededBug("missing-join", "the attention waits for no join event from the K and V streams",
              ("missing-event", "k_cache_store-0", "kqv_out-0"), QKV,
              lambda p: with_launch(p, "kqv_out-0", wait_events=())),
    SeededBug("missing-fork", "the K branch does not wait for the fork event after attn_norm",
              ("missing-event", "attn_norm-0", "Kcur-0"), QKV, lambda p: with_launch(p, "Kcur-0", wait_events=())),
    SeededBug("fork-recorded-early", "the fork event is recorded before attn_norm instead of after it",
              ("missing-event", "attn_norm-0", "Vcur-0"), QKV, _early_fork),
    SeededBug("wait-after-launch", "eager: cudaStreamWaitEvent issued after the K launch instead of before",
              ("missing-event", "attn_norm-0", "Kcur-0"), QKV_EAGER,
              lambda p: with_host_program(p, wait_after_launch(p, "Kcur-0"))),
    SeededBug("set-rows-wrong-stream", "the K cache store runs on stream 0 instead of the K stream",
              ("missing-event", "Kcur_rope-0", "k_cache_store-0"), QKV,
              lambda p: with_launch(p, "k_cache_store-0", stream=0)),
    SeededBug("host-rewrite-no-sync", "implicit sync without the final stream sync: the host rewrites "
              "pinned inputs the async copies of the previous token may still read",
              ("host-rewrite", "memcpy_h2d inp_pos", "host writes inp_pos"), Strategy(sync="implicit", graphs=True),
              _no_final_sync),
    SeededBug("logits-read-no-sync", "boundary sync without the final sync: the host reads the logits "
              "before the async D2H copy is done",
              ("host-read", "memcpy_d2h logits", "host reads logits"), Strategy(sync="boundary", graphs=True),
              _no_final_sync),
    SeededBug("sync-wrong-stream", "the final cudaStreamSynchronize waits on stream 1, not on the stream "
              "of the D2H copy", ("host-read", "memcpy_d2h logits", "host reads logits"), QKV_EAGER,
              lambda p: with_host_program(p, on_stream(("stream_sync",), 1, last_only=True))),
    SeededBug("h2d-other-stream", "the input copies go to stream 1, the kernels run on stream 0, no event",
              ("missing-event", "memcpy_h2d inp_tokens", "inp_embd"),
              Strategy(sync="implicit", graphs=True, streams="qkv", allocator="stream-aware"),
              lambda p: with_host_program(p, on_stream(("memcpy_h2d",), 1))),
    SeededBug("graph-launch-other-stream", "the copies run on stream 0, the graph is launched on stream 1",
              ("missing-event", "memcpy_h2d inp_tokens", "inp_embd"), Strategy(sync="implicit", graphs=True),
              lambda p: with_host_program(p, on_stream(("graph_launch",), 1))),
    SeededBug("copy-elim-cross-stream", "copy elimination writes the state row that another stream still reads",
              ("copy-elim", "state_new", "state_read"), hand_built=copy_elim_cross_stream),
    SeededBug("side-stream-not-joined", "a side stream never joins stream 0 before the token's final sync",
              ("unsynced-token", "side", "x_proj"), hand_built=side_stream_not_joined),
    *(SeededBug(f"{label}-stale-events", f"--fusion {fusion_of(label)}: the fused node keeps the waits of the last "
                "node it replaced and reads the first node's input, written on stream 1, unordered",
                ("fusion", "side", fused), hand_built=stale_events(label))
      for label, (_, fused) in FUSION_GRAPHS.items()),
)


def seeded_bug(name: str) -> SeededBug:
    for bug in SEEDED_BUGS:
        if bug.name == name:
            return bug
    raise KeyError(f"no seeded bug {name!r}; known: {', '.join(b.name for b in SEEDED_BUGS)}")
