"""The RaceReport: every unordered conflicting pair, in plain words, with a suggested fix.

Each race names both operations (node, kernel op, stream, token, what they access), the
buffer and bytes they share, the model tensors behind those bytes (the allocator may have put
two tensors there), why nothing orders them, and what would: an event, moving the PDL wait,
``stream-aware`` allocation, a sync before the host rewrites its buffer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..strategy.fusion_chains import FUSED_OPS
from ..strategy.plan import Plan
from .accesses import Access, AccessTable
from .hb import HappensBefore, Op
from .races import RacePair

#: cause -> one-line description (the keys are stable, tests and JSON consumers use them)
CAUSES = {
    "pdl-early-read": "a PDL kernel reads before its griddepcontrol.wait",
    "pdl-trigger": "an early PDL read of a kernel that is not the predecessor, let in by an early trigger",
    "allocator-reuse": "the allocator gave two tensors the same bytes while their users run concurrently",
    "copy-elim": "a copy-eliminated op writes into a view another stream uses, with no event",
    "fusion": "a fused kernel reads a tensor of another stream that only a node it absorbed was ordered after",
    "missing-event": "a cross-stream dependency without an event record -> wait",
    "host-rewrite": "the host rewrites a staging buffer an async copy may still read",
    "host-read": "the host reads a buffer an async copy may still write",
    "unsynced-token": "work of one token is not ordered before the next token's",
    "unordered": "no order between the two operations",
}


@dataclass(frozen=True)
class Side:
    """One side of a race, in the Plan's vocabulary."""

    node: str
    op: str            # kernel op (MUL_MAT, ...), memcpy kind or "host"
    stream: int | None
    lane: str          # "stream 1", "capture stream 1 of the graph launched on stream 0", "the host thread"
    token: int
    access: str        # "read" / "write"
    role: str          # "reads src 1", "writes dst", "rewrites host buffer", ...
    phase: str         # pre-wait, post-wait, copy, host
    view: str
    tensor: str | None  # the model tensor behind the bytes (before allocation), when known

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Race:
    kind: str           # "write/write" | "read/write"
    cause: str          # a key of CAUSES
    buffer: str
    lo: int
    hi: int
    first: Side
    second: Side
    why: str
    fix: str

    @property
    def nodes(self) -> tuple[str, str]:
        return self.first.node, self.second.node

    def text(self) -> str:
        f, s = self.first, self.second
        return (f"{self.kind} race on {self.buffer}[{self.lo}:{self.hi}) ({self.cause})\n"
                f"  {f.node} ({f.op}, token {f.token}, {f.lane}) {f.role} {f.view}"
                f"{_tensor(f)} [{f.phase}]\n"
                f"  {s.node} ({s.op}, token {s.token}, {s.lane}) {s.role} {s.view}"
                f"{_tensor(s)} [{s.phase}]\n"
                f"  why: {self.why}\n  fix: {self.fix}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "cause": self.cause, "buffer": self.buffer, "bytes": [self.lo, self.hi],
                "first": self.first.to_dict(), "second": self.second.to_dict(), "why": self.why, "fix": self.fix}


def _tensor(side: Side) -> str:
    return f" (tensor {side.tensor})" if side.tensor and side.tensor not in side.view else ""


