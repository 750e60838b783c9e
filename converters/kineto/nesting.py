"""Host op nesting: the parent of an op is the innermost op of the same thread whose time
span contains its start. Kineto records no parent ids, so time containment is the only
evidence; an op that starts inside another but ends after it (clock rounding) still counts
as its child and is counted as an overlap."""

from __future__ import annotations

from .events import Ev


def host_order_key(ev: Ev) -> tuple[int, int, int, int]:
    """Parents before children: earlier start, then longer, then ops before runtime calls."""
    return (ev.ts, -ev.dur, ev.kind, ev.idx)


def assign_parents(thread_events: list[Ev]) -> tuple[dict[int, Ev], list[Ev]]:
    """Parent of each event (by ``Ev.idx``) among ``thread_events`` (one thread, any order),
    and the children that outlast their parent."""
    parents: dict[int, Ev] = {}
    overlaps: list[Ev] = []
    stack: list[Ev] = []
    for ev in sorted(thread_events, key=host_order_key):
        ts = ev.ts
        while stack and stack[-1].ts + stack[-1].dur <= ts:
            stack.pop()
        if stack:
            top = stack[-1]
            if ev.ts + ev.dur > top.ts + top.dur:
                overlaps.append(ev)
            parents[ev.idx] = top
        stack.append(ev)
    return parents, overlaps
