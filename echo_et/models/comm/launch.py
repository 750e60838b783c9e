"""NCCL's emulated choice checked against the kernels a trace recorded.

An NCCL collective kernel's launch configuration *is* the choice NCCL made for that call: one
thread block per channel, and a block size the protocol fixes (LL: 512 threads, halved for
small messages once one channel is left; LL128: 640; Simple: 512 plus a sync warp, 544, and
three more warps on the tree, 640; never fewer than 96). The Kineto converter keeps it on
the collective node (``launch_blocks``, ``launch_threads``); :func:`check` compares it with
what :mod:`~echo_et.models.comm.tuning` emulates for the same collective, message and group,
so a user sees which NCCL release (and channel cap) explains their trace and where the
emulation departs from it. Only the collectives NCCL tunes are compared: all-to-all, gather
and scatter run as grouped send/recv kernels whose block count is the union of the channels
of every peer's operations (NCCL's per-round channel spreading, not modelled).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from echo_et.ir.collectives import is_nccl_kernel, kernel_collective
from echo_et.ir.conventions import LAUNCH_BLOCKS_ATTR, LAUNCH_THREADS_ATTR, NCCL_VERSION_ATTR
from echo_et.ir.job import Job
from echo_et.ir.schema import collective_name, pb
from echo_et.models.comm import nccl_graphs, nccl_releases, tuning
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.topology import Placement, placement
from echo_et.models.comm.tuning import Choice


@dataclass(frozen=True)
class Launch:
    """One distinct traced launch: a collective of ``ir_bytes`` on the group of global
    ``ranks`` ran on ``blocks`` thread blocks of ``threads`` threads (``calls`` times)."""

    collective: str
    ir_bytes: int
    ranks: tuple[int, ...]
    blocks: int
    threads: int
    calls: int = 1


@dataclass(frozen=True)
class LaunchCheck:
    launch: Launch
    placement: Placement
    emulated: Choice

    @property
    def channels_match(self) -> bool:
        return self.emulated.channels == self.launch.blocks

    @property
    def threads_match(self) -> bool:
        return self.emulated.threads == self.launch.threads

    @property
    def match(self) -> bool:
        return self.channels_match and self.threads_match


def _int_attr(node: pb.Node, key: str) -> int | None:
    text = node.attrs.get(key, "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def job_launches(job: Job) -> tuple[list[Launch], Counter[str]]:
    """The distinct launches of the collectives NCCL tunes in ``job`` (one per collective,
    bytes, group and launch configuration, with the number of traced calls; a graph bound to
    several ranks counts once), and why the other collective nodes were left out."""
    seen: Counter[tuple[str, int, tuple[int, ...], int, int]] = Counter()
    skipped: Counter[str] = Counter()
    for graph_id, ranks in job.ranks_of_graph().items():
        for node in job.graph(graph_id):
            if node.kind != pb.KIND_COLLECTIVE:
                continue
            coll = collective_name(node.collective.type)
            blocks, threads = _int_attr(node, LAUNCH_BLOCKS_ATTR), _int_attr(node, LAUNCH_THREADS_ATTR)
            if blocks is None or threads is None:
                skipped["no_launch_configuration"] += 1
                continue
            if coll not in nccl_releases.FUNCTIONS:
                skipped["grouped_point_to_point"] += 1
                continue
            if is_nccl_kernel(node.name) and kernel_collective(node.name) != node.collective.type:
                skipped["kernel_of_another_collective"] += 1   # e.g. run as SendRecv kernels
                continue
            if node.collective.in_bytes == 0:
                skipped["bytes_unknown_or_zero"] += 1
                continue
            # a graph bound to several ranks is one rank's trace (the others are copies): once
            group = tuple(job.resolve_group(ranks[0], node.collective.group).ranks)
            if len(group) < 2:
                skipped["one_rank_group"] += 1
                continue
            seen[(coll, int(node.collective.in_bytes), group, blocks, threads)] += 1
    launches = [Launch(c, b, g, bl, th, n) for (c, b, g, bl, th), n in sorted(seen.items())]
    return launches, skipped


def stated_version(job: Job) -> str:
    """The NCCL release the trace states ("" when it does not): preferred among equally good
    emulations."""
    return job.manifest.attrs.get(NCCL_VERSION_ATTR, "")


def check(launches: Iterable[Launch], system: NcclSystem, gpus_per_node: int) -> list[LaunchCheck]:
    """Each launch next to the choice ``system`` emulates for it (node of rank r = r // G)."""
    out = []
    for launch in launches:
        pl = placement(list(launch.ranks), gpus_per_node, where=f"{launch.collective} group")
        out.append(LaunchCheck(launch, pl, tuning.choose(system, pl, launch.collective, launch.ir_bytes)))
    return out


def agreement(checks: Iterable[LaunchCheck]) -> dict[str, int]:
    """Calls (not distinct launches) whose channels, threads and both match."""
    total = channels = threads = both = 0
    for c in checks:
        n = c.launch.calls
        total += n
        channels += n * c.channels_match
        threads += n * c.threads_match
        both += n * c.match
    return {"calls": total, "channels_match": channels, "threads_match": threads, "match": both}


def _rank(agree: dict[str, int], version: str, prefer: list[str]) -> tuple:
    """Most matching calls, then most matching thread counts (protocols), then the earliest
    release of ``prefer`` (the one the trace states, the model's)."""
    return (agree["match"], agree["threads_match"], -(prefer.index(version) if version in prefer else len(prefer)))


def closest_version(agreements: dict[str, dict[str, int]], prefer: Iterable[str] = ()) -> str:
    """The release whose emulation explains the traced calls best (see ``_rank``); ties that
    remain go to the first release listed."""
    order = list(agreements)
    prefer = list(prefer)
    return max(order, key=lambda v: (*_rank(agreements[v], v, prefer), -order.index(v)))


def closest_system(launches: list[Launch], base: NcclSystem, gpus_per_node: int,
                   versions: Iterable[str] = nccl_releases.VERSIONS, prefer: Iterable[str] = ()
                   ) -> tuple[NcclSystem, dict[str, int]]:
    """The release and channel cap whose emulation matches the traced calls best, searched
    over ``versions`` and the caps the traced block counts suggest; ranked as
    :func:`closest_version`, then the larger cap (no cap before a cap)."""
    versions, prefer = list(versions), list(prefer)
    cap = nccl_graphs.MAX_CHANNELS
    caps = sorted({cap, base.max_channels} | {min(lc.blocks, cap) for lc in launches}, reverse=True)
    best: tuple[tuple, NcclSystem, dict[str, int]] | None = None
    for i, version in enumerate(versions):
        for cap in caps:
            system = base.with_version(version).with_max_channels(cap)
            agree = agreement(check(launches, system, gpus_per_node))
            key = (*_rank(agree, version, prefer), -i, cap)
            if best is None or key > best[0]:
                best = (key, system, agree)
    if best is None:
        raise ValueError("no NCCL release to search")
    return best[1], best[2]
