"""What ``inspect`` reports: counts over all ranks, computed once per distinct graph."""

from __future__ import annotations

from collections import Counter
from typing import Any

from echo_et.ir.job import Job
from echo_et.ir.schema import ROLE_NAMES, collective_name, node_kind_name, pb


def _graph_counts(graph) -> tuple[Counter, Counter, int, Counter]:
    """Node kinds, collectives, bytes issued and communication kernels of unknown libraries,
    in one pass (each field read of a node is a call)."""
    by_kind: Counter = Counter()
    colls: Counter = Counter()
    libs: Counter = Counter()
    comm_bytes = 0
    coll, send, recv, unknown = pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV, pb.KIND_COMM_UNKNOWN
    # A copy of a repeat block has its body node's kind and payload: count the body node
    # once per copy, never expanding the graph.
    times = {n.id: 1 + len(b.block.instances) for b in graph.bodies()
             for n in b.nodes}
    nodes = graph.stored_nodes
    if not times:
        # Kinds first, in one comprehension; the payloads only of the communication nodes.
        by_kind.update([n.kind for n in nodes])
        if not (by_kind.keys() & {coll, send, recv, unknown}):
            nodes = ()
    for n in nodes:
        k = n.kind
        if times:
            t = times.get(n.id, 1)
            by_kind[k] += t
        else:
            t = 1
        if k == coll:
            c = n.collective
            colls[collective_name(c.type)] += t
            comm_bytes += c.in_bytes * t
        elif k == send:
            colls["send"] += t
            comm_bytes += n.p2p.bytes * t
        elif k == recv:
            colls["recv"] += t
        elif k == unknown:
            libs[n.attrs.get("comm_library") or "unknown"] += t
    kinds: Counter = Counter()
    for k, v in by_kind.items():
        kinds[node_kind_name(k)] += v
    return kinds, colls, comm_bytes, libs


def comm_libraries(job: Job) -> dict[str, int]:
    """Communication kernels that no collective model prices (``comm_unknown`` nodes), by the
    library the converter recognised, over all ranks: the simulator keeps their measured time."""
    ranks_of = job.ranks_of_graph()
    out: Counter = Counter()
    for gid in job.graph_ids():
        mult = len(ranks_of.get(gid, []))
        if not mult:
            continue
        unknown = pb.KIND_COMM_UNKNOWN
        for n in job.graph(gid).iter_nodes((unknown,)):
            if n.kind == unknown:
                out[n.attrs.get("comm_library") or "unknown"] += mult
    return dict(sorted(out.items()))


def summarize(job: Job) -> dict[str, Any]:
    m = job.manifest
    ranks_of = job.ranks_of_graph()
    nodes: Counter = Counter()
    colls: Counter = Counter()
    comm_bytes = 0
    libs: Counter = Counter()
    per_graph = []
    for gid in job.graph_ids():
        g = job.graph(gid)
        k, c, b, lib = _graph_counts(g)
        mult = len(ranks_of.get(gid, []))
        for key, v in lib.items():
            if mult:
                libs[key] += v * mult
        for key, v in k.items():
            nodes[key] += v * mult
        for key, v in c.items():
            colls[key] += v * mult
        comm_bytes += b * mult
        entry: dict[str, Any] = {"id": gid, "nodes": len(g), "ranks": mult,
                                 "streams": len(g.header.streams)}
        if g.has_repeats:
            entry["stored_nodes"] = len(g.stored_nodes)
            entry["repeat_blocks"] = [
                {"id": b.block.id, "name": b.block.name, "body_nodes": len(b.nodes),
                 "instances": len(b.block.instances)}
                for b in g.bodies()]
        per_graph.append(entry)
    measured = {str(b.rank): b.measured_step_ns for b in m.bindings if b.measured_step_ns}
    lay = m.layout
    return {
        "name": m.name,
        "world_size": m.world_size,
        "ranks": len(m.bindings),
        "graphs": len(job.graph_ids()),
        "nodes": dict(sorted(nodes.items())),
        "collectives": dict(sorted(colls.items())),
        "comm_bytes": comm_bytes,
        "comm_libraries": dict(sorted(libs.items())),   # = comm_libraries(job), same pass
        "dropped": dict(sorted(m.dropped.items())),
        "groups": [
            {"id": g.id, "name": g.name, "desc": g.desc, "size": len(g.ranks),
             "role": ROLE_NAMES.get(g.role, "unknown")}
            for g in m.groups
        ][:64],
        "group_count": len(m.groups),
        "layout": {k: getattr(lay, k) for k in ("dp", "tp", "pp", "vpp", "ep", "cp",
                                                  "microbatches", "zero_stage")} | {"source": lay.source},
        "hardware": {"gpu_name": m.hardware.gpu_name, "gpus_per_node": m.hardware.gpus_per_node},
        "source_format": m.provenance.source_format,
        "step": m.step,
        "measured_step_ns": measured,
        "per_graph": per_graph[:64],
    }
