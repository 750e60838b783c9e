"""A timeline (measured or simulated) in Kineto's own trace schema: the JSON that
``torch.profiler`` writes, which HolisticTraceAnalysis (HTA), Perfetto, chrome://tracing and
TensorBoard read, and which ``echo-et convert`` reads back.

Two forms, chosen by the destination's name:

- a folder (any name not ending in ``.json`` / ``.json.gz``): one file per rank,
  ``rank-<R>.json``, each with ``distributedInfo.rank``: the layout HTA's
  ``TraceAnalysis(trace_dir=...)`` and ``echo-et convert`` read;
- one file (``*.json``, ``*.json.gz``): every rank in one trace, for Perfetto.

What each rank's events look like (the schema of Kineto 2.x, PyTorch 2.x):

- host threads: process ``pid`` = 1000000 + rank (a stand-in for the OS pid), one ``tid``
  per host stream (its traced thread id when the source had one); operators are
  ``cpu_op``, launches and syncs ``cuda_runtime`` with a ``correlation`` id; a
  ``ProfilerStep#N`` ``user_annotation`` spans the rank's step on its first host thread
  (on a thread of its own when the rank has none);
- GPU streams: ``pid`` = the device index (per-rank files; in one job file 2000000 +
  100 x rank + device, so ranks do not share a process), ``tid`` = the CUDA stream number,
  and ``args.device`` / ``args.stream`` / ``args.correlation`` as Kineto writes them;
  kernels are ``kernel``, copies ``gpu_memcpy`` / ``gpu_memset``; an ``ac2g`` flow links
  each launch to its kernels;
- communication on a GPU stream is an NCCL kernel (``ncclDevKernel_*`` when the node's own
  name is not one) with the metadata ``record_param_comms`` gives it: ``Collective name``,
  ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Name``,
  ``Process Group Description``, ``Process Group Ranks``, ``In split size`` / ``Out split
  size``, and ``Src Rank`` / ``Dst Rank`` (group ranks) for send/recv; communication on a
  host thread (gloo, ex-situ traces) is a ``gloo:<op>`` ``user_annotation`` with the same
  args;
- a collective's box spans its wait for the last member and its transfer, as the profiler
  records the kernel; ``args.wait_ns`` says how much of it was waiting;
- top level: ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (backend, rank,
  world size, ``pg_config`` with the groups the rank is in), ``displayTimeUnit`` ("ms"),
  ``baseTimeNanoseconds`` (the job-clock instant of ``ts`` 0), ``traceEvents``, and
  ``otherData`` (echo-et's provenance);
- ``ts``/``dur`` in microseconds with three decimals, so nanoseconds survive; keys sorted,
  so reruns are byte-identical. echo-et's own labels (``id``, ``kind``, ``bytes``,
  ``group``, ``seq``, ...) stay in ``args`` beside Kineto's.
"""

from __future__ import annotations

import gzip
import heapq
import itertools
import json
import marshal
import os
import pickle
import re
import tempfile
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.collectives import (
    RECV,
    SEND,
    collective_word,
    nccl_kernel_name,
    pytorch_collective_name,
)
from echo_et.ir.dtypes import c10_name, dtype_size
from echo_et.ir.io import atomic_dir, atomic_file, check_output_file, written_by
from echo_et.ir.job import Job
from echo_et.ir.labels import (
    KINETO_ANNOTATION,
    KINETO_CPU_OP,
    KINETO_KERNEL,
    KINETO_MEMCPY,
    KINETO_MEMSET,
    KINETO_RUNTIME,
    kineto_category,
    node_track,
)
from echo_et.ir.repeats import Body, ExpandedNodes, copy_node, instance_deps
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent, TimelineStream, graph_events, launch_of, node_event

__all__ = ["TimelineEvent", "chrome_trace", "is_single_file", "job_timeline", "kineto_traces", "write",
           "write_timeline", "write_timeline_whole"]

HOST_PID_BASE = 1_000_000
JOB_GPU_PID_BASE = 2_000_000
# Correlation ids (launch -> kernel) are the launch node's id plus this: HolisticTraceAnalysis
# downcasts the correlation column to the smallest integer type and writes row indices into a
# column of that type; with pandas 3 a trace of more than 32,767 events whose ids all fit in
# int16 then fails to load (TypeError in transform_correlation_to_index).
CORRELATION_BASE = 1 << 16
_GPU_CATS = frozenset({KINETO_KERNEL, KINETO_MEMCPY, KINETO_MEMSET})
_COMM_KINDS = frozenset({pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV})
# An NCCL kernel's name as trace tools match it (HTA: ``^nccl.*Kernel``); "void " dropped.
_NCCL_KERNEL_NAME = re.compile(r"^(?:void\s+)?((?:nccl|rccl)\w*Kernel.*)$", re.DOTALL)


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


def is_single_file(dest: str | os.PathLike[str]) -> bool:
    """Whether ``dest`` names one trace file (``*.json``, ``*.json.gz``) rather than a folder."""
    name = Path(dest).name.lower()
    return name.endswith((".json", ".json.gz"))


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


class _JobFacts:
    """What the trace says about the job besides its events: groups, world size, GPU."""

    def __init__(self, job: Job | None, ranks: list[int]):
        self.world_size = job.world_size if job is not None else (max(ranks) + 1 if ranks else 0)
        self.gpu_name = job.manifest.hardware.gpu_name if job is not None else ""
        self.gpus_per_node = int(job.manifest.hardware.gpus_per_node or 0) if job is not None else 0
        self.name = job.manifest.name if job is not None else ""
        self.step = 0
        groups = list(job.manifest.groups) if job is not None else []
        self.groups = {g.id: g for g in groups}
        names = [g.name for g in groups]
        self.pg_name = {g.id: (g.name if g.name and names.count(g.name) == 1 else str(g.id)) for g in groups}
        self.rank_groups: dict[int, list[int]] = {}
        if job is not None:
            for r in ranks:
                self.add_rank(job, r)
            steps = {job.graph(gid).header.attrs.get("kineto.step", "") for gid in job.graph_ids()}
            if len(steps) == 1 and next(iter(steps)).isdigit():
                self.step = int(next(iter(steps)))

    def add_rank(self, job: Job | None, rank: int) -> None:
        """Know the groups of ``rank`` (for its ``pg_config``)."""
        if job is not None and rank not in self.rank_groups:
            self.rank_groups[rank] = sorted(set(job.binding(rank).groups.values()))

    def device_of(self, rank: int, stream: TimelineStream | None) -> int:
        if stream is not None and stream.device >= 0:
            return stream.device
        return rank % self.gpus_per_node if self.gpus_per_node else 0

    def pg_config(self, rank: int, backend: str) -> list[dict[str, Any]]:
        out = []
        for gid in self.rank_groups.get(rank, []):
            g = self.groups.get(gid)
            if g is None:
                continue
            out.append({"pg_name": self.pg_name[gid], "pg_desc": g.desc or g.name or f"group {gid}",
                        "backend_config": "cuda:nccl" if backend == "nccl" else "cpu:gloo",
                        "pg_size": len(g.ranks), "ranks": list(g.ranks)})
        return out


