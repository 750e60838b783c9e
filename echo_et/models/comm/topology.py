"""Where a group's ranks sit: how many, on how many nodes, how many per node.

The cost model only needs this summary: NCCL builds rings and trees that cross each node
boundary once per channel, so the step and hop counts follow from (ranks, nodes, ranks per
node), whatever the global rank numbers are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from echo_et.errors import EchoError


@dataclass(frozen=True)
class Placement:
    ranks: int           # group size
    nodes: int           # distinct nodes the group spans
    per_node: int        # most ranks of the group on one node (the bottleneck node)

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def placement(ranks: Sequence[int], gpus_per_node: int, *, where: str = "group") -> Placement:
    """Placement of global ``ranks`` when node of rank r is ``r // gpus_per_node``."""
    if gpus_per_node < 1:
        raise EchoError(f"{where}: gpus per node must be >= 1, got {gpus_per_node}")
    if len(ranks) < 1:
        raise EchoError(f"{where}: a group needs at least one rank")
    seen: set[int] = set()
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise EchoError(f"{where}: ranks must be integers >= 0, got {r!r}")
        if r in seen:
            raise EchoError(f"{where}: rank {r} appears twice")
        seen.add(r)
    return from_nodes([r // gpus_per_node for r in ranks])


def from_nodes(node_of_rank: Sequence[object]) -> Placement:
    """Placement from any node label per rank (host names read from a log, node ids)."""
    counts = Counter(node_of_rank)
    return Placement(ranks=len(node_of_rank), nodes=len(counts), per_node=max(counts.values()))


def contiguous(ranks: int, gpus_per_node: int) -> Placement:
    """Ranks 0..ranks-1 packed onto nodes of ``gpus_per_node`` (how nccl-tests and
    ``estimate --ranks N`` lay out a group)."""
    if ranks < 1:
        raise EchoError(f"ranks must be >= 1, got {ranks}")
    return placement(list(range(ranks)), gpus_per_node)
