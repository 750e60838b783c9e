"""How long ASTRA-sim's analytical backend takes for one collective or send, from the
network and system files this exporter writes: what a network fit needs to match a
communication model (``echo_et.experiments.astra_sim``).

Measured on the real binaries (congestion-unaware, current and legacy reader alike; ring
algorithms, 1 active chunk per dimension, ``preferred-dataset-splits`` P, ``endpoint-delay``
E, ``local-mem-bw`` M) and exact within about 1 % for collectives on one dimension:

* a collective of C bytes on a ring of N NPUs is P chunks, each of ``steps`` ring steps; a
  step costs ``hops x latency + E`` (``hops``: 2 through a Switch, 1 on a Ring or
  FullyConnected dimension), and the bytes cost ``bus x C / bandwidth`` plus, for the
  reducing collectives, ``1.61 x 2(N-1)/N x C / M`` of local memory traffic;
* bandwidths are read as GiB/s (2^30 bytes per second per GB/s of the file);
* steps and bus factors per type: all-reduce 2(N-1) and 2(N-1)/N; all-gather (C the
  per-rank shard) N-1 and N-1; reduce-scatter (C the full input) N-1 and (N-1)/N;
  all-to-all (ring algorithm) N(N-1)/2 and (N-1)/2;
* a send costs ``hops x latency + C / bandwidth`` (no chunking); a rank runs one send at a
  time (receives alongside), so an all-to-all written as per-peer send/recv costs each rank
  the sum of its sends;
* a group smaller than the whole network runs as one ring over its members; each hop uses
  the parameters of the lowest dimension in which the two NPUs differ, and the ring runs at
  the pace of its slowest hop;
* a collective of the whole multi-dimensional network runs one phase per dimension: the
  latencies add up, the phases pipeline, so the bytes cost the slowest phase's (each phase
  on the data it sees: all-reduce and reduce-scatter shrink it by the dimension's size going
  outwards, all-gather grows it going inwards from the outermost dimension). This part is
  an approximation (within about 20 % of the binary on two-dimensional networks, see
  ``tests/test_astra_sim_costs.py``); one-dimensional rings are exact within 1 %.
"""

from __future__ import annotations

from dataclasses import dataclass

from .configs import DEFAULT_SPLITS, ENDPOINT_DELAY_NS, LOCAL_MEM_BW
from .mapping import CHAKRA_ALL_GATHER, CHAKRA_ALL_REDUCE, CHAKRA_ALL_TO_ALL, CHAKRA_REDUCE_SCATTER

GIB_PER_GB = 2**30 / 1e9      # ASTRA-sim reads a bandwidth of 1 "GB/s" as 2^30 bytes/s
MEM_FACTOR = 1.6103           # local memory passes of a reducing ring step, per 2(N-1)/N
HOPS = {"Switch": 2, "Ring": 1, "FullyConnected": 1}


@dataclass(frozen=True)
class Dim:
    """One network dimension: topology, NPUs, bandwidth (GB/s) and link latency (ns)."""

    topology: str
    npus: int
    bandwidth: float
    latency: float


def _steps_bus_mem(comm_type: int, n: int) -> tuple[float, float, float]:
    if comm_type == CHAKRA_ALL_REDUCE:
        return 2.0 * (n - 1), 2.0 * (n - 1) / n, MEM_FACTOR * 2.0 * (n - 1) / n
    if comm_type == CHAKRA_ALL_GATHER:
        return float(n - 1), float(n - 1), 0.0
    if comm_type == CHAKRA_REDUCE_SCATTER:
        return float(n - 1), (n - 1) / n, MEM_FACTOR * 2.0 * (n - 1) / n
    if comm_type == CHAKRA_ALL_TO_ALL:
        return n * (n - 1) / 2.0, (n - 1) / 2.0, 0.0
    raise ValueError(f"comm_type {comm_type} is not networked by ASTRA-sim")


def ring_latency_part(comm_type: int, n: int, dim: Dim, splits: int = DEFAULT_SPLITS,
                      endpoint_ns: float = ENDPOINT_DELAY_NS) -> float:
    steps, _, _ = _steps_bus_mem(comm_type, n)
    return splits * steps * (HOPS.get(dim.topology, 1) * dim.latency + endpoint_ns)


def ring_bytes_part(comm_type: int, n: int, size: float, dim: Dim,
                    local_mem_bw: float = LOCAL_MEM_BW) -> float:
    _, bus, mem = _steps_bus_mem(comm_type, n)
    return bus * size / (dim.bandwidth * GIB_PER_GB) + mem * size / (local_mem_bw * GIB_PER_GB)


def ring_ns(comm_type: int, n: int, size: float, dim: Dim, splits: int = DEFAULT_SPLITS) -> float:
    """One collective on a one-dimensional ring of ``n`` NPUs with ``dim``'s parameters."""
    if n <= 1:
        return 0.0
    return ring_latency_part(comm_type, n, dim, splits) + ring_bytes_part(comm_type, n, size, dim)


