"""Repeat blocks whose sends and receives meet other rank classes, placed together.

A block placed in closed form (:mod:`echo_et.sim.blocks`) must not wait for another rank
inside it. A context-parallel ring breaks that: every layer of every CP rank sends its keys
and values to the next rank and receives the previous rank's, and the CP ranks are classes of
their own (each has its own peers and its own half blocks). The occurrences that exchange
messages form a **bundle**: (rank class, occurrence) pairs joined by the meetings of their
sends and receives (the connected components of "a send of one meets a recv of the other").
A bundle is still a max-plus system: a pair's two items start at the later of their two
arrivals (an eager send, small enough to go to the peer's buffer, at its own arrival) and
last the transfer the send is priced at, exactly as the event loop runs them; so the start of
every item of every member is ``max_j (x_j + D[i, j])`` over the members' inputs, one after
the other, and so is every send's and recv's arrival (``R``; its wait is start minus arrival).
The event loop places a bundle when the macro items of all its members are ready: the last
member to arrive places every member's occurrence and releases what waits for its ports.

``D`` depends on the members' blocks and outside dependencies, on which of their items meet,
and on their durations; it is computed once per distinct combination (:class:`JointTables`),
and a placement once per distinct inputs relative to their latest, as for one occurrence. The
items are evaluated in an order that respects both stream order and the meetings (a send
waits for its recv's predecessors), found once per bundle shape; a shape with no such order
would deadlock when simulated node by node too, and is left to the expanded simulation,
which says where. Exact, like a single block: ``tests/test_linked_blocks.py`` compares every
result with the same job simulated node by node.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from echo_et.sim.blocks import NEG, Block, NotCompact, Occurrence, place
from echo_et.sim.state import RankState


class NotLinked(NotCompact):
    """These blocks' sends and receives cannot be placed as bundles: their graphs are
    simulated expanded (the reason is for tests and diagnostics)."""


@dataclass(frozen=True)
class End:
    """One member's item at a meeting inside a block occurrence of a simulated rank."""

    state: RankState
    occurrence: int
    local: int
    is_send: bool = False  # the send of a message (False: its recv, or a collective)
    eager: bool = False    # a send small enough not to wait for its recv


@dataclass(frozen=True)
class JointMeeting:
    """A meeting inside a bundle: its members' items as (member, local item), and which of
    them waits for which (an eager send for nobody, its recv for the send; everyone else for
    everyone)."""

    ends: tuple[tuple[int, int], ...]
    sends: tuple[bool, ...]
    eager: bool


@dataclass
class Plan:
    """What every bundle of one shape shares: the input columns and joint items of each
    member, who waits for whom at its meetings, and an order of evaluation."""

    col: list[int]                            # first input column of each member
    base: list[int]                           # first joint item of each member
    n_in: int
    n_items: int
    waits_for: dict[tuple[int, int], list[tuple[int, int]]]   # (member, local) -> items whose arrival it waits for
    meeting_of: dict[tuple[int, int], int]    # (member, local) -> its meeting in the bundle
    order: list[tuple[int, int]]              # (member, local), dependencies first
    rows: np.ndarray                          # joint items that meet others
    ext: list[dict[int, list[int]]]           # per member: local item -> its outside input columns (joint)


@dataclass
class Bundle:
    """Occurrences of several simulated ranks that meet each other: placed together."""

    members: list[tuple[RankState, int]]      # (state, occurrence), by class id then occurrence
    meetings: tuple[JointMeeting, ...]
    sig: tuple                                # what the plan depends on
    plan: Plan | None = None
    arrived: list[np.ndarray | None] = field(default_factory=list)   # this run: each member's inputs
    count: int = 0

    def reset(self) -> None:
        self.arrived = [None] * len(self.members)
        self.count = 0


@dataclass(frozen=True)
class Link:
    """Where a linked occurrence sits in its bundle (kept on its rank's ``BlockRun.links``)."""

    bundle: Bundle
    member: int