@dataclass
class RaceReport:
    """The verdict on a Plan over ``tokens`` consecutive tokens."""

    label: str
    tokens: int
    races: list[Race]
    checked_pairs: int
    ops: int
    points: int
    accesses: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def race_free(self) -> bool:
        return not self.races

    def by_cause(self) -> dict[str, int]:
        return dict(Counter(r.cause for r in self.races))

    def text(self, limit: int = 20) -> str:
        head = (f"{self.label}: {len(self.races)} race(s) in {self.tokens} tokens "
                f"({self.ops} operations, {self.accesses} accesses, {self.checked_pairs} conflicting pairs "
                f"checked in {self.seconds:.2f} s)")
        lines = [head]
        lines += [f"note: {n}" for n in self.notes]
        if self.race_free:
            lines.append("race-free: every conflicting pair is ordered by happens-before")
            return "\n".join(lines)
        lines.append("by cause: " + ", ".join(f"{c} {n}" for c, n in sorted(self.by_cause().items())))
        for k, r in enumerate(self.races[:limit]):
            lines.append(f"\n[{k + 1}] " + r.text())
        if len(self.races) > limit:
            rest = Counter((r.cause, r.first.node.split("-")[0], r.second.node.split("-")[0])
                           for r in self.races[limit:])
            lines.append(f"\n... and {len(self.races) - limit} more:")
            lines += [f"  {n} x {cause}: {a} / {b}" for (cause, a, b), n in rest.most_common(15)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.label, "tokens": self.tokens, "race_free": self.race_free,
                "checked_pairs": self.checked_pairs, "ops": self.ops, "points": self.points,
                "accesses": self.accesses, "seconds": round(self.seconds, 4), "by_cause": self.by_cause(),
                "notes": self.notes, "races": [r.to_dict() for r in self.races]}


