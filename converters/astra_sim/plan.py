"""How one echo-et graph becomes the node list of an ASTRA-sim rank file, keeping its time.

ASTRA-sim runs, per rank, at most one CPU compute node, one GPU compute node and one
communication node (collective or send) at a time; receives are not limited
(``HardwareResource``; checked on the real binaries, current and legacy reader alike). A node
starts as soon as its ``data_deps`` are done and its resource is free, with no gap. The
planner maps the IR's streams onto those *lanes* so that, when everything runs as measured,
every exported node starts at its measured time:

``host`` lane
    The host threads' time: the union of every host thread's timeline, from the rank's first
    measured start to its last host boundary, cut only where a dependency attaches (a launch,
    a wait, a collective issued or waited for); the pieces between cuts are COMP nodes with
    their measured length (host operators are *merged* into them, counted in ``merged``).
    A wait for the device (a sync node, or a blocking communication call of a host thread)
    is not a fixed length: the measured wait is cut out and replaced by a zero-length *join*
    node that depends on what was waited for, so the wait grows or shrinks with the work it
    waits on. Several host threads share one lane: a wait on one thread is cut out only where
    no other thread has a boundary.
``gpu`` lane
    Kernels, copies and kernels of unknown communication libraries of every device stream,
    in measured start order: ASTRA-sim runs one GPU compute node at a time, so where kernels
    of different streams overlapped, the later one is *clipped* to start when the earlier
    ended (the lane's busy time stays the union of the kernels'), and a kernel entirely
    covered by another is *merged* into it. Idle GPU time between a kernel and the next one
    that waited for it is added to the earlier kernel; a kernel that waited for its launch
    depends on the host lane cut at its measured start (the launch latency stays host time).
``comm`` lane
    Collectives and sends in measured start order (ASTRA-sim runs one at a time), each group's
    collectives also chained in their ``seq`` order.
``recv``
    Receives: not limited by ASTRA-sim, ordered only by their stream and dependencies.

In a CPU-only graph (no launches, no device kernels: a gloo or ex-situ trace) the host
operators *are* the compute: the host lane is written as GPU compute nodes
(``is_cpu_op=false``), which keeps ASTRA-sim master's statistics (they fail on CPU nodes).
Every rank starts with a ``start`` node whose length is the rank's measured start offset.

A dependency that the measured times contradict (its node ended more than 1 µs after the
dependent one started) is dropped, as echo-et's simulator drops it, and counted.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.intervals import merge_intervals
from echo_et.ir.schema import collective_name, node_kind_name, pb

from .mapping import mapping_label
from .plan_classes import LANE_OF, classify, empty_stats, graph_kinds
from .plan_stream import UntimedStream
from .planned import COLL, COMM, COMP, GPU, HOST, P2P, RECV, GraphPlan, PlannedNode

ACAUSAL_TOLERANCE_NS = 1000
_NEG = -(1 << 62)


class _Node:
    """Planning state of one IR node."""

    __slots__ = ("i", "n", "cls", "preds", "hpreds", "out", "host_t", "end")

    def __init__(self, i: int, n: pb.Node, cls: str):
        self.i = i
        self.n = n
        # host: on a host thread; gpu: device compute; solo: collective of a one-rank group
        # (kept as compute); comm / recv: communication of a device stream; block /
        # block-recv: communication a host thread blocks in; fold: no time, no counterpart
        self.cls = cls
        self.preds: list[int] = []   # non-host predecessors (indices into the graph's nodes)
        self.hpreds: list[int] = []  # host cut times this node waits for
        self.out: set[int] = set()   # planned indices a dependent must wait for
        self.host_t: int | None = None  # host cut a dependent must wait for (folded nodes)
        self.end = 0                 # exported end (measured time)


def _label(s: _Node) -> str:
    if s.cls == "solo":
        return f"{collective_name(s.n.collective.type)}(one-rank group)->COMP_NODE"
    return mapping_label(s.n)


class _Planner:
    def __init__(self, graph: Graph, group_sizes: dict[str, int], merge: dict[str, frozenset[int]] | None = None):
        self.graph = graph
        self.group_sizes = group_sizes
        self.merge = merge or {}   # group key -> seqs merged into the previous collective of the group
        nodes = list(graph.nodes)
        self.nodes = nodes
        self.index = {n.id: i for i, n in enumerate(nodes)}
        if len(self.index) != len(nodes):
            raise EchoError(f"graph {graph.id}: node ids are not unique")
        self.host_streams, self.cpu_only = graph_kinds(nodes, group_sizes)
        self.timed = any(n.start_ns for n in nodes) and len({n.start_ns for n in nodes}) > 1
        self.origin = min((n.start_ns for n in nodes), default=0)
        self.planned: list[PlannedNode] = []
        self.merged: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.stats: dict[str, int] = empty_stats()
        self.sources: dict[int, list[int]] = {}   # host time -> planned indices waiting for the host there
        self.waits: list[tuple[int, int, int]] = []  # (start, end, host stream) of removable waits
        self._pending_sinks: list[tuple[int, list[int]]] = []  # (host time, waited node indices)
        self.stats_wait: dict[int, int] = {}   # join node index -> length of the wait it replaces
        self.st: list[_Node] = []

    def count(self, d: dict[str, int], key: str, k: int = 1) -> None:
        d[key] = d.get(key, 0) + k

    # -- classification ---------------------------------------------------------------------
    def classify(self) -> None:
        for i, n in enumerate(self.nodes):
            self.st.append(_Node(i, n, classify(n, self.host_streams, self.group_sizes)))

    def ref_time(self, p: pb.Node, launch: bool) -> int:
        return p.start_ns if launch else p.start_ns + p.duration_ns

    def predecessors(self) -> None:
        """Non-host predecessors and host cut times of every non-host node; the host's waits."""
        nodes, st, index = self.nodes, self.st, self.index
        last_on_stream: dict[int, int] = {}
        order = sorted(range(len(nodes)), key=lambda i: nodes[i].id)
        tol = ACAUSAL_TOLERANCE_NS if self.timed else 1 << 62
        for i in order:
            s = st[i]
            n = s.n
            if s.cls == "host":
                self._host_waits(s)
                continue
            if s.cls not in ("block", "block-recv"):
                prev = last_on_stream.get(n.stream)
                if prev is not None:
                    s.preds.append(prev)
                last_on_stream[n.stream] = i
            for d in n.deps:
                if d.id == n.id:
                    continue
                j = index.get(d.id)
                if j is None:
                    raise EchoError(f"node {n.id} ({n.name}): dependency on missing node {d.id}")
                p = st[j]
                if p.cls == "host":
                    launch = d.kind in (pb.DEP_LAUNCH, pb.DEP_CONTROL)
                    t = self.ref_time(p.n, launch)
                    if t > n.start_ns + tol:
                        self.stats["acausal_deps_dropped"] += 1
                        continue
                    s.hpreds.append(t)
                    continue
                if d.kind == pb.DEP_CONTROL:
                    continue
                if p.n.start_ns + p.n.duration_ns > n.start_ns + tol:
                    self.stats["acausal_deps_dropped"] += 1
                    continue
                s.preds.append(j)
            if s.cls in ("block", "block-recv"):
                s.hpreds.append(n.start_ns)

    def _host_waits(self, s: _Node) -> None:
        """A host node waiting for non-host work: a sync waits at its end, anything else at
        its start."""
        n = s.n
        waited: list[int] = []
        end = n.start_ns + n.duration_ns
        is_sync = n.kind == pb.KIND_SYNC
        limit = (end if is_sync else n.start_ns) + (ACAUSAL_TOLERANCE_NS if self.timed else 1 << 62)
        for d in n.deps:
            if d.kind == pb.DEP_CONTROL or d.id == n.id:
                continue
            j = self.index.get(d.id)
            if j is None:
                raise EchoError(f"node {n.id} ({n.name}): dependency on missing node {d.id}")
            p = self.st[j]
            if p.cls == "host":
                continue
            if p.n.start_ns + p.n.duration_ns > limit:
                self.stats["acausal_deps_dropped"] += 1
                continue
            waited.append(j)
        if not waited:
            return
        if is_sync:
            w = max(self.nodes[j].start_ns + self.nodes[j].duration_ns for j in waited)
            w = min(max(w, n.start_ns), end)
            if w > n.start_ns:
                self.waits.append((n.start_ns, w, n.stream))
        else:
            w = n.start_ns
        self._sink_later(w, waited)

    def _sink_later(self, t: int, waited: list[int]) -> None:
        # Resolved to planned indices after the lanes are planned.
        self._pending_sinks.append((t, waited))

    # -- lanes ------------------------------------------------------------------------------
    def lane_order(self) -> list[int]:
        """Non-host nodes in a topological order, earliest measured start first."""
        st = self.st
        todo = [s.i for s in st if s.cls != "host"]
        indeg = {i: 0 for i in todo}
        children: dict[int, list[int]] = {}
        for i in todo:
            for p in set(st[i].preds):
                indeg[i] += 1
                children.setdefault(p, []).append(i)
        heap = [(st[i].n.start_ns, st[i].n.id, i) for i in todo if indeg[i] == 0]
        heapq.heapify(heap)
        out: list[int] = []
        while heap:
            _, _, i = heapq.heappop(heap)
            out.append(i)
            for c in children.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(heap, (st[c].n.start_ns, st[c].n.id, c))
        if len(out) != len(todo):
            stuck = min((i for i in todo if indeg[i] > 0), key=lambda i: st[i].n.id)
            n = st[stuck].n
            raise EchoError(f"node {n.id} ({n.name}): its dependencies and its stream order form a cycle, "
                            "so no program order exists to export")
        return out

    def new(self, role: str, lane: str, node: pb.Node | None, name: str, start: int, end: int,
            deps, label: str) -> PlannedNode:
        pn = PlannedNode(len(self.planned), role, lane, node, name, start, end, sorted(set(deps)), label)
        self.planned.append(pn)
        return pn

    def plan_lanes(self) -> None:
        st = self.st
        self.start = self.new(COMP, HOST, None, "start (rank offset)", self.origin - 1, self.origin - 1, (),
                              "start offset->COMP_NODE")
        has_host = bool(self.host_streams)
        last: dict[str, PlannedNode | None] = {GPU: None, COMM: None}
        last_coll: dict[str, PlannedNode] = {}
        cursor = _NEG
        timed = self.timed
        for i in self.lane_order():
            s = st[i]
            n = s.n
            # What the node waits for: planned nodes, a host cut time, and when each is ready.
            deps: set[int] = set()
            ready, gate = _NEG, ""
            host_t: int | None = None
            for t in s.hpreds:
                host_t = t if host_t is None else max(host_t, t)
                if t > ready:
                    ready, gate = t, "host"
            for j in s.preds:
                p = st[j]
                deps |= p.out
                if p.host_t is not None:
                    host_t = p.host_t if host_t is None else max(host_t, p.host_t)
                    if p.host_t > ready:
                        ready, gate = p.host_t, "host"
                if p.end > ready:
                    ready, gate = p.end, "other"
            if s.cls == "fold":
                s.out, s.host_t, s.end = deps, host_t, max(ready, n.start_ns + n.duration_ns)
                self.count(self.dropped, f"{collective_name(n.collective.type)}(one-rank group)")
                continue
            lane = LANE_OF[s.cls]
            lp = last.get(lane)
            if lp is not None:
                deps.add(lp.index)
                if lp.end_ns >= ready:  # on a tie the lane decides: the gap stays on the lane
                    ready, gate = lp.end_ns, "lane"
            if s.cls in ("comm", "block") and n.kind == pb.KIND_COLLECTIVE:
                prev = last_coll.get(n.collective.group)
                if prev is not None:
                    deps.add(prev.index)
                    if prev.end_ns > ready:
                        ready, gate = prev.end_ns, "lane"
            if ready == _NEG:
                ready, gate = self.origin, "host"
                host_t = self.origin
            if (s.cls in ("comm", "block") and n.kind == pb.KIND_COLLECTIVE
                    and n.collective.seq in self.merge.get(n.collective.group, ())):
                self._merge_into_previous(s, i, deps, host_t, last_coll.get(n.collective.group), lp, has_host)
                continue
            start, end = n.start_ns, n.start_ns + n.duration_ns
            if lane == GPU:
                if timed and lp is not None and end <= cursor and (n.duration_ns > 0 or start < cursor):
                    # Entirely covered by the kernel before it on the lane: merged into it.
                    self.count(self.merged, f"{node_kind_name(n.kind)} (covered by a concurrent kernel)")
                    self.stats["gpu_clipped_ns"] += n.duration_ns
                    s.out, s.end = {lp.index}, lp.end_ns
                    continue
                if timed and start < cursor:
                    self.stats["gpu_clipped_ns"] += cursor - start
                    start = cursor
            elif lane == COMM and timed and lp is not None and start < lp.end_ns:
                # Ran concurrently with the previous communication (another stream or thread):
                # ASTRA-sim runs one at a time.
                self.stats["comm_serialised"] += 1
                self.stats["comm_serialised_ns"] += lp.end_ns - start
                start = lp.end_ns
            gap = start - ready if timed else 0
            if gap > 0:
                if gate == "host" and has_host:
                    host_t = start
                elif gate == "lane" and lane == GPU and lp is not None:
                    lp.end_ns = start
                    self.stats["gpu_gaps_added_ns"] += gap
                elif lane == GPU:
                    start = ready
                    self.stats["gpu_gaps_added_ns"] += gap
                else:
                    self.stats["comm_gaps_dropped_ns"] += gap
            if not has_host and host_t is not None:
                host_t = None
                deps.add(self.start.index)
            role = COMP if lane == GPU else (COLL if n.kind == pb.KIND_COLLECTIVE else P2P)
            if lane != GPU:
                end = max(end, start)
            pn = self.new(role, lane, n, n.name or f"node{n.id}", start, end, deps, _label(s))
            if host_t is not None:
                self.sources.setdefault(host_t, []).append(pn.index)
            s.out, s.end = {pn.index}, end
            if lane == GPU:
                cursor = end
                last[GPU] = pn
            elif lane == COMM:
                last[COMM] = pn
                if n.kind == pb.KIND_COLLECTIVE:
                    last_coll[n.collective.group] = pn
            if s.cls in ("block", "block-recv"):
                # The host thread blocks in this call: its wait is cut out of the host lane.
                self.waits.append((n.start_ns, n.start_ns + n.duration_ns, n.stream))
                self._pending_sinks.append((n.start_ns + n.duration_ns, [i]))

    def _merge_into_previous(self, s: _Node, i: int, deps: set[int], host_t: int | None,
                             prev: PlannedNode | None, lp: PlannedNode | None, has_host: bool) -> None:
        """A collective that ran concurrently with the previous one of its group (gloo runs
        them on several worker threads; ASTRA-sim runs one communication node at a time):
        the two become one collective of the summed bytes, waiting for what either waited
        for. Every member of the group merges the same pair (chosen by the exporter)."""
        n = s.n
        if prev is None or prev is not lp:
            raise EchoError(f"node {n.id} ({n.name}): cannot merge this collective into the previous one of "
                            "its group: other communication ran between them")
        deps.discard(prev.index)
        if not has_host and host_t is not None:
            host_t = None
            deps.add(self.start.index)
        end = n.start_ns + n.duration_ns
        self.stats["comm_merged"] += 1
        self.stats["comm_merged_ns"] += max(0, min(prev.end_ns, end) - n.start_ns)
        prev.deps = sorted(set(prev.deps) | deps)
        prev.end_ns = max(prev.end_ns, end)
        prev.merged.append(n)
        self.count(self.merged, f"{collective_name(n.collective.type)} (concurrent with the previous one of "
                                "its group: one collective of the summed bytes)")
        if host_t is not None:
            self.sources.setdefault(host_t, []).append(prev.index)
        s.out, s.end = {prev.index}, prev.end_ns
        if s.cls == "block":
            self.waits.append((n.start_ns, end, n.stream))
            self._pending_sinks.append((end, [i]))

    # -- host lane --------------------------------------------------------------------------
    def plan_host(self) -> None:
        st = self.st
        host_nodes = [s.n for s in st if s.cls == "host"]
        for s in st:
            if s.cls == "host":
                self.count(self.merged, f"{node_kind_name(s.n.kind)} (into host segments)")
        sinks: dict[int, set[int]] = {}
        for t, waited in self._pending_sinks:
            dst = sinks.setdefault(t, set())
            for j in waited:
                dst |= st[j].out
        if not self.host_streams:
            return
        ends = [n.start_ns + n.duration_ns for n in host_nodes]
        host_end = max([*ends, *self.sources, *sinks, self.origin])
        # Boundaries of each host thread, to keep another thread's work out of a removed wait.
        bounds_by_stream: dict[int, list[int]] = {}
        for n in host_nodes:
            b = bounds_by_stream.setdefault(n.stream, [])
            b.append(n.start_ns)
            b.append(n.start_ns + n.duration_ns)
        for b in bounds_by_stream.values():
            b.sort()
        src_times = sorted(self.sources)
        removed: list[tuple[int, int]] = []
        for a, b, stream in sorted(self.waits):
            lo = a
            k = bisect.bisect_right(src_times, a)
            while k < len(src_times) and src_times[k] < b:
                lo = max(lo, src_times[k])
                k += 1
            for other, bb in bounds_by_stream.items():
                if other == stream:
                    continue
                k = bisect.bisect_left(bb, b) - 1
                if k >= 0 and bb[k] > lo:
                    lo = bb[k]
            if removed and lo < removed[-1][1]:
                lo = removed[-1][1]
            if lo < b:
                removed.append((lo, b))
        # Sinks inside a removed wait join it at its end.
        starts = [r[0] for r in removed]
        moved: dict[int, set[int]] = {}
        for t, waited in sinks.items():
            k = bisect.bisect_right(starts, t) - 1
            if k >= 0 and removed[k][0] < t < removed[k][1]:
                t = removed[k][1]
            moved.setdefault(t, set()).update(waited)
        sinks = moved
        cuts = {self.origin, host_end, *self.sources, *sinks}
        for a, b in removed:
            cuts.add(a)
            cuts.add(b)
        points = sorted(c for c in cuts if c >= self.origin)
        removed_at = {a: b for a, b in removed}
        node_ending_at: dict[int, int] = {self.origin: self.start.index}
        prev = self.start.index
        label = "host time->COMP_NODE" if not self.cpu_only else "host compute->COMP_NODE"
        used: set[int] = set()   # sink times already joined
        k = 0
        while k < len(points) - 1:
            a = points[k]
            extra = set() if a in used else sinks.get(a, set())
            used.add(a)
            if a in removed_at:
                b = removed_at[a]
                deps = {prev} | sinks.get(b, set()) | extra
                used.add(b)
                pn = self.new(COMP, HOST, None, "host waits", b, b, deps, "host wait (join)->COMP_NODE")
                self.stats_wait[pn.index] = b - a
                self.stats["host_waits_elastic"] += 1
                self.stats["host_wait_ns_elastic"] += b - a
                while points[k] < b:
                    k += 1
            else:
                b = points[k + 1]
                pn = self.new(COMP, HOST, None, "host", a, b, {prev} | extra, label)
                k += 1
            prev = pn.index
            node_ending_at[b] = prev
        last_t = points[-1]
        if sinks.get(last_t) and last_t not in used:
            pn = self.new(COMP, HOST, None, "host waits", last_t, last_t, {prev} | sinks[last_t],
                          "host wait (join)->COMP_NODE")
            node_ending_at[last_t] = pn.index
        for t, waiting in self.sources.items():
            src = node_ending_at.get(t)
            if src is None:
                raise EchoError(f"graph {self.graph.id}: no host cut at {t} ns (internal)")
            for w in waiting:
                pn = self.planned[w]
                pn.deps = sorted(set(pn.deps) | {src})

    # -- graphs without measured times --------------------------------------------------------
    def plan_untimed(self) -> None:
        """No timeline to cut (every start is the same, as in SimAI workloads or Chakra files
        from the PyTorch converter): each node is one node of its lane, in program order,
        with its own duration (Chakra's host durations are exclusive, so they add up)."""
        st, nodes, index = self.st, self.nodes, self.index
        self.start = self.new(COMP, HOST, None, "start (rank offset)", -1, -1, (), "start offset->COMP_NODE")
        preds: dict[int, list[int]] = {}
        last_on_stream: dict[int, int] = {}
        for i in sorted(range(len(nodes)), key=lambda i: nodes[i].id):
            n = nodes[i]
            ps = []
            if st[i].cls != "host" and n.stream in last_on_stream:
                ps.append(last_on_stream[n.stream])
            last_on_stream[n.stream] = i
            for d in n.deps:
                j = index.get(d.id)
                if j is None:
                    raise EchoError(f"node {n.id} ({n.name}): dependency on missing node {d.id}")
                if j == i or (d.kind == pb.DEP_CONTROL and not (st[j].cls == "host" and st[i].cls != "host")):
                    continue
                ps.append(j)
            preds[i] = ps
        indeg = {i: 0 for i in preds}
        children: dict[int, list[int]] = {}
        for i, ps in preds.items():
            for p in set(ps):
                indeg[i] += 1
                children.setdefault(p, []).append(i)
        heap = [(nodes[i].id, i) for i, k in indeg.items() if k == 0]
        heapq.heapify(heap)
        last: dict[str, PlannedNode] = {HOST: self.start}
        last_coll: dict[str, PlannedNode] = {}
        done = 0
        while heap:
            _, i = heapq.heappop(heap)
            done += 1
            for c in children.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(heap, (nodes[c].id, c))
            s, n = st[i], st[i].n
            deps: set[int] = set()
            for j in preds[i]:
                deps |= st[j].out
            if s.cls == "fold":
                s.out = deps
                self.count(self.dropped, f"{collective_name(n.collective.type)}(one-rank group)")
                continue
            lane = LANE_OF[s.cls]
            if lane in last:
                deps.add(last[lane].index)
            if not deps:
                deps.add(self.start.index)
            if lane in (COMM,) and n.kind == pb.KIND_COLLECTIVE:
                prev = last_coll.get(n.collective.group)
                if prev is not None:
                    deps.add(prev.index)
            if lane == HOST:
                role, label = COMP, ("host compute->COMP_NODE" if self.cpu_only else "host time->COMP_NODE")
            else:
                role, label = (COMP if lane == GPU else COLL if n.kind == pb.KIND_COLLECTIVE else P2P), _label(s)
            pn = self.new(role, lane, n, n.name or f"node{n.id}", 0, n.duration_ns if role == COMP else 0,
                          deps, label)
            s.out = {pn.index}
            if lane != RECV:
                last[lane] = pn
            if role == COLL:
                last_coll[n.collective.group] = pn
        if done != len(nodes):
            stuck = min((i for i, k in indeg.items() if k > 0), key=lambda i: nodes[i].id)
            n = nodes[stuck]
            raise EchoError(f"node {n.id} ({n.name}): its dependencies and its stream order form a cycle, "
                            "so no program order exists to export")

    # -- output ------------------------------------------------------------------------------
    def finish(self) -> list[PlannedNode]:
        """The planned nodes in a topological order, earliest start first; indices rewritten."""
        planned = self.planned
        n = len(planned)
        indeg = [0] * n
        children: list[list[int]] = [[] for _ in range(n)]
        for pn in planned:
            for d in pn.deps:
                indeg[pn.index] += 1
                children[d].append(pn.index)
        heap = [(planned[i].start_ns, i) for i in range(n) if indeg[i] == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, i = heapq.heappop(heap)
            order.append(i)
            for c in children[i]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(heap, (planned[c].start_ns, c))
        if len(order) != n:
            stuck = next(planned[i] for i in range(n) if indeg[i] > 0)
            what = f"node {stuck.node.id} ({stuck.node.name})" if stuck.node is not None else stuck.name
            raise EchoError(f"graph {self.graph.id} {what}: the exported dependencies form a cycle")
        new_index = {old: k for k, old in enumerate(order)}
        out = []
        for k, old in enumerate(order):
            pn = planned[old]
            pn.index = k
            pn.deps = sorted(new_index[d] for d in pn.deps)
            out.append(pn)
        return out


def _intervals_len(iv: list[tuple[int, int]]) -> int:
    """ns the union of ``iv`` covers."""
    if not iv:
        return 0
    lo, hi = merge_intervals(np.array([s for s, _ in iv], dtype=np.int64), np.array([e for _, e in iv], dtype=np.int64))
    return int((hi - lo).sum())


def _lost_busy(graph: Graph, nodes: list[PlannedNode], waits: list[tuple[int, int]], timed: bool) -> tuple[int, int]:
    """The rank's measured busy time (every node, every stream) and how much of it no exported
    node (nor a wait the export re-creates) covers."""
    if not timed:
        busy = sum(n.duration_ns for n in graph.nodes)
        kept = sum(pn.duration_ns if pn.role == COMP else pn.node.duration_ns for pn in nodes if pn.node is not None)
        kept += sum(pn.duration_ns for pn in nodes if pn.node is None and pn.index != 0)
        return busy, max(0, busy - kept)
    measured = [(n.start_ns, n.start_ns + n.duration_ns) for n in graph.nodes if n.duration_ns > 0]
    covered = [(pn.start_ns, pn.end_ns) for pn in nodes if pn.end_ns > pn.start_ns and pn.index != 0]
    covered += [(pn.node.start_ns, pn.node.start_ns + pn.node.duration_ns) for pn in nodes
                if pn.role != COMP and pn.node is not None]
    covered += waits
    busy = _intervals_len(measured)
    return busy, max(0, _intervals_len(measured + covered) - _intervals_len(covered))


def _fold_host(nodes: list[PlannedNode]) -> tuple[list[PlannedNode], int]:
    """Leave the host lane out: its order survives as dependencies between the nodes it
    linked (a kernel launched after a wait depends on what the wait waited for)."""
    reach: dict[int, set[int]] = {}
    out: list[PlannedNode] = []
    folded = 0
    for pn in nodes:
        deps: set[int] = set()
        for d in pn.deps:
            deps |= reach[d] if d in reach else {d}
        if pn.lane == HOST and pn.index != 0:
            reach[pn.index] = deps
            folded += 1
            continue
        pn.deps = sorted(deps)
        out.append(pn)
    new_index = {pn.index: k for k, pn in enumerate(out)}
    for k, pn in enumerate(out):
        pn.index = k
        pn.deps = sorted({new_index[d] for d in pn.deps})
    return out, folded


_MERGEABLE = frozenset({pb.COLL_ALL_REDUCE, pb.COLL_ALL_GATHER, pb.COLL_REDUCE_SCATTER, pb.COLL_REDUCE,
                        pb.COLL_BROADCAST})


def concurrent_collectives(graph: Graph, group_sizes: dict[str, int]) -> dict[str, frozenset[int]]:
    """Collectives (by group key, seq) that started, in measured time, before the previous
    collective of their group ended, on another stream or thread, with no other
    communication between them: gloo runs a process group's collectives on several worker
    threads at once (DDP's gradient buckets), ASTRA-sim runs one communication node at a
    time. Such a collective can be merged into the previous one (same type, summed bytes);
    the exporter merges it only where every member of the group ran the pair concurrently."""
    if graph.starts_uniform():   # untimed: nothing ran concurrently (found without expanding)
        return {}
    nodes = graph.nodes
    lane = sorted((n for n in nodes if n.kind == pb.KIND_SEND or (
        n.kind == pb.KIND_COLLECTIVE and group_sizes.get(n.collective.group, 0) > 1)),
        key=lambda n: (n.start_ns, n.id))
    out: dict[str, set[int]] = {}
    for a, b in zip(lane, lane[1:], strict=False):
        if (a.kind == b.kind == pb.KIND_COLLECTIVE and a.collective.group == b.collective.group
                and b.collective.seq == a.collective.seq + 1 and a.collective.type == b.collective.type
                and a.collective.type in _MERGEABLE and a.stream != b.stream
                and b.start_ns < a.start_ns + a.duration_ns):
            out.setdefault(b.collective.group, set()).add(b.collective.seq)
    return {k: frozenset(v) for k, v in out.items()}


def plan_graph(graph: Graph, group_sizes: dict[str, int], *, fold_host: bool = False,
               merge: dict[str, frozenset[int]] | None = None, stream: bool = False) -> GraphPlan:
    """Plan the export of ``graph``; ``group_sizes`` gives the size of the group each key is
    bound to (the same for every rank bound to the graph). ``fold_host`` leaves host time
    out (only the order it imposes stays): for readers whose statistics fail on CPU nodes,
    at the cost of the time, which the plan reports as lost. ``merge`` names, per group
    key, the collectives (by seq) merged into the previous collective of their group
    (:func:`concurrent_collectives` finds them).

    With ``stream``, an untimed graph whose dependencies all point back (what the meta-device
    tracer writes, repeat blocks and all) gets a *streamed* plan: nothing is planned until it
    is read, and each read plans the expanded graph node by node, never holding it. Other
    graphs need the whole graph at once: a measured timeline is cut where any node of any
    stream attaches, lanes are ordered by a topological sort on measured starts, and a
    dependency that points forward needs that sort too; they are planned here, expanded."""
    if (stream and not (fold_host and graph_kinds(graph.stored_nodes, group_sizes)[0])
            and graph.starts_uniform() and graph.deps_point_back()):
        src = UntimedStream(graph, group_sizes)
        host_cpu = bool(src.host_streams) and not src.cpu_only
        return GraphPlan(graph.id, None, {}, {}, {}, {}, host_cpu, src.cpu_only, src.origin,
                         src.has_all_to_all, src.coll_groups, src)
    p = _Planner(graph, group_sizes, merge)
    p.classify()
    waits: list[tuple[int, int]] = []
    if p.timed:
        p.predecessors()
        p.plan_lanes()
        p.plan_host()
        waits = [(pn.start_ns - p.stats_wait.get(pn.index, 0), pn.start_ns) for pn in p.planned
                 if pn.label.startswith("host wait")]
    else:
        p.plan_untimed()
    nodes = p.finish()
    if fold_host and p.host_streams:
        nodes, folded = _fold_host(nodes)
        p.count(p.dropped, "host time (folded)", folded)
        waits = []
    mapped: dict[str, int] = {}
    for pn in nodes:
        mapped[pn.label] = mapped.get(pn.label, 0) + 1
    p.stats["busy_ns"], p.stats["lost_busy_ns"] = _lost_busy(graph, nodes, waits, p.timed)
    host_cpu = bool(p.host_streams) and not p.cpu_only and not fold_host
    has_a2a = any(pn.role == COLL and pn.node.collective.type == pb.COLL_ALL_TO_ALL for pn in nodes)
    coll_groups = frozenset(pn.node.collective.group for pn in nodes if pn.role == COLL)
    return GraphPlan(graph.id, nodes, mapped, p.merged, p.dropped, p.stats, host_cpu, p.cpu_only,
                     p.origin, has_a2a, coll_groups)


__all__ = ["concurrent_collectives", "plan_graph"]
