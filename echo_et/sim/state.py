"""The simulator's records: the state of one simulated rank, and the meetings where ranks
wait for each other (collectives, send/recv pairs).

A *meeting* gathers the participants of one communication operation. Its key says which
operation it is in terms every participant computes alike, so that the members of a
collective (or the two ends of a send/recv) find the same meeting:

* :class:`CollectiveKey` ``(group_class, seq)``: the ``seq``-th collective on a group of
  that class (see :mod:`echo_et.sim.symmetry`; without symmetry a class is one group);
* :class:`P2PKey` ``(group_class, sender, receiver, seq)``: the ``seq``-th message from
  the member at position ``sender`` to the one at ``receiver`` of such a group.

The simulator's inner loop reads these records through local variables; their field names
are for the reader, and cost nothing there.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from echo_et.ir.graph import Graph
from echo_et.ir.schema import pb
from echo_et.sim.program import Program


class CollectiveKey(NamedTuple):
    """The meeting of the ``seq``-th collective on a group of class ``group_class``."""

    group_class: int
    seq: int


class P2PKey(NamedTuple):
    """The meeting of the ``seq``-th message from group position ``sender`` to
    ``receiver`` on a group of class ``group_class``."""

    group_class: int
    sender: int
    receiver: int
    seq: int


MeetingKey = CollectiveKey | P2PKey


class Participant(NamedTuple):
    """One member at a meeting: its rank state, its item, and when it arrived (ns).

    ``Meeting.parts`` stores plain ``(state, item, arrival_ns)`` tuples of this layout (the
    event loop makes one per arrival and unpacks them; exact tuples are the fastest to do
    both); ``Participant(*p)`` names one."""

    state: RankState
    item: int
    arrival_ns: int

    def unfinished(self) -> bool:
        return self.state.item_end[self.item] < 0


ParticipantTuple = tuple["RankState", int, int]   # the stored form of a Participant


@dataclass(slots=True)
class Meeting:
    """Members of one operation that arrived so far; it starts when the last one arrives."""

    arrived: int                       # members arrived so far
    last_arrival_ns: int               # the latest arrival: the start of a collective
    parts: list[ParticipantTuple]
    eager_send_end_ns: int = -1        # P2P: end of an eager send that already ran


@dataclass(slots=True, eq=False)
class RankState:
    """Simulation state of one simulated (representative) rank: its program and the time
    of every item, plus how its rendezvous items find their meetings.

    Items follow ``program``'s numbering; a time of -1 means "not yet"."""

    rank: int
    class_id: int                      # its symmetry class (ranks of a class share this state)
    program: Program
    graph: Graph
    origin_ns: int                     # when the rank starts (job clock)
    clock_offset_ns: int = 0           # measured time + clock offset = job clock
    durations_key: Hashable = None     # ranks with the same key get the same durations
    durations: list[int] = field(default_factory=list)
    pending_preds: list[int] = field(default_factory=list)  # predecessors not yet done, per item
    item_start: list[int] = field(default_factory=list)
    item_end: list[int] = field(default_factory=list)
    item_arrival: dict[int, int] = field(default_factory=dict)  # rendezvous item -> arrival time
    ready: list[int] = field(default_factory=list)  # items whose predecessors are all done (a stack)
    queued: bool = False               # on the simulator's list of ranks with ready items
    items_done: int = 0
    meeting_key: dict[int, MeetingKey] = field(default_factory=dict)  # rendezvous item -> its meeting
    meeting_size: dict[int, int] = field(default_factory=dict)  # rendezvous item -> members expected
    eager_sends: set[int] = field(default_factory=set)  # sends that complete without waiting for their recv
    group_of_key: dict[str, pb.ProcessGroup] = field(default_factory=dict)  # graph-local key -> group
    position_in_group: dict[str, int] = field(default_factory=dict)  # ordered key -> this rank's position
    participants: dict[int, list[ParticipantTuple]] = field(default_factory=dict)  # rendezvous item -> all members
    blocks: Any = None                 # repeat blocks (echo_et.sim.simulator.BlockRun) when the program keeps them

    def reset(self, durations: list[int]) -> None:
        n = self.program.n_items
        self.durations = durations
        self.pending_preds = list(self.program.pred_count)
        self.item_start = [-1] * n
        self.item_end = [-1] * n
        self.item_arrival = {}
        self.participants = {}
        self.ready = list(reversed(self.program.roots))
        self.items_done = 0

    def node(self, item: int) -> pb.Node | None:
        idx = self.program.node_of[item]
        # node_of indexes the nodes the program was compiled from: the stored ones (a graph
        # compiled expanded was expanded in place first)
        return self.graph.stored_nodes[idx] if idx >= 0 else None

    def describe(self, item: int) -> str:
        n = self.node(item)
        return f"node {n.id} ({n.name})" if n is not None else f"host gap item {item}"

    def node_span(self, node_index: int) -> tuple[int, int] | None:
        """Simulated (start, end) of the node at ``node_index`` in ``graph.nodes``, job
        clock ns; None for a node the program holds no item for."""
        prog = self.program
        s_it, e_it = prog.node_start_item[node_index], prog.node_end_item[node_index]
        if s_it < 0 or e_it < 0:
            return None
        return self.item_start[s_it], self.item_end[e_it]

    def first_unfinished(self) -> int:
        for it in range(self.program.n_items):
            if self.item_end[it] < 0:
                return it
        return 0
