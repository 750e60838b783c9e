"""In-memory graph: a header plus nodes, both protobuf messages.

Like ``torch.fx.Graph``, a Graph is rewritten by passes that build a new one; ``copy()``
exists so that a pass never edits the graph it was given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from echo_et.ir.schema import SCHEMA_VERSION, pb


class Graph:
    """The program of one rank, or a template shared by many ranks."""

    __slots__ = ("header", "nodes", "_index")

    def __init__(self, header: pb.GraphHeader | None = None, nodes: Iterable[pb.Node] = ()):
        self.header = header if header is not None else pb.GraphHeader()
        if not self.header.schema_version:
            self.header.schema_version = SCHEMA_VERSION
        self.nodes: list[pb.Node] = list(nodes)
        self._index: dict[int, pb.Node] | None = None

    @property
    def id(self) -> str:
        return self.header.id

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[pb.Node]:
        return iter(self.nodes)

    def node(self, node_id: int) -> pb.Node:
        if self._index is None or len(self._index) != len(self.nodes):
            self._index = {n.id: n for n in self.nodes}
        return self._index[node_id]

    def add(self, node: pb.Node) -> pb.Node:
        self.nodes.append(node)
        self._index = None
        return node

    def stream(self, stream_id: int) -> pb.Stream | None:
        for s in self.header.streams:
            if s.id == stream_id:
                return s
        return None

    def copy(self) -> Graph:
        header = pb.GraphHeader()
        header.CopyFrom(self.header)
        nodes = []
        for n in self.nodes:
            c = pb.Node()
            c.CopyFrom(n)
            nodes.append(c)
        return Graph(header, nodes)

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
        for n in self.nodes:
            data = n.SerializeToString(deterministic=True)
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        return h.hexdigest()
