"""Change some nodes' durations without leaving holes in the measured timeline.

The simulator starts a node after its predecessors plus the *measured gap* between them
(``start_ns`` minus the predecessor's measured end). Shortening a node's ``duration_ns``
alone would turn the time saved into a gap before its successors. So the time saved is
taken out of the timeline: every node that starts after a shortened node ended moves
earlier by the total saved before its start, and an operator that encloses shortened
operators (DEP_CONTROL nesting) is shortened by what its descendants saved.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from echo_et.ir import Graph
from echo_et.ir.schema import pb


def rescale_durations(graph: Graph, factors: dict[int, float]) -> int:
    """Multiply the durations of the nodes in ``factors`` (node id -> factor) in place on
    ``graph`` (a copy the caller owns), shifting later nodes; returns the ns saved."""
    if not factors:
        return 0
    saved_at: list[tuple[int, int]] = []   # (old end, ns saved)
    saved_by: dict[int, int] = {}
    for n in graph.nodes:
        f = factors.get(n.id)
        if f is None or n.duration_ns <= 0:
            continue
        new = max(1, round(n.duration_ns * f))
        if new == n.duration_ns:
            continue
        saved_at.append((n.start_ns + n.duration_ns, n.duration_ns - new))
        saved_by[n.id] = n.duration_ns - new
    if not saved_at:
        return 0
    saved_at.sort()
    ends = [e for e, _ in saved_at]
    cum = [0]
    for _, s in saved_at:
        cum.append(cum[-1] + s)

    def before(t: int) -> int:
        return cum[bisect.bisect_right(ends, t)]

    # Enclosing operators shrink by what their descendants saved.
    parent: dict[int, int] = {}
    for n in graph.nodes:
        for d in n.deps:
            if d.kind == pb.DEP_CONTROL:
                parent[n.id] = d.id
                break
    inherited: dict[int, int] = defaultdict(int)
    for nid, s in saved_by.items():
        p = parent.get(nid)
        seen = {nid}
        while p is not None and p not in seen:
            seen.add(p)
            inherited[p] += s
            p = parent.get(p)
    for n in graph.nodes:
        shift = before(n.start_ns)
        if n.id in saved_by:
            n.duration_ns -= saved_by[n.id]
        elif n.id in inherited:
            n.duration_ns = max(0, n.duration_ns - inherited[n.id])
        n.start_ns = max(0, n.start_ns - shift)
    return cum[-1]