def link_bundles(ends: dict[Hashable, list[End]]) -> list[Bundle]:
    """The bundles of the block occurrences that meet under ``ends``' keys (meeting key ->
    every member's item there; the caller checked that the members are all there and agree)."""
    parent: dict[tuple[int, int], tuple[int, int]] = {}
    state_of: dict[int, RankState] = {}

    def find(a: tuple[int, int]) -> tuple[int, int]:
        root = a
        while parent[root] != root:
            root = parent[root]
        while parent[a] != root:
            parent[a], a = root, parent[a]
        return root

    for at in ends.values():
        roots = []
        for e in at:
            k = (e.state.class_id, e.occurrence)
            parent.setdefault(k, k)
            state_of[e.state.class_id] = e.state
            roots.append(find(k))
        low = min(roots)
        for r in roots:
            parent[r] = low
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for k in parent:
        groups.setdefault(find(k), []).append(k)
    member: dict[tuple[int, int], tuple[tuple[int, int], int]] = {}
    for root, keys in groups.items():
        keys.sort()
        for m, k in enumerate(keys):
            member[k] = (root, m)
    meetings: dict[tuple[int, int], list[JointMeeting]] = {root: [] for root in groups}
    for at in ends.values():
        where = [member[(e.state.class_id, e.occurrence)] for e in at]
        joint = sorted(zip([m for _, m in where], [e.local for e in at], [e.is_send for e in at], strict=True))
        meetings[where[0][0]].append(JointMeeting(tuple((m, i) for m, i, _ in joint), tuple(s for _, _, s in joint),
                                                  any(e.eager for e in at)))
    out: list[Bundle] = []
    for root in sorted(groups):
        members = [(state_of[c], o) for c, o in groups[root]]
        mts = tuple(sorted(meetings[root], key=lambda j: j.ends))
        sig = (tuple((id(st.program), st.program.compact.occurrences[o].sig) for st, o in members), mts)
        bundle = Bundle(members, mts, sig)
        bundle.reset()
        out.append(bundle)
    return out


def _plan(bundle: Bundle) -> Plan:
    """The bundle's :class:`Plan`: columns, joint items, and an evaluation order in which every
    item comes after its local predecessors and after those of every item whose arrival it
    waits for (NotLinked when there is none: the items wait for each other in a cycle)."""
    occs: list[Occurrence] = [st.program.compact.occurrences[o] for st, o in bundle.members]
    col, base = [], []
    n_in = n_items = 0
    ext: list[dict[int, list[int]]] = []
    for occ in occs:
        blk = occ.block
        col.append(n_in)
        base.append(n_items)
        e: dict[int, list[int]] = {}
        for j, (local, _) in enumerate(occ.outside):
            e.setdefault(local, []).append(n_in + len(blk.streams) + j)
        ext.append(e)
        n_in += len(blk.streams) + len(occ.outside)
        n_items += blk.n
    waits_for: dict[tuple[int, int], list[tuple[int, int]]] = {}
    meeting_of: dict[tuple[int, int], int] = {}
    for k, mt in enumerate(bundle.meetings):
        for end, is_send in zip(mt.ends, mt.sends, strict=True):
            meeting_of[end] = k
            waits_for[end] = [] if (mt.eager and is_send) else [x for x in mt.ends if x != end]

    def preds(m: int, i: int) -> list[tuple[int, int]]:
        blk = occs[m].block
        out = [(m, q) for q, _ in blk.local_gates[i]]
        if blk.stream_prev[i] >= 0:
            out.append((m, blk.stream_prev[i]))
        return out

    # Kahn's order over the joint items
    deps: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for m, occ in enumerate(occs):
        for i in range(occ.block.n):
            d = set(preds(m, i))
            for other in waits_for.get((m, i), ()):
                d.update(preds(*other))
            d.discard((m, i))
            deps[(m, i)] = d
    users: dict[tuple[int, int], list[tuple[int, int]]] = {}
    left = {k: len(v) for k, v in deps.items()}
    for k, v in deps.items():
        for q in v:
            users.setdefault(q, []).append(k)
    ready = sorted((k for k, c in left.items() if c == 0), reverse=True)
    order: list[tuple[int, int]] = []
    while ready:
        k = ready.pop()
        order.append(k)
        for u in users.get(k, ()):
            left[u] -= 1
            if left[u] == 0:
                ready.append(u)
    if len(order) != n_items:
        raise NotLinked("items inside repeat blocks that wait for each other's meetings in a cycle")
    rows = np.asarray(sorted(base[m] + i for m, i in meeting_of), dtype=np.int64)
    return Plan(col, base, n_in, n_items, waits_for, meeting_of, order, rows, ext)


