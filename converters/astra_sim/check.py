"""The ASTRA-sim input contract, checked on an export folder (``echo-et check --astra-sim``).

Every rank file is decoded with the mlc-chakra schema and held to what both ASTRA-sim
readers (the legacy feeder and feeder v3 of current master) need to run it to the end.
Each rule has a name, reported with every problem:

  files-present      network.yml, system.json, remote_memory.json and PREFIX.{r}.et for every
                     rank r < N, N the product of npus_count
  network-config     topology/npus_count/bandwidth/latency lists of equal length, known
                     topologies, counts > 1, bandwidth > 0, latency >= 0
  system-config      preferred-dataset-splits >= 1, one collective implementation per dimension
  remote-memory      a memory-type is given
  comm-group         comm_group.json: keys positive integers, values distinct ranks < N, >= 2
  framing            the file is a plain (not gzip) stream of varint-length-prefixed messages
  metadata-first     the first message is a GlobalMetadata with a non-empty version
  node-decode        every later message decodes as a Node and is not empty
  has-nodes          at least one node per rank
  unique-ids         node ids are unique in a file
  ctrl-deps-empty    ctrl_deps is empty (feeder v3 enforces it, the legacy one ignores it)
  dep-exists         every data_dep names a node of the file
  acyclic            data_deps form a DAG (else nodes are silently never issued)
  node-type          only COMP, COMM_COLL, COMM_SEND and COMM_RECV nodes
  is-cpu-op          is_cpu_op is present and a bool, and true only on COMP nodes (ASTRA-sim
                     throws "Comm node should not be on CPU" for a communication node)
  attr-type          attributes carry the exact types the legacy reader reads (comm_type and
                     comm_size int64, comm_src/dst/tag/priority int32, pg_name string,
                     num_ops int64, tensor_size uint64), each at most once
  comp-duration      with roofline-enabled in system.json, a GPU COMP node carries num_ops and
                     tensor_size (ASTRA-sim throws without them); otherwise duration_micros is run
                     as is (0 runs as 1 ns)
  coll-type          comm_type is ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER or ALL_TO_ALL
  comm-size          comm_size present; >= preferred-dataset-splits on collectives, > 0 on P2P
  pg-name            pg_name is "0"/absent (world) or a group of comm_group.json holding the rank
  collective-order   the collectives of one group on a rank are chained by data_deps, so
                     their issue order is fixed
  collective-sequence every member of a group issues the same (comm_type, comm_size) sequence
  p2p-attrs          send: comm_dst (another rank) and comm_tag, comm_src absent or self;
                     recv: comm_src (another rank) and comm_tag, comm_dst absent or self
  p2p-match          every send has exactly one recv with equal (src, dst, tag, size)
  collective-deadlock no two ranks issue the collectives of two groups in opposite orders (each
                     rank runs them one after the other: both would wait for ever)
  start-offsets      start_offsets.json, when present, lists one whole, non-negative number of
                     µs per rank
  world-numbering    collectives on the implicit world (no pg_name) are preceded on every rank
                     by the same number of collectives of smaller groups: ASTRA-sim numbers
                     world collectives with a counter those advance too, and ranks whose
                     counts differ pair the wrong collectives and hang (give the world an
                     explicit group instead)
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf.message import DecodeError

from echo_et.errors import EchoError
from echo_et.ir.checker import Issue, IssueCollector

from .check_configs import (
    check_offsets,
    check_remote_memory,
    comm_groups,
    network_shape,
    system_settings,
    workload_prefix,
)
from .configs import FILE_NAMES
from .mapping import CHAKRA_TYPE_NAMES
from .node_facts import SLOW, WORLD, Facts, FactsCache
from .wire_scan import UNPACK_BYTES, frames, message_number, node_names, split_node, unpack_all

# -- one rank file, read as a stream ------------------------------------------------------------
# A rank file is read once, message by message, keeping per node only its id (an array of 8
# bytes a value) and its data_deps as written (packed varints), decoded into arrays once the
# file is read; what a node message says beyond them (its type, attributes, the problems found
# in it) is cached by the message with the id and the data_deps cut out, so the many nodes that
# differ only there (every micro-batch, every rank of a stage) are decoded once. Collectives
# and sends/recvs are kept as arrays too; a node's name, needed only to word a problem, is read
# back from the file when there is one to report. The findings, and their order, are those of
# the check that read each file whole (tests/test_astra_sim_check_stream.py). The reading is
# wire_scan's, a node message's facts and their cache node_facts'.


class _Ints:
    """Whole numbers appended one by one: 8 bytes each while they fit an int64, a list after
    one does not (attribute values are checked, not trusted to fit)."""

    __slots__ = ("v",)

    def __init__(self) -> None:
        self.v: array | list[int] = array("q")

    def append(self, x: int) -> None:
        try:
            self.v.append(x)
        except OverflowError:
            self.v = [*self.v, x]

    def __len__(self) -> int:
        return len(self.v)

    def __getitem__(self, i: int) -> int:
        return self.v[i]


@dataclass
class _RankSummary:
    # group -> (comm_types, comm_sizes) in issue order
    sequences: dict[str, tuple[_Ints, _Ints]] = field(default_factory=dict)
    # (group, k) -> (group, k) between groups: the rank issues the first collective before the
    # second; within a group, k before k + 1 for k < counts[group] - 1
    cross: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    # per world collective (pg_name absent), the collectives of other groups issued before it
    world_prefix: array = field(default_factory=lambda: array("q"))


class _P2P:
    """Every send and recv of the job, in the order read: (src, dst, tag, size), and the rank
    and message number it is at (its name is read again only to report it)."""

    def __init__(self) -> None:
        self.send = array("b")
        self.src, self.dst, self.tag, self.size = _Ints(), _Ints(), _Ints(), _Ints()
        self.rank = array("q")
        self.message = array("q")


@dataclass
class _Scan:
    """One rank file after the read: per node (file order) its id and its data_deps as written
    (packed varints, node i's ending at byte ``deps_end[i]``); the nodes with something to
    say, sparsely."""

    ids: array = field(default_factory=lambda: array("Q"))
    deps: bytearray = field(default_factory=bytearray)
    deps_end: array = field(default_factory=lambda: array("q"))
    skipped: list[int] = field(default_factory=list)      # message numbers that are not nodes
    # (node index, 0 before dep-exists / 2 after, rule, message, where), at most limit of them
    issues: list[tuple[int, int, str, str, str]] = field(default_factory=list)
    colls: dict[str, tuple[array, list[int], list[int]]] = field(default_factory=dict)  # index, type, size
    # send?, src, dst, tag, size, message number
    p2p: list[tuple[bool, int, int, int, int, int]] = field(default_factory=list)


def _read_rank(path: Path, rank: int, npus: int, groups: dict[str, set[int]], out: IssueCollector,
               cache: FactsCache) -> _Scan | None:
    where_f = str(path)
    try:
        f = path.open("rb")
    except OSError as e:
        out.add("framing", f"cannot read ({e})", where_f)
        return None
    with f:
        if f.read(2) == b"\x1f\x8b":
            out.add("framing", "file is gzip-compressed; ASTRA-sim master reads plain files only", where_f)
            return None
        f.seek(0)
        sc = _Scan()
        ids, deps_a, deps_end, issues, colls, p2p = sc.ids, sc.deps, sc.deps_end, sc.issues, sc.colls, sc.p2p
        cap = out.limit
        try:
            it = frames(f)
            first = next(it, None)
            if first is None:
                out.add("metadata-first", "file is empty", where_f)
                return None
            meta = et.GlobalMetadata()
            try:
                meta.ParseFromString(first)
            except DecodeError as e:
                out.add("metadata-first", f"first message is not a GlobalMetadata ({e})", where_f)
                return None
            if not meta.version:
                out.add("metadata-first", "GlobalMetadata has an empty version", where_f)
            get, by_key, split = cache.get, cache.by_key, split_node
            for i, data in enumerate(it):
                # The common case inline: a message like one met before but for id and deps.
                sp = split(data) if data else None
                fa = None if sp is None else by_key.get(sp[2])
                if fa is None or fa is SLOW:
                    if not data:
                        out.add("node-decode", f"message #{i + 1} is empty (Python readers stop there)", where_f)
                        sc.skipped.append(i + 1)
                        continue
                    got = get(data)
                    if isinstance(got, str):
                        out.add("node-decode", f"message #{i + 1} {got}", where_f)
                        sc.skipped.append(i + 1)
                        continue
                    sp = got
                    fa = got[2]
                nid, seg = sp[0], sp[1]
                k = len(ids)
                ids.append(nid)
                if seg:
                    deps_a += seg
                deps_end.append(len(deps_a))
                if fa.issues or fa.coll or fa.p2p:
                    _note(fa, k, i + 1, nid, where_f, rank, npus, groups, issues, colls, p2p, cap)
        except EchoError as e:
            out.add("framing", str(e), where_f)
            return None
    return sc


def _note(fa: Facts, k: int, msg: int, nid: int, where_f: str, rank: int, npus: int, groups: dict[str, set[int]],
          issues: list, colls: dict, p2p: list, cap: int) -> None:
    """What one node with something to say adds: its own problems, its collective or its
    send/recv once the rank may issue it."""
    where = f"{where_f} node {nid} ({fa.name})"
    for rule, text in fa.issues:
        if len(issues) < cap:
            issues.append((k, 0, rule, text, where))
    if fa.coll is not None:
        key = fa.coll[2]
        if key != WORLD:
            if key not in groups:
                if len(issues) < cap:
                    issues.append((k, 2, "pg-name", f"pg_name {key} is not a group of {FILE_NAMES['comm_group']}",
                                   where))
                return
            if rank not in groups[key]:
                if len(issues) < cap:
                    issues.append((k, 2, "pg-name", f"rank {rank} is not a member of group {key}", where))
                return
        c = colls.get(key)
        if c is None:
            c = colls[key] = (array("q"), [], [])
        c[0].append(k)
        c[1].append(fa.coll[0])
        c[2].append(fa.coll[1])
    elif fa.p2p is not None:
        is_send, src, dst, tag, size = fa.p2p
        other, mine = (dst, src) if is_send else (src, dst)
        other_name = "comm_dst" if is_send else "comm_src"
        if not 0 <= other < npus or other == rank:
            if len(issues) < cap:
                issues.append((k, 2, "p2p-attrs", f"{other_name} {other} is not another rank of 0..{npus - 1}",
                               where))
            return
        if mine is not None and mine != rank:
            if len(issues) < cap:
                issues.append((k, 2, "p2p-attrs", f"{'comm_src' if is_send else 'comm_dst'} {mine} is not "
                               f"this rank {rank}", where))
            return
        p2p.append((is_send, *((rank, other) if is_send else (other, rank)), tag, size, msg))


@dataclass
class _Graph:
    """A rank's dependency graph by unique id (``u``, in id order): ``pos[u]`` its place in the
    issue order, ``udeps[uptr[u]:uptr[u + 1]]`` the ``u`` of its data_deps (-1: no such node),
    ``uid[i]`` the ``u`` of node i of the file."""

    ids: np.ndarray
    uniq: np.ndarray
    uid: memoryview
    uptr: memoryview
    udeps: memoryview
    pos: memoryview
    ptr: memoryview
    dep_u: memoryview     # the u of node i's data_deps: dep_u[ptr[i]:ptr[i + 1]]


def _check_rank(path: Path, rank: int, npus: int, groups: dict[str, set[int]], out: IssueCollector,
                cache: FactsCache, p2p: _P2P) -> _RankSummary | None:
    where_f = str(path)
    sc = _read_rank(path, rank, npus, groups, out, cache)
    if sc is None:
        return None
    if not sc.ids:
        out.add("has-nodes", "no nodes (feeder v3 finds no dependency-free node and aborts)", where_f)
        return None
    ids = np.frombuffer(sc.ids, dtype=np.uint64)
    deps, ptr = unpack_all(sc.deps, sc.deps_end)
    sc.deps, sc.deps_end = bytearray(), array("q")
    n = len(ids)
    by_id: np.ndarray | None = None
    run_start: np.ndarray | None = None
    if n < 2 or bool(np.all(ids[1:] > ids[:-1])):
        # Ids rising through the file (the exporter's case): node i is u = i, no id repeats.
        uniq = ids
        uid = np.arange(n, dtype=np.int64)
    else:
        by_id = np.argsort(ids, kind="stable")
        sorted_ids = ids[by_id]
        run_start = np.ones(n, dtype=bool)
        run_start[1:] = sorted_ids[1:] != sorted_ids[:-1]
        for i in np.sort(by_id[~run_start]).tolist():
            out.add("unique-ids", f"node id {int(ids[i])} is used more than once", f"{where_f} node {int(ids[i])}")
            if out.full:
                break
        uniq = sorted_ids[run_start]
        uid = np.empty(n, dtype=np.int64)
        uid[by_id] = np.cumsum(run_start) - 1
    # The u of each data_dep, -1 where no node has that id.
    dep_u = np.searchsorted(uniq, deps).astype(np.int64, copy=False)
    for s in range(0, len(deps), UNPACK_BYTES):
        u = dep_u[s:s + UNPACK_BYTES]
        u[uniq[np.minimum(u, len(uniq) - 1)] != deps[s:s + UNPACK_BYTES]] = -1
    missing = np.flatnonzero(dep_u < 0)
    dep_issues: list[tuple[int, int, str, str, str]] = []
    if len(missing):
        owner = np.searchsorted(ptr, missing, side="right") - 1
        owner, first = np.unique(owner, return_index=True)
        owner, first = owner[:out.limit].tolist(), missing[first[:out.limit]].tolist()
        msg = {k: message_number(k, sc.skipped) for k in owner}
        names = node_names(path, set(msg.values()))
        dep_issues = [(k, 1, "dep-exists", f"data_dep on node {int(deps[p])}, which does not exist",
                       "{} node {} ({})".format(where_f, *names[msg[k]]))
                      for k, p in zip(owner, first, strict=True)]
    for _k, _, rule, text, where in sorted(sc.issues + dep_issues, key=lambda x: x[:2]):
        out.add(rule, text, where)
    for is_send, src, dst, tag, size, k in sc.p2p:
        p2p.send.append(is_send)
        p2p.src.append(src)
        p2p.dst.append(dst)
        p2p.tag.append(tag)
        p2p.size.append(size)
        p2p.rank.append(rank)
        p2p.message.append(k)
    g = _graph(ids, uniq, uid, ptr, deps, dep_u, run_start, by_id, where_f, out)
    del deps
    if g is None:
        return None
    return _order(path, sc, g, out)


def _graph(ids: np.ndarray, uniq: np.ndarray, uid: np.ndarray, ptr: np.ndarray, deps: np.ndarray,
           dep_u: np.ndarray, run_start: np.ndarray | None, by_id: np.ndarray | None, where: str,
           out: IssueCollector) -> _Graph | None:
    """The graph by u (``by_id`` None: node i is u = i), in issue order."""
    n, nu = len(ids), len(uniq)
    counts = np.diff(ptr)
    last: np.ndarray | None = None
    if nu == n and _deps_below(ids, ptr, deps):
        # Every dependency names a smaller id: id order is topological (the exporter's case).
        last = by_id
        pos = np.arange(nu, dtype=np.int64)
    else:
        if by_id is not None and run_start is not None:
            last = by_id[np.append(np.flatnonzero(run_start)[1:], n) - 1]   # last node of each id
        pos = None
    # The data_deps of the last node of each id (a later one replaces it).
    if last is None:
        lens, uptr, udeps = counts, ptr, dep_u
    else:
        lens = counts[last]
        uptr = np.zeros(nu + 1, dtype=np.int64)
        np.cumsum(lens, out=uptr[1:])
        gather = np.repeat(ptr[last] - uptr[:-1], lens) + np.arange(uptr[-1], dtype=np.int64)
        udeps = dep_u[gather]
    if pos is None:
        pos = _kahn(ids, uniq, uid, udeps, uptr, lens, where, out)
        if pos is None:
            return None
    mv = memoryview
    return _Graph(ids, uniq, mv(uid), mv(uptr), mv(udeps), mv(pos), mv(ptr), mv(dep_u))


def _deps_below(ids: np.ndarray, ptr: np.ndarray, deps: np.ndarray) -> bool:
    """True when every node's data_deps name smaller ids (compared a slice of nodes at a time)."""
    step = UNPACK_BYTES
    for s in range(0, len(ids), step):
        e = min(s + step, len(ids))
        a, z = ptr[s], ptr[e]
        if z > a and not bool(np.all(deps[a:z] < np.repeat(ids[s:e], np.diff(ptr[s:e + 1])))):
            return False
    return True


def _kahn(ids: np.ndarray, uniq: np.ndarray, uid: np.ndarray, udeps: np.ndarray, uptr: np.ndarray,
          lens: np.ndarray, where: str, out: IssueCollector) -> np.ndarray | None:
    """Issue order by Kahn's algorithm, the smallest ready id first; None after reporting a
    node that depends on itself or a cycle."""
    nu = len(uniq)
    owner = np.repeat(np.arange(nu, dtype=np.int64), lens)
    selfish = np.unique(owner[udeps == owner])
    if len(selfish):
        # The first id met in the file whose (last) node depends on itself.
        first_seen = np.full(nu, len(ids), dtype=np.int64)
        np.minimum.at(first_seen, uid, np.arange(len(ids), dtype=np.int64))
        u = int(selfish[np.argmin(first_seen[selfish])])
        out.add("acyclic", "node depends on itself", f"{where} node {int(uniq[u])}")
        return None
    keep = udeps >= 0
    edges = np.unique(owner[keep] * nu + udeps[keep])   # (child, parent), each once
    child, parent = edges // nu, edges % nu
    indeg = np.bincount(child, minlength=nu)
    by_parent = np.argsort(parent, kind="stable")
    kids = memoryview(child[by_parent])
    kptr = np.zeros(nu + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent, minlength=nu), out=kptr[1:])
    kp = memoryview(kptr)
    deg = memoryview(indeg)
    pos = np.full(nu, -1, dtype=np.int64)
    pv = memoryview(pos)
    ready = np.flatnonzero(indeg == 0).tolist()   # sorted: a heap already
    k = 0
    while ready:
        u = heapq.heappop(ready)
        pv[u] = k
        k += 1
        for c in kids[kp[u]:kp[u + 1]]:
            deg[c] -= 1
            if deg[c] == 0:
                heapq.heappush(ready, c)
    if k != nu:
        stuck = int(uniq[int(np.flatnonzero(pos < 0)[0])])
        out.add("acyclic", f"dependency cycle through node {stuck} (its nodes are never issued)",
                f"{where} node {stuck}")
        return None
    return pos


