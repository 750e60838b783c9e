"""Where the simulated time goes: per-rank breakdown and the critical path."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from echo_et.sim.program import CAT_COMPUTE, CAT_COPY, CAT_NAMES, CAT_SYNC, COMM_CATS
from echo_et.sim.state import RankState
from echo_et.sim.symmetry import Partition

_COMPUTE_CATS = (CAT_COMPUTE, CAT_COPY)


def _row_unions(lo: np.ndarray, hi: np.ndarray, subsets: list[np.ndarray]) -> list[np.ndarray]:
    """Union length of each row's intervals [lo, hi) (2-D arrays, one row per rank), for
    each subset of the columns (a boolean mask each), with one sort for all of them: a
    column outside the subset becomes the empty interval [lo, lo), which adds nothing and,
    the columns being sorted by lo, moves no later interval's overlap."""
    rows = lo.shape[0]
    if lo.shape[1] == 0:
        return [np.zeros(rows, dtype=np.int64) for _ in subsets]
    order = np.argsort(lo, axis=1, kind="stable")
    lo = np.take_along_axis(lo, order, axis=1)
    hi = np.take_along_axis(hi, order, axis=1)
    out = []
    for mask in subsets:
        h = np.where(mask[order], hi, lo)
        run = np.maximum.accumulate(h, axis=1)
        prev = np.concatenate((lo[:, :1], run[:, :-1]), axis=1)
        add = np.clip(h - np.maximum(lo, prev), 0, None)
        add[:, 0] = np.clip(h[:, 0] - lo[:, 0], 0, None)
        out.append(add.sum(axis=1))
    return out


def _unions(lo: np.ndarray, hi: np.ndarray, subsets: list[np.ndarray]) -> list[int]:
    """:func:`_row_unions` of a single row (1-D ``lo``, ``hi``), with the same one stable sort:
    each subset's own intervals are taken in that order (leaving out the others, which as
    empty intervals add nothing and move no later overlap), so the passes over a subset run
    on its intervals only. Integer sums: the same ns as the 2-D form."""
    if lo.size == 0:
        return [0 for _ in subsets]
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    out = []
    for mask in subsets:
        keep = mask[order]
        lo_k, hi_k = lo[keep], hi[keep]
        if lo_k.size == 0:
            out.append(0)
            continue
        reach = np.maximum.accumulate(hi_k)      # the furthest end so far
        # each interval adds what it reaches past its start and past every earlier one
        add = hi_k[1:] - np.maximum(lo_k[1:], reach[:-1])
        out.append(max(0, int(hi_k[0] - lo_k[0])) + int(add[add > 0].sum()))
    return out


def _rows(rows: list, width: int) -> np.ndarray:
    """Equal-length rows of Python ints as a 2-D int64 array (``np.fromiter`` over the
    chained rows: about 1.5x faster than ``np.array`` on a list of lists, which inspects
    every element for its shape first)."""
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=len(rows) * width)
    return flat.reshape(len(rows), width)


def _arrivals(items: list[int]):
    """A function giving the arrival times of ``items`` from a rank's ``item_arrival``, as
    one C-level lookup (``itemgetter``; always a sequence, also for one item or none)."""
    if not items:
        return lambda arrival: ()
    if len(items) == 1:
        return lambda arrival: (arrival[items[0]],)
    return itemgetter(*items)


