"""Invariants of the IR, checked like ``onnx.checker``: one ``check_*`` function per rule group.

Each problem is an :class:`Issue` naming the rule it breaks and where (file, graph, node,
manifest entry). This module holds what every check shares, the catalogue of rules
(``RULES``) and the issue types, and the rules of one graph, which the Job's rules
(:mod:`echo_et.ir.job_checker`) and the converters' contract checks build on. The groups
here, from the smallest thing up:

  check_node                 one node: its stream, payload, times and values
  check_node_ids             ids of one graph
  check_dependencies         dependencies of one graph
  check_stream_order         what the order of each stream makes impossible
  check_collective_numbering sequence numbers of one graph's collectives
  check_graph                all graph-level groups above

``check`` is the authority the other commands rely on: a Job it accepts is one that
``simulate``, ``scale`` and every exporter accept. The rules (``RULES``) say exactly what
that takes.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from echo_et.ir.graph import Graph
from echo_et.ir.limits import (
    MAX_BANDWIDTH_GBPS,
    MAX_BYTES,
    MAX_CLOCK_OFFSET_NS,
    MAX_GPUS_PER_NODE,
    MAX_NS,
    MAX_WORLD_SIZE,
)
from echo_et.ir.repeats import ExpandedNodes, repeat_problems
from echo_et.ir.schema import SCHEMA_VERSION, node_kind_name, pb

MAX_GPU_NAME = 256    # characters of a recorded GPU name (the size of CUDA's cudaDeviceProp.name)

RULES: dict[str, str] = {
    # node
    "stream-declared": "every node's stream is declared in the graph header",
    "payload-kind": "a node carries only the payload its kind allows (collective -> collective, "
                    "send/recv -> p2p, compute -> compute, host kinds -> cpu, memcpy/memset -> memcpy)",
    "duration": "start and duration are >= 0 ns and their sum fits int64 (< 2**62 ns)",
    "node-values": "byte counts fit int64 (< 2**53), FLOPs are finite and >= 0, ranks and peers fit",
    # graph
    "unique-ids": "node ids are unique in a graph",
    "dep-exists": "every dependency names a node of the same graph",
    "acyclic": "dependencies form a DAG",
    "stream-order": "no node waits for a node that its own stream runs after it (device streams "
                    "run in node-id order; host threads nest by measured start and duration)",
    "collective-seq": "collectives on one group key are numbered 0..k-1",
    "repeat-blocks": "repeat blocks are consistent: a body of stored nodes, 1..2**20 instances, "
                     "copies after their body and clear of every other node, instance "
                     "dependencies naming a body node and an existing node outside the copy, "
                     "sequence offsets and annotation deltas naming what the body uses",
    # manifest
    "schema-version": f"the manifest and graph headers are of schema {SCHEMA_VERSION}",
    "world-size": f"1 <= world size <= {MAX_WORLD_SIZE} and the ranks bound are exactly 0..world_size-1",
    "layout": "a declared layout has dp, tp, pp >= 1, and its product divides the world size",
    "hardware": f"gpus per node and NICs per node <= {MAX_GPUS_PER_NODE} (0: unknown); bandwidths 0 (unknown) or "
                f"from 1 bit/s to {MAX_BANDWIDTH_GBPS:g} GB/s; a GPU name of at most {MAX_GPU_NAME} printable "
                "characters",
    "node-fill": "recorded gpus per node G fill whole nodes with the world size W (G divides W) or hold it "
                 "on one node (W <= G), the rule every verb applies to --gpus-per-node",
    "group-defined": "group ids are unique and >= 1, members non-empty, in range and unique",
    # bindings and cross-rank
    "binding-graph": "every binding names a graph of the job",
    "binding-values": f"a rank's clock offset is within +-{MAX_CLOCK_OFFSET_NS} ns (2**60) and its measured "
                      f"step within 0..{MAX_NS} ns",
    "group-bound": "every group key a graph uses is bound, to a group containing the rank; an unused "
                   "bound key names a group of the job",
    "group-size": "a graph's declared group size equals the bound group's size",
    "collective-root": "a rooted collective's root is a rank of its group",
    "collective-sequence": "every member of a group issues the same collective sequence on it (type and "
                           "order always; bytes for all-reduce, all-gather, reduce-scatter, broadcast)",
    "p2p-match": "every send has one recv on its peer with the same bytes, in order; peers are in the group",
    "step-bound": f"a replayed step fits the IR's time range: the spread of the ranks' start times plus, for "
                  f"every distinct bound graph, the sum of its node durations and its streams x its measured "
                  f"span, is within {MAX_NS} ns (2**62)",
}

# What payload each node kind may carry (None: no payload).
ALLOWED_PAYLOADS: dict[int, frozenset[str | None]] = {
    pb.KIND_UNKNOWN: frozenset({None, "compute", "cpu"}),
    pb.KIND_COMPUTE: frozenset({None, "compute"}),
    pb.KIND_COLLECTIVE: frozenset({"collective"}),
    pb.KIND_SEND: frozenset({"p2p"}),
    pb.KIND_RECV: frozenset({"p2p"}),
    pb.KIND_CPU_OP: frozenset({None, "cpu"}),
    pb.KIND_LAUNCH: frozenset({None, "cpu"}),
    pb.KIND_MEMCPY: frozenset({None, "memcpy"}),
    pb.KIND_MEMSET: frozenset({None, "memcpy"}),
    pb.KIND_SYNC: frozenset({None, "cpu"}),
    pb.KIND_COMM_UNKNOWN: frozenset({None}),
}
# Kinds that make a stream a host thread (the simulator orders those by time and nesting).
HOST_KINDS = frozenset({pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC})
ROOTED_COLLECTIVES = frozenset({pb.COLL_BROADCAST, pb.COLL_REDUCE, pb.COLL_GATHER, pb.COLL_SCATTER})


@dataclass(frozen=True)
class Issue:
    rule: str
    message: str
    where: str = ""

    def __str__(self) -> str:
        return f"{self.where}: [{self.rule}] {self.message}" if self.where else f"[{self.rule}] {self.message}"


class IssueCollector:
    """Collects issues up to a limit (other contract checks reuse it)."""

    def __init__(self, limit: int):
        self.issues: list[Issue] = []
        self.limit = limit

    def add(self, rule: str, message: str, where: str) -> None:
        if len(self.issues) < self.limit:
            self.issues.append(Issue(rule, message, where))

    @property
    def full(self) -> bool:
        return len(self.issues) >= self.limit


def _where(source: str, graph: Graph, node: pb.Node | None = None) -> str:
    parts = [p for p in (source, f"graph {graph.id}") if p]
    if node is not None:
        parts.append(f"node {node.id} ({node.name})")
    return " ".join(parts)


# -- node -------------------------------------------------------------------------------------
def check_node(node: pb.Node, stream_ids: set[int], out: IssueCollector, where: str | Callable[[], str]) -> None:
    """stream-declared, payload-kind, duration, node-values. ``where`` may be a function that
    makes the location text, called only when there is something to report."""
    have = node.WhichOneof("payload")
    allowed = ALLOWED_PAYLOADS.get(node.kind)
    s, d = node.start_ns, node.duration_ns
    if (node.stream in stream_ids and allowed is not None and have in allowed and s >= 0 and d >= 0
            and s + d <= MAX_NS and (have is None or have == "cpu")):
        return  # the common case, decided without building the location text
    if callable(where):
        where = where()
    if node.stream not in stream_ids:
        out.add("stream-declared", f"stream {node.stream} is not declared", where)
    if allowed is None:
        out.add("payload-kind", f"node kind {node.kind} is not a known kind", where)
    elif have not in allowed:
        out.add("payload-kind", f"{node_kind_name(node.kind)} node carries {have or 'no'} payload "
                f"(allowed: {', '.join(sorted(p or 'none' for p in allowed))})", where)
    if s < 0 or d < 0:
        out.add("duration", f"negative time (start {s} ns, duration {d} ns)", where)
    elif s + d > MAX_NS:
        out.add("duration", f"start {s} ns + duration {d} ns is beyond {MAX_NS} ns", where)
    if have is not None:
        _check_payload_values(node, have, out, where)


def _check_payload_values(node: pb.Node, have: str, out: IssueCollector, where: str) -> None:
    if have == "collective":
        c = node.collective
        big = max(c.in_bytes, c.out_bytes)
        if big > MAX_BYTES:
            out.add("node-values", f"collective of {big} bytes is beyond {MAX_BYTES} bytes", where)
    elif have == "p2p":
        if node.p2p.bytes > MAX_BYTES:
            out.add("node-values", f"{node_kind_name(node.kind)} of {node.p2p.bytes} bytes is beyond "
                    f"{MAX_BYTES} bytes", where)
    elif have == "compute":
        c = node.compute
        if c.bytes > MAX_BYTES:
            out.add("node-values", f"compute of {c.bytes} bytes is beyond {MAX_BYTES} bytes", where)
        if not (math.isfinite(c.flops) and c.flops >= 0):
            out.add("node-values", f"FLOPs {c.flops} is not a finite number >= 0", where)
    elif have == "memcpy" and node.memcpy.bytes > MAX_BYTES:
        out.add("node-values", f"copy of {node.memcpy.bytes} bytes is beyond {MAX_BYTES} bytes", where)


# -- graph ------------------------------------------------------------------------------------
def check_graph(graph: Graph, *, source: str = "", limit: int = 100) -> list[Issue]:
    """Every graph-level rule of ``graph`` (at most ``limit`` issues)."""
    out = IssueCollector(limit)
    check_graph_rules(graph, source, out)
    return out.issues


def check_graph_rules(graph: Graph, source: str, out: IssueCollector) -> set[int] | None:
    """The graph rules; returns the node kinds the graph has when the one-pass check took it
    (None otherwise). Public for :func:`echo_et.ir.job_checker.check_job`, which adds every
    graph's issues to its own collector and skips the signature of a graph without
    communication nodes."""
    if graph.header.schema_version != SCHEMA_VERSION:
        out.add("schema-version", f"graph header is of schema {graph.header.schema_version!r}, "
                f"this echo-et reads {SCHEMA_VERSION!r}", _where(source, graph))
    if graph.has_repeats:
        problems = repeat_problems(graph.header, graph.stored_nodes, graph.bodies())
        for p in problems:
            out.add("repeat-blocks", p, _where(source, graph))
        if problems:
            return None
    if graph.has_repeats:
        kinds = _compact_rules_hold(graph, source, out)
        if kinds is not None:
            return kinds
    # From here the rules read the expansion as a stream (``iter_nodes``: copies are made one
    # at a time, in id order, the order the expanded graph has), never expanding the graph:
    # what a rule keeps of every node is an id, a stream or a position, not the node.
    kinds = _graph_rules_hold(graph, source, out)
    if kinds is not None:
        return kinds
    stream_ids = {s.id for s in graph.header.streams}
    for n in graph.iter_nodes():
        check_node(n, stream_ids, out, lambda n=n: _where(source, graph, n))
        if out.full:
            return None
    ids = check_node_ids(graph, source, out)
    if out.full:
        return None
    before = len(out.issues)
    check_dependencies(graph, ids, source, out)
    if out.full:
        return None
    if len(out.issues) == before:  # stream order means nothing across a broken dependency
        check_stream_order(graph, source, out)
    check_collective_numbering(graph, source, out)
    return None


def _block_streams(graph: Graph) -> Callable[..., int | None] | None:
    """For a graph with consistent repeat blocks (unique ids), the stream of an expanded
    node by id, found from the stored nodes and the blocks (``default`` when no node has the
    id); None for a flat graph, whose rules keep a stream per id as they read it."""
    if not graph.has_repeats:
        return None
    nodes = ExpandedNodes(graph.header, graph.stored_nodes, graph.bodies())

    def stream(node_id: int, default: int | None = None) -> int | None:
        src = nodes.source(node_id)
        return default if src is None else src[0].stream
    return stream


def _node_by_id(graph: Graph, node_id: int) -> pb.Node:
    """The first node of the expanded graph with id ``node_id`` (found by streaming it)."""
    return next(n for n in graph.iter_nodes() if n.id == node_id)


def _node_holds(n: pb.Node, stream_ids: set[int], probe: IssueCollector) -> bool:
    """The node rules on the common path, without wording an issue (the one-pass checks)."""
    have = n.WhichOneof("payload")
    allowed = ALLOWED_PAYLOADS.get(n.kind)
    s, d = n.start_ns, n.duration_ns
    if not (n.stream in stream_ids and allowed is not None and have in allowed and s >= 0 and d >= 0
            and s + d <= MAX_NS):
        return False
    if have is not None and have != "cpu":
        _check_payload_values(n, have, probe, "")
        if probe.issues:
            return False
    return True


def _graph_rules_hold(graph: Graph, source: str, out: IssueCollector) -> set[int] | None:
    """The graph-level rules in one pass, for the common graph: nodes in increasing id order,
    each depending only on earlier ones, nothing out of range. Then unique ids, existing
    dependencies and acyclicity follow from the order, the node rules are checked inline, and
    only stream order (when some dependency stays on its stream) and collective numbering
    remain to run. Returns the node kinds seen, or None, having added nothing, at the first
    thing off the common path: the rule-by-rule check then runs and words what is wrong."""
    stream_ids = {s.id for s in graph.header.streams}
    stream_of: dict[int, int] = {}
    host: set[int] = set()
    same_stream: list[tuple[int, int, int]] = []   # (stream, node kind, dep kind) of deps on it
    probe = IssueCollector(1)
    host_kinds = HOST_KINDS
    allowed_of, max_ns, stream_at = ALLOWED_PAYLOADS, MAX_NS, stream_of.get
    compact = _block_streams(graph)   # a graph with blocks: streams looked up, not kept per id
    kinds: set[int] = set()
    last = -1
    for n in graph.iter_nodes():   # streamed: repeat blocks are not expanded in memory
        nid, kind, st = n.id, n.kind, n.stream
        if nid <= last:
            return None
        last = nid
        # _node_holds inline (one call less per node on the common path)
        have = n.WhichOneof("payload")
        allowed = allowed_of.get(kind)
        s, d = n.start_ns, n.duration_ns
        if not (st in stream_ids and allowed is not None and have in allowed and s >= 0 and d >= 0
                and s + d <= max_ns):
            return None
        if have is not None and have != "cpu":
            _check_payload_values(n, have, probe, "")
            if probe.issues:
                return None
        for dep in n.deps:
            if compact is None:
                dst = stream_at(dep.id)
            else:
                dst = compact(dep.id) if dep.id < nid else None
            if dst is None:   # a later node, itself, or none: not the common case
                return None
            if dst == st:
                same_stream.append((st, kind, dep.kind))
        if compact is None:
            stream_of[nid] = st
        if kind not in kinds:
            kinds.add(kind)
        if kind in host_kinds:
            host.add(st)
    sync, control = pb.KIND_SYNC, pb.DEP_CONTROL
    if any(not (st in host and (kind == sync or dk == control)) for st, kind, dk in same_stream):
        check_stream_order(graph, source, out)
    if pb.KIND_COLLECTIVE in kinds:
        check_collective_numbering(graph, source, out)
    return kinds


def _compact_rules_hold(graph: Graph, source: str, out: IssueCollector) -> set[int] | None:
    """The one-pass rules of :func:`_graph_rules_hold` on a graph with consistent repeat
    blocks, without expanding it: a copy has its body node's fields, so the node rules hold
    for copies when they hold for the stored nodes and every shifted start stays in range;
    ids are unique when stored ids are and the copies' ranges are clear (the block rules);
    order holds when every stored node and every copy's own dependency names an earlier id
    (dependencies inside a body keep their order in a copy). Stream order then holds on a
    device stream, which runs its nodes in id order; a dependency on the node's own host
    thread (other than nesting, or a sync's wait) is left to the check on the expansion, whose
    nesting the stored nodes do not show. Collective numbering is checked on the numbers
    alone. Returns None, having added nothing, when something needs the rule-by-rule check on
    the expansion."""

    stream_ids = {s.id for s in graph.header.streams}
    probe = IssueCollector(1)
    max_ns = MAX_NS
    kinds: set[int] = set()
    stream_of: dict[int, int] = {}
    blocks = graph.bodies()
    spans = sorted((b.first + int(i.id_offset), b.last + int(i.id_offset), b, int(i.id_offset))
                   for b in blocks for i in b.block.instances)
    starts = [sp[0] for sp in spans]
    body_stream = {n.id: n.stream for b in blocks for n in b.nodes}
    body_kind = {n.id: n.kind for b in blocks for n in b.nodes}
    host = {n.stream for n in graph.stored_nodes if n.kind in HOST_KINDS}
    sync, control = pb.KIND_SYNC, pb.DEP_CONTROL

    def stream_at(nid: int) -> int | None:
        st = stream_of.get(nid)
        if st is not None:
            return st
        j = bisect.bisect_right(starts, nid) - 1
        if j >= 0 and nid <= spans[j][1]:
            return body_stream.get(nid - spans[j][3])
        return None

    same_stream = False
    last = -1
    for n in graph.stored_nodes:
        nid, kind, st = n.id, n.kind, n.stream
        if nid <= last:
            return None
        last = nid
        if not _node_holds(n, stream_ids, probe):
            return None
        stream_of[nid] = st
        for dep in n.deps:
            if dep.id >= nid:
                return None
            dst = stream_at(dep.id)
            if dst is None:
                return None
            if dst == st and st in host and kind != sync and dep.kind != control:
                same_stream = True
        kinds.add(kind)
    counts: dict[str, list[int]] = defaultdict(list)
    for n in graph.stored_nodes:
        if n.kind == pb.KIND_COLLECTIVE:
            counts[n.collective.group].append(int(n.collective.seq))
    for b in blocks:
        lo = min((n.start_ns for n in b.nodes), default=0)
        hi = max((n.start_ns + n.duration_ns for n in b.nodes), default=0)
        body_colls = [(n.collective.group, int(n.collective.seq)) for n in b.nodes
                      if n.kind == pb.KIND_COLLECTIVE]
        for inst in b.block.instances:
            off = int(inst.id_offset)
            if lo + inst.time_offset_ns < 0 or hi + inst.time_offset_ns > max_ns:
                return None
            for d in inst.deps:
                if d.id >= d.node + off:
                    return None
                st = body_stream.get(d.node)
                if stream_at(d.id) == st and st in host and body_kind.get(d.node) != sync and d.kind != control:
                    same_stream = True
            for key, seq in body_colls:
                counts[key].append(seq + inst.seq_offsets.get(key, 0))
    if same_stream:
        return None
    for seqs in counts.values():
        if sorted(seqs) != list(range(len(seqs))):
            return None
    return kinds


def check_node_ids(graph: Graph, source: str, out: IssueCollector) -> set[int]:
    """unique-ids. Returns the set of ids."""
    ids: set[int] = set()
    for n in graph.iter_nodes():
        if n.id in ids:
            out.add("unique-ids", f"node id {n.id} is used more than once", _where(source, graph, n))
        ids.add(n.id)
    return ids


def check_dependencies(graph: Graph, ids: set[int], source: str, out: IssueCollector) -> None:
    """dep-exists, acyclic."""
    for n in graph.iter_nodes():
        for d in n.deps:
            if d.id not in ids:
                out.add("dep-exists", f"dependency on node {d.id}, which does not exist", _where(source, graph, n))
            elif d.id == n.id:
                out.add("acyclic", "node depends on itself", _where(source, graph, n))
    _check_acyclic(graph, ids, source, out)


def _check_acyclic(graph: Graph, ids: set[int], source: str, out: IssueCollector) -> None:
    """Kahn's algorithm; on a cycle, name one node on it. A graph whose dependencies all name
    earlier ids (or the node itself, which is not a cycle here) has none: proven from the
    stored nodes and the blocks, without the algorithm's per-node tables."""
    if graph.deps_point_back():
        return
    indeg: dict[int, int] = {i: 0 for i in ids}
    children: dict[int, list[int]] = defaultdict(list)
    for n in graph.iter_nodes():
        for d in {d.id for d in n.deps if d.id in ids and d.id != n.id}:
            indeg[n.id] += 1
            children[d].append(n.id)
    ready = [i for i, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for c in children.get(i, ()):
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    if seen != len(indeg):
        # Every node left over waits on another left-over node: walking those waits from
        # any of them must come back to a node on a cycle (the smallest left-over id may
        # only sit downstream of one).
        left = {i for i, k in indeg.items() if k > 0}
        deps_of: dict[int, list[int]] = defaultdict(list)
        for n in graph.iter_nodes():
            if n.id in left:
                deps_of[n.id].extend(d.id for d in n.deps if d.id in left and d.id != n.id)
        stuck = min(left)
        visited: set[int] = set()
        while stuck not in visited and deps_of[stuck]:
            visited.add(stuck)
            stuck = min(deps_of[stuck])
        out.add("acyclic", f"dependency cycle through node {stuck}", _where(source, graph, _node_by_id(graph, stuck)))


def stream_positions(graph: Graph, wanted: set[int] | None = None, host: set[int] | None = None
                     ) -> dict[int, tuple[int, int]]:
    """Where each node starts and ends in its stream's order, as (start position, end
    position) in one sequence per stream (only the nodes of ``wanted`` ids when given).

    A device stream runs its nodes one at a time in node-id order: node k of the stream
    starts at 2k and ends at 2k+1. A host thread (a stream holding host operators) nests
    its nodes by measured start and duration, visited in node-id order: a node starts inside
    every earlier node that has not ended by its start. This is the order the simulator
    executes; a dependency against it can never be met.

    The nodes are read in id order as a stream (a graph with repeat blocks is not expanded):
    what is kept is a count per device stream and the nesting stack of each host thread.
    ``host``: the host threads, when the caller knows them."""
    if host is None:
        host = {n.stream for n in graph.iter_nodes(HOST_KINDS)}
    ordered = graph.iter_nodes() if graph.has_repeats else sorted(graph.nodes, key=lambda n: n.id)
    pos: dict[int, tuple[int, int]] = {}
    count: dict[int, int] = defaultdict(int)                 # device stream -> nodes so far
    stacks: dict[int, list[tuple[int, int, int]]] = defaultdict(list)   # host -> (id, end, start position)
    for n in ordered:
        st = n.stream
        if st not in host:
            k = count[st]
            count[st] = k + 1
            if wanted is None or n.id in wanted:
                pos[n.id] = (2 * k, 2 * k + 1)
            continue
        stack = stacks[st]
        b = count[st]
        while stack and stack[-1][1] <= n.start_ns:
            j, _, start_at = stack.pop()
            if wanted is None or j in wanted:
                pos[j] = (start_at, b)
            b += 1
        stack.append((n.id, n.start_ns + n.duration_ns, b))
        count[st] = b + 1
    for st, stack in stacks.items():
        b = count[st]
        while stack:
            j, _, start_at = stack.pop()
            if wanted is None or j in wanted:
                pos[j] = (start_at, b)
            b += 1
    return pos


def check_stream_order(graph: Graph, source: str, out: IssueCollector) -> None:
    """stream-order: a node cannot wait (data or sync: for the end; launch: for the start) on
    a node its own stream runs after it. On a host thread, control dependencies (nesting) are
    not execution order and a sync node ends, not starts, on what it waits for; on a device
    stream a control dependency means "issued by", a wait for the start."""
    stream_of: dict[int, int] = {}
    host: set[int] = set()
    compact = _block_streams(graph)   # a graph with blocks: streams looked up, not kept per id
    for n in graph.iter_nodes():
        if compact is None:
            stream_of[n.id] = n.stream
        if n.kind in HOST_KINDS:
            host.add(n.stream)
    stream_at = stream_of.get if compact is None else compact
    # (the node when stored, its id, its stream, dependency id, dependency kind): not the
    # copies a graph with repeat blocks makes one at a time (their ids are unique: a name is
    # found again by id when one is reported).
    flat = not graph.has_repeats
    pairs: list[tuple[pb.Node | None, int, int, int, int]] = []
    for n in graph.iter_nodes():
        on_host = n.stream in host
        if on_host and n.kind == pb.KIND_SYNC:
            continue
        for d in n.deps:
            if d.id != n.id and stream_at(d.id, -1) == n.stream and not (on_host and d.kind == pb.DEP_CONTROL):
                pairs.append((n if flat else None, n.id, n.stream, d.id, d.kind))
    if not pairs:
        return
    del stream_of
    pos = stream_positions(graph, {i for p in pairs for i in (p[1], p[3])}, host)
    names: dict[int, str | None] = {}
    bad = []
    for node, nid, st, did, dkind in pairs:
        mine = pos[nid][0]
        dstart, dend = pos[did]
        launch = dkind in (pb.DEP_LAUNCH, pb.DEP_CONTROL)
        if (dstart if launch else dend) > mine:
            bad.append((node, nid, st, did, launch))
            names[did] = None
            if node is None:
                names[nid] = None
            if len(bad) >= out.limit:
                break
    if not bad:
        return
    for n in graph.iter_nodes():   # the last node of each id, as graph.node() finds it
        if n.id in names:
            names[n.id] = n.name
    for node, nid, st, did, launch in bad:
        what = "starts" if launch else "ends"
        other = names[did]
        name = node.name if node is not None else names[nid]
        where = " ".join(p for p in (source, f"graph {graph.id}") if p) + f" node {nid} ({name})"
        out.add("stream-order", f"waits for node {did} ({other}), which {what} after it "
                f"on the same stream {st}", where)
        if out.full:
            return


def check_collective_numbering(graph: Graph, source: str, out: IssueCollector) -> None:
    """collective-seq."""
    # (seq, id, position in the expansion) per group; the node itself is found again by its
    # position when it is reported (a graph with repeat blocks makes its copies one at a time).
    seqs: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for k, n in enumerate(graph.iter_nodes()):
        if n.kind == pb.KIND_COLLECTIVE and n.HasField("collective"):
            seqs[n.collective.group].append((n.collective.seq, n.id, k))
    bad: list[tuple[str, int, int]] = []   # (key, collectives, position of the first misnumbered)
    for key, items in seqs.items():
        got = sorted(s for s, _, _ in items)
        if got != list(range(len(items))):
            # The first node, in sequence order, whose number is not its position.
            ranked = sorted(items, key=lambda t: (t[0], t[1]))
            at = next(k for i, (s, _, k) in enumerate(ranked) if s != i)
            bad.append((key, len(items), at))
    if not bad:
        return
    wanted = {at for _, _, at in bad}
    found = {k: (n.id, n.name) for k, n in enumerate(graph.iter_nodes()) if k in wanted}
    for key, count, at in bad:
        nid, name = found[at]
        where = " ".join(p for p in (source, f"graph {graph.id}") if p) + f" node {nid} ({name})"
        out.add("collective-seq", f"collectives on group {key!r} are not numbered 0..{count - 1}", where)

