"""Memory accesses of the unrolled program as byte ranges of allocated buffers.

Every access is a read or a write of a View (so of exact bytes of a buffer *after* allocation:
two tensors that the allocator placed at the same arena bytes conflict) over an interval of
happens-before points ``[begin, end]``: it may execute at any time after ``begin`` and is over
(for a write: done and flushed) by ``end``. Two accesses are ordered when the first's end
happens before the second's begin.

Where a kernel access lies follows its launch's PDL placement:

* reads before ``griddepcontrol.wait`` span ``[start, wait]``: with wait ``first-read`` only the
  reads of data nothing in the Plan writes (weights, constants); with ``late`` every read (which
  input a kernel reads first is up to the kernel, so every one counts);
* reads after the wait span ``[wait, trigger]`` (a kernel triggers after its main loop, or at its
  end) or ``[wait, end]`` when it triggers at ``start``;
* writes span ``[wait, end]``: only completion flushes them, a trigger never does.

A memcpy reads its source and writes its destination during ``[start, end]``; the host reads or
writes its staging buffers at one host point (a blocking copy from pageable memory reads it when
the CPU stages it), and reads a zero-copy output (``--logits zero-copy``) as the device tensor
itself, which its kernel wrote into mapped host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..graph import Buffer, View
from ..strategy.plan import Plan
from ..strategy.strategy import PDL_WAITS
from .hb import HappensBefore, Op, PlanFormatError


@dataclass(frozen=True)
class Access:
    """One read or write of ``view`` by op ``op`` somewhere in points ``[begin, end]``."""

    op: int
    write: bool
    view: View
    begin: int
    end: int
    role: str      # "reads src 1", "writes dst", "reads host buffer", ...
    phase: str     # "pre-wait", "post-wait", "copy", "host"

    @property
    def mode(self) -> str:
        return "write" if self.write else "read"


def host_buffer(plan: Plan, tensor: str, d2h: bool, pinned: bool) -> View:
    """The host staging buffer of a graph input/output, shaped like the device tensor."""
    table = plan.graph.outputs if d2h else plan.graph.inputs
    if tensor not in table:
        kind = "output" if d2h else "input"
        raise PlanFormatError(f"host copy of {tensor!r}: the Plan's graph has no {kind} of that name "
                              f"(has {sorted(table)})")
    v = table[tensor]
    mem = "pinned" if pinned else "pageable"
    return View.of(Buffer(f"host:{tensor} ({mem})", v.nbytes, "output" if d2h else "input"), v.shape, v.dtype)


def written_buffers(plan: Plan) -> set[str]:
    """Buffers that some kernel or H2D copy of the Plan writes (everything else is read-only)."""
    out = {v.buffer.name for n in plan.graph.nodes for v in n.outs}
    out |= {plan.graph.inputs[h.tensor].buffer.name for h in plan.host_program
            if h.kind == "memcpy_h2d" and h.tensor in plan.graph.inputs}
    return out


@dataclass
class AccessTable:
    """All accesses of an unrolled program, with column arrays for vectorized pair tests."""

    accesses: list[Access]

    @cached_property
    def columns(self) -> dict[str, np.ndarray]:
        acc = self.accesses
        names: dict[str, int] = {}
        buf = np.fromiter((names.setdefault(a.view.buffer.name, len(names)) for a in acc), np.int64, len(acc))
        return {
            "buffer": buf,
            "lo": np.fromiter((a.view.start for a in acc), np.int64, len(acc)),
            "hi": np.fromiter((a.view.end for a in acc), np.int64, len(acc)),
            "write": np.fromiter((a.write for a in acc), bool, len(acc)),
            "op": np.fromiter((a.op for a in acc), np.int64, len(acc)),
            "begin": np.fromiter((a.begin for a in acc), np.int64, len(acc)),
            "end": np.fromiter((a.end for a in acc), np.int64, len(acc)),
            "strided": np.fromiter((not _one_run(a.view) for a in acc), bool, len(acc)),
        }

    def __len__(self) -> int:
        return len(self.accesses)


def _one_run(v: View) -> bool:
    """True when the view covers its whole span (so span overlap is exact overlap)."""
    return v.is_contiguous or v.nbytes == v.end - v.start


def collect(hb: HappensBefore) -> AccessTable:
    """Every access of every op of ``hb`` (duplicates within one op folded)."""
    plan = hb.plan
    written = written_buffers(plan)
    out: list[Access] = []
    for op in hb.ops:
        seen: set[tuple] = set()
        for a in _op_accesses(plan, op, written):
            if a.view.numel == 0:
                continue
            key = (a.write, a.view.buffer.name, a.view.offset, a.view.shape, a.view.strides, a.begin, a.end)
            if key not in seen:
                seen.add(key)
                out.append(a)
    return AccessTable(out)


def _op_accesses(plan: Plan, op: Op, written: set[str]) -> list[Access]:
    if op.kind == "kernel":
        return _kernel_accesses(op, written)
    if op.reads is not None:  # the host reads a zero-copy output where its kernel wrote it
        return [Access(op.index, False, op.reads, op.start, op.end, "reads zero-copy output", "host")]
    hop = op.host_op
    assert hop is not None
    d2h = hop.kind == "memcpy_d2h"
    host = host_buffer(plan, hop.tensor, d2h, hop.host_buffer == "pinned")
    if op.kind == "host":
        return [Access(op.index, op.name.startswith("host writes"), host, op.start, op.end,
                       "rewrites host buffer" if not d2h else "reads host buffer", "host")]
    device = plan.graph.outputs[hop.tensor] if d2h else plan.graph.inputs[hop.tensor]
    if d2h:
        return [Access(op.index, False, device, op.start, op.end, "reads device tensor", "copy"),
                Access(op.index, True, host, op.start, op.end, "writes host buffer", "copy")]
    staged = op.staged_at
    if staged is not None:
        host_read = Access(op.index, False, host, staged, staged, "reads host buffer (staging)", "host")
    else:
        host_read = Access(op.index, False, host, op.start, op.end, "reads host buffer", "copy")
    return [host_read, Access(op.index, True, device, op.start, op.end, "writes device tensor", "copy")]


def _kernel_accesses(op: Op, written: set[str]) -> list[Access]:
    launch = op.launch
    assert launch is not None
    node = launch.node
    wait = launch.wait if launch.pdl else "start"
    if wait not in PDL_WAITS:
        raise PlanFormatError(f"launch of {node.name}: PDL wait {wait!r} is not one of {PDL_WAITS}")
    read_end = op.end if launch.trigger == "start" else op.trigger
    out: list[Access] = []
    for k, v in enumerate(node.srcs):
        dependent = v.buffer.name in written
        early = wait == "late" or (wait == "first-read" and not dependent)
        if early and op.wait != op.start:
            out.append(Access(op.index, False, v, op.start, op.wait, f"reads src {k}", "pre-wait"))
        else:
            out.append(Access(op.index, False, v, op.wait, read_end, f"reads src {k}", "post-wait"))
    for k, v in enumerate(node.outs):
        role = "writes dst" if k == 0 else f"writes out {k}"
        out.append(Access(op.index, True, v, op.wait, op.end, role, "post-wait"))
    return out
