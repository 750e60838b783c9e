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
graph search reduced to its result, the cost table and the choice.

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

The graph search itself (which rings and trees NCCL finds in a node) is reduced to its result
for the node layouts the presets describe: GPUs behind an NVSwitch (or a PCIe switch) with one
NIC per GPU or per pair of GPUs. The search takes the fastest per-channel speed of the
release's speed list that the GPU-NIC path (across nodes) or the GPU's NVLinks (inside a node)
can carry, as many channels of it as the links allow, keeps a slower speed only when it gives
more total bandwidth, and duplicates channels faster than 25 GB/s (halving their speed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_BANDWIDTH_GBPS, checked_float, checked_int
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
    VERSIONS,
)
from echo_et.models.comm.topology import Placement

# NCCL's algorithms in its own order (NCCL_ALGO_*)
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
# the IR collectives NCCL runs as grouped send/recv (its p2p path), not from the cost table
P2P_COLLECTIVES = ("all_to_all", "gather", "scatter", "send", "recv", "sendrecv", "hypercube")

# path types NCCL orders GPU-GPU and GPU-NIC paths by (closest first)
PATH_TYPES = ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")

LL_MAX_THREADS, LL128_MAX_THREADS, SIMPLE_MAX_THREADS = 512, 640, 512
P2P_THREADS = 640                 # NCCL_MAX_NTHREADS
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
MAX_CHANNELS = 32
P2P_LL_THRESHOLD = 16384          # 2.20.3: send/recv of at most this many bytes use LL
NET_CHANNELS_PER_PEER = 2         # NCCL_NCHANNELS_PER_NET_PEER default
P2P_NVL_CHUNK = 512 << 10         # NCCL_P2P_NVL_CHUNKSIZE default: a send/recv step over NVLink
P2P_NET_CHUNK = 128 << 10         # NCCL_P2P_NET_CHUNKSIZE default: a send/recv step across nodes


@dataclass(frozen=True)
class NodeFacts:
    """What NCCL's topology detection sees in one node."""

    compute_capability: int = 80      # 70 Volta, 80 Ampere, 90 Hopper
    cpu_vendor: str = "AMD"           # "AMD", "Intel" or "other" (2.20.3 tunes LL and ring steps by it)
    intra: str = "nvswitch"           # "nvswitch", "nvlink" (direct links) or "pcie"
    intra_bw: float = 240.0           # GB/s one GPU moves to its peers (NVLinks x NCCL's per-link rate)
    nics_per_node: int = 8
    nic_bw: float = 25.0              # GB/s of one NIC as NCCL rates it (link Gb/s / 8)
    gpu_nic_bw: float = 24.0          # GB/s of the GPU-NIC PCIe path (NCCL: Gen4 x16 = 24)
    gpu_nic_path: str = "PIX"         # path type GPU -> nearest NIC
    nvls: bool = False                # NVSwitch with NVLink SHARP (Hopper)
    collnet: bool = False             # SHARP network switches, NCCL's CollNet plugin and NCCL_COLLNET_ENABLE=1

    def check(self, where: str) -> NodeFacts:
        for name, kind in (("compute_capability", int), ("nics_per_node", int), ("intra_bw", float),
                           ("nic_bw", float), ("gpu_nic_bw", float), ("cpu_vendor", str), ("intra", str),
                           ("gpu_nic_path", str), ("nvls", bool), ("collnet", bool)):
            value = getattr(self, name)
            ok = isinstance(value, bool) if kind is bool else (
                isinstance(value, str) if kind is str else
                not isinstance(value, bool) and isinstance(value, int if kind is int else int | float))
            if not ok:
                raise EchoError(f"{where}: NCCL node fact {name} = {str(value)[:40]} is not "
                                f"{'true or false' if kind is bool else 'a string' if kind is str else 'a number'}")
        for name in ("intra_bw", "nic_bw", "gpu_nic_bw"):
            checked_float(getattr(self, name), f"NCCL node fact {name}", lo=0.0, lo_open=True,
                          hi=MAX_BANDWIDTH_GBPS, where=where)
        checked_int(self.compute_capability, "NCCL node fact compute_capability", lo=60, hi=1000, where=where)
        checked_int(self.nics_per_node, "NCCL node fact nics_per_node", lo=1, hi=1024, where=where)
        if self.cpu_vendor not in ("AMD", "Intel", "other"):
            raise EchoError(f"{where}: cpu_vendor must be AMD, Intel or other, got {self.cpu_vendor!r}")
        if self.intra not in ("nvswitch", "nvlink", "pcie"):
            raise EchoError(f"{where}: intra must be nvswitch, nvlink or pcie, got {self.intra!r}")
        if self.gpu_nic_path not in PATH_TYPES[3:]:
            raise EchoError(f"{where}: gpu_nic_path must be one of {', '.join(PATH_TYPES[3:])}")
        for name in ("intra_bw", "nic_bw", "gpu_nic_bw"):
            if not getattr(self, name) > 0:
                raise EchoError(f"{where}: {name} must be > 0")
        if self.nics_per_node < 1 or self.compute_capability < 60:
            raise EchoError(f"{where}: nics_per_node must be >= 1 and compute_capability >= 60")
        return self


