"""How one echo-et graph becomes the node list of an ASTRA-sim rank file.

ASTRA-sim runs four things well on every reader generation: GPU compute nodes, the four
networked collectives and send/recv. Everything else of the IR is mapped onto those or
folded into dependencies, once per distinct graph (``plan_graph``); the per-rank writer then
only fills in what differs between ranks (process group ids, peers, tags).

Mapping (the ``mapped`` counts of an export use these names):

========================  =====================================================================
IR node                   ASTRA-sim
========================  =====================================================================
compute                   COMP_NODE (GPU), ``duration_micros`` = measured time rounded, >= 1
memcpy, memset            COMP_NODE (GPU): ASTRA-sim has no copy engine, the copy keeps its time
comm_unknown              COMP_NODE (GPU) with the measured time: a kernel of an unknown library
                          has no size or group to simulate, so its traced time is replayed
cpu_op, launch, sync      folded: not emitted, the GPU work they order keeps that order as
                          ``data_deps`` (CPU COMP nodes break ASTRA-sim master's statistics)
all_reduce / all_gather   COMM_COLL_NODE of the same type, ``comm_size`` = per-rank input bytes
reduce_scatter            (never below ``preferred-dataset-splits``)
all_to_all (equal sizes)  COMM_COLL_NODE ALL_TO_ALL
all_to_all (uneven)       one send and one recv per peer with the true per-peer bytes (from the
                          ``in_split_bytes`` attribute, else each rank's input split evenly)
broadcast                 ALL_GATHER of ceil(bytes / group size): the ring traffic of a pipelined
                          broadcast (ASTRA-sim master only replays BROADCAST, untimed by network)
reduce                    REDUCE_SCATTER of the full buffer (same ring traffic as a ring reduce)
gather, scatter           ALL_GATHER of the per-rank shard
barrier                   ALL_REDUCE of ``max(8, splits)`` bytes
any collective on a       folded (nothing to communicate)
one-rank group
send / recv               COMM_SEND_NODE / COMM_RECV_NODE with global ``comm_src``/``comm_dst``
========================  =====================================================================

Ordering: ASTRA-sim has no streams, so each kept node depends on the previous kept node of
its stream and on what its IR dependencies (data, launch, sync; never control) reach
through folded nodes, reduced to the latest node per stream. Collectives of one group key
are also chained in their ``seq`` order, so every member issues them in the same order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.schema import collective_name, node_kind_name, pb

# Roles of a planned node.
COMP = "comp"
COLL = "coll"
P2P = "p2p"

_COMP_KINDS = {
    pb.KIND_COMPUTE: "compute",
    pb.KIND_MEMCPY: "memcpy",
    pb.KIND_MEMSET: "memset",
    pb.KIND_COMM_UNKNOWN: "comm_unknown",
}
_FOLD_KINDS = {pb.KIND_CPU_OP: "cpu_op", pb.KIND_LAUNCH: "launch", pb.KIND_SYNC: "sync"}

# IR collective type -> (Chakra CollectiveCommType value, mapping label).
# Chakra: ALL_REDUCE=0, REDUCE=1, ALL_GATHER=2, GATHER=3, SCATTER=4, BROADCAST=5, ALL_TO_ALL=6,
# REDUCE_SCATTER=7, REDUCE_SCATTER_BLOCK=8, BARRIER=9.
CHAKRA_ALL_REDUCE = 0
CHAKRA_ALL_GATHER = 2
CHAKRA_ALL_TO_ALL = 6
CHAKRA_REDUCE_SCATTER = 7
SUPPORTED_COMM_TYPES = frozenset(
    {CHAKRA_ALL_REDUCE, CHAKRA_ALL_GATHER, CHAKRA_ALL_TO_ALL, CHAKRA_REDUCE_SCATTER}
)
CHAKRA_TYPE_NAMES = {
    CHAKRA_ALL_REDUCE: "ALL_REDUCE",
    CHAKRA_ALL_GATHER: "ALL_GATHER",
    CHAKRA_ALL_TO_ALL: "ALL_TO_ALL",
    CHAKRA_REDUCE_SCATTER: "REDUCE_SCATTER",
}
COLLECTIVE_MAP = {
    pb.COLL_ALL_REDUCE: CHAKRA_ALL_REDUCE,
    pb.COLL_ALL_GATHER: CHAKRA_ALL_GATHER,
    pb.COLL_REDUCE_SCATTER: CHAKRA_REDUCE_SCATTER,
    pb.COLL_ALL_TO_ALL: CHAKRA_ALL_TO_ALL,
    pb.COLL_BROADCAST: CHAKRA_ALL_GATHER,
    pb.COLL_REDUCE: CHAKRA_REDUCE_SCATTER,
    pb.COLL_GATHER: CHAKRA_ALL_GATHER,
    pb.COLL_SCATTER: CHAKRA_ALL_GATHER,
    pb.COLL_BARRIER: CHAKRA_ALL_REDUCE,
}
BARRIER_BYTES = 8


@dataclass
class PlannedNode:
    """One node of the export, before rank-specific fields are known."""

    index: int                 # position in export order (0-based)
    role: str                  # COMP, COLL or P2P
    node: pb.Node              # the IR node it comes from
    deps: list[int] = field(default_factory=list)  # indices of planned nodes
    label: str = ""            # mapping label (``mapped`` counts)


@dataclass
class GraphPlan:
    graph_id: str
    nodes: list[PlannedNode]
    folded: dict[str, int]     # mapping label -> count of IR nodes folded (per rank)
    has_all_to_all: bool


def comm_type_of(node: pb.Node) -> int:
    c = node.collective
    if c.type not in COLLECTIVE_MAP:
        raise EchoError(
            f"node {node.id} ({node.name}): collective type {collective_name(c.type)} "
            "has no ASTRA-sim equivalent"
        )
    return COLLECTIVE_MAP[c.type]


def mapping_label(node: pb.Node) -> str:
    """The name under which a node's mapping is counted."""
    if node.kind in _COMP_KINDS:
        return f"{_COMP_KINDS[node.kind]}->COMP_NODE"
    if node.kind in _FOLD_KINDS:
        return f"{_FOLD_KINDS[node.kind]}->folded"
    if node.kind == pb.KIND_COLLECTIVE:
        name = collective_name(node.collective.type)
        return f"{name}->{CHAKRA_TYPE_NAMES[comm_type_of(node)]}"
    if node.kind == pb.KIND_SEND:
        return "send->COMM_SEND_NODE"
    if node.kind == pb.KIND_RECV:
        return "recv->COMM_RECV_NODE"
    return f"{node_kind_name(node.kind)}->?"


