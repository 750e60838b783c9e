"""Invariants of the IR, checked like ``onnx.checker``: one ``check_*`` function per level.

Each problem is a :class:`Issue` naming the rule it breaks and where (file, graph, node).
``check_graph`` needs only one graph; ``check_job`` adds the cross-rank rules (bindings,
group membership, equal collective sequences, matched send/recv), computing each graph's
signatures once so that cost grows with distinct graphs, not with world size.

Rules:
  unique-ids          node ids are unique in a graph
  dep-exists          every dependency names a node of the same graph
  acyclic             dependencies form a DAG
  stream-declared     every node's stream is declared in the graph header
  payload-kind        a node's payload matches its kind (collective -> collective, ...)
  duration            durations and start times are not negative
  collective-seq      collectives on one group key are numbered 0..k-1
  world-size          the ranks bound are exactly 0..world_size-1
  binding-graph       every binding names a graph of the job
  group-defined       group ids are unique and >= 1, members in range and unique
  group-bound         every group key a graph uses is bound, to a group containing the rank
  group-size          a graph's declared group size equals the bound group's size
  collective-sequence every member of a group issues the same collective sequence on it
                      (type and order always; bytes for all-reduce, all-gather,
                      reduce-scatter, broadcast)
  p2p-match           every send has one recv on its peer with the same bytes, in order
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from echo_et.errors import CheckError
from echo_et.ir.graph import Graph
from echo_et.ir.job import Job
from echo_et.ir.schema import EQUAL_SIZE_COLLECTIVES, collective_name, node_kind_name, pb

_PAYLOAD_OF_KIND = {
    pb.KIND_COLLECTIVE: "collective",
    pb.KIND_SEND: "p2p",
    pb.KIND_RECV: "p2p",
}


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


def check_node(node: pb.Node, stream_ids: set[int], out: IssueCollector, where: str) -> None:
    if node.stream not in stream_ids:
        out.add("stream-declared", f"stream {node.stream} is not declared", where)
    want = _PAYLOAD_OF_KIND.get(node.kind)
    have = node.WhichOneof("payload")
    if want is not None and have != want:
        out.add("payload-kind", f"{node_kind_name(node.kind)} node carries {have or 'no'} payload", where)
    if node.duration_ns < 0 or node.start_ns < 0:
        out.add("duration", f"negative time (start {node.start_ns} ns, duration {node.duration_ns} ns)", where)


def check_graph(graph: Graph, *, source: str = "", limit: int = 100) -> list[Issue]:
    out = IssueCollector(limit)
    _check_graph(graph, source, out)
    return out.issues


def _check_graph(graph: Graph, source: str, out: IssueCollector) -> None:
    stream_ids = {s.id for s in graph.header.streams}
    ids: set[int] = set()
    for n in graph.nodes:
        if n.id in ids:
            out.add("unique-ids", f"node id {n.id} is used more than once", _where(source, graph, n))
        ids.add(n.id)
        check_node(n, stream_ids, out, _where(source, graph, n))
        if out.full:
            return
    for n in graph.nodes:
        for d in n.deps:
            if d.id not in ids:
                out.add("dep-exists", f"dependency on node {d.id}, which does not exist", _where(source, graph, n))
            elif d.id == n.id:
                out.add("acyclic", "node depends on itself", _where(source, graph, n))
    _check_acyclic(graph, ids, source, out)
    seqs: dict[str, list[tuple[int, pb.Node]]] = defaultdict(list)
    for n in graph.nodes:
        if n.kind == pb.KIND_COLLECTIVE and n.HasField("collective"):
            seqs[n.collective.group].append((n.collective.seq, n))
    for key, items in seqs.items():
        got = sorted(s for s, _ in items)
        if got != list(range(len(items))):
            # The first node, in sequence order, whose number is not its position.
            ranked = sorted(items, key=lambda t: (t[0], t[1].id))
            bad = next(n for i, (s, n) in enumerate(ranked) if s != i)
            out.add("collective-seq", f"collectives on group {key!r} are not numbered 0..{len(items) - 1}",
                    _where(source, graph, bad))


def _check_acyclic(graph: Graph, ids: set[int], source: str, out: IssueCollector) -> None:
    """Kahn's algorithm; on a cycle, name one node on it."""
    indeg: dict[int, int] = {i: 0 for i in ids}
    children: dict[int, list[int]] = defaultdict(list)
    for n in graph.nodes:
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
        for n in graph.nodes:
            if n.id in left:
                deps_of[n.id].extend(d.id for d in n.deps if d.id in left and d.id != n.id)
        stuck = min(left)
        visited: set[int] = set()
        while stuck not in visited and deps_of[stuck]:
            visited.add(stuck)
            stuck = min(deps_of[stuck])
        out.add("acyclic", f"dependency cycle through node {stuck}", _where(source, graph, graph.node(stuck)))