def rank_breakdowns(states: list[RankState]) -> dict[int, dict[str, int]]:
    """Step time and its breakdown (see :class:`RankResult`) for every simulated rank,
    vectorized over the ranks that run the same program."""
    out: dict[int, dict[str, int]] = {}
    by_prog: dict[int, list[RankState]] = {}
    for st in states:
        if st.blocks is not None:
            out[st.class_id] = compact_breakdown(st)
            continue
        by_prog.setdefault(id(st.program), []).append(st)
    for group in by_prog.values():
        prog = group[0].program
        if prog.n_items == 0:
            for st in group:
                out[st.class_id] = dict(step_time_ns=0, compute_ns=0, comm_ns=0, exposed_comm_ns=0, idle_ns=0,
                                        bubble_ns=0, sync_wait_ns=0, host_wait_ns=0)
            continue
        cats = np.asarray(prog.category, dtype=np.int64)
        is_comp = np.isin(cats, _COMPUTE_CATS)
        is_comm = np.isin(cats, tuple(COMM_CATS))
        sync = np.flatnonzero(cats == CAT_SYNC)
        rdv = np.array(sorted(prog.rendezvous), dtype=np.int64)
        # Columns: every item [start, end), then every rendezvous item's wait [arrival, start).
        no_wait = np.zeros(rdv.size, dtype=bool)
        subsets = [np.concatenate((is_comp, no_wait)), np.concatenate((is_comm, no_wait)),
                   np.concatenate((is_comp | is_comm, no_wait)),
                   np.concatenate((is_comp | is_comm, ~no_wait)),              # busy or waiting
                   np.concatenate((np.zeros(cats.size, dtype=bool), ~no_wait))]  # waiting
        for lo_k in range(0, len(group), 512):  # bounded memory on huge jobs
            chunk = group[lo_k:lo_k + 512]
            start = _rows([st.item_start for st in chunk], cats.size)
            end = _rows([st.item_end for st in chunk], cats.size)
            origin = np.array([st.origin_ns for st in chunk], dtype=np.int64)
            step = end.max(axis=1) - origin
            arrivals = _arrivals(rdv.tolist())
            arr = _rows([arrivals(st.item_arrival) for st in chunk], rdv.size)
            compute_ns, comm_ns, busy_ns, held_ns, wait = _row_unions(
                np.concatenate((start, arr), axis=1), np.concatenate((end, start[:, rdv]), axis=1), subsets)
            bubble = held_ns - busy_ns   # waiting for peers that nothing else hides
            if sync.size:
                dur = np.array([[st.durations[i] for i in sync.tolist()] for st in chunk], dtype=np.int64)
                host_wait = np.clip(end[:, sync] - start[:, sync] - dur, 0, None).sum(axis=1)
            else:
                host_wait = np.zeros(len(chunk), dtype=np.int64)
            for k, st in enumerate(chunk):
                out[st.class_id] = dict(
                    step_time_ns=int(step[k]),
                    compute_ns=int(compute_ns[k]),
                    comm_ns=int(comm_ns[k]),
                    exposed_comm_ns=int(busy_ns[k] - compute_ns[k]),
                    idle_ns=int(max(0, step[k] - busy_ns[k])),
                    bubble_ns=int(bubble[k]),
                    sync_wait_ns=int(wait[k]),
                    host_wait_ns=int(host_wait[k]),
                )
    return out


def _label(st: RankState, item: int) -> tuple[str, str]:
    node = st.node(item)
    cat = CAT_NAMES.get(st.program.category[item], "other")
    if node is None:
        return cat, "(host gap)"
    return cat, node.name or f"node {node.id}"


def _no_path() -> dict[str, Any]:
    return {"length_ns": 0, "rank": -1, "start_rank": -1, "start_offset_ns": 0, "by_category": {}, "top": [],
            "ranks": []}


