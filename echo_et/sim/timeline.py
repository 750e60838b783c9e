"""The simulated step as timeline events, in the layout of ``echo-et export chrome``.

The simulator does not import converters (docs/architecture.md), so it yields the IR's
:class:`echo_et.ir.timeline.TimelineEvent`, made by the same function as the measured
timeline (:func:`echo_et.ir.timeline.graph_events`); the CLI (or a user) writes them in
Kineto's trace schema with ``echo_et.converters.chrome.write_timeline``, so a simulated and
a measured step open side by side in Perfetto and HolisticTraceAnalysis::

    from echo_et.converters.chrome import write_timeline
    write_timeline(result.timeline_events(), "sim-trace", job=job)   # rank-<R>.json each

A collective or send/recv box starts when its rank reached it (as the profiler records an
NCCL kernel, which spins until its peers arrive) and ends when its transfer ends;
``args.wait_ns`` is the part spent waiting for the last member. Ranks that share a
representative's timeline (symmetry) get that timeline.

A rank whose repeat blocks were placed in closed form (``SimOptions(repeats=True)``, the
default in predict mode) has the same timeline as when simulated node by node: each
occurrence's nodes take the times its placement gives them (a block's collectives meet only
their own rank class, so they wait 0, but where the occurrence was placed with those of other
ranks it meets, :mod:`echo_et.sim.linked_blocks`), and only the nodes whose box is written are
expanded into messages. ``until_ns`` keeps the boxes that start before it (a prefix of the
step), and :func:`window_end` finds the prefix that holds at most a number of boxes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from echo_et.ir.repeats import copy_node, instance_deps
from echo_et.ir.schema import pb
from echo_et.ir.timeline import NodeSpan, TimelineEvent, graph_events, node_events
from echo_et.sim.state import RankState

_COMM = (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)
_CHUNK = 1 << 16


def _node_span(st: RankState, idx: int) -> NodeSpan | None:
    span = st.node_span(idx)
    if span is None:
        return None
    start, end = span
    arrival = st.item_arrival.get(st.program.node_start_item[idx])
    if arrival is None:
        return start, end, None
    return arrival, end, start - arrival


@dataclass
class _Boxes:
    """Every box of one simulated rank, in node-id order: where its node is (``occ`` -1 and
    ``ref`` its index in the stored (flat: expanded) nodes; or local item ``ref`` of
    occurrence ``occ``), and the box's start, end and wait (-1: none) in job-clock ns."""

    ids: np.ndarray
    occ: np.ndarray
    ref: np.ndarray
    start: np.ndarray
    end: np.ndarray
    wait: np.ndarray


