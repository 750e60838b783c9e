"""The ASTRA-sim contract check as it was before it streamed (main at e153789): every rank
file read whole and every node kept as a Python object. Only the equivalence tests use it
(tests/test_astra_sim_check_stream.py): the streaming check must report exactly what this
one reports, in the same order. The rules are those of echo_et.converters.astra_sim.check;
the configuration files are checked by the same code (check_configs)."""

from __future__ import annotations

import hashlib
import heapq
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf.message import DecodeError

from echo_et.converters.astra_sim.check_configs import (
    check_offsets,
    check_remote_memory,
    comm_groups,
    network_shape,
    system_settings,
    workload_prefix,
)
from echo_et.converters.astra_sim.configs import FILE_NAMES
from echo_et.converters.astra_sim.mapping import CHAKRA_TYPE_NAMES, SUPPORTED_COMM_TYPES
from echo_et.converters.astra_sim.node_facts import ALLOWED_TYPES, ATTR_TYPES, WORLD
from echo_et.errors import EchoError
from echo_et.ir.checker import Issue, IssueCollector


# -- one rank file ----------------------------------------------------------------------------
@dataclass
class _RankSummary:
    sequences: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # (group, k) -> (group, k): the rank issues the first collective before the second
    order: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)
    # per world collective (pg_name absent), the collectives of other groups issued before it
    world_prefix: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Facts:
    """What the checks need from one node message, independent of the rank it is on (rank
    files that share a graph repeat most node messages byte for byte, so facts are cached
    by the message bytes)."""

    id: int
    name: str
    type: int
    deps: tuple[int, ...]
    issues: tuple[tuple[str, str], ...]          # (rule, message) found in the node alone
    coll: tuple[int, int, str] | None = None     # comm_type, comm_size, group key
    p2p: tuple[bool, int | None, int | None, int | None, int] | None = None  # send?, src, dst, tag, size


def _int_attr(attrs: dict, name: str) -> int | None:
    v = attrs.get(name)
    if v is None or v[0] not in ("int64_val", "int32_val", "uint64_val", "uint32_val"):
        return None
    return int(v[1])


def _facts(data: bytes, splits: int | None, roofline: bool = False) -> _Facts | str:
    """Facts of one node message, or a decode error message."""
    n = et.Node()
    try:
        n.ParseFromString(data)
    except DecodeError as e:
        return f"does not decode as a Node ({e})"
    issues: list[tuple[str, str]] = []
    if n.ctrl_deps:
        issues.append(("ctrl-deps-empty", f"ctrl_deps {list(n.ctrl_deps)[:5]} (put ordering in data_deps)"))
    base = {"id": n.id, "name": n.name, "type": n.type, "deps": tuple(n.data_deps)}
    if n.type not in ALLOWED_TYPES:
        name = et.NodeType.Name(n.type) if n.type in et.NodeType.values() else str(n.type)
        issues.append(("node-type", f"node type {name} is not one ASTRA-sim runs (use COMP, "
                       "COMM_COLL, COMM_SEND or COMM_RECV)"))
        return _Facts(**base, issues=tuple(issues))
    attrs: dict[str, tuple[str, object]] = {}
    for a in n.attr:
        kind = a.WhichOneof("value") or ""
        if a.name in attrs and a.name in ATTR_TYPES:
            issues.append(("attr-type", f"attribute {a.name} appears more than once"))
        attrs[a.name] = (kind, getattr(a, kind) if kind else None)
        want = ATTR_TYPES.get(a.name)
        if want is not None and kind != want:
            issues.append(("attr-type", f"attribute {a.name} is {kind or 'unset'}, ASTRA-sim reads {want}"))
    cpu = attrs.get("is_cpu_op")
    on_cpu = cpu is not None and cpu[0] == "bool_val" and bool(cpu[1])
    if cpu is None:
        issues.append(("is-cpu-op", "is_cpu_op is missing (older readers default it to true)"))
    elif on_cpu and n.type != et.COMP_NODE:
        issues.append(("is-cpu-op", "is_cpu_op is true on a communication node (ASTRA-sim throws "
                       "\"Comm node should not be on CPU\")"))
    if n.type == et.COMP_NODE:
        if roofline and not on_cpu and not (_int_attr(attrs, "num_ops") and _int_attr(attrs, "tensor_size")):
            issues.append(("comp-duration", "GPU COMP node without num_ops and tensor_size while "
                           "roofline-enabled is on (ASTRA-sim throws)"))
        return _Facts(**base, issues=tuple(issues))
    size = _int_attr(attrs, "comm_size")
    if n.type == et.COMM_COLL_NODE:
        ctype = _int_attr(attrs, "comm_type")
        if ctype is None:
            issues.append(("coll-type", "comm_type is missing"))
            return _Facts(**base, issues=tuple(issues))
        if ctype not in SUPPORTED_COMM_TYPES:
            issues.append(("coll-type", f"comm_type {ctype} is not one of "
                           f"{', '.join(CHAKRA_TYPE_NAMES[t] for t in sorted(SUPPORTED_COMM_TYPES))}"))
        if size is None:
            issues.append(("comm-size", "comm_size is missing"))
        elif size <= 0 or (splits and size < splits):
            issues.append(("comm-size", f"comm_size {size} is below preferred-dataset-splits {splits} "
                           "(ASTRA-sim divides it into zero-size chunks)"))
        key = WORLD
        pg = attrs.get("pg_name")
        if pg is not None and pg[0] == "string_val":
            key = str(pg[1]) or WORLD
            if not key.isdigit():
                issues.append(("pg-name", f"pg_name {key!r} is not a decimal integer"))
                return _Facts(**base, issues=tuple(issues))
            key = str(int(key))
        return _Facts(**base, issues=tuple(issues),
                      coll=(ctype, size if size is not None else -1, key))
    is_send = n.type == et.COMM_SEND_NODE
    src, dst, tag = (_int_attr(attrs, k) for k in ("comm_src", "comm_dst", "comm_tag"))
    other = dst if is_send else src
    if other is None:
        issues.append(("p2p-attrs", f"{'comm_dst' if is_send else 'comm_src'} is missing"))
    elif tag is None:
        issues.append(("p2p-attrs", "comm_tag is missing"))
    elif size is None or size <= 0:
        issues.append(("comm-size", f"comm_size {size} on a {'send' if is_send else 'recv'}"))
    else:
        return _Facts(**base, issues=tuple(issues), p2p=(is_send, src, dst, tag, size))
    return _Facts(**base, issues=tuple(issues))


