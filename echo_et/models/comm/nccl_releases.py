"""Each modelled NCCL release's tuning constants, read from NCCL's sources: data, no algorithm.

:mod:`echo_et.models.comm.tuning` emulates NCCL's tuner (the graph search reduced to its result,
the cost table, the choice) from these constants; this module only states them. Adding or
checking a release is this file: its version in ``VERSIONS``, its ``Release`` in ``RELEASES``
(the flags of ``Release`` switch on rules that ``tuning`` codes), the limits below that are
per release, and its sources here. docs/comm-model.md ("What NCCL runs") tabulates the values
of all four releases, 2.17.1 (commit 5d3ab08b) included.

Facts and constants come from NVIDIA's NCCL sources (github.com/NVIDIA/nccl), read per release
and restated here, not copied:

``2.7.5`` (commit 01afd20a; its ``makefiles/version.mk`` says 2.7.5)
    ``src/graph/tuning.cc``: base latencies, per-hop latencies by link (NVLink, PCI,
    network), the LL128 per-channel limits per collective, the A100 bus bandwidth cap (235
    GB/s), the tree limits (80/110 GB/s, 105/130 GB/s for LL128 on A100), the tree
    correction factors, the LL latency factor 1.8 across nodes, the ring plateau factor
    1.9; ``src/graph/search.cc``: the speed list of the graph search and the channel
    duplication of graphs faster than 25 GB/s per channel; connect.cc: the communicator
    runs twice the searched channels.
``2.20.3`` (commit b6475625; version.mk 2.20.3)
    the same files: new base/hop latencies, per-channel limits by GPU generation and node
    count (``llMaxBws``, ``perChMaxTreeBws``, ...), the network overhead per ring step by host
    CPU (1 us Intel, 2 us AMD, x3 for Simple), ring inter-node steps 2 x nodes, the plateau
    factor 1.4 from Ampere on, NVLS (Hopper NVSwitch) and separate speed lists for Hopper.
``2.28.3`` (NVIDIA's v2.28.3-1 as mirrored in github.com/zhanglin496/nccl-2.28.3-1: ``tuning.cc``
    at 850a18f5, ``search.cc`` at 67491d6d, ``paths.cc`` at 31d0bed4; no NVIDIA/nccl commit
    of 2.21-2.29 is stored here, and it is the nearest to the 2.29.2 of the shared H100 logs,
    so logs stating 2.29.x are emulated with it): tree/Simple base latency 8.4 us, tree/Simple
    hops 4 us (NVLink, PCI) and 14 us (network); NVLS 25 us on NVLink, NVLS-tree 25 us + 2 x
    log2(nodes) x 14 us; NVLS efficiency 0.85 on Hopper, the NVLS bus rate per channel
    ``bwIntra x .85 x (c-1)/c`` x2 for all-reduce (x(ppn-1)/ppn for all-gather and
    reduce-scatter) capped by ``bwInter`` (x2 on two nodes) and for NVLS-tree by
    ``perChMaxNVLSTreeBws`` (Hopper 57.7 / 45.5 GB/s for 2 / 4+ nodes); NVLS across nodes only
    with CollNet, NVLS-tree only across nodes; PAT (all-gather, reduce-scatter, only at one GPU
    per node) at 0.75 of the tree graph's rate with ``8 + log2(nodes) x net/3.5 + 2.8 x ranks``
    us; ring LL x0.5 capped by ``llMaxBws`` (Hopper row 141 / 45 / 35), ring LL128 x0.92 at any
    GPUs per node; ring network steps 2(m-1); at one GPU per node every algorithm pays the
    tree's network latency; ``paths.cc``: channels per network peer 2, halved while 2 x ranks
    > 4 x the p2p channels, at least the NICs the GPU drives.
"""

from __future__ import annotations

from dataclasses import dataclass

# the modelled releases, oldest first: the keys of RELEASES
VERSIONS = ("2.7.5", "2.17.1", "2.20.3", "2.28.3")
# NCCL's protocols and collectives (ncclFunc_t, by their IR names) in its own order: the
# release data below is keyed by them (hop latencies per protocol, LL128 limits per collective)
PROTOCOLS = ("LL", "LL128", "Simple")
FUNCTIONS = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")


