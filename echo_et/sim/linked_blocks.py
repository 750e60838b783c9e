"""Repeat blocks whose sends, receives and collectives meet other rank classes, placed together.

A block placed in closed form (:mod:`echo_et.sim.blocks`) must not wait for another rank
inside it. A context-parallel ring breaks that: every layer of every CP rank sends its keys
and values to the next rank and receives the previous rank's, and the CP ranks are classes of
their own (each has its own peers and its own half blocks); the last stage's loss is
all-reduced over them inside its block. The occurrences that meet form a **bundle**: (rank
class, occurrence) pairs joined by the meetings of their items (the connected components of
"an item of one meets an item of the other"). A bundle is still a max-plus system: a
message's two items start at the later of their two arrivals (an eager send, small enough to
go to the peer's buffer, at its own arrival) and last the transfer the send is priced at, a
collective's members at the last arrival, exactly as the event loop runs them; so the start
of every item of every member is ``max_j (x_j + D[i, j])`` over the members' inputs, one
after the other, and so is every meeting item's arrival (``R``; its wait is start minus
arrival).
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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from echo_et.sim.blocks import NEG, Block, NotCompact, Occurrence, place, unique_rows
from echo_et.sim.state import RankState


class NotLinked(NotCompact):
    """These blocks' meetings with other rank classes cannot be placed as bundles: their
    graphs are simulated expanded (the reason is for tests and diagnostics)."""


@dataclass
class Ends:
    """Every item inside a block occurrence that meets other rank classes, as columns (one
    row per item): its meeting key (``kind`` 0 a collective, 1 a message; ``gc`` the group
    class; ``a``, ``b`` the sender's and receiver's group positions of a message, 0 for a
    collective; ``seq``), the (rank, occurrence) ``node`` it belongs to, its ``local`` item,
    and what its members must agree on."""

    kind: list[np.ndarray] = field(default_factory=list)
    gc: list[np.ndarray] = field(default_factory=list)
    a: list[np.ndarray] = field(default_factory=list)
    b: list[np.ndarray] = field(default_factory=list)
    seq: list[np.ndarray] = field(default_factory=list)
    size: list[np.ndarray] = field(default_factory=list)    # members the meeting waits for
    node: list[np.ndarray] = field(default_factory=list)
    local: list[np.ndarray] = field(default_factory=list)
    send: list[np.ndarray] = field(default_factory=list)
    eager: list[np.ndarray] = field(default_factory=list)
    what: list[np.ndarray] = field(default_factory=list)    # (type, bytes) hashed: members agree
    dur: list[np.ndarray] = field(default_factory=list)     # each member's own time (ns)

    def add(self, rows: np.ndarray, seqs: np.ndarray, nodes: np.ndarray, dur: np.ndarray) -> None:
        """One block's items on every occurrence of it: ``rows`` (items x [local, kind, gc, a,
        b, size, send, eager, what]), ``seqs`` (occurrences x items), ``nodes`` (occurrences).
        The small columns are kept narrow: a CP16 ring has millions of such items."""
        n_occ, n = seqs.shape
        tile = np.tile
        for name, col, dtype in (("local", 0, np.int32), ("kind", 1, np.int8), ("gc", 2, np.int32),
                                 ("a", 3, np.int32), ("b", 4, np.int32), ("size", 5, np.int32),
                                 ("send", 6, np.int8), ("eager", 7, np.int8), ("what", 8, np.int64)):
            getattr(self, name).append(tile(rows[:, col].astype(dtype), n_occ))
        self.dur.append(tile(dur, n_occ))
        self.seq.append(seqs.reshape(-1))
        self.node.append(np.repeat(nodes.astype(np.int32), n))

    def columns(self) -> dict[str, np.ndarray]:
        """Every column joined, the pieces let go as each is (they would double the peak)."""
        out: dict[str, np.ndarray] = {}
        for k, v in vars(self).items():
            out[k] = np.concatenate(v) if v else np.zeros(0, dtype=np.int64)
            v.clear()
        return out


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
    """What every bundle of one shape shares: its meetings, the input columns and joint items
    of each member, who waits for whom, and an order of evaluation."""

    meetings: tuple[JointMeeting, ...]
    col: list[int]                            # first input column of each member
    base: list[int]                           # first joint item of each member
    n_in: int
    n_items: int
    waits_for: dict[tuple[int, int], list[tuple[int, int]]]   # (member, local) -> items whose arrival it waits for
    meeting_of: dict[tuple[int, int], int]    # (member, local) -> its meeting
    order: list[tuple[int, int]]              # (member, local), dependencies first
    rows: np.ndarray                          # joint items that meet others
    ext: list[dict[int, list[int]]]           # per member: local item -> its outside input columns (joint)
    schedule: Schedule | None = None          # how its tables are filled (made with the plan)


@dataclass
class Bundle:
    """Occurrences of several simulated ranks that meet each other: placed together."""

    members: list[tuple[RankState, int]]      # (state, occurrence), by class id then occurrence
    sig: tuple                                # its shape: what the plan depends on
    meetings: tuple[JointMeeting, ...] = ()   # until the plan is made (then the plan's)
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


def link_bundles(ends: Ends, nodes: Sequence[tuple[RankState, int]], skeleton_keys: np.ndarray) -> list[Bundle]:
    """The bundles of the block occurrences ``nodes`` whose items ``ends`` meet: the
    connected components of "an item of one meets an item of the other", each with its
    meetings in member-relative terms. ``skeleton_keys`` (rows of kind, group class, a, b,
    seq) are the meetings of items outside every block. NotLinked when a meeting is not all
    inside blocks, its members are not all there, or they disagree (a send meets a send,
    sizes or prices differ): the node-by-node simulation then says what is wrong, if
    anything."""
    cols = ends.columns()
    n = cols["node"].size
    if n == 0:
        return []
    key_names = ("kind", "gc", "a", "b", "seq")
    order = np.lexsort(tuple(cols[k] for k in reversed(key_names)))
    for k in list(cols):               # one column at a time: the unsorted one goes at once
        cols[k] = cols[k][order]
    del order
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for k in key_names:
        new[1:] |= cols[k][1:] != cols[k][:-1]
    starts = np.flatnonzero(new)
    group = np.cumsum(new) - 1
    del new
    counts = np.diff(np.append(starts, n))
    if skeleton_keys.size:
        keys = np.stack([cols[k][starts].astype(np.int64) for k in key_names], axis=1)
        both = np.concatenate((skeleton_keys.reshape(-1, 5), keys))
        _, inv = unique_rows(both)
        if np.isin(inv[len(skeleton_keys):], inv[:len(skeleton_keys)]).any():
            raise NotLinked("a meeting between a repeat block and a node outside every block")
    if (counts != cols["size"][starts]).any():
        raise NotLinked("a meeting inside repeat blocks whose members are not all there")
    for name in ("what", "dur"):
        v = cols[name]
        if (np.maximum.reduceat(v, starts) != np.minimum.reduceat(v, starts)).any():
            raise NotLinked("members of a meeting inside repeat blocks that disagree or are priced differently")
    msg = cols["kind"][starts] == 1
    if (np.add.reduceat(cols["send"], starts, dtype=np.int64)[msg] != 1).any():
        raise NotLinked("a send that meets a send, or a recv a recv, inside repeat blocks")
    for k in ("gc", "a", "b", "seq", "size", "what", "dur", "kind"):
        del cols[k]
    # connected components of the nodes: each meeting joins its members' nodes
    node = cols["node"]
    label = np.arange(len(nodes), dtype=np.int64)
    while True:
        low = np.minimum.reduceat(label[node], starts)
        before = label.copy()
        np.minimum.at(label, node, low[group])
        label = label[label]
        if np.array_equal(label, before):
            break
    # members: by label, then node (class id then occurrence: nodes were numbered so)
    by = np.lexsort((np.arange(len(nodes)), label))
    member = np.empty(len(nodes), dtype=np.int64)
    lab_sorted = label[by]
    first = np.ones(len(nodes), dtype=bool)
    first[1:] = lab_sorted[1:] != lab_sorted[:-1]
    member[by] = np.arange(len(nodes)) - np.maximum.accumulate(np.where(first, np.arange(len(nodes)), 0))
    # every end as (bundle label, member, local); meetings ordered by their first end
    m_of = member[node]
    lab = label[node]
    e_order = np.lexsort((cols["local"], m_of, group))   # meeting by meeting, each by (member, local)
    g_first = e_order[starts]                               # each meeting's first end
    g_sort = np.lexsort((cols["local"][g_first], m_of[g_first], lab[g_first]))
    g_rank = np.empty(len(starts), dtype=np.int64)
    g_rank[g_sort] = np.arange(len(starts))
    # every end in the order of its meeting, then (member, local): a bundle is one slice
    e2 = np.lexsort((cols["local"], m_of, g_rank[group]))
    lab2 = lab[e2]
    b_cut = np.flatnonzero(np.diff(lab2)) + 1
    b_start = np.concatenate(([0], b_cut))
    b_end = np.append(b_cut, n)
    opens = np.ones(n, dtype=np.int64)       # 1 where a meeting opens, 2 where an eager one does
    opens[1:] = (group[e2][1:] != group[e2][:-1]).astype(np.int64)
    opens += opens * np.maximum.reduceat(cols["eager"], starts)[group[e2]]
    table = np.stack((m_of[e2], cols["local"][e2], cols["send"][e2], opens), axis=1)
    mem_lists: dict[int, list[int]] = {}
    for v in by.tolist():
        mem_lists.setdefault(int(label[v]), []).append(v)
    shapes: dict[bytes, tuple[JointMeeting, ...]] = {}
    meetings_of: dict[int, tuple[JointMeeting, ...]] = {}
    for a, z in zip(b_start.tolist(), b_end.tolist(), strict=True):
        piece = table[a:z]
        key = piece.tobytes()
        mts = shapes.get(key)
        if mts is None:
            mts = shapes[key] = _meetings(piece.tolist())
        meetings_of[int(lab2[a])] = mts
    out: list[Bundle] = []
    for root in sorted(mem_lists):
        members = [nodes[v] for v in mem_lists[root]]
        mts = meetings_of.get(root, ())
        sig = (tuple((id(st.program), st.program.compact.occurrences[o].sig) for st, o in members), mts)
        bundle = Bundle(members, sig, mts)
        bundle.reset()
        out.append(bundle)
    return out


def _meetings(rows: list[list[int]]) -> tuple[JointMeeting, ...]:
    """A bundle's meetings from its ends' rows (member, local, send, opens: 0 the meeting
    goes on, 1 a meeting opens, 2 an eager one), in order."""
    out: list[JointMeeting] = []
    ends: list[tuple[int, int]] = []
    sends: list[bool] = []
    eager = False
    for m, i, send, opens in rows:
        if opens and ends:
            out.append(JointMeeting(tuple(ends), tuple(sends), eager))
            ends, sends = [], []
        if opens:
            eager = opens == 2
        ends.append((m, i))
        sends.append(bool(send))
    if ends:
        out.append(JointMeeting(tuple(ends), tuple(sends), eager))
    return tuple(out)


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
    plan = Plan(bundle.meetings, col, base, n_in, n_items, waits_for, meeting_of, order, rows, ext)
    plan.schedule = _schedule(plan, [occ.block for occ in occs])
    return plan


@dataclass
class Schedule:
    """How a bundle shape's tables are filled, level by level (the durations aside).

    The rows are the inputs' unit rows (0 at their own column), the joint items, the
    arrivals of the items that meet others (in ``plan.rows`` order) and one padding row.
    Every row is the max of its sources' rows plus an offset (a source's duration when it is
    waited for from its end, else 0); a row's level is one more than its sources' highest, so
    a level's rows are filled at once from rows already filled, each level's targets padded
    to its most sources (the padding row, lowest of all, offset 0): one gather, add and max
    per level instead of a few numpy calls per item. A context-parallel ring at CP16 has
    about 110,000 items in some 3,600 levels of up to 4 sources."""

    n_rows: int                     # inputs, items and arrivals; the padding row is n_rows
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]
    # per level: (targets, their sources (targets x most, flat), the joint item whose
    # duration each source adds (n_items: none), most sources)


def _schedule(plan: Plan, blocks: Sequence[Block]) -> Schedule:
    """The bundle shape's :class:`Schedule`: the same edges :func:`_joint_tables`' rule
    reads, each item's from its stream predecessor (or its stream's entry), its gates and its
    outside inputs; a meeting item's from its own arrival and those of the items it waits
    for."""
    n_in, n_items, base = plan.n_in, plan.n_items, plan.base
    meets = sorted(plan.meeting_of, key=lambda e: base[e[0]] + e[1])
    arrival_row = {e: n_in + n_items + k for k, e in enumerate(meets)}
    level = [0] * (n_in + n_items + len(arrival_row))
    tgt: list[int] = []
    src: list[int] = []
    dur: list[int] = []
    lvl: list[int] = []

    def add(row: int, sources: list[tuple[int, int]]) -> None:
        top = 1 + max(level[r] for r, _ in sources)
        level[row] = top
        for r, d in sources:
            tgt.append(row)
            src.append(r)
            dur.append(d)
            lvl.append(top)

    def sources(m: int, i: int) -> list[tuple[int, int]]:
        blk, b = blocks[m], base[m]
        p = blk.stream_prev[i]
        out = [(n_in + b + p, b + p) if p >= 0 else (plan.col[m] + blk.streams.index(blk.stream[i]), n_items)]
        out += [(n_in + b + q, n_items if fs else b + q) for q, fs in blk.local_gates[i]]
        out += [(j, n_items) for j in plan.ext[m].get(i, ())]
        return out

    done: set[int] = set()

    def arrival(e: tuple[int, int]) -> int:
        row = arrival_row[e]
        if row not in done:
            add(row, sources(*e))
            done.add(row)
        return row

    for m, i in plan.order:
        if (m, i) not in plan.meeting_of:
            add(n_in + base[m] + i, sources(m, i))
            continue
        ends = [arrival((m, i))] + [arrival(o) for o in plan.waits_for.get((m, i), ())]
        add(n_in + base[m] + i, [(r, n_items) for r in ends])
    t = np.asarray(tgt, dtype=np.int64)
    lv = np.asarray(lvl, dtype=np.int64)
    order = np.lexsort((t, lv))
    t, lv = t[order], lv[order]
    s_all = np.asarray(src, dtype=np.int64)[order]
    d_all = np.asarray(dur, dtype=np.int64)[order]
    pad = len(level)
    cuts = np.flatnonzero(np.diff(lv)) + 1
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []
    for a, z in zip(np.concatenate(([0], cuts)).tolist(), np.append(cuts, t.size).tolist(), strict=True):
        piece = t[a:z]
        new = np.ones(piece.size, dtype=bool)
        new[1:] = piece[1:] != piece[:-1]
        first = np.flatnonzero(new)
        count = np.diff(np.append(first, piece.size))
        most = int(count.max())
        slot = np.arange(piece.size) - np.repeat(first, count)       # each edge's place among its target's
        at = np.repeat(np.arange(first.size), count) * most + slot
        srcs = np.full(first.size * most, pad, dtype=np.int64)
        durs = np.full(first.size * most, n_items, dtype=np.int64)
        srcs[at] = s_all[a:z]
        durs[at] = d_all[a:z]
        levels.append((piece[first], srcs, durs, most))
    return Schedule(pad, levels)


def _joint_tables(plan: Plan, schedule: Schedule, durs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(D, R): longest path from each input column to each joint item's start (D) and, for
    the items that meet others (``plan.rows``), to its arrival at its meeting (R); as int32
    when every path is shorter than NARROW_LIMIT ns (about a second: a ring's layer), half
    the memory (a context-parallel ring's bundle at CP16 is 110,000 items by 96 inputs, and
    a slowdown round holds up to 84 tables), else as int64. Both are views of one array.

    "No path" starts at NARROW_NONE (int32) or NEG (int64) and drifts by the durations added
    to it, by at most the longest real path (a drifted entry's chain starts at an item that
    has a real path from its stream's entry): below -NARROW_LIMIT in an int32 table, where
    every real path is >= 0 and no sum leaves int32, and far below every real path in an
    int64 one, which is what placing needs (:func:`place_narrow`)."""
    offsets = np.append(np.concatenate(durs).astype(np.int64), 0)
    longest = _filled(schedule, plan.n_in, offsets, None)[:schedule.n_rows]    # each row's longest path
    n_in, n_items = plan.n_in, plan.n_items
    if longest.size == n_in or int(longest.max()) < NARROW_LIMIT:
        rows = _filled(schedule, n_in, offsets.astype(np.int32), NARROW_NONE)
    else:
        rows = _filled(schedule, n_in, offsets, NEG)
    return rows[n_in:n_in + n_items], rows[n_in + n_items:schedule.n_rows]