# -- explaining one pair ------------------------------------------------------------------------
class Explainer:
    """Turns RacePairs into Races: names, tensors, cause, why and fix."""

    def __init__(self, hb: HappensBefore, table: AccessTable) -> None:
        self.hb = hb
        self.plan: Plan = hb.plan
        self.table = table
        self._source: dict[str, Any] | None = None
        self._sides: dict[int, Side] = {}
        self._last: dict[tuple[int, tuple[str, int | None]], Op] = {}
        for op in hb.ops:  # last op of each (token, stream)
            self._last[(op.token, op.lane)] = op

    def race(self, pair: RacePair) -> Race:
        a, b = self.table.accesses[pair.first], self.table.accesses[pair.second]
        oa, ob = self.hb.ops[a.op], self.hb.ops[b.op]
        strided = self.table.columns["strided"]
        lo, hi = _overlap(a, b, bool(strided[pair.first] or strided[pair.second]))
        kind = "write/write" if a.write and b.write else "read/write"
        sa, sb = self.side_of(pair.first), self.side_of(pair.second)
        cause, why, fix = self.cause(a, b, oa, ob, sa, sb)
        return Race(kind, cause, a.view.buffer.name, lo, hi, sa, sb, why, fix)

    def side_of(self, k: int) -> Side:
        if k not in self._sides:
            acc = self.table.accesses[k]
            self._sides[k] = self.side(self.hb.ops[acc.op], acc)
        return self._sides[k]

    def side(self, op: Op, acc: Access) -> Side:
        kernel = op.launch.node.op if op.launch is not None else ("host" if op.kind == "host" else op.host_op.kind)
        return Side(op.name, kernel, op.stream, op.where(), op.token, acc.mode, acc.role, acc.phase,
                    acc.view.describe(), self.tensor(op, acc))

    def tensor(self, op: Op, acc: Access) -> str | None:
        """The model tensor (buffer before allocation) behind an arena access, when it is known."""
        alloc = self.plan.allocation
        if acc.view.buffer.name != alloc.arena:
            return acc.view.buffer.name
        cands = alloc.buffers_at(acc.view.start, acc.view.end)
        if len(cands) == 1:
            return cands[0]
        src = self.source_nodes().get(op.name)
        if src is not None:
            views = src.outs if acc.write else src.srcs
            mine = [v.buffer.name for v in views if v.buffer.name in cands]
            if not mine:
                mine = [v.buffer.name for v in (*src.srcs, *src.outs) if v.buffer.name in cands]
            if mine:
                return mine[0]
        return None

    def source_nodes(self) -> dict[str, Any]:
        if self._source is None:
            self._source = {n.name: n for n in self.plan.source.nodes}
        return self._source

    def cause(self, a: Access, b: Access, oa: Op, ob: Op, sa: Side, sb: Side) -> tuple[str, str, str]:
        hb = self.hb
        what = f"tensor {sa.tensor or a.view.buffer.name}"
        # -- host staging buffers ----------------------------------------------------------------
        if ob.kind == "host" and b.write:
            return ("host-rewrite",
                    f"for token {ob.token} the host rewrites {a.view.buffer.name} while token {oa.token}'s "
                    f"{oa.host_op.api} on stream {oa.stream} may still be reading it: that copy is asynchronous "
                    f"and nothing between them waits for it (no stream sync after the copy)",
                    f"synchronize stream {oa.stream} (cudaStreamSynchronize) after the copy and before the host "
                    f"rewrites the buffer (a sync at the token boundary), or make the copy blocking")
        if ob.kind == "host" and ob.reads is not None:
            return ("host-read",
                    f"the host reads the zero-copy output {a.view.buffer.name} for token {ob.token} while kernel "
                    f"{oa.name}, which writes it into mapped host memory, may still be running (no sync after it)",
                    f"cudaStreamSynchronize({oa.stream}) after the step, before the host reads the output")
        if ob.kind == "host" and not b.write:
            return ("host-read",
                    f"the host reads {a.view.buffer.name} for token {ob.token} before the asynchronous "
                    f"{oa.host_op.api} that fills it is known to be done (no sync after the copy)",
                    f"cudaStreamSynchronize({oa.stream}) after the D2H copy, before the host reads the buffer")
        if oa.kind == "host" or a.phase == "host" or b.phase == "host":
            return ("host-rewrite",
                    f"the host accesses {a.view.buffer.name} with no sync ordering it against {ob.name}",
                    "synchronize the stream of the copy before the host touches the buffer")
        # -- PDL ---------------------------------------------------------------------------------
        pre, other, opre = (b, oa, ob) if b.phase == "pre-wait" else (a, ob, oa) if a.phase == "pre-wait" \
            else (None, None, None)
        if pre is not None:
            what = (sb if pre is b else sa).tensor or pre.view.buffer.name
            wait = opre.launch.wait
            pred = hb.ops[opre.stream_pred] if opre.stream_pred is not None else None
            if pred is not None and pred.index != other.index and pred.kind == "kernel" and \
                    pred.launch.trigger == "start" and hb.before(other.end, opre.wait):
                return ("pdl-trigger",
                        f"{opre.name} {pre.role} ({what}) before its griddepcontrol.wait (PDL wait '{wait}'). "
                        f"{other.name} is not its stream predecessor, but the predecessor {pred.name} triggers "
                        f"launch_dependents at 'start', before its own wait, so {opre.name} may begin while "
                        f"{other.name} is still running",
                        f"move {opre.name}'s wait before this read (--pdl-wait first-read or start), or trigger "
                        f"{pred.name} after its wait (--pdl-trigger after-main-loop or end)")
            if hb.before(other.end, opre.wait):
                return ("pdl-early-read",
                        f"{opre.name} {pre.role} ({what}) before its griddepcontrol.wait (PDL wait '{wait}'); "
                        f"{other.name} writes it and its writes are visible only after that wait (a trigger "
                        f"lets {opre.name} start early but never flushes its predecessor's writes)",
                        f"place {opre.name}'s wait before its first dependent read (--pdl-wait first-read "
                        f"or start)")
        # -- streams -----------------------------------------------------------------------------
        if oa.token != ob.token and not self._token_synced(oa, ob):
            return ("unsynced-token",
                    f"token {ob.token}'s {ob.name} on {ob.where()} is not ordered after token {oa.token}'s "
                    f"{oa.name} on {oa.where()}: that stream never joins what the token's final sync waits for",
                    f"join {oa.where()} into the synchronized stream with an event before the token ends (or "
                    f"cudaDeviceSynchronize at the token boundary)")
        if oa.lane != ob.lane:
            streams = f"{oa.where()} and {ob.where()}"
            if sa.tensor and sb.tensor and sa.tensor != sb.tensor and \
                    a.view.buffer.name == self.plan.allocation.arena:
                policy = self.plan.allocation.policy
                placed = (f"the {policy} allocator placed {sa.tensor} (used by {oa.name}) and {sb.tensor} (used by "
                          f"{ob.name}) at the same arena bytes")
                if policy == "serial-reuse":
                    return ("allocator-reuse",
                            f"{placed}, assuming in-order execution, but the two run on {streams} with no event "
                            f"between them",
                            "allocate with --allocator stream-aware (recycle bytes only after their last use is "
                            "visible to every stream), or no-reuse")
                return ("allocator-reuse",
                        f"{placed} because the schedule it was given ordered {oa.name} before {ob.name}; the "
                        f"Plan's events do not (they run on {streams} unordered)",
                        f"restore the event that orders {oa.name} before {ob.name} (and re-run the allocator on "
                        f"the schedule that is actually executed)")
            writer = oa if a.write else ob
            wnode = writer.launch.node if writer.launch is not None else None
            if wnode is not None and wnode.params.get("cpy_eliminated"):
                return ("copy-elim",
                        f"{writer.name} writes straight into {a.view.buffer.name} (copy elimination removed its "
                        f"CPY) while {(ob if writer is oa else oa).name} on another stream uses those bytes; "
                        f"nothing orders {streams}",
                        f"record an event after {oa.name} on {oa.where()} and wait on it on {ob.where()} "
                        f"before {ob.name}, or keep the CPY for {writer.name}")
            fused = next((o for o, acc in ((ob, b), (oa, a)) if _inherited_read(o, acc)), None)
            if fused is not None:
                other = oa if fused is ob else ob
                verb = "writes" if (a if other is oa else b).write else "reads"
                return ("fusion",
                        f"{fused.name} ({fused.launch.node.op}, --fusion {FUSED_OPS[fused.launch.node.op]}) reads "
                        f"{what} that {other.name} on {other.where()} {verb}: "
                        f"the fused kernel reads it for {', '.join(fused.launch.node.params['fused'])}, which it "
                        f"absorbed, but nothing orders it after {other.name} (it kept the events of its last "
                        f"node, not those of the first)",
                        f"schedule the fused graph (streams and events from its own hazards): make {fused.where()} "
                        f"wait on an event recorded after {other.name} before {fused.name}")
            return ("missing-event",
                    f"{ob.name} on {ob.where()} {b.mode}s {what} that {oa.name} on {oa.where()} "
                    f"{'writes' if a.write else 'reads'}, but no event record -> wait path leads from "
                    f"{oa.name} to {ob.name} (a missing fork or join event)",
                    f"record an event on {oa.where()} after {oa.name} and make {ob.where()} wait "
                    f"on it before {ob.name}")
        return ("unordered",
                f"nothing orders {oa.name} before {ob.name} on {ob.where()}",
                "add a dependency (event or sync) between them")

    def _token_synced(self, oa: Op, ob: Op) -> bool:
        """True when the last op of ``oa``'s token on ``oa``'s stream ends before ``ob`` starts."""
        return self.hb.before(self._last[(oa.token, oa.lane)].end, ob.start)


def _inherited_read(op: Op, acc: Access) -> bool:
    """``acc`` is a fused node's read of a source it inherited from a node it absorbed."""
    node = op.launch.node if op.launch is not None else None
    if node is None or node.op not in FUSED_OPS or acc.write or not acc.role.startswith("reads src "):
        return False
    return int(acc.role.rsplit(" ", 1)[1]) in node.params.get("inherited", ())


def _overlap(a: Access, b: Access, strided: bool) -> tuple[int, int]:
    """The first run of bytes both accesses touch."""
    if strided:
        for lo1, hi1 in a.view.intervals():
            for lo2, hi2 in b.view.intervals():
                if lo1 < hi2 and lo2 < hi1:
                    return max(lo1, lo2), min(hi1, hi2)
    return max(a.view.start, b.view.start), min(a.view.end, b.view.end)
