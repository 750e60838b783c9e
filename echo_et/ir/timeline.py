"""A timeline box: what ran, on which rank and stream, when (job clock, ns).

The one event type that the measured timeline of a Job (``echo_et.converters.chrome``) and
the simulated one (``echo_et.sim.timeline``) both produce, and the one function that makes
them from a graph (:func:`graph_events`); it lives in the IR, below both, so the simulator
never imports a converter. The writer, which turns events into Kineto's trace schema, is
``echo_et.converters.chrome.write_timeline``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from echo_et.ir.graph import Graph
from echo_et.ir.labels import kineto_category, node_label, node_track
from echo_et.ir.schema import pb


@dataclass(frozen=True)
class TimelineStream:
    """The stream a box runs on, as the graph declares it."""

    id: int
    name: str
    kind: int = pb.STREAM_UNKNOWN     # pb StreamKind
    device: int = -1                  # GPU index, -1 unknown or a host thread
    native_id: int = 0                # the tid / CUDA stream id the source trace used, 0 unknown


@dataclass(frozen=True)
class TimelineEvent:
    """One box on a timeline: what ran, on which rank and track, when (job clock, ns).

    ``category`` is Kineto's (``cpu_op``, ``cuda_runtime``, ``kernel``, ``gpu_memcpy``,
    ``gpu_memset``, ``user_annotation``), see :func:`echo_et.ir.labels.kineto_category`.
    The fields after ``args`` say which node the box shows; a box made by hand may leave
    them at their defaults."""

    rank: int
    track: str                  # track (thread) name, e.g. the stream name
    name: str
    start_ns: int
    duration_ns: int
    category: str = ""
    track_order: int = 0        # tracks of a rank are sorted by (track_order, track)
    args: Mapping[str, object] = field(default_factory=dict)
    kind: int = 0               # pb NodeKind of the node (0: not a node)
    stream: TimelineStream | None = None
    node_id: int = 0
    launch_id: int = 0          # node id of the KIND_LAUNCH call that issued it, 0 none


# (start, end, wait) of a node in job-clock ns; wait: the part of a collective or P2P spent
# waiting for its last member (None for other nodes). None when the node did not run.
NodeSpan = tuple[int, int, int | None]


def graph_events(rank: int, graph: Graph, span_of: Callable[[int], NodeSpan | None],
                 group_of: Callable[[str], pb.ProcessGroup]) -> Iterator[TimelineEvent]:
    """The boxes of one rank's ``graph``: ``span_of(index in graph.nodes)`` gives each node's
    times (measured or simulated), ``group_of(key)`` resolves a group key for the rank.

    A collective or P2P box spans its wait and its transfer, as a profiler records the
    kernel (it is launched, waits for its peers inside, then moves data); ``wait_ns`` in
    its args says how much of it was waiting."""
    kinds = {n.id: n.kind for n in graph.nodes}

    def spans() -> Iterator[tuple[pb.Node, NodeSpan]]:
        for idx, node in enumerate(graph.nodes):
            span = span_of(idx)
            if span is not None:
                yield node, span

    return node_events(rank, spans(), graph.header.streams, kinds.get, group_of)


def node_events(rank: int, nodes: Iterable[tuple[pb.Node, NodeSpan]], streams: Iterable[pb.Stream],
                kind_of: Callable[[int], int | None],
                group_of: Callable[[str], pb.ProcessGroup]) -> Iterator[TimelineEvent]:
    """:func:`graph_events` for chosen nodes of a rank's graph (each with its span, in the
    order given): ``streams`` are the graph header's, ``kind_of(node id)`` the kind of any
    node of the graph (None: no such node), which finds the launch that issued a kernel."""
    by_id = {s.id: s for s in streams}
    tstreams: dict[int, TimelineStream] = {}
    for node, span in nodes:
        yield node_event(rank, node, span, by_id, tstreams, group_of, launch_of(node, kind_of))


def launch_of(node: pb.Node, kind_of: Callable[[int], int | None]) -> int:
    """The id of the ``KIND_LAUNCH`` call that issued ``node`` (its first launch dependency
    on a launch node; ``kind_of`` gives a node's kind by id), 0 when none."""
    for d in node.deps:
        if d.kind == pb.DEP_LAUNCH and kind_of(d.id) == pb.KIND_LAUNCH:
            return d.id
    return 0


def node_event(rank: int, node: pb.Node, span: NodeSpan, streams: dict[int, pb.Stream],
               tstreams: dict[int, TimelineStream], group_of: Callable[[str], pb.ProcessGroup],
               launch: int) -> TimelineEvent:
    """The box of one node that ran over ``span``: what :func:`node_events` yields for it,
    for a writer that walks a graph's nodes itself (``streams`` by id; ``tstreams`` caches
    the timeline streams by stream id; ``launch``: :func:`launch_of`)."""
    start, end, wait = span
    name, args = node_label(node, group_of)
    track, order, _ = node_track(node, streams, args)
    if wait is not None:
        args["wait_ns"] = wait
    ts = tstreams.get(node.stream)
    if ts is None:
        s = streams.get(node.stream)
        ts = (TimelineStream(s.id, track, s.kind, s.device, s.native_id) if s is not None
              else TimelineStream(node.stream, track))
        tstreams[node.stream] = ts
    return TimelineEvent(rank=rank, track=track, name=name, start_ns=start, duration_ns=max(0, end - start),
                         category=kineto_category(node.kind, ts.kind), track_order=order, args=args,
                         kind=node.kind, stream=ts, node_id=node.id, launch_id=launch)
