"""The simulated step as timeline events, in the layout of ``echo-et export chrome``.

The simulator does not import converters (DESIGN.md section 10), so it yields plain field
dicts that match ``echo_et.converters.chrome.TimelineEvent``; the CLI (or a user) writes
them with that module's ``write_timeline``, so a simulated and a measured trace open side by
side in Perfetto with the same processes, tracks and names::

    from echo_et.converters.chrome import TimelineEvent, write_timeline
    write_timeline([TimelineEvent(**e) for e in timeline_events(result)], "sim.json")

Layout (the exporter's): one process per rank; one track per stream named after it (host
threads first, then compute, communication, copy); one box per node at its simulated start
and end (job clock, ns); collectives named "<type> <bytes>" with exact bytes, group, group
id and size and sequence number in args, sends/recvs "send to|recv from <peer> <bytes>".
Added by the simulator: the time a collective or P2P waited for its last member is its own
box "wait: <name>" (category "wait") just before it, and ``args.wait_ns`` on the operation.
Ranks that share a representative's timeline (symmetry) get that timeline.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from echo_et.ir.schema import COMM_KINDS, STREAM_KIND_NAMES, collective_name, node_kind_name, pb

_TRACK_ORDER = {
    pb.STREAM_CPU_THREAD: 0,
    pb.STREAM_GPU_COMPUTE: 1,
    pb.STREAM_GPU_COMM: 2,
    pb.STREAM_GPU_COPY: 3,
    pb.STREAM_UNKNOWN: 4,
}


def _human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _name_args(st, node: pb.Node) -> tuple[str, dict[str, Any]]:
    args: dict[str, Any] = {"id": node.id, "kind": node_kind_name(node.kind)}
    if node.kind == pb.KIND_COLLECTIVE and node.HasField("collective"):
        c = node.collective
        pg = st.keygroup[c.group]
        args.update(op=node.name, type=collective_name(c.type), bytes=c.in_bytes, out_bytes=c.out_bytes,
                    group=c.group, group_id=pg.id, group_size=len(pg.ranks), seq=c.seq)
        return f"{collective_name(c.type)} {_human_bytes(c.in_bytes)}", args
    if node.kind in (pb.KIND_SEND, pb.KIND_RECV) and node.HasField("p2p"):
        p = node.p2p
        peer = st.keygroup[p.group].ranks[p.peer]
        verb = "send to" if node.kind == pb.KIND_SEND else "recv from"
        args.update(op=node.name, bytes=p.bytes, peer=peer, tag=p.tag, group=p.group)
        return f"{verb} {peer} {_human_bytes(p.bytes)}", args
    if node.HasField("memcpy"):
        args.update(bytes=node.memcpy.bytes, direction=node.memcpy.direction)
    if node.HasField("annotations") and node.annotations.phase:
        args["phase"] = node.annotations.phase
    return node.name, args


def _rank_events(rank: int, st) -> Iterator[dict[str, Any]]:
    prog = st.prog
    streams = {s.id: s for s in prog.streams}
    for idx, node in enumerate(st.graph.nodes):
        s_it, e_it = prog.node_start_item[idx], prog.node_end_item[idx]
        if s_it < 0 or e_it < 0:
            continue
        t0, t1 = st.start[s_it], st.end[e_it]
        s = streams.get(node.stream)
        track = s.name if s is not None and s.name else f"stream {node.stream}"
        order = _TRACK_ORDER.get(s.kind if s is not None else 0, 4)
        name, args = _name_args(st, node)
        if s is not None:
            args["stream_kind"] = STREAM_KIND_NAMES.get(s.kind, "unknown")
        category = "communication" if node.kind in COMM_KINDS else node_kind_name(node.kind)
        if s_it in st.arrive:
            wait = t0 - st.arrive[s_it]
            args["wait_ns"] = wait
            if wait > 0:
                yield dict(rank=rank, track=track, name=f"wait: {name}", start_ns=st.arrive[s_it],
                           duration_ns=wait, category="wait", track_order=order, args={"id": node.id})
        yield dict(rank=rank, track=track, name=name, start_ns=t0, duration_ns=max(0, t1 - t0),
                   category=category, track_order=order, args=args)


def timeline_events(result, ranks: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Field dicts of ``echo_et.converters.chrome.TimelineEvent`` for every (chosen) rank."""
    if result._timeline is None:
        raise ValueError("this result holds no timeline")
    states, part = result._timeline
    by_class = {st.cls: st for st in states}
    for rank in sorted(part.class_of) if ranks is None else sorted(set(ranks)):
        yield from _rank_events(rank, by_class[part.class_of[rank]])