def _filled(schedule: Schedule, n_in: int, offsets: np.ndarray, none: int | None) -> np.ndarray:
    """Every row of ``schedule`` (inputs, items, arrivals, padding) in ``offsets``' dtype:
    ``n_in`` columns, an input's row ``none`` but 0 at its own column; or (``none`` None)
    one column, 0 for every input, which gives each row's longest path from any input."""
    columns = 1 if none is None else n_in
    rows = np.empty((schedule.n_rows + 1, columns), dtype=offsets.dtype)
    if none is None:
        rows[:n_in] = 0
    else:
        rows[:n_in] = none
        rows[np.arange(n_in), np.arange(n_in)] = 0
    rows[schedule.n_rows] = np.iinfo(offsets.dtype).min
    for targets, srcs, durs, most in schedule.levels:
        got = rows[srcs]
        got += offsets[durs][:, None]
        rows[targets] = got if most == 1 else got.reshape(targets.size, most, columns).max(axis=1)
    return rows


Placed = tuple[np.ndarray, np.ndarray, np.ndarray]   # a member's (start, end, wait), relative to the shift

# A joint table is int32 when its paths are all shorter than NARROW_LIMIT ns (a second);
# "no path" is then below -NARROW_LIMIT (NARROW_NONE plus a drift shorter than the limit).
NARROW_LIMIT = 1 << 30
NARROW_NONE = -(1 << 31)


