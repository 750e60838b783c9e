"""Host op nesting: the parent of an op is the innermost op of the same thread whose time
span contains its start. Kineto records no parent ids, so time containment is the only
evidence; an op that starts inside another but ends after it (clock rounding) still counts
as its child and is counted as an overlap.

Such an op can contain only what its parent contains: its span as a container is cut at its
parent's end. An asynchronous span outlasts the op that opened it (gloo's ``gloo:send`` /
``gloo:recv`` on the caller's thread run from ``c10d::send`` until the work's wait), and
the ops issued meanwhile (the ``c10d::recv_`` of a ring exchange) are not inside it."""

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
    stack: list[tuple[Ev, int]] = []  # (op, end of its span as a container)
    for ev in sorted(thread_events, key=host_order_key):
        ts = ev.ts
        end = ev.ts + ev.dur
        while stack and stack[-1][1] <= ts:
            stack.pop()
        if stack:
            top, top_end = stack[-1]
            if end > top.ts + top.dur:
                overlaps.append(ev)
            parents[ev.idx] = top
            end = min(end, top_end)
        stack.append((ev, end))
    return parents, overlaps
