"""Program order for a Chakra graph: echo-et runs a stream in ascending node id, Chakra only
promises that ``data_deps`` form a DAG, so ids that do not already follow the dependencies
are replaced by a topological order that stays as close to the original ids as possible.

``ctrl_deps`` take part in the order too, but they are nesting, not execution order, and
old converters wrote some that contradict ``data_deps``: when only ctrl deps stand in the
way, the fewest needed (greedily) are given up.

Everything here works on flat arrays (the ids of a rank's nodes in file order, and their
deps concatenated, with offsets), never on decoded messages: a rank of millions of nodes
and tens of millions of deps is ordered in a few bytes per dep. Nodes are numbered by
their position in ascending-id order ("slots") while ordering.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


class OrderError(Exception):
    """The dependencies of a file cannot be ordered; the reader words the error."""


class DuplicateId(OrderError):
    def __init__(self, index: int, first: int):
        super().__init__(index, first)
        self.index = index   # file position of the node whose id was seen before
        self.first = first   # file position of the first node with that id


class MissingDataDep(OrderError):
    def __init__(self, index: int, dep: int):
        super().__init__(index, dep)
        self.index = index   # file position of the node
        self.dep = dep       # the first of its data deps that names no node


class DataCycle(OrderError):
    def __init__(self, index: int):
        super().__init__(index)
        self.index = index   # file position of a node on a cycle of data deps


@dataclass
class RankOrder:
    """Where each node of a file goes, and its deps in the new ids."""

    emit: np.ndarray         # file position of the node emitted 1st, 2nd, ...
    new_id: np.ndarray       # echo-et id per file position (uint64)
    data_deps: np.ndarray    # new ids of the data deps, flat in file order (repeats kept)
    ctrl_deps: np.ndarray    # new ids of the ctrl deps kept, flat in file order (repeats kept)
    ctrl_ptr: np.ndarray     # node i's kept ctrl deps are ctrl_deps[ctrl_ptr[i]:ctrl_ptr[i + 1]]
    dangling_ctrl: int       # ctrl deps naming no node (dropped)
    ctrl_given_up: int       # ctrl deps dropped because they contradict the data deps
    renumbered: int          # nodes renumbered (0 when ids were already in dependency order)
    ids_changed: bool        # some node's echo-et id differs from its Chakra id


def first_duplicate(ids: np.ndarray) -> tuple[int, int] | None:
    """(position, position of the first node with that id) of the earliest node, in file
    order, whose id an earlier node already has; None when ids are unique."""
    if len(ids) < 2:
        return None
    by_id = np.argsort(ids, kind="stable")
    s = ids[by_id]
    same = np.flatnonzero(s[1:] == s[:-1])
    if not len(same):
        return None
    second = by_id[same + 1]          # stable sort: a later occurrence of the value
    k = int(np.argmin(second))
    value = s[same[k] + 1]
    first = by_id[int(np.searchsorted(s, value, side="left"))]
    return int(second[k]), int(first)


def _owners(ptr: np.ndarray) -> np.ndarray:
    """File position of the node each flat dep belongs to."""
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))


def order_rank(ids: np.ndarray, data: np.ndarray, data_ptr: np.ndarray, ctrl: np.ndarray,
               ctrl_ptr: np.ndarray) -> RankOrder:
    """The emission order of one file's nodes. ``ids`` per file position (uint64); node i's
    data deps are ``data[data_ptr[i]:data_ptr[i + 1]]`` as written (repeats allowed), its ctrl
    deps likewise. When every dep already names a smaller id, ids are kept and nodes go in id
    order; otherwise they are renumbered 1..N by :func:`_kahn`. Raises DuplicateId,
    MissingDataDep or DataCycle."""
    n = len(ids)
    dup = first_duplicate(ids)
    if dup is not None:
        raise DuplicateId(*dup)
    by_id = np.argsort(ids, kind="stable")         # slot -> file position
    sorted_ids = ids[by_id]
    slot = np.empty(n, dtype=np.int64)              # file position -> slot
    slot[by_id] = np.arange(n, dtype=np.int64)

    def locate(deps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not n:
            return np.zeros(len(deps), np.int64), np.zeros(len(deps), bool)
        at = np.searchsorted(sorted_ids, deps)
        np.minimum(at, n - 1, out=at)
        return at, sorted_ids[at] == deps

    d_at, d_found = locate(data)
    if not d_found.all():
        k = int(np.argmin(d_found))
        raise MissingDataDep(int(np.searchsorted(data_ptr, k, side="right")) - 1, int(data[k]))
    del d_found
    c_at, c_found = locate(ctrl)
    dangling = int(len(c_found) - np.count_nonzero(c_found))
    d_owner = np.repeat(slot, np.diff(data_ptr))    # slot of the node each data dep is of
    c_file = _owners(ctrl_ptr)
    c_owner = slot[c_file]

    forward = bool((d_at >= d_owner).any()) or bool((c_at >= c_owner)[c_found].any())
    keep = c_found
    if not forward:
        del d_at, d_owner, c_owner
        emit, new_of_slot, renumbered, cut = by_id, sorted_ids, 0, 0
    else:
        data_keys = _edges(n, d_owner, d_at)
        ctrl_keys = _edges(n, c_owner[c_found], c_at[c_found])   # every kept ctrl dep
        del d_owner, c_owner
        result = _kahn(n, data_keys, ctrl_keys)
        if result is None:
            raise DataCycle(int(by_id[_slot_on_cycle(n, data_keys)]))
        del data_keys, ctrl_keys
        topo, given_up = result
        emit = by_id[topo]
        new_of_slot = np.empty(n, dtype=np.uint64)
        new_of_slot[topo] = np.arange(1, n + 1, dtype=np.uint64)
        renumbered = n
        cut = sum(len(gone) for gone in given_up.values())
        if given_up:
            keep = c_found.copy()
            for s, gone in given_up.items():
                j = int(by_id[s])
                for k in range(int(ctrl_ptr[j]), int(ctrl_ptr[j + 1])):
                    if keep[k] and int(c_at[k]) in gone:
                        keep[k] = False
    kept_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(c_file[keep], minlength=n), out=kept_ptr[1:])
    new_id = new_of_slot[slot]
    return RankOrder(
        emit=emit,
        new_id=new_id,
        data_deps=new_of_slot[d_at] if forward else data,
        ctrl_deps=new_of_slot[c_at[keep]],
        ctrl_ptr=kept_ptr,
        dangling_ctrl=dangling,
        ctrl_given_up=cut,
        renumbered=renumbered,
        ids_changed=bool(forward and (new_id != ids).any()),
    )


def _edges(n: int, child: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Distinct (child, parent) slot pairs as sorted keys child * n + parent."""
    keys = child.astype(np.int64)             # a copy, made into the keys in place
    keys *= n
    keys += parent
    keys.sort()
    if len(keys) < 2:
        return keys
    first = np.empty(len(keys), dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    return keys[first]


def _within(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are in ``sorted_keys`` (memory: only arrays the size of ``keys``)."""
    if not len(sorted_keys):
        return np.zeros(len(keys), dtype=bool)
    at = np.searchsorted(sorted_keys, keys)
    np.minimum(at, len(sorted_keys) - 1, out=at)
    return sorted_keys[at] == keys


def _split(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(child, parent) of edge keys."""
    child = keys // n
    parent = keys - child * n
    return child, parent


def _kahn(n: int, data_keys: np.ndarray, ctrl_keys: np.ndarray) -> tuple[array, dict[int, set[int]]] | None:
    """Slots in an order where every node follows its data deps and, where possible, its ctrl
    deps; ties go to the smaller slot (id), so an ordered graph keeps its order. Returns the
    order and the ctrl deps (slots) given up per node, or None when the data deps have a
    cycle. The greedy rule: when no node is free of pending deps, place the smallest one whose
    data deps are all placed and give up its pending ctrl deps. The deps come as the sorted
    keys of :func:`_edges`."""
    ctrl_only = ctrl_keys[~_within(data_keys, ctrl_keys)]
    # Children of each slot, as child * 2 + (1 for a data dep, 0 for a ctrl-only one), by
    # parent; the in-degrees count distinct parents.
    dc, dp = _split(data_keys, n)
    cc, cp = _split(ctrl_only, n)
    del ctrl_only
    data_in = array("q", np.bincount(dc, minlength=n).astype(np.int64).tobytes())
    ctrl_in = array("q", np.bincount(cc, minlength=n).astype(np.int64).tobytes())
    parents = np.concatenate([dp, cp])
    del dp, cp
    dc *= 2
    dc += 1
    cc *= 2
    enc = np.concatenate([dc, cc])
    del dc, cc
    by_parent = np.argsort(parents, kind="stable")
    kids = memoryview(enc[by_parent])
    del enc, by_parent
    kid_ptr = memoryview(np.concatenate([[0], np.cumsum(np.bincount(parents, minlength=n))]))
    del parents
    # Every kept ctrl parent of each slot (keys are sorted by child), for what is given up.
    ctrl_child, ctrl_parent = _split(ctrl_keys, n)
    cpar = memoryview(ctrl_parent)
    cpar_ptr = memoryview(np.searchsorted(ctrl_child, np.arange(n + 1)))
    del ctrl_child

    ready = [i for i in range(n) if data_in[i] == 0 and ctrl_in[i] == 0]   # sorted: a heap
    data_ready = [i for i in range(n) if data_in[i] == 0]
    placed = bytearray(n)
    out = array("q")
    given_up: dict[int, set[int]] = {}
    heappop, heappush = heapq.heappop, heapq.heappush
    while len(out) < n:
        if ready:
            i = heappop(ready)
            if placed[i]:
                continue
        else:
            while data_ready and placed[data_ready[0]]:
                heappop(data_ready)
            if not data_ready:
                return None
            i = heappop(data_ready)
            given_up[i] = {p for p in cpar[cpar_ptr[i]:cpar_ptr[i + 1]] if not placed[p]}
        placed[i] = 1
        out.append(i)
        for e in kids[kid_ptr[i]:kid_ptr[i + 1]]:
            c = e >> 1
            if placed[c]:
                continue
            if e & 1:
                left = data_in[c] - 1
                data_in[c] = left
                if left == 0:
                    heappush(data_ready, c)
                    if ctrl_in[c] == 0:
                        heappush(ready, c)
            else:
                left = ctrl_in[c] - 1
                ctrl_in[c] = left
                if left == 0 and data_in[c] == 0:
                    heappush(ready, c)
    return out, given_up


def _slot_on_cycle(n: int, data_keys: np.ndarray) -> int:
    """A slot on a cycle of data deps (there must be one); only runs to word an error."""
    keys = data_keys
    deps: dict[int, list[int]] = {i: [] for i in range(n)}
    for key in keys.tolist():
        deps[key // n].append(key % n)
    return node_on_cycle(range(n), deps)


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


def lay_out_untimed(graph) -> int:
    """Give an untimed graph (every start 0) start times: each node as soon as its stream is
    free and its dependencies allow (the end of a data or sync dependency, the start of a
    launch or control one), visiting nodes in id order (program order here). Returns the
    number of nodes laid out, 0 when the graph has times.

    echo-et reads a host thread's nesting from start times and durations: with every start at
    0, each host operator would sit inside the first one, and a dependency on an earlier
    operator could never be met. Laid out this way, nothing nests and every dependency
    holds."""
    nodes = graph.nodes
    if not nodes or any(n.start_ns for n in nodes):
        return 0
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    stream_free: dict[int, int] = {}
    by_id = sorted(range(len(nodes)), key=lambda i: nodes[i].id)
    for i in by_id:
        n = nodes[i]
        t = stream_free.get(n.stream, 0)
        for d in n.deps:
            if d.id in start:
                t = max(t, start[d.id] if d.kind in (1, 3) else end[d.id])  # DEP_LAUNCH, DEP_CONTROL
        n.start_ns = t
        start[n.id] = t
        end[n.id] = stream_free[n.stream] = t + n.duration_ns
    return len(nodes)
