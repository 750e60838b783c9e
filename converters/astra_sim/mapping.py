"""Which ASTRA-sim node type each kind of IR node becomes, and how collective types map.

ASTRA-sim networks four collectives (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL) and
send/recv; the other IR collective types are mapped onto those:

========================  =====================================================================
IR node                   ASTRA-sim
========================  =====================================================================
all_reduce / all_gather   COMM_COLL_NODE of the same type, ``comm_size`` = per-rank input bytes
reduce_scatter            (never below ``preferred-dataset-splits``)
all_to_all (equal sizes)  COMM_COLL_NODE ALL_TO_ALL
all_to_all (uneven)       one send and one recv per peer with the true per-peer bytes (from the
                          ``in_split_bytes`` attribute, else each rank's input split evenly)
broadcast                 ALL_GATHER of ceil(bytes / group size): the ring traffic of a pipelined
                          broadcast (ASTRA-sim master only replays BROADCAST, untimed by network)
reduce                    REDUCE_SCATTER of the full buffer (same ring traffic as a ring reduce)
gather, scatter           ALL_GATHER of the per-rank shard
barrier                   ALL_REDUCE of ``max(8, splits)`` bytes
send / recv               COMM_SEND_NODE / COMM_RECV_NODE with global ``comm_src``/``comm_dst``
========================  =====================================================================

Compute, copies and host time become COMP nodes; how they are laid out so that the time is
kept is :mod:`.plan`.
"""

from __future__ import annotations

import math

from echo_et.errors import EchoError
from echo_et.ir.schema import collective_name, node_kind_name, pb

_COMP_KINDS = {
    pb.KIND_COMPUTE: "compute",
    pb.KIND_MEMCPY: "memcpy",
    pb.KIND_MEMSET: "memset",
    pb.KIND_COMM_UNKNOWN: "comm_unknown",
}

# IR collective type -> (Chakra CollectiveCommType value, mapping label).
# Chakra: ALL_REDUCE=0, REDUCE=1, ALL_GATHER=2, GATHER=3, SCATTER=4, BROADCAST=5, ALL_TO_ALL=6,
# REDUCE_SCATTER=7, REDUCE_SCATTER_BLOCK=8, BARRIER=9.
CHAKRA_ALL_REDUCE = 0
CHAKRA_ALL_GATHER = 2
CHAKRA_ALL_TO_ALL = 6
CHAKRA_REDUCE_SCATTER = 7
SUPPORTED_COMM_TYPES = frozenset(
    {CHAKRA_ALL_REDUCE, CHAKRA_ALL_GATHER, CHAKRA_ALL_TO_ALL, CHAKRA_REDUCE_SCATTER}
)
CHAKRA_TYPE_NAMES = {
    CHAKRA_ALL_REDUCE: "ALL_REDUCE",
    CHAKRA_ALL_GATHER: "ALL_GATHER",
    CHAKRA_ALL_TO_ALL: "ALL_TO_ALL",
    CHAKRA_REDUCE_SCATTER: "REDUCE_SCATTER",
}
COLLECTIVE_MAP = {
    pb.COLL_ALL_REDUCE: CHAKRA_ALL_REDUCE,
    pb.COLL_ALL_GATHER: CHAKRA_ALL_GATHER,
    pb.COLL_REDUCE_SCATTER: CHAKRA_REDUCE_SCATTER,
    pb.COLL_ALL_TO_ALL: CHAKRA_ALL_TO_ALL,
    pb.COLL_BROADCAST: CHAKRA_ALL_GATHER,
    pb.COLL_REDUCE: CHAKRA_REDUCE_SCATTER,
    pb.COLL_GATHER: CHAKRA_ALL_GATHER,
    pb.COLL_SCATTER: CHAKRA_ALL_GATHER,
    pb.COLL_BARRIER: CHAKRA_ALL_REDUCE,
}
BARRIER_BYTES = 8


def comm_type_of(node: pb.Node) -> int:
    c = node.collective
    if c.type not in COLLECTIVE_MAP:
        raise EchoError(
            f"node {node.id} ({node.name}): collective type {collective_name(c.type)} "
            "has no ASTRA-sim equivalent"
        )
    return COLLECTIVE_MAP[c.type]


def comm_size_of(coll_type: int, in_bytes: int, out_bytes: int, group_size: int,
                 splits: int) -> tuple[int, bool]:
    """``comm_size`` of a mapped collective, and whether it had to be raised to ``splits``
    (below that ASTRA-sim divides the data into zero-size chunks and hangs)."""
    if coll_type == pb.COLL_BROADCAST:
        size = math.ceil(in_bytes / group_size) if in_bytes else 0
    elif coll_type == pb.COLL_SCATTER:
        size = out_bytes
    elif coll_type == pb.COLL_BARRIER:
        size = max(BARRIER_BYTES, splits)
    else:
        size = in_bytes
    if size < splits:
        return splits, True
    return size, False


def chakra_type_of(coll_type: int) -> int | None:
    """The Chakra collective a traced collective type is written as (None: none)."""
    return COLLECTIVE_MAP.get(coll_type)


def mapping_label(node: pb.Node) -> str:
    """The name under which a node's mapping is counted."""
    if node.kind in _COMP_KINDS:
        return f"{_COMP_KINDS[node.kind]}->COMP_NODE"
    if node.kind == pb.KIND_COLLECTIVE:
        name = collective_name(node.collective.type)
        return f"{name}->{CHAKRA_TYPE_NAMES[comm_type_of(node)]}"
    if node.kind == pb.KIND_SEND:
        return "send->COMM_SEND_NODE"
    if node.kind == pb.KIND_RECV:
        return "recv->COMM_RECV_NODE"
    return f"{node_kind_name(node.kind)}->?"
