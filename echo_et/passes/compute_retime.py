"""Retime every compute node of a Job for a GPU with the compute model.

Which nodes: KIND_COMPUTE nodes (and device-to-device copies and memsets) on device streams,
as GPU traces and meta-device traces have them. Each gets ``duration_ns`` from the model and
``attrs["timing"] = "model:<profile>"``:

- a node naming an operator (``aten::mm`` with shapes and dtypes: meta-device traces, or any
  node with shapes) is priced from its own payload;
- a GPU kernel from a profiler trace (``ampere_sgemm_...``, no shapes) takes the shapes of
  the CPU operator that launched it (launch dependency, then up the operator nesting to the
  innermost operator with shapes); the operator's time is shared among the kernels it
  launched in proportion to their measured durations;
- a kernel with neither is scaled from the trace's GPU to the target by the ratio of peak
  FLOP rates (GEMM, attention, convolution kernels) or of HBM bandwidths (the rest), when
  the trace's GPU is known; otherwise it keeps its measured time.

In an untimed graph, every host launch node (the meta-device tracer writes one per issued
operator) gets the model's ``launch_ns`` for its op (an operator's issue time, or a
communication call's): the host issuing operators can then bound the iteration, as PyTorch
eager does on a real GPU.

Timed graphs (measured start times) are re-laid out so that no dependency is broken: every
timestamp moves by the time gained or lost by the retimed nodes that ended before it (a host
operator waiting for a kernel, or enclosing it, grows or shrinks with it). Untimed graphs
(all starts 0, as the meta-device tracer writes them) only get durations. The input Job is
never modified. The manifest's ``hardware.gpu_name`` becomes the target GPU's, so the
communication model picks that GPU's preset too.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from echo_et.errors import EchoError
from echo_et.ir import Graph, Job
from echo_et.ir.conventions import WORK_SCALE_ATTR
from echo_et.ir.schema import pb

# How a node was timed (the first four are the model's answers for an operator).
PRICED, NO_WORK, GUESSED, NO_SHAPES = "priced", "no_work", "guessed", "no_shapes"
FROM_OP = "from_launching_op"
SCALED = "scaled"
KEPT = "kept"
LAUNCH = "host_launch"
# The compute time of kernels the model did not price (kept or scaled from the trace).
NOT_MODELLED = "not_modelled"


class ComputeTimer(Protocol):
    """What the pass needs from a compute model (``echo_et.models.compute.ComputeModel``
    is one; passes do not import models, the caller hands it in)."""

    name: str           # profile name, recorded in attrs["timing"]
    gpu: str            # preset name
    gpu_name: str       # product name, written to the manifest
    def launch_ns(self, op: str) -> int: ...

    def op_cost(self, op: str, shapes: str, dtypes: str, attrs: dict[str, str]) -> tuple[int, str]: ...

    def memcpy_ns(self, nbytes: int, memset: bool = False) -> int: ...

    def kernel_scale(self, source_gpu: str, kernel_name: str, compute_bound: bool) -> float | None: ...

    def op_bounds(self, op: str, shapes: str, dtypes: str, attrs: dict[str, str]) -> dict[str, float]: ...

    def memcpy_bounds(self, nbytes: int, memset: bool = False) -> dict[str, float]: ...
_COMPUTE_BOUND = frozenset({pb.KC_GEMM, pb.KC_ATTENTION, pb.KC_CONV})
_DEVICE_STREAMS = frozenset({pb.STREAM_GPU_COMPUTE, pb.STREAM_GPU_COMM, pb.STREAM_GPU_COPY})


@dataclass
class RetimeReport:
    gpu: str
    profile: str
    source_gpu: str = ""
    nodes: int = 0
    by_status: Counter = field(default_factory=Counter)
    guessed_ops: Counter = field(default_factory=Counter)
    compute_ns_before: int = 0      # over distinct graphs
    compute_ns_after: int = 0
    # compute_ns_after by what sets it: the model's bounds (``ceiling``, ``compute``,
    # ``memory``, ``overhead``) and NOT_MODELLED (kernels kept or scaled from the trace)
    by_bound: dict[str, float] = field(default_factory=dict)
    graphs_without_compute: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "profile": self.profile, "source_gpu": self.source_gpu, "nodes": self.nodes,
                "by_status": dict(sorted(self.by_status.items())),
                "guessed_ops": dict(self.guessed_ops.most_common(10)),
                "compute_ns_before": self.compute_ns_before, "compute_ns_after": self.compute_ns_after,
                "compute_ns_by_bound": {k: round(v) for k, v in sorted(self.by_bound.items())},
                "graphs_without_compute": self.graphs_without_compute}

    def bound_shares(self) -> dict[str, float]:
        """Each bound's share of the retimed compute time (0-1; empty when there is none)."""
        total = sum(self.by_bound.values())
        return {k: v / total for k, v in self.by_bound.items()} if total > 0 else {}


