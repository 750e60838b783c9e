"""The measured timeline of a Job in Kineto's schema (``echo-et export chrome``): :func:`write`
streams each rank's events from its stored nodes and repeat blocks (:mod:`.job_events`);
:func:`job_timeline` gives every event, held."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_dir, atomic_file
from echo_et.ir.job import Job
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent, graph_events

from .boxes import JobFacts, RankWriter, to_us
from .document import check_folder_dest, is_single_file, is_timeline_folder, trace_head, trace_text, write_text
from .job_events import RankEvents, RankPlan
from .spool import ScratchEstimate
from .timeline import timeline_scratch, write_timeline


def write(job: Job, dest: str | os.PathLike[str], ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """The measured timeline of ``job`` in Kineto's schema (see :func:`.timeline.write_timeline`),
    streamed: each rank's events are made in the trace's order from its stored nodes and
    repeat blocks and written as they come, no graph is expanded, and the bytes are those of
    ``write_timeline(job_timeline(job, ranks), dest, job=job, metadata=...)``."""
    meta = {"world_size": job.world_size, "source_format": job.manifest.provenance.source_format}
    got = _streamed(job, Path(dest), ranks, meta)
    if got is not None:
        return got
    return write_timeline(job_timeline(job, ranks), dest, job=job, metadata=meta)


def job_timeline(job: Job, ranks: Sequence[int] | None = None) -> list[TimelineEvent]:
    """The measured timeline of ``job`` (each rank's node start times plus its clock offset),
    every event held (the expanded graphs' nodes: :func:`write` streams them instead)."""
    chosen = _chosen(job, ranks)
    events: list[TimelineEvent] = []
    for r in chosen:
        b = job.binding(r)
        graph = job.graph(b.graph)
        nodes = graph.nodes
        offset = b.clock_offset_ns

        def span(idx: int, nodes=nodes, offset: int = offset) -> tuple[int, int, None]:
            n = nodes[idx]
            return n.start_ns + offset, n.start_ns + offset + n.duration_ns, None

        def group_of(key: str, rank: int = r) -> pb.ProcessGroup:
            return job.resolve_group(rank, key)

        events.extend(graph_events(r, graph, span, group_of))
    return events


def _step_box(plan: RankPlan, writer: RankWriter, origin: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rank's ``ProfilerStep`` box (and its thread name when it has no host thread)."""
    s, d = plan.last
    start = to_us(plan.first_ns - origin)
    end = round(to_us(s - origin) + to_us(d), 3)
    return writer.profiler_step(start, end)


def _chosen(job: Job, ranks: Sequence[int] | None) -> list[int]:
    chosen = job.ranks() if ranks is None else sorted(set(ranks))
    known = set(job.ranks())
    bad = [r for r in chosen if r not in known]
    if bad:
        raise EchoError(f"rank {bad[0]} is not in the job (ranks 0..{job.world_size - 1})")
    return chosen


def _plan(job: Job, ranks: Sequence[int] | None, one_file: bool
          ) -> tuple[list[RankPlan], int, JobFacts, dict[int, RankWriter]]:
    """The plans of the ranks with events, the trace's time 0, the job's facts and each
    rank's writer (its lanes)."""
    plans = [p for r in _chosen(job, ranks) if (p := RankPlan(job, r)).count]
    origin = min((p.first_ns for p in plans), default=0)
    facts = JobFacts(job, [p.rank for p in plans])
    writers = {p.rank: RankWriter(p.rank, [], facts, one_file=one_file, origin=origin, process_label="rank",
                                  tracks=p.tracks()) for p in plans}
    return plans, origin, facts, writers


def _pid_ranks(plans: list[RankPlan], writers: dict[int, RankWriter]) -> dict[int, int] | None:
    """The rank of each process id in one file; None when ranks share one."""
    pids: dict[int, int] = {}
    for p in plans:
        w = writers[p.rank]
        for pid in {lane[0] for lane in w.lanes.values()} | {w.host_pid}:
            if pids.setdefault(pid, p.rank) != p.rank:
                return None
    return pids


def export_scratch(job: Job, dest: str | os.PathLike[str], ranks: Sequence[int] | None = None
                   ) -> ScratchEstimate | None:
    """The scratch file :func:`write` keeps at its largest: None when it streams (a folder,
    and one file unless ranks share a process id there; then every event goes through
    :func:`.timeline.write_timeline`, whose scratch file holds them all)."""
    if not is_single_file(dest):
        return None
    plans, _, _, writers = _plan(job, ranks, True)
    if _pid_ranks(plans, writers) is not None:
        return None
    return timeline_scratch(dest, [p.count for p in plans], by_rank=False)


def _streamed(job: Job, dest: Path, ranks: Sequence[int] | None, metadata: Mapping[str, object]
              ) -> dict[str, Any] | None:
    """Write the measured timeline of ``job`` without expanding a graph (see
    :func:`write`); None when ranks of one file share a process id (then the whole writer
    orders them)."""
    one_file = is_single_file(dest)
    plans, origin, facts, writers = _plan(job, ranks, one_file)
    lanes = {lane[:2] for w in writers.values() for lane in w.lanes.values()}
    summary = {"output": str(dest), "files": 1 if one_file else len(plans),
               "events": sum(p.count for p in plans), "ranks": len(plans), "tracks": len(lanes)}

    def head(devices: set[int], dist: dict[str, Any]) -> dict[str, Any]:
        return trace_head(facts, origin, devices, dist, metadata)

    if one_file:
        pids = _pid_ranks(plans, writers)
        if pids is None:
            return None
        steps = {p.rank: _step_box(p, writers[p.rank], origin) for p in plans}
        by_rank = {p.rank: p for p in plans}

        def events() -> Iterator[dict[str, Any]]:
            for p in plans:
                yield from writers[p.rank].metadata()
                yield from steps[p.rank][0]
            order = sorted(pids.items())
            i = 0
            while i < len(order):
                rank = order[i][1]
                mine = set()
                while i < len(order) and order[i][1] == rank:
                    mine.add(order[i][0])
                    i += 1
                w = writers[rank]
                step = steps[rank][1] if w.host_pid in mine else None
                yield from RankEvents(by_rank[rank], w, origin).events(mine, step)

        devices = set().union(*(p.devices(facts) for p in plans))
        dist = {"backend": "nccl" if any(p.on_gpu() for p in plans) else "gloo", "world_size": facts.world_size,
                "ranks": [p.rank for p in plans]}
        with atomic_file(dest) as f:
            write_text(f, trace_text(head(devices, dist), events()), dest.name.lower().endswith(".gz"))
        return summary
    check_folder_dest(dest)
    if not plans:
        raise EchoError("no events to write")
    with atomic_dir(dest, replaceable=is_timeline_folder, kind="a timeline folder") as tmp:
        for p in plans:
            w = writers[p.rank]
            meta, step = _step_box(p, w, origin)
            backend = "nccl" if p.on_gpu() else "gloo"
            dist = {"backend": backend, "rank": p.rank, "world_size": facts.world_size,
                    "pg_config": facts.pg_config(p.rank, backend)}
            dist["pg_count"] = len(dist["pg_config"])
            rank_events = itertools.chain(w.metadata(), meta,
                                          RankEvents(p, w, origin).events({lane[0] for lane in w.lanes.values()}
                                                                          | {w.host_pid}, step))
            with open(tmp / f"rank-{p.rank}.json", "wb") as f:
                write_text(f, trace_text(head(p.devices(facts), dist), rank_events), False)
    return summary
