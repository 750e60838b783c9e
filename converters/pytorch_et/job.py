"""Turning host traces (one per rank) into a Job: CPU op graphs plus the collectives they issue."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from echo_et.converters.pytorch_et import comms
from echo_et.converters.pytorch_et.comms import CommCall
from echo_et.converters.pytorch_et.schema import PG_INIT_NAME, PROCESS_ROOT_PREFIX, causal_of
from echo_et.converters.pytorch_et.trace import MALFORMED, HostTrace
from echo_et.errors import EchoError, OptionError
from echo_et.ir import Graph, GraphBuilder, Job, JobBuilder, pb
from echo_et.ir.attention import CAUSAL_ATTR
from echo_et.ir.schema import collective_name

DEFAULT_GROUP = "0"


@dataclass
class RankTrace:
    rank: int
    trace: HostTrace
    rank_source: str            # "file name", "given rank", "collectives", "order"


@dataclass
class GroupPlan:
    """Graph-local group keys of every call, and the groups they stand for."""

    key_of: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, op id) -> key
    guessed: int = 0
    members: dict[str, list[int]] = field(default_factory=dict)       # key -> global ranks
    desc: dict[str, str] = field(default_factory=dict)


def assign_ranks(traces: list[HostTrace], option_rank: int | None) -> list[RankTrace]:
    """Rank of each trace: from its file name, else the given rank (single file), else from its own
    collectives, else its position. Two traces claiming one rank is an error."""
    out: list[RankTrace] = []
    for i, t in enumerate(traces):
        r, src = t.name_rank, "file name"
        if r is None and option_rank is not None and len(traces) == 1:
            r, src = option_rank, "given rank"
        if r is None:
            r, src = t.comm_rank(), "collectives"
        if r is None:
            r, src = i, "order"
        out.append(RankTrace(r, t, src))
    seen: dict[int, Path] = {}
    for rt in out:
        if rt.rank in seen:
            raise EchoError(f"{rt.trace.path}: rank {rt.rank} is also claimed by "
                            f"{seen[rt.rank].name} (files of two jobs, or ranks not in the file "
                            "names: use one file per rank)")
        seen[rt.rank] = rt.trace.path
    return sorted(out, key=lambda rt: rt.rank)


def plan_groups(ranks: list[RankTrace], world_hint: int | None) -> tuple[GroupPlan, int]:
    """Group key per call and the world size all ranks agree on."""
    plan = GroupPlan()
    world: dict[int, Path] = {}
    if world_hint:
        world[world_hint] = Path("the given world size")
    defs: dict[str, comms.PgDef] = {}
    for rt in ranks:
        for p in rt.trace.pg_defs:
            defs.setdefault(p.name, p)
            if p.name == DEFAULT_GROUP and not p.ranks and p.size:
                world.setdefault(p.size, rt.trace.path)
    for rt in ranks:
        refs: list[int | None] = []
        for c in rt.trace.comms.values():
            if c.pg_name is None and c.pg_ref not in refs:
                refs.append(c.pg_ref)
        for oid, c in rt.trace.comms.items():
            if c.pg_name is not None:
                key = c.pg_name
            else:
                # Old traces name no group: one unnamed group is the default one.
                k = refs.index(c.pg_ref)
                key = DEFAULT_GROUP if k == 0 else f"pg{k}"
                plan.guessed += 1
            plan.key_of[(rt.rank, oid)] = key
            if key in defs:
                plan.members.setdefault(key, defs[key].members())
                plan.desc.setdefault(key, defs[key].desc)
            elif c.pg_ranks:
                plan.members.setdefault(key, list(c.pg_ranks))
                plan.desc.setdefault(key, c.pg_desc)
            if key == DEFAULT_GROUP and c.pg_size and not c.pg_ranks:
                world.setdefault(c.pg_size, rt.trace.path)
    if len(world) > 1:
        (a, pa), (b, pb_) = sorted(world.items())[:2]
        raise EchoError(f"ranks disagree on world size: {pa.name} says {a}, {pb_.name} says {b}")
    top_rank = max(rt.rank for rt in ranks)
    world_size = next(iter(world)) if world else top_rank + 1
    if top_rank >= world_size:
        bad = ranks[-1]
        raise EchoError(f"{bad.trace.path}: rank {bad.rank} is outside the world size {world_size}")
    for key, members in plan.members.items():
        bad = [r for r in members if r >= world_size]
        if bad:
            raise EchoError(f"{ranks[0].trace.path}: process group {key!r} lists rank {bad[0]}, "
                            f"outside the world size {world_size}")
    for key in set(plan.key_of.values()):
        if key not in plan.members:
            plan.members[key] = list(range(world_size))   # an unnamed group: assume the world
        plan.desc.setdefault(key, "default_pg" if key == DEFAULT_GROUP else "")
    for key, p in defs.items():
        plan.members.setdefault(key, p.members())
        plan.desc.setdefault(key, p.desc)
    return plan, world_size


@dataclass
class GraphStats:
    untimed: int = 0
    outside_step: int = 0
    p2p_without_peer: int = 0
    parent_after_child: int = 0
    cross_thread_deps: int = 0


def build_graph(rt: RankTrace, graph_id: str, plan: GroupPlan, window: tuple[int, int] | None,
                stats: GraphStats) -> Graph:
    """The rank's program: every host op (nested by DEP_CONTROL) and, beside the op that issued
    it, each collective/P2P call on a communication stream (DEP_LAUNCH on that op)."""
    t = rt.trace
    gb = GraphBuilder(graph_id, name=f"rank {rt.rank}")
    gb.graph.header.attrs["source"] = "pytorch_et"
    gb.graph.header.attrs["schema"] = t.schema
    node_of: dict[int, int] = {}        # ET id -> IR id of the emitted node
    thread_of: dict[int, int] = {}      # IR id -> ET thread
    writer: dict[tuple[int, int], int] = {}  # (tensor id, storage id) -> IR id of last writer
    group_sizes: dict[str, int] = {}
    stream_of_tid: dict[int, int] = {}
    control, data = pb.DEP_CONTROL, pb.DEP_DATA
    # Names of the ops that are not nodes (root pseudo nodes, group init), decided per name.
    skipped = {name for name in {op.name for op in t.ops}
               if name.startswith(PROCESS_ROOT_PREFIX) or name == PG_INIT_NAME}
    untimed = 0
    for op in t.ops:
        if op.name in skipped:
            continue
        oid, parent, tid = op.id, op.parent, op.tid
        if window is not None and not window[0] <= oid <= window[1]:
            stats.outside_step += 1
            continue
        deps: list[tuple[int, int]] = []
        if parent != oid and parent in node_of:
            deps.append((node_of[parent], control))
        elif parent > oid:
            stats.parent_after_child += 1
        ins = op.in_tensors
        for tz in ins:
            w = writer.get((tz[0], tz[1]))
            if w is not None and thread_of[w] != tid and (w, data) not in deps:
                deps.append((w, data))
                stats.cross_thread_deps += 1
        sid = stream_of_tid.get(tid)
        if sid is None:
            sid = stream_of_tid[tid] = gb.stream(pb.STREAM_CPU_THREAD, f"thread {tid}", native_id=tid)
        n = gb.cpu_op(op.name, sid, start_ns=op.start_ns, duration_ns=op.duration_ns, deps=deps,
                      rf_id=op.rf_id or 0, shapes=op.in_shapes, dtypes=op.in_types)
        if not op.timed:
            untimed += 1
        attrs = n.attrs
        attrs["et_id"] = str(oid)
        if op.in_values and (causal := causal_of(op)):
            attrs[CAUSAL_ATTR] = causal
        if ins:
            attrs["et_in_tensors"] = ",".join([str(x[0]) for x in ins])
        outs = op.out_tensors
        if outs:
            attrs["et_out_tensors"] = ",".join([str(x[0]) for x in outs])
        nid = n.id
        node_of[oid] = nid
        thread_of[nid] = tid
        for tz in outs:
            writer[(tz[0], tz[1])] = nid
        call = t.comms.get(oid)
        if call is not None:
            key = plan.key_of[(rt.rank, oid)]
            size = len(plan.members[key])
            if _emit_comm(gb, call, key, size, n, stats):
                group_sizes[key] = size
    stats.untimed += untimed
    for key, size in sorted(group_sizes.items()):
        gb.declare_group(key, size)
    return gb.build()


def _emit_comm(gb: GraphBuilder, call: CommCall, key: str, size: int, launcher: pb.Node,
               stats: GraphStats) -> bool:
    device = call.device
    name = f"comm {key}" if device < 0 else f"comm {key} dev {device}"
    sid = gb.stream(pb.STREAM_GPU_COMM, name, device=device)
    deps = [(launcher.id, pb.DEP_LAUNCH)]
    start = launcher.start_ns
    if call.is_p2p:
        if call.peer is None or call.peer >= size:
            stats.p2p_without_peer += 1
            return False
        n = gb.p2p(call.kind == comms.SEND, str(call.kind), sid, group=key, peer=call.peer,
                   nbytes=call.in_bytes, tag=call.tag, deps=deps, start_ns=start)
    else:
        assert isinstance(call.kind, int)
        n = gb.collective(collective_name(call.kind), sid, coll_type=call.kind, group=key,
                          in_bytes=call.in_bytes, out_bytes=call.out_bytes, dtype=call.dtype,
                          root=call.root if call.root is not None and call.root < size else None,
                          deps=deps, start_ns=start)
    for k, v in sorted(call.attrs.items()):
        n.attrs[k] = v
    n.attrs["et_id"] = str(call.op_id)
    return True


def build_job(ranks: list[RankTrace], *, world_hint: int | None, step: int | None,
              name: str) -> Job:
    plan, world_size = plan_groups(ranks, world_hint)
    chosen = choose_step(ranks, step)
    jb = JobBuilder(name, world_size, source_format="pytorch_et")
    m = jb.job.manifest
    m.step = chosen if chosen is not None else -1
    m.provenance.inputs.extend(rt.trace.path.name for rt in ranks)
    schemas = sorted({rt.trace.schema for rt in ranks})
    m.attrs["host_et_schema"] = ",".join(schemas)
    group_ids: dict[str, int] = {}
    for key in sorted(plan.members):
        group_ids[key] = jb.group(plan.members[key], name=key, desc=plan.desc.get(key, ""),
                                  role="world" if len(plan.members[key]) == world_size else 0)
    stats = GraphStats()
    by_hash: dict[str, str] = {}
    graph_of: dict[int, str] = {}
    for rt in ranks:
        window = rt.trace.steps.get(chosen) if chosen is not None else None
        try:
            g = build_graph(rt, f"rank{rt.rank}", plan, window, stats)
        except MALFORMED as e:
            raise EchoError(f"{rt.trace.path}: malformed host execution trace "
                            f"({type(e).__name__}: {str(e)[:120]})") from None
        # Identical programs share one graph; a single rank has nothing to share with.
        h = g.content_hash() if len(ranks) > 1 else ""
        gid = by_hash.get(h)
        if gid is None:
            gid = by_hash[h] = g.id
            jb.add_graph(g)
        graph_of[rt.rank] = gid
    keys_of_graph: dict[str, set[str]] = {}
    for gid in by_hash.values():
        keys_of_graph[gid] = set(jb.job.graph(gid).header.group_sizes)
    for rt in ranks:
        gid = graph_of[rt.rank]
        jb.bind(rt.rank, gid, {k: group_ids[k] for k in sorted(keys_of_graph[gid])})
    traced = {rt.rank for rt in ranks}
    missing = [r for r in range(world_size) if r not in traced]
    if missing:
        ref = ranks[0]
        gid = graph_of[ref.rank]
        partial = [k for k in keys_of_graph[gid] if len(plan.members[k]) != world_size]
        if any(n.kind in (pb.KIND_SEND, pb.KIND_RECV) for n in jb.job.graph(gid).nodes):
            partial.append("point-to-point")
        partial = [p if p == "point-to-point" else f"sub-group {p!r}" for p in partial]
        if partial:
            raise EchoError(f"{ref.trace.path}: the traces cover {len(traced)} of {world_size} "
                            f"ranks and use {', '.join(sorted(partial))} communication; give the "
                            "host trace of every rank")
        for r in missing:
            jb.bind(r, gid, {k: group_ids[k] for k in sorted(keys_of_graph[gid])})
        jb.drop("host_et_untraced_ranks_copied", len(missing))
    jb.drop("host_et_untimed_ops", stats.untimed)
    jb.drop("host_et_outside_step", stats.outside_step)
    jb.drop("host_et_group_guessed", plan.guessed)
    jb.drop("host_et_p2p_without_peer", stats.p2p_without_peer)
    jb.drop("host_et_parent_after_child", stats.parent_after_child)
    jb.drop("host_et_gpu_ops", sum(rt.trace.gpu_ops for rt in ranks))
    guessed_ranks = Counter(rt.rank_source for rt in ranks
                            if rt.rank_source in ("collectives", "order"))
    for src, count in sorted(guessed_ranks.items()):
        jb.drop(f"host_et_rank_from_{src}", count)
    m.attrs["host_et_cross_thread_deps"] = str(stats.cross_thread_deps)
    return jb.build()


def choose_step(ranks: list[RankTrace], step: int | None) -> int | None:
    """The ProfilerStep to keep: ``step`` if given, else the last one every rank has; None when
    the traces have no step markers (they are taken whole)."""
    with_steps = [rt for rt in ranks if rt.trace.steps]
    if not with_steps:
        if step is not None:
            raise OptionError("step", f"{ranks[0].trace.path}: step {step} asked for, but the host trace "
                                      "has no ProfilerStep markers")
        return None
    if step is not None:
        for rt in with_steps:
            if step not in rt.trace.steps:
                have = ", ".join(str(s) for s in sorted(rt.trace.steps))
                raise EchoError(f"{rt.trace.path}: no ProfilerStep#{step} (has {have})")
        return step
    common = set.intersection(*(set(rt.trace.steps) for rt in with_steps))
    if not common:
        raise EchoError(f"{with_steps[0].trace.path}: the ranks' host traces share no ProfilerStep")
    return max(common)
