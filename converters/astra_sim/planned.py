"""What the ASTRA-sim export plans for one graph: the planned nodes (role, lane, times,
dependencies) and the plan's counts. ``plan.py`` makes plans; the writer and the views read
them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from echo_et.ir.schema import pb

# Roles of a planned node.
COMP = "comp"
COLL = "coll"
P2P = "p2p"
# Lanes.
HOST = "host"
GPU = "gpu"
COMM = "comm"
RECV = "recv"



class PlanSource(Protocol):
    """A plan made node by node on each read (a streamed plan): what :class:`GraphPlan`
    asks of it."""

    mapped: dict[str, int]
    dropped: dict[str, int]
    stats: dict[str, int]

    def plan(self) -> Iterator[PlannedNode]: ...

    def start_node(self) -> PlannedNode: ...


@dataclass
class PlannedNode:
    """One node of the export, before rank-specific fields are known."""

    index: int                 # position in export order (0-based): the node id is index + 1
    role: str                  # COMP, COLL or P2P
    lane: str                  # HOST, GPU, COMM or RECV
    node: pb.Node | None       # the IR node it comes from (None: host segment, join, start)
    name: str
    start_ns: int = 0          # exported start on the graph's clock (measured time)
    end_ns: int = 0            # exported end (COMP: start + length; communication: measured end)
    deps: list[int] = field(default_factory=list)  # indices of planned nodes
    label: str = ""            # mapping label (``mapped`` counts)
    merged: list[pb.Node] = field(default_factory=list)  # collectives of the same group that ran
    #                                                      concurrently with ``node``: one collective
    #                                                      of the summed bytes

    @property
    def in_bytes(self) -> int:
        """A collective's per-rank input bytes, those of the collectives merged into it included."""
        return self.node.collective.in_bytes + sum(m.collective.in_bytes for m in self.merged)

    @property
    def out_bytes(self) -> int:
        return self.node.collective.out_bytes + sum(m.collective.out_bytes for m in self.merged)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


class GraphPlan:
    """What one graph becomes. ``nodes`` is the planned list; a *streamed* plan (an untimed
    graph whose dependencies point back, see :func:`plan_graph`) holds none: it re-plans the
    graph node by node on each :meth:`iter_nodes` (``nodes`` makes the list on demand), and
    its counts (``mapped``, ``dropped``, ``stats``) are those of its first complete pass."""

    def __init__(self, graph_id: str, nodes: list[PlannedNode] | None, mapped: dict[str, int],
                 merged: dict[str, int], dropped: dict[str, int], stats: dict[str, int], host_cpu: bool,
                 gpu_cpu: bool, origin_ns: int, has_all_to_all: bool, coll_groups: frozenset[str],
                 source: PlanSource | None = None):
        self.graph_id = graph_id
        self._nodes = nodes
        self._mapped = mapped        # mapping label -> nodes written per rank
        self.merged = merged         # IR kind -> nodes merged into another exported node (per rank)
        self._dropped = dropped      # what had no counterpart -> count (per rank)
        self._stats = stats          # ns and counts: clipped, gaps, waits, busy and lost time (per rank)
        self.host_cpu = host_cpu     # the host lane is written as CPU nodes (is_cpu_op=true)
        self.gpu_cpu = gpu_cpu       # the gpu lane is written as CPU nodes (CPU-only graphs)
        self.origin_ns = origin_ns   # the graph's first measured start
        self.has_all_to_all = has_all_to_all
        self.coll_groups = coll_groups   # group keys of the exported collectives
        self._source = source
        self._counted = source is None

    @property
    def streamed(self) -> bool:
        return self._source is not None

    @property
    def any_merged(self) -> bool:
        """Whether collectives were merged into others (never in a streamed, untimed plan)."""
        return self._source is None and any(pn.merged for pn in self._nodes or ())

    @property
    def nodes(self) -> list[PlannedNode]:
        if self._nodes is not None:
            return self._nodes
        return list(self.iter_nodes())

    def iter_nodes(self) -> Iterator[PlannedNode]:
        """The planned nodes in export order (a streamed plan makes them one at a time)."""
        if self._source is None:
            yield from self._nodes or ()
            return
        src = self._source
        yield from src.plan()
        if not self._counted:
            self._mapped, self._dropped, self._stats = src.mapped, src.dropped, src.stats
            self._counted = True

    def _count(self) -> None:
        if not self._counted:
            for _ in self.iter_nodes():
                pass

    @property
    def mapped(self) -> dict[str, int]:
        self._count()
        return self._mapped

    @property
    def dropped(self) -> dict[str, int]:
        self._count()
        return self._dropped

    @property
    def stats(self) -> dict[str, int]:
        self._count()
        return self._stats

    @property
    def first(self) -> PlannedNode:
        """The start node (index 0)."""
        if self._source is not None:
            return self._source.start_node()
        return self.nodes[0]

    def is_cpu(self, pn: PlannedNode) -> bool:
        if pn.lane == HOST:
            return self.host_cpu
        if pn.lane == GPU:
            return self.gpu_cpu
        return False


def round_us(ns: int) -> int:
    """Nanoseconds to whole microseconds, half up (ASTRA-sim reads integer µs)."""
    return max(0, (int(ns) + 500) // 1000)


def exported_us(pn: PlannedNode) -> int:
    """The whole microseconds a COMP node runs: its end and start are rounded on the graph's
    clock, so the lengths of back-to-back nodes add up to the rounded total (no drift)."""
    return max(0, round_us(pn.end_ns) - round_us(pn.start_ns))


__all__ = ["COLL", "COMM", "COMP", "GPU", "HOST", "P2P", "RECV", "GraphPlan", "PlanSource", "PlannedNode",
           "exported_us", "round_us"]
