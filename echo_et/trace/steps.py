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
    for members in tops.values():
        end = None
        for i in sorted(members, key=lambda i: (nodes[i].start_ns, i)):
            n = nodes[i]
            if end is not None:
                out[i] = max(0, n.start_ns - end)
            end = n.start_ns + n.duration_ns if end is None else max(end, n.start_ns + n.duration_ns)
    return out


class StepCombiner:
    """Combines measured steps one at a time, holding only the fastest step's graph and the
    shortest time of every piece so far (not all K graphs: a large rank's graph is big)."""

    def __init__(self, *, where: str = ""):
        self.prefix = f"{where}: " if where else ""
        self.count = 0
        self.shape: list[tuple[int, str, int]] = []
        self.children: list[list[int]] = []
        self.tops: dict[int, list[int]] = {}
        self.ref: Graph | None = None
        self.ref_span = 0
        self.ref_self: list[int] = []
        self.ref_gap: dict[int, int] = {}
        self.best_self: list[int] = []
        self.best_gap: dict[int, int] = {}

    def add(self, graph: Graph) -> None:
        """Take one measured step (the combiner may keep ``graph``: do not edit it after)."""
        self.count += 1
        if self.count == 1:
            self.shape = [(n.kind, n.name, n.stream) for n in graph]
            parent = _parents(graph)
            self.children = [[] for _ in graph.nodes]
            for i, p in enumerate(parent):
                if p >= 0:
                    self.children[p].append(i)
            host = {st.id for st in graph.header.streams if st.kind == pb.STREAM_CPU_THREAD}
            tops: dict[int, list[int]] = defaultdict(list)
            for i, n in enumerate(graph.nodes):
                if parent[i] < 0 and n.stream in host:
                    tops[n.stream].append(i)
            self.tops = dict(tops)
        else:
            other = [(n.kind, n.name, n.stream) for n in graph]
            if other != self.shape:
                at = next((i for i, (a, b) in enumerate(zip(self.shape, other, strict=False))
                           if a != b), min(len(self.shape), len(other)))
                raise EchoError(f"{self.prefix}measured step {self.count} runs different "
                                f"operators from step 1 ({len(other)} vs {len(self.shape)} "
                                f"nodes, first difference at node {at}); the workload is not "
                                "repeatable, trace it with one measured step")
        selfs = _self_times(graph, self.children)
        gaps = _gaps(graph, self.tops)
        span = step_span_ns(graph)
        if self.count == 1:
            self.best_self, self.best_gap = list(selfs), dict(gaps)
        else:
            self.best_self = [min(a, b) for a, b in zip(self.best_self, selfs, strict=True)]
            for i, g in gaps.items():
                if g < self.best_gap.get(i, g + 1):
                    self.best_gap[i] = g
        if self.ref is None or span < self.ref_span:
            self.ref, self.ref_span, self.ref_self, self.ref_gap = graph, span, selfs, gaps

    def result(self, *, copy: bool = True) -> Graph:
        """The fastest step with every piece at its shortest (a copy unless ``copy`` is
        False, which hands over the kept graph itself)."""
        if self.ref is None:
            raise EchoError(f"{self.prefix}no measured step to combine")
        out = self.ref.copy() if copy else self.ref
        if self.count == 1:
            return out
        nodes = out.nodes
        children = [sorted(c, key=lambda i: (nodes[i].start_ns, i)) for c in self.children]
        busy: dict[int, int] = defaultdict(int)
        enclosed = {c for cs in self.children for c in cs}
        for i, n in enumerate(nodes):
            if i not in enclosed:
                busy[n.stream] += n.duration_ns
        rank_of_stream = {sid: k for k, sid in enumerate(sorted(busy, key=lambda x: (-busy[x], x)))}
        wanted: list[tuple[int, int, int, int]] = []   # (stream rank, start, end, ns saved)
        for i, n in enumerate(nodes):
            prio = rank_of_stream.get(n.stream, len(rank_of_stream))
            saved = self.ref_self[i] - self.best_self[i]
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
            g = self.ref_gap.get(i)
            if g:
                best = self.best_gap.get(i, g)
                if best < g:
                    wanted.append((prio, n.start_ns - g, n.start_ns, g - best))
        squeeze = _Squeeze(wanted)
        if squeeze:
            for n in nodes:
                start = squeeze(n.start_ns)
                n.duration_ns = max(0, squeeze(n.start_ns + n.duration_ns) - start)
                n.start_ns = max(0, start)
        return out


def fastest_per_op(graphs: Sequence[Graph], *, where: str = "") -> Graph:
    """One graph from several measured steps of the same program (see the module
    docstring); the inputs are not modified. The steps must run the same operators in the
    same order on the same streams, else the workload is not repeatable and a clear error
    is raised."""
    combiner = StepCombiner(where=where)
    for g in graphs:
        combiner.add(g)
    return combiner.result()


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
