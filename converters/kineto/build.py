"""One rank's Kineto events -> one echo-et Graph.

Nodes, in one order sorted by start time (so ids ascend in execution order on every
stream):
  host thread  KIND_CPU_OP  cpu_op / user_annotation / python_function events, with
                            DEP_CONTROL to the innermost op containing them
               KIND_LAUNCH  runtime/driver calls that issued GPU work (by ``correlation``)
               KIND_SYNC    stream/device/event synchronize calls, DEP_SYNC on the GPU ops
                            they waited for
  GPU stream   KIND_COMPUTE kernels, KIND_MEMCPY / KIND_MEMSET, DEP_LAUNCH to their launch
               KIND_COLLECTIVE / KIND_SEND / KIND_RECV  NCCL kernels (see comm.py)
               KIND_COMM_UNKNOWN  communication kernels of other libraries
  host-comm:K  collectives of host backends (gloo) of group key K, one stream per thread
               that ran them (``host-comm:K:<tid>`` when K used several), with
               DEP_LAUNCH (and DEP_CONTROL) to the op that issued them
Cross-stream event waits add DEP_SYNC between GPU ops (sync.py); a sync dependency the
measured times contradict (the waiter going on before what it waits for ended) is left out
and counted. Other runtime calls (cudaEventQuery, cudaGetDevice, ...) are not nodes; they
are counted.

Times are ns relative to the rank's earliest kept event (``origin_ns`` is that instant on
the file's wall clock), so the job assembler can place ranks on one clock with
``RankBinding.clock_offset_ns``.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from echo_et.ir import Graph, GraphBuilder

try:  # a fast canonical key for the shapes-text cache; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]
from echo_et.ir.limits import MAX_BYTES, checked_int
from echo_et.ir.schema import pb

from . import comm, comm_kernels, groups, sync
from .events import K_CPU, K_KERNEL, K_MEMCPY, K_MEMSET, K_RUNTIME, K_SYNC_ACT, Ev, TraceFile
from .groups import GroupUse, PgDef
from .kernel_class import kernel_class
from .nesting import assign_parents, host_order_key
from .steps import Window
from .units import CommUnit, find_units

# Node roles (internal).
_CPU, _LAUNCH, _SYNC, _GPU, _COMM, _HOSTCOMM = range(6)


@dataclass
class RankContext:
    graph_id: str
    rank: int                                  # original global rank
    world_size: int                            # original world size (0 if unknown)
    window: Window | None
    pgs: dict[str, PgDef]
    backend: str


@dataclass
class RankGraph:
    graph: Graph
    groups: dict[str, GroupUse] = field(default_factory=dict)
    dropped: Counter = field(default_factory=Counter)
    measured_step_ns: int = 0
    origin_ns: int = 0                         # wall-clock ns of the graph's time 0


@dataclass
class _Node:
    key: tuple
    role: int
    ev: Ev
    stream: tuple                              # stream identity (see _stream_decl)
    start: int                                 # file-clock ns
    dur: int
    unit: CommUnit | None = None
    group: GroupUse | None = None
    peer_index: int | None = None
    launches: list[Ev] = field(default_factory=list)
    parent: Ev | None = None


def build_rank_graph(tf: TraceFile, ctx: RankContext) -> RankGraph:
    drop: Counter = Counter(tf.dropped)
    win = ctx.window
    host: list[Ev] = []
    gpu: list[Ev] = []
    acts: list[Ev] = []
    for ev in tf.events:
        if ev.kind in (K_CPU, K_RUNTIME):
            host.append(ev)
        elif ev.kind == K_SYNC_ACT:
            acts.append(ev)
        else:
            gpu.append(ev)
    gpu_by_corr: dict[int, list[Ev]] = defaultdict(list)
    for g in gpu:
        if g.corr >= 0:
            gpu_by_corr[g.corr].append(g)
    runtime_by_corr: dict[int, Ev] = {}
    for ev in host:
        if ev.kind == K_RUNTIME and ev.corr >= 0:
            runtime_by_corr.setdefault(ev.corr, ev)
    acts_by_corr = {a.corr: a for a in acts if a.corr >= 0}

    def launch_of(g: Ev) -> Ev | None:
        return runtime_by_corr.get(g.corr) if g.corr >= 0 else None

    # Host events looked at in detail: the step and one more step's length after it (where
    # gloo may still run what the step issued); the whole file when there is no step.
    if win is None:
        scope = host
    else:
        late = win.end + (win.end - win.start)
        scope = [ev for ev in host if win.start <= ev.ts < late]

    # Which host events become nodes: ops, launches, host syncs. Event record/wait calls
    # only feed sync resolution.
    role: dict[int, int] = {}
    nesting_events: list[Ev] = []
    sync_calls: list[Ev] = []
    for ev in scope:
        if ev.kind == K_CPU:
            role[ev.idx] = _CPU
            nesting_events.append(ev)
        elif ev.corr >= 0 and ev.corr in gpu_by_corr:
            role[ev.idx] = _LAUNCH
            nesting_events.append(ev)
        elif ev.name in sync.HOST_SYNC:
            role[ev.idx] = _SYNC
            nesting_events.append(ev)
            sync_calls.append(ev)
        elif ev.name in sync.EVENT_RECORD or ev.name in sync.STREAM_WAIT:
            sync_calls.append(ev)
    by_thread: dict[tuple, list[Ev]] = defaultdict(list)
    for ev in nesting_events:
        by_thread[ev.thread].append(ev)

    def in_window(ev: Ev) -> bool:
        return win is None or win.holds(ev.ts)

    parents: dict[int, Ev] = {}
    for evs in by_thread.values():
        p, overlapping = assign_parents(evs)
        parents.update(p)
        drop["nesting_overlap_guessed"] += sum(1 for ev in overlapping if in_window(ev))

    # GPU ops kept with their launch (GPU work issued in the step belongs to the step).
    kept_gpu: list[Ev] = []
    for g in gpu:
        launch = launch_of(g)
        if launch is None:
            if in_window(g):
                kept_gpu.append(g)
                drop["gpu_op_without_launch"] += 1
            else:
                drop["outside_step"] += 1
        elif in_window(launch):
            kept_gpu.append(g)
        else:
            drop["outside_step"] += 1
    kept_gpu_ids = {g.idx for g in kept_gpu}

    # Communication units over the whole file, kept when issued inside the window.
    nccl = [g for g in gpu if g.kind == K_KERNEL and comm.is_nccl_kernel(g.name)]
    gpu_units, host_units = find_units(scope, parents, nccl, launch_of)
    has_gpu_ops = bool(gpu)
    has_nccl = bool(nccl)
    host_comm_ok = not has_gpu_ops or (not has_nccl and ctx.backend not in ("nccl",))

    nodes: list[_Node] = []
    kernel_node: dict[int, _Node] = {}
    # Streams carrying NCCL kernels anywhere in the file (not only in the step, so that the
    # fallback group keys do not depend on the step chosen).
    comm_streams: set[tuple] = {k.thread for k in nccl}
    for u in gpu_units:
        ks = [k for k in u.kernels if k.idx in kept_gpu_ids]
        if not ks:
            continue
        if len(ks) > 1:
            drop["comm_kernels_merged"] += len(ks) - 1
        first = ks[0]
        end = max(k.end for k in ks)
        n = _Node((first.ts, -(end - first.ts), 3, first.idx), _COMM, first, first.thread,
                  first.ts, end - first.ts, unit=u)
        n.launches = [launch for k in ks if (launch := launch_of(k)) is not None]
        nodes.append(n)
        for k in ks:
            kernel_node[k.idx] = n
    for u in host_units:
        root = u.root
        assert root is not None
        if not in_window(root):
            continue  # its ops are counted as outside the step
        gloo = u.execution is not None and u.execution.name.startswith("gloo:")
        if not (host_comm_ok or gloo):
            if comm.op_collective(root.name) is not None or root.name == "record_param_comms":
                drop["collective_op_without_kernel"] += 1
            continue
        span = u.execution if u.execution is not None else root
        if u.execution is None:
            drop["host_collective_time_from_issuing_op"] += 1
        n = _Node((root.ts, 0, 9, root.idx), _HOSTCOMM, span, ("host-comm",), span.ts,
                  span.dur, unit=u, parent=root)
        n.launches = [root]  # the op that issued it: it cannot start before that op does
        nodes.append(n)

    # Host nodes in the window.
    for ev in nesting_events:
        r = role.get(ev.idx)
        if r is None:
            continue
        if not in_window(ev):
            drop["outside_step"] += 1
            continue
        nodes.append(_Node(host_order_key(ev), r, ev, ("cpu",) + ev.thread, ev.ts, ev.dur,
                           parent=parents.get(ev.idx)))
    for ev in host:
        if ev.idx in role:
            continue
        if not in_window(ev):
            drop["outside_step"] += 1
        elif ev.kind == K_RUNTIME and ev.name not in sync.EVENT_RECORD \
                and ev.name not in sync.STREAM_WAIT and ev.corr not in gpu_by_corr:
            drop["runtime_call_without_gpu_work"] += 1
    for ev in sync_calls:
        if ev.idx not in role and in_window(ev):
            drop["event_record_wait_calls"] += 1
    # Other GPU ops.
    for g in kept_gpu:
        if g.idx in kernel_node:
            continue
        n = _Node((g.ts, -g.dur, 3, g.idx), _GPU, g, g.thread, g.ts, g.dur)
        launch = launch_of(g)
        if launch is not None:
            n.launches = [launch]
        nodes.append(n)
        if g.kind == K_KERNEL and comm.is_other_comm_kernel(g.name):
            drop["comm_kernel_unknown_library"] += 1

    if not nodes:
        from echo_et.errors import EchoError

        where = f"step {win.step}" if win else "the trace"
        raise EchoError(f"{tf.path}: no events to convert in {where}")

    # Collective details and groups (need the number of comm streams for fallback keys).
    single_comm_stream = len(comm_streams) <= 1
    worker_pg = _gloo_workers(scope, parents, ctx) if any(n.role == _HOSTCOMM for n in nodes) else {}
    for n in nodes:
        if n.role not in (_COMM, _HOSTCOMM):
            continue
        info = _gather_info(n.unit)  # type: ignore[arg-type]
        n.unit.info = info  # type: ignore[union-attr]
        ex = n.unit.execution  # type: ignore[union-attr]
        if not info.pg_name and ex is not None and ex.thread[1] in worker_pg:
            info.pg_name = worker_pg[ex.thread[1]]
            drop["group_from_gloo_worker_thread"] += 1
        if n.role == _COMM and not single_comm_stream:
            fallback = f"stream{n.stream[1]}"
        else:
            fallback = "0"
        g = groups.resolve(info, ctx.rank, ctx.world_size, ctx.pgs, fallback)
        if g.guess:
            drop[g.guess] += 1
        n.group = g
        gsize = len(g.ranks)
        if isinstance(info.coll, int) or info.coll in (comm.SEND, comm.RECV):
            status = comm.finish_sizes(info, gsize)
            if status:
                drop[status] += 1
        if n.role == _HOSTCOMM:
            # One stream per thread that ran the group's exchanges (gloo's worker threads;
            # the caller's for ops timed by themselves): a thread runs one exchange at a
            # time, while a group's worker threads run several at once.
            n.stream = ("host-comm", g.key, n.ev.thread[1])

    # Node order and ids.
    nodes.sort(key=lambda n: n.key)
    node_id: dict[int, int] = {}
    for i, n in enumerate(nodes, start=1):
        if n.role == _HOSTCOMM:
            continue  # its event is also a host op node (or none); nothing refers to it
        node_id[n.ev.idx] = i
        if n.role == _COMM:
            for k in n.unit.kernels:  # type: ignore[union-attr]
                node_id.setdefault(k.idx, i)
    origin = min(n.start for n in nodes)

    # Cross-stream and host syncs.
    comm_kernels = {g.idx for g in kept_gpu if g.kind == K_KERNEL and (
        comm.is_nccl_kernel(g.name) or comm.is_other_comm_kernel(g.name))}
    index = sync.LaunchIndex(kept_gpu, launch_of, comm_kernels)
    regions, work_waits = _comm_regions(gpu_units, scope, parents, launch_of)
    kept_calls = [c for c in sync_calls if in_window(c)]
    counts: Counter = Counter()
    sync_deps: dict[int, list[int]] = defaultdict(list)
    issued = _issue_times(nodes)
    for waiter, waited in sync.resolve(kept_calls, acts_by_corr, runtime_by_corr, index,
                                       _counter(counts), regions, work_waits):
        a, b = node_id.get(waiter.idx), node_id.get(waited.idx)
        if a is None or b is None or a == b or b in sync_deps[a]:
            continue
        if (issued[b], b) >= (issued[a], a):
            # Only merged collectives can meet this (a wait between their launches): a
            # dependency on later-issued work could close a cycle, so it is left out.
            counts["sync_dep_against_issue_order"] += 1
            continue
        if _contradicted(nodes[a - 1], nodes[b - 1]):
            counts["sync_dep_contradicted_by_times"] += 1
            continue
        sync_deps[a].append(b)
    drop.update(counts)

    # Streams, declared in a fixed order.
    gb = GraphBuilder(ctx.graph_id)
    kinds = _stream_kinds(nodes)
    sids: dict[tuple, int] = {}
    multi_pid = len({s[1] for s in kinds if s[0] == "cpu"}) > 1
    per_key = Counter(s[1] for s in kinds if s[0] == "host-comm")
    single = {s for s in kinds if s[0] == "host-comm" and per_key[s[1]] == 1}
    for s in sorted(kinds, key=_stream_sort):
        sids[s] = gb.stream(kinds[s], _stream_name(s, multi_pid, single),
                            device=_stream_device(s), native_id=_native(s))

    builder_out = RankGraph(gb.graph, measured_step_ns=0)
    for i, n in enumerate(nodes, start=1):
        deps: list[tuple[int, int]] = []
        if n.parent is not None:
            pid = node_id.get(n.parent.idx)
            if pid is not None and pid != i:
                deps.append((pid, pb.DEP_CONTROL))
        for launch in n.launches:
            lid = node_id.get(launch.idx)
            if lid is not None and (lid, pb.DEP_LAUNCH) not in deps:
                deps.append((lid, pb.DEP_LAUNCH))
        for d in sync_deps.get(i, ()):
            deps.append((d, pb.DEP_SYNC))
        sid = sids[n.stream]
        kw = dict(start_ns=n.start - origin, duration_ns=n.dur, deps=deps, node_id=i)
        _emit(gb, n, sid, kw, tf, ctx, builder_out, drop)

    for key, use in builder_out.groups.items():
        gb.declare_group(key, len(use.ranks))
    g = gb.build()
    h = g.header
    h.attrs["kineto.file"] = tf.name
    h.attrs["kineto.rank"] = str(ctx.rank)
    h.attrs["kineto.rf_id_source"] = tf.rf_id_source
    h.attrs["kineto.time_unit"] = tf.time_unit
    if tf.display_time_unit:
        h.attrs["kineto.display_time_unit"] = tf.display_time_unit
    if win is not None:
        h.attrs["kineto.step"] = str(win.step)
    builder_out.graph = g
    builder_out.dropped = drop
    builder_out.origin_ns = tf.base_ns + origin
    if win is not None:
        builder_out.measured_step_ns = win.end - win.start
    else:
        builder_out.measured_step_ns = max(n.start + n.dur for n in nodes) - origin
    return builder_out


def _gloo_workers(host: list[Ev], parents: dict[int, Ev], ctx: RankContext) -> dict[int, str]:
    """Threads whose outermost ops are all gloo:* exchanges, mapped to their group."""
    gloo: set = set()
    other: set = set()
    for ev in host:
        if ev.kind == K_CPU and ev.idx not in parents:
            (gloo if ev.name.startswith("gloo:") else other).add(ev.thread)
    workers = {th[1] for th in gloo - other}
    return groups.gloo_worker_groups(workers, ctx.pgs, ctx.rank)


# A dependency the measured times break by more than this was guessed wrong (the
# simulator's tolerance for the same test).
_CAUSALITY_TOLERANCE_NS = 1000


def _contradicted(waiter: _Node, waited: _Node) -> bool:
    """Whether the measurement shows ``waiter`` going on before ``waited`` ended: a GPU op
    starting early, or a host sync returning early (a sync may start before, it blocks)."""
    t = waiter.start + waiter.dur if waiter.role == _SYNC else waiter.start
    return t < waited.start + waited.dur - _CAUSALITY_TOLERANCE_NS


def _comm_regions(units: list[CommUnit], host: list[Ev], parents: dict[int, Ev],
                  launch_of: Callable[[Ev], Ev | None]) -> tuple[sync.Spans, sync.Spans]:
    """Where NCCL communication ops ran on their host threads (sync.CommRegion spans), and
    the ``record_param_comms`` outside them that launched nothing (c10d's work.wait())."""
    spans = []
    for u in units:
        root = u.root
        if root is None or not u.kernels:
            continue
        launches = [x.ts for k in u.kernels if (x := launch_of(k)) is not None]
        if not launches:
            continue
        library = min(launches)
        for op in u.ops:
            if op.name.startswith(("nccl:", "rccl:")):
                library = min(library, op.ts)
        start, end = root.ts, root.end
        p = parents.get(root.idx)
        while p is not None:  # c10d's wrapper around a bare nccl:* root (older traces)
            if p.name == "record_param_comms":
                start, end = min(start, p.ts), max(end, p.end)
                break
            p = parents.get(p.idx)
        spans.append((root.thread, start, end, sync.CommRegion(root.thread, start, library, end,
                                                                u.kernels[0].thread)))
    regions = sync.Spans(spans)
    waits = [(ev.thread, ev.ts, ev.end, True) for ev in host
             if ev.kind == K_CPU and ev.name == "record_param_comms"
             and ev.arg("Collective name") in (None, "wait") and regions.at(ev.thread, ev.ts) is None]
    return regions, sync.Spans(waits)


def _issue_times(nodes: list[_Node]) -> dict[int, int]:
    """Node id -> when its work was issued (earliest launch for GPU work, else its start)."""
    out: dict[int, int] = {}
    for i, n in enumerate(nodes, start=1):
        out[i] = min(x.ts for x in n.launches) if n.launches else n.ev.ts
    return out


def _counter(counts: Counter) -> Callable[[str], None]:
    def count(reason: str) -> None:
        counts[reason] += 1
    return count


def _gather_info(u: CommUnit) -> comm.CommInfo:
    info = comm.CommInfo()
    if u.kernels:
        comm.merge_meta(info, u.kernels[0].args, "kernel_args")
    for op in u.ops:
        if op.name == "record_param_comms":
            comm.merge_meta(info, op.args, "record_param_comms")
    for op in u.ops:
        if ":" in op.name and not op.name.startswith(("gloo:", "c10d::")) \
                and "::" not in op.name:
            comm.merge_annotation(info, op)
    for op in u.ops:
        if "::" in op.name:
            comm.merge_c10d(info, op)
    for op in u.ops:
        if op.name.startswith("gloo:"):
            comm.merge_annotation(info, op)
    if u.execution is not None and u.execution not in u.ops:
        comm.merge_annotation(info, u.execution)
    if u.kernels:
        comm.merge_kernel_name(info, u.kernels[0].name)
    return info


def _emit(gb: GraphBuilder, n: _Node, sid: int, kw: dict, tf: TraceFile, ctx: RankContext,
          out: RankGraph, drop: Counter) -> None:
    ev = n.ev
    if n.role in (_CPU, _LAUNCH, _SYNC):
        kind = {_CPU: pb.KIND_CPU_OP, _LAUNCH: pb.KIND_LAUNCH, _SYNC: pb.KIND_SYNC}[n.role]
        node = gb.cpu_op(ev.name, sid, kind=kind, correlation=max(ev.corr, 0), **kw)
        if n.role == _CPU:
            _cpu_payload(node, ev, tf.rf_id_source)
        return
    if n.role == _GPU:
        if ev.kind == K_KERNEL:
            if comm.is_other_comm_kernel(ev.name) or comm.is_nccl_kernel(ev.name):
                node = gb.node(pb.KIND_COMM_UNKNOWN, ev.name, sid, **kw)
                node.attrs["comm_library"] = comm_kernels.library(ev.name) or "other"
            else:
                gb.compute(ev.name, sid, kernel_class=kernel_class(ev.name), **kw)
            return
        nbytes = _bytes_of(ev, n.launches)
        if ev.kind == K_MEMSET:
            gb.memcpy(ev.name, sid, nbytes=nbytes, direction="memset", kind=pb.KIND_MEMSET, **kw)
        else:
            assert ev.kind == K_MEMCPY
            gb.memcpy(ev.name, sid, nbytes=nbytes, direction=_direction(ev.name), **kw)
        return
    # Communication.
    u = n.unit
    assert u is not None and u.info is not None and n.group is not None
    info, use = u.info, n.group
    name = _comm_name(n)
    if info.coll in (comm.SEND, comm.RECV):
        peer = _peer_index(info, use, ctx)
        if peer is None:
            drop["p2p_peer_unknown"] += 1
            node = gb.node(pb.KIND_COMM_UNKNOWN, name, sid, **kw)
            node.attrs["comm"] = str(info.coll)
        else:
            gb.p2p(info.coll == comm.SEND, name, sid, group=use.key, peer=peer,
                   nbytes=info.in_bytes or 0, **kw)
            out.groups[use.key] = use
    elif isinstance(info.coll, int):
        node = gb.collective(name, sid, coll_type=info.coll, group=use.key,
                             in_bytes=info.in_bytes or 0, out_bytes=info.out_bytes,
                             dtype=info.dtype, **kw)
        if info.algorithm:
            node.collective.algorithm = info.algorithm
        if info.coll == comm.ALL_TO_ALL:
            _split_attrs(node, info, len(use.ranks), drop)
        out.groups[use.key] = use
    else:
        drop["comm_type_unknown"] += 1
        node = gb.node(pb.KIND_COMM_UNKNOWN, name, sid, **kw)
        node.attrs["comm_library"] = "nccl" if u.kernels else "host"
        return
    node = gb.graph.nodes[-1]
    node.attrs["comm_source"] = ",".join(info.sources) or "none"
    if use.guess:
        node.attrs["group_guess"] = use.guess


# Node attrs with an all-to-all's bytes per peer (comma-separated, group-rank order), read
# by the ASTRA-sim exporter (converters/astra_sim: in_split_bytes).
IN_SPLIT_ATTR, OUT_SPLIT_ATTR = "in_split_bytes", "out_split_bytes"


def _split_attrs(node: pb.Node, info: comm.CommInfo, group_size: int, drop: Counter) -> None:
    """Uneven all-to-all: the bytes sent to / received from each peer, when the trace
    recorded split sizes (``In/Out split size`` args, or the c10d op's split-size inputs)."""
    if info.splits_truncated:
        drop["all_to_all_splits_truncated"] += 1
    for splits, total, attr in ((info.in_splits, info.in_bytes, IN_SPLIT_ATTR),
                                (info.out_splits, info.out_bytes, OUT_SPLIT_ATTR)):
        per_peer, why = comm.split_bytes(splits, total, group_size)
        if why:
            drop[why] += 1
        elif per_peer is not None:
            node.attrs[attr] = ",".join(str(b) for b in per_peer)


def _comm_name(n: _Node) -> str:
    if n.role == _COMM:
        return n.ev.name
    root = n.unit.root if n.unit is not None else None
    return root.name if root is not None else n.ev.name


def _peer_index(info: comm.CommInfo, use: GroupUse, ctx: RankContext) -> int | None:
    """The peer's index in the group (group rank), when it names another member."""
    p = info.peer
    if p is None or p < 0 or p >= len(use.ranks) or use.ranks[p] == ctx.rank:
        return None
    return p


def _cpu_payload(node: pb.Node, ev: Ev, rf_source: str) -> None:
    c = node.cpu
    if rf_source == "record_function_id":
        rf = ev.arg("Record function id")
    else:
        rf = ev.arg("Ev Idx")
    if type(rf) is int:
        c.rf_id = rf
        node.attrs["rf_id_source"] = rf_source
    dims = ev.arg("Input Dims")
    if dims is not None:
        c.shapes = _json_text(dims)
    types = ev.arg("Input type")
    if types is not None:
        c.dtypes = _json_text(types)


_JSON_CACHE: dict[bytes | str, str] = {}


def _json_text(value) -> str:
    """JSON text of a shapes/types list; many ops repeat the same lists, so the text is cached
    under orjson's (fast, canonical) encoding of the value."""
    try:
        key: bytes | str = _orjson.dumps(value) if _orjson is not None else repr(value)
    except TypeError:  # an integer beyond 64 bits
        key = repr(value)
    text = _JSON_CACHE.get(key)
    if text is None:
        text = json.dumps(value)
        if len(_JSON_CACHE) < 100_000:
            _JSON_CACHE[key] = text
    return text


def _bytes_of(ev: Ev, launches: list[Ev]) -> int:
    b = ev.arg("bytes")
    if b is not None:
        return _checked_bytes(b, "bytes", ev)
    for launch in launches:  # HIP records the size on the runtime call only
        s = launch.arg("size")
        if s is not None:
            return _checked_bytes(s, "size", launch)
    return 0


def _checked_bytes(value, field: str, ev: Ev) -> int:
    """A byte count from an event's args: an integer (or integral number text) in
    0..MAX_BYTES, else one EchoError naming the event."""
    if type(value) is str:  # floats are kept as their text
        try:
            f = float(value)
        except ValueError:
            f = math.nan
        value = int(f) if math.isfinite(f) and f.is_integer() and abs(f) <= MAX_BYTES else value
    return checked_int(value, f"{field} of {ev.name[:60]!r}", hi=MAX_BYTES)


def _direction(name: str) -> str:
    for d in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "DtoA", "AtoD", "HtoA", "AtoH"):
        if d in name:
            return d
    return "other"