def place_narrow(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """:func:`echo_et.sim.blocks.place` on a joint table, exactly: in an int32 one, with
    every input later than -NARROW_LIMIT (relative to the latest, as placements are), a
    missing path (below -NARROW_LIMIT, plus x_j <= 0) stays below every real one (each item
    has one from its stream's entry, >= x_entry > -NARROW_LIMIT); an earlier input gets the
    table widened for this call, "no path" (every negative entry) becoming NEG."""
    if table.dtype == np.int32 and x.size and int(x.min()) <= -NARROW_LIMIT:
        table = np.where(table < 0, NEG, table.astype(np.int64))
    return place(table, x)


class JointTables:
    """``D`` and ``R`` per distinct (bundle shape, durations), and each distinct placement
    (tables, inputs relative to their latest) once: every occurrence of a steady pipeline
    shares them."""

    def __init__(self) -> None:
        self._tables: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._solutions: dict[tuple[int, bytes], tuple[list[Placed], np.ndarray]] = {}
        self._plans: dict[tuple, Plan] = {}
        self._users: dict[tuple, int] = {}                  # table key -> bundles still to place with it
        self._solved: dict[tuple, list[tuple[int, bytes]]] = {}   # table key -> its placements' keys
        self.computed = 0

    def new_run(self, bundles: Sequence[Bundle] = ()) -> None:
        """A simulation starts, every member's durations set: forget the tables and placements
        of the last one (a slowdown round changes the durations of every bundle that overlaps
        communication), and count the bundles that will use each table: a table is dropped
        once its last bundle is placed. A CP16 ring's round fills up to 84 tables of some
        45 MB, of which at most 29 have bundles both placed and still to place."""
        self._tables = {}
        self._solutions = {}
        self._solved = {}
        self._users = {}
        for b in bundles:
            key = _table_key(b)
            self._users[key] = self._users.get(key, 0) + 1

    def plan(self, bundle: Bundle) -> Plan:
        """The bundle's plan, shared by every bundle of its shape."""
        got = self._plans.get(bundle.sig)
        if got is None:
            got = _plan(bundle)
            self._plans[bundle.sig] = got
        bundle.plan = got
        bundle.meetings = got.meetings     # equal: one tuple kept for every bundle of the shape
        return got

    def place(self, bundle: Bundle) -> tuple[list[Placed], int]:
        """Every member's placement once all have arrived (``bundle.arrived``), and the shift."""
        plan = bundle.plan if bundle.plan is not None else self.plan(bundle)
        key = _table_key(bundle)
        got = self._tables.get(key)
        if got is None:
            durs = [st.blocks.durs[o] for st, o in bundle.members]
            assert plan.schedule is not None
            d_rows, r_rows = _joint_tables(plan, plan.schedule, durs)
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
            s = place_narrow(d_rows, rel)
            w = np.zeros(plan.n_items, dtype=np.int64)
            if plan.rows.size:
                w[plan.rows] = s[plan.rows] - place_narrow(r_rows, rel)
            e = s + dur
            ends = [*plan.base[1:], plan.n_items]
            members = [(s[a:b], e[a:b], w[a:b]) for a, b in zip(plan.base, ends, strict=True)]
            sol = self._solutions[skey] = (members, d_rows)
            self._solved.setdefault(key, []).append(skey)
        left = self._users.get(key)
        if left is not None:
            if left > 1:
                self._users[key] = left - 1
            else:                  # its last bundle: the placements made stay with their ranks
                del self._users[key], self._tables[key]
                for done in self._solved.pop(key, ()):
                    del self._solutions[done]
        return sol[0], shift


def _table_key(bundle: Bundle) -> tuple:
    """What a bundle's tables depend on: its shape and its members' durations."""
    return bundle.sig, tuple(st.blocks.keys[o] for st, o in bundle.members)