def retime_compute(job: Job, model: ComputeTimer) -> tuple[Job, RetimeReport]:
    """A copy of ``job`` with every compute node timed by ``model`` (see the module doc)."""
    src = job.manifest.hardware.gpu_name
    report = RetimeReport(gpu=model.gpu, profile=model.name, source_gpu=src)
    out = job.copy()
    for gid in out.graph_ids():
        g = out.graph(gid)
        if g.has_repeats and any(n.start_ns for n in g.stored_nodes):
            g.expand()     # a timed layout is warped as a whole
        # Untimed repeat blocks stay blocks: a copy has its body node's operator and shapes,
        # so timing the stored nodes times every copy (each counted once per copy).
        times = copies_of(g)
        nodes = g.stored_nodes
        new = _durations(g, nodes, times, model, src, report)
        if not new:
            report.graphs_without_compute.append(gid)
            continue
        if any(n.start_ns for n in nodes):
            _warp(g, new)
        else:
            for n in nodes:   # untimed: the host issues each operator in the model's launch time
                if n.kind == pb.KIND_LAUNCH and n.id not in new:
                    new[n.id] = _scaled(n, model.launch_ns(n.cpu.op))
                    report.by_status[LAUNCH] += times.get(n.id, 1)
                if n.id in new:
                    n.duration_ns = new[n.id]
        timing = f"model:{model.name}"
        for n in nodes:
            if n.id in new:
                n.attrs["timing"] = timing
    if report.nodes == 0:
        raise EchoError(f"{job.source or 'job'}: no GPU compute nodes to retime (a CPU-only trace?); "
                        "trace on a GPU or on the meta device")
    hw = out.manifest.hardware
    hw.gpu_name = model.gpu_name
    out.manifest.attrs["compute.gpu"] = model.gpu
    out.manifest.attrs["compute.profile"] = model.name
    return out, report


_OPERATOR = re.compile(r"^\w+::\w[\w.]*$")   # aten::mm, aten::add.Tensor, flash_attn::_flash_attn_forward


def _is_operator(name: str) -> bool:
    """An operator name (namespace::op), not a kernel's (which has spaces, templates...)."""
    return bool(_OPERATOR.match(name))


def copies_of(g: Graph) -> dict[int, int]:
    """How many times each stored node of a repeat block's body runs (1 + its copies)."""
    return {n.id: 1 + len(b.block.instances) for b in g.bodies() for n in b.nodes}


def _durations(g: Graph, nodes, times: dict[int, int], model: ComputeTimer, src: str,
               report: RetimeReport) -> dict[int, int]:
    device = {s.id for s in g.header.streams if s.kind in _DEVICE_STREAMS}
    by_id = {n.id: n for n in nodes}
    targets = [n for n in nodes if n.stream in device and _retimable(n)]
    if not targets:
        return {}
    new: dict[int, int] = {}
    bounds: dict[int, dict[str, float]] = {}    # node -> the model's split of its time
    pending: dict[int, list[pb.Node]] = defaultdict(list)   # launching operator -> its kernels
    for n in targets:
        t = times.get(n.id, 1)
        report.nodes += t
        report.compute_ns_before += n.duration_ns * t
        if n.kind in (pb.KIND_MEMCPY, pb.KIND_MEMSET):
            memset = n.kind == pb.KIND_MEMSET
            new[n.id] = model.memcpy_ns(n.memcpy.bytes, memset=memset)
            bounds[n.id] = model.memcpy_bounds(n.memcpy.bytes, memset=memset)
            report.by_status[PRICED] += t
            continue
        c = n.compute
        op = c.op or n.name
        if _is_operator(op) or c.shapes:
            ns, status = model.op_cost(op, c.shapes, c.dtypes, dict(n.attrs))
            report.by_status[status] += t
            if status == GUESSED:
                report.guessed_ops[op] += t
            new[n.id] = _scaled(n, ns)
            bounds[n.id] = model.op_bounds(op, c.shapes, c.dtypes, dict(n.attrs))
            continue
        parent = _launching_op(n, by_id)
        if parent is not None:
            pending[parent.id].append(n)
        else:
            new[n.id] = _fallback(n, model, src, report)
    for pid, kernels in pending.items():
        p = by_id[pid]
        op, attrs = p.cpu.op or p.name, dict(p.attrs)
        ns, status = model.op_cost(op, p.cpu.shapes, p.cpu.dtypes, attrs)
        if status != PRICED:
            for k in kernels:
                new[k.id] = _fallback(k, model, src, report)
            continue
        measured = sum(k.duration_ns for k in kernels)
        for k in kernels:
            share = k.duration_ns / measured if measured > 0 else 1.0 / len(kernels)
            new[k.id] = max(1, round(ns * share))
            bounds[k.id] = model.op_bounds(op, p.cpu.shapes, p.cpu.dtypes, attrs)
            report.by_status[FROM_OP] += times.get(k.id, 1)
    for n in targets:
        ns = new.get(n.id, n.duration_ns) * times.get(n.id, 1)
        report.compute_ns_after += ns
        _add_bounds(report.by_bound, ns, bounds.get(n.id))
    return new


