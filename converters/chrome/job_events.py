"""One rank's events of a measured Job in the trace's order, made from its stored nodes and
repeat blocks without expanding its graph (what :func:`.job_export.write` streams).

A trace's events are sorted by (pid, tid, ts, -dur, ph, name), ties in the order the events
were made: a rank's boxes in the order of its expanded graph, then its ``ac2g`` flows (each
kernel's in turn: its launch's ``s`` the first time, then its ``f``), then ``ProfilerStep``.
The streamed writer gives each event that whole order as its key and merges sorted sources:
the stored nodes (with the flows of launches that a kernel refers to across a copy's edge),
and per instance of a repeat block its copies and their flows in the body's order. A copy's
key is its body node's with ``ts`` shifted by the instance's time offset, and ``ts`` is a
strictly increasing function of the time in ns, so each body is sorted once. A rank holds its
stored nodes' events and one event per instance, never its expanded graph."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any

from echo_et.ir.job import Job
from echo_et.ir.labels import kineto_category, node_track
from echo_et.ir.repeats import Body, ExpandedNodes, copy_node, instance_deps
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineStream, launch_of, node_event

from .boxes import CORRELATION_BASE, GPU_CATS, JobFacts, RankWriter, Tracks, flow, to_us

_SortKey = tuple[Any, ...]
# (sort key, event, whether it is the ``f`` flow of a launch with more than one kernel)
_Keyed = tuple[_SortKey, dict[str, Any], bool]


def _box_key(box: dict[str, Any], tie: tuple[int, ...]) -> _SortKey:
    return (box["pid"], box["tid"], box["ts"], -box["dur"], "X", box["name"], tie)


def _flow_key(pid: int, tid: int, ts: float, ph: str, tie: tuple[int, ...]) -> _SortKey:
    return (pid, tid, ts, 0, ph, "ac2g", tie)


class RankPlan:
    """What one rank's part of a trace needs before its first event: its graph, tracks,
    first start and latest end, found from the stored nodes and the blocks."""

    def __init__(self, job: Job, rank: int):
        b = job.binding(rank)
        self.job = job
        self.rank = rank
        self.graph = job.graph(b.graph)
        self.offset = int(b.clock_offset_ns)
        self.stored = self.graph.stored_nodes
        self.blocks = self.graph.bodies() if self.graph.has_repeats else []
        self.count = len(self.graph)
        self.streams = {s.id: s for s in self.graph.header.streams}
        self.tstreams: dict[int, TimelineStream] = {}
        self._lanes: dict[tuple[int, int], tuple[bool, str, int, TimelineStream]] = {}
        # The first start, and (start, duration) of the node that ends last, in job-clock ns.
        first: int | None = None
        last: tuple[int, int] | None = None
        for n in self.stored:
            s, d = n.start_ns + self.offset, max(0, n.duration_ns)
            if first is None or s < first:
                first = s
            if last is None or s + d > last[0] + last[1]:
                last = (s, d)
        for body in self.blocks:
            if not body.nodes:
                continue
            lo = min(n.start_ns for n in body.nodes)
            top = max(body.nodes, key=lambda n: n.start_ns + max(0, n.duration_ns))
            for inst in body.block.instances:
                t = int(inst.time_offset_ns) + self.offset
                s, d = top.start_ns + t, max(0, top.duration_ns)
                if first is None or lo + t < first:
                    first = lo + t
                if last is None or s + d > last[0] + last[1]:
                    last = (s, d)
        self.first_ns = first or 0
        self.last = last or (0, 0)

    def lane_of(self, node: pb.Node) -> tuple[bool, str, int, TimelineStream]:
        """(on a GPU, track name, track order, timeline stream) of ``node``'s box: what
        :func:`echo_et.ir.timeline.node_event` gives it, which depends on its kind and stream."""
        key = (node.kind, node.stream)
        got = self._lanes.get(key)
        if got is None:
            track, order, _ = node_track(node, self.streams, {})
            ts = self.tstreams.get(node.stream)
            if ts is None:
                s = self.streams.get(node.stream)
                ts = (TimelineStream(s.id, track, s.kind, s.device, s.native_id) if s is not None
                      else TimelineStream(node.stream, track))
                self.tstreams[node.stream] = ts
            got = (kineto_category(node.kind, ts.kind) in GPU_CATS, track, order, ts)
            self._lanes[key] = got
        return got

    def tracks(self) -> Tracks:
        """The rank's tracks, each with the stream of its first box (copies come after their
        body node and share its kind and stream: the stored nodes in expanded order say it)."""
        tracks: Tracks = {}
        stored = self.stored if not self.blocks else sorted(self.stored, key=lambda n: n.id)
        for n in stored:
            gpu, track, order, ts = self.lane_of(n)
            if (gpu, track) not in tracks:
                tracks[(gpu, track)] = (order, ts)
        return tracks

    def devices(self, facts: JobFacts) -> set[int]:
        """The devices of the rank's GPU boxes (after :meth:`tracks`)."""
        return {facts.device_of(self.rank, ts) for gpu, _, _, ts in self._lanes.values() if gpu}

    def on_gpu(self) -> bool:
        return any(gpu for gpu, _, _, _ in self._lanes.values())


