"""The correspondences between Chakra ET and the echo-et IR that reader and writer share."""

from __future__ import annotations

from chakra.schema.protobuf import et_def_pb2 as et

from echo_et.ir import pb
from echo_et.ir.collectives import find_collective

# Graph-local key of the world group: c10d's name of the default process group, which is
# also what Chakra's pg_name "" / "0" means.
WORLD_KEY = "0"

# Attributes the writer adds for what Chakra has no field for; the reader consumes them.
ECHO_PREFIX = "echo."

CHAKRA_TO_COLL: dict[int, int] = {
    et.ALL_REDUCE: pb.COLL_ALL_REDUCE,
    et.REDUCE: pb.COLL_REDUCE,
    et.ALL_GATHER: pb.COLL_ALL_GATHER,
    et.GATHER: pb.COLL_GATHER,
    et.SCATTER: pb.COLL_SCATTER,
    et.BROADCAST: pb.COLL_BROADCAST,
    et.ALL_TO_ALL: pb.COLL_ALL_TO_ALL,
    et.REDUCE_SCATTER: pb.COLL_REDUCE_SCATTER,
    et.REDUCE_SCATTER_BLOCK: pb.COLL_REDUCE_SCATTER,
    et.BARRIER: pb.COLL_BARRIER,
}
COLL_TO_CHAKRA: dict[int, int] = {
    pb.COLL_ALL_REDUCE: et.ALL_REDUCE,
    pb.COLL_REDUCE: et.REDUCE,
    pb.COLL_ALL_GATHER: et.ALL_GATHER,
    pb.COLL_GATHER: et.GATHER,
    pb.COLL_SCATTER: et.SCATTER,
    pb.COLL_BROADCAST: et.BROADCAST,
    pb.COLL_ALL_TO_ALL: et.ALL_TO_ALL,
    pb.COLL_REDUCE_SCATTER: et.REDUCE_SCATTER,
    pb.COLL_BARRIER: et.BARRIER,
}

def infer_collective(name: str) -> int:
    """The collective type a node name spells (the most specific collective word in it, as
    Chakra's PyTorch converter matches NCCL kernel names; "sendrecv" is how NCCL runs
    all-to-all), COLL_UNKNOWN when it spells none."""
    coll = find_collective(name)
    return pb.COLL_UNKNOWN if coll is None else coll


def collective_out_bytes(coll: int, in_bytes: int, group_size: int) -> int:
    """Per-rank output bytes from per-rank input bytes, by the Chakra/ASTRA-sim convention:
    all-gather's input is the shard (output = input x N), reduce-scatter's input is the full
    buffer (output = input / N, rounded down); gather and scatter likewise at the root;
    barrier moves nothing; the rest keep the size."""
    n = max(group_size, 1)
    if coll in (pb.COLL_ALL_GATHER, pb.COLL_GATHER):
        return in_bytes * n
    if coll in (pb.COLL_REDUCE_SCATTER, pb.COLL_SCATTER):
        return in_bytes // n
    if coll == pb.COLL_BARRIER:
        return 0
    return in_bytes
