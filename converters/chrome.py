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
from dataclasses import dataclass, field
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_file
from echo_et.ir.job import Job
from echo_et.ir.schema import (
    COMM_KINDS,
    STREAM_KIND_NAMES,
    collective_name,
    node_kind_name,
    pb,
)

_TRACK_ORDER = {
    pb.STREAM_CPU_THREAD: 0,
    pb.STREAM_GPU_COMPUTE: 1,
    pb.STREAM_GPU_COMM: 2,
    pb.STREAM_GPU_COPY: 3,
    pb.STREAM_UNKNOWN: 4,
}


@dataclass(frozen=True)
class TimelineEvent:
    """One box on a timeline: what ran, on which rank and track, when (job clock, ns)."""

    rank: int
    track: str                  # track (thread) name, e.g. the stream name
    name: str
    start_ns: int
    duration_ns: int
    category: str = ""          # e.g. "compute", "collective", "send"
    track_order: int = 0        # tracks of a rank are sorted by (track_order, track)
    args: Mapping[str, object] = field(default_factory=dict)


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _event_name_args(job: Job, rank: int, node: pb.Node) -> tuple[str, dict[str, object]]:
    args: dict[str, object] = {"id": node.id, "kind": node_kind_name(node.kind)}
    if node.kind == pb.KIND_COLLECTIVE:
        c = node.collective
        pg = job.resolve_group(rank, c.group)
        args.update(op=node.name, type=collective_name(c.type), bytes=c.in_bytes,
                    out_bytes=c.out_bytes, group=c.group, group_id=pg.id,
                    group_size=len(pg.ranks), seq=c.seq)
        return f"{collective_name(c.type)} {human_bytes(c.in_bytes)}", args
    if node.kind in (pb.KIND_SEND, pb.KIND_RECV):
        p = node.p2p
        peer = job.resolve_group(rank, p.group).ranks[p.peer]
        verb = "send to" if node.kind == pb.KIND_SEND else "recv from"
        args.update(op=node.name, bytes=p.bytes, peer=peer, tag=p.tag, group=p.group)
        return f"{verb} {peer} {human_bytes(p.bytes)}", args
    if node.HasField("memcpy"):
        args.update(bytes=node.memcpy.bytes, direction=node.memcpy.direction)
    if node.HasField("annotations") and node.annotations.phase:
        args["phase"] = node.annotations.phase
    return node.name, args


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
        for n in graph.nodes:
            s = streams.get(n.stream)
            track = s.name if s is not None and s.name else f"stream {n.stream}"
            order = _TRACK_ORDER.get(s.kind if s is not None else 0, 4)
            name, args = _event_name_args(job, r, n)
            if s is not None:
                args["stream_kind"] = STREAM_KIND_NAMES.get(s.kind, "unknown")
            category = ("communication" if n.kind in COMM_KINDS else node_kind_name(n.kind))
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