@dataclass(frozen=True)
class NcclSystem:
    """A release of NCCL on a kind of node: everything NCCL's choice depends on besides the
    group and the message."""

    version: str = "2.7.5"
    node: NodeFacts = field(default_factory=NodeFacts)
    # NCCL_MAX_NCHANNELS (or ncclConfig_t.maxCTAs): caps the channels of a communicator, not
    # the searched graphs its cost table is built from, so it changes channel counts, never
    # the algorithm/protocol choice
    max_channels: int = MAX_CHANNELS

    def __post_init__(self):
        if self.version not in VERSIONS:
            raise EchoError(f"unknown NCCL version {self.version!r} (modelled: {', '.join(VERSIONS)})")
        if type(self.max_channels) is not int or not 1 <= self.max_channels <= MAX_CHANNELS:
            raise EchoError(f"NCCL max channels must be an integer from 1 to {MAX_CHANNELS}, "
                            f"got {self.max_channels!r}")

    def to_json(self) -> dict:
        n = self.node
        out = {"version": self.version, "node": {
            "compute_capability": n.compute_capability, "cpu_vendor": n.cpu_vendor, "intra": n.intra,
            "intra_bw": n.intra_bw, "nics_per_node": n.nics_per_node, "nic_bw": n.nic_bw,
            "gpu_nic_bw": n.gpu_nic_bw, "gpu_nic_path": n.gpu_nic_path, "nvls": n.nvls}}
        if n.collnet:                               # written only when set (older profiles' bytes)
            out["node"]["collnet"] = True
        if self.max_channels != MAX_CHANNELS:      # NCCL's default is not written (older profiles' bytes)
            out["max_channels"] = self.max_channels
        return out

    @classmethod
    def from_json(cls, obj: object, where: str) -> NcclSystem:
        if not isinstance(obj, dict):
            raise EchoError(f"{where}: 'nccl' must be an object")
        node = obj.get("node", {})
        if not isinstance(node, dict):
            raise EchoError(f"{where}: 'nccl.node' must be an object")
        known = set(NodeFacts.__dataclass_fields__)
        unknown = sorted(set(node) - known)
        if unknown:
            raise EchoError(f"{where}: unknown NCCL node fact(s) {', '.join(unknown)}")
        try:
            facts = NodeFacts(**node).check(where)
        except TypeError as e:
            raise EchoError(f"{where}: bad NCCL node facts ({e})") from None
        unknown = sorted(set(obj) - {"version", "node", "max_channels"})
        if unknown:
            raise EchoError(f"{where}: unknown 'nccl' key(s) {', '.join(unknown)}")
        return cls(version=str(obj.get("version", "")), node=facts,
                   max_channels=checked_int(obj.get("max_channels", MAX_CHANNELS), "nccl.max_channels", lo=1,
                                            hi=MAX_CHANNELS, where=where))

    def with_version(self, version: str) -> NcclSystem:
        return dataclasses.replace(self, version=version)

    def with_max_channels(self, max_channels: int) -> NcclSystem:
        return dataclasses.replace(self, max_channels=max_channels)


