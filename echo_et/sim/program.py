"""A graph compiled once into flat arrays ("items") that the simulator's inner loop walks.

The simulator never touches protobuf nodes in its hot loop. Each distinct graph becomes a
:class:`Program`: an ordered list of *items* per stream, with integer predecessor and
successor lists, the measured gap ("gate") that separates each item from its latest
predecessor, and the measured duration of each item.

Device streams (GPU compute/comm/copy streams, and any stream without host operators,
such as the host-side communication stream of a gloo or ex-situ trace) give one item per
node, in node-id order: one node at a time, no measured gaps kept between them.

Host threads carry nested operators (a CPU op contains other CPU ops, launches and syncs,
linked to their parent by DEP_CONTROL). A host thread is replayed as its *boundary
timeline*: the starts and ends of all its nodes, in nesting order (in time order where
ranges cross instead of nesting, as async ``gloo:send`` spans do), cut the thread into
consecutive segments; each segment is one item whose duration is the measured gap between
its two boundaries. So a launch happens at the same offset inside its operator as measured,
a parent operator ends after its last child plus the measured tail, and:

* a KIND_SYNC node (cudaStreamSynchronize, ...) waits at its *end* boundary for the GPU
  nodes it depends on; its segment keeps only the measured return latency ("tail": end of
  the sync minus the later of its start and the measured end of what it waited for);
* any other host node with a cross-stream dependency waits at its *start* boundary;
* a communication node that is a leaf of a host thread (gloo, CPU-only traces) is a
  rendezvous item spanning its own segment;
* dependencies between nodes of the same thread are implied by the thread order.

Every item starts at ``max over its predecessors p of (time of p + gap_p)``. The
predecessor that decided the measured start (the latest one, in measured time) keeps the
measured gap (``gap = measured start - its measured time``: launch latency, host time
between operators); the others get 0. In replay, with measured durations, every item lands
exactly at its measured time; when the simulation moves a predecessor, an item that was
waiting for its launch but is now waiting for its stream starts right after the stream
frees instead of carrying the old launch latency along. The stream predecessor of the first
item of a stream is the rank's origin (the earliest measured start of the graph). A
DEP_LAUNCH dependency counts from the *start* of the launch call (a kernel can start before
the launch returns), every other dependency from the end of the node it names. DEP_CONTROL
(nesting) is not an execution constraint between host operators; a node of a device-like
stream nested in an operator of another stream (a gloo collective under its ``c10d`` op)
was issued by it and counts it like a launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.schema import node_kind_name, pb

# Item categories (what the time of an item counts as).
CAT_HOST = 0        # host time: operator overhead, launches, gaps between operators
CAT_COMPUTE = 1     # compute kernel (or host compute in a CPU-only graph)
CAT_COPY = 2        # memcpy / memset
CAT_COLL = 3        # collective (rendezvous)
CAT_P2P = 4         # send / recv (rendezvous)
CAT_COMM_OTHER = 5  # communication kernel of an unknown library (measured time, no rendezvous)
CAT_SYNC = 6        # host waits for the device (time = return latency; the wait is computed)
CAT_OTHER = 7       # device node of unknown kind

CAT_NAMES = {
    CAT_HOST: "host",
    CAT_COMPUTE: "compute",
    CAT_COPY: "memcpy",
    CAT_COLL: "collective",
    CAT_P2P: "p2p",
    CAT_COMM_OTHER: "comm_unknown",
    CAT_SYNC: "sync",
    CAT_OTHER: "other",
}
COMM_CATS = frozenset({CAT_COLL, CAT_P2P, CAT_COMM_OTHER})
RENDEZVOUS_CATS = frozenset({CAT_COLL, CAT_P2P})

# A dependency whose measured predecessor ends this much after the dependent node started
# contradicts the trace (a converter guessed it wrong).
ACAUSAL_TOLERANCE_NS = 1000

HOST_KINDS = frozenset({pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC})

DEVICE_CATEGORY = {  # an untimed or device-stream node's item category
    pb.KIND_COMPUTE: CAT_COMPUTE,
    pb.KIND_COLLECTIVE: CAT_COLL,
    pb.KIND_SEND: CAT_P2P,
    pb.KIND_RECV: CAT_P2P,
    pb.KIND_MEMCPY: CAT_COPY,
    pb.KIND_MEMSET: CAT_COPY,
    pb.KIND_COMM_UNKNOWN: CAT_COMM_OTHER,
    pb.KIND_CPU_OP: CAT_HOST,
    pb.KIND_LAUNCH: CAT_HOST,
    pb.KIND_SYNC: CAT_SYNC,
}


_ROOT_SIZED = frozenset({pb.COLL_GATHER, pb.COLL_SCATTER})


@dataclass(frozen=True)
class Rendezvous:
    """What a communication item needs to meet its partners (graph-local terms)."""

    key: str            # graph-local group key
    seq: int            # collective seq in the group, or P2P seq of (group, peer, direction)
    coll_type: int      # CollectiveType (0 for P2P)
    in_bytes: int
    out_bytes: int
    dtype: str
    root: int           # group rank of the root, -1 when none
    peer: int           # P2P: peer's index in the group; -1 for collectives
    is_send: bool

    @property
    def position_matters(self) -> bool:
        """Whether a member's position in its group changes what it does here: its partner
        in a P2P, being the root of a gather or scatter (whose sizes are the root's alone).
        A broadcast or reduce is priced from its size and its group's placement, the same
        for every member whichever is the root, so it leaves members interchangeable
        (:mod:`echo_et.sim.symmetry`)."""
        return self.peer >= 0 or (self.root >= 0 and self.coll_type in _ROOT_SIZED)


class StartPred(NamedTuple):
    """A cross-stream predecessor that gates an item's start: the item starts no earlier
    than ``gap`` ns after the *start* (``from_start``: a launch call, which a kernel may
    outlive) or the *end* of item ``item``.

    ``Program.start_preds`` stores plain ``(item, from_start, gap)`` tuples of this layout,
    because the simulator's inner loop unpacks them (``for item, from_start, gap in
    program.start_preds[i]``) and CPython unpacks an exact tuple about twice as fast as a
    NamedTuple; ``StartPred(*t)`` names one."""

    item: int
    from_start: bool
    gap: int


StartPredTuple = tuple[int, bool, int]   # the stored form of a StartPred


class CollectiveItem(NamedTuple):
    """A collective item: where it meets its group (graph-local key) and its sequence.
    (``Program.collective_items`` stores plain tuples of this layout, unpacked per rank.)"""

    item: int
    key: str
    seq: int


class P2PItem(NamedTuple):
    """A send or recv item: its group key, the peer's position in that group, its sequence
    number on (group, peer, direction) and its direction. (``Program.p2p_items`` stores
    plain tuples of this layout.)"""

    item: int
    key: str
    peer: int
    seq: int
    is_send: bool


@dataclass
class Program:
    """One distinct graph, compiled. Lists (not numpy) because the inner loop indexes them
    one element at a time, which is faster on Python lists. An item is an index into every
    per-item list."""

    graph_id: str
    n_items: int = 0
    stream_of: list[int] = field(default_factory=list)      # dense stream index per item
    stream_prev: list[int] = field(default_factory=list)    # previous item on the same stream, -1 first
    stream_gap: list[int] = field(default_factory=list)     # gap after stream_prev (or the origin)
    start_preds: list[tuple[StartPredTuple, ...]] = field(default_factory=list)  # cross-stream start gates
    end_waits: list[tuple[int, ...]] = field(default_factory=list)  # items whose end a sync's end waits for
    successors: list[tuple[int, ...]] = field(default_factory=list)  # items this one gates
    pred_count: list[int] = field(default_factory=list)     # distinct predecessors of each item
    measured_dur: list[int] = field(default_factory=list)
    measured_start: list[int] = field(default_factory=list)
    category: list[int] = field(default_factory=list)       # CAT_* of each item
    node_of: list[int] = field(default_factory=list)        # index in graph.nodes of the owner, -1 none
    rendezvous: dict[int, Rendezvous] = field(default_factory=dict)  # item -> rendezvous info
    is_rendezvous: list[bool] = field(default_factory=list)  # item meets other ranks
    collective_items: list[tuple[int, str, int]] = field(default_factory=list)         # CollectiveItem layout
    p2p_items: list[tuple[int, str, int, int, bool]] = field(default_factory=list)     # P2PItem layout
    # per node (index in graph.nodes): the items holding its start and end
    node_start_item: list[int] = field(default_factory=list)
    node_end_item: list[int] = field(default_factory=list)
    streams: list[pb.Stream] = field(default_factory=list)  # dense index -> declared stream
    host_stream: list[bool] = field(default_factory=list)
    measured_origin: int = 0     # earliest measured start in the graph
    cpu_only: bool = False       # no GPU work: host operators are the compute
    group_keys: list[str] = field(default_factory=list)
    ordered_keys: frozenset[str] = frozenset()  # keys where member positions matter (Rendezvous.position_matters)
    roots: list[int] = field(default_factory=list)  # items with no predecessor at all
    acausal_deps: int = 0        # dependencies the measured times contradict (dropped unless kept)
    placeholder_comm: int = 0    # communication nodes without a measured time (ex-situ traces)
    untimed: bool = False        # no measured layout (meta-device traces): every gap is 0
    compact: Any = None          # repeat blocks kept (echo_et.sim.blocks.CompactInfo), None when flat

    def add_item(self, stream_k: int, cat: int, owner: int, dur: int) -> int:
        """A new item on dense stream ``stream_k``, owned by node index ``owner`` (-1: none)."""
        it = self.n_items
        self.n_items += 1
        self.stream_of.append(stream_k)
        self.category.append(cat)
        self.node_of.append(owner)
        self.measured_dur.append(max(0, dur))
        return it

    def predecessors(self, item: int) -> set[int]:
        """Every item ``item`` waits for: its stream predecessor, its start gates and, for
        a sync, what its end waits for."""
        preds: set[int] = set()
        if self.stream_prev[item] >= 0:
            preds.add(self.stream_prev[item])
        preds.update(q for q, _, _ in self.start_preds[item])
        preds.update(self.end_waits[item])
        return preds


def _where(graph: Graph | None, node: pb.Node) -> str:
    return f"graph {graph.id if graph is not None else '?'} node {node.id} ({node.name})"


# A start gate while compiling: (item, from_start), before its gap is known.
_Gate = tuple[int, bool]


@dataclass
class _Compilation:
    """What compiling one graph carries between its phases."""

    graph: Graph
    keep_acausal_deps: bool
    prog: Program
    nodes: list[pb.Node] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    kinds: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    durs: list[int] = field(default_factory=list)
    index: dict[int, int] = field(default_factory=dict)      # node id -> index in graph.nodes
    by_stream: dict[int, list[int]] = field(default_factory=dict)  # stream id -> node indices, id order
    stream_ids: list[int] = field(default_factory=list)      # declared order: dense index -> stream id
    # Raw (node-level) dependencies, resolved to items once every item exists.
    start_deps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # item -> [(node idx, dep kind)]
    end_deps: dict[int, list[int]] = field(default_factory=dict)               # item -> [node idx]
    item_mstart: list[int] = field(default_factory=list)     # measured start / end of each item
    item_mend: list[int] = field(default_factory=list)
    gates: list[list[_Gate]] = field(default_factory=list)   # per item, resolved start gates
    waits: list[list[int]] = field(default_factory=list)     # per item, resolved end waits
    untimed: bool = False                                    # durations only (meta-device traces)

    def new_item(self, stream_k: int, cat: int, owner: int, mstart: int, mend: int, mdur: int) -> int:
        it = self.prog.add_item(stream_k, cat, owner, mdur)
        self.item_mstart.append(mstart)
        self.item_mend.append(mend)
        return it

    def gate_time(self, gate: _Gate) -> int:
        """The measured time a gate counts from (the start or the end of its item)."""
        item, from_start = gate
        return self.item_mstart[item] if from_start else self.item_mend[item]


def compile_graph(graph: Graph, *, keep_acausal_deps: bool = False) -> Program:
    """Compile ``graph`` into a :class:`Program`. Raises EchoError on a graph the simulator
    cannot order (a dependency on a later node of the same stream).

    In a timed graph (measured start times, not all 0), a dependency whose predecessor the
    measurement shows finishing after the dependent node started (by more than 1 us) cannot
    have been a real constraint: a converter guessed it wrong. It is dropped and counted in
    ``Program.acausal_deps`` unless ``keep_acausal_deps``."""
    c = _Compilation(graph, keep_acausal_deps, Program(graph_id=graph.id))
    _read_nodes(c)
    _make_items(c)
    _link_stream_order(c.prog)
    _resolve_dependencies(c)
    if any(c.starts) and not c.untimed:
        _drop_acausal(c)
    _measure_gaps(c)
    _link_successors(c.prog)
    _index_rendezvous(c)
    return c.prog


def _read_nodes(c: _Compilation) -> None:
    """Read every node's fields once (protobuf attribute access is the slow part) and
    declare the streams in id order."""
    prog = c.prog
    c.nodes = nodes = c.graph.nodes
    c.ids = [n.id for n in nodes]
    c.kinds = kinds = [n.kind for n in nodes]
    c.starts = [n.start_ns for n in nodes]
    c.durs = [n.duration_ns for n in nodes]
    c.index = {nid: i for i, nid in enumerate(c.ids)}
    for i, n in enumerate(nodes):
        c.by_stream.setdefault(n.stream, []).append(i)
    declared = {s.id: s for s in c.graph.header.streams}
    c.stream_ids = sorted(c.by_stream)
    for sid in c.stream_ids:
        c.by_stream[sid].sort(key=c.ids.__getitem__)
        prog.streams.append(declared.get(sid) or pb.Stream(id=sid, name=f"stream {sid}"))
        prog.host_stream.append(any(kinds[i] in HOST_KINDS for i in c.by_stream[sid]))
    device_compute = any(
        kinds[i] in (pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET)
        for k, sid in enumerate(c.stream_ids) if not prog.host_stream[k] for i in c.by_stream[sid]
    )
    prog.cpu_only = pb.KIND_LAUNCH not in kinds and not device_compute
    prog.measured_origin = min(c.starts, default=0)
    prog.node_start_item = [-1] * len(nodes)
    prog.node_end_item = [-1] * len(nodes)
    # An untimed graph (a meta-device trace, ``trace.timing = "untimed"``) has no measured
    # layout, only durations: host threads are plain sequences like device streams.
    c.untimed = c.graph.header.attrs.get("trace.timing") == "untimed"
    prog.untimed = c.untimed


def _make_items(c: _Compilation) -> None:
    """Items of every stream, stream by stream: boundary segments of host threads, one item
    per node of device streams. Records each item's raw dependencies."""
    prog, nodes, kinds, starts, durs = c.prog, c.nodes, c.kinds, c.starts, c.durs
    control = pb.DEP_CONTROL
    for k, sid in enumerate(c.stream_ids):
        members = c.by_stream[sid]
        if prog.host_stream[k] and not c.untimed:
            _compile_host_thread(c, members, k)
            continue
        n_start, n_end = prog.node_start_item, prog.node_end_item
        for i in members:
            cat = DEVICE_CATEGORY.get(kinds[i], CAT_OTHER)
            it = c.new_item(k, cat, i, starts[i], starts[i] + durs[i], durs[i])
            n_start[i] = it
            n_end[i] = it
            deps = nodes[i].deps
            if deps:
                # A device node nested in an operator (DEP_CONTROL) was issued by it: like a
                # launch, it cannot start before that operator starts.
                c.start_deps[it] = [(c.index[d.id], pb.DEP_LAUNCH if d.kind == control else d.kind)
                                    for d in deps if d.id in c.index]
            if cat in RENDEZVOUS_CATS:
                prog.rendezvous[it] = rendezvous_of(c.graph, nodes[i])


