"""In-memory graph: a header plus nodes, both protobuf messages.

Like ``torch.fx.Graph``, a Graph is rewritten by passes that build a new one; ``copy()``
exists so that a pass never edits the graph it was given.

The nodes are the elements of one ``NodeList`` message rather than separate messages: they
share its memory arena, which halves what a node costs in memory (about 0.7 KB instead of
1.6 KB for a typical host operator, 47 instead of 115 bytes per dependency). ``nodes``
behaves as a list of ``pb.Node`` except that putting a node in (``add``, ``append``,
``extend``, the constructor) stores a copy: keep working on the node ``add`` returns.

A graph may store repeated work once (``header.repeats``, :mod:`echo_et.ir.repeats`). Code
that knows blocks reads ``stored_nodes`` and ``header.repeats``; ``iter_nodes()`` streams the
expanded graph; ``len()`` counts it. ``nodes`` is always the expanded graph: on a graph with
blocks, the first access expands it in place (the blocks are dropped), so that code written
for flat graphs stays right, paying the expansion's memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Container, Iterable, Iterator

from echo_et.errors import EchoError
from echo_et.ir.repeats import (
    MAX_EXPANDED_NODES,
    Body,
    ExpandedIds,
    bodies,
    deps_point_back,
    expand_into,
    expanded_count,
    iter_expanded,
    starts_uniform,
)
from echo_et.ir.schema import SCHEMA_VERSION, pb


class Graph:
    """The program of one rank, or a template shared by many ranks."""

    __slots__ = ("header", "_nodes", "_store", "_index", "_bodies")

    def __init__(self, header: pb.GraphHeader | None = None, nodes: Iterable[pb.Node] = ()):
        self.header = header if header is not None else pb.GraphHeader()
        if not self.header.schema_version:
            self.header.schema_version = SCHEMA_VERSION
        self._store = pb.NodeList()
        self._nodes = self._store.nodes
        self._nodes.extend(nodes)
        self._index: dict[int, pb.Node] | None = None
        self._bodies: tuple[tuple, list] | None = None   # (block ranges, body nodes), see bodies()

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def nodes(self):
        """The expanded graph's nodes (a graph with repeat blocks is expanded in place)."""
        if self.header.repeats:
            self.expand()
        return self._nodes

    @property
    def stored_nodes(self):
        """The nodes as stored: with repeat blocks, the bodies and what is not repeated."""
        return self._nodes

    @property
    def has_repeats(self) -> bool:
        return bool(self.header.repeats)

    def bodies(self) -> list[Body]:
        """The repeat blocks' bodies; which stored nodes each holds is remembered while the
        stored nodes and the blocks' ranges stay the same."""
        key = (len(self._nodes), tuple((b.first_node, b.last_node) for b in self.header.repeats))
        if self._bodies is not None and self._bodies[0] == key:
            return bodies(self.header, self._nodes, self._bodies[1])
        got = bodies(self.header, self._nodes)
        self._bodies = (key, [b.nodes for b in got])
        return got

    def iter_nodes(self, kinds: Collection[int] | None = None) -> Iterator[pb.Node]:
        """The expanded graph in node-id order, streamed (copies are made one at a time);
        only nodes of ``kinds`` when given."""
        if not self.header.repeats:
            if kinds is None:
                return iter(self._nodes)
            return (n for n in self._nodes if n.kind in kinds)
        return iter_expanded(self.header, self._nodes, kinds, self.bodies())

    def expanded_ids(self) -> Container[int]:
        """The expanded graph's node ids, for membership tests: a set of a flat graph's ids;
        with repeat blocks, the stored ids and one span per instance (no id per copy)."""
        if not self.header.repeats:
            return {n.id for n in self._nodes}
        return ExpandedIds(self.header, self._nodes, self.bodies())

    def starts_uniform(self) -> bool:
        """Whether every node of the expanded graph starts at the same time (untimed)."""
        return starts_uniform(self.header, self._nodes, self.bodies() if self.header.repeats else None)

    def deps_point_back(self) -> bool:
        """Whether every dependency of the expanded graph names a smaller id than its node's
        (or the node itself): the id order is then a topological order. Found without
        expanding."""
        return deps_point_back(self.header, self._nodes, self.bodies() if self.header.repeats else None)

    def expand(self) -> None:
        """Replace the repeat blocks by the nodes they stand for (refused, one line, past
        ``MAX_EXPANDED_NODES``: the checker's limit)."""
        if not self.header.repeats:
            return
        n = len(self)
        if n > MAX_EXPANDED_NODES:
            raise EchoError(f"graph {self.id}: its repeat blocks expand to {n} nodes, more than the "
                            f"{MAX_EXPANDED_NODES} one graph may hold in memory")
        store = pb.NodeList()
        expand_into(store.nodes, self.header, self._nodes, self.bodies())
        del self.header.repeats[:]
        self._store = store
        self._nodes = store.nodes
        self._index = None
        self._bodies = None

    def __len__(self) -> int:
        if self.header.repeats:
            return expanded_count(self.header, self._nodes, self.bodies())
        return len(self._nodes)

    def __iter__(self) -> Iterator[pb.Node]:
        return iter(self.nodes)

    def node(self, node_id: int) -> pb.Node:
        if self._index is None or len(self._index) != len(self.nodes):
            self._index = {n.id: n for n in self.nodes}
        return self._index[node_id]

    def add(self, node: pb.Node) -> pb.Node:
        """Store a copy of ``node``; returns the stored node."""
        self.nodes.append(node)
        self._index = None
        self._bodies = None
        return self.nodes[-1]

    def new_node(self, **fields) -> pb.Node:
        """A new node stored in place (no copy), with the given fields set."""
        self._index = None
        self._bodies = None
        return self.nodes.add(**fields)

    def stored_framed(self) -> Iterator[bytes]:
        """The stored nodes as a length-delimited stream (each node's varint size, then its
        deterministic bytes), a few thousand nodes per chunk: what the graph file holds after
        its header. One serialisation of the whole store, re-framed, costs about half of one
        call per node."""
        data = self._store.SerializeToString(deterministic=True)
        parts: list[bytes] = []
        add = parts.append
        pos, end = 0, len(data)
        while pos < end:
            # data[pos] is the tag of field 1 (0x0a), then the node's varint size
            first = pos + 1
            size = data[first]
            start = first + 1
            if size >= 0x80:
                size &= 0x7F
                shift = 7
                while True:
                    b = data[start]
                    start += 1
                    size |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
            pos = start + size
            add(data[first:pos])
            if len(parts) >= 8192:
                yield b"".join(parts)
                parts.clear()
        if parts:
            yield b"".join(parts)

    def add_serialized(self, data: bytes) -> pb.Node:
        """Decode a serialised node straight into the graph's store (as stored: a reader
        adds the nodes of a graph with repeat blocks without expanding it)."""
        n = self._nodes.add()
        n.ParseFromString(data)
        self._index = None
        self._bodies = None
        return n

    def stream(self, stream_id: int) -> pb.Stream | None:
        for s in self.header.streams:
            if s.id == stream_id:
                return s
        return None

    def __reduce__(self):
        """Pickle as two serialised messages (a sweep ships a Job to worker processes)."""
        return (_graph_from_bytes, (self.header.SerializeToString(), self._store.SerializeToString()))

    def copy(self) -> Graph:
        """A deep copy, repeat blocks kept."""
        header = pb.GraphHeader()
        header.CopyFrom(self.header)
        out = Graph(header)
        # Copy into the store through its field: a whole-message CopyFrom would leave the
        # ``nodes`` view taken in __init__ pointing at the old (empty) field.
        out.stored_nodes.MergeFrom(self._nodes)
        return out

    def content_hash(self, *, ignore_id: bool = True) -> str:
        """SHA-256 of the deterministic serialisation (graph id excluded by default), so that
        identical programs can be proven identical and shared."""
        h = hashlib.sha256()
        header = pb.GraphHeader()
        header.CopyFrom(self.header)
        if ignore_id:
            header.id = ""
            header.name = ""
        h.update(header.SerializeToString(deterministic=True))
        for n in self._nodes:
            data = n.SerializeToString(deterministic=True)
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        return h.hexdigest()


def _graph_from_bytes(header: bytes, store: bytes) -> Graph:
    g = Graph(pb.GraphHeader.FromString(header))
    # Merge through the field, not the message: the ``nodes`` view must stay the store's.
    g.stored_nodes.MergeFrom(pb.NodeList.FromString(store).nodes)
    return g