def _add_bounds(by_bound: dict[str, float], ns: int, split: dict[str, float] | None) -> None:
    """``ns`` shared among the bounds in the proportions of the model's ``split`` of the
    node's price (all of it NOT_MODELLED without one)."""
    total = sum(split.values()) if split else 0.0
    if not split or total <= 0:
        if ns:
            by_bound[NOT_MODELLED] = by_bound.get(NOT_MODELLED, 0.0) + ns
        return
    for side, part in split.items():
        by_bound[side] = by_bound.get(side, 0.0) + ns * part / total


def _scaled(n: pb.Node, ns: int) -> int:
    """``ns`` for the work ``n`` stands for (its ``work_scale``, when a pass gave it one)."""
    text = n.attrs.get(WORK_SCALE_ATTR)
    if text is None:
        return ns
    try:
        factor = float(text)
    except ValueError:
        return ns
    return max(0, round(ns * factor)) if factor >= 0 and factor == factor else ns


def _retimable(n: pb.Node) -> bool:
    if n.kind == pb.KIND_COMPUTE:
        return True
    if n.kind == pb.KIND_MEMSET:
        return True
    return n.kind == pb.KIND_MEMCPY and n.memcpy.direction == "DtoD"


def _launching_op(n: pb.Node, by_id: dict[int, pb.Node]) -> pb.Node | None:
    """The innermost CPU operator with shapes above the launch that issued kernel ``n``."""
    launch = next((by_id.get(d.id) for d in n.deps if d.kind == pb.DEP_LAUNCH), None)
    cur = launch
    seen: set[int] = set()
    while cur is not None and cur.id not in seen:
        seen.add(cur.id)
        if cur.kind == pb.KIND_CPU_OP and cur.HasField("cpu") and cur.cpu.shapes and _is_operator(cur.cpu.op):
            return cur
        cur = next((by_id.get(d.id) for d in cur.deps if d.kind == pb.DEP_CONTROL), None)
    return None


def _fallback(n: pb.Node, model: ComputeTimer, src: str, report: RetimeReport) -> int:
    factor = model.kernel_scale(src, n.compute.op or n.name, n.compute.kernel_class in _COMPUTE_BOUND)
    if factor is None:
        report.by_status[KEPT] += 1
        return n.duration_ns
    report.by_status[SCALED] += 1
    return max(1, round(n.duration_ns * factor))


def _warp(g: Graph, new: dict[int, int]) -> None:
    """Re-lay out a timed graph: each timestamp t moves by the sum of (new - old) durations
    of the retimed nodes that ended at or before t."""
    changes = sorted((n.start_ns + n.duration_ns, new[n.id] - n.duration_ns) for n in g.nodes
                     if n.id in new and new[n.id] != n.duration_ns)
    if not changes:
        return
    ends = [e for e, _ in changes]
    cum = [0]
    for _, d in changes:
        cum.append(cum[-1] + d)

    def warp(t: int) -> int:
        return t + cum[bisect.bisect_right(ends, t)]

    for n in g.nodes:
        start = max(0, warp(n.start_ns))
        if n.id in new:
            dur = new[n.id]
        else:
            dur = max(0, warp(n.start_ns + n.duration_ns) - start)
        n.start_ns = start
        n.duration_ns = dur
