"""GraphML (via networkx) of a Job's dependency graphs, for graph tools (Gephi, yEd,
networkx, igraph).

One file holds one directed graph: the graph bound to ``--rank R`` (group keys resolved
to that rank's groups and peers), or, without a rank, every distinct graph of the Job side
by side (node ids ``<graph>/<node id>``, a ``graph`` attribute per node), each once however
many ranks share it.

Node attributes: ``kind``, ``name``, ``stream``, ``start_ns``, ``duration_ns``, ``bytes``
(collective input / P2P / copy bytes, 0 otherwise), ``collective`` (type), ``group`` (key),
``phase``; with a rank also ``group_id`` and ``peer`` (global rank). Edge attribute ``dep``:
``data``, ``launch``, ``sync`` or ``control``; an edge points from the node waited for to
the node that waits. Stream order (ascending ids per stream) is implicit, as in the IR.
"""

from __future__ import annotations

import os
from pathlib import Path

import networkx as nx

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.io import atomic_file
from echo_et.ir.job import Job
from echo_et.ir.schema import collective_name, node_kind_name, pb

DEP_NAMES = {pb.DEP_DATA: "data", pb.DEP_LAUNCH: "launch", pb.DEP_SYNC: "sync",
             pb.DEP_CONTROL: "control"}


def _node_bytes(n: pb.Node) -> int:
    if n.kind == pb.KIND_COLLECTIVE:
        return n.collective.in_bytes
    if n.kind in (pb.KIND_SEND, pb.KIND_RECV):
        return n.p2p.bytes
    if n.HasField("memcpy"):
        return n.memcpy.bytes
    if n.HasField("compute"):
        return n.compute.bytes
    return 0


def _add_graph(g: nx.DiGraph, graph: Graph, prefix: str, job: Job | None, rank: int | None) -> None:
    streams = {s.id: s.name for s in graph.header.streams}
    # Streamed twice (nodes, then edges): a graph with repeat blocks is not expanded in place,
    # though the networkx graph GraphML is written from holds every node and edge.
    for n in graph.iter_nodes():
        attrs: dict[str, object] = {
            "kind": node_kind_name(n.kind),
            "name": n.name,
            "stream": streams.get(n.stream, str(n.stream)),
            "start_ns": int(n.start_ns),
            "duration_ns": int(n.duration_ns),
            "bytes": int(_node_bytes(n)),
            "collective": collective_name(n.collective.type) if n.kind == pb.KIND_COLLECTIVE else "",
            "group": (n.collective.group if n.kind == pb.KIND_COLLECTIVE
                      else n.p2p.group if n.kind in (pb.KIND_SEND, pb.KIND_RECV) else ""),
            "phase": n.annotations.phase,
        }
        if prefix:
            attrs["graph"] = graph.id
        if job is not None and rank is not None and attrs["group"]:
            pg = job.resolve_group(rank, str(attrs["group"]))
            attrs["group_id"] = int(pg.id)
            if n.kind in (pb.KIND_SEND, pb.KIND_RECV):
                attrs["peer"] = int(pg.ranks[n.p2p.peer])
        g.add_node(f"{prefix}{n.id}", **attrs)
    for n in graph.iter_nodes():
        for d in n.deps:
            g.add_edge(f"{prefix}{d.id}", f"{prefix}{n.id}", dep=DEP_NAMES.get(d.kind, str(d.kind)))


def job_graph(job: Job, rank: int | None = None) -> nx.DiGraph:
    """The networkx graph that :func:`write` saves."""
    g = nx.DiGraph(job=job.manifest.name, world_size=job.world_size)
    if rank is not None:
        if rank not in set(job.ranks()):
            raise EchoError(f"rank {rank} is not in the job (ranks 0..{job.world_size - 1})")
        graph = job.graph_of(rank)
        g.graph.update(rank=rank, graph_id=graph.id)
        _add_graph(g, graph, "", job, rank)
        return g
    ranks_of = job.ranks_of_graph()
    ids = job.graph_ids()
    single = len(ids) == 1
    for gid in ids:
        _add_graph(g, job.graph(gid), "" if single else f"{gid}/", None, None)
    g.graph["graphs"] = ",".join(f"{gid}:{len(ranks_of.get(gid, []))} ranks" for gid in ids)
    return g


def write(job: Job, dest: str | os.PathLike[str], rank: int | None = None) -> dict:
    g = job_graph(job, rank)
    dest = Path(dest)
    with atomic_file(dest) as f:
        nx.write_graphml(g, f, named_key_ids=True)
    return {"output": str(dest), "nodes": g.number_of_nodes(), "edges": g.number_of_edges(),
            "rank": rank, "graphs": 1 if rank is not None else len(job.graph_ids())}
