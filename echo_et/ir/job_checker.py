"""The Job-level invariants: a Job's manifest, its process groups, the rank -> graph bindings
and what must agree across ranks.

They are kept apart from :mod:`echo_et.ir.checker` (the catalogue ``RULES``, the issue types,
the rules of one graph), which they build on: a graph is proven on its own, a Job only with
all of its graphs and ranks in hand. The groups, from the manifest up:

  check_manifest             schema version, world size, layout, hardware, node fill
  check_groups               the process groups
  check_bindings             the rank -> graph bindings and the groups they resolve to
  check_collective_sequences every member of a group issues the same collectives on it
  check_p2p                  every send has its recv
  check_step_bound           a replayed step cannot leave the IR's time range
  check_job                  all of it; graph signatures are computed once per distinct
                             graph, so cost grows with distinct graphs, not world size
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter

from echo_et.errors import CheckError, OptionError
from echo_et.ir.checker import MAX_GPU_NAME, Issue, IssueCollector, check_graph_rules
from echo_et.ir.graph import Graph
from echo_et.ir.job import Job
from echo_et.ir.limits import (
    MAX_BANDWIDTH_GBPS,
    MAX_CLOCK_OFFSET_NS,
    MAX_GPUS_PER_NODE,
    MAX_NS,
    MAX_WORLD_SIZE,
    check_node_fill,
)
from echo_et.ir.schema import EQUAL_SIZE_COLLECTIVES, SCHEMA_VERSION, collective_name, pb
from echo_et.ir.units import MIN_BANDWIDTH_GBPS

_COMM_KINDS = frozenset({pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV})   # what _signature collects


# -- manifest ---------------------------------------------------------------------------------
def _where_manifest(job: Job) -> str:
    return f"{job.source} manifest" if job.source else "manifest"


def check_manifest(job: Job, out: IssueCollector) -> None:
    """schema-version, world-size (its range), layout, hardware, node-fill."""
    m = job.manifest
    where = _where_manifest(job)
    if m.schema_version != SCHEMA_VERSION:
        out.add("schema-version", f"manifest is of schema {m.schema_version!r}, this echo-et reads "
                f"{SCHEMA_VERSION!r}", where)
    if not 1 <= m.world_size <= MAX_WORLD_SIZE:
        out.add("world-size", f"world size {m.world_size} is not in 1..{MAX_WORLD_SIZE}", where)
    lay = m.layout
    axes = {k: getattr(lay, k) for k in ("dp", "tp", "pp")}
    if any(axes.values()):
        zero = [k for k, v in axes.items() if v == 0]
        if zero:
            out.add("layout", f"layout declares {', '.join(f'{k}={v}' for k, v in axes.items())}: "
                    f"{'/'.join(zero)} must be >= 1", where)
        else:
            prod = axes["dp"] * axes["tp"] * axes["pp"] * max(lay.cp, 1)
            if m.world_size and m.world_size % prod:
                out.add("layout", f"layout dp{axes['dp']} x tp{axes['tp']} x pp{axes['pp']}"
                        f"{f' x cp{lay.cp}' if lay.cp > 1 else ''} = {prod} ranks does not divide "
                        f"world size {m.world_size}", where)
    hw = m.hardware
    for name in ("gpus_per_node", "nics_per_node"):
        if getattr(hw, name) > MAX_GPUS_PER_NODE:
            out.add("hardware", f"{name.replace('_', ' ')} {getattr(hw, name)} is beyond {MAX_GPUS_PER_NODE}", where)
    for name in ("intra_node_bw_gbps", "inter_node_bw_gbps"):
        v = getattr(hw, name)
        if not (v == 0 or MIN_BANDWIDTH_GBPS <= v <= MAX_BANDWIDTH_GBPS):
            out.add("hardware", f"{name} = {v} is neither 0 (unknown) nor a rate from 1 bit/s "
                                f"({MIN_BANDWIDTH_GBPS:g}) to {MAX_BANDWIDTH_GBPS:g} GB/s", where)
    if len(hw.gpu_name) > MAX_GPU_NAME or not hw.gpu_name.isprintable():
        out.add("hardware", f"gpu_name {hw.gpu_name[:40]!r} is not a name of at most {MAX_GPU_NAME} printable "
                            "characters", where)
    if 1 <= hw.gpus_per_node <= MAX_GPUS_PER_NODE and 1 <= m.world_size <= MAX_WORLD_SIZE:
        try:
            check_node_fill(m.world_size, hw.gpus_per_node)
        except OptionError as e:
            out.add("node-fill", f"hardware.gpus_per_node {hw.gpus_per_node}: {e}", where)


def check_groups(job: Job, out: IssueCollector) -> None:
    """group-defined."""
    m = job.manifest
    where = _where_manifest(job)
    group_ids: set[int] = set()
    for g in m.groups:
        if g.id < 1 or g.id in group_ids:
            out.add("group-defined", f"process group id {g.id} is not unique and >= 1", where)
        group_ids.add(g.id)
        if not g.ranks:
            out.add("group-defined", f"process group {g.id} has no members", where)
        elif len(set(g.ranks)) != len(g.ranks):
            out.add("group-defined", f"process group {g.id} lists a rank twice", where)
        bad = [r for r in g.ranks if r >= m.world_size]
        if bad:
            out.add("group-defined",
                    f"process group {g.id} has rank {bad[0]} outside world size {m.world_size}", where)
        if out.full:
            return


def _check_rank_cover(job: Job, out: IssueCollector) -> None:
    """world-size: the bindings cover 0..world_size-1 exactly (without materialising a range
    as long as a corrupt world size)."""
    m = job.manifest
    ranks = [b.rank for b in m.bindings]
    world = m.world_size
    distinct = set(ranks)
    if len(ranks) == world and len(distinct) == world and (not ranks or max(ranks) == world - 1):
        return
    in_range = {r for r in distinct if r < world}
    extra = sorted(r for r in distinct if r >= world)
    dup = len(ranks) - len(distinct)
    detail = []
    if len(in_range) < world:
        missing = []
        for r in range(world):
            if r not in in_range:
                missing.append(r)
                if len(missing) == 5:
                    break
        detail.append(f"missing ranks {missing}" + (f" ({world - len(in_range)} in all)"
                                                     if world - len(in_range) > len(missing) else ""))
    if extra:
        detail.append(f"ranks beyond world size {extra[:5]}")
    if dup:
        detail.append(f"{dup} duplicate bindings")
    out.add("world-size", f"bindings do not cover ranks 0..{world - 1}: {', '.join(detail)}",
            _where_manifest(job))


# -- bindings and cross-rank ------------------------------------------------------------------
@dataclass
class _GraphSignature:
    collectives: dict[str, list[pb.Node]]           # group key -> nodes by seq
    p2p: dict[tuple[str, int, bool], list[pb.Node]]  # (key, peer, is_send) -> nodes by seq
    keys: set[str]
    max_root: dict[str, pb.Node] = field(default_factory=dict)  # key -> rooted node of the highest root


class _CopyOf:
    """A repeat block's copy of a communication node, as the cross-rank rules read it: the
    body node's payload (type, bytes, root, peer) under the copy's id (messages name it)."""

    __slots__ = ("_node", "id")   # two references a copy: the body node's fields are read through

    def __init__(self, node: pb.Node, node_id: int):
        self._node = node
        self.id = node_id

    @property
    def kind(self) -> int:
        return self._node.kind

    @property
    def name(self) -> str:
        return self._node.name

    @property
    def collective(self) -> pb.CollectiveInfo:
        return self._node.collective

    @property
    def p2p(self) -> pb.P2PInfo:
        return self._node.p2p

    def HasField(self, name: str) -> bool:  # noqa: N802 - pb.Node's name, for the rules that read either
        return self._node.HasField(name)


def _signature(graph: Graph) -> _GraphSignature:
    colls: dict[str, list[tuple[int, int, pb.Node]]] = defaultdict(list)
    p2p: dict[tuple[str, int, bool], list[tuple[int, int, pb.Node]]] = defaultdict(list)
    max_root: dict[str, pb.Node] = {}

    def bucket(n: pb.Node) -> list[tuple[int, int, pb.Node]] | None:
        """The list a communication node's (seq, id, node) goes to (None: neither kind's
        payload); a rooted collective may become its key's highest root."""
        if n.kind == pb.KIND_COLLECTIVE and n.HasField("collective"):
            c = n.collective
            if c.HasField("root"):
                top = max_root.get(c.group)
                # ties go to the lowest id: a compact graph names the node its expansion would
                if top is None or (c.root, -n.id) > (top.collective.root, -top.id):
                    max_root[c.group] = n
            return colls[c.group]
        if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.HasField("p2p"):
            return p2p[(n.p2p.group, n.p2p.peer, n.kind == pb.KIND_SEND)]
        return None

    def seq_of(n: pb.Node) -> int:
        return n.collective.seq if n.kind == pb.KIND_COLLECTIVE else n.p2p.seq

    if graph.has_repeats:
        # Every communication node of the expanded graph: a body node, then its copies (a
        # :class:`_CopyOf` it under the copy's id, with the shifted sequence number; a copy
        # has its body node's payload, so it goes where the body node goes and never holds a
        # higher root than it), then the nodes in no body.
        from echo_et.ir.repeats import seq_key

        in_body: set[int] = set()
        for body in graph.bodies():
            in_body.update(n.id for n in body.nodes)
            insts = [(int(inst.id_offset), dict(inst.seq_offsets)) for inst in body.block.instances]
            for n in body.nodes:
                if n.kind not in _COMM_KINDS:
                    continue
                out = bucket(n)
                if out is None:
                    continue
                seq, nid, key = seq_of(n), n.id, seq_key(n)
                out.append((seq, nid, n))
                out.extend([(seq + offs.get(key, 0), nid + off, _CopyOf(n, nid + off)) for off, offs in insts])
        for n in graph.stored_nodes:
            if n.kind in _COMM_KINDS and n.id not in in_body:
                out = bucket(n)
                if out is not None:
                    out.append((seq_of(n), n.id, n))
    else:
        for n in graph.iter_nodes(_COMM_KINDS):
            out = bucket(n)
            if out is not None:
                out.append((seq_of(n), n.id, n))
    # in sequence order (ties, which the numbering rule reports, in id order as stored)
    order = itemgetter(0, 1)
    # keys in sorted order, not in the order nodes were met: the compact walk (bodies first)
    # and the expanded one meet them differently, and findings must come out the same
    by_seq = {k: [n for _, _, n in sorted(v, key=order)] for k, v in sorted(colls.items())}
    p2p_by_seq = {k: [n for _, _, n in sorted(v, key=order)] for k, v in sorted(p2p.items())}
    keys = set(colls) | {k[0] for k in p2p} | set(graph.header.group_sizes)
    return _GraphSignature(by_seq, p2p_by_seq, keys, max_root)


