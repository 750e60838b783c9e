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
                    out_bytes=c.out_bytes, dtype=c.dtype, group=c.group, group_id=pg.id,
                    group_size=len(pg.ranks), seq=c.seq)
        return f"{collective_name(c.type)} {human_bytes(c.in_bytes)}", args
    if node.kind in (pb.KIND_SEND, pb.KIND_RECV) and node.HasField("p2p"):
        p = node.p2p
        pg = group_of(p.group)
        peer = pg.ranks[p.peer]
        verb = "send to" if node.kind == pb.KIND_SEND else "recv from"
        args.update(op=node.name, bytes=p.bytes, peer=peer, group_peer=p.peer, tag=p.tag, group=p.group,
                    group_id=pg.id)
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


# Kineto's event categories (the ``cat`` torch.profiler writes), which trace tools
# (HolisticTraceAnalysis, Perfetto, TensorBoard) read.
KINETO_CPU_OP = "cpu_op"
KINETO_RUNTIME = "cuda_runtime"
KINETO_KERNEL = "kernel"
KINETO_MEMCPY = "gpu_memcpy"
KINETO_MEMSET = "gpu_memset"
KINETO_ANNOTATION = "user_annotation"

_HOST_STREAMS = frozenset({pb.STREAM_CPU_THREAD})


def kineto_category(kind: int, stream_kind: int) -> str:
    """The Kineto ``cat`` of a node of ``kind`` on a stream of ``stream_kind``: on a GPU
    stream, kernels (compute and communication alike: NCCL runs kernels), memcpy and
    memset; on a host thread, runtime calls (launches, syncs) and operators (everything
    else, host-backend collectives included: gloo runs them on CPU threads)."""
    if stream_kind in _HOST_STREAMS:
        if kind in (pb.KIND_LAUNCH, pb.KIND_SYNC):
            return KINETO_RUNTIME
        return KINETO_CPU_OP
    if kind == pb.KIND_MEMCPY:
        return KINETO_MEMCPY
    if kind == pb.KIND_MEMSET:
        return KINETO_MEMSET
    if kind in (pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC) and stream_kind == pb.STREAM_UNKNOWN:
        return KINETO_CPU_OP if kind == pb.KIND_CPU_OP else KINETO_RUNTIME
    return KINETO_KERNEL