# -- the releases' constants ------------------------------------------------------------------------
@dataclass(frozen=True)
class Release:
    """One release's tuning constants and rules (facts read from its sources): the values of
    ``RELEASES``, whose fields ``tuning`` reads."""

    base_lat: dict[tuple[str, str], float]
    hw_lat: dict[tuple[str, str, str], float]          # (hw, algo, proto)
    tree_correction: dict[str, tuple[float, ...]]      # per protocol, powers of two from 64 B
    speeds_intra: tuple[float, ...]
    speeds_inter: tuple[float, ...]
    speeds_intra_sm90: tuple[float, ...] = ()
    speeds_inter_sm90: tuple[float, ...] = ()
    ll_intra_factor: float = 1.0        # LL intra-node hop latency factor across nodes
    ring_inter_steps_all_nodes: bool = True   # all-reduce ring network steps 2m (else 2(m-1))
    net_overhead: bool = False          # ring steps cost at least the proxy's post (by CPU)
    caps: str = "gen"                   # "2.7": per-collective LL128 limits; "gen": per GPU generation
    bus_cap: bool = True                # A100 (235) / H100 (370) bus bandwidth cap
    dup: str = "end"                    # when channels > 25 GB/s are duplicated: "end", "pass1"
    ring_pass2: bool = False            # pass 2 also speeds up rings
    total_stop: bool = True             # the search stops once it uses all of a GPU's bandwidth
    nvls_lat: float = 0.0               # NVLS latency (us); 0: no NVLS
    p2p_split: bool = False             # send/recv split over channels by size (addP2pToPlan, 2.2x)
    # 2.28.3 rules (0 / False: the older rule)
    ring_ll_ratio: float = 0.0          # ring LL bus bandwidth factor (0: 1/4 or 1/3 by collective)
    ring_ll128_ppn: bool = True         # ring LL128 factor 0.7 at < 2 GPUs per node (else 0.92 always)
    ll_max_hopper: tuple[float, ...] = ()   # Hopper's own LL limits on 1, 2, 4+ nodes
    ppn1_tree_net_lat: bool = False     # one GPU per node: every algorithm pays the tree's network latency
    nvls_tree: bool = False             # NVLS-tree all-reduce across Hopper NVSwitch nodes
    nvls_gather: bool = False           # NVLS all-gather / reduce-scatter inside one node
    pat: bool = False                   # PAT all-gather / reduce-scatter at one GPU per node
    p2p_net_scaled: bool = False        # channels per network peer scaled by ranks and NICs (2.28.3)


def _lat_table(values: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]]):
    out = {}
    for hw, (tree, ring) in values.items():
        for proto, t, r in zip(PROTOCOLS, tree, ring, strict=True):
            out[(hw, "tree", proto)] = t
            out[(hw, "ring", proto)] = r
    return out


_TREE_CORRECTION_22 = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7, .8, .9)}
_TREE_CORRECTION_23 = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)}
_OLD_BASE_LAT = {("tree", "LL"): 4.4, ("tree", "LL128"): 4.4, ("tree", "Simple"): 0.0,
                 ("ring", "LL"): 3.6, ("ring", "LL128"): 10.0, ("ring", "Simple"): 8.4}

