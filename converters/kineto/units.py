"""Communication units: one issued collective (or send/recv) with everything that tells
what it is.

A unit is rooted at the outermost communication host op (``c10d::*``, ``record_param_comms``
naming a collective, ``nccl:*``/``gloo:*`` annotations) and holds all communication ops
nested under it plus the NCCL kernels launched from inside it; several kernels under one
root are one collective. A NCCL kernel launched outside any such op is a unit of its own.

Gloo runs asynchronous collectives on its worker threads: the issuing ``c10d::*`` op on the
caller's thread and the ``gloo:*`` annotation that spans the actual exchange are paired in
issue order (first unpaired execution of a compatible type starting after the issue), so
that the collective gets the execution's time and the issuing op's meaning. A ``gloo:*``
execution with no issuing op (filtered traces) is a unit by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from . import comm
from .comm import CommInfo
from .events import Ev


@dataclass
class CommUnit:
    root: Ev | None                     # outermost issuing host op
    ops: list[Ev] = field(default_factory=list)
    kernels: list[Ev] = field(default_factory=list)
    execution: Ev | None = None         # host communication: the op spanning the exchange
    info: CommInfo | None = None

    @property
    def first(self) -> Ev:
        """The event whose start orders the unit among others."""
        if self.kernels:
            return self.kernels[0]
        return self.root if self.root is not None else self.execution  # type: ignore[return-value]


def _outermost_comm(ev: Ev, parents: dict[int, Ev], is_comm: set[int]) -> Ev | None:
    found = ev if ev.idx in is_comm else None
    p = parents.get(ev.idx)
    while p is not None:
        if p.idx in is_comm:
            found = p
        p = parents.get(p.idx)
    return found


def find_units(host: list[Ev], parents: dict[int, Ev], nccl_kernels: list[Ev],
               launch_of: Callable[[Ev], Ev | None]) -> tuple[list[CommUnit], list[CommUnit]]:
    """(units with NCCL kernels, host-only units) over all events of a file."""
    comm_ops = [e for e in host if e.kind == 1 and comm.is_comm_op(e)]
    is_comm = {e.idx for e in comm_ops}
    by_root: dict[int, CommUnit] = {}
    for op in comm_ops:
        root = _outermost_comm(op, parents, is_comm)
        assert root is not None
        u = by_root.get(root.idx)
        if u is None:
            u = by_root[root.idx] = CommUnit(root)
        u.ops.append(op)
    gpu_units: dict[int, CommUnit] = {}
    lone: list[CommUnit] = []
    for k in nccl_kernels:
        launch = launch_of(k)
        root = _outermost_comm(launch, parents, is_comm) if launch is not None else None
        if root is None:
            lone.append(CommUnit(None, [], [k]))
            continue
        u = by_root[root.idx]
        u.kernels.append(k)
        gpu_units[root.idx] = u
    for u in by_root.values():
        u.ops.sort(key=lambda e: (e.ts, -e.dur, e.idx))
        u.kernels.sort(key=lambda e: (e.ts, e.idx))
    host_units = [u for idx, u in by_root.items() if idx not in gpu_units]
    _pair_gloo(host_units)
    host_units = [u for u in host_units if u.root is not None]
    units = list(gpu_units.values()) + lone
    units.sort(key=lambda u: (u.first.ts, u.first.idx))
    host_units.sort(key=lambda u: (u.first.ts, u.first.idx))
    return units, host_units


def _compatible(issued: int | str | None, executed: int | str | None) -> bool:
    if issued is None or executed is None or issued == executed:
        return True
    # Gloo runs reduce-scatter as an all-reduce of the whole buffer.
    return issued == comm.REDUCE_SCATTER and executed == comm.ALL_REDUCE


def _pair_gloo(units: list[CommUnit]) -> None:
    """Attach each gloo execution to its issuing unit (see module docstring)."""
    executions: list[CommUnit] = []
    issues: list[CommUnit] = []
    for u in units:
        inner = [op for op in u.ops if op.name.startswith("gloo:")]
        if u.root is not None and u.root.name.startswith("gloo:"):
            u.execution = u.root
            executions.append(u)
        elif inner:
            u.execution = inner[0]
        else:
            issues.append(u)
    if not executions or not issues:
        return
    executions.sort(key=lambda u: (u.root.ts, u.root.idx))  # type: ignore[union-attr]
    issues.sort(key=lambda u: (u.root.ts, u.root.idx))  # type: ignore[union-attr]
    taken = [False] * len(executions)
    lo = 0
    for u in issues:
        assert u.root is not None
        want = comm.op_collective(u.root.name)
        while lo < len(executions) and taken[lo]:
            lo += 1
        for j in range(lo, min(len(executions), lo + 32)):
            ex = executions[j]
            if taken[j] or ex.root.ts < u.root.ts:  # type: ignore[union-attr]
                continue
            if _compatible(want, comm.op_collective(ex.root.name)):  # type: ignore[union-attr]
                taken[j] = True
                u.execution = ex.root
                ex.root = None  # absorbed: dropped from the unit list by the caller
                break