def _link_stream_order(prog: Program) -> None:
    prog.stream_prev = [-1] * prog.n_items
    for it in range(1, prog.n_items):
        if prog.stream_of[it] == prog.stream_of[it - 1]:
            prog.stream_prev[it] = it - 1


def _resolve_dependencies(c: _Compilation) -> None:
    """Node-level dependencies -> item gates. A DEP_LAUNCH counts from the start of the
    launch's item, any other kind from the end of the node's last item; a dependency on an
    earlier item of the same stream is implied by stream order."""
    prog, nodes, graph = c.prog, c.nodes, c.graph
    c.gates = [[] for _ in range(prog.n_items)]
    c.waits = [[] for _ in range(prog.n_items)]
    for it, deps in c.start_deps.items():
        k = prog.stream_of[it]
        for j, kind in deps:
            if prog.node_start_item[j] < 0:
                continue
            if kind == pb.DEP_LAUNCH:
                gate = (prog.node_start_item[j], True)
            else:
                gate = (prog.node_end_item[j], False)
            pit = gate[0]
            if prog.stream_of[pit] == k:
                if pit >= it:
                    n = nodes[prog.node_of[it]] if prog.node_of[it] >= 0 else None
                    where = _where(graph, n) if n is not None else f"graph {graph.id}"
                    raise EchoError(f"{where}: depends on node {nodes[j].id} ({nodes[j].name}), which runs "
                                    "after it on the same stream")
                continue  # implied by stream order
            if gate not in c.gates[it]:
                c.gates[it].append(gate)
    for it, deps in c.end_deps.items():
        k = prog.stream_of[it]
        for j in deps:
            pit = prog.node_end_item[j]
            if pit < 0 or prog.stream_of[pit] == k:
                continue
            if pit not in c.waits[it]:
                c.waits[it].append(pit)