def check_bindings(job: Job, sigs: dict[str, _GraphSignature], out: IssueCollector
                   ) -> dict[int, list[tuple[int, str, str]]]:
    """world-size (coverage), binding-graph, group-bound, group-size, collective-root.
    Returns group id -> [(rank, graph id, key)] for the sequence rules."""
    _check_rank_cover(job, out)
    m = job.manifest
    where_m = _where_manifest(job)
    groups = {g.id: g for g in m.groups}
    member_sets: dict[int, frozenset[int]] = {}  # built on first use: O(1) membership at 100K ranks
    members: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    root_checked: set[tuple[str, str, int]] = set()
    for b in m.bindings:
        where_b = f"{where_m} rank {b.rank}"
        if not -MAX_CLOCK_OFFSET_NS <= b.clock_offset_ns <= MAX_CLOCK_OFFSET_NS:
            out.add("binding-values", f"clock offset {b.clock_offset_ns} ns is beyond +-{MAX_CLOCK_OFFSET_NS} ns",
                    where_b)
        if not 0 <= b.measured_step_ns <= MAX_NS:
            out.add("binding-values", f"measured step {b.measured_step_ns} ns is outside 0..{MAX_NS} ns", where_b)
        sig = sigs.get(b.graph)
        if sig is None:
            out.add("binding-graph", f"bound to graph {b.graph!r}, which the job does not have", where_b)
            continue
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
            rooted = sig.max_root.get(key)
            if rooted is not None and (b.graph, key, pg.id) not in root_checked:
                root_checked.add((b.graph, key, pg.id))
                if rooted.collective.root >= len(pg.ranks):
                    out.add("collective-root", f"{collective_name(rooted.collective.type)} on group {key!r} "
                            f"has root {rooted.collective.root}, outside bound group {pg.id} of "
                            f"{len(pg.ranks)} ranks", f"{where_b} node {rooted.id} ({rooted.name})")
            members[pg.id].append((b.rank, b.graph, key))
        for key in sorted(set(b.groups) - set(sig.keys)):   # bound, unused: still a group of the job
            if b.groups[key] not in groups:
                out.add("group-bound", f"group key {key!r} is bound to undefined group {b.groups[key]}", where_b)
        if out.full:
            break
    return members


