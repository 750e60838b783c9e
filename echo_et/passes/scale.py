"""scale: change a Job's data-parallel degree (and, through ``pipeline``, its pipeline depth).

Data parallelism (exact where the replicas are symmetric, which DP replicas are):

- new rank r with mesh coordinates (t, d, p) runs the program of old rank (t, d mod D, p),
  where D is the old dp degree; its graph is that rank's graph, shared, so a 100,000-rank Job
  holds as many graphs as the 8-rank one;
- every process group is re-derived in the new mesh (see :mod:`echo_et.passes.regroup`):
  groups that span dp grow to the new dp degree, the others are copied into each replica;
- collective sizes on groups that grow: all-reduce, broadcast, reduce and barrier keep their
  per-rank bytes (the gradient buffer does not depend on dp); with ZeRO (stage >= 1) a
  reduce-scatter keeps its full input and its output shrinks to ceil(full / N) (the buffer
  padded to a multiple of N, as ZeRO does), and an all-gather's input becomes that shard;
  without ZeRO both keep their per-rank input. All-to-all follows ``a2a``:
  ``keep-rank`` (default) keeps each rank's input and output (a fixed model sharded over more
  ranks with a fixed per-rank batch, as DLRM's embedding all-to-all), ``keep-peer`` keeps the
  bytes sent to each peer, so per-rank bytes grow with the group;
- with ZeRO the optimizer updates a 1/N shard: durations of optimizer-phase math nodes (GPU
  kernels; in a CPU-only graph the innermost host ops) are scaled by D/N (an assumption:
  time proportional to shard size), and later nodes move earlier by the time saved (see
  :mod:`echo_et.passes.retime`);
- measured step times do not carry over (the scaled job was never measured): 0.

What is assumed, not derived: that replica d >= D behaves like replica d mod D (same
kernels, same durations, same host timing), and that the network does not change per-rank
compute. P2P on a group that spans dp is refused (its peer indices would change).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Graph, Job
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.schema import COMM_KINDS, ROLE_BY_NAME, pb
from echo_et.passes.derive import check_gpus_per_node, derived_job_builder
from echo_et.passes.gradients import ACCUMULATE_GRAD, OPTIMIZER_PREFIX, op_name
from echo_et.passes.layout import LayoutDecision, infer_layout
from echo_et.passes.mesh import Mesh
from echo_et.passes.regroup import GroupShape, derived_ranks, group_shape
from echo_et.passes.retime import rescale_durations

A2A_POLICIES = ("keep-rank", "keep-peer")
_MATH_KINDS = (pb.KIND_COMPUTE,)


@dataclass
class ScaleReport:
    """What a pass did, for ``--json`` and docs."""

    input_layout: dict[str, Any]
    output_layout: dict[str, Any] = field(default_factory=dict)
    world_size: int = 0
    graphs: int = 0
    groups: int = 0
    resized_collectives: int = 0
    rescaled_optimizer_nodes: int = 0
    a2a: str = "keep-rank"
    template_rule: str = ""
    pipeline: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "input_layout": self.input_layout,
            "output_layout": self.output_layout,
            "world_size": self.world_size,
            "graphs": self.graphs,
            "groups": self.groups,
            "resized_collectives": self.resized_collectives,
            "rescaled_optimizer_nodes": self.rescaled_optimizer_nodes,
            "a2a": self.a2a,
            "template_rule": self.template_rule,
            "pipeline": self.pipeline,
            "notes": list(self.notes),
        }


def scale(
    job: Job,
    *,
    dp: int | None = None,
    pp: int | None = None,
    tp: int | None = None,
    microbatches: int | None = None,
    zero: int | None = None,
    gpus_per_node: int | None = None,
    layout: str | dict[str, Any] | LayoutDecision | None = None,
    a2a: str = "keep-rank",
) -> tuple[Job, ScaleReport]:
    """A new Job at the requested layout; ``job`` is not modified."""
    decision = layout if isinstance(layout, LayoutDecision) else infer_layout(job, layout)
    report = ScaleReport(input_layout=decision.to_json(), a2a=a2a)
    if a2a not in A2A_POLICIES:
        raise OptionError("a2a", f"unknown all-to-all policy {a2a!r}: expected one of {', '.join(A2A_POLICIES)}")
    if tp is not None and tp != decision.tp:
        raise EchoError(f"changing tensor parallelism ({decision.tp} -> {tp}) changes kernel shapes, "
                        f"which a trace cannot tell: re-trace at tp={tp} with `echo-et trace`")
    new_dp = decision.dp if dp is None else dp
    if new_dp < 1:
        raise OptionError("dp", f"dp must be >= 1, got {new_dp}")
    if zero is not None and zero not in (0, 1):
        raise OptionError("zero", f"only ZeRO stages 0 and 1 are supported, got {zero}")
    if zero is not None and zero != decision.zero:
        if decision.zero and not zero:
            raise OptionError("zero", "the job shards gradients (ZeRO-1); turning that into all-reduce is "
                                      "not supported: re-trace it with ZeRO stage 0")
        if zero and not decision.zero:
            raise OptionError("zero", "the job all-reduces gradients (ZeRO-0); turn it into ZeRO-1 by "
                                      "injecting data parallelism into a single-rank trace, or re-trace "
                                      "it with ZeRO stage 1")

    world = new_dp * decision.tp * (pp or decision.pp)
    recorded = job.manifest.hardware.gpus_per_node
    check_gpus_per_node(world, gpus_per_node, recorded)
    if decision.dp == 1 and new_dp > 1:
        _refuse_unsynchronised_replicas(job, decision, new_dp)
    current = job
    if (pp is not None and pp != decision.pp) or (
            microbatches is not None and microbatches != (decision.microbatches or None)):
        from echo_et.passes.pipeline import restage

        current, decision, report.pipeline = restage(job, decision, pp=pp or decision.pp,
                                                     microbatches=microbatches)
    # the nodes the job records, which a re-staged pipeline of another size may have dropped on
    # the way (derived_job_builder), carried to the output whose world fills them (checked above)
    out = scale_dp(current, decision, new_dp, a2a=a2a,
                   gpus_per_node=gpus_per_node if gpus_per_node is not None else recorded or None, report=report)
    return out, report


def _refuse_unsynchronised_replicas(job: Job, decision: LayoutDecision, new_dp: int) -> None:
    """A training Job with one data-parallel replica reduces no gradients over data
    parallelism (a collective over one rank is skipped), so there is nothing to grow: its
    copies would train apart. Refused, rather than predicting a step with no gradient
    reduction in it."""
    dp_groups = {gid for gid, role in decision.roles.items() if role == "dp"}
    dp_keys: dict[str, set[str]] = {}
    for b in job.manifest.bindings:
        dp_keys.setdefault(b.graph, set()).update(k for k, gid in b.groups.items() if gid in dp_groups)
    trains = False
    for gid, keys in sorted(dp_keys.items()):
        for n in job.graph(gid).nodes:
            if n.kind == pb.KIND_COLLECTIVE and n.collective.group in keys and n.annotations.phase != "forward":
                return    # a gradient reduction (one in a forward averages a loss: Megatron's)
            name = op_name(n)
            trains = trains or n.annotations.phase == "optimizer" or name == ACCUMULATE_GRAD \
                or name.startswith(OPTIMIZER_PREFIX)
    if trains:
        raise EchoError(f"{job.source or 'job'}: traced with one data-parallel replica, so it reduces no "
                        f"gradients over data parallelism: {new_dp} replicas of it would train apart. "
                        "Add data parallelism with `echo-et inject` (DDP's gradient buckets; inject "
                        "one replica to scale or sweep it from there), or trace it with two or "
                        "more replicas")


def scale_dp(job: Job, decision: LayoutDecision, new_dp: int, *, a2a: str = "keep-rank",
             gpus_per_node: int | None = None, report: ScaleReport | None = None) -> Job:
    """Only the data-parallel degree changes (see the module docstring)."""
    old: Mesh = decision.mesh
    new = old.with_sizes(dp=new_dp)
    report = report or ScaleReport(input_layout=decision.to_json(), a2a=a2a)
    if job.world_size != old.world:
        raise EchoError(f"{job.source or 'job'}: {job.world_size} ranks, but layout "
                        f"{old.describe()} has {old.world}")
    check_gpus_per_node(new.world, gpus_per_node, job.manifest.hardware.gpus_per_node)
    shapes: dict[int, GroupShape] = {}
    for g in job.manifest.groups:
        shapes[g.id] = group_shape(old, g, decision.roles.get(g.id, ""))

    # Which template rank each new rank runs, and which group each of its keys derives from.
    new_members: dict[tuple[int, int], list[int]] = {}   # (old gid, dp index or -1) -> ranks
    order: list[tuple[int, int]] = []
    bindings: list[tuple[int, str, dict[str, tuple[int, int]], int]] = []
    spans_of_key: dict[tuple[str, str], bool] = {}
    for r in range(new.world):
        c = new.coords(r)
        t_rank = old.rank({**c, "dp": c["dp"] % old.dp})
        b = job.binding(t_rank)
        keys: dict[str, tuple[int, int]] = {}
        for key, gid in sorted(b.groups.items()):
            shape = shapes.get(gid)
            if shape is None:
                raise EchoError(f"{job.source or 'job'}: rank {t_rank} binds {key!r} to undefined group {gid}")
            prev = spans_of_key.setdefault((b.graph, key), shape.spans_dp)
            if prev != shape.spans_dp:
                raise EchoError(f"graph {b.graph}: group key {key!r} spans data parallelism on some "
                                "ranks and not on others; cannot scale")
            ident = (gid, -1 if shape.spans_dp else c["dp"])
            if ident not in new_members:
                new_members[ident] = derived_ranks(shape, new, c["dp"])
                order.append(ident)
            keys[key] = ident
        bindings.append((r, b.graph, keys, b.clock_offset_ns))

    # Graphs: copies of the templates, with group sizes (and ZeRO/all-to-all bytes) rewritten.
    used = sorted({g for _, g, _, _ in bindings})
    graphs: dict[str, Graph] = {}
    for gid in used:
        graphs[gid] = _rescale_graph(job.graph(gid), {k: s for (g, k), s in spans_of_key.items() if g == gid},
                                     old.dp, new_dp, decision.zero, a2a, report)

    jb = derived_job_builder(job, new.world, gpus_per_node)
    m = jb.job.manifest
    per_old: dict[int, int] = {}
    for gid, _ in order:
        per_old[gid] = per_old.get(gid, 0) + 1
    seen: dict[int, int] = {}
    new_ids: dict[tuple[int, int], int] = {}
    for ident in order:
        oldg = job.group(ident[0])
        k = seen.get(ident[0], 0)
        seen[ident[0]] = k + 1
        name = oldg.name if per_old[ident[0]] == 1 else f"{oldg.name}/{k}"
        role = oldg.role or ROLE_BY_NAME.get(decision.roles.get(oldg.id, ""), 0)
        if role == pb.ROLE_WORLD and ident[1] >= 0:
            # the world of a one-replica Job, copied into each replica: the layout's reading
            role = ROLE_BY_NAME.get(decision.roles.get(oldg.id, ""), pb.ROLE_UNKNOWN)
            role = pb.ROLE_UNKNOWN if role == pb.ROLE_WORLD else role
        new_ids[ident] = jb.group(new_members[ident], name=name, desc=oldg.desc, role=role)
    for g in graphs.values():
        jb.add_graph(g)
    for r, gid, keys, offset in bindings:
        jb.bind(r, gid, {k: new_ids[i] for k, i in keys.items()}, clock_offset_ns=offset)
    out = jb.build()

    ep = decision.ep
    if ep and ep % old.dp == 0 and ep >= old.dp:
        ep = ep // old.dp * new_dp  # expert groups that span dp grow with it
    m.layout.CopyFrom(pb.Layout(dp=new_dp, tp=old.tp, pp=old.pp, ep=ep,
                                microbatches=decision.microbatches, zero_stage=decision.zero,
                                source=f"scaled({decision.source})"))
    m.attrs["scale.rank_order"] = "-".join(new.order)
    m.attrs["scale.from"] = f"dp={old.dp},tp={old.tp},pp={old.pp}"
    m.attrs["scale.a2a"] = a2a
    report.template_rule = (f"new rank (tp,dp,pp) runs the graph of old rank (tp, dp mod {old.dp}, pp)"
                            f" in rank order {'-'.join(new.order)}")
    report.output_layout = {"dp": new_dp, "tp": old.tp, "pp": old.pp, "ep": ep,
                            "microbatches": decision.microbatches, "zero": decision.zero,
                            "order": "-".join(new.order), "source": m.layout.source}
    report.world_size = new.world
    report.graphs = len(graphs)
    report.groups = len(m.groups)
    return out


def _refuse_dp_p2p(graph_id: int, n, growing) -> None:
    """A send/recv on a group that spans data parallelism: its peers cannot be re-derived."""
    if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group in growing:
        raise EchoError(f"graph {graph_id} node {n.id} ({n.name}): send/recv on group {n.p2p.group!r}, "
                        "which spans data parallelism; its peers cannot be re-derived")


def _rescale_graph(graph: Graph, spans: dict[str, bool], old_dp: int, new_dp: int, zero: int,
                   a2a: str, report: ScaleReport) -> Graph:
    g = graph.copy()
    growing = {k for k, s in spans.items() if s}
    if old_dp == new_dp or not growing:
        return g
    for k in growing:
        if k in g.header.group_sizes:
            size = g.header.group_sizes[k]
            if size % old_dp:
                raise EchoError(f"graph {g.id}: group {k!r} of size {size} does not divide into "
                                f"{old_dp} replicas")
            g.header.group_sizes[k] = size // old_dp * new_dp
    if g.has_repeats and not zero:
        # Only collectives change, and a repeat block's copy has its body node's collective
        # (bytes, group, type; its seq is shifted, not resized): the stored nodes are resized
        # and the blocks kept. ZeRO also rescales optimizer time and moves later nodes, which
        # is worked out on the expanded graph below.
        copies = {n.id: len(b.block.instances) for b in g.bodies() for n in b.nodes}
        for n in g.stored_nodes:
            _refuse_dp_p2p(g.id, n, growing)
            if n.kind == pb.KIND_COLLECTIVE and n.collective.group in growing:
                if _resize(n.collective, old_dp, new_dp, zero, a2a):
                    report.resized_collectives += 1 + copies.get(n.id, 0)
        return g
    has_kernels = any(n.kind == pb.KIND_COMPUTE for n in g.nodes)
    parents = {d.id for n in g.nodes for d in n.deps if d.kind == pb.DEP_CONTROL}
    # Host ops that issue communication are call overhead, not optimizer math.
    parents |= {d.id for n in g.nodes if n.kind in COMM_KINDS for d in n.deps}
    factors: dict[int, float] = {}
    for n in g.nodes:
        _refuse_dp_p2p(g.id, n, growing)
        if n.kind == pb.KIND_COLLECTIVE and n.collective.group in growing:
            if _resize(n.collective, old_dp, new_dp, zero, a2a):
                report.resized_collectives += 1
        elif zero and n.annotations.phase == "optimizer" and (
                n.kind in _MATH_KINDS
                or (not has_kernels and n.kind == pb.KIND_CPU_OP and n.id not in parents)):
            factors[n.id] = old_dp / new_dp
    rescale_durations(g, factors)
    report.rescaled_optimizer_nodes += len(factors)
    return g


def _resize(c: pb.CollectiveInfo, old_dp: int, new_dp: int, zero: int, a2a: str) -> bool:
    """Rewrite one collective's per-rank bytes for a group that grows from old_dp to new_dp
    replicas; True when something changed. ZeRO shards are whole elements: the flat buffer
    is padded to a multiple of new_dp elements (exact when old_dp divides new_dp)."""
    before = (c.in_bytes, c.out_bytes)
    elem = dtype_size(c.dtype) or 1
    if c.type == pb.COLL_REDUCE_SCATTER and zero:
        full = c.in_bytes // elem
        shard = math.ceil(full / new_dp)
        c.in_bytes, c.out_bytes = shard * new_dp * elem, shard * elem
    elif c.type == pb.COLL_ALL_GATHER and zero:
        full = (c.out_bytes or c.in_bytes * old_dp) // elem
        shard = math.ceil(full / new_dp)
        c.in_bytes, c.out_bytes = shard * elem, shard * new_dp * elem
    elif c.type == pb.COLL_ALL_TO_ALL and a2a == "keep-peer":
        c.in_bytes = c.in_bytes * new_dp // old_dp
        c.out_bytes = c.out_bytes * new_dp // old_dp
    return (c.in_bytes, c.out_bytes) != before