def _drop_acausal(c: _Compilation) -> None:
    """Count (and drop, unless kept) the dependencies the measured times contradict."""
    prog = c.prog
    for it in range(prog.n_items):
        lim = c.item_mstart[it] + ACAUSAL_TOLERANCE_NS
        bad = [g for g in c.gates[it] if c.gate_time(g) > lim]
        lim_end = c.item_mend[it] + ACAUSAL_TOLERANCE_NS
        bad_end = [q for q in c.waits[it] if c.item_mend[q] > lim_end]
        prog.acausal_deps += len(bad) + len(bad_end)
        if not c.keep_acausal_deps:
            c.gates[it] = [g for g in c.gates[it] if g not in bad]
            c.waits[it] = [q for q in c.waits[it] if q not in bad_end]


def _measure_gaps(c: _Compilation) -> None:
    """The measured gap each item keeps after the predecessor that decided its start (the
    latest one, in measured time); 0 after the others. A sync keeps only its measured
    return latency after what it waited for."""
    prog = c.prog
    mstart, mend = c.item_mstart, c.item_mend
    prog.stream_gap = [0] * prog.n_items
    prog.measured_start = mstart
    start_preds: list[tuple[StartPredTuple, ...]] = []
    for it in range(prog.n_items):
        p = prog.stream_prev[it]
        m_prev = mend[p] if p >= 0 else prog.measured_origin
        m_gates = [c.gate_time(g) for g in c.gates[it]]
        ready = max([m_prev, *m_gates])
        gap = max(0, mstart[it] - ready)
        prog.stream_gap[it] = gap if m_prev == ready else 0
        start_preds.append(tuple((q, from_start, gap if m == ready else 0)     # StartPred layout
                                 for (q, from_start), m in zip(c.gates[it], m_gates, strict=True)))
        if c.waits[it]:
            waited = max(mend[q] for q in c.waits[it])
            prog.measured_dur[it] = max(0, mend[it] - max(mstart[it], waited))
    prog.start_preds = start_preds
    prog.end_waits = [tuple(w) for w in c.waits]