def _execution_preds(graph: Graph) -> dict[int, list[int]]:
    """What each node waits for: the previous node of its stream and every non-control
    dependency."""
    preds: dict[int, list[int]] = {}
    last_on_stream: dict[int, int] = {}
    for n in sorted(graph.nodes, key=lambda n: n.id):
        ps = [d.id for d in n.deps if d.kind != pb.DEP_CONTROL and d.id != n.id]
        prev = last_on_stream.get(n.stream)
        if prev is not None:
            ps.append(prev)
        last_on_stream[n.stream] = n.id
        preds[n.id] = ps
    return preds


def _topological(graph: Graph, preds: dict[int, list[int]]) -> list[pb.Node]:
    by_id = {n.id: n for n in graph.nodes}
    indeg = dict.fromkeys(by_id, 0)
    children: dict[int, list[int]] = {}
    for nid, ps in preds.items():
        for p in set(ps):
            if p not in by_id:
                raise EchoError(f"graph {graph.id} node {nid}: dependency on missing node {p}")
            indeg[nid] += 1
            children.setdefault(p, []).append(nid)
    ready = [i for i, k in indeg.items() if k == 0]
    heapq.heapify(ready)
    order: list[pb.Node] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(by_id[i])
        for c in children.get(i, ()):
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(ready, c)
    if len(order) != len(by_id):
        stuck = min(i for i, k in indeg.items() if k > 0)
        n = by_id[stuck]
        raise EchoError(
            f"graph {graph.id} node {stuck} ({n.name}): its dependencies and its stream order "
            "form a cycle, so no program order exists to export"
        )
    return order


def plan_graph(graph: Graph, group_sizes: dict[str, int]) -> GraphPlan:
    """Plan the export of ``graph``; ``group_sizes`` gives the size of the group each key is
    bound to (the same for every rank bound to the graph)."""
    preds = _execution_preds(graph)
    order = _topological(graph, preds)
    stream_of = {n.id: n.stream for n in graph.nodes}
    planned: list[PlannedNode] = []
    kept_index: dict[int, int] = {}            # IR id -> planned index
    frontier: dict[int, dict[int, int]] = {}   # folded IR id -> {stream: planned index}
    folded: dict[str, int] = {}
    last_coll_on_key: dict[str, int] = {}
    has_a2a = False

    for n in order:
        reach: dict[int, int] = {}
        for p in preds[n.id]:
            if p in kept_index:
                items = ((stream_of[p], kept_index[p]),)
            else:
                items = frontier[p].items()
            for s, idx in items:
                if reach.get(s, -1) < idx:
                    reach[s] = idx
        role = _role(n, group_sizes)
        if role is None:
            label = (mapping_label(n) if n.kind in _FOLD_KINDS
                     else f"{collective_name(n.collective.type)}(one-rank group)->folded")
            folded[label] = folded.get(label, 0) + 1
            frontier[n.id] = reach
            continue
        deps = set(reach.values())
        if role == COLL:
            key = n.collective.group
            if key in last_coll_on_key:
                deps.add(last_coll_on_key[key])
            if n.collective.type == pb.COLL_ALL_TO_ALL:
                has_a2a = True
        idx = len(planned)
        planned.append(PlannedNode(idx, role, n, sorted(deps), mapping_label(n)))
        kept_index[n.id] = idx
        if role == COLL:
            last_coll_on_key[n.collective.group] = idx
    return GraphPlan(graph.id, planned, folded, has_a2a)


def _role(n: pb.Node, group_sizes: dict[str, int]) -> str | None:
    """COMP / COLL / P2P for kept nodes, None for folded ones; raises for unmappable ones."""
    if n.kind in _COMP_KINDS:
        return COMP
    if n.kind in _FOLD_KINDS:
        return None
    if n.kind == pb.KIND_COLLECTIVE:
        comm_type_of(n)  # raises for COLL_UNKNOWN
        if group_sizes.get(n.collective.group, 0) <= 1:
            return None
        return COLL
    if n.kind in (pb.KIND_SEND, pb.KIND_RECV):
        return P2P
    raise EchoError(
        f"node {n.id} ({n.name}): node kind {node_kind_name(n.kind)} has no ASTRA-sim "
        "equivalent (neither compute nor communication); give it a kind before exporting"
    )