@dataclass
class _PathWalk:
    """What the walk back along the critical path adds up."""

    contrib: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (category, name) -> [ns, count]
    by_cat: dict[str, int] = field(default_factory=dict)
    gaps: int = 0
    ranks_seen: list[int] = field(default_factory=list)

    def add(self, cat: str, name: str, ns: int, count: int = 1) -> None:
        if ns <= 0:
            return
        v = self.contrib.setdefault((cat, name), [0, 0])
        v[0] += ns
        v[1] += count
        self.by_cat[cat] = self.by_cat.get(cat, 0) + ns

    def result(self, length: int, slowest: RankState, start: RankState, top: int) -> dict[str, Any]:
        """The path's summary: the ``top`` contributors and the time by category."""
        if self.gaps:
            self.by_cat["gap"] = self.by_cat.get("gap", 0) + self.gaps
        ranked = sorted(self.contrib.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
        return {
            "length_ns": int(length),
            "rank": slowest.rank,
            # The path may begin on a rank that started later (or earlier) than the slowest
            # rank: by_category sums to length_ns - start_offset_ns.
            "start_rank": start.rank,
            "start_offset_ns": int(start.origin_ns - slowest.origin_ns),
            "by_category": dict(sorted(self.by_cat.items())),
            "top": [
                {"category": c, "name": n, "ns": int(v[0]), "count": v[1],
                 "share": round(v[0] / length, 4) if length else 0.0}
                for (c, n), v in ranked
            ],
            "ranks": self.ranks_seen,
        }


def _count_node(nodes: Counter | None, st: RankState, item: int, ns: int) -> None:
    """Count the node behind ``item`` once more on the critical path (fits use the counts)."""
    if nodes is not None and ns > 0 and st.program.node_of[item] >= 0:
        nodes[(st.program.graph_id, st.program.node_of[item])] += 1


Member = tuple[RankState, int, bool, Any]   # (state, arrival ns, is a send, item or view position)


def _meeting_of(parts: list) -> list[Member]:
    """A meeting's participants (state, item, arrival) as :data:`Member`s."""
    out: list[Member] = []
    for pst, it, t in parts:
        rv = pst.program.rendezvous.get(it)
        out.append((pst, t, rv is not None and rv.peer >= 0 and rv.is_send, it))
    return out


def decider(members: list[Member], here: RankState) -> Member:
    """The member whose arrival decided a meeting's start: the last to arrive. Of members
    that arrived together: the send of a send and its recv (the message comes from it), else
    the rank the walk is on, else the lowest rank; so that the walk does not depend on the
    order the simulator met the members in."""
    t = max(m[1] for m in members)
    tied = [m for m in members if m[1] == t]
    if len(tied) == 1:
        return tied[0]
    return next((m for m in tied if m[2]), None) or next((m for m in tied if m[0] is here), None) or \
        min(tied, key=lambda m: m[0].rank)


def _deciding_predecessor(st: RankState, item: int, t: int) -> tuple[tuple[int, bool] | None, int]:
    """The predecessor whose time plus gap equals ``t`` (the item's start): (item, whether
    the path continues from its end), or None at the rank's origin; and the gap kept."""
    prog = st.program
    p = prog.stream_prev[item]
    g = prog.stream_gap[item]
    if (st.item_end[p] if p >= 0 else st.origin_ns) + g == t:
        return ((p, True) if p >= 0 else None), g
    for q, from_start, g2 in prog.start_preds[item]:
        if (st.item_start[q] if from_start else st.item_end[q]) + g2 == t:
            return (q, not from_start), g2
    return None, g


def critical_path(states: list[RankState], part: Partition, top: int,
                  nodes: Counter | None = None) -> dict[str, Any]:
    """Walk back from the item that ends last on the slowest rank, always through the
    predecessor that decided each start (for a collective: the member that arrived last),
    and add up what lies on the way. Measured gaps kept before items (launch latency, idle
    host time between operators) count as "gap". ``nodes``, when given, counts how often each
    node (graph id, index in the graph) lies on the path with a non-zero time."""
    live = [s for s in states if s.program.n_items]
    if not live:
        return _no_path()
    st = max(live, key=lambda s: (max(s.item_end) - s.origin_ns, -s.rank))
    slowest = st
    item = max(range(st.program.n_items), key=lambda i: st.item_end[i])
    length = st.item_end[item] - st.origin_ns
    walk = _PathWalk()
    at_end = True
    guard = sum(s.program.n_items for s in states) * 2 + 10
    while guard > 0:
        guard -= 1
        if not walk.ranks_seen or walk.ranks_seen[-1] != st.rank:
            walk.ranks_seen.append(st.rank)
        if at_end:
            s, e = st.item_start[item], st.item_end[item]
            # a sync that ended when what it waited for ended (plus its return latency)
            ep = [q for q in st.program.end_waits[item]
                  if st.item_end[q] > s and st.item_end[q] + st.durations[item] == e]
            cat, name = _label(st, item)
            if ep:
                walk.add(cat, name, st.durations[item])
                _count_node(nodes, st, item, st.durations[item])
                item = ep[0]
                continue
            walk.add(cat, name, e - s)
            _count_node(nodes, st, item, e - s)
        # find what decided this item's start (or, for a rendezvous, its last arrival)
        if item in st.participants:
            st, t, _, item = decider(_meeting_of(st.participants[item]), st)
        else:
            t = st.item_start[item]
        nxt, g = _deciding_predecessor(st, item, t)
        walk.gaps += g
        if nxt is None:
            break  # reached the rank's origin
        item, at_end = nxt
    return walk.result(length, slowest, st, top)


# -- ranks whose repeat blocks were placed in closed form -----------------------------------------------
def compact_breakdown(st: RankState) -> dict[str, int]:
    """:func:`rank_breakdowns` for a rank with repeat blocks: the same unions over every item
    of the expanded step (a block's collectives meet only their own class: no wait; its sends
    and recvs wait for their partners as placed with them, ``FlatTimes.wait``)."""
    prog, run = st.program, st.blocks
    ft = run.flat(prog, st.item_start, st.item_end, keep=False)
    rdv = np.array(sorted(prog.rendezvous), dtype=np.int64)
    arr = np.array([st.item_arrival[i] for i in rdv.tolist()], dtype=np.int64)
    rstart = np.asarray(st.item_start, dtype=np.int64)[rdv] if rdv.size else np.zeros(0, dtype=np.int64)
    # the sends and recvs of linked occurrences waited for their partners: those waits too
    waited = np.flatnonzero(ft.wait > 0)
    arr = np.concatenate((arr, ft.start[waited] - ft.wait[waited]))
    rstart = np.concatenate((rstart, ft.start[waited]))
    is_comp = np.isin(ft.category, _COMPUTE_CATS)
    is_comm = np.isin(ft.category, tuple(COMM_CATS))
    no_wait = np.zeros(arr.size, dtype=bool)
    subsets = [np.concatenate((is_comp, no_wait)), np.concatenate((is_comm, no_wait)),
               np.concatenate((is_comp | is_comm, no_wait)), np.concatenate((is_comp | is_comm, ~no_wait)),
               np.concatenate((np.zeros(ft.category.size, dtype=bool), ~no_wait))]
    lo = np.concatenate((ft.start, arr))
    hi = np.concatenate((ft.end, rstart))
    compute_ns, comm_ns, busy_ns, held_ns, wait = _unions(lo, hi, subsets)
    step = int(ft.end.max()) - st.origin_ns if ft.end.size else 0
    sync = [i for i in range(prog.n_items) if prog.category[i] == CAT_SYNC]
    host_wait = sum(max(0, st.item_end[i] - st.item_start[i] - st.durations[i]) for i in sync)
    return dict(step_time_ns=step, compute_ns=compute_ns, comm_ns=comm_ns, exposed_comm_ns=busy_ns - compute_ns,
                idle_ns=max(0, step - busy_ns), bubble_ns=held_ns - busy_ns, sync_wait_ns=wait,
                host_wait_ns=host_wait)


class _FlatView:
    """A rank's items as the critical path walks them (positions are items)."""

    def __init__(self, st: RankState):
        self.st = st

    def size(self) -> int:
        return self.st.program.n_items

    def last(self):
        st = self.st
        return max(range(st.program.n_items), key=lambda i: st.item_end[i])

    def pos(self, item: int):
        return item

    def start(self, pos) -> int:
        return self.st.item_start[pos]

    def end(self, pos) -> int:
        return self.st.item_end[pos]

    def duration(self, pos) -> int:
        return self.st.durations[pos]

    def end_waits(self, pos) -> tuple:
        return self.st.program.end_waits[pos]

    def label(self, pos) -> tuple[str, str]:
        return _label(self.st, pos)

    def meeting(self, pos) -> list[Member] | None:
        """Who met at the rendezvous item ``pos`` (None: not one)."""
        parts = self.st.participants.get(pos)
        return _meeting_of(parts) if parts else None

    def decide(self, pos, t: int):
        return _deciding_predecessor(self.st, pos, t)


class _BlockView(_FlatView):
    """A rank with repeat blocks: a position is (occurrence, local item) or (-1, item)."""

    def __init__(self, st: RankState):
        super().__init__(st)
        self.run = st.blocks
        self.info = st.blocks.info
        self.last_input = -1

    def size(self) -> int:
        return self.info.expanded_items + len(self.info.occurrences)

    def last(self):
        ft = self.run.flat(self.st.program, self.st.item_start, self.st.item_end)
        k = int(np.argmax(ft.end))
        return int(ft.occ[k]), int(ft.ref[k])

    def pos(self, item: int):
        return self.info.port_of.get(item, (-1, item))

    def start(self, pos) -> int:
        o, i = pos
        if o < 0:
            return self.st.item_start[i]
        s, _, shift = self.run.relative_times(o)
        return int(s[i]) + shift

    def end(self, pos) -> int:
        o, i = pos
        if o < 0:
            return self.st.item_end[i]
        _, e, shift = self.run.relative_times(o)
        return int(e[i]) + shift

    def duration(self, pos) -> int:
        o, i = pos
        return self.st.durations[i] if o < 0 else int(self.run.durs[o][i])

    def end_waits(self, pos) -> tuple:
        o, i = pos
        return tuple(self.pos(q) for q in self.st.program.end_waits[i]) if o < 0 else ()

    def label(self, pos) -> tuple[str, str]:
        o, i = pos
        if o < 0:
            return _label(self.st, i)
        occ = self.info.occurrences[o]
        node = occ.block.nodes[i]
        return CAT_NAMES.get(occ.block.category[i], "other"), node.name or f"node {node.id + occ.offset}"

    def meeting(self, pos) -> list[Member] | None:
        """A skeleton item's meeting, or a linked occurrence's collective, send or recv and
        the members it met (an eager send waits for nobody: None)."""
        o, i = pos
        if o < 0:
            parts = self.st.participants.get(i)
            return _meeting_of(parts) if parts else None
        link = self.run.links.get(o)
        if link is None:
            return None
        bundle = link.bundle
        k = bundle.plan.meeting_of.get((link.member, i))
        if k is None:
            return None
        mt = bundle.meetings[k]
        if mt.eager and mt.sends[mt.ends.index((link.member, i))]:
            return None
        out: list[Member] = []
        for (m, j), send in zip(mt.ends, mt.sends, strict=True):
            st2, o2 = bundle.members[m]
            run2 = st2.blocks
            s2, _, shift2 = run2.relative_times(o2)
            out.append((st2, int(s2[j] - run2.waits(o2)[j]) + shift2, send, (o2, j)))
        return out

    def _input(self, occ, j: int, from_start: bool, t: int):
        q, _ = occ.inputs[j]
        if q < 0:
            got, hit = None, self.st.origin_ns == t
        else:
            p = self.pos(q)
            got, hit = (p, not from_start), (self.start(p) if from_start else self.end(p)) == t
        if hit:
            self.last_input = j      # the walk leaves the occurrence through input j
        return got, hit

    def segment_key(self, pos, at_end: bool):
        """What the walk through occurrence ``pos[0]`` from ``pos`` depends on: the block's
        table, the entry, and the inputs that decide some item's start (relative to the
        earliest of them; an input that decides nothing never matches a start the walk
        compares it with). None when a label would name the copy's own id."""
        o, i = pos
        occ = self.info.occurrences[o]
        if not occ.block.all_named or o in self.run.links:
            return None     # a linked occurrence's walk may leave it for a partner's: walked item by item
        run = self.run
        x = run.x[o]
        m = run.tables.table(occ, run.durs[o], run.keys[o]) + x[None, :]
        rel = (m == m.max(axis=1)[:, None]).any(axis=0)
        base = int(x[rel].min())
        return (occ.sig, run.keys[o], i, at_end,
                tuple((int(x[j]) - base if rel[j] else None, occ.inputs[j][0] < 0) for j in range(x.size)))

    def input_exit(self, o: int, j: int):
        """Where the walk goes when it leaves occurrence ``o`` through input ``j``."""
        q, fs = self.info.occurrences[o].inputs[j]
        return None if q < 0 else (self.pos(q), not fs)

    def decide(self, pos, t: int):
        o, i = pos
        st = self.st
        if o < 0:
            prog = st.program
            p = prog.stream_prev[i]
            if (st.item_end[p] if p >= 0 else st.origin_ns) == t:
                return ((self.pos(p), True) if p >= 0 else None), 0
            for q, from_start, _ in prog.start_preds[i]:
                if (st.item_start[q] if from_start else st.item_end[q]) == t:
                    return (self.pos(q), not from_start), 0
            return None, 0
        occ = self.info.occurrences[o]
        blk = occ.block
        s, e, shift = self.run.relative_times(o)
        tr = t - shift      # t in the occurrence's relative times (its own items' are relative)
        p = blk.stream_prev[i]
        if p >= 0:
            if int(e[p]) == tr:
                return ((o, p), True), 0
        else:
            got, hit = self._input(occ, blk.streams.index(blk.stream[i]), False, t)
            if hit:
                return got, 0
        outside = [(j, fs) for local, j, fs in occ.outside_all if local == i]
        k = 0
        for is_out, ref, fs in blk.dep_order[i]:
            if is_out:
                if k >= len(outside):
                    continue
                j, fs2 = outside[k]
                k += 1
                if j < 0:
                    continue
                got, hit = self._input(occ, j, fs2, t)
                if hit:
                    return got, 0
            elif int(s[ref] if fs else e[ref]) == tr:
                return ((o, ref), not fs), 0
        for j, fs2 in outside[k:]:
            if j >= 0:
                got, hit = self._input(occ, j, fs2, t)
                if hit:
                    return got, 0
        return None, 0


def _view(st: RankState) -> _FlatView:
    return _BlockView(st) if st.blocks is not None else _FlatView(st)


def critical_path_blocks(states: list[RankState], part: Partition, top: int) -> dict[str, Any]:
    """:func:`critical_path` when some rank's repeat blocks were placed in closed form: the
    same walk, through each occurrence's items."""
    views = {id(s): _view(s) for s in states}
    live = [s for s in states if s.program.n_items]
    if not live:
        return _no_path()
    st = max(live, key=lambda s: (max(s.item_end) - s.origin_ns, -s.rank))
    slowest = st
    view = views[id(st)]
    pos = view.last()
    length = view.end(pos) - st.origin_ns
    walk = _PathWalk()
    at_end = True
    guard = sum(views[id(s)].size() for s in states) * 2 + 10
    # The walk through an occurrence is the same for every occurrence with the same segment
    # key: it is walked once, then its contributions are added and the walk jumps to its exit.
    memo: dict[tuple, tuple[dict[tuple[str, str], list[int]], int, int]] = {}
    seg: tuple | None = None          # (key, occurrence, contributions, steps) being recorded
    while guard > 0:
        guard -= 1
        if not walk.ranks_seen or walk.ranks_seen[-1] != st.rank:
            walk.ranks_seen.append(st.rank)
        if seg is None and isinstance(view, _BlockView) and pos[0] >= 0:
            key = view.segment_key(pos, at_end)
            if key is not None:
                got = memo.get(key)
                if got is not None:
                    adds, steps, j = got
                    for (cat, name), (ns, count) in adds.items():
                        walk.add(cat, name, ns, count)
                    guard -= steps
                    nxt = view.input_exit(pos[0], j) if j >= 0 else None
                    if nxt is None:
                        break
                    pos, at_end = nxt
                    continue
                seg = (key, pos[0], {}, [0])
        if seg is not None:
            seg[3][0] += 1
        if at_end:
            s, e = view.start(pos), view.end(pos)
            d = view.duration(pos)
            ep = [q for q in view.end_waits(pos) if view.end(q) > s and view.end(q) + d == e]
            cat, name = view.label(pos)
            if ep:
                walk.add(cat, name, d)
                pos = ep[0]
                continue
            walk.add(cat, name, e - s)
            if seg is not None and e - s > 0:
                v = seg[2].setdefault((cat, name), [0, 0])
                v[0] += e - s
                v[1] += 1
        parts = view.meeting(pos)
        if parts:
            st, t, _, where = decider(parts, st)
            view = views[id(st)]
            pos = where if isinstance(where, tuple) else view.pos(where)
        else:
            t = view.start(pos)
        if seg is not None:
            view.last_input = -1
        nxt, g = view.decide(pos, t)
        walk.gaps += g
        if seg is not None and (nxt is None or nxt[0][0] != seg[1]):
            memo[seg[0]] = (seg[2], seg[3][0], view.last_input)
            seg = None
        if nxt is None:
            break
        pos, at_end = nxt
    return walk.result(length, slowest, st, top)