def _link_successors(prog: Program) -> None:
    succs: list[list[int]] = [[] for _ in range(prog.n_items)]
    pred_count = [0] * prog.n_items
    for it in range(prog.n_items):
        preds = prog.predecessors(it)
        pred_count[it] = len(preds)
        for p in preds:
            succs[p].append(it)
    prog.successors = [tuple(s) for s in succs]
    prog.pred_count = pred_count
    prog.roots = [it for it in range(prog.n_items) if pred_count[it] == 0]


def _index_rendezvous(c: _Compilation) -> None:
    """Which items meet other ranks, on which group keys; which keys need member order."""
    prog, graph = c.prog, c.graph
    prog.placeholder_comm = sum(1 for n in c.nodes if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)
                                and n.attrs.get("timing") == "placeholder")
    prog.is_rendezvous = [False] * prog.n_items
    for it, rv in sorted(prog.rendezvous.items()):
        prog.is_rendezvous[it] = True
        if rv.peer < 0:
            prog.collective_items.append((it, rv.key, rv.seq))                       # CollectiveItem
        else:
            prog.p2p_items.append((it, rv.key, rv.peer, rv.seq, rv.is_send))         # P2PItem
    keys: set[str] = set(graph.header.group_sizes)
    ordered: set[str] = set()
    for r in prog.rendezvous.values():
        keys.add(r.key)
        if r.position_matters:
            ordered.add(r.key)
    prog.group_keys = sorted(keys)
    prog.ordered_keys = frozenset(ordered)


