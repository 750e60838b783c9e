"""A timeline written in Kineto's schema: :func:`write_timeline`, streamed, and
:func:`write_timeline_whole`, its reference with every event held.

write_timeline reads its events once. Each event goes to an unnamed scratch file beside the
output (``marshal``; ``pickle`` for what marshal refuses) and leaves a few numbers behind: its
track, start, duration, interned box name, launch, and where its record lies. A rank's trace is
sorted on those numbers with the whole writer's key (lane, ts, -dur, ph, name, then the order
the events came in), and each box is made again from its record as it is written. The ``ac2g``
flows sort after every box of their lane and instant (their ph, "f" or "s", comes after "X",
their dur is 0), so they are written as the sorted boxes leave that instant: a kernel's "f"
there, a launch's "s" at the launch's own box, each in the order of the kernel that made it.
With ``origin_ns`` (the events' first start, known beforehand) and a Job, a folder's rank
files are written one at a time as each rank's events end, and only that rank's numbers are
held; otherwise (and always for one file, whose head needs every rank) every rank's numbers are
held until the last event: tens of bytes per box, never the events themselves."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_dir, atomic_file
from echo_et.ir.job import Job
from echo_et.ir.timeline import TimelineEvent

from .boxes import JobFacts
from .document import (
    check_folder_dest,
    chrome_trace,
    dump,
    is_single_file,
    is_timeline_folder,
    kineto_traces,
    trace_head,
    trace_text,
    write_text,
)
from .spool import RECORD_MIN_BYTES, ScratchEstimate, Spool, scratch_dir
from .timeline_rows import RankPart, RankRows, sorted_events


def _summary(dest: Path, traces: list[dict[str, Any]], files: int) -> dict[str, Any]:
    boxes = [e for t in traces for e in t["traceEvents"]
             if e["ph"] == "X" and not str(e["name"]).startswith("ProfilerStep#")]
    ranks = {t["distributedInfo"]["rank"] for t in traces if "rank" in t["distributedInfo"]}
    for t in traces:
        ranks.update(t["distributedInfo"].get("ranks", []))
    return {
        "output": str(dest),
        "files": files,
        "events": len(boxes),
        "ranks": len(ranks),
        "tracks": len({(e["pid"], e["tid"]) for e in boxes}),
    }


def write_timeline_whole(events: Iterable[TimelineEvent], dest: str | os.PathLike[str], *, job: Job | None = None,
                         metadata: Mapping[str, object] | None = None, process_label: str = "rank") -> dict[str, Any]:
    """:func:`write_timeline` with every event, box and line held before the first byte is
    written (its sorted whole-trace form): the reference that the streamed writer's bytes are
    compared with (tests/test_timeline_stream.py)."""
    dest = Path(dest)
    if is_single_file(dest):
        trace = chrome_trace(events, job, metadata=metadata, process_label=process_label)
        with atomic_file(dest) as f:
            f.write(dump(trace, dest.name.lower().endswith(".gz")))
        return _summary(dest, [trace], 1)
    check_folder_dest(dest)
    traces = kineto_traces(events, job, metadata=metadata, process_label=process_label)
    if not traces:
        raise EchoError("no events to write")
    with atomic_dir(dest, replaceable=is_timeline_folder,
                    kind="a timeline folder") as tmp:
        for rank, trace in traces.items():
            (tmp / f"rank-{rank}.json").write_bytes(dump(trace, False))
    return _summary(dest, list(traces.values()), len(traces))


def timeline_scratch(dest: str | os.PathLike[str], rank_events: Sequence[int], *, by_rank: bool) -> ScratchEstimate:
    """The scratch file :func:`write_timeline` keeps at its largest when it writes ``dest``
    with ``rank_events`` events per rank, in the order the ranks come: every event for one
    file, or when a folder is not written rank by rank; with ``by_rank`` (``origin_ns`` and
    ``job`` given) a folder's scratch holds one rank's events at a time, and at the end, when
    every file is written, the last rank's."""
    one_rank = by_rank and not is_single_file(dest)
    events = (rank_events[-1] if rank_events else 0) if one_rank else sum(rank_events)
    return ScratchEstimate(scratch_dir(dest), events, events * RECORD_MIN_BYTES)


def _prepend(first: TimelineEvent, rest: Iterator[TimelineEvent]) -> Iterator[TimelineEvent]:
    """``first`` then ``rest``, holding neither once it is given (itertools.chain would keep
    ``first`` to the end)."""
    held = [first]
    del first
    yield held.pop()
    yield from rest