def check_job(job: Job, *, limit: int = 100) -> list[Issue]:
    """All invariant violations of ``job`` (at most ``limit``)."""
    out = IssueCollector(limit)
    check_manifest(job, out)
    check_groups(job, out)
    if out.full or not 1 <= job.manifest.world_size <= MAX_WORLD_SIZE:
        return out.issues
    sigs: dict[str, _GraphSignature] = {}
    for gid in sorted(set(job.graph_ids())):
        graph = job.graph(gid)
        kinds = check_graph_rules(graph, job.source, out)
        sigs[gid] = _signature(graph) if kinds is None or not kinds.isdisjoint(_COMM_KINDS) else \
            _GraphSignature({}, {}, set(graph.header.group_sizes))
        if out.full:
            return out.issues
    members = check_bindings(job, sigs, out)
    if out.full:
        return out.issues
    check_collective_sequences(job, members, sigs, out)
    if not out.full:
        check_p2p(job, sigs, out)
    if not out.issues:  # the bound reads times the node rules have proven in range
        check_step_bound(job, out)
    return out.issues


def graph_time_bound(graph: Graph) -> tuple[int, int]:
    """(earliest measured start, an upper bound on the time a replay spends in ``graph``):
    the sum of its node durations (a repeat block's body once per copy, and once itself) plus
    its streams x its measured span. Replay runs a node for at most its measured duration (a
    meeting: its end minus the latest member's start), and the measured gap it keeps before
    a node lies between the measured end of an earlier node of its stream and its start:
    those gaps are disjoint stretches of the span, at most one span per stream."""
    stored = graph.stored_nodes
    if not len(stored):
        return 0, 0
    lo, hi, total = stored[0].start_ns, 0, 0
    streams = set()
    for n in stored:   # one pass, each field read once: this runs on every node check reads
        s, d = n.start_ns, n.duration_ns
        total += d
        if s < lo:
            lo = s
        if s + d > hi:
            hi = s + d
        streams.add(n.stream)
    if graph.has_repeats:
        for body in graph.bodies():
            if not body.nodes:
                continue
            offsets = [inst.time_offset_ns for inst in body.block.instances]
            total += sum(n.duration_ns for n in body.nodes) * len(offsets)
            if offsets:
                lo = min(lo, min(n.start_ns for n in body.nodes) + min(offsets))
                hi = max(hi, max(n.start_ns + n.duration_ns for n in body.nodes) + max(offsets))
    return lo, total + len(streams) * max(0, hi - lo)


