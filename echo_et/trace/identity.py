"""The structure of a graph without its timings: what "the same program" means.

Two traced ranks run the same program when their ex-situ graphs agree on everything but
measured times: the same nodes (kind, name, stream, payload: op, shapes, dtypes,
collective type, bytes, group key, peer), in the same order, with the same dependencies
and annotations, on the same streams, using groups of the same sizes. ``structure_hash``
is a SHA-256 over exactly that, so equal hashes prove equal structure for the ranks that
were traced.
"""

from __future__ import annotations

import hashlib

from echo_et.ir import Graph
from echo_et.ir.schema import pb


def structure_hash(graph: Graph) -> str:
    h = hashlib.sha256()
    header = pb.GraphHeader()
    header.CopyFrom(graph.header)
    header.id = ""
    header.name = ""
    header.ClearField("attrs")
    for s in header.streams:
        s.native_id = 0
    h.update(header.SerializeToString(deterministic=True))
    for n in graph.stored_nodes:   # repeat blocks are in the header: their bodies suffice
        c = pb.Node()
        c.CopyFrom(n)
        c.start_ns = 0
        c.duration_ns = 0
        data = c.SerializeToString(deterministic=True)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