class _FactsCache:
    def __init__(self, splits: int | None, limit: int = 200_000, roofline: bool = False):
        self.splits = splits
        self.roofline = roofline
        self.limit = limit
        self._d: dict[bytes, _Facts | str] = {}

    def get(self, data: bytes) -> _Facts | str:
        f = self._d.get(data)
        if f is None:
            f = _facts(data, self.splits, self.roofline)
            if len(self._d) >= self.limit:
                self._d.clear()
            self._d[data] = f
        return f


def _messages(data: bytes) -> Iterator[bytes]:
    """The varint-length-prefixed messages of a file held in memory (faster than reading
    the prefix byte by byte)."""
    i, n = 0, len(data)
    while i < n:
        shift = size = 0
        while True:
            if i >= n:
                raise EchoError("truncated length prefix")
            b = data[i]
            i += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise EchoError("length prefix longer than 10 bytes (not a length-delimited stream)")
        if i + size > n:
            raise EchoError(f"truncated message: expected {size} bytes, found {n - i}")
        yield data[i:i + size]
        i += size


def _read_rank(path: Path, out: IssueCollector, cache: _FactsCache) -> list[_Facts] | None:
    where_f = str(path)
    content = path.read_bytes()
    if content[:2] == b"\x1f\x8b":
        out.add("framing", "file is gzip-compressed; ASTRA-sim master reads plain files only", where_f)
        return None
    facts: list[_Facts] = []
    try:
        it = _messages(content)
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
        for i, data in enumerate(it):
            if not data:
                out.add("node-decode", f"message #{i + 1} is empty (Python readers stop there)", where_f)
                continue
            fa = cache.get(data)
            if isinstance(fa, str):
                out.add("node-decode", f"message #{i + 1} {fa}", where_f)
                continue
            facts.append(fa)
    except EchoError as e:
        out.add("framing", str(e), where_f)
        return None
    return facts