class _BodyPlan:
    """A body as one rank's copies need it: its nodes in box order (``order``), its kernels
    in flow order (``flows``), each node's launch when its dependencies all lie inside the
    body (``static``, 0 otherwise), and the body's launches with the kernels inside each copy
    that they issue (``internal``: launch id -> [kernels, first kernel's id], ``launches``
    in flow order)."""

    __slots__ = ("body", "order", "flows", "static", "outside", "internal", "launches")

    def __init__(self, body: Body):
        self.body = body
        self.order: list[int] = []
        self.flows: list[int] = []
        self.static: list[int] = [0] * len(body.nodes)
        self.outside: list[bool] = [False] * len(body.nodes)
        self.internal: dict[int, list[int]] = {}
        self.launches: list[int] = []

    def launch_in(self, k: int, inst: pb.RepeatInstance, deps_of: dict[int, list[tuple[int, int]]],
                  launch: Callable[[pb.Node], int]) -> int:
        """The launch of body node ``k``'s copy by ``inst``."""
        n = self.body.nodes[k]
        if self.static[k]:
            return self.static[k] + int(inst.id_offset)
        if self.outside[k] or n.id in deps_of:
            return launch(copy_node(self.body, n, inst, deps_of))
        return 0


class RankEvents:
    """One rank's events in the trace's order, streamed from its stored graph and repeat
    blocks (see the module's docstring)."""

    def __init__(self, plan: RankPlan, writer: RankWriter, origin: int):
        self.plan = plan
        self.writer = writer
        self.origin = origin
        self.rank = plan.rank
        job, rank = plan.job, plan.rank
        self.group_of: Callable[[str], pb.ProcessGroup] = lambda key: job.resolve_group(rank, key)
        self.lookup: ExpandedNodes | None = None
        if plan.blocks:
            self.lookup = ExpandedNodes(plan.graph.header, plan.stored, plan.blocks)
            self.kind_of: Callable[[int], int | None] = self.lookup.kind
        else:
            self.kind_of = {n.id: n.kind for n in plan.stored}.get
        self.explicit: dict[int, list[int]] = {}   # launch id -> [kernels, first kernel's position]
        self.bodies: dict[int, _BodyPlan] = {}     # by id(Body)

    def lane(self, node: pb.Node) -> tuple[int, int]:
        gpu, track, _, _ = self.plan.lane_of(node)
        pid, tid, _ = self.writer.lanes[(gpu, track)]
        return pid, tid

    def ts(self, node: pb.Node, time_offset: int = 0) -> float:
        return to_us(node.start_ns + time_offset + self.plan.offset - self.origin)

    def box(self, node: pb.Node, launch: int) -> dict[str, Any]:
        start = node.start_ns + self.plan.offset
        e = node_event(self.rank, node, (start, start + node.duration_ns, None), self.plan.streams,
                       self.plan.tstreams, self.group_of, launch)
        return self.writer.box(e, CORRELATION_BASE + launch if launch else 0)

    def launch(self, node: pb.Node) -> int:
        return launch_of(node, self.kind_of)

    def _refer(self, launch: int, at: int) -> None:
        """A kernel at position ``at`` refers to ``launch`` across a copy's edge (or is stored)."""
        got = self.explicit.get(launch)
        if got is None:
            self.explicit[launch] = [1, at]
        else:
            got[0] += 1
            got[1] = min(got[1], at)

    def _source(self, node_id: int) -> tuple[pb.Node, int, _BodyPlan | None, int]:
        """(node, time offset, body plan, id offset) of expanded node ``node_id`` (a launch)."""
        if self.lookup is None:
            if not hasattr(self, "_by_id"):
                self._by_id = {n.id: n for n in self.plan.stored}   # the last of an id, as kinds
            return self._by_id[node_id], 0, None, 0
        got = self.lookup.source(node_id)
        assert got is not None
        node, body, inst = got
        if body is None or inst is None:
            return node, 0, None, 0
        return node, int(inst.time_offset_ns), self.bodies[id(body)], int(inst.id_offset)

    def kernels(self, launch: int) -> int:
        """How many kernels ``launch`` issued."""
        got = self.explicit.get(launch)
        count = got[0] if got is not None else 0
        if self.lookup is not None:
            node, _, bp, _ = self._source(launch)
            if bp is not None and node.id in bp.internal:
                count += bp.internal[node.id][0]
        return count

    def _stored_items(self, pids: set[int]) -> list[_Keyed]:
        """The stored nodes' boxes and kernels' ``f`` flows on ``pids``; fills ``explicit``
        and the body plans."""
        plan, rank = self.plan, self.rank
        flat = not plan.blocks
        items: list[_Keyed] = []
        for pos, n in enumerate(plan.stored):
            at = pos if flat else n.id
            launch = self.launch(n)
            box = self.box(n, launch)
            if launch and box["cat"] in GPU_CATS:
                self._refer(launch, at)
                if box["pid"] in pids:
                    items.append((_flow_key(box["pid"], box["tid"], box["ts"], "f", (rank, 1, at, 1)),
                                  flow("f", CORRELATION_BASE + launch, box["pid"], box["tid"], box["ts"]), False))
            if box["pid"] in pids:
                items.append((_box_key(box, (rank, 0, at)), box, False))
        for body in plan.blocks:
            bp = _BodyPlan(body)
            self.bodies[id(body)] = bp
            first, last = body.first, body.last
            keys: list[tuple[_SortKey, int]] = []
            flows: list[tuple[_SortKey, int]] = []
            for k, n in enumerate(body.nodes):
                bp.outside[k] = any(not first <= d.id <= last for d in n.deps)
                if not bp.outside[k]:
                    bp.static[k] = self.launch(n)
                gpu = plan.lane_of(n)[0]
                pid, tid = self.lane(n)
                if pid in pids:
                    box = self.box(n, bp.static[k])
                    keys.append(((pid, tid, box["ts"], -box["dur"], box["name"], n.id), k))
                    if gpu:
                        flows.append(((pid, tid, box["ts"], n.id), k))
                if gpu and bp.static[k]:
                    got = bp.internal.setdefault(bp.static[k], [0, n.id])
                    got[0] += 1
            keys.sort(key=lambda t: t[0])
            flows.sort(key=lambda t: t[0])
            bp.order = [k for _, k in keys]
            bp.flows = [k for _, k in flows]
            index = {n.id: k for k, n in enumerate(body.nodes)}
            launches = []
            for b_id, (_, first_kernel) in bp.internal.items():
                ln = body.nodes[index[b_id]]
                pid, tid = self.lane(ln)
                if pid in pids:
                    launches.append(((pid, tid, self.ts(ln), first_kernel), index[b_id]))
            launches.sort(key=lambda t: t[0])
            bp.launches = [k for _, k in launches]
            # Kernels whose launch an instance's own dependencies decide: referred across the edge.
            dynamic = [k for k, n in enumerate(body.nodes) if not bp.static[k] and plan.lane_of(n)[0]]
            for inst in body.block.instances:
                deps_of = instance_deps(inst)
                off = int(inst.id_offset)
                for k in dynamic:
                    launch = bp.launch_in(k, inst, deps_of, self.launch)
                    if launch:
                        self._refer(launch, body.nodes[k].id + off)
        # The ``s`` flows of the launches referred to across an edge (or by stored kernels).
        for launch, (_, first_kernel) in self.explicit.items():
            node, toff, bp_of, off = self._source(launch)
            if bp_of is not None and node.id in bp_of.internal:
                first_kernel = min(first_kernel, bp_of.internal[node.id][1] + off)
            pid, tid = self.lane(node)
            if pid in pids:
                ts = self.ts(node, toff)
                items.append((_flow_key(pid, tid, ts, "s", (rank, 1, first_kernel, 0)),
                              flow("s", CORRELATION_BASE + launch, pid, tid, ts), False))
        return [(key, ev, ev["ph"] == "f" and self.kernels(ev["id"] - CORRELATION_BASE) > 1)
                for key, ev, _ in items]

    def _copies(self, bp: _BodyPlan, inst: pb.RepeatInstance) -> Iterator[_Keyed]:
        nodes = bp.body.nodes
        deps_of = instance_deps(inst)
        for k in bp.order:
            c = copy_node(bp.body, nodes[k], inst, deps_of)
            box = self.box(c, bp.launch_in(k, inst, deps_of, self.launch))
            yield _box_key(box, (self.rank, 0, c.id)), box, False

    def _copy_flows(self, bp: _BodyPlan, inst: pb.RepeatInstance) -> Iterator[_Keyed]:
        nodes = bp.body.nodes
        deps_of = instance_deps(inst)
        off, toff = int(inst.id_offset), int(inst.time_offset_ns)
        rank = self.rank
        for k in bp.flows:
            launch = bp.launch_in(k, inst, deps_of, self.launch)
            if launch:
                n = nodes[k]
                pid, tid = self.lane(n)
                ts = self.ts(n, toff)
                multi = self.kernels(launch) > 1
                yield (_flow_key(pid, tid, ts, "f", (rank, 1, n.id + off, 1)),
                       flow("f", CORRELATION_BASE + launch, pid, tid, ts), multi)

    def _copy_launches(self, bp: _BodyPlan, inst: pb.RepeatInstance) -> Iterator[_Keyed]:
        """The ``s`` flows of a copy's launches whose kernels are all inside copies (a stream
        of its own: the launches' lanes are not the kernels')."""
        nodes = bp.body.nodes
        off, toff = int(inst.id_offset), int(inst.time_offset_ns)
        rank = self.rank
        for k in bp.launches:
            n = nodes[k]
            launch = n.id + off
            if launch in self.explicit:
                continue   # with the stored items
            pid, tid = self.lane(n)
            ts = self.ts(n, toff)
            yield (_flow_key(pid, tid, ts, "s", (rank, 1, bp.internal[n.id][1] + off, 0)),
                   flow("s", CORRELATION_BASE + launch, pid, tid, ts), False)

    def events(self, pids: set[int], step: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
        """The rank's events on processes ``pids`` in the trace's order; ``step``: its
        ``ProfilerStep`` box (None when it is on none of them)."""
        items = self._stored_items(pids)
        if step is not None:
            items.append((_box_key(step, (self.rank, 2)), step, False))
        items.sort(key=lambda t: t[0])
        streams: list[Iterator[_Keyed]] = [iter(items)]
        del items
        for bp in self.bodies.values():
            for inst in bp.body.block.instances:
                streams.append(self._copies(bp, inst))
                streams.append(self._copy_flows(bp, inst))
                streams.append(self._copy_launches(bp, inst))
        # The ``f`` flows of a launch with several kernels: once per (launch, lane, time), the
        # first in the trace's order, as the whole writer keeps them.
        seen: set[tuple[int, int, int, float]] = set()
        for _, ev, multi in heapq.merge(*streams, key=lambda t: t[0]):
            if multi:
                k = (ev["id"], ev["pid"], ev["tid"], ev["ts"])
                if k in seen:
                    continue
                seen.add(k)
            yield ev