def rendezvous_of(graph: Graph | None, n: pb.Node) -> Rendezvous:
    """What communication node ``n`` needs to meet its partners."""
    if n.kind == pb.KIND_COLLECTIVE:
        c = n.collective
        if not c.group:
            raise EchoError(f"{_where(graph, n)}: collective names no process group")
        return Rendezvous(c.group, int(c.seq), int(c.type), int(c.in_bytes), int(c.out_bytes), c.dtype,
                          int(c.root) if c.HasField("root") else -1, -1, False)
    p = n.p2p
    if not p.group:
        raise EchoError(f"{_where(graph, n)}: {node_kind_name(n.kind)} names no process group")
    return Rendezvous(p.group, int(p.seq), 0, int(p.bytes), int(p.bytes), "", -1, int(p.peer),
                      n.kind == pb.KIND_SEND)


def _compile_host_thread(c: _Compilation, members: list[int], k: int) -> None:
    """Cut one host thread into boundary segments (see the module docstring)."""
    bounds = _thread_boundaries(c.nodes, members)
    if not bounds:
        return
    first_item = c.prog.n_items
    seg_of_boundary, children = _cut_segments(c, bounds, k)
    _attach_nodes(c, members, bounds, seg_of_boundary, children, first_item)


def _thread_boundaries(nodes: list[pb.Node], members: list[int]) -> list[tuple[int, int, bool]]:
    """Every start and end of the thread's nodes as (measured time, node index, is_start),
    in nesting order (an end before the start of what follows it)."""
    bounds: list[tuple[int, int, bool]] = []
    stack: list[int] = []
    for i in members:
        n = nodes[i]
        while stack and nodes[stack[-1]].start_ns + nodes[stack[-1]].duration_ns <= n.start_ns:
            j = stack.pop()
            bounds.append((nodes[j].start_ns + nodes[j].duration_ns, j, False))
        bounds.append((n.start_ns, i, True))
        stack.append(i)
    while stack:
        j = stack.pop()
        bounds.append((nodes[j].start_ns + nodes[j].duration_ns, j, False))
    # Ranges that cross instead of nesting (an async annotation such as ``gloo:send``, open
    # from the call until the transfer completed while the thread went on) leave the
    # nesting order out of time order: a stable sort by time restores it and keeps the
    # nesting order among equal times (properly nested ranges are already in time order).
    if any(bounds[b][0] > bounds[b + 1][0] for b in range(len(bounds) - 1)):
        bounds.sort(key=lambda x: x[0])
    return bounds


