"""Builders: the one way converters, the tracer and passes make graphs and jobs.

They assign node ids in program order, declare streams on first use, number collectives
per group (``seq``) and P2P ops per (group, peer, direction), so every producer gets those
invariants right without repeating the bookkeeping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.job import Job
from echo_et.ir.limits import MAX_BYTES, MAX_NS
from echo_et.ir.schema import ROLE_BY_NAME, SCHEMA_VERSION, pb

DepSpec = int | tuple[int, int]  # node id, or (node id, DepKind)


def _sized(value: float, field: str, name: str, hi: int) -> int:
    """An int for a protobuf field, refused (one EchoError naming the node) when it is not a
    finite number within +-``hi``: nothing a producer builds can overflow a field."""
    if type(value) is not int:
        if isinstance(value, float) and not math.isfinite(value):
            raise EchoError(f"node {name[:60]!r}: {field} = {value} is not a finite number")
        value = int(value)
    if not -hi <= value <= hi:
        raise EchoError(f"node {name[:60]!r}: {field} = {value} is out of range (at most {hi})")
    return value


def _bytes(value: float, field: str, name: str) -> int:
    v = _sized(value, field, name, MAX_BYTES)
    if v < 0:
        raise EchoError(f"node {name[:60]!r}: {field} = {v} is negative")
    return v


_VARINT1 = [bytes([i]) for i in range(128)]
_DEP_FIELD = b"\x3a"   # Node.deps (field 7, length-delimited)
_U63 = 1 << 63
_KIND_FIELD = [b""] + [b"\x10" + _VARINT1[k] for k in range(1, 128)]   # Dep.kind, unset when 0


def _varint(v: int) -> bytes:
    if v < 128:
        return _VARINT1[v]
    if v < 16384:   # node ids of most graphs: one call, no loop
        return bytes((v & 0x7F | 0x80, v >> 7))
    if v < 2097152:
        return bytes((v & 0x7F | 0x80, (v >> 7) & 0x7F | 0x80, v >> 14))
    out = bytearray()
    while v > 127:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _add_deps(n: pb.Node, deps: Iterable[DepSpec]) -> None:
    """Append ``deps`` to ``n.deps``: plain ids and kinds as one encoded block merged in one
    call (a third of the cost of ``deps.add`` each); anything else through ``deps.add``, which
    refuses what the field cannot hold."""
    if type(deps) is list and len(deps) == 1:   # the common case, without the loop
        d = deps[0]
        i, k = d if type(d) is tuple else (d, pb.DEP_DATA)
        if type(i) is int and type(k) is int and 0 <= i < _U63 and 0 <= k < 128:
            if 128 <= i < 2097152 and k:   # Dep{id, kind}: 2- or 3-byte id, in one call
                if i < 16384:
                    n.MergeFromString(bytes((0x3A, 5, 0x08, i & 0x7F | 0x80, i >> 7, 0x10, k)))
                else:
                    n.MergeFromString(bytes((0x3A, 6, 0x08, i & 0x7F | 0x80, (i >> 7) & 0x7F | 0x80,
                                             i >> 14, 0x10, k)))
                return
            body = b"\x08" + _varint(i) + _KIND_FIELD[k]
            n.MergeFromString(_DEP_FIELD + _VARINT1[len(body)] + body)
            return
    parts: list[bytes] = []
    for d in deps:
        if type(d) is tuple:
            i, k = d
        else:
            i, k = d, pb.DEP_DATA
        if type(i) is not int or type(k) is not int or not (0 <= i < _U63 and 0 <= k < 128):
            if parts:
                n.MergeFromString(b"".join(parts))
                parts = []
            n.deps.add(id=i, kind=k)
            continue
        body = b"\x08" + _varint(i) + _KIND_FIELD[k]
        parts.append(_DEP_FIELD + _VARINT1[len(body)] + body)
    if parts:
        n.MergeFromString(b"".join(parts))


class GraphBuilder:
    def __init__(self, graph_id: str, name: str = "", *, first_id: int = 1):
        self.graph = Graph(pb.GraphHeader(schema_version=SCHEMA_VERSION, id=graph_id, name=name))
        self._next_id = first_id
        self._streams: dict[tuple[int, str], int] = {}
        self._coll_seq: dict[str, int] = {}
        self._p2p_seq: dict[tuple[str, int, int], int] = {}

    @classmethod
    def extend(cls, graph: Graph) -> GraphBuilder:
        """A builder that appends to ``graph`` (a copy the caller owns): new node ids follow
        the largest one, streams and collective/P2P sequence numbers continue where the graph
        left them. Passes use it to add nodes to a copied graph."""
        b = cls.__new__(cls)
        b.graph = graph
        b._next_id = max((n.id for n in graph.nodes), default=0) + 1
        b._streams = {(s.kind, s.name): s.id for s in graph.header.streams}
        b._coll_seq = {}
        b._p2p_seq = {}
        for n in graph.nodes:
            if n.kind == pb.KIND_COLLECTIVE:
                k = n.collective.group
                b._coll_seq[k] = max(b._coll_seq.get(k, 0), n.collective.seq + 1)
            elif n.kind in (pb.KIND_SEND, pb.KIND_RECV):
                key = (n.p2p.group, n.p2p.peer, 1 if n.kind == pb.KIND_SEND else 0)
                b._p2p_seq[key] = max(b._p2p_seq.get(key, 0), n.p2p.seq + 1)
        return b

    # -- streams ---------------------------------------------------------------------------
    def stream(self, kind: int, name: str, *, device: int = -1, native_id: int = 0) -> int:
        """The id of the stream (kind, name), declared on first use."""
        key = (kind, name)
        sid = self._streams.get(key)
        if sid is None:
            sid = max(self._streams.values(), default=-1) + 1
            self._streams[key] = sid
            self.graph.header.streams.add(
                id=sid, name=name, kind=kind, device=device, native_id=native_id
            )
        return sid

    def declare_group(self, key: str, size: int) -> None:
        self.graph.header.group_sizes[key] = size

    # -- nodes -----------------------------------------------------------------------------
    def node(
        self,
        kind: int,
        name: str,
        stream: int,
        *,
        start_ns: int = 0,
        duration_ns: int = 0,
        deps: Iterable[DepSpec] = (),
        node_id: int | None = None,
    ) -> pb.Node:
        return self._new(kind, name, stream, start_ns, duration_ns, deps, node_id)

    def _new(self, kind: int, name: str, stream: int, start_ns: int, duration_ns: int,
             deps: Iterable[DepSpec], node_id: int | None) -> pb.Node:
        if node_id is None:
            node_id = self._next_id
        if node_id >= self._next_id:
            self._next_id = node_id + 1
        if type(start_ns) is not int or not -MAX_NS <= start_ns <= MAX_NS:
            start_ns = _sized(start_ns, "start_ns", name, MAX_NS)
        if type(duration_ns) is not int or not -MAX_NS <= duration_ns <= MAX_NS:
            duration_ns = _sized(duration_ns, "duration_ns", name, MAX_NS)
        # Field by field, zeros left unset (the same message as keyword arguments, which
        # cost twice as much per node), and the dependencies as one encoded block.
        n = self.graph.new_node()
        n.id = node_id
        if name is not None:
            n.name = name
        if kind:
            n.kind = kind
        if stream:
            n.stream = stream
        if start_ns:
            n.start_ns = start_ns
        if duration_ns:
            n.duration_ns = duration_ns
        if deps:
            _add_deps(n, deps)
        return n

    def compute(
        self,
        name: str,
        stream: int,
        *,
        kernel_class: int = pb.KC_OTHER,
        op: str = "",
        flops: float = 0.0,
        bytes_: int = 0,
        shapes: str = "",
        dtypes: str = "",
        **kw,
    ) -> pb.Node:
        n = self.node(pb.KIND_COMPUTE, name, stream, **kw)
        n.compute.op = op or name
        n.compute.kernel_class = kernel_class
        if not math.isfinite(flops):
            raise EchoError(f"node {name[:60]!r}: flops = {flops} is not a finite number")
        n.compute.flops = flops
        n.compute.bytes = _bytes(bytes_, "bytes", name)
        n.compute.shapes = shapes
        n.compute.dtypes = dtypes
        return n

    def collective(
        self,
        name: str,
        stream: int,
        *,
        coll_type: int,
        group: str,
        in_bytes: int,
        out_bytes: int | None = None,
        dtype: str = "",
        root: int | None = None,
        **kw,
    ) -> pb.Node:
        n = self.node(pb.KIND_COLLECTIVE, name, stream, **kw)
        c = n.collective
        c.type = coll_type
        c.group = group
        c.in_bytes = _bytes(in_bytes, "in_bytes", name)
        c.out_bytes = _bytes(in_bytes if out_bytes is None else out_bytes, "out_bytes", name)
        c.dtype = dtype
        c.seq = self._coll_seq.get(group, 0)
        self._coll_seq[group] = c.seq + 1
        if root is not None:
            c.root = root
        return n

    def p2p(
        self,
        send: bool,
        name: str,
        stream: int,
        *,
        group: str,
        peer: int,
        nbytes: int,
        tag: int = 0,
        **kw,
    ) -> pb.Node:
        n = self.node(pb.KIND_SEND if send else pb.KIND_RECV, name, stream, **kw)
        key = (group, peer, 1 if send else 0)
        n.p2p.group = group
        n.p2p.peer = peer
        n.p2p.bytes = _bytes(nbytes, "bytes", name)
        n.p2p.tag = tag
        n.p2p.seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = n.p2p.seq + 1
        return n

    def cpu_op(self, name: str, stream: int, *, kind: int = pb.KIND_CPU_OP, op: str = "",
               correlation: int = 0, rf_id: int = 0, shapes: str = "", dtypes: str = "",
               start_ns: int = 0, duration_ns: int = 0, deps: Iterable[DepSpec] = (),
               node_id: int | None = None) -> pb.Node:
        n = self._new(kind, name, stream, start_ns, duration_ns, deps, node_id)
        c = n.cpu
        c.op = op or name   # sets the payload even when empty
        if correlation:
            c.correlation = correlation
        if rf_id:
            c.rf_id = rf_id
        if shapes:
            c.shapes = shapes
        if dtypes:
            c.dtypes = dtypes
        return n

    def memcpy(self, name: str, stream: int, *, nbytes: int, direction: str,
               kind: int = pb.KIND_MEMCPY, **kw) -> pb.Node:
        n = self.node(kind, name, stream, **kw)
        n.memcpy.bytes = _bytes(nbytes, "bytes", name)
        n.memcpy.direction = direction
        return n

    def build(self) -> Graph:
        return self.graph


class JobBuilder:
    """Assembles a Job: groups, graphs and rank bindings."""

    def __init__(self, name: str = "", world_size: int = 0, *, source_format: str = ""):
        from echo_et import __version__

        self.job = Job()
        m = self.job.manifest
        m.name = name
        m.world_size = world_size
        m.step = -1
        m.provenance.source_format = source_format
        m.provenance.tool_version = f"echo-et {__version__}"
        self._group_ids: dict[tuple[tuple[int, ...], str], int] = {}

    def group(self, ranks: Sequence[int], *, name: str = "", desc: str = "", role: str | int = 0) -> int:
        """Id of the group with these ranks and name, created on first use (ids start at 1)."""
        key = (tuple(int(r) for r in ranks), name)
        gid = self._group_ids.get(key)
        if gid is None:
            gid = len(self._group_ids) + 1
            self._group_ids[key] = gid
            role_value = ROLE_BY_NAME.get(role, 0) if isinstance(role, str) else role
            self.job.manifest.groups.add(id=gid, name=name or str(gid), desc=desc,
                                         ranks=list(key[0]), role=role_value)
            self.job.invalidate()
        return gid

    def add_graph(self, graph: Graph) -> None:
        self.job.add_graph(graph)

    def bind(self, rank: int, graph_id: str, groups: dict[str, int] | None = None, *,
             measured_step_ns: int = 0, clock_offset_ns: int = 0) -> pb.RankBinding:
        b = self.job.manifest.bindings.add(rank=rank, graph=graph_id,
                                          measured_step_ns=int(measured_step_ns),
                                          clock_offset_ns=int(clock_offset_ns))
        for k, v in (groups or {}).items():
            b.groups[k] = v
        self.job.invalidate()
        return b

    def drop(self, reason: str, count: int = 1) -> None:
        """Record what the conversion dropped or guessed, by reason."""
        if count:
            self.job.manifest.dropped[reason] = self.job.manifest.dropped.get(reason, 0) + count

    def build(self) -> Job:
        m = self.job.manifest
        if not m.world_size:
            m.world_size = len(m.bindings)
        # Bindings in rank order keep the manifest deterministic whatever the build order.
        ordered = sorted(m.bindings, key=lambda b: b.rank)
        copies = [pb.RankBinding() for _ in ordered]
        for c, b in zip(copies, ordered, strict=True):
            c.CopyFrom(b)
        del m.bindings[:]
        m.bindings.extend(copies)
        self.job.invalidate()
        return self.job
