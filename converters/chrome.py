"""Chrome trace-event JSON (opens in Perfetto and chrome://tracing) of a timeline.

Layout, shared by the measured timeline of a Job (``job_timeline``) and any simulated
timeline built from :class:`TimelineEvent` (``write_timeline``):

- one process per rank: ``pid`` = rank, ``process_name`` "rank R", sorted by rank;
- one thread (track) per stream: ``tid`` = track index, ``thread_name`` = stream name,
  host threads first, then compute, communication and copy streams;
- one complete event (``ph: "X"``) per node, ``ts``/``dur`` in microseconds as floats with
  three decimals, so nanoseconds survive; times are shifted so the earliest event starts at
  0 (the shift is ``otherData.time_origin_ns``);
- collectives are named "<type> <bytes>" (e.g. ``all_reduce 1.0 MiB``) and carry the exact
  ``bytes``, ``group``, ``group_ranks`` and ``seq`` in ``args``; sends/receives name their peer.

The file is a JSON object with ``traceEvents`` and ``displayTimeUnit`` (``"ns"``), written
with sorted keys so that reruns are byte-identical.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_file
from echo_et.ir.job import Job
from echo_et.ir.labels import node_label, node_track
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent

__all__ = ["TimelineEvent", "chrome_trace", "job_timeline", "write", "write_timeline"]


def job_timeline(job: Job, ranks: Sequence[int] | None = None) -> list[TimelineEvent]:
    """The measured timeline of ``job`` (each rank's node start times plus its clock offset)."""
    chosen = job.ranks() if ranks is None else sorted(set(ranks))
    known = set(job.ranks())
    bad = [r for r in chosen if r not in known]
    if bad:
        raise EchoError(f"rank {bad[0]} is not in the job (ranks 0..{job.world_size - 1})")
    events: list[TimelineEvent] = []
    for r in chosen:
        b = job.binding(r)
        graph = job.graph(b.graph)
        streams = {s.id: s for s in graph.header.streams}
        def group_of(key: str, rank: int = r) -> pb.ProcessGroup:
            return job.resolve_group(rank, key)

        for n in graph.nodes:
            name, args = node_label(n, group_of)
            track, order, category = node_track(n, streams, args)
            events.append(TimelineEvent(r, track, name, n.start_ns + b.clock_offset_ns,
                                        n.duration_ns, category, order, args))
    return events


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def chrome_trace(events: Iterable[TimelineEvent], *, metadata: Mapping[str, object] | None = None,
                 process_label: str = "rank") -> dict:
    """The Chrome trace object for ``events``."""
    evs = list(events)
    origin = min((e.start_ns for e in evs), default=0)
    tracks: dict[int, dict[str, int]] = {}
    for rank, _, track in sorted({(e.rank, e.track_order, e.track) for e in evs}):
        per_rank = tracks.setdefault(rank, {})
        if track not in per_rank:
            per_rank[track] = len(per_rank)
    out: list[dict] = []
    for rank in sorted(tracks):
        out.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": f"{process_label} {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}})
        for track, tid in tracks[rank].items():
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                        "args": {"name": track}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                        "args": {"sort_index": tid}})
    boxes = []
    for e in evs:
        box = {"ph": "X", "pid": e.rank, "tid": tracks[e.rank][e.track], "name": e.name,
               "ts": _us(e.start_ns - origin), "dur": _us(max(0, e.duration_ns))}
        if e.category:
            box["cat"] = e.category
        if e.args:
            box["args"] = dict(e.args)
        boxes.append(box)
    boxes.sort(key=lambda b: (b["pid"], b["tid"], b["ts"], -b["dur"], b["name"]))
    other = {"time_origin_ns": origin, "generator": "echo-et"}
    if metadata:
        other.update(metadata)
    return {"traceEvents": out + boxes, "displayTimeUnit": "ns", "otherData": other}


def write_timeline(events: Iterable[TimelineEvent], dest: str | os.PathLike[str], *,
                   metadata: Mapping[str, object] | None = None,
                   process_label: str = "rank") -> dict:
    """Write ``events`` as a Chrome trace JSON file (atomically, deterministic bytes);
    returns a summary (path, events, ranks, tracks)."""
    trace = chrome_trace(events, metadata=metadata, process_label=process_label)
    dest = Path(dest)
    with atomic_file(dest) as f:
        f.write(json.dumps(trace, sort_keys=True, separators=(",", ":")).encode())
    boxes = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    return {
        "output": str(dest),
        "events": len(boxes),
        "ranks": len({e["pid"] for e in boxes}),
        "tracks": len({(e["pid"], e["tid"]) for e in boxes}),
    }


def write(job: Job, dest: str | os.PathLike[str], ranks: Sequence[int] | None = None) -> dict:
    """The measured timeline of ``job`` as a Chrome trace file."""
    meta = {"job": job.manifest.name, "world_size": job.world_size,
            "source_format": job.manifest.provenance.source_format}
    return write_timeline(job_timeline(job, ranks), dest, metadata=meta)