def _stream_kinds(nodes: list[_Node]) -> dict[tuple, int]:
    kinds: dict[tuple, int] = {}
    gpu_roles: dict[tuple, set[int]] = defaultdict(set)
    for n in nodes:
        s = n.stream
        if s[0] == "cpu" or s[0] == "host-comm":
            kinds[s] = pb.STREAM_CPU_THREAD
        else:
            if n.role == _COMM or (n.ev.kind == K_KERNEL and (
                    comm.is_nccl_kernel(n.ev.name) or comm.is_other_comm_kernel(n.ev.name))):
                gpu_roles[s].add(2)
            elif n.ev.kind in (K_MEMCPY, K_MEMSET):
                gpu_roles[s].add(1)
            else:
                gpu_roles[s].add(0)
    for s, r in gpu_roles.items():
        if 2 in r:
            kinds[s] = pb.STREAM_GPU_COMM
        elif r == {1}:
            kinds[s] = pb.STREAM_GPU_COPY
        else:
            kinds[s] = pb.STREAM_GPU_COMPUTE
    return kinds


def _stream_sort(s: tuple) -> tuple:
    group = {"cpu": 0, "host-comm": 2}.get(s[0], 1) if isinstance(s[0], str) else 1
    return (group, tuple((0, x) if isinstance(x, int) else (1, str(x)) for x in s))


def _stream_name(s: tuple, multi_pid: bool, single: set[tuple]) -> str:
    if s[0] == "cpu":
        return f"cpu:{s[1]}:{s[2]}" if multi_pid else f"cpu:{s[2]}"
    if s[0] == "host-comm":
        if s in single:
            return f"host-comm:{s[1]}"
        return f"host-comm:{s[1]}:{s[2]}"
    return f"gpu{s[0]}:stream{s[1]}"


def _stream_device(s: tuple) -> int:
    if isinstance(s[0], str):
        return -1
    return s[0] if isinstance(s[0], int) else -1


def _native(s: tuple) -> int:
    x = s[2] if s[0] in ("cpu", "host-comm") else s[1]
    return x if isinstance(x, int) else 0
