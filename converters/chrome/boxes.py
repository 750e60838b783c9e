"""One rank's events as Kineto boxes: the process and thread ids of its tracks, each event's
``cat``, ``name`` and ``args`` (NCCL metadata as ``record_param_comms`` gives it, launch
correlation), the ``ac2g`` flows and the ``ProfilerStep`` span. Shared by the whole writer
(:mod:`.document`), the streamed timeline writer (:mod:`.timeline`) and the streamed export of
a measured Job (:mod:`.job_export`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from echo_et.ir.collectives import (
    RECV,
    SEND,
    collective_word,
    nccl_kernel_name,
    pytorch_collective_name,
)
from echo_et.ir.dtypes import c10_name, dtype_size
from echo_et.ir.job import Job
from echo_et.ir.labels import (
    KINETO_ANNOTATION,
    KINETO_CPU_OP,
    KINETO_KERNEL,
    KINETO_MEMCPY,
    KINETO_MEMSET,
    KINETO_RUNTIME,
)
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent, TimelineStream

HOST_PID_BASE = 1_000_000
JOB_GPU_PID_BASE = 2_000_000
# Correlation ids (launch -> kernel) are the launch node's id plus this: HolisticTraceAnalysis
# downcasts the correlation column to the smallest integer type and writes row indices into a
# column of that type; with pandas 3 a trace of more than 32,767 events whose ids all fit in
# int16 then fails to load (TypeError in transform_correlation_to_index).
CORRELATION_BASE = 1 << 16
GPU_CATS = frozenset({KINETO_KERNEL, KINETO_MEMCPY, KINETO_MEMSET})
COMM_KINDS = frozenset({pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV})
# An NCCL kernel's name as trace tools match it (HTA: ``^nccl.*Kernel``); "void " dropped.
_NCCL_KERNEL_NAME = re.compile(r"^(?:void\s+)?((?:nccl|rccl)\w*Kernel.*)$", re.DOTALL)


def to_us(ns: int) -> float:
    """``ns`` in microseconds with three decimals (how ``ts`` and ``dur`` are written)."""
    return round(ns / 1000.0, 3)


class JobFacts:
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


def comm_args(e: TimelineEvent, facts: JobFacts) -> dict[str, Any]:
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


def cat_name(e: TimelineEvent) -> tuple[str, str]:
    """The Kineto ``cat`` and ``name`` of ``e``'s box (what :meth:`RankWriter.box` gives it)."""
    cat, name = e.category or KINETO_CPU_OP, e.name
    if e.kind not in COMM_KINDS:
        return cat, name
    if e.args.get("op"):
        name = str(e.args["op"])   # the node's own name
    if e.category in GPU_CATS:
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
Tracks = dict[tuple[bool, str], tuple[int, TimelineStream | None]]


def tracks_of(events: Iterable[TimelineEvent]) -> Tracks:
    tracks: Tracks = {}
    for e in events:
        key = (e.category in GPU_CATS, e.track)
        if key not in tracks:
            tracks[key] = (e.track_order, e.stream)
    return tracks


class RankWriter:
    """The Kineto events of one rank."""

    def __init__(self, rank: int, events: list[TimelineEvent], facts: JobFacts, *, one_file: bool,
                 origin: int, process_label: str, tracks: Tracks | None = None):
        self.rank = rank
        self.events = events
        self.facts = facts
        self.one_file = one_file
        self.origin = origin
        self.process_label = process_label
        self.host_pid = HOST_PID_BASE + rank
        self.out: list[dict[str, Any]] = []
        self.lanes: dict[tuple[bool, str], tuple[int, int, int]] = {}   # (gpu, track) -> (pid, tid, order)
        self._assign_lanes(tracks if tracks is not None else tracks_of(events))

    def gpu_pid(self, device: int) -> int:
        return JOB_GPU_PID_BASE + 100 * self.rank + device if self.one_file else device

    def _assign_lanes(self, tracks: Tracks) -> None:
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
        gpu = e.category in GPU_CATS
        pid, tid, _ = self.lanes[(gpu, e.track)]
        args: dict[str, Any] = dict(e.args)
        cat, name = cat_name(e)
        if e.kind in COMM_KINDS and e.args.get("op"):
            args["label"] = e.name   # the box is named after the node; its label stays in args
        if gpu:
            corr = launch_corr
            args.update({"device": self.facts.device_of(self.rank, e.stream), "stream": tid,
                         "correlation": corr, "External id": corr})
            if e.kind in COMM_KINDS:
                args.update(comm_args(e, self.facts))
        elif e.kind in COMM_KINDS:
            args.update(comm_args(e, self.facts))
        elif cat == KINETO_RUNTIME:
            corr = CORRELATION_BASE + e.node_id   # what the correlation map holds for a launch
            args.update({"correlation": corr, "External id": corr})
        elif e.node_id:
            args.setdefault("External id", e.node_id)
        box = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
               "ts": to_us(e.start_ns - self.origin), "dur": to_us(max(0, e.duration_ns))}
        if args:
            box["args"] = args
        return box

    def _flows(self, launches: dict[int, tuple[int, int, float]]) -> None:
        """``ac2g`` flow arrows from each launch to the kernels it issued."""
        flows = []
        for box in self.out:
            if box.get("ph") != "X" or box["cat"] not in GPU_CATS:
                continue
            corr = box["args"].get("correlation", 0)
            if corr and corr in launches:
                pid, tid, ts = launches[corr]
                flows.append(flow("s", corr, pid, tid, ts))
                flows.append(flow("f", corr, box["pid"], box["tid"], box["ts"]))
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


def flow(ph: str, corr: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    """An ``ac2g`` flow event: ``s`` at a launch, ``f`` at a kernel it issued."""
    if ph == "s":
        return {"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    return {"ph": "f", "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}