def _comm_args(e: TimelineEvent, facts: _JobFacts) -> dict[str, Any]:
    """The metadata PyTorch's record_param_comms puts on an NCCL kernel (and on its op)."""
    a = e.args
    gid = a.get("group_id")
    g = facts.groups.get(gid) if isinstance(gid, int) else None
    if e.kind == pb.KIND_COLLECTIVE:
        coll = collective_word(str(a.get("type", ""))) or 0
        dtype = str(a.get("dtype", ""))
        size = dtype_size(dtype) or 1
        name = c10_name(dtype) or "Byte"
        in_b, out_b = int(a.get("bytes", 0)), int(a.get("out_bytes", a.get("bytes", 0)))
        out: dict[str, Any] = {"Collective name": pytorch_collective_name(coll),
                               "In msg nelems": in_b // size, "Out msg nelems": out_b // size, "dtype": name}
    else:
        word = SEND if e.kind == pb.KIND_SEND else RECV
        nbytes = int(a.get("bytes", 0))
        out = {"Collective name": pytorch_collective_name(word), "In msg nelems": nbytes,
               "Out msg nelems": nbytes, "dtype": "Byte"}
        peer = a.get("group_peer")
        if isinstance(peer, int):
            out["Dst Rank" if word == SEND else "Src Rank"] = peer
    out["In split size"] = "[]"
    out["Out split size"] = "[]"
    if g is not None:
        out["Group size"] = len(g.ranks)
        out["Process Group Name"] = facts.pg_name[g.id]
        out["Process Group Description"] = g.desc or g.name or f"group {g.id}"
        out["Process Group Ranks"] = json.dumps(list(g.ranks))
    return out


def _cat_name(e: TimelineEvent) -> tuple[str, str]:
    """The Kineto ``cat`` and ``name`` of ``e``'s box (what :meth:`_RankWriter.box` gives it)."""
    cat, name = e.category or KINETO_CPU_OP, e.name
    if e.kind not in _COMM_KINDS:
        return cat, name
    if e.args.get("op"):
        name = str(e.args["op"])   # the node's own name
    if e.category in _GPU_CATS:
        kernel = _NCCL_KERNEL_NAME.match(name)
        if kernel is not None:
            return cat, kernel.group(1)
        coll = (collective_word(str(e.args.get("type", ""))) or 0) if e.kind == pb.KIND_COLLECTIVE \
            else (SEND if e.kind == pb.KIND_SEND else RECV)
        return cat, nccl_kernel_name(coll)
    word = str(e.args.get("type", "")) if e.kind == pb.KIND_COLLECTIVE else \
        ("send" if e.kind == pb.KIND_SEND else "recv")
    return KINETO_ANNOTATION, f"gloo:{word}"


# A rank's tracks: (on a GPU, track name) -> (track order, stream of its first box).
_Tracks = dict[tuple[bool, str], tuple[int, TimelineStream | None]]


def _tracks(events: Iterable[TimelineEvent]) -> _Tracks:
    tracks: _Tracks = {}
    for e in events:
        key = (e.category in _GPU_CATS, e.track)
        if key not in tracks:
            tracks[key] = (e.track_order, e.stream)
    return tracks


class _RankWriter:
    """The Kineto events of one rank."""

    def __init__(self, rank: int, events: list[TimelineEvent], facts: _JobFacts, *, one_file: bool,
                 origin: int, process_label: str, tracks: _Tracks | None = None):
        self.rank = rank
        self.events = events
        self.facts = facts
        self.one_file = one_file
        self.origin = origin
        self.process_label = process_label
        self.host_pid = HOST_PID_BASE + rank
        self.out: list[dict[str, Any]] = []
        self.lanes: dict[tuple[bool, str], tuple[int, int, int]] = {}   # (gpu, track) -> (pid, tid, order)
        self._assign_lanes(tracks if tracks is not None else _tracks(events))

    def gpu_pid(self, device: int) -> int:
        return JOB_GPU_PID_BASE + 100 * self.rank + device if self.one_file else device

    def _assign_lanes(self, tracks: _Tracks) -> None:
        """pid/tid of every track: traced ids where the source had them, fresh ones
        (unique in the rank) otherwise; GPU stream numbers are > 0 (HTA needs that)."""
        for gpu in (False, True):
            mine = sorted(((order, track, s) for (g, track), (order, s) in tracks.items() if g == gpu),
                          key=lambda x: (x[0], x[1]))
            used: set[int] = set()
            chosen: dict[str, int] = {}
            for _, track, s in mine:
                n = s.native_id if s is not None else 0
                if n > 0 and n not in used:
                    chosen[track] = n
                    used.add(n)
            nxt = max(used, default=6) + 1
            for _, track, _s in mine:
                if track not in chosen:
                    while nxt in used:
                        nxt += 1
                    chosen[track] = nxt
                    used.add(nxt)
            for k, (_, track, s) in enumerate(mine):
                pid = self.gpu_pid(self.facts.device_of(self.rank, s)) if gpu else self.host_pid
                self.lanes[(gpu, track)] = (pid, chosen[track], k)

    def write(self) -> list[dict[str, Any]]:
        self.out.extend(self.metadata())
        correlation: dict[int, int] = {}
        for e in self.events:
            if e.kind == pb.KIND_LAUNCH and e.node_id:
                correlation[e.node_id] = CORRELATION_BASE + e.node_id
        launches: dict[int, tuple[int, int, int]] = {}   # launch correlation id -> (pid, tid, ts)
        for e in self.events:
            box = self.box(e, correlation.get(e.launch_id, 0))
            self.out.append(box)
            if e.kind == pb.KIND_LAUNCH and e.node_id:
                launches[correlation[e.node_id]] = (box["pid"], box["tid"], box["ts"])
        self._flows(launches)
        self._profiler_step()
        return self.out

    def metadata(self) -> list[dict[str, Any]]:
        """The process and thread names and sort indices of the rank's lanes."""
        out: list[dict[str, Any]] = []
        pids: dict[int, str] = {self.host_pid: "CPU"}
        for (gpu, _), (pid, _, _) in self.lanes.items():
            if gpu:
                pids[pid] = f"GPU {pid - JOB_GPU_PID_BASE - 100 * self.rank if self.one_file else pid}"
        for pid, label in sorted(pids.items()):
            sort = (self.rank * 1000 + (0 if label == "CPU" else 1 + int(label[4:]))) if self.one_file else \
                (pid if label != "CPU" else 0)
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": f"{self.process_label} {self.rank}"}})
            out.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                        "args": {"sort_index": sort}})
        for (gpu, track), (pid, tid, order) in sorted(self.lanes.items(), key=lambda kv: kv[1]):
            name = f"stream {tid} ({track})" if gpu else f"thread {tid} ({track})"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                        "args": {"sort_index": order}})
        return out

    def box(self, e: TimelineEvent, launch_corr: int) -> dict[str, Any]:
        """The Kineto event of ``e``; ``launch_corr``: the correlation id of the launch that
        issued it (0 none)."""
        gpu = e.category in _GPU_CATS
        pid, tid, _ = self.lanes[(gpu, e.track)]
        args: dict[str, Any] = dict(e.args)
        cat, name = _cat_name(e)
        if e.kind in _COMM_KINDS and e.args.get("op"):
            args["label"] = e.name   # the box is named after the node; its label stays in args
        if gpu:
            corr = launch_corr
            args.update({"device": self.facts.device_of(self.rank, e.stream), "stream": tid,
                         "correlation": corr, "External id": corr})
            if e.kind in _COMM_KINDS:
                args.update(_comm_args(e, self.facts))
        elif e.kind in _COMM_KINDS:
            args.update(_comm_args(e, self.facts))
        elif cat == KINETO_RUNTIME:
            corr = CORRELATION_BASE + e.node_id   # what the correlation map holds for a launch
            args.update({"correlation": corr, "External id": corr})
        elif e.node_id:
            args.setdefault("External id", e.node_id)
        box = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
               "ts": _us(e.start_ns - self.origin), "dur": _us(max(0, e.duration_ns))}
        if args:
            box["args"] = args
        return box

    def _flows(self, launches: dict[int, tuple[int, int, float]]) -> None:
        """``ac2g`` flow arrows from each launch to the kernels it issued."""
        flows = []
        for box in self.out:
            if box.get("ph") != "X" or box["cat"] not in _GPU_CATS:
                continue
            corr = box["args"].get("correlation", 0)
            if corr and corr in launches:
                pid, tid, ts = launches[corr]
                flows.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g",
                              "name": "ac2g"})
                flows.append({"ph": "f", "id": corr, "pid": box["pid"], "tid": box["tid"], "ts": box["ts"],
                              "cat": "ac2g", "name": "ac2g", "bp": "e"})
        seen: set[tuple] = set()
        for f in flows:
            k = (f["ph"], f["id"], f["pid"], f["tid"], f["ts"])
            if k not in seen:
                seen.add(k)
                self.out.append(f)

    def _profiler_step(self) -> None:
        """``ProfilerStep#N`` over the rank's whole step, on its first host thread."""
        boxes = [b for b in self.out if b.get("ph") == "X"]
        if not boxes:
            return
        start = min(b["ts"] for b in boxes)
        end = max(round(b["ts"] + b["dur"], 3) for b in boxes)
        meta, step = self.profiler_step(start, end)
        self.out.extend(meta)
        self.out.append(step)

    def profiler_step(self, start: float, end: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The ``ProfilerStep#N`` box from ``start`` to ``end`` (us), and the thread name it
        needs when the rank has no host thread."""
        host = [(order, tid) for (gpu, _), (_, tid, order) in self.lanes.items() if not gpu]
        meta = []
        if host:
            tid = min(host)[1]
        else:
            tid = 1
            meta.append({"ph": "M", "name": "thread_name", "pid": self.host_pid, "tid": tid,
                         "args": {"name": f"thread {tid} (main)"}})
        return meta, {"ph": "X", "cat": KINETO_ANNOTATION, "name": f"ProfilerStep#{self.facts.step}",
                      "pid": self.host_pid, "tid": tid, "ts": start, "dur": round(end - start, 3),
                      "args": {"External id": 0}}


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
    gpu_comm = any(e.kind in _COMM_KINDS and e.category in _GPU_CATS for e in events)
    any_gpu = any(e.category in _GPU_CATS for e in events)
    return "nccl" if gpu_comm or any_gpu else "gloo"


def _document(events: list[dict[str, Any]], facts: _JobFacts, origin: int, distributed: dict[str, Any],
              metadata: Mapping[str, object] | None) -> dict[str, Any]:
    other: dict[str, Any] = {"generator": "echo-et", "time_origin_ns": origin}
    if facts.name:
        other["job"] = facts.name
    if metadata:
        other.update(metadata)
    devices = sorted({e["args"]["device"] for e in events if e.get("ph") == "X" and "device" in e.get("args", {})})
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, "name": facts.gpu_name or "GPU"} for d in devices],
        "distributedInfo": distributed,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": origin,
        "traceEvents": _sorted(events),
        "otherData": other,
    }


def kineto_traces(events: Iterable[TimelineEvent], job: Job | None = None, *,
                  metadata: Mapping[str, object] | None = None,
                  process_label: str = "rank") -> dict[int, dict[str, Any]]:
    """One Kineto trace object per rank (the folder form)."""
    by_rank = _by_rank(events)
    facts = _JobFacts(job, list(by_rank))
    origin = min((e.start_ns for evs in by_rank.values() for e in evs), default=0)
    out = {}
    for rank, evs in by_rank.items():
        backend = _backend(evs)
        trace_events = _RankWriter(rank, evs, facts, one_file=False, origin=origin,
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
    facts = _JobFacts(job, list(by_rank))
    origin = min((e.start_ns for evs in by_rank.values() for e in evs), default=0)
    trace_events: list[dict[str, Any]] = []
    for rank, evs in by_rank.items():
        trace_events += _RankWriter(rank, evs, facts, one_file=True, origin=origin,
                                    process_label=process_label).write()
    # Every rank's events: a generator here would be spent by the first of _backend's two looks
    # (which made a job file "gloo" unless a GPU stream ran communication).
    dist = {"backend": _backend([e for evs in by_rank.values() for e in evs]), "world_size": facts.world_size,
            "ranks": list(by_rank)}
    return _document(trace_events, facts, origin, dist, metadata)


def _dump(trace: dict[str, Any], gz: bool) -> bytes:
    """The JSON text the way Kineto lays it out: top-level keys one per line, one event per
    line (HTA finds a file's rank by the text ``"rank": N``, so the spaces matter)."""
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    data = "".join(_text(head, trace.get("traceEvents"))).encode()
    return gzip.compress(data, mtime=0) if gz else data


def _text(head: Mapping[str, Any], events: Iterable[dict[str, Any]] | None) -> Iterator[str]:
    """:func:`_dump`'s text in pieces, the events written as they come (``None``: the trace
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


def _write_text(f: BinaryIO, pieces: Iterable[str], gz: bool) -> None:
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


# A timeline folder holds rank-R.json files only: the one kind of folder write_timeline replaces.
_is_timeline_folder = written_by("rank-*.json")


def write_timeline_whole(events: Iterable[TimelineEvent], dest: str | os.PathLike[str], *, job: Job | None = None,
                   metadata: Mapping[str, object] | None = None, process_label: str = "rank") -> dict[str, Any]:
    """:func:`write_timeline` with every event, box and line held before the first byte is
    written (its sorted whole-trace form): the reference that the streamed writer's bytes are
    compared with (tests/test_timeline_stream.py)."""
    dest = Path(dest)
    if is_single_file(dest):
        trace = chrome_trace(events, job, metadata=metadata, process_label=process_label)
        with atomic_file(dest) as f:
            f.write(_dump(trace, dest.name.lower().endswith(".gz")))
        return _summary(dest, [trace], 1)
    if dest.exists() and not dest.is_dir():
        check_output_file(dest)   # a device, FIFO or socket: never replaced
        raise EchoError(f"{dest}: exists and is not a directory (a timeline folder is written there; "
                        "give a .json name for one file)")
    traces = kineto_traces(events, job, metadata=metadata, process_label=process_label)
    if not traces:
        raise EchoError("no events to write")
    with atomic_dir(dest, replaceable=_is_timeline_folder,
                    kind="a timeline folder") as tmp:
        for rank, trace in traces.items():
            (tmp / f"rank-{rank}.json").write_bytes(_dump(trace, False))
    return _summary(dest, list(traces.values()), len(traces))


# --- A timeline written as its events come ------------------------------------------------------
#
# write_timeline reads its events once. Each event goes to an unnamed scratch file beside the
# output (``marshal``; ``pickle`` for what marshal refuses) and leaves a few numbers behind: its
# track, start, duration, interned box name, launch, and where its record lies. A rank's trace is
# sorted on those numbers with the whole writer's key (lane, ts, -dur, ph, name, then the order
# the events came in), and each box is made again from its record as it is written. The ``ac2g``
# flows sort after every box of their lane and instant (their ph, "f" or "s", comes after "X",
# their dur is 0), so they are written as the sorted boxes leave that instant: a kernel's "f"
# there, a launch's "s" at the launch's own box, each in the order of the kernel that made it.
# With ``origin_ns`` (the events' first start, known beforehand) and a Job, a folder's rank
# files are written one at a time as each rank's events end, and only that rank's numbers are
# held; otherwise (and always for one file, whose head needs every rank) every rank's numbers are
# held until the last event: tens of bytes per box, never the events themselves.

_ROWS_CHUNK = 1 << 16


_EVENT_FIELDS = ("rank", "track", "name", "start_ns", "duration_ns", "category", "track_order", "args", "kind",
                 "stream", "node_id", "launch_id")


class _Spool:
    """The events of a timeline in an unnamed scratch file, each read back by its position."""

    def __init__(self, where: Path):
        self.f = tempfile.TemporaryFile(dir=where)  # noqa: SIM115 - closed by close()
        self.fd = self.f.fileno()
        self.end = 0
        self.streams: list[TimelineStream | None] = []   # held: their ids key _stream_ix
        self._stream_ix: dict[int, int] = {}

    def put(self, e: TimelineEvent) -> tuple[int, int]:
        """Store ``e``; (offset, size) of its record."""
        ix = self._stream_ix.get(id(e.stream))
        if ix is None:
            ix = self._stream_ix[id(e.stream)] = len(self.streams)
            self.streams.append(e.stream)
        args = e.args if type(e.args) is dict else dict(e.args)
        rec = (e.rank, e.track, e.name, e.start_ns, e.duration_ns, e.category, e.track_order, args,
               e.kind, ix, e.node_id, e.launch_id)
        try:
            data = b"m" + marshal.dumps(rec)
        except ValueError:   # a value marshal does not take (a subclass of int or str, ...)
            data = b"p" + pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL)
        self.f.write(data)
        at = self.end
        self.end += len(data)
        return at, len(data)

    def ready(self) -> None:
        """Make what was stored readable (before :meth:`get`)."""
        self.f.flush()

    def get(self, at: int, size: int) -> TimelineEvent:
        data = os.pread(self.fd, size, at)
        rec = marshal.loads(data[1:]) if data[:1] == b"m" else pickle.loads(data[1:])  # noqa: S301 - our own file
        # The event's own fields, set without TimelineEvent's frozen __init__ (6 us a box, most
        # of the cost of reading one back); the stream is the very object the event had.
        e = object.__new__(TimelineEvent)
        e.__dict__.update(zip(_EVENT_FIELDS, rec, strict=True))
        e.__dict__["stream"] = self.streams[rec[9]]
        return e

    def reset(self) -> None:
        """Forget every record (the streams stay known)."""
        self.f.seek(0)
        self.f.truncate()
        self.end = 0

    def close(self) -> None:
        self.f.close()


class _RankRows:
    """What the streamed writer keeps of one rank's events: per box its track (index into
    ``tracks``), start, duration (ns, >= 0), name (interned), launch (a GPU box's
    ``launch_id``, 0 for others) and its record's place in the spool; the rank's launches
    (row, node id) and devices."""

    def __init__(self, rank: int):
        self.rank = rank
        self.tracks: _Tracks = {}
        self.track_ix: dict[tuple[bool, str], int] = {}
        self.track = array("i")
        self.start = array("q")
        self.dur = array("q")
        self.name = array("i")
        self.launch = array("q")
        self.at = array("q")
        self.size = array("q")
        self.launch_rows = array("q")
        self.launch_ids = array("q")
        self.devices: set[Any] = set()
        self.on_gpu = False
        self._device: dict[int, Any] = {}   # by id of a stream the spool holds

    def add(self, e: TimelineEvent, at: int, size: int, names: dict[str, int], facts: _JobFacts) -> None:
        gpu = e.category in _GPU_CATS
        key = (gpu, e.track)
        t = self.track_ix.get(key)
        if t is None:
            t = self.track_ix[key] = len(self.track_ix)
            self.tracks[key] = (e.track_order, e.stream)
        name = _cat_name(e)[1] if e.kind in _COMM_KINDS else e.name
        n = names.get(name)
        if n is None:
            n = names[name] = len(names)
        if e.kind == pb.KIND_LAUNCH and e.node_id:
            self.launch_rows.append(len(self.start))
            self.launch_ids.append(e.node_id)
        self.track.append(t)
        self.start.append(e.start_ns)
        self.dur.append(max(0, e.duration_ns))
        self.name.append(n)
        self.at.append(at)
        self.size.append(size)
        if gpu:
            self.launch.append(e.launch_id)
            self.on_gpu = True
            d = self._device.get(id(e.stream))
            if d is None:
                d = self._device[id(e.stream)] = facts.device_of(self.rank, e.stream)
                self.devices.add(d)
        else:
            self.launch.append(0)
            if "device" in e.args:
                self.devices.add(e.args["device"])

    def __len__(self) -> int:
        return len(self.start)

    def release(self) -> None:
        """Drop the per-box numbers (after they were sorted)."""
        for name in ("track", "start", "dur", "name", "launch", "at", "size", "launch_rows", "launch_ids"):
            setattr(self, name, array(getattr(self, name).typecode))


def _np(a: array, dtype: Any) -> np.ndarray:
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)


# Below this many ns, ``ns / 1000.0`` is already :func:`_us` (the float nearest the exact
# microseconds, which round(..., 3) keeps), so a column is converted at once.
_EXACT_US_NS = 1 << 50


def _us_column(ns: np.ndarray) -> np.ndarray:
    """:func:`_us` of each of ``ns`` (>= 0)."""
    if not ns.size or int(ns.max()) < _EXACT_US_NS:
        return ns / 1000.0
    return np.array([_us(v) for v in ns.tolist()], dtype=np.float64)


class _RankPart:
    """One rank's part of a trace: its writer (lanes), ``ProfilerStep``, sort columns and
    what the summary counts (boxes and lanes, the ``ProfilerStep`` span not among them)."""

    def __init__(self, rows: _RankRows, names: dict[str, int], facts: _JobFacts, *, one_file: bool, origin: int,
                 process_label: str):
        self.rows = rows
        self.writer = _RankWriter(rows.rank, [], facts, one_file=one_file, origin=origin,
                                  process_label=process_label, tracks=rows.tracks)
        self.origin = origin
        ts, dur = self.times()
        end = round(float(np.max(ts + dur)), 3)   # round() is monotone: the latest box end
        self.step_meta, self.step = self.writer.profiler_step(float(np.min(ts)), end)
        self.lanes = [self.writer.lanes[k][:2] for k in rows.track_ix]
        self.step_lane = (self.step["pid"], self.step["tid"])
        steps = np.array([i for n, i in names.items() if n.startswith("ProfilerStep#")], dtype=np.int32)
        counted = ~np.isin(_np(rows.name, np.int32), steps)
        self.events = int(np.count_nonzero(counted))
        tracks = np.unique(_np(rows.track, np.int32)[counted]).tolist()
        self.counted_lanes = {self.lanes[t] for t in tracks}

    def times(self) -> tuple[np.ndarray, np.ndarray]:
        """``ts`` and ``dur`` of the rank's boxes (us, as written)."""
        return _us_column(_np(self.rows.start, np.int64) - self.origin), _us_column(_np(self.rows.dur, np.int64))

    def head(self, facts: _JobFacts) -> dict[str, Any]:
        backend = "nccl" if self.rows.on_gpu else "gloo"
        dist = {"backend": backend, "rank": self.rows.rank, "world_size": facts.world_size,
                "pg_config": facts.pg_config(self.rows.rank, backend)}
        dist["pg_count"] = len(dist["pg_config"])
        return dist


def _sorted_events(parts: list[_RankPart], names: dict[str, int], spool: _Spool) -> Iterator[dict[str, Any]]:
    """The events of ``parts`` (ranks in order) in the trace's order: metadata, then boxes,
    flows and ``ProfilerStep`` sorted as :func:`_sorted` sorts the whole writer's list."""
    for p in parts:
        yield from p.writer.metadata()
        yield from p.step_meta
    lane_rank = {lane: i for i, lane in enumerate(sorted({lane for p in parts for lane in p.lanes}
                                                         | {p.step_lane for p in parts}))}
    name_rank = np.zeros(len(names) + 1, dtype=np.int64)
    step_names = {p.step["name"] for p in parts}
    for r, n in enumerate(sorted(set(names) | step_names)):
        if n in names:
            name_rank[names[n]] = r
    step_rank = {n: r for r, n in enumerate(sorted(set(names) | step_names)) if n in step_names}
    if not parts:
        return
    # One row per box and one per ProfilerStep, rank after rank, in columns filled as each
    # rank's numbers are dropped (about 50 bytes a row, and the order).
    total = sum(len(p.rows) + 1 for p in parts)
    lane = np.empty(total, dtype=np.int32)
    ts = np.empty(total, dtype=np.float64)
    negdur = np.empty(total, dtype=np.float64)
    name = np.empty(total, dtype=np.int32)
    part = np.empty(total, dtype=np.int32)
    at = np.empty(total, dtype=np.int64)
    size = np.empty(total, dtype=np.int32)
    corr = np.empty(total, dtype=np.int64)
    sfirst = np.full(total, -1, dtype=np.int64)
    base = 0
    for k, p in enumerate(parts):
        rows = p.rows
        n = len(rows)
        end = base + n   # the step's row
        lut = np.array([lane_rank[lane] for lane in p.lanes], dtype=np.int32)
        lane[base:end] = lut[_np(rows.track, np.int32)]
        lane[end] = lane_rank[p.step_lane]
        ts[base:end], dur = p.times()
        ts[end] = p.step["ts"]
        np.negative(dur, out=negdur[base:end])
        negdur[end] = -p.step["dur"]
        del dur
        name[base:end] = name_rank[_np(rows.name, np.int32)]
        name[end] = step_rank[p.step["name"]]
        part[base:end + 1] = k
        at[base:end] = _np(rows.at, np.int64)
        at[end] = -1
        size[base:end] = _np(rows.size, np.int64)
        size[end] = 0
        launch = _np(rows.launch, np.int64)
        ids = _np(rows.launch_ids, np.int64)
        has = (launch != 0) & np.isin(launch, ids)
        corr[base:end] = np.where(has, CORRELATION_BASE + launch, 0)
        corr[end] = 0
        kernels = np.flatnonzero(has)
        if kernels.size:
            # each launch's "s" sorts by its first kernel; it lies at the launch's last box
            used, first = np.unique(launch[kernels], return_index=True)
            lrows = _np(rows.launch_rows, np.int64)[::-1]
            known, last = np.unique(ids[::-1], return_index=True)
            sfirst[base + lrows[last[np.searchsorted(known, used)]]] = base + kernels[first]
        del launch, ids, has, kernels
        base = end + 1
        rows.release()   # all that is needed of them is in the columns now
    order = np.lexsort((name, negdur, ts, lane))   # stable: ties stay in the order the events came
    del negdur, name
    spool.ready()
    group: tuple[int, float] | None = None
    flows_f: list[tuple[int, int, int, int, float]] = []
    flows_s: list[tuple[int, int, int, int, float]] = []
    for c in range(0, base, _ROWS_CHUNK):
        idx = order[c:c + _ROWS_CHUNK]
        cols = (idx.tolist(), lane[idx].tolist(), ts[idx].tolist(), part[idx].tolist(), at[idx].tolist(),
                size[idx].tolist(), corr[idx].tolist(), sfirst[idx].tolist())
        for i, ln, t, k, a, sz, co, sf in zip(*cols, strict=True):
            if (ln, t) != group:
                if flows_f or flows_s:
                    yield from _group_flows(flows_f, flows_s)
                group = (ln, t)
            p = parts[k]
            if a < 0:
                yield p.step
                continue
            e = spool.get(a, sz)
            box = p.writer.box(e, co)
            yield box
            if co:
                flows_f.append((i, co, box["pid"], box["tid"], box["ts"]))
            if sf >= 0:
                flows_s.append((sf, CORRELATION_BASE + e.node_id, box["pid"], box["tid"], box["ts"]))
    if flows_f or flows_s:
        yield from _group_flows(flows_f, flows_s)


def _group_flows(flows_f: list[tuple[int, int, int, int, float]], flows_s: list[tuple[int, int, int, int, float]]
                 ) -> Iterator[dict[str, Any]]:
    """The ``f`` then ``s`` flows of one lane and instant in the order of the kernels that
    made them, each (ph, id) once; empties both lists."""
    for ph, flows in (("f", flows_f), ("s", flows_s)):
        flows.sort()
        seen: set[int] = set()
        for _, corr, pid, tid, ts in flows:
            if corr not in seen:
                seen.add(corr)
                yield _flow(ph, corr, pid, tid, ts)
        flows.clear()


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
    and a few numbers in memory (see the comment above). ``origin_ns``: the events' earliest
    start (the trace's time 0), when the caller knows it; then, with ``job``, a folder's rank
    files are written as each rank's events end (a rank's events must come together), and
    memory holds one rank's numbers. A wrong ``origin_ns`` is a ValueError (nothing written)."""
    dest = Path(dest)
    one_file = is_single_file(dest)
    if not one_file and dest.exists() and not dest.is_dir():
        check_output_file(dest)   # a device, FIFO or socket: never replaced
        raise EchoError(f"{dest}: exists and is not a directory (a timeline folder is written there; "
                        "give a .json name for one file)")
    it = iter(events)
    first = next(it, None)
    if first is None and not one_file:
        raise EchoError("no events to write")
    stream: Iterator[TimelineEvent] = _prepend(first, it) if first is not None else iter(())
    del first
    facts = _JobFacts(job, [])
    names: dict[str, int] = {}

    def other(origin: int) -> dict[str, Any]:
        out: dict[str, Any] = {"generator": "echo-et", "time_origin_ns": origin}
        if facts.name:
            out["job"] = facts.name
        if metadata:
            out.update(metadata)
        return out

    def head(origin: int, devices: set[Any], dist: dict[str, Any]) -> dict[str, Any]:
        return {"schemaVersion": 1, "deviceProperties": [{"id": d, "name": facts.gpu_name or "GPU"}
                                                        for d in sorted(devices)],
                "distributedInfo": dist, "displayTimeUnit": "ms", "baseTimeNanoseconds": origin,
                "otherData": other(origin)}

    def check_origin(got: int | None) -> int:
        origin = got if got is not None else 0
        if origin_ns is not None and got is not None and origin_ns != got:
            raise ValueError(f"origin_ns {origin_ns} is not the events' first start ({got})")
        return origin

    def gather(spool: _Spool) -> list[_RankRows]:
        by_rank: dict[int, _RankRows] = {}
        for e in stream:
            rows = by_rank.get(e.rank)
            if rows is None:
                rows = by_rank[e.rank] = _RankRows(e.rank)
                facts.add_rank(job, e.rank)
            at, size = spool.put(e)
            rows.add(e, at, size, names, facts)
        if job is None:
            facts.world_size = max(by_rank) + 1 if by_rank else 0
        return [by_rank[r] for r in sorted(by_rank)]

    summary: dict[str, Any] = {"output": str(dest), "files": 1, "events": 0, "ranks": 0, "tracks": 0}
    lanes: set[tuple[int, int]] = set()

    def count(part: _RankPart) -> None:
        summary["events"] += part.events
        summary["ranks"] += 1
        lanes.update(part.counted_lanes)

    if one_file:
        with atomic_file(dest) as f:
            spool = _Spool(dest.absolute().parent)
            try:
                ranks = gather(spool)
                origin = check_origin(min((int(_np(r.start, np.int64).min()) for r in ranks), default=None))
                parts = [_RankPart(r, names, facts, one_file=True, origin=origin, process_label=process_label)
                         for r in ranks]
                for p in parts:
                    count(p)
                dist = {"backend": "nccl" if any(r.on_gpu for r in ranks) else "gloo",
                        "world_size": facts.world_size, "ranks": [r.rank for r in ranks]}
                devices = set().union(*(r.devices for r in ranks))
                _write_text(f, _text(head(origin, devices, dist), _sorted_events(parts, names, spool)),
                            dest.name.lower().endswith(".gz"))
            finally:
                spool.close()
        summary["tracks"] = len(lanes)
        return summary

    def write_rank(tmp: Path, rows: _RankRows, origin: int, spool: _Spool) -> None:
        part = _RankPart(rows, names, facts, one_file=False, origin=origin, process_label=process_label)
        count(part)
        with open(tmp / f"rank-{rows.rank}.json", "wb") as f:
            _write_text(f, _text(head(origin, rows.devices, part.head(facts)), _sorted_events([part], names, spool)),
                        False)

    with atomic_dir(dest, replaceable=_is_timeline_folder, kind="a timeline folder") as tmp:
        spool = _Spool(tmp)
        try:
            if origin_ns is not None and job is not None:
                done: set[int] = set()
                rows: _RankRows | None = None
                low: int | None = None
                for e in stream:
                    if rows is None or e.rank != rows.rank:
                        if rows is not None:
                            write_rank(tmp, rows, origin_ns, spool)
                            done.add(rows.rank)
                            spool.reset()
                        if e.rank in done:
                            raise ValueError(f"the events of rank {e.rank} do not come together (with origin_ns)")
                        rows = _RankRows(e.rank)
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
                origin = check_origin(min(int(_np(r.start, np.int64).min()) for r in ranks))
                for r in ranks:
                    write_rank(tmp, r, origin, spool)
        finally:
            spool.close()
    summary["files"] = summary["ranks"]
    summary["tracks"] = len(lanes)
    return summary


def write(job: Job, dest: str | os.PathLike[str], ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """The measured timeline of ``job`` in Kineto's schema (see :func:`write_timeline`),
    streamed: each rank's events are made in the trace's order from its stored nodes and
    repeat blocks and written as they come, no graph is expanded, and the bytes are those of
    ``write_timeline(job_timeline(job, ranks), dest, job=job, metadata=...)``."""
    meta = {"world_size": job.world_size, "source_format": job.manifest.provenance.source_format}
    got = _streamed(job, Path(dest), ranks, meta)
    if got is not None:
        return got
    return write_timeline(job_timeline(job, ranks), dest, job=job, metadata=meta)


# --- The measured timeline of a Job, streamed --------------------------------------------------
#
# A trace's events are sorted by (pid, tid, ts, -dur, ph, name), ties in the order the events
# were made: a rank's boxes in the order of its expanded graph, then its ``ac2g`` flows (each
# kernel's in turn: its launch's ``s`` the first time, then its ``f``), then ``ProfilerStep``.
# The streamed writer gives each event that whole order as its key and merges sorted sources:
# the stored nodes (with the flows of launches that a kernel refers to across a copy's edge),
# and per instance of a repeat block its copies and their flows in the body's order. A copy's
# key is its body node's with ``ts`` shifted by the instance's time offset, and ``ts`` is a
# strictly increasing function of the time in ns, so each body is sorted once. A rank holds its
# stored nodes' events and one event per instance, never its expanded graph.

_SortKey = tuple[Any, ...]
# (sort key, event, whether it is the ``f`` flow of a launch with more than one kernel)
_Keyed = tuple[_SortKey, dict[str, Any], bool]


def _flow(ph: str, corr: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    if ph == "s":
        return {"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    return {"ph": "f", "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}


def _box_key(box: dict[str, Any], tie: tuple[int, ...]) -> _SortKey:
    return (box["pid"], box["tid"], box["ts"], -box["dur"], "X", box["name"], tie)


def _flow_key(pid: int, tid: int, ts: float, ph: str, tie: tuple[int, ...]) -> _SortKey:
    return (pid, tid, ts, 0, ph, "ac2g", tie)


class _RankPlan:
    """What one rank's part of a trace needs before its first event: its graph, tracks,
    first start and latest end, found from the stored nodes and the blocks."""

    def __init__(self, job: Job, rank: int):
        b = job.binding(rank)
        self.job = job
        self.rank = rank
        self.graph = job.graph(b.graph)
        self.offset = int(b.clock_offset_ns)
        self.stored = self.graph.stored_nodes
        self.blocks = self.graph.bodies() if self.graph.has_repeats else []
        self.count = len(self.graph)
        self.streams = {s.id: s for s in self.graph.header.streams}
        self.tstreams: dict[int, TimelineStream] = {}
        self._lanes: dict[tuple[int, int], tuple[bool, str, int, TimelineStream]] = {}
        # The first start, and (start, duration) of the node that ends last, in job-clock ns.
        first: int | None = None
        last: tuple[int, int] | None = None
        for n in self.stored:
            s, d = n.start_ns + self.offset, max(0, n.duration_ns)
            if first is None or s < first:
                first = s
            if last is None or s + d > last[0] + last[1]:
                last = (s, d)
        for body in self.blocks:
            if not body.nodes:
                continue
            lo = min(n.start_ns for n in body.nodes)
            top = max(body.nodes, key=lambda n: n.start_ns + max(0, n.duration_ns))
            for inst in body.block.instances:
                t = int(inst.time_offset_ns) + self.offset
                s, d = top.start_ns + t, max(0, top.duration_ns)
                if first is None or lo + t < first:
                    first = lo + t
                if last is None or s + d > last[0] + last[1]:
                    last = (s, d)
        self.first_ns = first or 0
        self.last = last or (0, 0)

    def lane_of(self, node: pb.Node) -> tuple[bool, str, int, TimelineStream]:
        """(on a GPU, track name, track order, timeline stream) of ``node``'s box: what
        :func:`echo_et.ir.timeline.node_event` gives it, which depends on its kind and stream."""
        key = (node.kind, node.stream)
        got = self._lanes.get(key)
        if got is None:
            track, order, _ = node_track(node, self.streams, {})
            ts = self.tstreams.get(node.stream)
            if ts is None:
                s = self.streams.get(node.stream)
                ts = (TimelineStream(s.id, track, s.kind, s.device, s.native_id) if s is not None
                      else TimelineStream(node.stream, track))
                self.tstreams[node.stream] = ts
            got = (kineto_category(node.kind, ts.kind) in _GPU_CATS, track, order, ts)
            self._lanes[key] = got
        return got

    def tracks(self) -> _Tracks:
        """The rank's tracks, each with the stream of its first box (copies come after their
        body node and share its kind and stream: the stored nodes in expanded order say it)."""
        tracks: _Tracks = {}
        stored = self.stored if not self.blocks else sorted(self.stored, key=lambda n: n.id)
        for n in stored:
            gpu, track, order, ts = self.lane_of(n)
            if (gpu, track) not in tracks:
                tracks[(gpu, track)] = (order, ts)
        return tracks

    def devices(self, facts: _JobFacts) -> set[int]:
        """The devices of the rank's GPU boxes (after :meth:`tracks`)."""
        return {facts.device_of(self.rank, ts) for gpu, _, _, ts in self._lanes.values() if gpu}

    def on_gpu(self) -> bool:
        return any(gpu for gpu, _, _, _ in self._lanes.values())


class _BodyPlan:
    """A body as one rank's copies need it: its nodes in box order (``order``), its kernels
    in flow order (``flows``), each node's launch when its dependencies all lie inside the
    body (``static``, 0 otherwise), and the body's launches with the kernels inside each copy
    that they issue (``internal``: launch id -> [kernels, first kernel's id], ``launches``
    in flow order)."""

    __slots__ = ("body", "order", "flows", "static", "outside", "internal", "launches")

    def __init__(self, body: Body):
        self.body = body
        self.order: list[int] = []
        self.flows: list[int] = []
        self.static: list[int] = [0] * len(body.nodes)
        self.outside: list[bool] = [False] * len(body.nodes)
        self.internal: dict[int, list[int]] = {}
        self.launches: list[int] = []

    def launch_in(self, k: int, inst: pb.RepeatInstance, deps_of: dict[int, list[tuple[int, int]]],
                  launch: Callable[[pb.Node], int]) -> int:
        """The launch of body node ``k``'s copy by ``inst``."""
        n = self.body.nodes[k]
        if self.static[k]:
            return self.static[k] + int(inst.id_offset)
        if self.outside[k] or n.id in deps_of:
            return launch(copy_node(self.body, n, inst, deps_of))
        return 0


class _RankEvents:
    """One rank's events in the trace's order, streamed from its stored graph and repeat
    blocks (see the comment above)."""

    def __init__(self, plan: _RankPlan, writer: _RankWriter, origin: int):
        self.plan = plan
        self.writer = writer
        self.origin = origin
        self.rank = plan.rank
        job, rank = plan.job, plan.rank
        self.group_of: Callable[[str], pb.ProcessGroup] = lambda key: job.resolve_group(rank, key)
        self.lookup: ExpandedNodes | None = None
        if plan.blocks:
            self.lookup = ExpandedNodes(plan.graph.header, plan.stored, plan.blocks)
            self.kind_of: Callable[[int], int | None] = self.lookup.kind
        else:
            self.kind_of = {n.id: n.kind for n in plan.stored}.get
        self.explicit: dict[int, list[int]] = {}   # launch id -> [kernels, first kernel's position]
        self.bodies: dict[int, _BodyPlan] = {}     # by id(Body)

    def lane(self, node: pb.Node) -> tuple[int, int]:
        gpu, track, _, _ = self.plan.lane_of(node)
        pid, tid, _ = self.writer.lanes[(gpu, track)]
        return pid, tid

    def ts(self, node: pb.Node, time_offset: int = 0) -> float:
        return _us(node.start_ns + time_offset + self.plan.offset - self.origin)

    def box(self, node: pb.Node, launch: int) -> dict[str, Any]:
        start = node.start_ns + self.plan.offset
        e = node_event(self.rank, node, (start, start + node.duration_ns, None), self.plan.streams,
                       self.plan.tstreams, self.group_of, launch)
        return self.writer.box(e, CORRELATION_BASE + launch if launch else 0)

    def launch(self, node: pb.Node) -> int:
        return launch_of(node, self.kind_of)

    def _refer(self, launch: int, at: int) -> None:
        """A kernel at position ``at`` refers to ``launch`` across a copy's edge (or is stored)."""
        got = self.explicit.get(launch)
        if got is None:
            self.explicit[launch] = [1, at]
        else:
            got[0] += 1
            got[1] = min(got[1], at)

    def _source(self, node_id: int) -> tuple[pb.Node, int, _BodyPlan | None, int]:
        """(node, time offset, body plan, id offset) of expanded node ``node_id`` (a launch)."""
        if self.lookup is None:
            if not hasattr(self, "_by_id"):
                self._by_id = {n.id: n for n in self.plan.stored}   # the last of an id, as kinds
            return self._by_id[node_id], 0, None, 0
        got = self.lookup.source(node_id)
        assert got is not None
        node, body, inst = got
        if body is None or inst is None:
            return node, 0, None, 0
        return node, int(inst.time_offset_ns), self.bodies[id(body)], int(inst.id_offset)

    def kernels(self, launch: int) -> int:
        """How many kernels ``launch`` issued."""
        got = self.explicit.get(launch)
        count = got[0] if got is not None else 0
        if self.lookup is not None:
            node, _, bp, _ = self._source(launch)
            if bp is not None and node.id in bp.internal:
                count += bp.internal[node.id][0]
        return count

    def _stored_items(self, pids: set[int]) -> list[_Keyed]:
        """The stored nodes' boxes and kernels' ``f`` flows on ``pids``; fills ``explicit``
        and the body plans."""
        plan, rank = self.plan, self.rank
        flat = not plan.blocks
        items: list[_Keyed] = []
        for pos, n in enumerate(plan.stored):
            at = pos if flat else n.id
            launch = self.launch(n)
            box = self.box(n, launch)
            if launch and box["cat"] in _GPU_CATS:
                self._refer(launch, at)
                if box["pid"] in pids:
                    items.append((_flow_key(box["pid"], box["tid"], box["ts"], "f", (rank, 1, at, 1)),
                                  _flow("f", CORRELATION_BASE + launch, box["pid"], box["tid"], box["ts"]), False))
            if box["pid"] in pids:
                items.append((_box_key(box, (rank, 0, at)), box, False))
        for body in plan.blocks:
            bp = _BodyPlan(body)
            self.bodies[id(body)] = bp
            first, last = body.first, body.last
            keys: list[tuple[_SortKey, int]] = []
            flows: list[tuple[_SortKey, int]] = []
            for k, n in enumerate(body.nodes):
                bp.outside[k] = any(not first <= d.id <= last for d in n.deps)
                if not bp.outside[k]:
                    bp.static[k] = self.launch(n)
                gpu = plan.lane_of(n)[0]
                pid, tid = self.lane(n)
                if pid in pids:
                    box = self.box(n, bp.static[k])
                    keys.append(((pid, tid, box["ts"], -box["dur"], box["name"], n.id), k))
                    if gpu:
                        flows.append(((pid, tid, box["ts"], n.id), k))
                if gpu and bp.static[k]:
                    got = bp.internal.setdefault(bp.static[k], [0, n.id])
                    got[0] += 1
            keys.sort(key=lambda t: t[0])
            flows.sort(key=lambda t: t[0])
            bp.order = [k for _, k in keys]
            bp.flows = [k for _, k in flows]
            index = {n.id: k for k, n in enumerate(body.nodes)}
            launches = []
            for b_id, (_, first_kernel) in bp.internal.items():
                ln = body.nodes[index[b_id]]
                pid, tid = self.lane(ln)
                if pid in pids:
                    launches.append(((pid, tid, self.ts(ln), first_kernel), index[b_id]))
            launches.sort(key=lambda t: t[0])
            bp.launches = [k for _, k in launches]
            # Kernels whose launch an instance's own dependencies decide: referred across the edge.
            dynamic = [k for k, n in enumerate(body.nodes) if not bp.static[k] and plan.lane_of(n)[0]]
            for inst in body.block.instances:
                deps_of = instance_deps(inst)
                off = int(inst.id_offset)
                for k in dynamic:
                    launch = bp.launch_in(k, inst, deps_of, self.launch)
                    if launch:
                        self._refer(launch, body.nodes[k].id + off)
        # The ``s`` flows of the launches referred to across an edge (or by stored kernels).
        for launch, (_, first_kernel) in self.explicit.items():
            node, toff, bp_of, off = self._source(launch)
            if bp_of is not None and node.id in bp_of.internal:
                first_kernel = min(first_kernel, bp_of.internal[node.id][1] + off)
            pid, tid = self.lane(node)
            if pid in pids:
                ts = self.ts(node, toff)
                items.append((_flow_key(pid, tid, ts, "s", (rank, 1, first_kernel, 0)),
                              _flow("s", CORRELATION_BASE + launch, pid, tid, ts), False))
        return [(key, ev, ev["ph"] == "f" and self.kernels(ev["id"] - CORRELATION_BASE) > 1)
                for key, ev, _ in items]

    def _copies(self, bp: _BodyPlan, inst: pb.RepeatInstance) -> Iterator[_Keyed]:
        nodes = bp.body.nodes
        deps_of = instance_deps(inst)
        for k in bp.order:
            c = copy_node(bp.body, nodes[k], inst, deps_of)
            box = self.box(c, bp.launch_in(k, inst, deps_of, self.launch))
            yield _box_key(box, (self.rank, 0, c.id)), box, False

    def _copy_flows(self, bp: _BodyPlan, inst: pb.RepeatInstance) -> Iterator[_Keyed]:
        nodes = bp.body.nodes
        deps_of = instance_deps(inst)
        off, toff = int(inst.id_offset), int(inst.time_offset_ns)
        rank = self.rank
        for k in bp.flows:
            launch = bp.launch_in(k, inst, deps_of, self.launch)
            if launch:
                n = nodes[k]
                pid, tid = self.lane(n)
                ts = self.ts(n, toff)
                multi = self.kernels(launch) > 1
                yield (_flow_key(pid, tid, ts, "f", (rank, 1, n.id + off, 1)),
                       _flow("f", CORRELATION_BASE + launch, pid, tid, ts), multi)

    def _copy_launches(self, bp: _BodyPlan, inst: pb.RepeatInstance) -> Iterator[_Keyed]:
        """The ``s`` flows of a copy's launches whose kernels are all inside copies (a stream
        of its own: the launches' lanes are not the kernels')."""
        nodes = bp.body.nodes
        off, toff = int(inst.id_offset), int(inst.time_offset_ns)
        rank = self.rank
        for k in bp.launches:
            n = nodes[k]
            launch = n.id + off
            if launch in self.explicit:
                continue   # with the stored items
            pid, tid = self.lane(n)
            ts = self.ts(n, toff)
            yield (_flow_key(pid, tid, ts, "s", (rank, 1, bp.internal[n.id][1] + off, 0)),
                   _flow("s", CORRELATION_BASE + launch, pid, tid, ts), False)

    def events(self, pids: set[int], step: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
        """The rank's events on processes ``pids`` in the trace's order; ``step``: its
        ``ProfilerStep`` box (None when it is on none of them)."""
        items = self._stored_items(pids)
        if step is not None:
            items.append((_box_key(step, (self.rank, 2)), step, False))
        items.sort(key=lambda t: t[0])
        streams: list[Iterator[_Keyed]] = [iter(items)]
        del items
        for bp in self.bodies.values():
            for inst in bp.body.block.instances:
                streams.append(self._copies(bp, inst))
                streams.append(self._copy_flows(bp, inst))
                streams.append(self._copy_launches(bp, inst))
        # The ``f`` flows of a launch with several kernels: once per (launch, lane, time), the
        # first in the trace's order, as the whole writer keeps them.
        seen: set[tuple[int, int, int, float]] = set()
        for _, ev, multi in heapq.merge(*streams, key=lambda t: t[0]):
            if multi:
                k = (ev["id"], ev["pid"], ev["tid"], ev["ts"])
                if k in seen:
                    continue
                seen.add(k)
            yield ev


def _step_box(plan: _RankPlan, writer: _RankWriter, origin: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rank's ``ProfilerStep`` box (and its thread name when it has no host thread)."""
    s, d = plan.last
    start = _us(plan.first_ns - origin)
    end = round(_us(s - origin) + _us(d), 3)
    return writer.profiler_step(start, end)


def _chosen(job: Job, ranks: Sequence[int] | None) -> list[int]:
    chosen = job.ranks() if ranks is None else sorted(set(ranks))
    known = set(job.ranks())
    bad = [r for r in chosen if r not in known]
    if bad:
        raise EchoError(f"rank {bad[0]} is not in the job (ranks 0..{job.world_size - 1})")
    return chosen


def _streamed(job: Job, dest: Path, ranks: Sequence[int] | None, metadata: Mapping[str, object]
              ) -> dict[str, Any] | None:
    """Write the measured timeline of ``job`` without expanding a graph (see
    :func:`write`); None when ranks of one file share a process id (then the whole writer
    orders them)."""
    plans = [p for r in _chosen(job, ranks) if (p := _RankPlan(job, r)).count]
    origin = min((p.first_ns for p in plans), default=0)
    facts = _JobFacts(job, [p.rank for p in plans])
    one_file = is_single_file(dest)
    writers = {p.rank: _RankWriter(p.rank, [], facts, one_file=one_file, origin=origin, process_label="rank",
                                   tracks=p.tracks()) for p in plans}
    other: dict[str, Any] = {"generator": "echo-et", "time_origin_ns": origin}
    if facts.name:
        other["job"] = facts.name
    other.update(metadata)
    lanes = {lane[:2] for w in writers.values() for lane in w.lanes.values()}
    summary = {"output": str(dest), "files": 1 if one_file else len(plans),
               "events": sum(p.count for p in plans), "ranks": len(plans), "tracks": len(lanes)}

    def head(devices: set[int], dist: dict[str, Any]) -> dict[str, Any]:
        return {"schemaVersion": 1, "deviceProperties": [{"id": d, "name": facts.gpu_name or "GPU"}
                                                        for d in sorted(devices)],
                "distributedInfo": dist, "displayTimeUnit": "ms", "baseTimeNanoseconds": origin,
                "otherData": other}

    if one_file:
        pids: dict[int, int] = {}
        for p in plans:
            w = writers[p.rank]
            for pid in {lane[0] for lane in w.lanes.values()} | {w.host_pid}:
                if pids.setdefault(pid, p.rank) != p.rank:
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
                yield from _RankEvents(by_rank[rank], w, origin).events(mine, step)

        devices = set().union(*(p.devices(facts) for p in plans))
        dist = {"backend": "nccl" if any(p.on_gpu() for p in plans) else "gloo", "world_size": facts.world_size,
                "ranks": [p.rank for p in plans]}
        with atomic_file(dest) as f:
            _write_text(f, _text(head(devices, dist), events()), dest.name.lower().endswith(".gz"))
        return summary
    if dest.exists() and not dest.is_dir():
        check_output_file(dest)   # a device, FIFO or socket: never replaced
        raise EchoError(f"{dest}: exists and is not a directory (a timeline folder is written there; "
                        "give a .json name for one file)")
    if not plans:
        raise EchoError("no events to write")
    with atomic_dir(dest, replaceable=_is_timeline_folder, kind="a timeline folder") as tmp:
        for p in plans:
            w = writers[p.rank]
            meta, step = _step_box(p, w, origin)
            backend = "nccl" if p.on_gpu() else "gloo"
            dist = {"backend": backend, "rank": p.rank, "world_size": facts.world_size,
                    "pg_config": facts.pg_config(p.rank, backend)}
            dist["pg_count"] = len(dist["pg_config"])
            rank_events = itertools.chain(w.metadata(), meta,
                                          _RankEvents(p, w, origin).events({lane[0] for lane in w.lanes.values()}
                                                                           | {w.host_pid}, step))
            with open(tmp / f"rank-{p.rank}.json", "wb") as f:
                _write_text(f, _text(head(p.devices(facts), dist), rank_events), False)
    return summary
