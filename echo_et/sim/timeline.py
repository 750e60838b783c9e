"""The simulated step as a Chrome/Perfetto trace (JSON object format).

Layout: one process per rank (pid = rank, named "rank R"), one track per stream (tid =
the stream id of the graph, named after the stream), one complete ("X") event per node
with the node's name; args carry the kind, bytes, group and sequence number of
communication. Time in microseconds (the format's unit) with ns precision kept in the
fraction. The wait of a collective for its last member is its own event ("wait: NAME",
category "wait") just before the collective. Ranks that share a representative's timeline
(symmetry) are written with that timeline.
"""

from __future__ import annotations

import json
import os
from typing import Any

from echo_et.ir.io import atomic_file
from echo_et.ir.schema import collective_name, node_kind_name, pb
from echo_et.sim.program import CAT_NAMES


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _node_args(node: pb.Node) -> dict[str, Any]:
    args: dict[str, Any] = {"kind": node_kind_name(node.kind), "node": node.id}
    which = node.WhichOneof("payload")
    if which == "collective":
        c = node.collective
        args.update(type=collective_name(c.type), bytes=c.in_bytes, out_bytes=c.out_bytes, group=c.group,
                    seq=c.seq)
    elif which == "p2p":
        p = node.p2p
        args.update(bytes=p.bytes, group=p.group, peer=p.peer, seq=p.seq)
    elif which == "memcpy":
        args.update(bytes=node.memcpy.bytes, direction=node.memcpy.direction)
    elif which == "compute" and node.compute.kernel_class:
        from echo_et.ir.schema import KERNEL_CLASS_NAMES

        args["kernel_class"] = KERNEL_CLASS_NAMES.get(node.compute.kernel_class, "other")
    return args


def _rank_events(rank: int, st) -> list[dict[str, Any]]:
    prog = st.prog
    nodes = st.graph.nodes
    ev: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                                 "args": {"name": f"rank {rank}"}},
                                {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                                 "args": {"sort_index": rank}}]
    for s in prog.streams:
        ev.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": s.id,
                   "args": {"name": s.name or f"stream {s.id}"}})
    for idx, node in enumerate(nodes):
        s_it, e_it = prog.node_start_item[idx], prog.node_end_item[idx]
        if s_it < 0 or e_it < 0:
            continue
        t0, t1 = st.start[s_it], st.end[e_it]
        if t0 < 0 or t1 < 0:
            continue
        args = _node_args(node)
        if s_it in st.arrive:
            wait = t0 - st.arrive[s_it]
            args["wait_ns"] = wait
            if wait > 0:
                ev.append({"ph": "X", "name": f"wait: {node.name}", "cat": "wait", "pid": rank, "tid": node.stream,
                           "ts": _us(st.arrive[s_it]), "dur": _us(wait)})
        ev.append({"ph": "X", "name": node.name or f"node {node.id}", "cat": CAT_NAMES.get(prog.cat[s_it], "other"),
                   "pid": rank, "tid": node.stream, "ts": _us(t0), "dur": _us(max(0, t1 - t0)), "args": args})
    return ev


def write_timeline(state, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the trace for every rank; returns {"path", "events", "ranks"}."""
    states, part = state
    by_class = {st.cls: st for st in states}
    count = 0
    with atomic_file(path) as f:
        f.write(b'{"displayTimeUnit": "ns", "otherData": {"producer": "echo-et simulate"}, "traceEvents": [\n')
        first = True
        for rank in sorted(part.class_of):
            st = by_class[part.class_of[rank]]
            for e in _rank_events(rank, st):
                if not first:
                    f.write(b",\n")
                first = False
                f.write(json.dumps(e, sort_keys=True).encode())
                count += 1
        f.write(b"\n]}\n")
    return {"path": str(path), "events": count, "ranks": len(part.class_of)}