def _reaches(b: int, a: int, g: _Graph) -> bool:
    """True when node ``b`` (an index in the file) depends on node ``a`` through data_deps."""
    ptr, dep_u, tu = g.ptr, g.dep_u, g.uid[a]
    for p in range(ptr[b], ptr[b + 1]):
        if dep_u[p] == tu:
            return True
    floor = g.pos[tu]
    uptr, udeps, pos = g.uptr, g.udeps, g.pos
    start = g.uid[b]
    stack = [start]
    seen = {start}
    while stack:
        u = stack.pop()
        for p in range(uptr[u], uptr[u + 1]):
            d = udeps[p]
            if d == tu:
                return True
            if d >= 0 and d not in seen and pos[d] > floor:
                seen.add(d)
                stack.append(d)
    return False


def _order(path: Path, sc: _Scan, g: _Graph, out: IssueCollector) -> _RankSummary:
    """collective-order on one rank, and what the cross-rank rules need from it."""
    where_f = str(path)
    uid, pos = g.uid, g.pos
    summary = _RankSummary()
    sorted_colls: dict[str, list[int]] = {}
    unchained: list[tuple[str, int, int]] = []    # group, previous collective, collective
    for key, (idx, types, sizes) in sc.colls.items():
        order = sorted(range(len(idx)), key=lambda j: pos[uid[idx[j]]])
        cs = [idx[j] for j in order]
        for a, b in zip(cs, cs[1:], strict=False):
            if not _reaches(b, a, g):
                unchained.append((key, a, b))
                break
        sorted_colls[key] = cs
        t, s = _Ints(), _Ints()
        for j in order:
            t.append(types[j])
            s.append(sizes[j])
        summary.sequences[key] = (t, s)
        summary.counts[key] = len(cs)
    if unchained:
        msg = {b: message_number(b, sc.skipped) for _, _, b in unchained}
        names = node_names(path, set(msg.values()))
        for key, a, b in unchained:
            bid, bname = names[msg[b]]
            out.add("collective-order", f"collective {bid} does not depend (through data_deps) on the "
                    f"previous collective {int(g.ids[a])} of group {key}, so ranks may issue them in "
                    "different orders", f"{where_f} node {bid} ({bname})")
    # The order this rank issues collectives of different groups in, where it is fixed.
    keys = list(sorted_colls)
    flat_pos = np.array([pos[uid[i]] for key in keys for i in sorted_colls[key]], dtype=np.int64)
    flat_key = np.repeat(np.arange(len(keys)), [len(sorted_colls[k]) for k in keys])
    flat_k = np.concatenate([np.arange(len(sorted_colls[k])) for k in keys]) if keys else np.zeros(0, np.int64)
    flat_i = np.array([i for key in keys for i in sorted_colls[key]], dtype=np.int64)
    merged = np.argsort(flat_pos, kind="stable")
    mk, mkk, mi = flat_key[merged].tolist(), flat_k[merged].tolist(), flat_i[merged].tolist()
    for j in range(len(mk) - 1):
        if mk[j] != mk[j + 1] and _reaches(mi[j + 1], mi[j], g):
            summary.cross.append(((keys[mk[j]], mkk[j]), (keys[mk[j + 1]], mkk[j + 1])))
    if WORLD in sorted_colls:
        world, others = keys.index(WORLD), 0
        for key in mk:
            if key == world:
                summary.world_prefix.append(others)
            else:
                others += 1
    return summary