def _segment_category(prog: Program, owner: pb.Node | None) -> int:
    """What a segment is, from the innermost node open during it."""
    if owner is None:
        return CAT_HOST
    kind = owner.kind
    if kind == pb.KIND_SYNC:
        return CAT_SYNC
    if kind == pb.KIND_COMPUTE or (prog.cpu_only and kind == pb.KIND_CPU_OP):
        return CAT_COMPUTE
    if kind in (pb.KIND_MEMCPY, pb.KIND_MEMSET):
        return CAT_COPY
    if kind == pb.KIND_COMM_UNKNOWN:
        return CAT_COMM_OTHER
    return CAT_HOST


def _cut_segments(c: _Compilation, bounds: list[tuple[int, int, bool]], k: int) -> tuple[list[int], dict[int, int]]:
    """One item per stretch between consecutive boundaries, owned by the innermost node
    open in it. Returns the item after each boundary (-1 after the last) and how many
    children each node has."""
    nodes = c.nodes
    open_stack: list[int] = []
    seg_of_boundary: list[int] = []
    children: dict[int, int] = {}
    n_b = len(bounds)
    for b in range(n_b):
        t, i, is_start = bounds[b]
        if is_start:
            if open_stack:
                children[open_stack[-1]] = children.get(open_stack[-1], 0) + 1
            open_stack.append(i)
        elif open_stack and open_stack[-1] == i:
            open_stack.pop()
        elif i in open_stack:
            open_stack.remove(i)
        if b == n_b - 1:
            seg_of_boundary.append(-1)
            break
        t_next = bounds[b + 1][0]
        owner = open_stack[-1] if open_stack else -1
        cat = _segment_category(c.prog, nodes[owner] if owner >= 0 else None)
        seg_of_boundary.append(c.new_item(k, cat, owner, t, max(t, t_next), t_next - t))
    return seg_of_boundary, children