def _joint_tables(plan: Plan, blocks: Sequence[Block], durs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(D, R): longest path from each input column to each joint item's start (D) and, for
    the items that meet others (``plan.rows``), to its arrival at its meeting (R)."""
    n_in = plan.n_in
    d_rows = np.full((plan.n_items, n_in), NEG, dtype=np.int64)
    arrival: dict[tuple[int, int], np.ndarray] = {}
    entry = [{k: plan.col[m] + j for j, k in enumerate(blk.streams)} for m, blk in enumerate(blocks)]

    def ready_row(m: int, i: int) -> np.ndarray:
        got = arrival.get((m, i))
        if got is not None:
            return got
        blk, d, b = blocks[m], durs[m], plan.base[m]
        p = blk.stream_prev[i]
        if p >= 0:
            src = d_rows[b + p]
            row = np.where(src > NEG, src + int(d[p]), NEG)
        else:
            row = np.full(n_in, NEG, dtype=np.int64)
            row[entry[m][blk.stream[i]]] = 0
        for q, fs in blk.local_gates[i]:
            src = d_rows[b + q]
            add = 0 if fs else int(d[q])
            np.maximum(row, np.where(src > NEG, src + add, NEG), out=row)
        for j in plan.ext[m].get(i, ()):
            if row[j] < 0:
                row[j] = 0
        if (m, i) in plan.meeting_of:
            arrival[(m, i)] = row
        return row

    for m, i in plan.order:
        row = ready_row(m, i)
        for other in plan.waits_for.get((m, i), ()):
            row = np.maximum(row, ready_row(*other))
        d_rows[plan.base[m] + i] = row
    r_rows = np.empty((plan.rows.size, n_in), dtype=np.int64)
    where = {plan.base[m] + i: (m, i) for m, i in plan.meeting_of}
    for k, g in enumerate(plan.rows.tolist()):
        r_rows[k] = arrival[where[g]]
    return d_rows, r_rows


Placed = tuple[np.ndarray, np.ndarray, np.ndarray]   # a member's (start, end, wait), relative to the shift


class JointTables:
    """``D`` and ``R`` per distinct (bundle shape, durations), and each distinct placement
    (tables, inputs relative to their latest) once: every occurrence of a steady pipeline
    shares them."""

    def __init__(self) -> None:
        self._tables: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._solutions: dict[tuple[int, bytes], tuple[list[Placed], np.ndarray]] = {}
        self._plans: dict[tuple, Plan] = {}
        self.computed = 0

    def plan(self, bundle: Bundle) -> Plan:
        """The bundle's plan, shared by every bundle of its shape."""
        got = self._plans.get(bundle.sig)
        if got is None:
            got = _plan(bundle)
            self._plans[bundle.sig] = got
        bundle.plan = got
        return got

    def place(self, bundle: Bundle) -> tuple[list[Placed], int]:
        """Every member's placement once all have arrived (``bundle.arrived``), and the shift."""
        plan = bundle.plan if bundle.plan is not None else self.plan(bundle)
        runs = [st.blocks for st, _ in bundle.members]
        key = (bundle.sig, tuple(run.keys[o] for run, (_, o) in zip(runs, bundle.members, strict=True)))
        got = self._tables.get(key)
        if got is None:
            blocks = [st.program.compact.occurrences[o].block for st, o in bundle.members]
            durs = [run.durs[o] for run, (_, o) in zip(runs, bundle.members, strict=True)]
            d_rows, r_rows = _joint_tables(plan, blocks, durs)
            got = (d_rows, r_rows, np.concatenate(durs))
            self._tables[key] = got
            self.computed += 1
        d_rows, r_rows, dur = got
        x = np.concatenate([a for a in bundle.arrived if a is not None])
        shift = int(x.max()) if x.size else 0
        rel = x - shift
        skey = (id(d_rows), rel.tobytes())     # the tables live as long as this object
        sol = self._solutions.get(skey)
        if sol is None:
            s = place(d_rows, rel)
            w = np.zeros(plan.n_items, dtype=np.int64)
            if plan.rows.size:
                w[plan.rows] = s[plan.rows] - place(r_rows, rel)
            e = s + dur
            ends = [*plan.base[1:], plan.n_items]
            members = [(s[a:b], e[a:b], w[a:b]) for a, b in zip(plan.base, ends, strict=True)]
            sol = self._solutions[skey] = (members, d_rows)
        return sol[0], shift
