"""A Job: the manifest (layout, groups, rank bindings) plus its distinct graphs.

Graphs are loaded lazily when the Job was read from disk, so commands that only need the
manifest (or one graph) never read the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.schema import SCHEMA_VERSION, pb


class Job:
    __slots__ = ("manifest", "_graphs", "_loader", "_groups_by_id", "_bindings_by_rank", "source")

    def __init__(
        self,
        manifest: pb.JobManifest | None = None,
        graphs: dict[str, Graph] | None = None,
        loader: Callable[[str], Graph] | None = None,
        source: str = "",
    ):
        self.manifest = manifest if manifest is not None else pb.JobManifest()
        if not self.manifest.schema_version:
            self.manifest.schema_version = SCHEMA_VERSION
        self._graphs: dict[str, Graph] = dict(graphs or {})
        self._loader = loader
        self._groups_by_id: dict[int, pb.ProcessGroup] | None = None
        self._bindings_by_rank: dict[int, pb.RankBinding] | None = None
        self.source = source  # where it was read from, for error messages

    # -- graphs -------------------------------------------------------------------------
    def graph_ids(self) -> list[str]:
        ids = [g.id for g in self.manifest.graphs]
        for gid in self._graphs:
            if gid not in ids:
                ids.append(gid)
        return ids

    def graph(self, graph_id: str) -> Graph:
        g = self._graphs.get(graph_id)
        if g is None:
            if self._loader is None:
                raise EchoError(f"{self.source or 'job'}: graph {graph_id!r} is not in the job")
            g = self._loader(graph_id)
            self._graphs[graph_id] = g
        return g

    def graphs(self) -> Iterator[Graph]:
        for gid in self.graph_ids():
            yield self.graph(gid)

    def add_graph(self, graph: Graph) -> None:
        if not graph.id:
            raise ValueError("graph needs an id")
        self._graphs[graph.id] = graph

    def graph_of(self, rank: int) -> Graph:
        return self.graph(self.binding(rank).graph)

    # -- groups and bindings ------------------------------------------------------------
    def invalidate(self) -> None:
        """Forget derived indexes after editing the manifest in place (builders only)."""
        self._groups_by_id = None
        self._bindings_by_rank = None

    def group(self, group_id: int) -> pb.ProcessGroup:
        if self._groups_by_id is None:
            self._groups_by_id = {g.id: g for g in self.manifest.groups}
        try:
            return self._groups_by_id[group_id]
        except KeyError:
            raise EchoError(f"{self.source or 'job'}: process group {group_id} is not defined") from None

    def binding(self, rank: int) -> pb.RankBinding:
        if self._bindings_by_rank is None:
            self._bindings_by_rank = {b.rank: b for b in self.manifest.bindings}
        try:
            return self._bindings_by_rank[rank]
        except KeyError:
            raise EchoError(f"{self.source or 'job'}: rank {rank} has no graph binding") from None

    def ranks(self) -> list[int]:
        return sorted(b.rank for b in self.manifest.bindings)

    @property
    def world_size(self) -> int:
        return self.manifest.world_size

    def resolve_group(self, rank: int, key: str) -> pb.ProcessGroup:
        """The concrete process group that graph-local group ``key`` means on ``rank``."""
        b = self.binding(rank)
        if key not in b.groups:
            raise EchoError(f"{self.source or 'job'}: rank {rank} has no binding for group key {key!r}")
        return self.group(b.groups[key])

    def ranks_of_graph(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for b in self.manifest.bindings:
            out.setdefault(b.graph, []).append(b.rank)
        for v in out.values():
            v.sort()
        return out

    def __reduce__(self):
        """Pickle with every graph loaded (a lazy loader reads files a worker may not see)."""
        graphs = {gid: self.graph(gid) for gid in self.graph_ids()}
        return (_job_from_bytes, (self.manifest.SerializeToString(), graphs, self.source))

    def copy(self) -> Job:
        """A deep copy with every graph loaded; passes edit the copy, never the input."""
        m = pb.JobManifest()
        m.CopyFrom(self.manifest)
        return Job(m, {gid: self.graph(gid).copy() for gid in self.graph_ids()}, source=self.source)


def _job_from_bytes(manifest: bytes, graphs: dict[str, Graph], source: str) -> Job:
    return Job(pb.JobManifest.FromString(manifest), graphs, source=source)
