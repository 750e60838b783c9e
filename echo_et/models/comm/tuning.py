"""What NCCL itself would run: algorithm, protocol, channels and threads for one collective.

This emulates NCCL's own tuner, not the fastest choice: NCCL picks the (algorithm, protocol)
its internal cost table rates fastest, ``latency + bytes / bandwidth``, built once per
communicator from its topology search, and then trims the channel and thread count to the
message size. Those tables are not the truth about a cluster (they are NVIDIA's fixed
estimates), which is why NCCL's choice is sometimes slower than another option and why
measured curves have steps (the shared 32-GPU log: 64 KiB slower than 128 KiB, where the tree
switches from LL to LL128).

Each modelled release's constants (latencies, speed lists, per-channel limits, the flags of
the rules it follows) and the NCCL sources they are read from are in
:mod:`echo_et.models.comm.nccl_releases`; this module is the algorithm that uses them: the
cost table and the choice.

2.7.5 and 2.20.3 alike: LL128 is enabled only on Volta/Ampere(/Hopper) with NVLink inside the
node and a GPU-to-NIC path through PCIe switches only (PIX/PXB); per-thread work thresholds
of 8 B (LL, x ranks for the ring), 8 B (LL128) and 64 B (Simple), 512 threads (LL, Simple)
and 640 (LL128): a message of ``S`` bytes runs on the most channels ``c`` with ``c x threads
x threshold <= S``.

What is modelled: ring, tree, NVLS (single Hopper node, 2.17.1+; all-gather and
reduce-scatter too in 2.28.3), NVLS-tree (all-reduce across Hopper NVSwitch nodes, 2.28.3),
PAT (2.28.3), the five collectives NCCL tunes (broadcast, reduce, all-gather, reduce-scatter,
all-reduce) and grouped send/recv (all-to-all, gather, scatter, send, recv: NCCL's p2p path,
Simple, and LL up to 16 KiB per peer from 2.20.3), CollNet direct/chain and NVLS across nodes
for all-reduce (2.28.3, only where the node facts say ``collnet``: SHARP switches, NCCL's
CollNet plugin and NCCL_COLLNET_ENABLE=1; no shared log has it, so it is checked against
NCCL's constants only). Not modelled: CollNet and NVLS all-gather/reduce-scatter across nodes
(they also need the plugin's iallgather/ireducescatter and a head per local GPU), 2.28's
symmetric-memory kernels and CE collectives, user overrides (NCCL_ALGO, NCCL_PROTO, NCCL_*CHANNELS), tuner plugins, and
aggregation of several collectives in one group (each op is tuned alone).

The node facts and the graph search reduced to its result (which rings and trees NCCL finds
in a node) are :mod:`echo_et.models.comm.nccl_graphs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from echo_et.errors import EchoError
from echo_et.models.comm.nccl_graphs import (
    PATH_TYPES,
    Graph,
    NcclSystem,
    collnet_graph,
    first_at_most,
    nvls_graph,
    search_graphs,
)
from echo_et.models.comm.nccl_releases import (
    COLLNET_ARITY_LAT,
    COLLNET_DIRECT_MAX_LOCAL,
    COLLNET_THREAD_THRESHOLD,
    FUNCTIONS,
    GEN,
    LL128_MAX_BW_PER_CH_275,
    LL128_MAX_BW_PER_CH_2171,
    LL_MAX_BWS,
    NVLS_EFFICIENCY_SM90,
    PAT_BW_FACTOR,
    PAT_RANK_LAT,
    PER_CH_MAX_NVLS_TREE_SM90,
    PER_CH_MAX_RING_LL128,
    PER_CH_MAX_TREE,
    PER_CH_MAX_TREE_LL128,
    PROTOCOLS,
    RELEASES,
)
from echo_et.models.comm.topology import Placement

# NCCL's algorithms in its own order (NCCL_ALGO_*)
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
# the IR collectives NCCL runs as grouped send/recv (its p2p path), not from the cost table
P2P_COLLECTIVES = ("all_to_all", "gather", "scatter", "send", "recv", "sendrecv", "hypercube")


LL_MAX_THREADS, LL128_MAX_THREADS, SIMPLE_MAX_THREADS = 512, 640, 512
P2P_THREADS = 640                 # NCCL_MAX_NTHREADS
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
P2P_LL_THRESHOLD = 16384          # 2.20.3: send/recv of at most this many bytes use LL
NET_CHANNELS_PER_PEER = 2         # NCCL_NCHANNELS_PER_NET_PEER default
P2P_NVL_CHUNK = 512 << 10         # NCCL_P2P_NVL_CHUNKSIZE default: a send/recv step over NVLink
P2P_NET_CHUNK = 128 << 10         # NCCL_P2P_NET_CHUNKSIZE default: a send/recv step across nodes


@dataclass(frozen=True)
class Choice:
    algorithm: str        # "ring", "tree", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat", "p2p"
    protocol: str         # "LL", "LL128", "Simple"
    channels: int         # channels (thread blocks) the kernel runs on for this message
    threads: int          # threads per channel
    nccl_time_us: float   # NCCL's own estimate of the time (its cost table, not ours)


# -- the cost table ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """NCCL's per-communicator tuning: algorithm bandwidth (GB/s) and latency (us) per
    (collective, algorithm, protocol); 0 bandwidth = not available."""

    bandwidth: dict[tuple[str, str, str], float]
    latency: dict[tuple[str, str, str], float]
    channels: int                                   # the communicator's channels
    max_threads: dict[tuple[str, str], int]
    graphs: dict[str, Graph]


def _ll128_enabled(system: NcclSystem, g: Graph) -> bool:
    cc = system.node.compute_capability
    order = PATH_TYPES.index
    if system.version == "2.7.5":
        return order(g.type_inter) <= order("PXB") and order(g.type_intra) <= order("NVL") and cc in (70, 80)
    inter_ok = order(g.type_inter) <= order("PXB") or (cc >= 90 and order(g.type_inter) <= order("PXN"))
    intra_ok = order(g.type_intra) <= order("NVL" if system.version == "2.17.1" else "NVB")
    return inter_ok and intra_ok and cc in (70, 80, 90)


def _net_overhead(system: NcclSystem) -> float:
    return 2.0 if system.node.cpu_vendor == "AMD" else 1.0


def _bus_bw(system: NcclSystem, g: Graph, coll: str, algo: str, proto: str, m: int, ppn: float) -> float:
    """NCCL's bus bandwidth (GB/s) of one (collective, algorithm, protocol) on a graph."""
    version, node = system.version, system.node
    rel = RELEASES[version]
    cc = node.compute_capability
    gen = GEN[min(max(cc // 10 * 10, 70), 90)]
    nidx = 0 if m == 1 else 1 if m == 2 else 2
    bus = g.channels * (g.bw_intra if m <= 2 else g.bw_inter)
    if rel.bus_cap:
        if cc == 80 or (version != "2.7.5" and gen == 1):
            bus = min(bus, 235.0)
        elif version != "2.7.5" and gen == 2:
            bus = min(bus, 370.0)
    ll_ratio = rel.ring_ll_ratio or (0.25 if (m > 1 or coll in ("all_reduce", "reduce")) else 1.0 / 3.0)
    if rel.caps == "2.7":
        per_coll = LL128_MAX_BW_PER_CH_275[coll]
        if algo == "ring" and proto == "LL":
            bus *= ll_ratio
        if algo == "ring" and proto == "LL128":
            bus = min(bus * (0.7 if ppn < 2 else 0.92), per_coll * g.channels)
        if algo == "tree":
            cc80 = cc == 80
            max_tree = ((105.0 if cc80 and proto == "LL128" else 80.0) if m > 2 else
                        (130.0 if cc80 and proto == "LL128" else 110.0))
            bus = min(bus * 0.9, max_tree)
            if proto == "LL":
                bus /= 3.8
            if proto == "LL128":
                bus = min(bus * (7.0 / 9.0 if m == 1 else 0.915), per_coll * g.channels * 7.0 / 9.0)
        return bus
    cpu_row = 1 if node.cpu_vendor == "AMD" else 0
    ll_max = LL_MAX_BWS[gen if m == 1 else cpu_row][nidx]
    if m == 1 and gen == 2 and rel.ll_max_hopper:
        ll_max = rel.ll_max_hopper[nidx]
    ring_ll128 = (LL128_MAX_BW_PER_CH_2171[gen] if version == "2.17.1" else PER_CH_MAX_RING_LL128[gen][nidx])
    tree_ll128 = (LL128_MAX_BW_PER_CH_2171[gen] if version == "2.17.1" else PER_CH_MAX_TREE_LL128[gen][nidx])
    if algo == "ring" and proto == "LL":
        bus = min(ll_max, bus * ll_ratio)
    if algo == "ring" and proto == "LL128":
        bus = min(bus * (0.7 if ppn < 2 and rel.ring_ll128_ppn else 0.92), g.channels * ring_ll128)
    if algo == "tree":
        bus = min(bus * 0.92, g.channels * PER_CH_MAX_TREE[version][gen][nidx])
        if proto == "LL":
            bus = min(bus / 3.8, ll_max)
        if proto == "LL128":
            bus = min(bus * (7.0 / 9.0 if m == 1 else 120.0 / 128.0), g.channels * tree_ll128)
    return bus


def tune(system: NcclSystem, pl: Placement) -> Table:
    """NCCL's cost table for a communicator on ``pl`` (``ncclTopoTuneModel``)."""
    if pl.ranks < 2:
        raise EchoError("NCCL tunes groups of two or more ranks")
    graphs = search_graphs(system, pl)
    rel = RELEASES[system.version]
    node = system.node
    n, m = pl.ranks, pl.nodes
    ppn = n / m
    bw: dict[tuple[str, str, str], float] = {}
    lat: dict[tuple[str, str, str], float] = {}

    for coll in FUNCTIONS:
        nsteps = 2 * (n - 1) if coll == "all_reduce" else n - 1 if coll in ("all_gather", "reduce_scatter") else n
        if coll == "all_reduce":
            inter_steps = (2 * m if m > 1 else 0) if rel.ring_inter_steps_all_nodes else 2 * (m - 1)
        else:
            inter_steps = m - 1 if coll in ("all_gather", "reduce_scatter") else m
        for algo in ("tree", "ring"):
            if algo == "tree" and coll != "all_reduce":
                continue
            g = graphs[algo]
            intra_hw = "nvlink" if g.type_intra == "NVL" else "pci"
            hw = intra_hw if m == 1 else "net"
            for proto in PROTOCOLS:
                ratio = n / nsteps if algo == "ring" else 0.5
                bw[(coll, algo, proto)] = _bus_bw(system, g, coll, algo, proto, m, ppn) * ratio

                t = rel.base_lat[(algo, proto)]
                intra_lat = rel.hw_lat[(intra_hw, algo, proto)]
                inter_lat = rel.hw_lat[("net", "tree" if rel.ppn1_tree_net_lat and n == m else algo, proto)]
                if m > 1 and proto == "LL":
                    intra_lat *= rel.ll_intra_factor
                if algo == "ring":
                    if coll in ("reduce", "broadcast"):
                        step = rel.hw_lat[(hw, algo, proto)]
                        if g.same_channels:
                            t += step
                        else:
                            if proto == "Simple":
                                step = rel.hw_lat[(hw, "tree", proto)]
                            t += nsteps * step
                    else:
                        if rel.net_overhead and m > 1:
                            overhead = _net_overhead(system) * (3.0 if proto == "Simple" else 1.0)
                            intra_lat = max(intra_lat, overhead)
                        t += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
                else:
                    t += 2 * ((n // m - 1) * intra_lat + int(math.log2(m)) * inter_lat)
                lat[(coll, algo, proto)] = t
        if rel.nvls_tree or rel.pat:          # 2.28.3's NVLS, NVLS-tree and PAT
            _tune_228(system, pl, graphs, coll, nsteps, bw, lat)
            continue
        # NVLS: all-reduce inside one Hopper NVSwitch node with NVLink SHARP (2.17.1, 2.20.3)
        if (rel.nvls_lat and coll == "all_reduce" and m == 1 and node.nvls and node.compute_capability >= 90
                and node.intra == "nvswitch" and n > 2):
            if system.version == "2.17.1":     # NVLS is rated at the ring graph's NVSwitch speed
                ring = graphs["ring"]
                bw[(coll, "nvls", "Simple")] = min(ring.channels * ring.bw_intra, 370.0) * 0.75
            else:                                # assumed NVLS graph: one channel per GPU
                speeds = rel.speeds_intra_sm90
                s = speeds[first_at_most(speeds, node.intra_bw / n)]
                bw[(coll, "nvls", "Simple")] = n * s * 5.0 / 6.0
            lat[(coll, "nvls", "Simple")] = rel.nvls_lat

    for key in list(bw):
        coll, algo, proto = key
        if proto == "LL128" and algo in graphs and not _ll128_enabled(system, graphs[algo]):
            bw[key] = 0.0

    ring = graphs["ring"]
    simple_threads = 256 if ring.bw_intra * ring.channels <= 12.0 else SIMPLE_MAX_THREADS
    max_threads = {("ring", "LL"): LL_MAX_THREADS, ("tree", "LL"): LL_MAX_THREADS,
                   ("ring", "LL128"): LL128_MAX_THREADS, ("tree", "LL128"): LL128_MAX_THREADS,
                   ("ring", "Simple"): simple_threads, ("tree", "Simple"): SIMPLE_MAX_THREADS,
                   ("nvls", "Simple"): P2P_THREADS if rel.nvls_tree else SIMPLE_MAX_THREADS,
                   ("nvls_tree", "Simple"): P2P_THREADS,      # 2.28.3: NCCL_MAX_NTHREADS
                   ("pat", "Simple"): SIMPLE_MAX_THREADS, ("collnet_direct", "Simple"): P2P_THREADS,
                   ("collnet_chain", "Simple"): P2P_THREADS}
    channels = min(system.max_channels, 2 * min(graphs["ring"].channels, graphs["tree"].channels))
    return Table(bw, lat, channels, max_threads, graphs)


def uses_nvls_tree(system: NcclSystem) -> bool:
    """Whether this release runs NVLS-tree all-reduce across this system's nodes."""
    return RELEASES[system.version].nvls_tree and system.node.nvls and system.node.compute_capability >= 90


def _tune_228(system: NcclSystem, pl: Placement, graphs: dict[str, Graph], coll: str, nsteps: int,
              bw: dict[tuple[str, str, str], float], lat: dict[tuple[str, str, str], float]) -> None:
    """2.28.3's ``ncclTopoTuneModel`` for NVLS (one node: all-reduce, all-gather,
    reduce-scatter; across nodes NCCL enables it only with CollNet), NVLS-tree (all-reduce
    across nodes) and PAT (all-gather, reduce-scatter at one GPU per node), Simple only."""
    rel = RELEASES[system.version]
    n, m = pl.ranks, pl.nodes
    ppn = n / m
    nidx = 0 if m == 1 else 1 if m == 2 else 2
    g = nvls_graph(system, pl)
    net_lat = rel.hw_lat[("net", "tree" if n == m else "nvls_tree", "Simple")]
    if g is not None and g.channels >= 2 and coll in ("all_reduce", "all_gather", "reduce_scatter"):
        algo = "nvls" if m == 1 else "nvls_tree"
        if algo == "nvls" or coll == "all_reduce":
            intra = g.bw_intra * NVLS_EFFICIENCY_SM90 * (g.channels - 1) / g.channels
            intra *= 2.0 if coll == "all_reduce" else (ppn - 1) / ppn   # all-reduce pipelines two
            inter = g.bw_inter * (2.0 if m <= 2 and algo == "nvls_tree" else 1.0)
            per_ch = min(intra, inter, PER_CH_MAX_NVLS_TREE_SM90[nidx] if algo == "nvls_tree" else math.inf)
            ratio = n / nsteps if coll == "all_reduce" else 1.0    # no bus -> algorithm conversion
            bw[(coll, algo, "Simple")] = g.channels * per_ch * ratio
            t = rel.hw_lat[("nvlink", algo, "Simple")]
            lat[(coll, algo, "Simple")] = t + (2 * int(math.log2(m)) * net_lat if algo == "nvls_tree" else 0.0)
    if g is not None and g.channels >= 2 and coll == "all_reduce" and m > 1 and system.node.collnet:
        # NVLS across nodes: the switch reduces in the node, SHARP across (enabled with CollNet)
        intra = g.bw_intra * NVLS_EFFICIENCY_SM90 * (g.channels - 1) / g.channels * 2.0
        bw[(coll, "nvls", "Simple")] = g.channels * min(intra, g.bw_inter) * n / nsteps
        lat[(coll, "nvls", "Simple")] = rel.hw_lat[("nvlink", "nvls", "Simple")] + rel.hw_lat[("net", "nvls", "Simple")]
    if coll == "all_reduce" and m > 1 and system.node.collnet:
        _tune_collnet(system, pl, bw, lat)
    if coll in ("all_gather", "reduce_scatter") and m > 1 and system.node.collnet:
        _tune_collnet_gather(system, pl, g, coll, bw, lat)
    if rel.pat and coll in ("all_gather", "reduce_scatter") and n == m:
        tree = graphs["tree"]
        bw[(coll, "pat", "Simple")] = tree.channels * (tree.bw_intra if m <= 2 else tree.bw_inter) * PAT_BW_FACTOR
        lat[(coll, "pat", "Simple")] = (rel.base_lat[("pat", "Simple")] + int(math.log2(m)) * net_lat / 3.5
                                        + n * PAT_RANK_LAT)


def _tune_collnet(system: NcclSystem, pl: Placement, bw: dict[tuple[str, str, str], float],
                  lat: dict[tuple[str, str, str], float]) -> None:
    """2.28.3's CollNet direct and chain all-reduce (Simple only): the graph's intra-node
    rate per channel; direct divided by half the excess of GPUs per head (and x0.85 from
    Hopper on), both x1/2 (bus -> algorithm); latency direct ``2 (min(1, k-1) x 3.7 + (k-1) x
    0.4) + 31`` us, chain ``2 (k-1) x 2.8 + 30`` us (NVLink hops; the network hop is the tree's
    14 us at one GPU per node)."""
    rel = RELEASES[system.version]
    k, n, m = pl.per_node, pl.ranks, pl.nodes
    g = collnet_graph(system, pl)
    hw = "nvlink" if g.type_intra == "NVL" else "pci"
    ppn = n / m
    for algo in ("collnet_direct", "collnet_chain"):
        net = rel.hw_lat[("net", "tree" if n == m else algo, "Simple")]
        intra = rel.hw_lat[(hw, algo, "Simple")]
        bus = g.channels * g.bw_intra
        if algo == "collnet_direct":
            if k > COLLNET_DIRECT_MAX_LOCAL or system.node.intra != "nvswitch":
                continue
            factor = ppn / g.channels
            bus /= factor - (factor - 1) / 2
            if system.node.compute_capability >= 90:
                bus *= 0.85
            t = 2 * (min(1, k - 1) * intra + (k - 1) * COLLNET_ARITY_LAT) + net
        else:
            t = 2 * (k - 1) * intra + net
        bw[("all_reduce", algo, "Simple")] = bus * 0.5
        lat[("all_reduce", algo, "Simple")] = t


def _tune_collnet_gather(system: NcclSystem, pl: Placement, g: Graph | None, coll: str,
                         bw: dict[tuple[str, str, str], float], lat: dict[tuple[str, str, str], float]) -> None:
    """2.28.3's all-gather and reduce-scatter across nodes in the network switches (Simple
    only; ``tuning.cc``): enabled only with CollNet (``collnet`` node fact: SHARP switches and
    a CollNet plugin that has ``iallgather`` / ``ireducescatter``) and when no node has more
    GPUs than CollNet heads. NVLS (Hopper NVLink SHARP inside the node): per channel
    ``min(bwIntra x 0.85 x (c-1)/c x (ppn-1)/ppn, bwInter)`` x channels, latency NVLS NVLink +
    network (25 + 18 us); CollNet direct (NVSwitch nodes): ``ppn x min(bwIntra, 0.9 x
    bwInter)``, latency ``2 (min(1, k-1) x 3.7 + (k-1) x 0.4) + 31`` us. Neither converts bus to
    algorithm bandwidth (NCCL does so only for the ring of these two collectives); at one GPU
    per node the network latency is the tree's."""
    rel = RELEASES[system.version]
    k, n, m = pl.per_node, pl.ranks, pl.nodes
    ppn = n / m
    cg = collnet_graph(system, pl)
    if k > cg.channels:                       # a node with more local ranks than heads
        return
    if g is not None and g.channels >= 2:
        intra = g.bw_intra * NVLS_EFFICIENCY_SM90 * (g.channels - 1) / g.channels * (ppn - 1) / ppn
        bw[(coll, "nvls", "Simple")] = g.channels * min(intra, g.bw_inter)
        lat[(coll, "nvls", "Simple")] = (rel.hw_lat[("nvlink", "nvls", "Simple")]
                                         + rel.hw_lat[("net", "tree" if n == m else "nvls", "Simple")])
    if system.node.intra == "nvswitch" and k <= COLLNET_DIRECT_MAX_LOCAL:
        hw = "nvlink" if cg.type_intra == "NVL" else "pci"
        bw[(coll, "collnet_direct", "Simple")] = ppn * min(cg.bw_intra, 0.9 * cg.bw_inter)
        lat[(coll, "collnet_direct", "Simple")] = (
            2 * (min(1, k - 1) * rel.hw_lat[(hw, "collnet_direct", "Simple")] + (k - 1) * COLLNET_ARITY_LAT)
            + rel.hw_lat[("net", "tree" if n == m else "collnet_direct", "Simple")])


@lru_cache(maxsize=4096)
def table_for(system: NcclSystem, pl: Placement) -> Table:
    return tune(system, pl)


def _log2i(x: int) -> int:
    return x.bit_length() - 1 if x > 0 else 0


def nccl_time(system: NcclSystem, table: Table, pl: Placement, coll: str, algo: str, proto: str,
              nbytes: int) -> float:
    """NCCL's estimate (``ncclTopoGetAlgoTime``); -1 when the pair is not available."""
    bw = table.bandwidth.get((coll, algo, proto), 0.0)
    if bw <= 0:
        return -1.0
    lat = table.latency[(coll, algo, proto)]
    rel = RELEASES[system.version]
    log_size = _log2i(nbytes >> 6)
    corr = rel.tree_correction[proto]
    if algo == "tree" and log_size < len(corr):
        bw *= corr[log_size]
    if algo == "ring" and proto == "Simple" and pl.nodes > 1 and coll == "all_reduce":
        cc = system.node.compute_capability
        if system.version == "2.7.5":
            if nbytes >= pl.ranks / 16.0 * 65536:
                lat *= 1.9
        elif system.version == "2.17.1":
            if nbytes >= pl.ranks / 16.0 * 65536:
                lat *= 1.9 if cc < 90 else 1.5
        elif nbytes / (table.channels * pl.ranks) >= 64:
            lat *= 1.9 if cc < 80 else 1.4
    return lat + nbytes / (1000.0 * bw)


def tree_correction(system: NcclSystem, proto: str, nbytes: int) -> float:
    """NCCL's tree correction factor for a message: the share of its modelled bandwidth NCCL
    says a tree reaches at medium sizes (one entry per power of two from 64 B; 1.0 beyond the
    table). Interpolated in log2(bytes) between its powers of two, so that a time divided by
    it never drops as the message grows (neighbouring entries differ by at most 1.25x)."""
    corr = RELEASES[system.version].tree_correction[proto]
    x = math.log2(max(nbytes, 64) / 64.0)
    i = int(x)
    if i >= len(corr):
        return 1.0
    nxt = corr[i + 1] if i + 1 < len(corr) else 1.0
    return corr[i] + (nxt - corr[i]) * (x - i)


def channels_threads(table: Table, pl: Placement, algo: str, proto: str, nbytes: int) -> tuple[int, int]:
    """NCCL's channel and thread count for one message: fewer channels (then fewer threads)
    until every thread has its minimum share of the bytes."""
    nc = table.channels
    nt = table.max_threads[(algo, proto)]
    if algo in ("nvls", "nvls_tree"):
        return nc, table.max_threads[(algo, proto)]
    threshold = (COLLNET_THREAD_THRESHOLD if algo.startswith("collnet") else
                 THREAD_THRESHOLD[proto] * (pl.ranks if (algo == "ring" and proto == "LL") else 1))
    while nbytes < nc * nt * threshold:
        if nc >= 2:
            nc -= 1
        elif nt % 128 == 0:
            nt //= 2
        else:
            break
    if proto == "Simple":
        nt += 32 + (96 if algo == "tree" else 0)
    return nc, max(nt, 96)


def nccl_function_bytes(coll: str, ir_bytes: int, ranks: int) -> int:
    """The byte count NCCL tunes by: the whole output for all-gather (IR bytes are the
    shard), the buffer otherwise."""
    return ir_bytes * ranks if coll == "all_gather" else ir_bytes


def candidates(system: NcclSystem, pl: Placement, coll: str) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL has enabled for ``coll`` on this group."""
    if coll in P2P_COLLECTIVES:
        return [("p2p", "LL"), ("p2p", "Simple")] if system.version != "2.7.5" else [("p2p", "Simple")]
    table = table_for(system, pl)
    return [(a, p) for (c, a, p), bw in table.bandwidth.items() if c == coll and bw > 0]


def choose(system: NcclSystem, pl: Placement, coll: str, ir_bytes: int) -> Choice:
    """What NCCL runs for ``coll`` of ``ir_bytes`` (IR convention) on the group ``pl``."""
    return _choose(system, pl, coll, int(ir_bytes))


@lru_cache(maxsize=65536)
def _choose(system: NcclSystem, pl: Placement, coll: str, ir_bytes: int) -> Choice:
    if pl.ranks < 2:
        raise EchoError("NCCL's choice needs two or more ranks")
    if coll in P2P_COLLECTIVES:
        return _p2p_choice(system, pl, coll, ir_bytes)
    if coll not in FUNCTIONS:
        raise EchoError(f"NCCL does not tune {coll!r}")
    table = table_for(system, pl)
    nbytes = nccl_function_bytes(coll, ir_bytes, pl.ranks)
    best: tuple[float, str, str] | None = None
    for algo in ALGORITHMS:                        # NCCL's loop order: the first of equal times wins
        for proto in PROTOCOLS:
            t = nccl_time(system, table, pl, coll, algo, proto, nbytes)
            if t >= 0 and (best is None or t < best[0]):
                best = (t, algo, proto)
    if best is None:
        raise EchoError(f"no algorithm/protocol available for {coll}")
    t, algo, proto = best
    nc, nt = channels_threads(table, pl, algo, proto, nbytes)
    return Choice(algo, proto, nc, nt, t)


def with_pair(system: NcclSystem, pl: Placement, coll: str, ir_bytes: int, algo: str, proto: str) -> Choice:
    """The channels and threads NCCL would give ``(algo, proto)`` if it ran that pair (what a
    tuned NCCL_ALGO/NCCL_PROTO setting gets)."""
    if coll in P2P_COLLECTIVES:
        c = _p2p_choice(system, pl, coll, ir_bytes)
        return Choice("p2p", proto, c.channels, c.threads, c.nccl_time_us)
    table = table_for(system, pl)
    nbytes = nccl_function_bytes(coll, ir_bytes, pl.ranks)
    nc, nt = channels_threads(table, pl, algo, proto, nbytes)
    return Choice(algo, proto, nc, nt, nccl_time(system, table, pl, coll, algo, proto, nbytes))


def p2p_channels(system: NcclSystem, pl: Placement) -> tuple[int, int]:
    """(channels for all send/recv, channels per peer): a power of two of the communicator's
    channels, two per peer across nodes (NCCL_NCHANNELS_PER_NET_PEER)."""
    comm = table_for(system, pl).channels if pl.ranks > 1 else 1
    total = 1 << (max(1, comm) - 1).bit_length()
    per_peer = min(total, net_channels_per_peer(system, pl, total)) if pl.nodes > 1 else total
    return total, 1 << (max(1, per_peer) - 1).bit_length()


def net_channels_per_peer(system: NcclSystem, pl: Placement, p2p_channels: int) -> int:
    """Channels per peer on another node. Before 2.28.3: NCCL_NCHANNELS_PER_NET_PEER (2).
    2.28.3 (``paths.cc``, ``ncclTopoGetNchannels``, the parameter unset): 2, halved while
    ``2 x ranks`` exceeds 4 x the p2p channels (no channel carries 8+ operations), but at
    least the NICs the GPU needs to fill its PCIe path (``getLocalNetCountByBw``; here
    ceil(GPU-NIC rate / NIC rate), at most the node's NICs per GPU)."""
    if not RELEASES[system.version].p2p_net_scaled:
        return NET_CHANNELS_PER_PEER
    c = NET_CHANNELS_PER_PEER
    while c * pl.ranks > p2p_channels * 4 and c > 1:
        c //= 2
    node = system.node
    nics_per_gpu = max(1, node.nics_per_node // max(1, pl.per_node))
    by_bw = min(nics_per_gpu, math.ceil(node.gpu_nic_bw / node.nic_bw - 1e-9))
    return max(by_bw, c)


def p2p_op_channels(system: NcclSystem, pl: Placement, op_bytes: int) -> int:
    """Channels one send (or receive) of ``op_bytes`` runs on. Every release: at least
    ``nChannelsMin`` (the channels per peer, halved until every rank of the communicator has
    its own), the rule of ``scheduleP2pTasksToPlan``. Releases that split by size (2.2x
    ``addP2pToPlan``; 2.20.3 here): parts of at least 1/8 of a step (one node; 1/2 across
    nodes), doubled up to the channels per peer while a part exceeds 32 steps (one node; one
    step across nodes); a step is NCCL_P2P_NVL_CHUNKSIZE (512 KiB) or NCCL_P2P_NET_CHUNKSIZE
    (128 KiB)."""
    total, per_peer = p2p_channels(system, pl)
    low = per_peer
    while low * pl.ranks > total and low > 1:
        low //= 2
    if not RELEASES[system.version].p2p_split or op_bytes <= 0:
        return low
    step = P2P_NET_CHUNK if pl.multi_node else P2P_NVL_CHUNK
    min_part = step // 2 if pl.multi_node else step // 8
    max_part = step if pl.multi_node else step * 32
    c = max(1, min(low, -(-op_bytes // min_part)))
    part = max(min_part, -(-op_bytes // c))
    while part > max_part and c <= per_peer // 2:
        c *= 2
        part = -(-op_bytes // c)
    return c


def _p2p_choice(system: NcclSystem, pl: Placement, coll: str, ir_bytes: int) -> Choice:
    n = pl.ranks
    per_peer_bytes = {"all_to_all": ir_bytes // max(1, n), "gather": ir_bytes,
                      "scatter": ir_bytes // max(1, n),
                      "hypercube": ir_bytes * max(1, n // 2)}.get(coll, ir_bytes)   # its largest round
    proto = "Simple"
    if RELEASES[system.version].p2p_split:        # LL while every channel carries <= 16 KiB
        channels = p2p_op_channels(system, pl, per_peer_bytes)
        proto = "LL" if per_peer_bytes <= channels * P2P_LL_THRESHOLD else "Simple"
        return Choice("p2p", proto, channels, P2P_THREADS, -1.0)
    if system.version != "2.7.5" and per_peer_bytes <= P2P_LL_THRESHOLD:
        proto = "LL"
    total, per_peer = p2p_channels(system, pl)
    peers = 1 if coll in ("send", "recv", "sendrecv", "hypercube") else max(1, n - 1)
    nmin = per_peer
    while nmin * n > total and nmin > 1:      # one channel per operation when many peers
        nmin //= 2
    channels = per_peer if peers == 1 else nmin
    # grouped send/recv run NCCL_MAX_NTHREADS (640) threads from the kernel-plan rewrite on
    # (2.12; 2.17.1's enqueue.cc; 640 in the traced SendRecv kernels of ../shared/data)
    threads = SIMPLE_MAX_THREADS if system.version == "2.7.5" else P2P_THREADS
    return Choice("p2p", proto, channels, threads, -1.0)
