"""A Kineto trace document: its top-level keys (``trace_head``), its events sorted and held
whole (:func:`kineto_traces`, :func:`chrome_trace`), and its text as Kineto lays it out,
written in pieces as the events come (:func:`trace_text`, :func:`write_text`)."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from echo_et.errors import EchoError
from echo_et.ir.io import check_output_file, written_by
from echo_et.ir.job import Job
from echo_et.ir.timeline import TimelineEvent

from .boxes import COMM_KINDS, GPU_CATS, JobFacts, RankWriter


def is_single_file(dest: str | os.PathLike[str]) -> bool:
    """Whether ``dest`` names one trace file (``*.json``, ``*.json.gz``) rather than a folder."""
    name = Path(dest).name.lower()
    return name.endswith((".json", ".json.gz"))


# A timeline folder holds rank-R.json files only: the one kind of folder write_timeline replaces.
is_timeline_folder = written_by("rank-*.json")


def check_folder_dest(dest: Path) -> None:
    """Refuse a folder destination that exists and is not a directory (a device, FIFO or
    socket is never replaced; a file is not a timeline folder)."""
    if dest.exists() and not dest.is_dir():
        check_output_file(dest)   # a device, FIFO or socket: never replaced
        raise EchoError(f"{dest}: exists and is not a directory (a timeline folder is written there; "
                        "give a .json name for one file)")


def _sorted(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    meta = [e for e in events if e["ph"] == "M"]
    rest = [e for e in events if e["ph"] != "M"]
    rest.sort(key=lambda b: (b["pid"], b["tid"], b["ts"], -b.get("dur", 0), b["ph"], b["name"]))
    return meta + rest


def _by_rank(events: Iterable[TimelineEvent]) -> dict[int, list[TimelineEvent]]:
    out: dict[int, list[TimelineEvent]] = {}
    for e in events:
        out.setdefault(e.rank, []).append(e)
    return dict(sorted(out.items()))


def _backend(events: Iterable[TimelineEvent]) -> str:
    gpu_comm = any(e.kind in COMM_KINDS and e.category in GPU_CATS for e in events)
    any_gpu = any(e.category in GPU_CATS for e in events)
    return "nccl" if gpu_comm or any_gpu else "gloo"


def trace_head(facts: JobFacts, origin: int, devices: Iterable[Any], distributed: dict[str, Any],
               metadata: Mapping[str, object] | None) -> dict[str, Any]:
    """A trace's top-level keys but ``traceEvents``: the GPUs of ``devices``, ``distributed``
    as ``distributedInfo``, ``origin`` (job-clock ns of ``ts`` 0) and echo-et's provenance
    with ``metadata`` in ``otherData``."""
    other: dict[str, Any] = {"generator": "echo-et", "time_origin_ns": origin}
    if facts.name:
        other["job"] = facts.name
    if metadata:
        other.update(metadata)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, "name": facts.gpu_name or "GPU"} for d in sorted(devices)],
        "distributedInfo": distributed,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": origin,
        "otherData": other,
    }


def _document(events: list[dict[str, Any]], facts: JobFacts, origin: int, distributed: dict[str, Any],
              metadata: Mapping[str, object] | None) -> dict[str, Any]:
    devices = {e["args"]["device"] for e in events if e.get("ph") == "X" and "device" in e.get("args", {})}
    return {**trace_head(facts, origin, devices, distributed, metadata), "traceEvents": _sorted(events)}


def kineto_traces(events: Iterable[TimelineEvent], job: Job | None = None, *,
                  metadata: Mapping[str, object] | None = None,
                  process_label: str = "rank") -> dict[int, dict[str, Any]]:
    """One Kineto trace object per rank (the folder form)."""
    by_rank = _by_rank(events)
    facts = JobFacts(job, list(by_rank))
    origin = min((e.start_ns for evs in by_rank.values() for e in evs), default=0)
    out = {}
    for rank, evs in by_rank.items():
        backend = _backend(evs)
        trace_events = RankWriter(rank, evs, facts, one_file=False, origin=origin,
                                  process_label=process_label).write()
        dist = {"backend": backend, "rank": rank, "world_size": facts.world_size,
                "pg_config": facts.pg_config(rank, backend)}
        dist["pg_count"] = len(dist["pg_config"])
        out[rank] = _document(trace_events, facts, origin, dist, metadata)
    return out


def chrome_trace(events: Iterable[TimelineEvent], job: Job | None = None, *,
                 metadata: Mapping[str, object] | None = None, process_label: str = "rank") -> dict[str, Any]:
    """One Kineto-schema trace object holding every rank (the one-file form)."""
    by_rank = _by_rank(events)
    facts = JobFacts(job, list(by_rank))
    origin = min((e.start_ns for evs in by_rank.values() for e in evs), default=0)
    trace_events: list[dict[str, Any]] = []
    for rank, evs in by_rank.items():
        trace_events += RankWriter(rank, evs, facts, one_file=True, origin=origin,
                                   process_label=process_label).write()
    # Every rank's events: a generator here would be spent by the first of _backend's two looks
    # (which made a job file "gloo" unless a GPU stream ran communication).
    dist = {"backend": _backend([e for evs in by_rank.values() for e in evs]), "world_size": facts.world_size,
            "ranks": list(by_rank)}
    return _document(trace_events, facts, origin, dist, metadata)


def dump(trace: dict[str, Any], gz: bool) -> bytes:
    """The JSON text the way Kineto lays it out: top-level keys one per line, one event per
    line (HTA finds a file's rank by the text ``"rank": N``, so the spaces matter)."""
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    data = "".join(trace_text(head, trace.get("traceEvents"))).encode()
    return gzip.compress(data, mtime=0) if gz else data


def trace_text(head: Mapping[str, Any], events: Iterable[dict[str, Any]] | None) -> Iterator[str]:
    """:func:`dump`'s text in pieces, the events written as they come (``None``: the trace
    has no ``traceEvents``)."""
    keys = sorted([*head, "traceEvents"] if events is not None else head)
    yield "{"
    for i, key in enumerate(keys):
        sep = "," if i < len(keys) - 1 else ""
        if key == "traceEvents":
            assert events is not None
            yield '\n  "traceEvents": ['
            first = True
            for e in events:
                yield ("\n  " if first else ",\n  ") + json.dumps(e, sort_keys=True)
                first = False
            yield "\n  ]" + sep
        else:
            yield f"\n  {json.dumps(key)}: {json.dumps(head[key], sort_keys=True)}{sep}"
    yield "\n}\n"


def write_text(f: BinaryIO, pieces: Iterable[str], gz: bool) -> None:
    """Write ``pieces`` to ``f`` in blocks of about 1 MB; ``gz``: gzip-compressed as
    ``gzip.compress(data, mtime=0)`` compresses the whole text (the same bytes)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31) if gz else None
    buf: list[str] = []
    size = 0
    for p in pieces:
        buf.append(p)
        size += len(p)
        if size >= 1 << 20:
            data = "".join(buf).encode()
            f.write(z.compress(data) if z is not None else data)
            buf, size = [], 0
    data = "".join(buf).encode()
    f.write(z.compress(data) + z.flush() if z is not None else data)
