"""A white-box model of how NCCL moves the bytes of one collective.

For every (algorithm, protocol) NCCL could run, the kernel time is

    setup + hops x per-hop latency + max(bytes on each link / its rate) + pipeline fill
          + reduced bytes / reduction rate

(the resources in the max are NVLink, the node's NICs and the protocol's own throughput
limit; the reduction term is added, as in Echo's model, not overlapped), with the structure of NCCL's algorithms:

- ring (all-reduce, all-gather, reduce-scatter): 2(n-1) or n-1 steps; the ring is a cycle
  that crosses each of the m node boundaries once, so a fraction m/n of its steps go over
  the network; every rank moves (steps + loop overhead)/n of the buffer through its NVLink
  and, across nodes, its node's NICs;
- tree (all-reduce across nodes): a chain inside each node and a double binary tree across
  nodes, reduce up then broadcast down, pipelined in chunks: 2((k-1) + ceil(log2 m)) hops;
  2S through NVLink; across nodes S per node when m == 2 (each node is the other's root)
  and 2S when m > 2 (an inner node has two children), at a fraction of the ring's network
  rate that depends on the node count as in NCCL's tuning (``tree_net_eff`` on two nodes,
  ``tree_net_eff_many`` on more);
- chain (broadcast, reduce): n-1 pipelined hops;
- NVLS (all-reduce inside one NVSwitch node with NVLink SHARP, Hopper and later);
- point-to-point (send/recv, all-to-all, gather, scatter).

Protocols: LL (8-byte lines, half payload), LL128 (120 of 128 bytes), Simple (full
payload, larger per-hop latency); LL and LL128 also have a throughput limit of their own.
Start-up: a ring (and any LL transfer) reaches its full rate only for messages of
``ramp_bytes`` and more (fewer channels and short per-step chunks for small messages): the
usable bandwidth ramps from 1/channels at tiny sizes to all of it at ``ramp_bytes``. A tree
with LL128 or Simple runs every channel from a few KiB per channel (NCCL's thread thresholds)
and pays its start-up as the pipeline fill of its chunks instead.

NCCL picks the (algorithm, protocol) its own cost table rates fastest. We model that choice
with the same costs seen through the one belief of NCCL's table that differs from the
performance model: the tree's inter-node traffic is always 2S (its table converts the tree's
bus bandwidth to algorithm bandwidth with a fixed factor 1/2 and has no two-node special
case). So on two nodes NCCL runs the ring where the tree would be faster, and so does the
model; the kernel time is the *performance* cost of the chosen pair. CollNet (needs
SHARP-capable switches) and PAT are not modelled.

Everything here is a pure function of (parameters, collective, sizes, placement).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from echo_et.errors import EchoError
from echo_et.models.comm.params import PROTOCOL_PAYLOAD, PROTOCOLS
from echo_et.models.comm.topology import Placement

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
               "reduce", "gather", "scatter", "barrier", "send", "recv")

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


def _lat(P: Mapping[str, float], proto: str, intra_hops: float, net_hops: float) -> float:
    return (P[f"base_us.{proto}"] + intra_hops * P[f"nvlink_hop_us.{proto}"]
            + net_hops * P[f"net_hop_us.{proto}"])


def _ring(P, coll: str, S: np.ndarray, pl: Placement, proto: str) -> np.ndarray:
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
    r = _ramp(P, nccl_bytes(coll, S, n), proto) / _US
    e = PROTOCOL_PAYLOAD[proto]
    t = bus / (P["nvlink_gbps"] * e * r)
    if m > 1:
        t = _vmax(t, bus / (k * P["net_gbps"] * e * r))
    if proto != "Simple":
        t = _vmax(t, bus / (P[f"cap_gbps.{proto}"] * r))
    if coll in ("broadcast", "reduce") and proto != "LL" and steps > 1:
        link = min(P["nvlink_gbps"], k * P["net_gbps"]) if m > 1 else P["nvlink_gbps"]
        t = t + (steps - 1) * _vmin(S, P["tree_chunk_bytes"]) / (link * e) * _US
    return _lat(P, proto, steps - net_steps, net_steps) + t + reduced / P["reduce_gbps"] * _US


def _tree(P, S: np.ndarray, pl: Placement, proto: str, *, belief: bool) -> np.ndarray:
    m, k = pl.nodes, pl.per_node
    levels = math.ceil(math.log2(m))
    # LL128 / Simple trees run all channels from a few KiB per channel; their start-up is the
    # pipeline fill below, not the ring's ramp
    r = (_ramp(P, S, proto) if proto == "LL" else 1.0 + 0.0 * S) / _US
    e = PROTOCOL_PAYLOAD[proto]
    net_share = 1.0 if (m == 2 and not belief) else 2.0
    eff = P["tree_net_eff"] if m <= 2 else P["tree_net_eff_many"]
    t_nvl = 2 * S / (P["nvlink_gbps"] * e * r)
    t_net = net_share * S / (k * P["net_gbps"] * e * eff * r)
    cap = P["tree_simple_cap_gbps"] if proto == "Simple" else P[f"cap_gbps.{proto}"]
    t = _vmax(_vmax(t_nvl, t_net), 2 * S / (cap * r))
    if proto != "LL":
        hops = 2 * (k - 1 + levels) - 1
        link = min(P["nvlink_gbps"], k * P["net_gbps"])
        t = t + hops * _vmin(S, P["tree_chunk_bytes"]) / (link * e) * _US
    return _lat(P, proto, 2 * (k - 1), 2 * levels) + t + S / P["reduce_gbps"] * _US


def _nvls(P, S: np.ndarray, pl: Placement) -> np.ndarray:
    n = pl.ranks
    r = _ramp(P, S, "Simple") / _US
    return _lat(P, "Simple", 2, 0) + 2 * (n - 1) / n * S / (P["nvls_gbps"] * r)


def _p2p_pattern(P, coll: str, S: np.ndarray, pl: Placement, proto: str) -> np.ndarray:
    """all-to-all, gather, scatter: NCCL runs them as grouped sends and receives."""
    n, k = pl.ranks, pl.per_node
    if coll == "all_to_all":      # each rank sends S/n to every other rank
        intra, inter = (k - 1) / n * S, (n - k) / n * S
    elif coll == "gather":        # the root receives one S-byte piece from every rank
        intra, inter = (k - 1) * S, (n - k) * S
    else:                         # scatter: the root (input S) sends S/n to every rank
        intra, inter = (k - 1) / n * S, (n - k) / n * S
    r = _ramp(P, S, proto) / _US
    e = PROTOCOL_PAYLOAD[proto]
    t = intra / (P["nvlink_gbps"] * e * r)
    if pl.multi_node:
        t = _vmax(t, inter / (P["net_gbps"] * e * r))
    return _lat(P, proto, 1, 1 if pl.multi_node else 0) + t


def p2p_costs(P: Mapping[str, float], S: np.ndarray, same_node: bool) -> Costs:
    """Send/recv between two ranks: one hop over NVLink or the network."""
    out: Costs = {}
    for proto in ("LL", "Simple"):
        r = _ramp(P, S, proto) / _US
        e = PROTOCOL_PAYLOAD[proto]
        bw = P["nvlink_gbps"] if same_node else P["net_gbps"]
        out[("p2p", proto)] = _lat(P, proto, 1 if same_node else 0, 0 if same_node else 1) + S / (bw * e * r)
    return out


def candidate_costs(P: Mapping[str, float], coll: str, S: np.ndarray, pl: Placement) -> Costs:
    """Time (us) of every (algorithm, protocol) NCCL could run for ``coll`` on ``pl``."""
    if coll == "barrier":
        coll, S = "all_reduce", S * 0.0 + _BARRIER_BYTES
    if pl.ranks == 1:
        return {("local", "Simple"): P["local_setup_us"] + S / P["local_copy_gbps"] * _US}
    out: Costs = {}
    if coll in ("all_to_all", "gather", "scatter"):
        for proto in ("LL", "Simple"):
            out[("p2p", proto)] = _p2p_pattern(P, coll, S, pl, proto)
        return out
    for proto in PROTOCOLS:
        out[("ring", proto)] = _ring(P, coll, S, pl, proto)
    if coll == "all_reduce":
        if pl.multi_node:
            for proto in PROTOCOLS:
                out[("tree", proto)] = _tree(P, S, pl, proto, belief=False)
        elif P["nvls_gbps"] > 0 and pl.ranks > 2:
            out[("nvls", "Simple")] = _nvls(P, S, pl)
    return out


def choose(P: Mapping[str, float], coll: str, S: np.ndarray, pl: Placement
           ) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Kernel time (us) per size and the (algorithm, protocol) NCCL is modelled to pick."""
    if coll not in COLLECTIVES or coll in ("send", "recv"):
        raise EchoError(f"unknown collective {coll!r}")
    S = np.asarray(S, dtype=float)
    if S.ndim == 0:
        S = S[()]  # a numpy scalar: the cost functions then run on plain floats
    if coll == "barrier":
        coll, S = "all_reduce", S * 0.0 + _BARRIER_BYTES
    perf = candidate_costs(P, coll, S, pl)
    seen = perf
    if ("tree", "LL") in perf:  # NCCL's view differs from the performance model for the tree only
        seen = dict(perf)
        for proto in PROTOCOLS:
            seen[("tree", proto)] = _tree(P, S, pl, proto, belief=True)
    keys = list(perf)
    if np.ndim(S) == 0:  # one size: plain comparisons are much cheaper than stacking arrays
        best = min(keys, key=lambda key: float(seen[key]))
        return np.asarray(perf[best], dtype=float), [best]
    pick = np.stack([np.broadcast_to(seen[key], S.shape) for key in keys]).argmin(axis=0)
    times = np.stack([np.broadcast_to(perf[key], S.shape) for key in keys])
    chosen = np.take_along_axis(times, pick[None, ...], axis=0)[0]
    return chosen, [keys[i] for i in np.atleast_1d(pick).tolist()]