def _flat_starts(st: RankState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node indices, start, wait -1 none) of a flat rank's boxes: what
    :func:`_node_span` gives them."""
    prog = st.program
    s_it = np.asarray(prog.node_start_item, dtype=np.int64)
    e_it = np.asarray(prog.node_end_item, dtype=np.int64)
    idx = np.flatnonzero((s_it >= 0) & (e_it >= 0))
    starts = np.asarray(st.item_start, dtype=np.int64)
    start = starts[s_it[idx]] if idx.size else np.zeros(0, dtype=np.int64)
    wait = np.full(idx.size, -1, dtype=np.int64)
    arrival = st.item_arrival
    if arrival:
        items = s_it[idx].tolist()
        for k, it in enumerate(items):
            a = arrival.get(it)
            if a is not None:
                wait[k] = start[k] - a
                start[k] = a
    return idx, start, wait


def _flat_boxes(st: RankState) -> _Boxes:
    idx, start, wait = _flat_starts(st)
    e_it = np.asarray(st.program.node_end_item, dtype=np.int64)
    end = np.asarray(st.item_end, dtype=np.int64)[e_it[idx]] if idx.size else np.zeros(0, dtype=np.int64)
    ids = np.asarray([st.graph.nodes[i].id for i in idx.tolist()], dtype=np.int64)
    return _Boxes(ids, np.full(idx.size, -1, dtype=np.int64), idx, start, end, wait)


def _compact_boxes(st: RankState) -> _Boxes:
    prog, run = st.program, st.blocks
    info = prog.compact
    ft = run.flat(prog, st.item_start, st.item_end, keep=False)   # every rank's kept: GBs at CP16
    stored = st.graph.stored_nodes
    start, end = ft.start.copy(), ft.end.copy()
    wait = np.full(start.size, -1, dtype=np.int64)
    ref = ft.ref.copy()
    ids = np.empty(start.size, dtype=np.int64)
    sk = np.flatnonzero(ft.occ < 0)
    node_of = np.asarray(prog.node_of, dtype=np.int64)
    stored_ids = np.fromiter((n.id for n in stored), dtype=np.int64, count=len(stored))
    ref[sk] = node_of[ft.ref[sk]]
    ids[sk] = stored_ids[ref[sk]]
    arrival = st.item_arrival
    for k, it in zip(sk.tolist(), ft.ref[sk].tolist(), strict=True):
        a = arrival.get(it)
        if a is not None:
            wait[k] = start[k] - a
            start[k] = a
    bl = np.flatnonzero(ft.occ >= 0)
    if bl.size:
        # a block's communication meets its own rank class (everyone arrives at once) or, in
        # an occurrence placed with others, waits as placed (FlatTimes.wait)
        base, at = [], 0
        for blk in info.blocks:
            base.append(at)
            at += blk.n
        body_ids = np.concatenate([np.asarray(blk.ids, dtype=np.int64) for blk in info.blocks])
        body_comm = np.concatenate([np.isin(np.fromiter((n.kind for n in blk.nodes), dtype=np.int64,
                                                        count=blk.n), _COMM) for blk in info.blocks])
        occ_base = np.asarray([base[o.block.index] for o in info.occurrences], dtype=np.int64)
        occ_offset = np.asarray([o.offset for o in info.occurrences], dtype=np.int64)
        o = ft.occ[bl]
        pos = occ_base[o] + ft.ref[bl]
        ids[bl] = body_ids[pos] + occ_offset[o]
        comm = bl[body_comm[pos]]
        wait[comm] = ft.wait[comm]        # 0 but in linked occurrences (their partners' arrivals)
        start[comm] -= wait[comm]
    order = np.argsort(ids, kind="stable")
    return _Boxes(ids[order], ft.occ[order], ref[order], start[order], end[order], wait[order])


def _boxes(st: RankState) -> _Boxes:
    return _compact_boxes(st) if st.blocks is not None else _flat_boxes(st)


def _compact_events(rank: int, st: RankState, boxes: _Boxes, keep: np.ndarray,
                    group_of: Callable[[str], pb.ProcessGroup]) -> Iterator[TimelineEvent]:
    """The boxes ``keep`` (positions in ``boxes``) of a rank with repeat blocks, each copy
    made as its box is written."""
    info = st.program.compact
    graph = st.graph
    stored = graph.stored_nodes
    bodies = graph.bodies()
    kinds = {n.id: n.kind for n in stored}
    ranges = sorted((blk.ids[0] + occ.offset, blk.ids[-1] + occ.offset, o)
                    for o, occ in enumerate(info.occurrences) for blk in (occ.block,))
    firsts = [r[0] for r in ranges]

    def kind_of(node_id: int) -> int | None:
        got = kinds.get(node_id)
        if got is not None:
            return got
        j = bisect.bisect_right(firsts, node_id) - 1
        if j < 0 or node_id > ranges[j][1]:
            return None
        occ = info.occurrences[ranges[j][2]]
        local = occ.block.local_of.get(node_id - occ.offset)
        return None if local is None else occ.block.nodes[local].kind

    deps: dict[int, dict[int, list[tuple[int, int]]]] = {}

    def chunks() -> Iterator[tuple[int, int, int, int, int]]:
        # a block of boxes at a time as Python numbers (all of them would be ~180 bytes a box)
        for a in range(0, keep.size, _CHUNK):
            k = keep[a:a + _CHUNK]
            yield from zip(boxes.occ[k].tolist(), boxes.ref[k].tolist(), boxes.start[k].tolist(),
                           boxes.end[k].tolist(), boxes.wait[k].tolist(), strict=True)

    def spans() -> Iterator[tuple[pb.Node, NodeSpan]]:
        for o, r, s, e, w in chunks():
            span = (s, e, None if w < 0 else w)
            if o < 0:
                yield stored[r], span
                continue
            occ = info.occurrences[o]
            node = occ.block.nodes[r]
            if occ.instance is None:
                yield node, span
                continue
            got = deps.get(o)
            if got is None:
                got = deps[o] = instance_deps(occ.instance)
            yield copy_node(bodies[occ.block.index], node, occ.instance, got), span

    return node_events(rank, spans(), graph.header.streams, kind_of, group_of)


def _rank_events(rank: int, st: RankState, group_of, until_ns: int | None) -> Iterator[TimelineEvent]:
    if st.blocks is None and until_ns is None:
        yield from graph_events(rank, st.graph, lambda idx: _node_span(st, idx), group_of)
        return
    boxes = _boxes(st)
    keep = np.arange(boxes.ids.size) if until_ns is None else np.flatnonzero(boxes.start < until_ns)
    if st.blocks is None:
        chosen = set(boxes.ref[keep].tolist())
        yield from graph_events(rank, st.graph,
                                lambda idx: _node_span(st, idx) if idx in chosen else None, group_of)
        return
    yield from _compact_events(rank, st, boxes, keep, group_of)


def _chosen(result, ranks: list[int] | None) -> list[int]:
    if result.timeline is None:
        raise ValueError("this result holds no timeline")
    tl = result.timeline
    known = set(tl.ranks)
    chosen = tl.ranks if ranks is None else sorted(set(ranks))
    for rank in chosen:
        if rank not in known:
            raise ValueError(f"rank {rank} is not in the simulated job")
    return chosen


def timeline_events(result, ranks: list[int] | None = None, *,
                    until_ns: int | None = None) -> Iterator[TimelineEvent]:
    """The boxes of every (chosen) rank, from the result's :class:`SimTimeline`; with
    ``until_ns``, only those that start before it (job clock)."""
    tl = result.timeline
    for rank in _chosen(result, ranks):
        yield from _rank_events(rank, tl.state_of(rank), tl.group_of(rank), until_ns)


def first_start(result, ranks: list[int] | None = None, *, until_ns: int | None = None) -> int | None:
    """The earliest start (job clock, ns) of the boxes ``timeline_events(result, ranks,
    until_ns=until_ns)`` gives, None when it gives none: their trace's time 0, found from
    the simulated times without making a box, so that a writer can write each rank's boxes
    as they come (``write_timeline(..., origin_ns=...)``)."""
    tl = result.timeline
    low: int | None = None
    by_state: dict[int, int | None] = {}   # ranks of one class share their representative's state
    for r in _chosen(result, ranks):
        st = tl.state_of(r)
        if id(st) not in by_state:
            starts = _compact_boxes(st).start if st.blocks is not None else _flat_starts(st)[1]
            if until_ns is not None:
                starts = starts[starts < until_ns]
            by_state[id(st)] = int(starts.min()) if starts.size else None
        got = by_state[id(st)]
        if got is not None and (low is None or got < low):
            low = got
    return low


def _earliest(starts: np.ndarray, max_boxes: int | None) -> tuple[np.ndarray, int | None]:
    """(the ``max_boxes + 1`` earliest of ``starts``, sorted; the earliest start later than
    the first, None when every box starts at once)."""
    if max_boxes is None or starts.size == 0:
        return starts[:0], None
    early = np.sort(np.partition(starts, min(max_boxes, starts.size - 1))[:max_boxes + 1])
    later = starts[starts > early[0]]
    return early, (int(later.min()) if later.size else None)


def window_end(result, ranks: list[int] | None, max_boxes: int | None) -> tuple[int | None, int]:
    """(``t``, the boxes of ``ranks`` in the whole step): ``t`` is the latest time (job
    clock, ns) such that at most ``max_boxes`` of them start before it, None when every box
    fits (or ``max_boxes`` is None). With ``until_ns=t``, :func:`timeline_events` gives the
    longest prefix of the step within that many boxes; when more than ``max_boxes`` start
    at the step's first instant, the prefix is those boxes (never empty)."""
    if max_boxes is not None and max_boxes < 1:
        raise ValueError(f"max_boxes must be >= 1, got {max_boxes}")
    tl = result.timeline
    # per rank class: how many chosen ranks share it, its box count, and its earliest starts
    # (the max_boxes + 1 earliest, sorted: all the cut can need) and its earliest start after
    # its first; not every box's start (8 bytes a box: a GB at CP16)
    classes: dict[int, list] = {}
    total = 0
    for r in _chosen(result, ranks):
        st = tl.state_of(r)
        got = classes.get(id(st))
        if got is None:
            starts = _boxes(st).start
            got = classes[id(st)] = [0, int(starts.size), *_earliest(starts, max_boxes)]
        got[0] += 1
        total += got[1]
    if max_boxes is None or total <= max_boxes:
        return None, total
    every = np.concatenate([np.repeat(early, times) for times, _, early, _ in classes.values()])
    # the (max_boxes+1)-th earliest start: at most max_boxes boxes start before it
    cut = int(np.partition(every, max_boxes)[max_boxes])
    first = int(every.min())
    if cut <= first:
        # more than max_boxes start at the step's first instant: those, not an empty prefix
        next_ones = [int(early[0]) if int(early[0]) > first else after
                     for _, _, early, after in classes.values() if early.size]
        later = [t for t in next_ones if t is not None]
        return (min(later), total) if later else (None, total)
    return cut, total
