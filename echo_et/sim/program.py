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
timeline*: the starts and ends of all its nodes, in nesting order, cut the thread into
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

_HOST_KINDS = frozenset({pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC})

_DEVICE_CAT = {
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


@dataclass
class Program:
    """One distinct graph, compiled. Lists (not numpy) because the inner loop indexes them
    one element at a time, which is faster on Python lists."""

    graph_id: str
    n_items: int = 0
    stream_of: list[int] = field(default_factory=list)      # dense stream index per item
    prev: list[int] = field(default_factory=list)           # stream predecessor item, -1 first
    spreds: list[tuple[tuple[int, int], ...]] = field(default_factory=list)  # start preds: (item*2 + use start, gap)
    epreds: list[tuple[int, ...]] = field(default_factory=list)  # end preds (sync): item ids
    succs: list[tuple[int, ...]] = field(default_factory=list)
    npreds: list[int] = field(default_factory=list)
    pgap: list[int] = field(default_factory=list)           # gap after the stream predecessor / origin
    measured_dur: list[int] = field(default_factory=list)
    measured_start: list[int] = field(default_factory=list)
    cat: list[int] = field(default_factory=list)
    node_of: list[int] = field(default_factory=list)        # index in graph.nodes of the owner, -1 none
    rendezvous: dict[int, Rendezvous] = field(default_factory=dict)  # item -> rendezvous info
    is_rdv: list[bool] = field(default_factory=list)        # item meets other ranks
    coll_items: list[tuple[int, str, int]] = field(default_factory=list)  # (item, key, seq)
    p2p_items: list[tuple[int, str, int, int, bool]] = field(default_factory=list)  # (item, key, peer, seq, send)
    # per node (index in graph.nodes): the items holding its start and end
    node_start_item: list[int] = field(default_factory=list)
    node_end_item: list[int] = field(default_factory=list)
    streams: list[pb.Stream] = field(default_factory=list)  # dense index -> declared stream
    host_stream: list[bool] = field(default_factory=list)
    measured_origin: int = 0     # earliest measured start in the graph
    cpu_only: bool = False       # no GPU work: host operators are the compute
    group_keys: list[str] = field(default_factory=list)
    ordered_keys: frozenset[str] = frozenset()  # keys used by P2P or rooted collectives
    roots: list[int] = field(default_factory=list)  # items with no predecessor at all
    acausal_deps: int = 0        # dependencies the measured times contradict (dropped unless kept)
    placeholder_comm: int = 0    # communication nodes without a measured time (ex-situ traces)


def _where(graph: Graph, node: pb.Node) -> str:
    return f"graph {graph.id} node {node.id} ({node.name})"


def compile_graph(graph: Graph, *, keep_acausal_deps: bool = False) -> Program:
    """Compile ``graph`` into a :class:`Program`. Raises EchoError on a graph the simulator
    cannot order (a dependency on a later node of the same stream).

    In a timed graph (measured start times, not all 0), a dependency whose predecessor the
    measurement shows finishing after the dependent node started (by more than 1 us) cannot
    have been a real constraint: a converter guessed it wrong. It is dropped and counted in
    ``Program.acausal_deps`` unless ``keep_acausal_deps``."""
    nodes = graph.nodes
    prog = Program(graph_id=graph.id)
    # Read every node's fields once: protobuf attribute access is the slow part.
    ids = [n.id for n in nodes]
    kinds = [n.kind for n in nodes]
    starts = [n.start_ns for n in nodes]
    durs = [n.duration_ns for n in nodes]
    index = {nid: i for i, nid in enumerate(ids)}
    by_stream: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        by_stream.setdefault(n.stream, []).append(i)
    declared = {s.id: s for s in graph.header.streams}
    stream_ids = sorted(by_stream)
    dense = {sid: k for k, sid in enumerate(stream_ids)}
    for sid in stream_ids:
        by_stream[sid].sort(key=ids.__getitem__)
        s = declared.get(sid) or pb.Stream(id=sid, name=f"stream {sid}")
        prog.streams.append(s)
        prog.host_stream.append(any(kinds[i] in _HOST_KINDS for i in by_stream[sid]))

    has_launch = pb.KIND_LAUNCH in kinds
    device_compute = any(
        kinds[i] in (pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET)
        for sid in stream_ids if not prog.host_stream[dense[sid]] for i in by_stream[sid]
    )
    prog.cpu_only = not has_launch and not device_compute
    prog.measured_origin = min(starts, default=0)
    # An untimed graph (a meta-device trace, ``trace.timing = "untimed"``) has no measured
    # layout, only durations: host threads are plain sequences like device streams.
    untimed = graph.header.attrs.get("trace.timing") == "untimed"
    timed = any(starts) and not untimed

    n_nodes = len(nodes)
    prog.node_start_item = [-1] * n_nodes
    prog.node_end_item = [-1] * n_nodes
    # Raw (node-level) dependencies resolved after all items exist.
    start_deps: dict[int, list[tuple[int, int]]] = {}   # item -> [(node idx, dep kind)]
    end_deps: dict[int, list[int]] = {}                 # item -> [node idx]
    item_mstart: list[int] = []
    item_mend: list[int] = []

    def new_item(stream_k: int, cat: int, owner: int, mstart: int, mend: int, mdur: int) -> int:
        it = prog.n_items
        prog.n_items += 1
        prog.stream_of.append(stream_k)
        prog.cat.append(cat)
        prog.node_of.append(owner)
        prog.measured_dur.append(max(0, mdur))
        item_mstart.append(mstart)
        item_mend.append(mend)
        return it

    control = pb.DEP_CONTROL
    for sid in stream_ids:
        k = dense[sid]
        members = by_stream[sid]
        if prog.host_stream[k] and not untimed:
            _compile_host_thread(prog, nodes, index, members, k, new_item, start_deps, end_deps, graph)
            continue
        n_start, n_end = prog.node_start_item, prog.node_end_item
        for i in members:
            kind = kinds[i]
            cat = _DEVICE_CAT.get(kind, CAT_OTHER)
            it = new_item(k, cat, i, starts[i], starts[i] + durs[i], durs[i])
            n_start[i] = it
            n_end[i] = it
            deps = nodes[i].deps
            if deps:
                # A device node nested in an operator (DEP_CONTROL) was issued by it: like a
                # launch, it cannot start before that operator starts.
                start_deps[it] = [(index[d.id], pb.DEP_LAUNCH if d.kind == control else d.kind)
                                  for d in deps if d.id in index]
            if cat in RENDEZVOUS_CATS:
                prog.rendezvous[it] = _rendezvous(graph, nodes[i])

    # Stream predecessors.
    prog.prev = [-1] * prog.n_items
    for it in range(1, prog.n_items):
        if prog.stream_of[it] == prog.stream_of[it - 1]:
            prog.prev[it] = it - 1

    # Resolve dependencies to item references and compute gates.
    spreds: list[list[int]] = [[] for _ in range(prog.n_items)]
    epreds: list[list[int]] = [[] for _ in range(prog.n_items)]
    for it, deps in start_deps.items():
        k = prog.stream_of[it]
        for j, kind in deps:
            if prog.node_start_item[j] < 0:
                continue
            if kind == pb.DEP_LAUNCH:
                ref = prog.node_start_item[j] * 2 + 1
            else:
                ref = prog.node_end_item[j] * 2
            pit = ref >> 1
            if prog.stream_of[pit] == k:
                if pit >= it:
                    n = nodes[prog.node_of[it]] if prog.node_of[it] >= 0 else None
                    where = _where(graph, n) if n is not None else f"graph {graph.id}"
                    raise EchoError(f"{where}: depends on node {nodes[j].id} ({nodes[j].name}), which runs "
                                    "after it on the same stream")
                continue  # implied by stream order
            if ref not in spreds[it]:
                spreds[it].append(ref)
    for it, deps in end_deps.items():
        k = prog.stream_of[it]
        for j in deps:
            pit = prog.node_end_item[j]
            if pit < 0 or prog.stream_of[pit] == k:
                continue
            if pit not in epreds[it]:
                epreds[it].append(pit)

    if timed:
        for it in range(prog.n_items):
            lim = item_mstart[it] + ACAUSAL_TOLERANCE_NS
            bad = [ref for ref in spreds[it] if (item_mstart[ref >> 1] if ref & 1 else item_mend[ref >> 1]) > lim]
            lim_end = item_mend[it] + ACAUSAL_TOLERANCE_NS
            bad_end = [q for q in epreds[it] if item_mend[q] > lim_end]
            prog.acausal_deps += len(bad) + len(bad_end)
            if not keep_acausal_deps:
                spreds[it] = [ref for ref in spreds[it] if ref not in bad]
                epreds[it] = [q for q in epreds[it] if q not in bad_end]
    prog.pgap = [0] * prog.n_items
    prog.measured_start = item_mstart
    gaps: list[list[int]] = [[] for _ in range(prog.n_items)]
    for it in range(prog.n_items):
        p = prog.prev[it]
        m_prev = item_mend[p] if p >= 0 else prog.measured_origin
        m_refs = [item_mstart[ref >> 1] if ref & 1 else item_mend[ref >> 1] for ref in spreds[it]]
        ready = max([m_prev, *m_refs])
        gap = max(0, item_mstart[it] - ready)
        prog.pgap[it] = gap if m_prev == ready else 0
        gaps[it] = [gap if m == ready else 0 for m in m_refs]
        if epreds[it]:
            # A sync keeps only its measured return latency after what it waited for.
            waited = max(item_mend[q] for q in epreds[it])
            prog.measured_dur[it] = max(0, item_mend[it] - max(item_mstart[it], waited))

    prog.spreds = [tuple(zip(s, g, strict=True)) for s, g in zip(spreds, gaps, strict=True)]
    prog.epreds = [tuple(e) for e in epreds]
    succs: list[list[int]] = [[] for _ in range(prog.n_items)]
    npreds = [0] * prog.n_items
    for it in range(prog.n_items):
        preds = set()
        if prog.prev[it] >= 0:
            preds.add(prog.prev[it])
        preds.update(ref >> 1 for ref in spreds[it])
        preds.update(epreds[it])
        npreds[it] = len(preds)
        for p in preds:
            succs[p].append(it)
    prog.succs = [tuple(s) for s in succs]
    prog.npreds = npreds
    prog.roots = [it for it in range(prog.n_items) if npreds[it] == 0]

    comm_kinds = (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)
    prog.placeholder_comm = sum(1 for i, k in enumerate(kinds) if k in comm_kinds
                                and nodes[i].attrs.get("timing") == "placeholder")
    prog.is_rdv = [False] * prog.n_items
    for it, rv in sorted(prog.rendezvous.items()):
        prog.is_rdv[it] = True
        if rv.peer < 0:
            prog.coll_items.append((it, rv.key, rv.seq))
        else:
            prog.p2p_items.append((it, rv.key, rv.peer, rv.seq, rv.is_send))
    keys: set[str] = set(graph.header.group_sizes)
    ordered: set[str] = set()
    for r in prog.rendezvous.values():
        keys.add(r.key)
        if r.peer >= 0 or r.root >= 0:
            ordered.add(r.key)
    prog.group_keys = sorted(keys)
    prog.ordered_keys = frozenset(ordered)
    return prog


def _rendezvous(graph: Graph, n: pb.Node) -> Rendezvous:
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


def _compile_host_thread(prog, nodes, index, members, k, new_item, start_deps, end_deps, graph) -> None:
    """Cut one host thread into boundary segments (see the module docstring)."""
    # Boundaries in nesting order: (measured time, node index, is_start).
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

    n_b = len(bounds)
    if n_b == 0:
        return
    # Owner of each segment: the innermost node open after each boundary.
    open_stack: list[int] = []
    first_item = prog.n_items
    seg_of_boundary: list[int] = []
    children: dict[int, int] = {}
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
        cat = CAT_HOST
        if owner >= 0:
            kind = nodes[owner].kind
            if kind == pb.KIND_SYNC:
                cat = CAT_SYNC
            elif kind == pb.KIND_COMPUTE or (prog.cpu_only and kind == pb.KIND_CPU_OP):
                cat = CAT_COMPUTE
            elif kind in (pb.KIND_MEMCPY, pb.KIND_MEMSET):
                cat = CAT_COPY
            elif kind == pb.KIND_COMM_UNKNOWN:
                cat = CAT_COMM_OTHER
        seg = new_item(k, cat, owner, t, max(t, t_next), t_next - t)
        seg_of_boundary.append(seg)

    for b in range(n_b):
        _, i, is_start = bounds[b]
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
            prog.cat[s_it] = CAT_COLL if n.kind == pb.KIND_COLLECTIVE else CAT_P2P
            prog.rendezvous[s_it] = _rendezvous(graph, n)
        if not cross:
            continue
        if n.kind == pb.KIND_SYNC:
            end_deps.setdefault(e_it, []).extend(index[d_id] for d_id, _ in cross if d_id in index)
        else:
            start_deps.setdefault(s_it, []).extend((index[d_id], kd) for d_id, kd in cross if d_id in index)