# -- job level --------------------------------------------------------------------------------
@dataclass
class _GraphSignature:
    collectives: dict[str, list[pb.Node]]           # group key -> nodes by seq
    p2p: dict[tuple[str, int, bool], list[pb.Node]]  # (key, peer, is_send) -> nodes by seq
    keys: set[str]


def _signature(graph: Graph) -> _GraphSignature:
    colls: dict[str, list[pb.Node]] = defaultdict(list)
    p2p: dict[tuple[str, int, bool], list[pb.Node]] = defaultdict(list)
    for n in graph.nodes:
        if n.kind == pb.KIND_COLLECTIVE and n.HasField("collective"):
            colls[n.collective.group].append(n)
        elif n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.HasField("p2p"):
            p2p[(n.p2p.group, n.p2p.peer, n.kind == pb.KIND_SEND)].append(n)
    for v in colls.values():
        v.sort(key=lambda n: n.collective.seq)
    for v in p2p.values():
        v.sort(key=lambda n: n.p2p.seq)
    keys = set(colls) | {k[0] for k in p2p} | set(graph.header.group_sizes)
    return _GraphSignature(dict(colls), dict(p2p), keys)


def check_job(job: Job, *, limit: int = 100) -> list[Issue]:
    """All invariant violations of ``job`` (at most ``limit``)."""
    out = IssueCollector(limit)
    src = job.source
    m = job.manifest
    where_m = f"{src} manifest" if src else "manifest"

    # groups
    group_ids: set[int] = set()
    for g in m.groups:
        if g.id < 1 or g.id in group_ids:
            out.add("group-defined", f"process group id {g.id} is not unique and >= 1", where_m)
        group_ids.add(g.id)
        if len(set(g.ranks)) != len(g.ranks):
            out.add("group-defined", f"process group {g.id} lists a rank twice", where_m)
        bad = [r for r in g.ranks if r >= m.world_size]
        if bad:
            out.add("group-defined",
                    f"process group {g.id} has rank {bad[0]} outside world size {m.world_size}", where_m)

    # bindings
    ranks = [b.rank for b in m.bindings]
    if sorted(ranks) != list(range(m.world_size)):
        missing = sorted(set(range(m.world_size)) - set(ranks))
        extra = sorted(set(ranks) - set(range(m.world_size)))
        dup = len(ranks) - len(set(ranks))
        detail = []
        if missing:
            detail.append(f"missing ranks {missing[:5]}")
        if extra:
            detail.append(f"ranks beyond world size {extra[:5]}")
        if dup:
            detail.append(f"{dup} duplicate bindings")
        out.add("world-size", f"bindings do not cover ranks 0..{m.world_size - 1}: {', '.join(detail)}", where_m)

    graph_ids = set(job.graph_ids())
    sigs: dict[str, _GraphSignature] = {}
    for gid in sorted(graph_ids):
        graph = job.graph(gid)
        _check_graph(graph, src, out)
        sigs[gid] = _signature(graph)
        if out.full:
            return out.issues

    groups = {g.id: g for g in m.groups}
    member_sets: dict[int, frozenset[int]] = {}  # built on first use: O(1) membership at 100K ranks
    # group id -> list of (rank, graph id, key)
    members: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    for b in m.bindings:
        where_b = f"{where_m} rank {b.rank}"
        if b.graph not in graph_ids:
            out.add("binding-graph", f"bound to graph {b.graph!r}, which the job does not have", where_b)
            continue
        sig = sigs[b.graph]
        header = job.graph(b.graph).header
        for key in sorted(sig.keys):
            if key not in b.groups:
                out.add("group-bound", f"graph {b.graph} uses group key {key!r}, which is not bound", where_b)
                continue
            pg = groups.get(b.groups[key])
            if pg is None:
                out.add("group-bound", f"group key {key!r} is bound to undefined group {b.groups[key]}", where_b)
                continue
            mset = member_sets.get(pg.id)
            if mset is None:
                mset = member_sets[pg.id] = frozenset(pg.ranks)
            if b.rank not in mset:
                out.add("group-bound",
                        f"group key {key!r} is bound to group {pg.id}, which does not contain rank {b.rank}", where_b)
                continue
            want = header.group_sizes.get(key)
            if want and want != len(pg.ranks):
                out.add("group-size", f"graph {b.graph} expects group {key!r} of size {want}, "
                        f"bound group {pg.id} has {len(pg.ranks)}", where_b)
            members[pg.id].append((b.rank, b.graph, key))
        if out.full:
            return out.issues

    _check_collective_sequences(job, groups, members, sigs, out)
    if not out.full:
        _check_p2p(job, groups, sigs, out)
    return out.issues


