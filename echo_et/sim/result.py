"""What a simulation returns: per-rank step time and breakdown, critical path, counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError

# The step-time vocabulary (docs/step-breakdown.md): one name per quantity in every output.
# The four parts add up to the step time; the other measures overlap them.
STEP_PARTS = ("compute_ns", "exposed_comm_ns", "bubble_ns", "host_idle_ns")
OVERLAPPING = ("comm_ns", "sync_wait_ns", "host_wait_ns")
# How tables and charts name each quantity (a column head, a legend entry).
LABELS = {"step_time_ns": "step", "compute_ns": "compute", "exposed_comm_ns": "exposed comm",
          "bubble_ns": "bubble", "host_idle_ns": "host idle", "comm_ns": "comm (all)",
          "sync_wait_ns": "sync wait", "host_wait_ns": "host wait"}


@dataclass
class RankResult:
    """Times of one rank, all in ns, measured from the rank's own start.

    compute_ns       time the rank's device runs compute or copies (union over streams)
    comm_ns          time communication transfers run (union; the wait for partners excluded)
    exposed_comm_ns  communication not hidden behind compute
    idle_ns          step time with neither compute nor communication running: bubble_ns +
                     host_idle_ns (kept for the engine; outputs give the two parts)
    bubble_ns        the part of idle_ns spent waiting for the last member of a collective
                     or for a P2P peer (pipeline bubbles, stragglers)
    host_idle_ns     the rest of idle_ns: the device waits for the host to issue work
                     (host-bound gaps, launch latency)
    sync_wait_ns     time spent waiting for the last member of a collective / the P2P peer,
                     hidden or not
    host_wait_ns     time host threads block in synchronisation calls waiting for the device
    """

    rank: int
    step_time_ns: int
    compute_ns: int
    comm_ns: int
    exposed_comm_ns: int
    idle_ns: int
    sync_wait_ns: int
    host_wait_ns: int
    simulated_as: int  # the representative rank whose timeline this rank shares
    bubble_ns: int = 0

    @property
    def host_idle_ns(self) -> int:
        return max(0, self.idle_ns - self.bubble_ns)

    def breakdown(self) -> dict[str, int]:
        """The step time and the vocabulary's quantities, in ns (:data:`STEP_PARTS` add up
        to ``step_time_ns``)."""
        return {"step_time_ns": self.step_time_ns, **{k: getattr(self, k) for k in STEP_PARTS + OVERLAPPING}}

    def to_json(self) -> dict[str, int]:
        return {**self.breakdown(), "simulated_as": self.simulated_as}


@dataclass(frozen=True)
class SimTimeline:
    """Where each node of each simulated rank ran: the engine's per-class states
    (:class:`echo_et.sim.state.RankState`: start and end of every item, the time it arrived
    at a collective) and the partition that maps a rank to the class whose timeline it
    shares. Read by :mod:`echo_et.sim.timeline`."""

    states: list[Any]   # echo_et.sim.state.RankState, one per class
    partition: Any      # echo_et.sim.symmetry.Partition
    job: Any = None     # the simulated Job: a rank's group keys resolve through its own binding

    def group_of(self, rank: int) -> Any:
        """``key -> ProcessGroup`` for ``rank`` (its own groups, not its representative's)."""
        if self.job is not None:
            job = self.job
            return lambda key: job.resolve_group(rank, key)
        return self.state_of(rank).group_of_key.__getitem__

    @property
    def ranks(self) -> list[int]:
        return sorted(self.partition.class_of)

    def state_of(self, rank: int) -> Any:
        """The RankState whose timeline ``rank`` has (its class representative's)."""
        c = self.partition.class_of[rank]
        st = self.states[c]
        if st.class_id != c:  # states are made in class order; be safe if that ever changes
            st = next(s for s in self.states if s.class_id == c)
        return st

    def node_times(self, rank: int) -> dict[int, tuple[int, int]]:
        """Node id -> simulated (start, end) in job-clock ns, for every node of ``rank``'s
        graph that ran."""
        st = self.state_of(rank)
        _require_nodes(st)
        out = {}
        for idx, node in enumerate(st.graph.nodes):
            span = st.node_span(idx)
            if span is not None:
                out[node.id] = span
        return out


def _require_nodes(st: Any) -> None:
    if getattr(st, "blocks", None) is not None:
        raise EchoError("this simulation placed repeat blocks in closed form and keeps no per-node times; "
                        "simulate with SimOptions(repeats=False) for a timeline")


@dataclass
class SimResult:
    mode: str
    ranks: dict[int, RankResult]
    critical_path: dict[str, Any]
    simulated_ranks: int
    events: int
    slowdown: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    # acausal_deps: per graph, dependencies that the measured times contradict (a converter
    # guessed them wrong); the simulation obeys them, so replay drifts where they bind
    diagnostics: dict[str, Any] = field(default_factory=dict)
    timeline: SimTimeline | None = field(default=None, repr=False)
    # with SimOptions(critical_nodes=True): (graph id, node index) -> times on the critical path
    critical_nodes: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)

    @property
    def step_time_ns(self) -> int:
        return max((r.step_time_ns for r in self.ranks.values()), default=0)

    @property
    def slowest_rank(self) -> int:
        return max(self.ranks.values(), key=lambda r: (r.step_time_ns, -r.rank)).rank if self.ranks else -1

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "step_time_ns": self.step_time_ns,
            "slowest_rank": self.slowest_rank,
            "ranks": {str(r): v.to_json() for r, v in sorted(self.ranks.items())},
            "critical_path": self.critical_path,
            "simulated_ranks": self.simulated_ranks,
            "world_size": len(self.ranks),
            "events": self.events,
            "slowdown": self.slowdown,
            "options": self.options,
            "diagnostics": self.diagnostics,
        }

    def rank_classes(self) -> list[tuple[RankResult, list[int]]]:
        """(representative's result, the ranks it stands for), one per class of equivalent
        ranks (those that share one simulated timeline), in rank order."""
        classes: dict[int, list[int]] = {}
        for r in sorted(self.ranks):
            classes.setdefault(self.ranks[r].simulated_as, []).append(r)
        return [(self.ranks[members[0]], members) for members in classes.values()]

    def timeline_events(self, ranks: list[int] | None = None):
        """The simulated step as :class:`echo_et.ir.timeline.TimelineEvent` boxes
        (see :mod:`echo_et.sim.timeline`)."""
        from echo_et.sim.timeline import timeline_events

        return timeline_events(self, ranks)
