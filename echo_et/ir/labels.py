"""How a node shows on a timeline: its box name, args and track.

One definition for the measured timeline (``echo-et export chrome``) and the simulated one
(``simulate --timeline``), so the two open side by side in Perfetto with the same tracks
and names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from echo_et.ir.schema import COMM_KINDS, STREAM_KIND_NAMES, collective_name, node_kind_name, pb

TRACK_ORDER = {
    pb.STREAM_CPU_THREAD: 0,
    pb.STREAM_GPU_COMPUTE: 1,
    pb.STREAM_GPU_COMM: 2,
    pb.STREAM_GPU_COPY: 3,
    pb.STREAM_UNKNOWN: 4,
}


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def node_label(node: pb.Node, group_of: Callable[[str], pb.ProcessGroup]
               ) -> tuple[str, dict[str, Any]]:
    """Box name and args: collectives "<type> <bytes>" with exact bytes, group, group id and
    size and sequence number; sends/recvs "send to|recv from <peer> <bytes>" (global peer
    rank, through ``group_of`` which resolves a group key for the node's rank)."""
    args: dict[str, Any] = {"id": node.id, "kind": node_kind_name(node.kind)}
    if node.kind == pb.KIND_COLLECTIVE and node.HasField("collective"):
        c = node.collective
        pg = group_of(c.group)
        args.update(op=node.name, type=collective_name(c.type), bytes=c.in_bytes,
                    out_bytes=c.out_bytes, group=c.group, group_id=pg.id,
                    group_size=len(pg.ranks), seq=c.seq)
        return f"{collective_name(c.type)} {human_bytes(c.in_bytes)}", args
    if node.kind in (pb.KIND_SEND, pb.KIND_RECV) and node.HasField("p2p"):
        p = node.p2p
        peer = group_of(p.group).ranks[p.peer]
        verb = "send to" if node.kind == pb.KIND_SEND else "recv from"
        args.update(op=node.name, bytes=p.bytes, peer=peer, tag=p.tag, group=p.group)
        return f"{verb} {peer} {human_bytes(p.bytes)}", args
    if node.HasField("memcpy"):
        args.update(bytes=node.memcpy.bytes, direction=node.memcpy.direction)
    if node.HasField("annotations") and node.annotations.phase:
        args["phase"] = node.annotations.phase
    return node.name, args


def node_track(node: pb.Node, streams: dict[int, pb.Stream], args: dict[str, Any]
               ) -> tuple[str, int, str]:
    """(track name, track order, category) of ``node``; adds ``stream_kind`` to ``args``."""
    s = streams.get(node.stream)
    track = s.name if s is not None and s.name else f"stream {node.stream}"
    order = TRACK_ORDER.get(s.kind if s is not None else 0, 4)
    if s is not None:
        args["stream_kind"] = STREAM_KIND_NAMES.get(s.kind, "unknown")
    category = "communication" if node.kind in COMM_KINDS else node_kind_name(node.kind)
    return track, order, category