def check_step_bound(job: Job, out: IssueCollector) -> None:
    """step-bound: a replayed step fits MAX_NS, so that ``simulate`` (replay) never runs past
    the IR's time range on a Job ``check`` accepts. A critical path of the replay visits each
    node of a distinct graph at most once (members of a meeting run the same node), so it is
    at most the ranks' start spread plus the sum of the distinct graphs' bounds."""
    bounds: dict[str, tuple[int, int]] = {}
    starts = []
    for b in job.manifest.bindings:
        if b.graph not in bounds:
            bounds[b.graph] = graph_time_bound(job.graph(b.graph))
        starts.append(bounds[b.graph][0] + b.clock_offset_ns)
    if not starts:
        return
    spread = max(starts) - min(starts)
    work = sum(w for _, w in bounds.values())
    if spread + work > MAX_NS:
        worst = max(bounds, key=lambda g: bounds[g][1])
        out.add("step-bound", f"a replayed step may run to {spread + work} ns, past {MAX_NS} ns (2**62): the "
                f"ranks' starts spread over {spread} ns and the graphs' durations and gaps add up to {work} ns "
                f"(graph {worst}: {bounds[worst][1]} ns)", _where_manifest(job))


def _coll_sig(nodes: list[pb.Node]) -> tuple:
    return tuple(
        (n.collective.type, n.collective.in_bytes if n.collective.type in EQUAL_SIZE_COLLECTIVES else -1)
        for n in nodes
    )