def _digest(seq: tuple[_Ints, _Ints]) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    types, sizes = seq
    for i in range(len(types)):
        h.update(f"{types[i]}:{sizes[i]};".encode())
    return h.hexdigest()


class _IssueOrder:
    """The issue order of collective instances across ranks, (group, k) -> (group, k), each
    edge with the first rank that has it: within a group k -> k + 1, kept as each rank's count
    of the group's collectives; between groups the edges the ranks give (one where a rank
    switches groups)."""

    def __init__(self) -> None:
        self.counts: dict[str, tuple[array, array]] = {}   # group -> (ranks, counts), rank order
        self.cross: dict[tuple[tuple[str, int], tuple[str, int]], int] = {}

    def add(self, rank: int, s: _RankSummary) -> None:
        for key, c in s.counts.items():
            if c > 1:
                rs = self.counts.setdefault(key, (array("q"), array("q")))
                rs[0].append(rank)
                rs[1].append(c)
        for e in s.cross:
            self.cross.setdefault(e, rank)


def check_export(folder, *, limit: int = 100) -> list[Issue]:
    """Every violation of the ASTRA-sim input contract in an export folder (at most ``limit``)."""
    folder = Path(folder)
    out = IssueCollector(limit)
    if not folder.is_dir():
        out.add("files-present", "not a folder", str(folder))
        return out.issues
    npus, dims = network_shape(folder, out)
    splits, roofline = system_settings(folder, dims, out)
    check_remote_memory(folder, out)
    groups = comm_groups(folder, npus, out)
    if npus is None:
        return out.issues
    prefix = workload_prefix(folder)
    p2p = _P2P()
    cache = FactsCache(splits, roofline=roofline)
    # group -> digest -> (first rank, sequence); group -> rank -> digest
    reps: dict[str, dict[str, tuple[int, tuple[_Ints, _Ints]]]] = defaultdict(dict)
    seen: dict[str, dict[int, str]] = defaultdict(dict)
    unread: set[int] = set()   # ranks whose sequences are unknown: left out of cross-rank rules
    issue_order = _IssueOrder()
    prefixes: dict[int, array] = {}
    for r in range(npus):
        path = folder / f"{prefix}.{r}.et"
        if not path.is_file():
            out.add("files-present", f"rank {r} has no workload file (ASTRA-sim exits)", str(path))
            unread.add(r)
            continue
        s = _check_rank(path, r, npus, groups, out, cache, p2p)
        if s is None:
            unread.add(r)
        else:
            issue_order.add(r, s)
            prefixes[r] = s.world_prefix
            for key, seq in s.sequences.items():
                d = _digest(seq)
                reps[key].setdefault(d, (r, seq))
                seen[key][r] = d
        if out.full:
            return out.issues
    _check_sequences(folder, prefix, npus, groups, reps, seen, unread, out)
    _check_cross_order(folder, prefix, issue_order, out)
    _check_world_numbering(folder, prefix, prefixes, out)
    check_offsets(folder, npus, out)
    _check_p2p(folder, prefix, p2p, unread, out)
    return out.issues


