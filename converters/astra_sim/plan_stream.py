"""The export plan of an untimed graph made node by node as it is read (a *streamed* plan):
what the meta-device tracer writes, repeat blocks and all, never expanded in memory."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.schema import collective_name, pb

from .mapping import mapping_label
from .plan_classes import LANE_OF, classify, empty_stats, graph_kinds
from .planned import COLL, COMM, COMP, GPU, HOST, P2P, RECV, PlannedNode


class UntimedStream:
    """The planner's ``plan_untimed`` node by node, for an untimed graph whose dependencies all
    point back (``Graph.deps_point_back``): its program order is then the id order, and
    every planned node depends only on planned nodes before it, so the plan is the expanded
    graph streamed in id order (``Graph.iter_nodes``) and no topological sort is needed.
    What it holds is the id map a dependency is resolved through (per node: its id, its
    planned index, whether it is host work: 17 bytes), not the nodes; the same plan as
    the planner's ``plan_untimed`` followed by its ``finish``."""

    def __init__(self, graph: Graph, group_sizes: dict[str, int]):
        self.graph = graph
        self.group_sizes = group_sizes
        stored = graph.stored_nodes   # a copy has its body node's kind and stream
        self.host_streams, self.cpu_only = graph_kinds(stored, group_sizes)
        self.origin = min((n.start_ns for n in stored), default=0)
        classes = [(n, classify(n, self.host_streams, group_sizes)) for n in stored]
        colls = [n for n, c in classes if c in ("comm", "block") and n.kind == pb.KIND_COLLECTIVE]
        self.coll_groups = frozenset(n.collective.group for n in colls)
        self.has_all_to_all = any(n.collective.type == pb.COLL_ALL_TO_ALL for n in colls)
        self.mapped: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.stats: dict[str, int] = {}

    def start_node(self) -> PlannedNode:
        return PlannedNode(0, COMP, HOST, None, "start (rank offset)", -1, -1, [], "start offset->COMP_NODE")

    def plan(self) -> Iterator[PlannedNode]:
        mapped: dict[str, int] = {}
        dropped: dict[str, int] = {}
        start = self.start_node()
        mapped[start.label] = 1
        yield start
        host_streams, group_sizes = self.host_streams, self.group_sizes
        host_label = "host compute->COMP_NODE" if self.cpu_only else "host time->COMP_NODE"
        ids = array("q")          # node ids in id order: a dependency's position by bisection
        outs = array("q")         # planned index per position (-1: folded, see fold_out)
        is_host = bytearray()
        fold_out: dict[int, set[int]] = {}
        last: dict[str, int] = {HOST: 0}
        last_coll: dict[str, int] = {}
        last_on_stream: dict[int, int] = {}
        index = 0
        busy = kept = 0
        bisect_left = bisect.bisect_left
        for n in self.graph.iter_nodes():
            pos = len(ids)
            cls = classify(n, host_streams, group_sizes)
            busy += n.duration_ns
            ps: list[int] = []
            if cls != "host" and n.stream in last_on_stream:
                ps.append(last_on_stream[n.stream])
            last_on_stream[n.stream] = pos
            for d in n.deps:
                if d.id == n.id:
                    continue
                j = bisect_left(ids, d.id)
                if j == pos or ids[j] != d.id:
                    raise EchoError(f"node {n.id} ({n.name}): dependency on missing node {d.id}")
                if d.kind == pb.DEP_CONTROL and not (is_host[j] and cls != "host"):
                    continue
                ps.append(j)
            deps: set[int] = set()
            for j in ps:
                o = outs[j]
                if o < 0:
                    deps |= fold_out[j]
                else:
                    deps.add(o)
            ids.append(n.id)
            is_host.append(cls == "host")
            if cls == "fold":
                outs.append(-1)
                fold_out[pos] = deps
                key = f"{collective_name(n.collective.type)}(one-rank group)"
                dropped[key] = dropped.get(key, 0) + 1
                continue
            lane = LANE_OF[cls]
            if lane in last:
                deps.add(last[lane])
            if not deps:
                deps.add(0)
            coll = lane == COMM and n.kind == pb.KIND_COLLECTIVE
            if coll:
                prev = last_coll.get(n.collective.group)
                if prev is not None:
                    deps.add(prev)
            if lane == HOST:
                role, label = COMP, host_label
            else:
                role = COMP if lane == GPU else COLL if n.kind == pb.KIND_COLLECTIVE else P2P
                label = mapping_label(n) if cls != "solo" else \
                    f"{collective_name(n.collective.type)}(one-rank group)->COMP_NODE"
            index += 1
            pn = PlannedNode(index, role, lane, n, n.name or f"node{n.id}", 0,
                             n.duration_ns if role == COMP else 0, sorted(deps), label)
            outs.append(index)
            if lane != RECV:
                last[lane] = index
            if role == COLL:
                last_coll[n.collective.group] = index
            kept += pn.duration_ns if role == COMP else n.duration_ns
            mapped[label] = mapped.get(label, 0) + 1
            yield pn
        stats = empty_stats()
        stats["busy_ns"], stats["lost_busy_ns"] = busy, max(0, busy - kept)
        self.mapped, self.dropped, self.stats = mapped, dropped, stats
