"""Program order for a Chakra graph: echo-et runs a stream in ascending node id, Chakra only
promises that ``data_deps`` form a DAG, so ids that do not already follow the dependencies
are replaced by a topological order that stays as close to the original ids as possible.

``ctrl_deps`` take part in the order too, but they are nesting, not execution order, and
old converters wrote some that contradict ``data_deps``: when only ctrl deps stand in the
way, the fewest needed (greedily) are given up.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence


def needs_renumbering(deps: Mapping[int, Sequence[int]]) -> bool:
    """True when some node depends on a node with an id that is not smaller than its own."""
    return any(d >= n for n, ds in deps.items() for d in ds)


def topological(
    ids: Sequence[int],
    data: Mapping[int, Sequence[int]],
    ctrl: Mapping[int, Sequence[int]] | None = None,
) -> tuple[list[int], dict[int, set[int]]] | None:
    """Ids in an order where every node follows its data deps and, where possible, its ctrl
    deps; ties go to the smaller id, so an ordered graph keeps its order. Returns the order
    and the ctrl deps given up per node, or None when the data deps have a cycle."""
    ctrl = ctrl or {}
    data_in = {i: 0 for i in ids}
    ctrl_in = {i: 0 for i in ids}
    children: dict[int, list[tuple[int, bool]]] = {}
    for n in ids:
        ds = set(data.get(n, ()))
        for d in ds:
            data_in[n] += 1
            children.setdefault(d, []).append((n, True))
        for d in set(ctrl.get(n, ())) - ds:
            ctrl_in[n] += 1
            children.setdefault(d, []).append((n, False))
    ready = [i for i in ids if data_in[i] == 0 and ctrl_in[i] == 0]
    data_ready = [i for i in ids if data_in[i] == 0]
    heapq.heapify(ready)
    heapq.heapify(data_ready)
    placed: set[int] = set()
    out: list[int] = []
    given_up: dict[int, set[int]] = {}
    while len(out) < len(data_in):
        if ready:
            i = heapq.heappop(ready)
            if i in placed:
                continue
        else:
            # Stuck: only ctrl deps (or a data cycle) hold the rest back. Place the smallest
            # node whose data deps are all done, giving up its pending ctrl deps.
            while data_ready and data_ready[0] in placed:
                heapq.heappop(data_ready)
            if not data_ready:
                return None
            i = heapq.heappop(data_ready)
            given_up[i] = {d for d in ctrl.get(i, ()) if d not in placed}
        placed.add(i)
        out.append(i)
        for c, is_data in children.get(i, ()):
            if c in placed:
                continue
            if is_data:
                data_in[c] -= 1
                if data_in[c] == 0:
                    heapq.heappush(data_ready, c)
            else:
                ctrl_in[c] -= 1
            if data_in[c] == 0 and ctrl_in[c] == 0:
                heapq.heappush(ready, c)
    return out, given_up


def node_on_cycle(ids: Sequence[int], deps: Mapping[int, Sequence[int]]) -> int:
    """One node that lies on a cycle of ``deps`` (there must be one)."""
    indeg = {i: 0 for i in ids}
    children: dict[int, list[int]] = {}
    for n in ids:
        for d in set(deps.get(n, ())):
            indeg[n] += 1
            children.setdefault(d, []).append(n)
    stack = [i for i in ids if indeg[i] == 0]
    done: set[int] = set()
    while stack:
        i = stack.pop()
        done.add(i)
        for c in children.get(i, ()):
            indeg[c] -= 1
            if indeg[c] == 0:
                stack.append(c)
    left = {i for i in ids if i not in done}
    node = min(left)
    seen: set[int] = set()
    # Every node left over has a dependency that is left over too; walking them must loop.
    while node not in seen:
        seen.add(node)
        node = min(d for d in deps[node] if d in left)
    return node