@dataclass(frozen=True)
class Graph:
    """The result of NCCL's search for one algorithm: channels and per-channel GB/s."""

    channels: int
    bw_intra: float
    bw_inter: float
    type_intra: str
    type_inter: str
    same_channels: bool


@dataclass(frozen=True)
class Choice:
    algorithm: str        # "ring", "tree", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat", "p2p"
    protocol: str         # "LL", "LL128", "Simple"
    channels: int         # channels (thread blocks) the kernel runs on for this message
    threads: int          # threads per channel
    nccl_time_us: float   # NCCL's own estimate of the time (its cost table, not ours)


# -- the graph search, reduced to its result ------------------------------------------------------------
def _first_at_most(speeds: tuple[float, ...], limit: float) -> int:
    i = 0
    while i < len(speeds) - 1 and speeds[i] > limit + 1e-9:
        i += 1
    return i


def _search(speeds: tuple[float, ...], limit: float, fit, max_channels: int, total: float | None
            ) -> tuple[int, float]:
    """Pass 1 of NCCL's search: from the fastest speed the path can carry, try slower speeds
    (while they are more than .49 of the best so far) and keep strictly more total bandwidth;
    stop once a GPU's whole bandwidth is used (``total``, releases that check it)."""
    i = _first_at_most(speeds, limit)
    best_n, best_s = 0, 0.0
    while True:
        s = speeds[i]
        n = min(max_channels, fit(s))
        if n >= 1 and n * s > best_n * best_s + 1e-9:
            best_n, best_s = n, s
            if total is not None and n * s >= total - 1e-9:
                break
        if i + 1 >= len(speeds) or (best_n and speeds[i + 1] / best_s <= 0.49):
            break
        i += 1
    if best_n == 0:       # NCCL falls back to one channel of 0.1 GB/s ("simple order")
        return 1, 0.1
    return best_n, best_s


def _dup(version: str, cc: int, n: int, bw_intra: float, max_channels: int) -> int:
    """Channels after NCCL duplicates a fast graph (its speeds are divided by the factor)."""
    if version == "2.7.5":
        dup = bw_intra >= 25.0
    elif version == "2.17.1":
        dup = (cc <= 80 and bw_intra >= 25.0) or (cc <= 90 and bw_intra >= 50.0)
    else:
        dup = bw_intra >= 25.0 and not (cc > 80 and bw_intra < 50.0 and n > 4)
    return min(2 * n, max_channels) if dup else n