def check_collective_sequences(job: Job, members: dict[int, list[tuple[int, str, str]]],
                               sigs: dict[str, _GraphSignature], out: IssueCollector) -> None:
    """collective-sequence."""
    src = job.source
    groups = {g.id: g for g in job.manifest.groups}
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


def check_p2p(job: Job, sigs: dict[str, _GraphSignature], out: IssueCollector) -> None:
    """p2p-match."""
    src = job.source
    groups = {g.id: g for g in job.manifest.groups}
    # Each pair's messages as runs of one graph's nodes (a run per binding), and the bytes of
    # each run once per (graph, key, peer, direction): ranks that share a graph share them.
    sends: dict[tuple[int, int], list[tuple[list[pb.Node], int, str]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[list[pb.Node], int, str]]] = defaultdict(list)
    sizes: dict[int, tuple[int, ...]] = {}
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
            target[pair].append((nodes, b.rank, b.graph))
            if id(nodes) not in sizes:
                sizes[id(nodes)] = tuple(n.p2p.bytes for n in nodes)

    def flat(runs: list[tuple[list[pb.Node], int, str]]) -> list[tuple[pb.Node, int, str]]:
        return [(n, rank, gid) for nodes, rank, gid in runs for n in nodes]

    def nbytes(runs: list[tuple[list[pb.Node], int, str]]) -> tuple[int, ...]:
        return sizes[id(runs[0][0])] if len(runs) == 1 else tuple(x for r in runs for x in sizes[id(r[0])])

    for pair in sorted(set(sends) | set(recvs)):
        s_runs, r_runs = sends.get(pair, []), recvs.get(pair, [])
        n_s, n_r = sum(len(x[0]) for x in s_runs), sum(len(x[0]) for x in r_runs)
        if n_s != n_r:
            n, rank, gid = flat(s_runs or r_runs)[0]
            out.add("p2p-match", f"{n_s} sends from rank {pair[0]} to rank {pair[1]} but {n_r} recvs",
                    f"{src + ' ' if src else ''}graph {gid} rank {rank} node {n.id} ({n.name})")
        elif n_s and nbytes(s_runs) != nbytes(r_runs):
            s, r = flat(s_runs), flat(r_runs)
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
