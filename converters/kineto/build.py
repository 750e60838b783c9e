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

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import NamedTuple

import msgspec

from echo_et.ir import Graph, GraphBuilder
from echo_et.ir.attention import CAUSAL_ATTR, causal_text
from echo_et.ir.conventions import LAUNCH_BLOCKS_ATTR, LAUNCH_THREADS_ATTR
from echo_et.ir.schema import pb

from . import comm, comm_kernels, groups, sync
from .events import K_CPU, K_KERNEL, K_MEMCPY, K_MEMSET, K_RUNTIME, K_SYNC_ACT, Ev, TraceFile
from .groups import GroupUse, PgDef
from .kernel_class import kernel_class
from .nesting import assign_parents, host_order_key
from .payloads import (
    bytes_of,
    copy_direction,
    cpu_payload,
    is_rf_id,
    launch_shape,
    shape_texts,
    split_attrs,
)
from .steps import Window
from .units import CommUnit, find_units

# Node roles (internal): what a node of the graph stands for.
_CPU, _LAUNCH, _SYNC, _GPU, _COMM, _HOSTCOMM = range(6)
_HOST_KINDS = {_CPU: pb.KIND_CPU_OP, _LAUNCH: pb.KIND_LAUNCH, _SYNC: pb.KIND_SYNC}


class StreamFamily(StrEnum):
    """The three kinds of lanes a Kineto trace's work runs on."""

    CPU = "cpu"                # a host thread (pid, tid)
    HOST_COMM = "host-comm"    # collectives of a host backend (gloo) of one group, per thread
    GPU = "gpu"                # a GPU stream (device, stream)


class StreamKey(NamedTuple):
    """A stream's identity before it gets an id in the graph.

    ``owner``/``lane`` are, per family: CPU (pid, tid); HOST_COMM (group key, tid of the
    thread that ran the exchange); GPU (device, stream). Kineto's pids and tids are ints in
    practice, but a file may carry strings."""

    family: StreamFamily
    owner: object
    lane: object

    @classmethod
    def of_host(cls, ev: Ev) -> StreamKey:
        return cls(StreamFamily.CPU, ev.thread[0], ev.thread[1])

    @classmethod
    def of_gpu(cls, ev: Ev) -> StreamKey:
        return cls(StreamFamily.GPU, ev.thread[0], ev.thread[1])

    def sort_key(self) -> tuple:
        """Host threads first, then GPU streams, then host-backend communication; numbers
        before text within each."""
        return (_FAMILY_ORDER[self.family], _mixed(self.owner), _mixed(self.lane))

    def name(self, multi_pid: bool, single_thread_keys: set[StreamKey]) -> str:
        if self.family is StreamFamily.CPU:
            return f"cpu:{self.owner}:{self.lane}" if multi_pid else f"cpu:{self.lane}"
        if self.family is StreamFamily.HOST_COMM:
            if self in single_thread_keys:
                return f"host-comm:{self.owner}"
            return f"host-comm:{self.owner}:{self.lane}"
        return f"gpu{self.owner}:stream{self.lane}"

    @property
    def device(self) -> int:
        """The GPU of a GPU stream; -1 for host lanes."""
        if self.family is StreamFamily.GPU and isinstance(self.owner, int):
            return self.owner
        return -1

    @property
    def native_id(self) -> int:
        """The tid (host lanes) or stream id (GPU) as Kineto wrote it; 0 when not a number."""
        return self.lane if isinstance(self.lane, int) else 0


_FAMILY_ORDER = {StreamFamily.CPU: 0, StreamFamily.GPU: 1, StreamFamily.HOST_COMM: 2}


def _mixed(x: object) -> tuple[int, object]:
    return (0, x) if isinstance(x, int) else (1, str(x))


class GpuStreamUse(IntEnum):
    """What a GPU stream carries; a stream that carries communication is a comm stream, one
    that carries only copies a copy stream, any other a compute stream."""

    COMPUTE = 0
    COPY = 1
    COMM = 2


class NodeOrder(NamedTuple):
    """Where a node goes in the graph's single node order (ids ascend in execution order on
    every stream): earlier start first, then longer first (a parent before its children),
    then by ``tie``, then by the event's index in the file."""

    ts: int
    neg_dur: int
    tie: int
    idx: int