def coordinates(npu: int, dims: list[Dim]) -> list[int]:
    out = []
    for d in dims:
        out.append(npu % d.npus)
        npu //= d.npus
    return out


def hop_dim(a: int, b: int, dims: list[Dim]) -> int:
    """The dimension whose parameters a message from NPU ``a`` to NPU ``b`` pays: the lowest
    one in which their coordinates differ."""
    ca, cb = coordinates(a, dims), coordinates(b, dims)
    for k, (x, y) in enumerate(zip(ca, cb, strict=True)):
        if x != y:
            return k
    return 0


def collective_shape(members: list[int], dims: list[Dim]) -> tuple:
    """What of a group's placement ASTRA-sim's time depends on: ("hier",) for the whole
    multi-dimensional network, else ("ring", n, the dimensions its hops use)."""
    n = len(members)
    total = 1
    for d in dims:
        total *= d.npus
    if n == total and len(dims) > 1:
        return ("hier",)
    if len(dims) == 1:
        return ("ring", n, (0,))
    return ("ring", n, tuple(sorted({hop_dim(members[k], members[(k + 1) % n], dims) for k in range(n)})))


def shaped_ns(comm_type: int, size: float, shape: tuple, dims: list[Dim], splits: int = DEFAULT_SPLITS) -> float:
    """:func:`collective_ns` for a group of the given :func:`collective_shape`."""
    if shape[0] == "ring":
        n = shape[1]
        if n <= 1:
            return 0.0
        # One ring over the members, at the pace of its slowest hop.
        return max(ring_ns(comm_type, n, size, dims[d], splits) for d in shape[2])
    lat = 0.0
    slowest = 0.0
    data = float(size)
    # All-gather runs from the outermost dimension in (its data grows); the others from the
    # innermost out (all-reduce and reduce-scatter shrink theirs).
    for d in (reversed(dims) if comm_type == CHAKRA_ALL_GATHER else dims):
        lat += ring_latency_part(comm_type, d.npus, d, splits)
        slowest = max(slowest, ring_bytes_part(comm_type, d.npus, data, d))
        if comm_type in (CHAKRA_ALL_REDUCE, CHAKRA_REDUCE_SCATTER):
            data /= d.npus
        elif comm_type == CHAKRA_ALL_GATHER:
            data *= d.npus
    return lat + slowest


def collective_ns(comm_type: int, size: int, members: list[int], dims: list[Dim],
                  splits: int = DEFAULT_SPLITS) -> float:
    """ASTRA-sim's time for one collective of ``size`` bytes (``comm_size``) on the NPUs
    ``members`` (in the order comm_group.json lists them) of the network ``dims``."""
    if len(members) <= 1:
        return 0.0
    return shaped_ns(comm_type, size, collective_shape(members, dims), dims, splits)


def send_ns(size: int, src: int, dst: int, dims: list[Dim]) -> float:
    """ASTRA-sim's time for one send of ``size`` bytes from NPU ``src`` to ``dst``."""
    d = dims[hop_dim(src, dst, dims)]
    return HOPS.get(d.topology, 1) * d.latency + size / (d.bandwidth * GIB_PER_GB)


def peer_dims(members: list[int], dims: list[Dim]) -> tuple[tuple[int, ...], ...]:
    """For each distinct member, how many of its peers in the group it reaches through each
    dimension (the lowest one in which they differ): what the time of a per-peer exchange
    depends on."""
    out = set()
    for m in members:
        counts = [0] * len(dims)
        for p in members:
            if p != m:
                counts[hop_dim(m, p, dims)] += 1
        out.add(tuple(counts))
    return tuple(sorted(out))


def all_to_all_p2p_shaped_ns(size: float, n: int, peers: tuple[tuple[int, ...], ...], dims: list[Dim]) -> float:
    """An all-to-all of ``size`` bytes per rank on ``n`` members written as one send and one
    receive per peer (``size / n`` bytes each): ASTRA-sim runs a rank's sends one at a time
    and its receives alongside, so a rank takes the sum of its sends; the slowest rank sets
    the time. ``peers`` is :func:`peer_dims` of the group."""
    if n <= 1:
        return 0.0
    per = size / n
    return max(sum(c * (HOPS.get(d.topology, 1) * d.latency + per / (d.bandwidth * GIB_PER_GB))
                   for c, d in zip(counts, dims, strict=True)) for counts in peers)


def all_to_all_p2p_ns(size: int, members: list[int], dims: list[Dim]) -> float:
    """ASTRA-sim's time for an all-to-all of ``size`` bytes per rank on ``members`` written as
    per-peer send/recv (see :func:`all_to_all_p2p_shaped_ns`)."""
    return all_to_all_p2p_shaped_ns(size, len(members), peer_dims(members, dims), dims)


__all__ = ["Dim", "all_to_all_p2p_ns", "all_to_all_p2p_shaped_ns", "collective_ns", "collective_shape",
           "coordinates", "hop_dim", "peer_dims", "ring_ns", "send_ns", "shaped_ns"]