def _check_sequences(folder: Path, prefix: str, npus: int, groups: dict[str, set[int]],
                     reps: dict, seen: dict, unread: set[int], out: IssueCollector) -> None:
    none: tuple[_Ints, _Ints] = (_Ints(), _Ints())
    empty = _digest(none)
    for key in sorted(set(reps) | set(groups), key=lambda k: int(k)):
        members = [r for r in (range(npus) if key == WORLD else sorted(groups.get(key, ())))
                   if r not in unread]
        if not members:
            continue
        digests = {r: seen.get(key, {}).get(r, empty) for r in members}
        if len(set(digests.values())) <= 1:
            continue
        ref_rank = min(digests)
        ref_d = digests[ref_rank]
        ref_t, ref_s = reps[key].get(ref_d, (ref_rank, none))[1]
        for r in sorted(digests):
            if digests[r] == ref_d:
                continue
            t, s = reps[key].get(digests[r], (r, none))[1]
            common = min(len(t), len(ref_t))
            i = next((i for i in range(common) if t[i] != ref_t[i] or s[i] != ref_s[i]), common)
            name = "world" if key == WORLD else f"group {key}"
            if i >= len(t) or i >= len(ref_t):
                msg = f"issues {len(t)} collectives on {name}, rank {ref_rank} issues {len(ref_t)}"
            else:
                msg = (f"collective #{i} on {name} is {CHAKRA_TYPE_NAMES.get(t[i], t[i])} of {s[i]} B, "
                       f"rank {ref_rank} issues {CHAKRA_TYPE_NAMES.get(ref_t[i], ref_t[i])} of {ref_s[i]} B")
            out.add("collective-sequence", msg, str(folder / f"{prefix}.{r}.et"))
            if out.full:
                return


