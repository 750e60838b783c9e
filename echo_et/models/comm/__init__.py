"""The collective-communication (CC) cost model: how long one NCCL collective kernel runs.

``CommModel`` wraps a parameter set (a shipped preset or a calibrated profile, with the NCCL
release and node it emulates) and answers :meth:`CommModel.estimate` / :meth:`CommModel.p2p`
/ :meth:`CommModel.time_ns` with the kernel time, excluding waiting for peers
(synchronisation is the simulator's job), and the algorithm, protocol and channels NCCL
itself picks. NCCL's choice is emulated in :mod:`echo_et.models.comm.tuning` (each release's
constants in :mod:`~echo_et.models.comm.nccl_releases`), its timing in
:mod:`echo_et.models.comm.nccl`; fitting in
:mod:`~echo_et.models.comm.fit`; inputs from nccl-tests in
:mod:`~echo_et.models.comm.nccl_tests` and from traced Jobs in
:mod:`~echo_et.models.comm.trace`.

Example::

    m = CommModel.preset("a100-ib")
    m.estimate("all_reduce", 64 << 20, list(range(16)))   # Estimate(time_ns=..., "ring", "Simple", 16)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_NS
from echo_et.models.comm import nccl, nccl_graphs, tuning
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.profile import Profile, load_preset, load_profile
from echo_et.models.comm.profile import preset_names as _preset_names
from echo_et.models.comm.profile import rated_net_gbps as profile_rated_net_gbps
from echo_et.models.comm.topology import Placement, from_nodes, placement
from echo_et.models.gpu_variants import comm_preset

__all__ = ["COLLECTIVES", "CommModel", "Estimate", "NcclSystem"]

COLLECTIVES = nccl.COLLECTIVES


@dataclass(frozen=True)
class Estimate:
    time_ns: int          # kernel execution time, excluding waiting for peers
    algorithm: str        # "ring", "tree", "nvls", "nvls_tree", "pat", "p2p", "local" (one rank), "none" (0 bytes)
    protocol: str         # "LL", "LL128", "Simple" ("none" for 0 bytes)
    channels: int = 0     # channels (thread blocks) NCCL runs it on; 0 for none/local


class CommModel:
    """A parameter set plus the NCCL cost model. Immutable: what-ifs make new models."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self._cache: dict[tuple[str, int, Placement, str], Estimate] = {}

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_profile(cls, path: str | Path) -> CommModel:
        return cls(load_profile(path))

    load = from_profile

    @classmethod
    def preset(cls, name: str) -> CommModel:
        return cls(load_preset(name))

    @staticmethod
    def preset_names() -> list[str]:
        return _preset_names()

    @classmethod
    def preset_for_gpu(cls, gpu_name: str) -> CommModel:
        """The preset of the node type of GPU ``gpu_name`` (e.g. "NVIDIA A100-SXM4-40GB" ->
        a100-ib), matched exactly by variant (:mod:`echo_et.models.gpu_variants`): a PCIe
        board is refused, not priced as an SXM node."""
        if not (gpu_name or "").strip():
            raise EchoError(f"no GPU named, so no collective preset to choose (presets: "
                            f"{', '.join(_preset_names())}); name the GPU, give a calibrated profile or name a preset")
        return cls(load_preset(comm_preset(gpu_name, _preset_names())))

    def with_overrides(self, *, gpus_per_node: int | None = None, intra_bw_gbps: float | None = None,
                       inter_bw_gbps: float | None = None, intra_latency_us: float | None = None,
                       inter_latency_us: float | None = None) -> CommModel:
        """A what-if copy. ``intra_bw_gbps`` replaces the per-GPU NVLink bandwidth (NVLS
        scales with NVLink). ``inter_bw_gbps`` is the per-GPU network bandwidth the NICs are
        rated for (``--inter-bw``, e.g. 800 Gb/s per node of 8 is 12.5): the copy keeps the
        profile's network efficiency, what its ``net_gbps`` reaches of the rate its node's
        NICs are rated for (:meth:`network_efficiency`; a profile calibrated across nodes
        measured it, a preset states NCCL's typical one), so its ``net_gbps`` is that
        fraction of the given rate. A latency replaces the LL per-hop latency of that link
        and scales the LL128 and Simple hop latencies by the same factor."""
        P = dict(self.profile.params)
        gpn = self.profile.gpus_per_node
        rated = self.profile.rated_net_gbps
        if gpus_per_node is not None:
            gpn = _positive_int(gpus_per_node, "gpus_per_node")
        if intra_bw_gbps is not None:
            v = _positive(intra_bw_gbps, "intra_bw_gbps")
            P["nvls_gbps"] *= v / P["nvlink_gbps"]
            P["nvlink_gbps"] = v
        if inter_bw_gbps is not None:
            rated = _positive(inter_bw_gbps, "inter_bw_gbps")
            P["net_gbps"] = rated * self.network_efficiency
        for value, family, label in ((intra_latency_us, "nvlink_hop_us", "intra_latency_us"),
                                     (inter_latency_us, "net_hop_us", "inter_latency_us")):
            if value is not None:
                scale = _positive(value, label) / P[f"{family}.LL"]
                for proto in ("LL", "LL128", "Simple"):
                    P[f"{family}.{proto}"] *= scale
        return CommModel(dataclasses.replace(self.profile, params=P, gpus_per_node=gpn, rated_net_gbps=rated))

    def with_nccl_version(self, version: str) -> CommModel:
        """A copy that chooses as NCCL ``version`` would (one of ``nccl_releases.VERSIONS``)."""
        return CommModel(dataclasses.replace(self.profile, nccl=self.profile.nccl.with_version(version)))

    def with_max_channels(self, max_channels: int) -> CommModel:
        """A copy whose communicators run at most ``max_channels`` channels, as with
        NCCL_MAX_NCHANNELS (or ncclConfig_t.maxCTAs): channel counts change, choices do not."""
        return CommModel(dataclasses.replace(self.profile, nccl=self.profile.nccl.with_max_channels(max_channels)))

    # -- properties ---------------------------------------------------------------------------
    @property
    def calibrated(self) -> bool:
        return self.profile.calibrated

    @property
    def gpus_per_node(self) -> int:
        return self.profile.gpus_per_node

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def params(self) -> dict[str, float]:
        return dict(self.profile.params)

    @property
    def rated_net_gbps(self) -> float:
        """GB/s per GPU of network the NICs are rated for (see :meth:`with_overrides`)."""
        return profile_rated_net_gbps(self.profile)

    @property
    def network_efficiency(self) -> float:
        """The per-GPU network rate the model runs at (``net_gbps``) over the rate the NICs
        are rated for: 0.65 measured on the 4-node A100 nccl-tests logs of ../shared/data
        (8 x 200 Gb/s HDR per node, NCCL 2.7.5), which the ``a100-ib`` preset carries
        (``benchmarks/comm_preset_network.py``); 0.82 on the 80-GPU H100 log (``h100-ib``)."""
        return self.profile.params["net_gbps"] / self.rated_net_gbps

    @property
    def nccl_version(self) -> str:
        return self.profile.nccl.version

    @property
    def nccl(self) -> NcclSystem:
        return self.profile.nccl

    # -- estimates ------------------------------------------------------------------------------
    def estimate(self, coll: str, nbytes: int, ranks: Sequence[int], *, dtype: str = "float32",
                 gpus_per_node: int | None = None, choice: str = "nccl") -> Estimate:
        """Kernel time of collective ``coll`` on the group of global ``ranks``; ``nbytes`` is
        the per-rank input (all-gather: the shard; reduce-scatter: the full buffer; gather:
        one piece; scatter: the root's whole buffer). ``dtype`` does not change the time
        (reduction throughput is per byte). send/recv take ``ranks=[src, dst]``.

        ``choice="nccl"`` (default) times what NCCL's tuner runs; ``"fastest"`` the
        algorithm/protocol this model rates fastest among those NCCL has enabled."""
        if coll not in COLLECTIVES:
            raise EchoError(f"unknown collective {coll!r} (known: {', '.join(COLLECTIVES)})")
        if choice not in nccl.CHOICE_MODES:
            raise EchoError(f"unknown choice {choice!r} (known: {', '.join(nccl.CHOICE_MODES)})")
        nbytes = _bytes(nbytes)
        gpn = self.gpus_per_node if gpus_per_node is None else _positive_int(gpus_per_node, "gpus_per_node")
        if coll in ("send", "recv"):
            if len(ranks) != 2:
                raise EchoError(f"{coll}: ranks must be [src, dst], got {len(ranks)} rank(s)")
            return self.p2p(nbytes, ranks[0], ranks[1], gpus_per_node=gpn)
        pl = placement(ranks, gpn, where=coll)
        if nbytes == 0 and coll != "barrier":
            return Estimate(0, "none", "none")
        key = (coll, nbytes, pl, choice)
        got = self._cache.get(key)
        if got is None:
            t, picks = nccl.choose(self.profile.params, coll, np.float64(nbytes), pl, self.profile.nccl, choice)
            c = picks[0]
            got = Estimate(_ns(t), c.algorithm, c.protocol, c.channels)
            self._cache[key] = got
        return got

    def time_ns(self, coll: str, nbytes: int, group_size: int, *, gpus_per_node: int | None = None,
                choice: str = "nccl") -> int:
        """Kernel time (ns) of ``coll`` on a group of ``group_size`` ranks packed onto nodes of
        ``gpus_per_node`` (ranks 0..N-1; send/recv: rank 0 to rank N-1). The stable entry
        point for tools that only know a group's shape (e.g. deriving network parameters)."""
        n = _positive_int(group_size, "group_size")
        if coll in ("send", "recv"):
            if n < 2:
                raise EchoError(f"{coll} needs a group of two or more ranks")
            return self.estimate(coll, nbytes, [0, n - 1], gpus_per_node=gpus_per_node).time_ns
        return self.estimate(coll, nbytes, list(range(n)), gpus_per_node=gpus_per_node, choice=choice).time_ns

    def p2p(self, nbytes: int, src: int, dst: int, *, gpus_per_node: int | None = None) -> Estimate:
        """Kernel time of one send/recv of ``nbytes`` from global rank ``src`` to ``dst``."""
        nbytes = _bytes(nbytes)
        gpn = self.gpus_per_node if gpus_per_node is None else _positive_int(gpus_per_node, "gpus_per_node")
        placement([src], gpn, where="p2p src")
        placement([dst], gpn, where="p2p dst")
        if nbytes == 0:
            return Estimate(0, "none", "none")
        P = self.profile.params
        S = np.float64(nbytes)
        if src == dst:
            return Estimate(_ns(P["local_setup_us"] + nbytes / P["local_copy_gbps"] * 1e-3), "local", "Simple", 1)
        same_node = src // gpn == dst // gpn
        pair = from_nodes([0, 0] if same_node else [0, 1])
        c = tuning.choose(self.profile.nccl, pair, "send", nbytes)
        ch = nccl.Channels(float(c.channels), nccl_graphs.MAX_CHANNELS)
        t = nccl.p2p_costs(P, S, same_node, {("p2p", c.protocol): ch})[("p2p", c.protocol)]
        return Estimate(_ns(t), c.algorithm, c.protocol, c.channels)

    def estimate_sizes(self, coll: str, sizes: Sequence[int], pl: Placement, choice: str = "nccl"
                       ) -> tuple[np.ndarray, list[tuning.Choice]]:
        """Kernel times (us) and choices for many sizes on one placement (tables, fits)."""
        if coll not in COLLECTIVES or coll in ("send", "recv"):
            raise EchoError(f"unknown collective {coll!r}")
        return nccl.choose(self.profile.params, coll, np.array([float(_bytes(s)) for s in sizes]), pl,
                           self.profile.nccl, choice)


def _ns(us: float) -> int:
    """A model time in ns; one beyond what the IR holds (a terabyte at a bit per second) is
    an error naming the bound, not an OverflowError later."""
    ns = float(us) * 1000.0
    if not ns <= MAX_NS:
        raise EchoError(f"a modelled communication time of {ns:.3g} ns exceeds {MAX_NS} ns (146 years): "
                        "the bandwidths are too low for these sizes")
    return int(round(ns))


def _bytes(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise EchoError(f"bytes must be an integer, got {n!r}")
    if n < 0:
        raise EchoError(f"bytes must be >= 0, got {n}")
    return int(n)


def _positive(v: float, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or v == float("inf"):
        raise EchoError(f"{what} must be a positive number, got {v!r}")
    return float(v)


def _positive_int(v: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise EchoError(f"{what} must be an integer >= 1, got {v!r}")
    return int(v)