def _check_rank(path: Path, rank: int, npus: int, groups: dict[str, set[int]], out: IssueCollector,
                cache: _FactsCache, sends: Counter, recvs: Counter,
                where_msg: dict) -> _RankSummary | None:
    where_f = str(path)
    facts = _read_rank(path, out, cache)
    if facts is None:
        return None
    if not facts:
        out.add("has-nodes", "no nodes (feeder v3 finds no dependency-free node and aborts)", where_f)
        return None
    ids: dict[int, _Facts] = {}
    for n in facts:
        if n.id in ids:
            out.add("unique-ids", f"node id {n.id} is used more than once", f"{where_f} node {n.id}")
        ids[n.id] = n
    summary = _RankSummary()
    colls: dict[str, list[_Facts]] = defaultdict(list)
    for n in facts:
        if not (n.issues or n.coll or n.p2p) and all(d in ids for d in n.deps):
            continue  # the common case: a clean compute node
        where = f"{where_f} node {n.id} ({n.name})"
        for rule, msg in n.issues:
            out.add(rule, msg, where)
        missing = [d for d in n.deps if d not in ids]
        if missing:
            out.add("dep-exists", f"data_dep on node {missing[0]}, which does not exist", where)
        if n.coll is not None:
            key = n.coll[2]
            if key != WORLD:
                if key not in groups:
                    out.add("pg-name", f"pg_name {key} is not a group of {FILE_NAMES['comm_group']}", where)
                    continue
                if rank not in groups[key]:
                    out.add("pg-name", f"rank {rank} is not a member of group {key}", where)
                    continue
            colls[key].append(n)
        elif n.p2p is not None:
            is_send, src, dst, tag, size = n.p2p
            other, mine = (dst, src) if is_send else (src, dst)
            other_name = "comm_dst" if is_send else "comm_src"
            if not 0 <= other < npus or other == rank:
                out.add("p2p-attrs", f"{other_name} {other} is not another rank of 0..{npus - 1}", where)
                continue
            if mine is not None and mine != rank:
                out.add("p2p-attrs", f"{'comm_src' if is_send else 'comm_dst'} {mine} is not this "
                        f"rank {rank}", where)
                continue
            key4 = (rank, other, tag, size) if is_send else (other, rank, tag, size)
            (sends if is_send else recvs)[key4] += 1
            where_msg.setdefault(("send" if is_send else "recv", key4), where)
    order = _topological_positions(facts, ids, where_f, out)
    if order is None:
        return None
    for key, cs in colls.items():
        cs.sort(key=lambda n: order[n.id])
        for a, b in zip(cs, cs[1:], strict=False):
            if not _reaches(b, a, ids, order):
                out.add("collective-order", f"collective {b.id} does not depend (through data_deps) on the "
                        f"previous collective {a.id} of group {key}, so ranks may issue them in "
                        "different orders", f"{where_f} node {b.id} ({b.name})")
                break
        summary.sequences[key] = [n.coll[:2] for n in cs]
    # The order this rank issues collectives of different groups in, where it is fixed.
    merged = sorted(((order[n.id], key, k, n) for key, cs in colls.items() for k, n in enumerate(cs)),
                    key=lambda x: x[0])
    for (_, ka, ia, a), (_, kb, ib, b) in zip(merged, merged[1:], strict=False):
        if ka != kb and _reaches(b, a, ids, order):
            summary.order.append(((ka, ia), (kb, ib)))
    for key, cs in colls.items():
        summary.order.extend(((key, k), (key, k + 1)) for k in range(len(cs) - 1))
    others = 0
    for _, key, _, _ in merged:
        if key == WORLD:
            summary.world_prefix.append(others)
        else:
            others += 1
    return summary


def _topological_positions(facts: list[_Facts], ids: dict[int, _Facts], where: str,
                           out: IssueCollector) -> dict[int, int] | None:
    if len(ids) == len(facts) and all(d < n.id for n in facts for d in n.deps):
        # Every dependency names a smaller id: id order is topological (the exporter's case).
        return {i: k for k, i in enumerate(sorted(ids))}
    indeg = dict.fromkeys(ids, 0)
    children: dict[int, list[int]] = defaultdict(list)
    for n in ids.values():
        for d in set(n.deps):
            if d == n.id:
                out.add("acyclic", "node depends on itself", f"{where} node {n.id}")
                return None
            if d in ids:
                indeg[n.id] += 1
                children[d].append(n.id)
    ready = [i for i, k in indeg.items() if k == 0]
    heapq.heapify(ready)
    pos: dict[int, int] = {}
    while ready:
        i = heapq.heappop(ready)
        pos[i] = len(pos)
        for c in children.get(i, ()):
            indeg[c] -= 1
            if indeg[c] == 0:
                heapq.heappush(ready, c)
    if len(pos) != len(ids):
        stuck = min(i for i in ids if i not in pos)
        out.add("acyclic", f"dependency cycle through node {stuck} (its nodes are never issued)",
                f"{where} node {stuck}")
        return None
    return pos


def _reaches(node: _Facts, target: _Facts, ids: dict[int, _Facts], pos: dict[int, int]) -> bool:
    """True when ``node`` depends on ``target`` through data_deps."""
    if target.id in node.deps:
        return True
    floor = pos[target.id]
    stack = [node.id]
    seen = {node.id}
    while stack:
        for d in ids[stack.pop()].deps:
            if d == target.id:
                return True
            if d in ids and d not in seen and pos[d] > floor:
                seen.add(d)
                stack.append(d)
    return False


