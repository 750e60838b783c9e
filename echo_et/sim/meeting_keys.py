"""The meeting keys of the collectives of every simulated rank, built once per group.

A rank's collective item meets under ``CollectiveKey(group class, seq)``. Every rank bound
to the same group through the same key of the same program (the members of a TP or DP
group, all replicas of one graph) has the same items, seqs and group class there, so the
item -> key and item -> size tables of that (program, key, group class) are built once and
copied into each member's dicts (a C-level ``dict.update``). Without symmetry at 8,192
ranks this replaces about a million key tuples with about 50 thousand.
"""

from __future__ import annotations

from echo_et.sim.program import Program
from echo_et.sim.state import CollectiveKey, RankState


class CollectiveMeetings:
    """Shared item -> meeting key and item -> meeting size tables, per (program, group key,
    group class). Lives for one setup of the simulator's states."""

    def __init__(self, meeting_size_of: dict[int, int]):
        self._size_of = meeting_size_of     # group class -> members a collective waits for
        self._items: dict[int, dict[str, tuple[list[int], list[int]]]] = {}  # id(program) -> key -> items, seqs
        self._tables: dict[tuple[int, str, int], tuple[dict[int, CollectiveKey], dict[int, int]]] = {}

    def _by_key(self, prog: Program) -> dict[str, tuple[list[int], list[int]]]:
        got = self._items.get(id(prog))
        if got is None:
            got = {}
            for it, key, seq in prog.collective_items:
                items, seqs = got.setdefault(key, ([], []))
                items.append(it)
                seqs.append(seq)
            self._items[id(prog)] = got
        return got

    def bind(self, st: RankState, group_class: dict[str, int]) -> None:
        """Give ``st`` the meeting key and size of each of its collective items."""
        prog = st.program
        for key, (items, seqs) in self._by_key(prog).items():
            gc = group_class[key]
            tkey = (id(prog), key, gc)
            tables = self._tables.get(tkey)
            if tables is None:
                keys = dict(zip(items, [CollectiveKey(gc, s) for s in seqs], strict=True))
                tables = (keys, dict.fromkeys(items, self._size_of[gc]))
                self._tables[tkey] = tables
            st.meeting_key.update(tables[0])
            st.meeting_size.update(tables[1])