# ``NodeOrder.tie`` at one instant: host ops (K_CPU = 1, from ``host_order_key``) before
# runtime calls (K_RUNTIME = 2) before GPU work; a host-backend collective goes after all of
# them (its order key has no duration: it sorts after the op that issued it).
TIE_GPU = 3
TIE_HOST_COMM = 9


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


class _Node(msgspec.Struct, eq=False):
    """A node to be: a struct (made for every host op; cheaper to build than a dataclass),
    compared by identity."""

    key: tuple                                 # NodeOrder (host ops: nesting.host_order_key)
    role: int
    ev: Ev
    stream: StreamKey
    start: int                                 # file-clock ns
    dur: int
    unit: CommUnit | None = None
    group: GroupUse | None = None
    peer_index: int | None = None
    launches: list[Ev] = msgspec.field(default_factory=list)
    parent: Ev | None = None


def build_rank_graph(tf: TraceFile, ctx: RankContext) -> RankGraph:
    """One rank's graph, built in phases (see :class:`_RankBuild`)."""
    return _RankBuild(tf, ctx).run()


class _RankBuild:
    """The state shared by the phases that turn one rank's events into its graph:

    1. ``_index_events``: host / GPU / sync-activity events, and who launched what
       (``correlation``);
    2. ``_choose_host_nodes``: which host events of the step become nodes, and their nesting;
    3. ``_keep_gpu_ops``: GPU work launched in the step;
    4. ``_comm_nodes``, ``_host_nodes``, ``_gpu_nodes``: the nodes, in any order;
    5. ``_resolve_groups``: each collective's sizes and process group;
    6. ``_number_nodes``: the node order and ids;
    7. ``_sync_dependencies``: cross-stream waits and host syncs;
    8. ``_emit``: streams declared in a fixed order, then every node written.
    """

    def __init__(self, tf: TraceFile, ctx: RankContext):
        self.tf = tf
        self.ctx = ctx
        self.win = ctx.window
        self.drop: Counter = Counter(tf.dropped)
        self.nodes: list[_Node] = []

    def run(self) -> RankGraph:
        self._index_events()
        self._choose_host_nodes()
        self._keep_gpu_ops()
        self._comm_nodes()
        self._host_nodes()
        self._gpu_nodes()
        if not self.nodes:
            from echo_et.errors import EchoError

            where = f"step {self.win.step}" if self.win else "the trace"
            raise EchoError(f"{self.tf.path}: no events to convert in {where}")
        self._resolve_groups()
        self._number_nodes()
        sync_deps = self._sync_dependencies()
        return self._emit(sync_deps)

    def in_window(self, ev: Ev) -> bool:
        return self.win is None or self.win.holds(ev.ts)

    def launch_of(self, g: Ev) -> Ev | None:
        return self.runtime_by_corr.get(g.corr) if g.corr >= 0 else None

    # -- 1. events ---------------------------------------------------------------------------
    def _index_events(self) -> None:
        self.host: list[Ev] = []
        self.gpu: list[Ev] = []
        acts: list[Ev] = []
        for ev in self.tf.events:
            if ev.kind in (K_CPU, K_RUNTIME):
                self.host.append(ev)
            elif ev.kind == K_SYNC_ACT:
                acts.append(ev)
            else:
                self.gpu.append(ev)
        self.gpu_by_corr: dict[int, list[Ev]] = defaultdict(list)
        for g in self.gpu:
            if g.corr >= 0:
                self.gpu_by_corr[g.corr].append(g)
        self.runtime_by_corr: dict[int, Ev] = {}
        for ev in self.host:
            if ev.kind == K_RUNTIME and ev.corr >= 0:
                self.runtime_by_corr.setdefault(ev.corr, ev)
        self.acts_by_corr = {a.corr: a for a in acts if a.corr >= 0}

    # -- 2. host nodes and nesting ---------------------------------------------------------
    def _choose_host_nodes(self) -> None:
        """Host events looked at in detail: the step and one more step's length after it
        (where gloo may still run what the step issued); the whole file when there is no
        step. Ops, launches and host syncs become nodes; event record/wait calls only feed
        sync resolution."""
        win = self.win
        if win is None:
            self.scope = self.host
        else:
            late = win.end + (win.end - win.start)
            self.scope = [ev for ev in self.host if win.start <= ev.ts < late]
        self.role: dict[int, int] = {}
        self.nesting_events: list[Ev] = []
        self.sync_calls: list[Ev] = []
        for ev in self.scope:
            if ev.kind == K_CPU:
                self.role[ev.idx] = _CPU
                self.nesting_events.append(ev)
            elif ev.corr >= 0 and ev.corr in self.gpu_by_corr:
                self.role[ev.idx] = _LAUNCH
                self.nesting_events.append(ev)
            elif ev.name in sync.HOST_SYNC:
                self.role[ev.idx] = _SYNC
                self.nesting_events.append(ev)
                self.sync_calls.append(ev)
            elif ev.name in sync.EVENT_RECORD or ev.name in sync.STREAM_WAIT:
                self.sync_calls.append(ev)
        by_thread: dict[tuple, list[Ev]] = defaultdict(list)
        for ev in self.nesting_events:
            by_thread[ev.thread].append(ev)
        self.parents: dict[int, Ev] = {}
        for evs in by_thread.values():
            p, overlapping = assign_parents(evs)
            self.parents.update(p)
            self.drop["nesting_overlap_guessed"] += sum(1 for ev in overlapping if self.in_window(ev))

    # -- 3. GPU work of the step -------------------------------------------------------------
    def _keep_gpu_ops(self) -> None:
        """GPU ops kept with their launch (GPU work issued in the step belongs to the step)."""
        self.kept_gpu: list[Ev] = []
        for g in self.gpu:
            launch = self.launch_of(g)
            if launch is None:
                if self.in_window(g):
                    self.kept_gpu.append(g)
                    self.drop["gpu_op_without_launch"] += 1
                else:
                    self.drop["outside_step"] += 1
            elif self.in_window(launch):
                self.kept_gpu.append(g)
            else:
                self.drop["outside_step"] += 1

    # -- 4. nodes ----------------------------------------------------------------------------
    def _comm_nodes(self) -> None:
        """Communication units over the whole file, kept when issued inside the window: one
        node per NCCL unit (its kernels merged), one per host-backend collective."""
        ctx, drop = self.ctx, self.drop
        kept_gpu_ids = {g.idx for g in self.kept_gpu}
        nccl = [g for g in self.gpu if g.kind == K_KERNEL and comm.is_nccl_kernel(g.name)]
        self.gpu_units, host_units = find_units(self.scope, self.parents, nccl, self.launch_of)
        has_nccl = bool(nccl)
        host_comm_ok = not self.gpu or (not has_nccl and ctx.backend not in ("nccl",))
        self.kernel_node: dict[int, _Node] = {}
        # Streams carrying NCCL kernels anywhere in the file (not only in the step, so that
        # the fallback group keys do not depend on the step chosen).
        self.comm_streams: set[tuple] = {k.thread for k in nccl}
        for u in self.gpu_units:
            ks = [k for k in u.kernels if k.idx in kept_gpu_ids]
            if not ks:
                continue
            if len(ks) > 1:
                drop["comm_kernels_merged"] += len(ks) - 1
            first = ks[0]
            end = max(k.end for k in ks)
            n = _Node(NodeOrder(first.ts, -(end - first.ts), TIE_GPU, first.idx), _COMM, first,
                      StreamKey.of_gpu(first), first.ts, end - first.ts, unit=u)
            n.launches = [launch for k in ks if (launch := self.launch_of(k)) is not None]
            self.nodes.append(n)
            for k in ks:
                self.kernel_node[k.idx] = n
        for u in host_units:
            root = u.root
            assert root is not None
            if not self.in_window(root):
                continue  # its ops are counted as outside the step
            gloo = u.execution is not None and u.execution.name.startswith("gloo:")
            if not (host_comm_ok or gloo):
                if comm.op_collective(root.name) is not None or root.name == "record_param_comms":
                    drop["collective_op_without_kernel"] += 1
                continue
            span = u.execution if u.execution is not None else root
            if u.execution is None:
                drop["host_collective_time_from_issuing_op"] += 1
            # Its lane is known once its group is (_resolve_groups).
            lane = StreamKey(StreamFamily.HOST_COMM, "", 0)
            n = _Node(NodeOrder(root.ts, 0, TIE_HOST_COMM, root.idx), _HOSTCOMM, span, lane, span.ts,
                      span.dur, unit=u, parent=root)
            n.launches = [root]  # the op that issued it: it cannot start before that op does
            self.nodes.append(n)

    def _host_nodes(self) -> None:
        """Host nodes in the window; what is left out is counted."""
        drop = self.drop
        role, parents, win, nodes = self.role, self.parents, self.win, self.nodes
        lanes: dict[tuple, StreamKey] = {}   # one StreamKey per thread
        for ev in self.nesting_events:
            r = role.get(ev.idx)
            if r is None:
                continue
            if win is not None and not win.holds(ev.ts):
                drop["outside_step"] += 1
                continue
            lane = lanes.get(ev.thread)
            if lane is None:
                lane = lanes[ev.thread] = StreamKey.of_host(ev)
            nodes.append(_Node(host_order_key(ev), r, ev, lane, ev.ts, ev.dur, None, None, None, [],
                               parents.get(ev.idx)))
        for ev in self.host:
            if ev.idx in self.role:
                continue
            if not self.in_window(ev):
                drop["outside_step"] += 1
            elif ev.kind == K_RUNTIME and ev.name not in sync.EVENT_RECORD \
                    and ev.name not in sync.STREAM_WAIT and ev.corr not in self.gpu_by_corr:
                drop["runtime_call_without_gpu_work"] += 1
        for ev in self.sync_calls:
            if ev.idx not in self.role and self.in_window(ev):
                drop["event_record_wait_calls"] += 1

    def _gpu_nodes(self) -> None:
        """GPU ops that are not part of a communication unit."""
        for g in self.kept_gpu:
            if g.idx in self.kernel_node:
                continue
            n = _Node(NodeOrder(g.ts, -g.dur, TIE_GPU, g.idx), _GPU, g, StreamKey.of_gpu(g), g.ts, g.dur)
            launch = self.launch_of(g)
            if launch is not None:
                n.launches = [launch]
            self.nodes.append(n)
            if g.kind == K_KERNEL and comm.is_other_comm_kernel(g.name):
                self.drop["comm_kernel_unknown_library"] += 1

    # -- 5. collectives' groups and sizes ----------------------------------------------------
    def _resolve_groups(self) -> None:
        """Collective details and groups (the fallback group key needs the number of comm
        streams)."""
        ctx, drop = self.ctx, self.drop
        single_comm_stream = len(self.comm_streams) <= 1
        worker_pg = (_gloo_workers(self.scope, self.parents, ctx)
                     if any(n.role == _HOSTCOMM for n in self.nodes) else {})
        for n in self.nodes:
            if n.role not in (_COMM, _HOSTCOMM):
                continue
            unit = n.unit
            assert unit is not None
            info = _gather_info(unit)
            unit.info = info
            ex = unit.execution
            if not info.pg_name and ex is not None and ex.thread[1] in worker_pg:
                info.pg_name = worker_pg[ex.thread[1]]
                drop["group_from_gloo_worker_thread"] += 1
            if n.role == _COMM and not single_comm_stream:
                fallback = f"stream{n.stream.lane}"
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
                # One stream per thread that ran the group's exchanges (gloo's worker
                # threads; the caller's for ops timed by themselves): a thread runs one
                # exchange at a time, while a group's worker threads run several at once.
                n.stream = StreamKey(StreamFamily.HOST_COMM, g.key, n.ev.thread[1])

    # -- 6. order and ids --------------------------------------------------------------------
    def _number_nodes(self) -> None:
        self.nodes.sort(key=lambda n: n.key)
        self.node_id: dict[int, int] = {}   # Ev.idx -> node id
        for i, n in enumerate(self.nodes, start=1):
            if n.role == _HOSTCOMM:
                continue  # its event is also a host op node (or none); nothing refers to it
            self.node_id[n.ev.idx] = i
            if n.role == _COMM:
                for k in n.unit.kernels:  # type: ignore[union-attr]
                    self.node_id.setdefault(k.idx, i)
        self.origin = min(n.start for n in self.nodes)

    # -- 7. syncs ----------------------------------------------------------------------------
    def _sync_dependencies(self) -> dict[int, list[int]]:
        """Cross-stream and host syncs: node id -> ids of the nodes it waits for."""
        nodes, node_id = self.nodes, self.node_id
        comm_kernels = {g.idx for g in self.kept_gpu if g.kind == K_KERNEL and (
            comm.is_nccl_kernel(g.name) or comm.is_other_comm_kernel(g.name))}
        index = sync.LaunchIndex(self.kept_gpu, self.launch_of, comm_kernels)
        regions, work_waits = _comm_regions(self.gpu_units, self.scope, self.parents, self.launch_of)
        kept_calls = [c for c in self.sync_calls if self.in_window(c)]
        counts: Counter = Counter()
        sync_deps: dict[int, list[int]] = defaultdict(list)
        issued = _issue_times(nodes)
        for waiter, waited in sync.resolve(kept_calls, self.acts_by_corr, self.runtime_by_corr, index,
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
        self.drop.update(counts)
        return sync_deps

    # -- 8. the graph ------------------------------------------------------------------------
    def _declare_streams(self, gb: GraphBuilder) -> dict[StreamKey, int]:
        """Streams, declared in a fixed order (StreamKey.sort_key)."""
        kinds = _stream_kinds(self.nodes)
        multi_pid = len({s.owner for s in kinds if s.family is StreamFamily.CPU}) > 1
        per_key = Counter(s.owner for s in kinds if s.family is StreamFamily.HOST_COMM)
        single = {s for s in kinds if s.family is StreamFamily.HOST_COMM and per_key[s.owner] == 1}
        sids: dict[StreamKey, int] = {}
        for s in sorted(kinds, key=StreamKey.sort_key):
            sids[s] = gb.stream(kinds[s], s.name(multi_pid, single), device=s.device, native_id=s.native_id)
        return sids

    def _emit(self, sync_deps: dict[int, list[int]]) -> RankGraph:
        tf, ctx, win, nodes, node_id, origin = self.tf, self.ctx, self.win, self.nodes, self.node_id, self.origin
        gb = GraphBuilder(ctx.graph_id)
        sids = self._declare_streams(gb)
        out = RankGraph(gb.graph, measured_step_ns=0)
        rf_source = tf.rf_id_source
        rf_key = "Record function id" if rf_source == "record_function_id" else "Ev Idx"
        control, launch_dep, sync_dep = pb.DEP_CONTROL, pb.DEP_LAUNCH, pb.DEP_SYNC
        for i, n in enumerate(nodes, start=1):
            deps: list[tuple[int, int]] = []
            if n.parent is not None:
                pid = node_id.get(n.parent.idx)
                if pid is not None and pid != i:
                    deps.append((pid, control))
            for launch in n.launches:
                lid = node_id.get(launch.idx)
                if lid is not None and (lid, launch_dep) not in deps:
                    deps.append((lid, launch_dep))
            if i in sync_deps:
                for d in sync_deps[i]:
                    deps.append((d, sync_dep))
            role = n.role
            kind = _HOST_KINDS.get(role)
            if kind is not None:
                # Host nodes (most of a graph): _emit and _cpu_payload in one builder call.
                ev = n.ev
                rf = None
                shapes = dtypes = causal = ""
                if role == _CPU and ev.args:
                    args = ev.args
                    rf = args.get(rf_key)
                    dims = args.get("Input Dims")
                    types = args.get("Input type")
                    if dims is not None or types is not None:
                        shapes, dtypes = shape_texts(dims, types)
                    concrete = args.get("Concrete Inputs")
                    if concrete is not None:
                        causal = causal_text(ev.name, concrete)
                has_rf = is_rf_id(rf)
                corr = ev.corr
                node = gb.cpu_op(ev.name, sids[n.stream], kind=kind, correlation=corr if corr > 0 else 0,
                                 rf_id=rf if has_rf else 0, shapes=shapes, dtypes=dtypes,
                                 start_ns=n.start - origin, duration_ns=n.dur, deps=deps, node_id=i)
                if has_rf:
                    node.attrs["rf_id_source"] = rf_source
                if causal:
                    node.attrs[CAUSAL_ATTR] = causal
                continue
            kw = dict(start_ns=n.start - origin, duration_ns=n.dur, deps=deps, node_id=i)
            _emit(gb, n, sids[n.stream], kw, tf, ctx, out, self.drop)

        for key, use in out.groups.items():
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
        out.graph = g
        out.dropped = self.drop
        out.origin_ns = tf.base_ns + origin
        if win is not None:
            out.measured_step_ns = win.end - win.start
        else:
            out.measured_step_ns = max(n.start + n.dur for n in nodes) - origin
        return out


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
    # A backend annotation that carries record_param_comms' args (echo-et's own timelines
    # write them on gloo:* spans of host-thread collectives).
    spans = [*u.ops, *([u.execution] if u.execution is not None and u.execution not in u.ops else [])]
    for op in spans:
        if op.name.startswith("gloo:") and op.arg("Collective name") is not None:
            comm.merge_meta(info, op.args, "annotation_args")
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
            cpu_payload(node, ev, tf.rf_id_source)
        return
    if n.role == _GPU:
        if ev.kind == K_KERNEL:
            if comm.is_other_comm_kernel(ev.name) or comm.is_nccl_kernel(ev.name):
                node = gb.node(pb.KIND_COMM_UNKNOWN, ev.name, sid, **kw)
                node.attrs["comm_library"] = comm_kernels.library(ev.name) or "other"
            else:
                gb.compute(ev.name, sid, kernel_class=kernel_class(ev.name), **kw)
            return
        nbytes = bytes_of(ev, n.launches)
        if ev.kind == K_MEMSET:
            gb.memcpy(ev.name, sid, nbytes=nbytes, direction="memset", kind=pb.KIND_MEMSET, **kw)
        else:
            assert ev.kind == K_MEMCPY
            gb.memcpy(ev.name, sid, nbytes=nbytes, direction=copy_direction(ev.name), **kw)
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
            split_attrs(node, info, len(use.ranks), drop)
        out.groups[use.key] = use
    else:
        drop["comm_type_unknown"] += 1
        node = gb.node(pb.KIND_COMM_UNKNOWN, name, sid, **kw)
        node.attrs["comm_library"] = "nccl" if u.kernels else "host"
        return
    node = gb.graph.nodes[-1]
    node.attrs["comm_source"] = ",".join(info.sources) or "none"
    launch = launch_shape(u.kernels)
    if launch is not None:
        node.attrs[LAUNCH_BLOCKS_ATTR], node.attrs[LAUNCH_THREADS_ATTR] = str(launch[0]), str(launch[1])
    if use.guess:
        node.attrs["group_guess"] = use.guess


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


def _stream_kinds(nodes: list[_Node]) -> dict[StreamKey, int]:
    """The StreamKind of every stream the nodes run on (see :class:`GpuStreamUse`)."""
    kinds: dict[StreamKey, int] = {}
    gpu_uses: dict[StreamKey, set[GpuStreamUse]] = defaultdict(set)
    for n in nodes:
        s = n.stream
        if s.family is not StreamFamily.GPU:
            kinds[s] = pb.STREAM_CPU_THREAD
        elif n.role == _COMM or (n.ev.kind == K_KERNEL and (
                comm.is_nccl_kernel(n.ev.name) or comm.is_other_comm_kernel(n.ev.name))):
            gpu_uses[s].add(GpuStreamUse.COMM)
        elif n.ev.kind in (K_MEMCPY, K_MEMSET):
            gpu_uses[s].add(GpuStreamUse.COPY)
        else:
            gpu_uses[s].add(GpuStreamUse.COMPUTE)
    for s, uses in gpu_uses.items():
        if GpuStreamUse.COMM in uses:
            kinds[s] = pb.STREAM_GPU_COMM
        elif uses == {GpuStreamUse.COPY}:
            kinds[s] = pb.STREAM_GPU_COPY
        else:
            kinds[s] = pb.STREAM_GPU_COMPUTE
    return kinds