def _check_cross_order(folder: Path, prefix: str, io: _IssueOrder, out: IssueCollector) -> None:
    """A cycle in the issue order of collective instances across ranks: a deadlock."""
    most = {key: max(c) for key, (_, c) in io.counts.items()}
    reach = {key: np.maximum.accumulate(np.frombuffer(c, dtype=np.int64)) for key, (_, c) in io.counts.items()}
    cross: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    for a, b in io.cross:
        cross[a].append(b)
    size = dict.fromkeys(most, 0)
    for a, b in io.cross:
        for key, k in (a, b):
            size[key] = max(size.get(key, 0), k + 1)
    color = {key: bytearray(max(n, most.get(key, 0))) for key, n in size.items()}

    def kids(node: tuple[str, int]) -> Iterator[tuple[str, int]]:
        key, k = node
        found = list(cross.get(node, ()))
        if k + 2 <= most.get(key, 0):
            found.append((key, k + 1))
        return iter(sorted(found))

    def first_rank(a: tuple[str, int], b: tuple[str, int]) -> int:
        if a[0] != b[0]:
            return io.cross[(a, b)]
        ranks, _ = io.counts[a[0]]
        return ranks[int(np.searchsorted(reach[a[0]], a[1] + 2))]

    def starts() -> Iterator[tuple[str, int]]:
        by_key: dict[str, list[int]] = defaultdict(list)
        for key, k in cross:
            by_key[key].append(k)
        for key in sorted(set(by_key) | set(most)):
            last = None
            for k in heapq.merge(range(most.get(key, 0) - 1), sorted(by_key.get(key, ()))):
                if k != last:
                    yield key, k
                    last = k

    for start in starts():
        if color[start[0]][start[1]]:
            continue
        stack = [(start, kids(start))]
        color[start[0]][start[1]] = 1
        path = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node[0]][node[1]] = 2
                stack.pop()
                path.pop()
                continue
            c = color[nxt[0]][nxt[1]]
            if c == 1:
                cyc = path[path.index(nxt):] + [nxt]
                a, b = cyc[0], cyc[1]
                ra, rb = first_rank(a, b), first_rank(cyc[-2], cyc[-1])
                name = lambda x: f"#{x[1]} on {'world' if x[0] == WORLD else 'group ' + x[0]}"  # noqa: E731
                out.add("collective-deadlock", f"rank {ra} issues collective {name(a)} before {name(b)}, "
                        f"but rank {rb} issues {name(cyc[-2])} before {name(cyc[-1])}: each waits for the "
                        "other for ever", str(folder / f"{prefix}.{rb}.et"))
                return
            if c == 0:
                color[nxt[0]][nxt[1]] = 1
                path.append(nxt)
                stack.append((nxt, kids(nxt)))


