"""How the ASTRA-sim export classifies an IR node before planning it: on a host thread,
device compute, communication of a device stream or one a host thread blocks in, a
collective of a one-rank group, or nothing to export; and which lane each class runs on."""

from __future__ import annotations

from echo_et.errors import EchoError
from echo_et.ir.schema import node_kind_name, pb

from .mapping import comm_type_of
from .planned import COMM, GPU, HOST, RECV

HOST_KINDS = frozenset({pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC})
DEVICE_COMP_KINDS = frozenset({pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET, pb.KIND_COMM_UNKNOWN})
COMM_KINDS = frozenset({pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV})

LANE_OF = {"host": HOST, "gpu": GPU, "solo": GPU, "comm": COMM, "block": COMM, "recv": RECV,
           "block-recv": RECV}


def classify(n: pb.Node, host_streams: set[int], group_sizes: dict[str, int]) -> str:
    """The planning class of a node: host (on a host thread), gpu (device compute), solo (a
    collective of a one-rank group, kept as compute), comm / recv (communication of a device
    stream), block / block-recv (communication a host thread blocks in), fold (no time, no
    counterpart)."""
    if n.kind in COMM_KINDS:
        if n.kind == pb.KIND_COLLECTIVE:
            comm_type_of(n)  # raises for types ASTRA-sim cannot express
            if group_sizes.get(n.collective.group, 0) <= 1:
                # Nothing to send: its measured time stays, as compute (host time on a
                # host thread); without a time it is folded into dependencies.
                return "fold" if n.duration_ns <= 0 else ("host" if n.stream in host_streams else "solo")
        if n.stream in host_streams:
            return "block-recv" if n.kind == pb.KIND_RECV else "block"
        return "recv" if n.kind == pb.KIND_RECV else "comm"
    if n.stream in host_streams:
        return "host"
    if n.kind in DEVICE_COMP_KINDS:
        return "gpu"
    raise EchoError(
        f"node {n.id} ({n.name}): node kind {node_kind_name(n.kind)} has no ASTRA-sim "
        "equivalent (neither compute nor communication); give it a kind before exporting")


def graph_kinds(nodes, group_sizes: dict[str, int]) -> tuple[set[int], bool]:
    """The host streams of a graph and whether it is CPU-only (no launches, no device work)."""
    host_streams = {n.stream for n in nodes if n.kind in HOST_KINDS}
    has_launch = any(n.kind == pb.KIND_LAUNCH for n in nodes)
    device = any(n.kind in (pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET)
                 for n in nodes if n.stream not in host_streams)
    return host_streams, bool(host_streams) and not has_launch and not device


def empty_stats() -> dict[str, int]:
    return {"gpu_clipped_ns": 0, "gpu_gaps_added_ns": 0, "comm_gaps_dropped_ns": 0,
            "comm_serialised": 0, "comm_serialised_ns": 0, "comm_merged": 0, "comm_merged_ns": 0,
            "host_waits_elastic": 0, "host_wait_ns_elastic": 0, "acausal_deps_dropped": 0, "lost_busy_ns": 0}
