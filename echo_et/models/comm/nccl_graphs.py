"""What NCCL sees of a node, and the graphs its topology search finds there.

:mod:`echo_et.models.comm.tuning` builds NCCL's cost table from these graphs; this module
holds what that table depends on besides the release's constants
(:mod:`echo_et.models.comm.nccl_releases`): the node facts NCCL's topology detection reads
(:class:`NodeFacts`, with a release and a channel cap: :class:`NcclSystem`, which collective
profiles store), and the graph search reduced to its result (:func:`search_graphs` for rings
and trees, :func:`nvls_graph`, :func:`collnet_graph`).

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

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_BANDWIDTH_GBPS, checked_float, checked_int
from echo_et.models.comm.nccl_releases import COLLNET_DIRECT_MAX_LOCAL, RELEASES, VERSIONS
from echo_et.models.comm.topology import Placement

# path types NCCL orders GPU-GPU and GPU-NIC paths by (closest first)
PATH_TYPES = ("LOC", "NVL", "NVB", "PIX", "PXB", "PXN", "PHB", "SYS")
MAX_CHANNELS = 32                 # NCCL's MAXCHANNELS


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


def first_at_most(speeds: tuple[float, ...], limit: float) -> int:
    """The index of the fastest speed of a release's list that ``limit`` can carry (the
    slowest when none fits): where NCCL's search starts."""
    i = 0
    while i < len(speeds) - 1 and speeds[i] > limit + 1e-9:
        i += 1
    return i


def _search(speeds: tuple[float, ...], limit: float, fit, max_channels: int, total: float | None
            ) -> tuple[int, float]:
    """Pass 1 of NCCL's search: from the fastest speed the path can carry, try slower speeds
    (while they are more than .49 of the best so far) and keep strictly more total bandwidth;
    stop once a GPU's whole bandwidth is used (``total``, releases that check it)."""
    i = first_at_most(speeds, limit)
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
        i = first_at_most(speeds, s_inter)
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
    intra = rel.speeds_intra_sm90[first_at_most(rel.speeds_intra_sm90, node.intra_bw / (k - 1))]
    if pl.nodes == 1:
        return Graph(channels, intra, intra, "NVL", node.gpu_nic_path, False)
    nic = min(node.nic_bw, node.gpu_nic_bw)
    inter = rel.speeds_inter_sm90[first_at_most(rel.speeds_inter_sm90, nic)]
    return Graph(channels, min(intra, inter), inter, "NVL", node.gpu_nic_path, False)


def collnet_graph(system: NcclSystem, pl: Placement) -> Graph:
    """The CollNet graphs (2.28.3 ``search.cc``): at most ``NCCL_MAX_DIRECT_ARITY + 1`` (8)
    heads, one per GPU of the node, at the fastest network speed of the GPU-NIC path. A
    reduction of the search to its result for nodes with one NIC per GPU."""
    node, rel = system.node, RELEASES[system.version]
    speeds = rel.speeds_inter_sm90 if node.compute_capability >= 90 and rel.speeds_inter_sm90 else rel.speeds_inter
    s = speeds[first_at_most(speeds, min(node.nic_bw, node.gpu_nic_bw))]
    channels = max(1, min(pl.per_node, COLLNET_DIRECT_MAX_LOCAL, node.nics_per_node))
    return Graph(channels, s, s, "NVL" if node.intra != "pcie" else "PHB", node.gpu_nic_path, False)
