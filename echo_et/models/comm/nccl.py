"""A white-box model of how long NCCL takes to move the bytes of one collective.

What runs is NCCL's own choice (:mod:`~echo_et.models.comm.tuning`: algorithm, protocol and
channel count as NCCL's tuner picks them); this module times that choice. For one
(algorithm, protocol) on ``c`` channels the kernel time is

    setup + hops x per-hop latency + c x (per-channel cost + network hops x per-hop proxy cost)
          + max(bytes on each link / its rate, reduced bytes / reduction rate) + pipeline fill

(the resources in the max are NVLink, the node's NICs and the protocol's own throughput
limit; the reduction is fused into the transfers as NCCL's step primitives run it, not added
after them as in Echo's model), with the structure
of NCCL's algorithms:

- ring (all-reduce, all-gather, reduce-scatter): 2(n-1) or n-1 steps; the ring is a cycle
  that crosses each of the m node boundaries once, so a fraction m/n of its steps go over
  the network; every rank moves (steps + loop overhead)/n of the buffer through its NVLink
  and, across nodes, its node's NICs;
- tree (all-reduce): a chain inside each node and a double binary tree across nodes, reduce
  up then broadcast down, pipelined in chunks: 2((k-1) + ceil(log2 m)) hops; 2S through
  NVLink; across nodes S per node when m == 2 (each node is the other's root) and 2S when
  m > 2 (an inner node has two children), at a fraction of the ring's network rate that
  depends on the node count as in NCCL's tuning (``tree_net_eff`` on two nodes,
  ``tree_net_eff_many`` on more);
- chain (broadcast, reduce): n-1 pipelined hops;
- NVLS (all-reduce inside one NVSwitch node with NVLink SHARP, Hopper and later; from 2.28.3
  also all-gather and reduce-scatter), NVLS-tree (all-reduce across such nodes: the switch
  reduces inside the node, a double binary tree crosses nodes), PAT (all-gather and
  reduce-scatter at one GPU per node: log2(n) rounds), CollNet direct/chain and NVLS across
  nodes (all-reduce reduced in SHARP network switches, 2.28.3 where the node has CollNet);
- point-to-point (send/recv; all-to-all, gather, scatter as grouped send/recv, with a serial
  cost per peer).

Protocols: LL (8-byte lines, half payload), LL128 (120 of 128 bytes), Simple (full
payload, larger per-hop latency); LL and LL128 also have a throughput limit of their own.
Channels: NCCL runs a small message on few channels (its per-thread thresholds) and every
channel costs a little serial work (the kernel sets it up; across nodes the proxy thread
posts each channel's sends and receives): that is what makes a 4-node LL tree take 107 us at
64 KiB on 16 channels and 58 us at 4 KiB on one. Start-up: a ring (and any LL transfer)
reaches its full rate only for messages of ``ramp_bytes`` and more (short per-step chunks):
the usable bandwidth ramps from 1/channels at tiny sizes to all of it at ``ramp_bytes``. A
tree with LL128 or Simple pays its start-up as the pipeline fill of its chunks instead.

Everything here is a pure function of (parameters, NCCL system, collective, sizes, placement).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from echo_et.errors import EchoError
from echo_et.models.comm import nccl_releases, tuning
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.params import PROTOCOL_PAYLOAD, PROTOCOLS
from echo_et.models.comm.topology import Placement
from echo_et.models.comm.tuning import Choice

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
               "reduce", "gather", "scatter", "barrier", "send", "recv")

# Patterns nccl-tests measures that are not IR collectives: sendrecv_perf (every rank sends to
# the next and receives from the previous at once) and hypercube_perf (an all-gather as
# log2(n) rounds of send/recv with the rank at distance 1, 2, 4, ...). Only fits price them.
MEASURED_PATTERNS = ("sendrecv", "hypercube")

CHOICE_MODES = ("nccl", "fastest")
_BARRIER_BYTES = 4  # c10d's barrier is an all-reduce of one 4-byte element
_US = 1e-3  # bytes / (GB/s) -> us: 1 GB/s moves 1e3 bytes per us

Costs = dict[tuple[str, str], np.ndarray]


def _vmin(a, b):
    """Element-wise min; builtin on scalars (estimate() prices one size at a time)."""
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


def _vmax(a, b):
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def nccl_bytes(coll: str, nbytes: np.ndarray, ranks: int) -> np.ndarray:
    """The buffer size NCCL sizes its channels by: the total output for all-gather (IR bytes
    are the shard), the IR bytes otherwise."""
    return nbytes * ranks if coll == "all_gather" else nbytes


def _ramp(P: Mapping[str, float], size: np.ndarray, proto: str) -> np.ndarray:
    return _vmin(1.0, 1.0 / P["channels"] + size / P[f"ramp_bytes.{proto}"])


@dataclass(frozen=True)
class Channels:
    """How many channels a candidate runs on: ``used`` per size (NCCL's per-message count)
    out of the communicator's ``total``."""

    used: np.ndarray | float
    total: int
    # the share of its modelled bandwidth NCCL says the algorithm reaches at this size (its
    # tree correction factors); 1.0 elsewhere
    reach: np.ndarray | float = 1.0


FULL = Channels(1.0, 1)


def _rate(P: Mapping[str, float], size: np.ndarray, proto: str, ch: Channels) -> np.ndarray:
    """Fraction of the full bandwidth a message gets: the start-up ramp (few channels and
    short per-step chunks for small messages)."""
    return _ramp(P, size, proto)


def _chan(P: Mapping[str, float], proto: str, ch: Channels, net_hops: float) -> np.ndarray:
    """Serial work per channel: setting up each channel, and per channel and network hop the
    proxy thread's post of a send or receive."""
    if ch.total <= 1:
        return 0.0
    return (P["chan_us"] + P["net_chan_us"] * net_hops) * ch.used


def _lat(P: Mapping[str, float], proto: str, intra_hops: float, net_hops: float) -> float:
    return (P[f"base_us.{proto}"] + intra_hops * P[f"nvlink_hop_us.{proto}"]
            + net_hops * P[f"net_hop_us.{proto}"])


def _fused(P: Mapping[str, float], transfer: np.ndarray, reduced: np.ndarray | float) -> np.ndarray:
    """Transfer time with the reduction NCCL fuses into it: each step's primitive
    (``recvReduceSend``, ``recvReduceCopy``) reads the arriving chunk and the local one, reduces
    and writes in one pass, so the reduction is bounded by its own rate (``reduce_gbps``: the
    memory traffic of reading two operands) rather than added after the transfer. An H100 node
    shows it: reduce-scatter and all-gather reach the same bus bandwidth (365 GB/s at 16 GiB)."""
    return _vmax(transfer, reduced / P["reduce_gbps"] * _US + 0.0 * transfer)


def _ring(P, coll: str, S: np.ndarray, pl: Placement, proto: str, ch: Channels) -> np.ndarray:
    n, m, k = pl.ranks, pl.nodes, pl.per_node
    x = P["ring_loop_extra_steps"]
    if coll == "all_reduce":
        steps = 2 * (n - 1)
        net_steps = steps * m / n if m > 1 else 0.0   # the cycle crosses m of its n links
        bus = (steps + x) / n * S
        reduced = (n - 1) / n * S
    elif coll == "all_gather":
        steps = n - 1
        net_steps = steps * m / n if m > 1 else 0.0
        bus = (steps + x) * S
        reduced = 0.0 * S
    elif coll == "reduce_scatter":
        steps = n - 1
        net_steps = steps * m / n if m > 1 else 0.0
        bus = (steps + x) / n * S
        reduced = (n - 1) / n * S
    else:  # broadcast / reduce: a pipelined chain through the ring order
        steps, net_steps = n - 1, m - 1
        bus = S * 1.0
        reduced = S * (1.0 if coll == "reduce" else 0.0)
    r = _rate(P, nccl_bytes(coll, S, n), proto, ch) / _US
    e = PROTOCOL_PAYLOAD[proto]
    t = bus / (P["nvlink_gbps"] * e * r)
    if m > 1:
        t = _vmax(t, bus / (k * P["net_gbps"] * e * r))
    if proto != "Simple":
        t = _vmax(t, bus / (P[f"cap_gbps.{proto}"] * r))
    if coll in ("broadcast", "reduce") and proto != "LL" and steps > 1:
        link = min(P["nvlink_gbps"], k * P["net_gbps"]) if m > 1 else P["nvlink_gbps"]
        t = t + (steps - 1) * _vmin(S, P["chain_chunk_bytes"]) / (link * e) * _US
    return (_lat(P, proto, steps - net_steps, net_steps) + _fused(P, t, reduced)
            + _chan(P, proto, ch, net_steps))


def _tree(P, S: np.ndarray, pl: Placement, proto: str, ch: Channels) -> np.ndarray:
    m, k = pl.nodes, pl.per_node
    levels = math.ceil(math.log2(m))
    # LL128 / Simple trees run all channels from a few KiB per channel; their start-up is the
    # pipeline fill below, not the ring's ramp
    r = (_rate(P, S, proto, ch) if proto == "LL" else 1.0 + 0.0 * S) / _US
    e = PROTOCOL_PAYLOAD[proto]
    net_share = 1.0 if m == 2 else 2.0
    eff = P["tree_net_eff"] if m <= 2 else P["tree_net_eff_many"]
    t = 2 * S / (P["nvlink_gbps"] * e * r)
    if m > 1:
        t = _vmax(t, net_share * S / (k * P["net_gbps"] * e * eff * r))
    cap = P["tree_simple_cap_gbps"] if proto == "Simple" else P[f"cap_gbps.{proto}"]
    t = _vmax(t, 2 * S / (cap * r)) / ch.reach
    if proto != "LL":
        hops = max(1, 2 * (k - 1 + levels) - 1)
        link = min(P["nvlink_gbps"], k * P["net_gbps"]) if m > 1 else P["nvlink_gbps"]
        t = t + hops * _vmin(S, P["tree_chunk_bytes"]) / (link * e) * _US
    return (_lat(P, proto, 2 * (k - 1), 2 * levels) + _fused(P, t, S)
            + _chan(P, proto, ch, 2 * levels))


def _nvls(P, S: np.ndarray, pl: Placement) -> np.ndarray:
    n = pl.ranks
    r = _ramp(P, S, "Simple") / _US
    return _lat(P, "Simple", 2, 0) + 2 * (n - 1) / n * S / (P["nvls_gbps"] * r)


def _nvls_gather(P, coll: str, S: np.ndarray, pl: Placement) -> np.ndarray:
    """All-gather / reduce-scatter through the switch's multicast (NVLS, one node): every GPU
    receives (or reduces) the n-1 shards of the others at the NVLS rate."""
    n = pl.ranks
    r = _ramp(P, S, "Simple") / _US
    return _lat(P, "Simple", 1, 0) + (n - 1) / n * nccl_bytes(coll, S, n) / (P["nvls_gbps"] * r)


def _nvls_tree(P, S: np.ndarray, pl: Placement, ch: Channels) -> np.ndarray:
    """NVLS-tree all-reduce (Hopper NVSwitch nodes): reduce inside each node through the
    switch, a double binary tree across nodes between the GPUs that face the NICs, the result
    multicast back. Per NIC, the two trees (half the buffer each, m-1 edges, up and down) move
    2(m-1)/m x S/k bytes each way, at ``nvls_tree_net_eff`` of the ring's network rate;
    pipelined in chunks like the tree."""
    m, k = pl.nodes, pl.per_node
    levels = math.ceil(math.log2(m))
    r = 1.0 / _US + 0.0 * S
    t = 2 * (k - 1) / k * S / (P["nvls_gbps"] * r)
    t = _vmax(t, 2 * (m - 1) / m * S / (k * P["net_gbps"] * P["nvls_tree_net_eff"] * r))
    hops = 2 * levels + 1
    t = t + hops * _vmin(S, P["tree_chunk_bytes"]) / (min(P["nvlink_gbps"], k * P["net_gbps"])) * _US
    return (_lat(P, "Simple", 2, 0) + 2 * levels * P["nvls_tree_hop_us"] + t
            + _chan(P, "Simple", ch, 2 * levels))


def _in_network(P, S: np.ndarray, pl: Placement, algo: str, ch: Channels) -> np.ndarray:
    """All-reduce reduced by the network switches (SHARP, NCCL's CollNet): each node sends its
    buffer once up and receives the result once, S/k through each of its k NICs. Inside the
    node: CollNet direct a reduce-scatter to the heads and an all-gather back (2(k-1)/k x S
    over NVLink), CollNet chain a chain up and down (2S), NVLS the switch (2(k-1)/k x S at
    ``nvls_gbps``)."""
    k = pl.per_node
    r = 1.0 / _US + 0.0 * S
    if algo == "nvls":
        t, hops = 2 * (k - 1) / k * S / (P["nvls_gbps"] * r), 2
    elif algo == "collnet_direct":
        t, hops = 2 * (k - 1) / k * S / (P["nvlink_gbps"] * r), 2
    else:
        t, hops = (2.0 if k > 1 else 0.0) * S / (P["nvlink_gbps"] * r), 2 * (k - 1)
    t = _vmax(t, S / (k * P["net_gbps"] * r))
    return _lat(P, "Simple", hops, 2) + _fused(P, t, S) + _chan(P, "Simple", ch, 2)


def _in_network_gather(P, coll: str, S: np.ndarray, pl: Placement, algo: str, ch: Channels) -> np.ndarray:
    """All-gather / reduce-scatter gathered or reduced by the network switches (SHARP, CollNet):
    each node's k heads move the whole buffer B (the gathered output; the reduce-scatter
    input) through the switch once, B/k through each NIC; inside the node every GPU receives
    (all-gather) or contributes (reduce-scatter) the (k-1)/k of B its heads carry: over NVLink
    (CollNet direct) or through the switch (NVLS), the reduction fused into the transfer."""
    n, k = pl.ranks, pl.per_node
    B = nccl_bytes(coll, S, n)
    r = 1.0 / _US + 0.0 * S
    rate = P["nvls_gbps"] if algo == "nvls" else P["nvlink_gbps"]
    t = (k - 1) / k * B / (rate * r)
    t = _vmax(t, B / (k * P["net_gbps"] * r))
    reduced = B if coll == "reduce_scatter" else 0.0 * S
    return _lat(P, "Simple", 1, 2) + _fused(P, t, reduced) + _chan(P, "Simple", ch, 2)


def _pat(P, coll: str, S: np.ndarray, pl: Placement, ch: Channels) -> np.ndarray:
    """PAT all-gather / reduce-scatter at one GPU per node: the ring's bytes through the NIC in
    log2(n) rounds of doubling distance (latency log2(n) network hops, not n-1)."""
    n = pl.ranks
    bus = (n - 1) / n * nccl_bytes(coll, S, n)
    r = _ramp(P, S, "Simple") / _US
    reduced = bus if coll == "reduce_scatter" else 0.0 * S
    levels = math.ceil(math.log2(n))
    return (_lat(P, "Simple", 0, levels) + _fused(P, bus / (P["net_gbps"] * r), reduced)
            + _chan(P, "Simple", ch, levels))


def _p2p_rate(P: Mapping[str, float], ch: Channels, ops: int) -> float:
    """What the channels a grouped send/recv runs on can carry (GB/s): ``ops`` operations of
    ``ch.used`` channels each, at most ``ch.total`` channels, ``p2p_chan_gbps`` each."""
    if ch is FULL:
        return math.inf
    return _vmin(float(ch.total), ops * ch.used) * P["p2p_chan_gbps"]


def _p2p_fill(op_bytes: np.ndarray, ch: Channels, proto: str, net: bool) -> np.ndarray | float:
    """The pipeline fill of a Simple send/recv: each channel moves its part of an operation in
    steps of NCCL_P2P_NVL_CHUNKSIZE (512 KiB; NCCL_P2P_NET_CHUNKSIZE, 128 KiB, across nodes),
    every step copied into the FIFO and out of it, so a channel's part takes one step more than
    its bytes: a 1 MiB part (two steps) runs at 2/3 of the rate, a 16 MiB part at 32/33."""
    if proto != "Simple" or ch is FULL:
        return 1.0
    per_channel = op_bytes / ch.used
    step = float(tuning.P2P_NET_CHUNK if net else tuning.P2P_NVL_CHUNK)
    return 1.0 + _vmin(per_channel, step) / _vmax(per_channel, 1.0)


def _p2p_pattern(P, coll: str, S: np.ndarray, pl: Placement, proto: str, ch: Channels = FULL) -> np.ndarray:
    """all-to-all, gather, scatter: NCCL runs them as grouped sends and receives, one
    operation per peer, each with its serial per-channel cost (and its proxy post across
    nodes); the bytes share NVLink and the NICs and the channels the operations run on."""
    n, k = pl.ranks, pl.per_node
    if coll == "all_to_all":      # each rank sends S/n to every other rank
        intra, inter = (k - 1) / n * S, (n - k) / n * S
    elif coll == "gather":        # the root receives one S-byte piece from every rank
        intra, inter = (k - 1) * S, (n - k) * S
    else:                         # scatter: the root (input S) sends S/n to every rank
        intra, inter = (k - 1) / n * S, (n - k) / n * S
    # Simple on known channels: the start-up is the pipeline fill of each channel's steps
    r = (_ramp(P, S, proto) if proto != "Simple" or ch is FULL else 1.0 + 0.0 * S) / _US
    e = PROTOCOL_PAYLOAD[proto]
    op = S if coll == "gather" else S / n           # one peer's operation
    # one GPU per node: no intra-node peer, and no rate to divide the (zero) bytes by
    t = intra / (_vmin(P["nvlink_gbps"], _p2p_rate(P, ch, max(k - 1, 1))) * e * r) * _p2p_fill(op, ch, proto, False)
    if pl.multi_node:
        t = _vmax(t, inter / (_vmin(P["net_gbps"], _p2p_rate(P, ch, n - k)) * e * r)
                  * _p2p_fill(op, ch, proto, True))
    per_peer = (n - 1) * P["chan_us"] + (n - k) * P["net_chan_us"]   # every rank has n-1 peers
    return _lat(P, proto, 1, 1 if pl.multi_node else 0) + t + per_peer


def _sendrecv(P, S: np.ndarray, pl: Placement, channels: Mapping[tuple[str, str], Channels]) -> Costs:
    """Every rank sends S to the next rank and receives S from the previous at once: the
    slowest pair sets the time (across nodes, the pair that crosses a node boundary)."""
    return p2p_costs(P, S, not pl.multi_node, channels)


def _hypercube(P, S: np.ndarray, pl: Placement, channels: Mapping[tuple[str, str], Channels]) -> Costs:
    """log2(n) rounds (one grouped send/recv each): in round i every rank exchanges 2^i
    shards with the rank at distance 2^i, a peer on another node once 2^i >= the GPUs per
    node (ranks packed onto nodes); every round on the channels of the largest one."""
    out: Costs = {}
    rounds = max(1, (pl.ranks - 1).bit_length())
    for i in range(rounds):
        same = (1 << i) < pl.per_node or not pl.multi_node
        for key, t in p2p_costs(P, S * (1 << i), same, channels).items():
            out[key] = out.get(key, 0.0) + t
    return out


def for_collective(P: Mapping[str, float], coll: str) -> Mapping[str, float]:
    """``P`` with the NVLink (and protocol limit) and network rates ``coll`` reaches: all-reduce's
    times its ``coll_nvlink_eff`` and ``coll_net_eff`` (1.0 unless a fit set them apart)."""
    intra, net = P.get(f"coll_nvlink_eff.{coll}", 1.0), P.get(f"coll_net_eff.{coll}", 1.0)
    if intra == 1.0 and net == 1.0:
        return P
    out = dict(P)
    for name in ("nvlink_gbps", "cap_gbps.LL", "cap_gbps.LL128"):
        out[name] = P[name] * intra
    out["net_gbps"] = P["net_gbps"] * net
    return out


def p2p_costs(P: Mapping[str, float], S: np.ndarray, same_node: bool,
              channels: Mapping[tuple[str, str], Channels] | None = None) -> Costs:
    """Send/recv between two ranks: one hop over NVLink or the network, at most at the rate
    of the channels it runs on (``channels[("p2p", protocol)]``; default: no channel limit)."""
    out: Costs = {}
    for proto in ("LL", "Simple"):
        ch = (channels or {}).get(("p2p", proto), FULL)
        r = (_ramp(P, S, proto) if proto != "Simple" or ch is FULL else 1.0 + 0.0 * S) / _US
        e = PROTOCOL_PAYLOAD[proto]
        bw = P["nvlink_gbps"] if same_node else P["net_gbps"]
        bw = _vmin(bw, _p2p_rate(P, ch, 1))
        out[("p2p", proto)] = (_lat(P, proto, 1 if same_node else 0, 0 if same_node else 1)
                               + S / (bw * e * r) * _p2p_fill(S, ch, proto, not same_node)
                               + P["chan_us"] + (0.0 if same_node else P["net_chan_us"]))
    return out


def candidate_costs(P: Mapping[str, float], coll: str, S: np.ndarray, pl: Placement,
                    channels: Mapping[tuple[str, str], Channels] | None = None,
                    only: Collection[tuple[str, str]] | None = None) -> Costs:
    """Time (us) of every (algorithm, protocol) NCCL could run for ``coll`` on ``pl``, each on
    ``channels[(algorithm, protocol)]`` (default: all channels); ``only``: just those pairs
    (what NCCL picked), where the parameters can price them."""
    channels = channels or {}
    if coll == "barrier":
        coll, S = "all_reduce", S * 0.0 + _BARRIER_BYTES
    if pl.ranks == 1:
        return {("local", "Simple"): P["local_setup_us"] + S / P["local_copy_gbps"] * _US}
    P = for_collective(P, coll)
    if coll == "sendrecv":
        return _sendrecv(P, S, pl, channels)
    if coll == "hypercube":
        return _hypercube(P, S, pl, channels)

    def wanted(algo: str, proto: str) -> bool:
        return only is None or (algo, proto) in only

    def ch(algo: str, proto: str) -> Channels:
        return channels.get((algo, proto), FULL)

    out: Costs = {}
    if coll in ("all_to_all", "gather", "scatter"):
        for proto in ("LL", "Simple"):
            if wanted("p2p", proto):
                out[("p2p", proto)] = _p2p_pattern(P, coll, S, pl, proto, ch("p2p", proto))
        return out
    for proto in PROTOCOLS:
        if wanted("ring", proto):
            out[("ring", proto)] = _ring(P, coll, S, pl, proto, ch("ring", proto))
    if coll in ("all_gather", "reduce_scatter"):
        if not pl.multi_node and P["nvls_gbps"] > 0 and pl.ranks > 2 and wanted("nvls", "Simple"):
            out[("nvls", "Simple")] = _nvls_gather(P, coll, S, pl)
        if pl.multi_node:
            if P["nvls_gbps"] > 0 and pl.per_node > 1 and wanted("nvls", "Simple"):
                out[("nvls", "Simple")] = _in_network_gather(P, coll, S, pl, "nvls", ch("nvls", "Simple"))
            if wanted("collnet_direct", "Simple"):
                out[("collnet_direct", "Simple")] = _in_network_gather(P, coll, S, pl, "collnet_direct",
                                                                       ch("collnet_direct", "Simple"))
        if pl.per_node == 1 and wanted("pat", "Simple"):
            out[("pat", "Simple")] = _pat(P, coll, S, pl, ch("pat", "Simple"))
    if coll == "all_reduce":
        if pl.multi_node and P["nvls_gbps"] > 0 and pl.per_node > 1:
            if wanted("nvls_tree", "Simple"):
                out[("nvls_tree", "Simple")] = _nvls_tree(P, S, pl, ch("nvls_tree", "Simple"))
            if wanted("nvls", "Simple"):
                out[("nvls", "Simple")] = _in_network(P, S, pl, "nvls", ch("nvls", "Simple"))
        if pl.multi_node:
            for algo in ("collnet_direct", "collnet_chain"):
                if wanted(algo, "Simple"):
                    out[(algo, "Simple")] = _in_network(P, S, pl, algo, ch(algo, "Simple"))
        for proto in PROTOCOLS:
            if wanted("tree", proto):
                out[("tree", proto)] = _tree(P, S, pl, proto, ch("tree", proto))
        if not pl.multi_node and P["nvls_gbps"] > 0 and pl.ranks > 2 and wanted("nvls", "Simple"):
            out[("nvls", "Simple")] = _nvls(P, S, pl)
    return out


def _channels(system: NcclSystem, pl: Placement, coll: str, sizes: list[int], scalar: bool
              ) -> dict[tuple[str, str], Channels]:
    """NCCL's channel count for every candidate and size. It depends on NCCL's tables, not
    on the performance parameters, so a fit that prices the same sizes thousands of times
    looks it up once (the arrays are read-only: every caller shares them)."""
    return _channels_of(system, pl, coll, tuple(sizes), scalar)


@lru_cache(maxsize=4096)
def _channels_of(system: NcclSystem, pl: Placement, coll: str, sizes: tuple[int, ...], scalar: bool
                 ) -> dict[tuple[str, str], Channels]:
    if pl.ranks < 2:
        return {}
    if coll in tuning.P2P_COLLECTIVES:        # one operation's channels, out of all p2p channels
        used = [tuning.choose(system, pl, coll, b).channels for b in sizes]
        ch = Channels(float(used[0]) if scalar else _frozen(used), tuning.p2p_channels(system, pl)[0])
        return {("p2p", "LL"): ch, ("p2p", "Simple"): ch}
    if coll not in nccl_releases.FUNCTIONS:
        return {}
    table = tuning.table_for(system, pl)
    out = {}
    for algo, proto in tuning.candidates(system, pl, coll):
        nbytes = [tuning.nccl_function_bytes(coll, b, pl.ranks) for b in sizes]
        used = [tuning.channels_threads(table, pl, algo, proto, b)[0] for b in nbytes]
        # a tree across nodes with LL128 or Simple (no start-up ramp: a pipeline) reaches the share
        # of its bandwidth NCCL's tree correction factors say
        reach = [tuning.tree_correction(system, proto, b) if algo == "tree" and proto != "LL" and pl.multi_node
                 else 1.0 for b in nbytes]
        out[(algo, proto)] = Channels(float(used[0]) if scalar else _frozen(used), table.channels,
                                      float(reach[0]) if scalar else _frozen(reach))
    return out


@lru_cache(maxsize=4096)
def _nccl_picks(system: NcclSystem, pl: Placement, coll: str, sizes: tuple[int, ...]) -> tuple[Choice, ...]:
    """NCCL's choice for each size, looked up once per list of sizes (see :func:`_channels`)."""
    return tuple(tuning.choose(system, pl, coll, b) for b in sizes)


def _frozen(values: list[int] | list[float]) -> np.ndarray:
    arr = np.array(values, dtype=float)
    arr.flags.writeable = False
    return arr


def choose(P: Mapping[str, float], coll: str, S: np.ndarray, pl: Placement, system: NcclSystem,
           mode: str = "nccl") -> tuple[np.ndarray, list[Choice]]:
    """Kernel time (us) per size and what runs: with ``mode="nccl"`` the (algorithm, protocol,
    channels) NCCL's own tuner picks (:mod:`~echo_et.models.comm.tuning`), timed by this
    performance model; with ``mode="fastest"`` the pair this model rates fastest among those
    NCCL has enabled (what a tuned NCCL_ALGO/NCCL_PROTO would run), with NCCL's channels."""
    if (coll not in COLLECTIVES and coll not in MEASURED_PATTERNS) or coll in ("send", "recv"):
        raise EchoError(f"unknown collective {coll!r}")
    if mode not in CHOICE_MODES:
        raise EchoError(f"unknown choice {mode!r} (known: {', '.join(CHOICE_MODES)})")
    S = np.asarray(S, dtype=float)
    scalar = S.ndim == 0
    if scalar:
        S = S[()]  # a numpy scalar: the cost functions then run on plain floats
    if coll == "barrier":
        coll, S = "all_reduce", S * 0.0 + _BARRIER_BYTES
    sizes = [int(S)] if scalar else [int(x) for x in np.ravel(S)]
    channels = _channels(system, pl, coll, sizes, scalar)
    if pl.ranks == 1:
        picks = [Choice("local", "Simple", 1, 0, -1.0)] * len(sizes)
        perf = candidate_costs(P, coll, S, pl, channels)
    elif mode == "nccl":     # what runs does not depend on the parameters: price only that
        picks = list(_nccl_picks(system, pl, coll, tuple(sizes)))
        perf = candidate_costs(P, coll, S, pl, channels, only={(c.algorithm, c.protocol) for c in picks})
    else:
        perf = candidate_costs(P, coll, S, pl, channels)
        enabled = [key for key in tuning.candidates(system, pl, coll) if key in perf]
        picks = []
        for i, b in enumerate(sizes):
            best = min(enabled, key=lambda key: float(np.ravel(perf[key])[i] if not scalar else perf[key]))
            picks.append(tuning.with_pair(system, pl, coll, b, *best))
    for c in picks:
        if (c.algorithm, c.protocol) not in perf:
            raise EchoError(f"{coll}: NCCL runs {c.algorithm}/{c.protocol} here, which the parameters "
                            "cannot price (nvls_gbps is 0?)")
    if scalar:
        c = picks[0]
        return np.asarray(perf[(c.algorithm, c.protocol)], dtype=float), picks
    keys = [(c.algorithm, c.protocol) for c in picks]
    flat = {key: np.ravel(np.broadcast_to(perf[key], S.shape)) for key in dict.fromkeys(keys)}
    times = np.array([flat[key][i] for i, key in enumerate(keys)], dtype=float).reshape(S.shape)
    return times, picks
