"""The simulated step as timeline events, in the layout of ``echo-et export chrome``.

The simulator does not import converters (docs/architecture.md), so it yields the IR's
:class:`echo_et.ir.timeline.TimelineEvent`; the CLI (or a user) writes them with
``echo_et.converters.chrome.write_timeline``, so a simulated and a measured trace open side
by side in Perfetto with the same processes, tracks and names::

    from echo_et.converters.chrome import write_timeline
    write_timeline(result.timeline_events(), "sim.json")

Layout (the exporter's): one process per rank; one track per stream named after it (host
threads first, then compute, communication, copy); one box per node at its simulated start
and end (job clock, ns); collectives named "<type> <bytes>" with exact bytes, group, group
id and size and sequence number in args, sends/recvs "send to|recv from <peer> <bytes>".
Added by the simulator: the time a collective or P2P waited for its last member is its own
box "wait: <name>" (category "wait") just before it, and ``args.wait_ns`` on the operation.
Ranks that share a representative's timeline (symmetry) get that timeline.
"""

from __future__ import annotations

from collections.abc import Iterator

from echo_et.ir.labels import node_label, node_track
from echo_et.ir.timeline import TimelineEvent


def _rank_events(rank: int, st) -> Iterator[TimelineEvent]:
    prog = st.prog
    streams = {s.id: s for s in prog.streams}
    for idx, node in enumerate(st.graph.nodes):
        s_it, e_it = prog.node_start_item[idx], prog.node_end_item[idx]
        if s_it < 0 or e_it < 0:
            continue
        t0, t1 = st.start[s_it], st.end[e_it]
        name, args = node_label(node, st.keygroup.__getitem__)
        track, order, category = node_track(node, streams, args)
        if s_it in st.arrive:
            wait = t0 - st.arrive[s_it]
            args["wait_ns"] = wait
            if wait > 0:
                yield TimelineEvent(rank=rank, track=track, name=f"wait: {name}", start_ns=st.arrive[s_it],
                                    duration_ns=wait, category="wait", track_order=order,
                                    args={"id": node.id})
        yield TimelineEvent(rank=rank, track=track, name=name, start_ns=t0, duration_ns=max(0, t1 - t0),
                            category=category, track_order=order, args=args)


def timeline_events(result, ranks: list[int] | None = None) -> Iterator[TimelineEvent]:
    """The boxes of every (chosen) rank, from the result's :class:`SimTimeline`."""
    if result.timeline is None:
        raise ValueError("this result holds no timeline")
    tl = result.timeline
    by_class = {st.cls: st for st in tl.states}
    for rank in sorted(tl.partition.class_of) if ranks is None else sorted(set(ranks)):
        yield from _rank_events(rank, by_class[tl.partition.class_of[rank]])