def _attach_nodes(c: _Compilation, members: list[int], bounds: list[tuple[int, int, bool]],
                  seg_of_boundary: list[int], children: dict[int, int], first_item: int) -> None:
    """Each node starts and ends at a segment; a leaf collective or send/recv is its segment
    (a rendezvous); cross-thread dependencies attach to the segment where the node starts
    (a sync's, where it ends)."""
    prog, nodes, index = c.prog, c.nodes, c.index
    for b, (_, i, is_start) in enumerate(bounds):
        if is_start:
            prog.node_start_item[i] = seg_of_boundary[b]
        else:
            prog.node_end_item[i] = seg_of_boundary[b - 1] if b > 0 else first_item
    for i in members:
        n = nodes[i]
        s_it, e_it = prog.node_start_item[i], prog.node_end_item[i]
        if s_it < 0:  # a zero-length thread tail: point the node at the last segment
            s_it = e_it
            prog.node_start_item[i] = s_it
        cross = [(d.id, d.kind) for d in n.deps if d.kind != pb.DEP_CONTROL]
        if (n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV) and not children.get(i)
                and s_it == e_it):
            prog.category[s_it] = CAT_COLL if n.kind == pb.KIND_COLLECTIVE else CAT_P2P
            prog.rendezvous[s_it] = rendezvous_of(c.graph, n)
        if not cross:
            continue
        if n.kind == pb.KIND_SYNC:
            c.end_deps.setdefault(e_it, []).extend(index[d_id] for d_id, _ in cross if d_id in index)
        else:
            c.start_deps.setdefault(s_it, []).extend((index[d_id], kd) for d_id, kd in cross if d_id in index)