RELEASES: dict[str, Release] = {
    "2.7.5": Release(
        base_lat=_OLD_BASE_LAT,
        hw_lat=_lat_table({"nvlink": ((0.52, 1.2, 28.0), (0.47, 1.9, 3.4)),
                           "pci": ((1.0, 1.9, 28.0), (1.0, 2.5, 5.7)),
                           "net": ((5.0, 8.5, 50.0), (2.7, 4.0, 9.6))}),
        tree_correction=_TREE_CORRECTION_22,
        speeds_intra=(42.0, 24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                      0.24, 0.12),
        speeds_inter=(42.0, 24.0, 21.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
                      0.24, 0.12),
        ll_intra_factor=1.8, ring_inter_steps_all_nodes=False, caps="2.7", total_stop=False,
    ),
    "2.17.1": Release(
        base_lat=_OLD_BASE_LAT,
        hw_lat=_lat_table({"nvlink": ((0.52, 1.25, 28.0), (0.47, 1.9, 3.4)),
                           "pci": ((1.0, 1.9, 28.0), (1.0, 2.5, 5.7)),
                           "net": ((5.0, 8.5, 28.0), (2.7, 4.0, 9.6))}),
        tree_correction=_TREE_CORRECTION_23,
        speeds_intra=(44.0, 30.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
        speeds_inter=(48.0, 30.0, 28.0, 24.0, 22.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
                      2.4, 1.2, 0.24, 0.12),
        speeds_intra_sm90=(66.0, 33.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0),
        speeds_inter_sm90=(48.0, 45.0, 30.0, 24.0, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
        ll_intra_factor=1.8, nvls_lat=40.0,
    ),
    "2.20.3": Release(
        base_lat={("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 0.0,
                  ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4},
        hw_lat=_lat_table({"nvlink": ((0.6, 1.25, 28.0), (0.6, 1.9, 3.4)),
                           "pci": ((1.0, 1.9, 28.0), (1.0, 2.5, 5.7)),
                           "net": ((5.0, 8.5, 28.0), (2.7, 4.0, 14.0))}),
        tree_correction=_TREE_CORRECTION_23,
        speeds_intra=(40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
        speeds_inter=(48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
                      2.4, 1.2, 0.24, 0.12),
        speeds_intra_sm90=(60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 6.0, 3.0),
        speeds_inter_sm90=(48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
                           1.2, 0.24, 0.12),
        net_overhead=True, bus_cap=False, dup="pass1", ring_pass2=True, nvls_lat=23.0, p2p_split=True,
    ),
    # nearest stored source to the 2.29.2 of ../shared/data/nccl-tests/h100-c01 (see the module doc)
    "2.28.3": Release(
        base_lat={("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 8.4,
                  ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4,
                  ("pat", "Simple"): 8.0},
        hw_lat=_lat_table({"nvlink": ((0.6, 1.25, 4.0), (0.6, 1.9, 3.4)),
                           "pci": ((1.0, 1.9, 4.0), (1.0, 2.5, 5.7)),
                           "net": ((5.0, 8.5, 14.0), (2.7, 4.0, 14.0))})
        | {("nvlink", "nvls", "Simple"): 25.0, ("nvlink", "nvls_tree", "Simple"): 25.0,
           ("net", "nvls", "Simple"): 18.0, ("net", "nvls_tree", "Simple"): 14.0,
           ("nvlink", "pat", "Simple"): 4.0, ("pci", "pat", "Simple"): 4.0, ("net", "pat", "Simple"): 14.0,
           ("nvlink", "collnet_direct", "Simple"): 3.7, ("pci", "collnet_direct", "Simple"): 3.7,
           ("net", "collnet_direct", "Simple"): 31.0, ("nvlink", "collnet_chain", "Simple"): 2.8,
           ("pci", "collnet_chain", "Simple"): 2.8, ("net", "collnet_chain", "Simple"): 30.0},
        tree_correction=_TREE_CORRECTION_23,
        speeds_intra=(40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
        speeds_inter=(48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
                      2.4, 1.2, 0.24, 0.12),
        speeds_intra_sm90=(60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
        speeds_inter_sm90=(48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
                           1.2, 0.24, 0.12),
        ring_inter_steps_all_nodes=False, net_overhead=True, bus_cap=False, dup="pass1", ring_pass2=True,
        nvls_lat=25.0, p2p_split=True, ring_ll_ratio=0.5, ring_ll128_ppn=False,
        ll_max_hopper=(141.0, 45.0, 35.0), ppn1_tree_net_lat=True, nvls_tree=True, nvls_gather=True, pat=True,
        p2p_net_scaled=True,
    ),
}
# 2.28.3: NVLS efficiency on Hopper (nvlsEfficiency) and the NVLS-tree per-channel limit
# (perChMaxNVLSTreeBws, Hopper row: 1, 2, 4+ nodes; 0 on one node, where NVLS-tree is off)
NVLS_EFFICIENCY_SM90 = 0.85
PER_CH_MAX_NVLS_TREE_SM90 = (0.0, 57.7, 45.5)
PAT_BW_FACTOR = 0.75         # 2.28.3: PAT's bus bandwidth is 3/4 of its graph's
PAT_RANK_LAT = 2.8           # 2.28.3: PAT's latency grows 2.8 us per rank
COLLNET_ARITY_LAT = 0.4      # 2.28.3: CollNet direct's serialisation per local rank (us)
COLLNET_DIRECT_MAX_LOCAL = 8  # 2.28.3 enqueue.cc: CollNet direct only up to 8 GPUs per node
COLLNET_THREAD_THRESHOLD = 512  # 2.28.3: per-thread bytes before CollNet adds channels

# The per-channel limits tuning's bus bandwidth rule caps by (public for that reason).
# LL128 per-channel limits per collective (2.7.5), in FUNCTIONS order
LL128_MAX_BW_PER_CH_275 = dict(zip(FUNCTIONS, (18.8, 12.0, 18.3, 15.2, 16.7), strict=True))
# 2.17.1 / 2.20.3 per-channel limits: [generation: Volta, Ampere, Hopper][nodes: 1, 2, 4+];
# LL: by GPU on one node, by host CPU across nodes (row 0 Intel, row 1 AMD)
GEN = {70: 0, 80: 1, 90: 2}
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
LL128_MAX_BW_PER_CH_2171 = (20.0, 20.0, 36.7)
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE = {"2.17.1": ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 33.0)),
                   "2.20.3": ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0)),
                   "2.28.3": ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))}