def _check_world_numbering(folder: Path, prefix: str, prefixes: dict[int, array], out: IssueCollector) -> None:
    if not prefixes or not any(any(p) for p in prefixes.values()):
        return
    ref_rank = min(prefixes)
    ref = prefixes[ref_rank]
    for r in sorted(prefixes):
        mine = prefixes[r]
        k = next((i for i, (a, b) in enumerate(zip(mine, ref, strict=False)) if a != b), None)
        if k is not None:
            out.add("world-numbering", f"world collective #{k} follows {mine[k]} collective(s) of smaller groups "
                    f"here but {ref[k]} on rank {ref_rank}: ASTRA-sim would pair the wrong world collectives "
                    "and hang", str(folder / f"{prefix}.{r}.et"))
            return


def _check_p2p(folder: Path, prefix: str, p2p: _P2P, unread: set[int], out: IssueCollector) -> None:
    """Sends and recvs matched on (src, dst, tag, size), in that order of keys."""
    n = len(p2p.rank)
    if not n or out.full:
        return
    cols = (p2p.src.v, p2p.dst.v, p2p.tag.v, p2p.size.v)
    src, dst, tag, size = cols
    if all(isinstance(c, array) for c in cols):
        order = np.lexsort([np.frombuffer(c, dtype=np.int64) for c in reversed(cols)]).tolist()
    else:
        order = sorted(range(n), key=lambda i: (src[i], dst[i], tag[i], size[i]))
    found: list[tuple[tuple[int, int, int, int], int, int, int]] = []   # key, sends, recvs, where
    room = out.limit - len(out.issues)
    j = 0
    while j < n and len(found) < room:
        x = order[j]
        key = (src[x], dst[x], tag[x], size[x])
        sends = recvs = 0
        first = [-1, -1]    # recv, send
        while j < n:
            y = order[j]
            if (src[y], dst[y], tag[y], size[y]) != key:
                break
            is_send = p2p.send[y]
            if is_send:
                sends += 1
            else:
                recvs += 1
            if first[is_send] < 0:
                first[is_send] = y
            j += 1
        if key[0] in unread or key[1] in unread or sends == recvs:
            continue
        found.append((key, sends, recvs, first[1] if sends > recvs else first[0]))
    want: dict[int, set[int]] = defaultdict(set)
    for *_, y in found:
        want[p2p.rank[y]].add(p2p.message[y])
    names = {r: node_names(folder / f"{prefix}.{r}.et", ms) for r, ms in want.items()}
    for (s_rank, d_rank, t, sz), sends, recvs, y in found:
        r = p2p.rank[y]
        nid, name = names[r][p2p.message[y]]
        out.add("p2p-match", f"{sends} send(s) but {recvs} recv(s) of {sz} B from rank {s_rank} to rank {d_rank} "
                f"with tag {t} (a recv matches a send on equal src, dst, tag and size)",
                f"{folder / f'{prefix}.{r}.et'} node {nid} ({name})")