def _coll_sig(nodes: list[pb.Node]) -> tuple:
    return tuple(
        (n.collective.type, n.collective.in_bytes if n.collective.type in EQUAL_SIZE_COLLECTIVES else -1)
        for n in nodes
    )


def _check_collective_sequences(job, groups, members, sigs, out: IssueCollector) -> None:
    src = job.source
    # Signatures per (graph, key), shared by all groups: ranks that share a graph share them.
    cache: dict[tuple[str, str], tuple] = {}
    for gid in sorted(members):
        pg = groups[gid]
        mem = members[gid]
        bound = {r for r, _, _ in mem}
        for r in pg.ranks:
            if r not in bound:
                # A member with no binding for this group issues no collective on it.
                mem.append((r, "", ""))
        ref_rank, ref_graph, ref_key = min(mem)
        ref = cache.get((ref_graph, ref_key))
        if ref is None:
            ref_nodes = sigs[ref_graph].collectives.get(ref_key, []) if ref_graph else []
            ref = _coll_sig(ref_nodes)
            cache[(ref_graph, ref_key)] = ref
        for rank, graph_id, key in sorted(mem):
            s = cache.get((graph_id, key))
            if s is None:
                nodes = sigs[graph_id].collectives.get(key, []) if graph_id else []
                s = _coll_sig(nodes)
                cache[(graph_id, key)] = s
            if s == ref:
                continue
            nodes = sigs[graph_id].collectives.get(key, []) if graph_id else []
            i = next((i for i, (a, b) in enumerate(zip(s, ref, strict=False)) if a != b), min(len(s), len(ref)))
            where = f"{src + ' ' if src else ''}graph {graph_id or '-'} rank {rank}"
            if i < len(nodes):
                where += f" node {nodes[i].id} ({nodes[i].name})"
            if i >= len(s) or i >= len(ref):
                msg = f"issues {len(s)} collectives on group {pg.id}, rank {ref_rank} issues {len(ref)}"
            else:
                a, b = s[i], ref[i]
                msg = (f"collective #{i} on group {pg.id} is {collective_name(a[0])}"
                       f"{'' if a[1] < 0 else f' of {a[1]} B'}, rank {ref_rank} issues "
                       f"{collective_name(b[0])}{'' if b[1] < 0 else f' of {b[1]} B'}")
            out.add("collective-sequence", msg, where)
            if out.full:
                return


def _check_p2p(job, groups, sigs, out: IssueCollector) -> None:
    src = job.source
    sends: dict[tuple[int, int], list[tuple[pb.Node, int, str]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[pb.Node, int, str]]] = defaultdict(list)
    for b in job.manifest.bindings:
        sig = sigs.get(b.graph)
        if sig is None:
            continue
        for (key, peer, is_send), nodes in sig.p2p.items():
            pg = groups.get(b.groups.get(key, 0))
            if pg is None:
                continue  # reported as group-bound
            if peer >= len(pg.ranks):
                out.add("p2p-match", f"peer {peer} is outside group {pg.id} of size {len(pg.ranks)}",
                        f"{src + ' ' if src else ''}graph {b.graph} rank {b.rank} node {nodes[0].id}")
                continue
            other = pg.ranks[peer]
            target = sends if is_send else recvs
            pair = (b.rank, other) if is_send else (other, b.rank)
            target[pair].extend((n, b.rank, b.graph) for n in nodes)
    for pair in sorted(set(sends) | set(recvs)):
        s, r = sends.get(pair, []), recvs.get(pair, [])
        if len(s) != len(r):
            n, rank, gid = (s or r)[0]
            out.add("p2p-match", f"{len(s)} sends from rank {pair[0]} to rank {pair[1]} but {len(r)} recvs",
                    f"{src + ' ' if src else ''}graph {gid} rank {rank} node {n.id} ({n.name})")
        else:
            for (sn, _, _), (rn, rrank, rgid) in zip(s, r, strict=True):
                if sn.p2p.bytes != rn.p2p.bytes:
                    out.add("p2p-match",
                            f"recv of {rn.p2p.bytes} B from rank {pair[0]} meets a send of {sn.p2p.bytes} B",
                            f"{src + ' ' if src else ''}graph {rgid} rank {rrank} node {rn.id} ({rn.name})")
                    break
        if out.full:
            return


def assert_valid(job: Job) -> None:
    """Raise :class:`CheckError` with the first issue (and a count of the rest)."""
    issues = check_job(job)
    if issues:
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        raise CheckError(f"{issues[0]}{more}")
