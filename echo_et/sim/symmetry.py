"""Which ranks are certain to have the same simulated timeline, so only one of each is run.

The timeline the simulator computes is the unique solution of max-plus equations: every
item starts at the max of its predecessors plus a fixed gate, and a collective starts at
the max of its members' arrivals. If ranks are split into classes such that

* ranks of one class run the same graph with the same per-rank parameters (straggler
  factor, start offset, anything :meth:`Simulator.symmetry_key` returns), and
* for every group key, the groups that ranks of one class are bound to look the same:
  same placement pattern (which members share a node, so a CC model prices them the same),
  same multiset of (member class, member's key) for plain collectives, and the same
  *ordered* member classes when the group carries P2P, gathers or scatters (there, a
  rank's position in the group decides who its partner is, or whether its sizes are the
  root's; a broadcast's or a reduce's time is the same for every member, whichever is the
  root),

then giving every rank of a class its representative's timeline satisfies all equations
of the full job, and so it *is* the full job's timeline. This is an equitable partition of
the rank/group incidence graph; colour refinement (1-dimensional Weisfeiler-Leman) finds
the coarsest one. DP replicas of a TPxPPxDP job collapse to one class per (stage, TP
position) whose groups look alike: cost grows with distinct graphs, not world size.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from echo_et.ir.job import Job


@dataclass
class Partition:
    class_of: dict[int, int]          # rank -> class id
    reps: list[int]                   # class id -> representative rank (smallest rank)
    group_class: dict[int, int]       # process group id -> group class id
    members: dict[int, list[int]]     # class id -> ranks

    @property
    def classes(self) -> int:
        return len(self.reps)


class _Interner:
    """Small consecutive ids for hashable values (colours), in order of first use."""

    def __init__(self) -> None:
        self.ids: dict[Hashable, int] = {}

    def __call__(self, value: Hashable) -> int:
        got = self.ids.get(value)
        if got is None:
            got = len(self.ids)
            self.ids[value] = got
        return got


def placement_pattern(ranks: list[int] | tuple[int, ...], gpus_per_node: int) -> tuple[int, ...]:
    """Node of each member relabelled by first appearance, e.g. ranks [8, 9, 16, 17] with 8
    GPUs per node -> (0, 0, 1, 1). Two groups with the same pattern cost the same."""
    if gpus_per_node <= 0:
        return (len(ranks),)
    seen: dict[int, int] = {}
    out = []
    for r in ranks:
        node = r // gpus_per_node
        if node not in seen:
            seen[node] = len(seen)
        out.append(seen[node])
    return tuple(out)


def identity_partition(job: Job) -> Partition:
    ranks = job.ranks()
    class_of = {r: k for k, r in enumerate(ranks)}
    return Partition(class_of, list(ranks), {g.id: g.id for g in job.manifest.groups},
                     {k: [r] for k, r in enumerate(ranks)})


def rank_partition(
    job: Job,
    rank_key: Callable[[int], Hashable],
    ordered_keys: Callable[[str], frozenset[str]],
    gpus_per_node: int,
) -> Partition:
    """The coarsest equitable partition of ranks (see the module docstring).

    ``rank_key(rank)``: everything about a rank that changes its own timeline besides its
    graph. ``ordered_keys(graph_id)``: group keys on which the graph does P2P, gathers or
    scatters (member positions matter there).
    """
    intern = _Interner()
    ranks = job.ranks()
    groups = {g.id: g for g in job.manifest.groups}
    # Who is bound to each group, under which graph-local key.
    members: dict[int, list[tuple[int, str]]] = {gid: [] for gid in groups}
    ordered: set[int] = set()    # groups where a member's position matters (P2P, gather, scatter)
    bindings = {}
    for r in ranks:
        b = job.binding(r)
        keys = dict(b.groups)
        bindings[r] = keys
        okeys = ordered_keys(b.graph)
        for key, gid in keys.items():
            if gid in members:
                members[gid].append((r, key))
                if key in okeys:
                    ordered.add(gid)
    position = {gid: {x: i for i, x in enumerate(g.ranks)} for gid, g in groups.items() if gid in ordered}

    # Colour refinement: a rank's colour is its own key plus the colours of its groups; a
    # group's colour is its shape plus the colours of its members; repeat until the number
    # of colours stops growing.
    rank_base = {r: intern(("rank", job.binding(r).graph, rank_key(r))) for r in ranks}
    group_base = {gid: intern(("group", len(g.ranks), placement_pattern(list(g.ranks), gpus_per_node),
                               gid in ordered))
                  for gid, g in groups.items()}
    rank_colour = dict(rank_base)
    group_colour = dict(group_base)
    n_rank_colours, n_group_colours = len(set(rank_colour.values())), len(set(group_colour.values()))
    while True:
        new_group = {}
        for gid, inc in members.items():
            if gid in ordered:
                pos = position[gid]
                sig: tuple = tuple(sorted((pos[x], rank_colour[x], key) for x, key in inc))
            else:
                sig = tuple(sorted((rank_colour[x], key) for x, key in inc))
            new_group[gid] = intern((group_base[gid], sig))
        new_rank = {}
        for r in ranks:
            sig = tuple(sorted(
                (key, new_group[gid], position[gid][r] if gid in ordered else -1)
                for key, gid in bindings[r].items() if gid in new_group
            ))
            new_rank[r] = intern((rank_base[r], sig))
        m_r, m_g = len(set(new_rank.values())), len(set(new_group.values()))
        rank_colour, group_colour = new_rank, new_group
        if m_r == n_rank_colours and m_g == n_group_colours:
            break
        n_rank_colours, n_group_colours = m_r, m_g

    class_ids: dict[int, int] = {}
    class_of: dict[int, int] = {}
    reps: list[int] = []
    members: dict[int, list[int]] = {}
    for r in ranks:  # ascending, so the representative is the smallest rank
        c = class_ids.get(rank_colour[r])
        if c is None:
            c = len(reps)
            class_ids[rank_colour[r]] = c
            reps.append(r)
            members[c] = []
        class_of[r] = c
        members[c].append(r)
    gclass_ids: dict[int, int] = {}
    group_class = {}
    for gid in sorted(groups):
        group_class[gid] = gclass_ids.setdefault(group_colour[gid], len(gclass_ids))
    return Partition(class_of, reps, group_class, members)