def write_timeline(events: Iterable[TimelineEvent], dest: str | os.PathLike[str], *, job: Job | None = None,
                   metadata: Mapping[str, object] | None = None, process_label: str = "rank",
                   origin_ns: int | None = None) -> dict[str, Any]:
    """Write ``events`` in Kineto's schema: one file (``dest`` ends in ``.json`` /
    ``.json.gz``) or a folder of ``rank-<R>.json`` (any other name; an earlier such folder
    is replaced). Atomic, byte-identical on reruns, and the bytes of
    :func:`write_timeline_whole`. Returns a summary (output, files, events, ranks, tracks);
    the ``ProfilerStep`` spans are not counted as events.

    The events are read once and not held: each is kept in a scratch file beside ``dest``
    and a few numbers in memory (see the module's docstring). ``origin_ns``: the events' earliest
    start (the trace's time 0), when the caller knows it; then, with ``job``, a folder's rank
    files are written as each rank's events end (a rank's events must come together), and
    memory holds one rank's numbers. A wrong ``origin_ns`` is a ValueError (nothing written)."""
    dest = Path(dest)
    one_file = is_single_file(dest)
    if not one_file:
        check_folder_dest(dest)
    it = iter(events)
    first = next(it, None)
    if first is None and not one_file:
        raise EchoError("no events to write")
    stream: Iterator[TimelineEvent] = _prepend(first, it) if first is not None else iter(())
    del first
    facts = JobFacts(job, [])
    names: dict[str, int] = {}

    def head(origin: int, devices: set[Any], dist: dict[str, Any]) -> dict[str, Any]:
        return trace_head(facts, origin, devices, dist, metadata)

    def check_origin(got: int | None) -> int:
        origin = got if got is not None else 0
        if origin_ns is not None and got is not None and origin_ns != got:
            raise ValueError(f"origin_ns {origin_ns} is not the events' first start ({got})")
        return origin

    def gather(spool: Spool) -> list[RankRows]:
        by_rank: dict[int, RankRows] = {}
        for e in stream:
            rows = by_rank.get(e.rank)
            if rows is None:
                rows = by_rank[e.rank] = RankRows(e.rank)
                facts.add_rank(job, e.rank)
            at, size = spool.put(e)
            rows.add(e, at, size, names, facts)
        if job is None:
            facts.world_size = max(by_rank) + 1 if by_rank else 0
        return [by_rank[r] for r in sorted(by_rank)]

    summary: dict[str, Any] = {"output": str(dest), "files": 1, "events": 0, "ranks": 0, "tracks": 0}
    lanes: set[tuple[int, int]] = set()

    def count(part: RankPart) -> None:
        summary["events"] += part.events
        summary["ranks"] += 1
        lanes.update(part.counted_lanes)

    if one_file:
        with atomic_file(dest) as f:
            spool = Spool(scratch_dir(dest))
            try:
                ranks = gather(spool)
                origin = check_origin(min((r.first_start() for r in ranks), default=None))
                parts = [RankPart(r, names, facts, one_file=True, origin=origin, process_label=process_label)
                         for r in ranks]
                for p in parts:
                    count(p)
                dist = {"backend": "nccl" if any(r.on_gpu for r in ranks) else "gloo",
                        "world_size": facts.world_size, "ranks": [r.rank for r in ranks]}
                devices = set().union(*(r.devices for r in ranks))
                write_text(f, trace_text(head(origin, devices, dist), sorted_events(parts, names, spool)),
                           dest.name.lower().endswith(".gz"))
            finally:
                spool.close()
        summary["tracks"] = len(lanes)
        return summary

    def write_rank(tmp: Path, rows: RankRows, origin: int, spool: Spool) -> None:
        part = RankPart(rows, names, facts, one_file=False, origin=origin, process_label=process_label)
        count(part)
        with open(tmp / f"rank-{rows.rank}.json", "wb") as f:
            write_text(f, trace_text(head(origin, rows.devices, part.head(facts)), sorted_events([part], names, spool)),
                       False)

    with atomic_dir(dest, replaceable=is_timeline_folder, kind="a timeline folder") as tmp:
        spool = Spool(tmp)   # in scratch_dir(dest), where the temporary folder is made
        try:
            if origin_ns is not None and job is not None:
                done: set[int] = set()
                rows: RankRows | None = None
                low: int | None = None
                for e in stream:
                    if rows is None or e.rank != rows.rank:
                        if rows is not None:
                            write_rank(tmp, rows, origin_ns, spool)
                            done.add(rows.rank)
                            spool.reset()
                        if e.rank in done:
                            raise ValueError(f"the events of rank {e.rank} do not come together (with origin_ns)")
                        rows = RankRows(e.rank)
                        facts.add_rank(job, e.rank)
                    if e.start_ns < origin_ns:
                        raise ValueError(f"origin_ns {origin_ns} is after an event's start ({e.start_ns})")
                    low = e.start_ns if low is None else min(low, e.start_ns)
                    at, size = spool.put(e)
                    rows.add(e, at, size, names, facts)
                assert rows is not None   # the first event is there
                check_origin(low)
                write_rank(tmp, rows, origin_ns, spool)
            else:
                ranks = gather(spool)
                origin = check_origin(min(r.first_start() for r in ranks))
                for r in ranks:
                    write_rank(tmp, r, origin, spool)
        finally:
            spool.close()
    summary["files"] = summary["ranks"]
    summary["tracks"] = len(lanes)
    return summary
