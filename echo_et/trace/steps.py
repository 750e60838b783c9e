"""Combine several measured steps of one rank into one graph with the least noise.

Timings taken on a busy machine carry noise that only adds time (another process on the
core, a slower core, a cache flushed by a neighbour), so the shortest of several
measurements of the same piece of work is the best estimate of what it costs. The tracer
can profile K steps of a rank (``echo-et trace --steps K``); this module keeps the fastest
step as the reference timeline and gives each piece of it the shortest time that piece had
in any step:

- the *self time* of every operator (its duration less that of the operators it encloses,
  DEP_CONTROL nesting): the time saved is taken out of the operator's own stretches, in
  proportion to their lengths, so nesting and order are kept;
- the *gap* before every top-level operator on a host thread (host overhead between
  operators).

Each saving compresses its stretch evenly and moves everything after it earlier, on every
stream, so no two events change order (see :class:`_Squeeze`); durations of enclosing
operators shrink by what they contain. The inputs are not modified.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence

from echo_et.errors import EchoError
from echo_et.ir import Graph
from echo_et.ir.schema import pb


def step_span_ns(graph: Graph) -> int:
    """First start to last end over all nodes (0 for an empty graph)."""
    if not len(graph):
        return 0
    return max(n.start_ns + n.duration_ns for n in graph) - min(n.start_ns for n in graph)


def _parents(graph: Graph) -> list[int]:
    """Index of each node's enclosing node (-1 for top level)."""
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    out = []
    for n in graph.nodes:
        p = next((d.id for d in n.deps if d.kind == pb.DEP_CONTROL), None)
        out.append(index.get(p, -1) if p is not None else -1)
    return out


def _self_times(graph: Graph, children: list[list[int]]) -> list[int]:
    nodes = graph.nodes
    return [max(0, n.duration_ns - sum(nodes[c].duration_ns for c in children[i]))
            for i, n in enumerate(nodes)]


def _gaps(graph: Graph, tops: dict[int, list[int]]) -> dict[int, int]:
    """Host gap before each top-level node after the first on its thread."""
    nodes = graph.nodes
    out: dict[int, int] = {}
    for order in tops.values():
        end = None
        for i in order:
            n = nodes[i]
            if end is not None:
                out[i] = max(0, n.start_ns - end)
            end = n.start_ns + n.duration_ns if end is None else max(end, n.start_ns + n.duration_ns)
    return out


def _check_same_program(graphs: Sequence[Graph], where: str) -> None:
    shape = [(n.kind, n.name, n.stream) for n in graphs[0]]
    for k, g in enumerate(graphs[1:], start=2):
        other = [(n.kind, n.name, n.stream) for n in g]
        if other != shape:
            at = next((i for i, (a, b) in enumerate(zip(shape, other, strict=False)) if a != b),
                      min(len(shape), len(other)))
            raise EchoError(f"{where}measured step {k} runs different operators from step 1 "
                            f"({len(other)} vs {len(shape)} nodes, first difference at node "
                            f"{at}); the workload is not repeatable, trace it with one "
                            "measured step")


def fastest_per_op(graphs: Sequence[Graph], *, where: str = "") -> Graph:
    """One graph from several measured steps of the same program (see the module
    docstring). The steps must run the same operators in the same order on the same
    streams, else the workload is not repeatable and a clear error is raised."""
    prefix = f"{where}: " if where else ""
    if not graphs:
        raise EchoError(f"{prefix}no measured step to combine")
    _check_same_program(graphs, prefix)
    ref_index = min(range(len(graphs)), key=lambda i: (step_span_ns(graphs[i]), i))
    out = graphs[ref_index].copy()
    if len(graphs) == 1:
        return out
    nodes = out.nodes
    parent = _parents(out)
    children: list[list[int]] = [[] for _ in nodes]
    for i, p in enumerate(parent):
        if p >= 0:
            children[p].append(i)
    for c in children:
        c.sort(key=lambda i: (nodes[i].start_ns, i))
    host = {s.id for s in out.header.streams if s.kind == pb.STREAM_CPU_THREAD}
    tops: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        if parent[i] < 0 and n.stream in host:
            tops[n.stream].append(i)
    for order in tops.values():
        order.sort(key=lambda i: (nodes[i].start_ns, i))

    selfs = [_self_times(g, children) for g in graphs]
    gaps = [_gaps(g, tops) for g in graphs]
    busy: dict[int, int] = defaultdict(int)
    for i, n in enumerate(nodes):
        if parent[i] < 0:
            busy[n.stream] += n.duration_ns
    rank_of_stream = {sid: k for k, sid in enumerate(sorted(busy, key=lambda x: (-busy[x], x)))}
    wanted: list[tuple[int, int, int, int]] = []   # (stream rank, start, end, ns saved)
    for i, n in enumerate(nodes):
        prio = rank_of_stream.get(n.stream, len(rank_of_stream))
        saved = selfs[ref_index][i] - min(s[i] for s in selfs)
        if saved > 0:
            # The operator's own stretches: before, between and after what it encloses.
            marks = [n.start_ns]
            for c in children[i]:
                marks += [nodes[c].start_ns, nodes[c].start_ns + nodes[c].duration_ns]
            marks.append(n.start_ns + n.duration_ns)
            spans = [(marks[j], marks[j + 1]) for j in range(0, len(marks), 2)
                     if marks[j + 1] > marks[j]]
            total = sum(b - a for a, b in spans)
            if total > 0:
                saved = min(saved, total)
                left = saved
                for j, (a, b) in enumerate(spans):
                    part = left if j == len(spans) - 1 else saved * (b - a) // total
                    part = min(part, b - a, left)
                    if part > 0:
                        wanted.append((prio, a, b, part))
                        left -= part
        g = gaps[ref_index].get(i)
        if g:
            best = min(gs.get(i, g) for gs in gaps)
            if best < g:
                wanted.append((prio, n.start_ns - g, n.start_ns, g - best))
    squeeze = _Squeeze(wanted)
    if not squeeze:
        return out
    for n in nodes:
        start = squeeze(n.start_ns)
        n.duration_ns = max(0, squeeze(n.start_ns + n.duration_ns) - start)
        n.start_ns = max(0, start)
    return out


class _Squeeze:
    """The old timeline -> the new one: each accepted stretch [a, b] that saves s ns is
    compressed evenly to b - a - s, so the map is continuous and never decreasing and no
    two events on any stream change order. Stretches are taken busiest stream first and in
    time order; one that overlaps a stretch already taken (another thread's, a kernel under
    a host operator) is left as it was, since compressing both would count time twice."""

    def __init__(self, wanted: list[tuple[int, int, int, int]]):
        taken: list[tuple[int, int, int]] = []
        starts: list[int] = []
        for _, a, b, s in sorted(wanted):
            k = bisect.bisect_left(starts, a)
            if k > 0 and taken[k - 1][1] > a:
                continue
            if k < len(taken) and taken[k][0] < b:
                continue
            taken.insert(k, (a, b, s))
            starts.insert(k, a)
        self.taken = taken
        self.starts = starts
        self.ends = [b for _, b, _ in taken]
        self.cum = [0]
        for _, _, s in taken:
            self.cum.append(self.cum[-1] + s)

    def __bool__(self) -> bool:
        return bool(self.taken)

    def __call__(self, t: int) -> int:
        k = bisect.bisect_right(self.ends, t)      # stretches wholly at or before t
        moved = self.cum[k]
        if k < len(self.taken):
            a, b, s = self.taken[k]
            if a < t:
                moved += s * (t - a) // (b - a)
        return t - moved
