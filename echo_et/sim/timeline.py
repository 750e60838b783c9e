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
"""

from __future__ import annotations

from collections.abc import Iterator

from echo_et.errors import EchoError
from echo_et.ir.timeline import NodeSpan, TimelineEvent, graph_events
from echo_et.sim.state import RankState


def _node_span(st: RankState, idx: int) -> NodeSpan | None:
    span = st.node_span(idx)
    if span is None:
        return None
    start, end = span
    arrival = st.item_arrival.get(st.program.node_start_item[idx])
    if arrival is None:
        return start, end, None
    return arrival, end, start - arrival


def _rank_events(rank: int, st: RankState, group_of) -> Iterator[TimelineEvent]:
    if st.blocks is not None:
        raise EchoError("this simulation placed repeat blocks in closed form and keeps no per-node "
                        "times; simulate with SimOptions(repeats=False) for a timeline")
    yield from graph_events(rank, st.graph, lambda idx: _node_span(st, idx), group_of)


def timeline_events(result, ranks: list[int] | None = None) -> Iterator[TimelineEvent]:
    """The boxes of every (chosen) rank, from the result's :class:`SimTimeline`."""
    if result.timeline is None:
        raise ValueError("this result holds no timeline")
    tl = result.timeline
    known = set(tl.ranks)
    for rank in tl.ranks if ranks is None else sorted(set(ranks)):
        if rank not in known:
            raise ValueError(f"rank {rank} is not in the simulated job")
        yield from _rank_events(rank, tl.state_of(rank), tl.group_of(rank))