def search_graphs(system: NcclSystem, pl: Placement) -> dict[str, Graph]:
    """The ring and tree graphs NCCL's search would find for this group (per node: ``k``
    GPUs of the group, all of the node's NICs)."""
    node, version = system.node, system.version
    rel = RELEASES[version]
    k, m = pl.per_node, pl.nodes
    cc = node.compute_capability
    sm90 = bool(rel.speeds_intra_sm90) and cc >= 90
    type_intra = "NVL" if node.intra in ("nvswitch", "nvlink") else "PHB"
    type_inter = node.gpu_nic_path
    eps = 1e-6

    if m == 1:
        speeds = rel.speeds_intra_sm90 if sm90 else rel.speeds_intra
        per_gpu = node.intra_bw

        def fit(s: float) -> int:
            return int(per_gpu / s + eps) if k > 1 else MAX_CHANNELS

        limit = per_gpu if k > 1 else 5000.0
    else:
        speeds = rel.speeds_inter_sm90 if sm90 else rel.speeds_inter
        nic_path = min(node.nic_bw, node.gpu_nic_bw)
        nics = min(node.nics_per_node, k)

        def fit(s: float) -> int:
            # a channel enters the node at one GPU (from its NIC) and leaves at another (to
            # its NIC, over PCIe): each GPU's NVLink carries k-1 of every k channels' hops
            per_nic = int(nic_path / s + eps)
            return min(nics * per_nic, int(node.intra_bw * k / ((k - 1) * s) + eps) if k > 1 else MAX_CHANNELS)

        limit = nic_path
    total = node.intra_bw if rel.total_stop and m == 1 and k > 1 else None

    def graph(max_channels: int, tree: bool) -> tuple[int, float, float]:
        tot = None if total is None else (total * k / (k - 1) if tree and version == "2.20.3" else total)
        n, s = _search(speeds, limit, fit, max_channels, tot)
        s_intra = s_inter = s
        if rel.dup == "pass1":
            d = _dup(version, cc, n, s, max_channels)
            if d > n:
                s_intra = s_inter = s / math.ceil(d / n)
                n = d
        # pass 2: faster rings (2.20.3) / a faster intra-node part for trees
        i = _first_at_most(speeds, s_inter)
        if tree:
            while i > 0 and s_intra < 2 * s_inter and speeds[i - 1] * n <= node.intra_bw + eps and m > 1:
                i -= 1
                s_intra = speeds[i]
        elif rel.ring_pass2:
            while i > 0 and fit(speeds[i - 1]) >= n and speeds[i - 1] <= limit + eps:
                i -= 1
                s_intra = s_inter = speeds[i]
        if rel.dup == "end":
            d = _dup(version, cc, n, s_intra, max_channels)
            if d > n:
                f = math.ceil(d / n)
                s_intra, s_inter, n = s_intra / f, s_inter / f, d
        return n, s_intra, s_inter

    ring_n, ring_intra, ring_inter = graph(MAX_CHANNELS // 2, tree=False)
    tree_n, tree_intra, tree_inter = graph(ring_n, tree=True)
    same = m == 1
    return {
        "ring": Graph(ring_n, ring_intra, ring_inter, type_intra, type_inter, same),
        "tree": Graph(tree_n, tree_intra, tree_inter, type_intra, type_inter, same),
    }


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
                s = speeds[_first_at_most(speeds, node.intra_bw / n)]
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


def nvls_graph(system: NcclSystem, pl: Placement) -> Graph | None:
    """The NVLS graph (2.28.3 ``search.cc``): one channel per GPU of the node (at most
    ``NCCL_MAX_NVLS_ARITY``), at least two; inside one node at the fastest Hopper speed whose
    ``k`` channels fit in a GPU's NVLinks x k/(k-1) (the search's start for non-ring patterns),
    across nodes at the fastest network speed of the GPU-NIC path (pass 2 raises only the
    network speed). None where the node has no NVLink SHARP. A reduction of the search to
    its result for NVSwitch nodes, not the search itself."""
    node, rel = system.node, RELEASES[system.version]
    k = pl.per_node
    if not (node.nvls and node.compute_capability >= 90 and node.intra == "nvswitch" and k >= 2):
        return None
    channels = min(k, 32)
    # the search's first check: speed x channels within a GPU's NVLinks x k/(k-1) (not a ring)
    intra = rel.speeds_intra_sm90[_first_at_most(rel.speeds_intra_sm90, node.intra_bw / (k - 1))]
    if pl.nodes == 1:
        return Graph(channels, intra, intra, "NVL", node.gpu_nic_path, False)
    nic = min(node.nic_bw, node.gpu_nic_bw)
    inter = rel.speeds_inter_sm90[_first_at_most(rel.speeds_inter_sm90, nic)]
    return Graph(channels, min(intra, inter), inter, "NVL", node.gpu_nic_path, False)


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


def collnet_graph(system: NcclSystem, pl: Placement) -> Graph:
    """The CollNet graphs (2.28.3 ``search.cc``): at most ``NCCL_MAX_DIRECT_ARITY + 1`` (8)
    heads, one per GPU of the node, at the fastest network speed of the GPU-NIC path. A
    reduction of the search to its result for nodes with one NIC per GPU."""
    node, rel = system.node, RELEASES[system.version]
    speeds = rel.speeds_inter_sm90 if node.compute_capability >= 90 and rel.speeds_inter_sm90 else rel.speeds_inter
    s = speeds[_first_at_most(speeds, min(node.nic_bw, node.gpu_nic_bw))]
    channels = max(1, min(pl.per_node, COLLNET_DIRECT_MAX_LOCAL, node.nics_per_node))
    return Graph(channels, s, s, "NVL" if node.intra != "pcie" else "PHB", node.gpu_nic_path, False)


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
