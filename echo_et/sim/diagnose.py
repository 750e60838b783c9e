"""What the simulator says when a job cannot run: members of a meeting that do not match
(a collective of another type or size, two sends), and a deadlock, named by the ranks that
wait and what for (a cycle of ranks each waiting for the next, a rank that never issues what
the others wait at, or a rank whose own dependencies form a cycle)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from echo_et.errors import EchoError
from echo_et.ir.schema import EQUAL_SIZE_COLLECTIVES, collective_name, pb
from echo_et.sim.state import CollectiveKey, Meeting, MeetingKey, P2PKey, Participant, ParticipantTuple, RankState
from echo_et.sim.symmetry import Partition


def check_collective_match(parts: list[ParticipantTuple], group: pb.ProcessGroup) -> None:
    """An EchoError when the members of one collective issue different collectives."""
    st0, it0, _ = parts[0]
    prog0 = st0.program
    a = prog0.rendezvous[it0]
    for st, it, _ in parts[1:]:
        if st.program is prog0 and it == it0:
            continue  # the same node of a shared graph
        b = st.program.rendezvous[it]
        same = a.coll_type == b.coll_type and (
            a.coll_type not in EQUAL_SIZE_COLLECTIVES or a.in_bytes == b.in_bytes)
        if not same:
            raise EchoError(
                f"mismatched collectives on group {group.id} ({group_label(group)}) at sequence #{a.seq}: "
                f"rank {st0.rank} {st0.describe(it0)} issues {collective_name(a.coll_type)} of {a.in_bytes} B, "
                f"rank {st.rank} {st.describe(it)} issues {collective_name(b.coll_type)} of {b.in_bytes} B")


def check_p2p_match(parts: list[ParticipantTuple], group: pb.ProcessGroup) -> None:
    """An EchoError when a send meets a send (or a recv a recv), or sizes differ."""
    if len(parts) < 2:
        return
    (sa, ia, _), (sb, ib, _) = parts[0], parts[1]
    a, b = sa.program.rendezvous[ia], sb.program.rendezvous[ib]
    key = sa.meeting_key[ia]
    assert isinstance(key, P2PKey)
    if a.is_send == b.is_send and key.sender != key.receiver:
        raise EchoError(f"two {'sends' if a.is_send else 'recvs'} meet on group {group.id} at sequence #{a.seq}")
    if a.in_bytes != b.in_bytes:
        raise EchoError(f"mismatched send/recv on group {group.id} at sequence #{a.seq}: rank {sa.rank} "
                        f"{sa.describe(ia)} passes {a.in_bytes} B, rank {sb.rank} {sb.describe(ib)} "
                        f"passes {b.in_bytes} B")


def deadlock_message(unfinished: list[RankState], meetings: Mapping[MeetingKey, Meeting],
                     states: Iterable[RankState], part: Partition,
                     members_of: Mapping[int, frozenset[int]]) -> str:
    """Why the simulation stopped with ``unfinished`` ranks (or with a send nobody receives):
    ``meetings`` are those still open, ``members_of`` the classes of each group class."""
    states = list(states)
    rep_of_class = part.reps
    waiting: dict[int, tuple[RankState, int, MeetingKey]] = {}   # class -> (state, item, meeting key)
    edges: dict[int, list[int]] = {}
    missing_of: dict[MeetingKey, list[int]] = {}
    # An eager send that ran leaves a meeting nobody waits at: only its recv can be missing.
    pending = {k: m for k, m in meetings.items()
               if any(Participant(*p).unfinished() for p in m.parts)}
    if not unfinished and not pending:
        st, it, _ = next(iter(meetings.values())).parts[0]
        return f"rank {st.rank} {st.describe(it)}: nobody receives this send (mismatched send/recv)"
    for key, m in pending.items():
        parts = [p for p in m.parts if Participant(*p).unfinished()]
        missing = sorted(_wanted(key, parts, part, members_of) - {st.class_id for st, _, _ in parts})
        missing_of[key] = missing
        for st, it, _ in parts:
            waiting[st.class_id] = (st, it, key)
            edges.setdefault(st.class_id, []).extend(missing)
    # A cycle of ranks each waiting for the next: a cross-rank deadlock.
    cycle = find_cycle(edges)
    if cycle:
        lines = []
        for k, c in enumerate(cycle):
            nxt = cycle[(k + 1) % len(cycle)]
            if c in waiting:
                st, it, key = waiting[c]
                lines.append(f"rank {st.rank} waits at {st.describe(it)} ({meeting_label(st, it, key)}) "
                             f"for rank {rep_of_class[nxt]}")
            else:
                lines.append(f"rank {rep_of_class[c]} is blocked")
        return "deadlock (cyclic wait across ranks): " + "; ".join(lines)
    if pending:
        key, m = min(pending.items(), key=lambda kv: (kv[1].parts[0][0].rank, kv[1].parts[0][1]))
        st, it, _ = next(p for p in m.parts if Participant(*p).unfinished())
        missing = missing_of[key]
        why = []
        for c in missing:
            other = next((s for s in states if s.class_id == c), None)
            if other is None:
                continue
            if other.items_done >= other.program.n_items:
                why.append(f"rank {other.rank} finished without issuing it")
            else:
                blocked = other.first_unfinished()
                why.append(f"rank {other.rank} never reaches it (stuck at {other.describe(blocked)})")
        return (f"deadlock: rank {st.rank} waits at {st.describe(it)} ({meeting_label(st, it, key)}) "
                f"for ranks {[rep_of_class[c] for c in missing]}: " + "; ".join(why))
    st = unfinished[0]
    blocked = st.first_unfinished()
    return (f"deadlock: rank {st.rank} {st.describe(blocked)} can never start (its dependencies and "
            "stream order form a cycle)")


def _wanted(key: MeetingKey, parts: list[ParticipantTuple], part: Partition,
            members_of: Mapping[int, frozenset[int]]) -> frozenset[int]:
    """The classes a meeting waits for."""
    if isinstance(key, CollectiveKey):
        return members_of[key.group_class]
    st, it, _ = parts[0]
    rv = st.program.rendezvous[it]
    partner = st.group_of_key[rv.key].ranks[rv.peer]
    return frozenset({st.class_id} | ({part.class_of[partner]} if partner in part.class_of else set()))


def meeting_label(st: RankState, item: int, key: MeetingKey) -> str:
    """A meeting as people name it: ``all_reduce #3 on group 2``, ``send to rank 5 #0 ...``."""
    rv = st.program.rendezvous[item]
    g = st.group_of_key[rv.key]
    if isinstance(key, CollectiveKey):
        return f"{collective_name(rv.coll_type)} #{rv.seq} on group {g.id}"
    verb = "send to" if rv.is_send else "recv from"
    return f"{verb} rank {g.ranks[rv.peer]} #{rv.seq} on group {g.id}"


def group_label(g: pb.ProcessGroup) -> str:
    ranks = list(g.ranks)
    shown = ", ".join(str(r) for r in ranks[:8]) + (", ..." if len(ranks) > 8 else "")
    name = f"{g.name} " if g.name else ""
    return f"{name}ranks [{shown}]"


def find_cycle(edges: dict[int, list[int]]) -> list[int]:
    """A cycle of the directed graph ``edges`` (node -> successors), [] when it has none."""
    color: dict[int, int] = {}
    stack_path: list[int] = []

    def visit(u: int) -> list[int]:
        color[u] = 1
        stack_path.append(u)
        for v in edges.get(u, ()):
            if color.get(v) == 1:
                return stack_path[stack_path.index(v):]
            if v not in color:
                found = visit(v)
                if found:
                    return found
        stack_path.pop()
        color[u] = 2
        return []

    for u in sorted(edges):
        if u not in color:
            found = visit(u)
            if found:
                return found
    return []