def _digest(seq: list[tuple[int, int]]) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    for t, s in seq:
        h.update(f"{t}:{s};".encode())
    return h.hexdigest()


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
    sends: Counter = Counter()
    recvs: Counter = Counter()
    where_msg: dict = {}
    cache = _FactsCache(splits, roofline=roofline)
    # group -> digest -> (first rank, sequence); group -> rank -> digest
    reps: dict[str, dict[str, tuple[int, list]]] = defaultdict(dict)
    seen: dict[str, dict[int, str]] = defaultdict(dict)
    unread: set[int] = set()   # ranks whose sequences are unknown: left out of cross-rank rules
    edges: dict[tuple[str, int], dict[tuple[str, int], int]] = {}  # issue order -> first rank seen
    prefixes: dict[int, list[int]] = {}
    for r in range(npus):
        path = folder / f"{prefix}.{r}.et"
        if not path.is_file():
            out.add("files-present", f"rank {r} has no workload file (ASTRA-sim exits)", str(path))
            unread.add(r)
            continue
        s = _check_rank(path, r, npus, groups, out, cache, sends, recvs, where_msg)
        if s is None:
            unread.add(r)
        else:
            for a, b in s.order:
                edges.setdefault(a, {}).setdefault(b, r)
            prefixes[r] = s.world_prefix
            for key, seq in s.sequences.items():
                d = _digest(seq)
                reps[key].setdefault(d, (r, seq))
                seen[key][r] = d
        if out.full:
            return out.issues
    _check_sequences(folder, prefix, npus, groups, reps, seen, unread, out)
    _check_cross_order(folder, prefix, edges, out)
    _check_world_numbering(folder, prefix, prefixes, out)
    check_offsets(folder, npus, out)
    _check_p2p(sends, recvs, where_msg, unread, out)
    return out.issues


def _check_sequences(folder: Path, prefix: str, npus: int, groups: dict[str, set[int]],
                     reps: dict, seen: dict, unread: set[int], out: IssueCollector) -> None:
    empty = _digest([])
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
        ref_seq = reps[key].get(ref_d, (ref_rank, []))[1]
        for r in sorted(digests):
            if digests[r] == ref_d:
                continue
            seq = reps[key].get(digests[r], (r, []))[1]
            i = next((i for i, (a, b) in enumerate(zip(seq, ref_seq, strict=False)) if a != b),
                     min(len(seq), len(ref_seq)))
            name = "world" if key == WORLD else f"group {key}"
            if i >= len(seq) or i >= len(ref_seq):
                msg = f"issues {len(seq)} collectives on {name}, rank {ref_rank} issues {len(ref_seq)}"
            else:
                a, b = seq[i], ref_seq[i]
                msg = (f"collective #{i} on {name} is {CHAKRA_TYPE_NAMES.get(a[0], a[0])} of {a[1]} B, "
                       f"rank {ref_rank} issues {CHAKRA_TYPE_NAMES.get(b[0], b[0])} of {b[1]} B")
            out.add("collective-sequence", msg, str(folder / f"{prefix}.{r}.et"))
            if out.full:
                return


def _check_cross_order(folder: Path, prefix: str, edges: dict, out: IssueCollector) -> None:
    """A cycle in the issue order of collective instances across ranks: a deadlock."""
    color: dict[tuple[str, int], int] = {}
    for start in sorted(edges):
        if start in color:
            continue
        stack = [(start, iter(sorted(edges.get(start, {}))))]
        color[start] = 1
        path = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
                continue
            if color.get(nxt) == 1:
                cyc = path[path.index(nxt):] + [nxt]
                a, b = cyc[0], cyc[1]
                ra, rb = edges[a][b], edges[cyc[-2]][cyc[-1]]
                name = lambda x: f"#{x[1]} on {'world' if x[0] == WORLD else 'group ' + x[0]}"  # noqa: E731
                out.add("collective-deadlock", f"rank {ra} issues collective {name(a)} before {name(b)}, "
                        f"but rank {rb} issues {name(cyc[-2])} before {name(cyc[-1])}: each waits for the "
                        "other for ever", str(folder / f"{prefix}.{rb}.et"))
                return
            if nxt not in color:
                color[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, {})))))


def _check_world_numbering(folder: Path, prefix: str, prefixes: dict[int, list[int]], out: IssueCollector) -> None:
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


def _check_p2p(sends: Counter, recvs: Counter, where_msg: dict, unread: set[int],
               out: IssueCollector) -> None:
    for key in sorted(set(sends) | set(recvs)):
        if key[0] in unread or key[1] in unread:
            continue
        s, r = sends.get(key, 0), recvs.get(key, 0)
        if s == r:
            continue
        src, dst, tag, size = key
        kind = "send" if s > r else "recv"
        where = where_msg.get((kind, key), "")
        out.add("p2p-match", f"{s} send(s) but {r} recv(s) of {size} B from rank {src} to rank {dst} "
                f"with tag {tag} (a recv matches a send on equal src, dst, tag and size)", where)
        if out.full:
            return
