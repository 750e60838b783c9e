"""What the streamed timeline writer (:mod:`.timeline`) keeps of each event, a few numbers
per box (:class:`RankRows`), and each rank's boxes, flows and ``ProfilerStep`` made again in
the trace's order from those numbers and the records in the spool (:func:`sorted_events`)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np

from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent

from .boxes import COMM_KINDS, CORRELATION_BASE, GPU_CATS, JobFacts, RankWriter, Tracks, cat_name, flow, to_us
from .spool import Spool

_ROWS_CHUNK = 1 << 16


class RankRows:
    """What the streamed writer keeps of one rank's events: per box its track (index into
    ``tracks``), start, duration (ns, >= 0), name (interned), launch (a GPU box's
    ``launch_id``, 0 for others) and its record's place in the spool; the rank's launches
    (row, node id) and devices."""

    def __init__(self, rank: int):
        self.rank = rank
        self.tracks: Tracks = {}
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

    def add(self, e: TimelineEvent, at: int, size: int, names: dict[str, int], facts: JobFacts) -> None:
        gpu = e.category in GPU_CATS
        key = (gpu, e.track)
        t = self.track_ix.get(key)
        if t is None:
            t = self.track_ix[key] = len(self.track_ix)
            self.tracks[key] = (e.track_order, e.stream)
        name = cat_name(e)[1] if e.kind in COMM_KINDS else e.name
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

    def first_start(self) -> int:
        """The earliest start of the rank's boxes (ns; the rank has one)."""
        return int(_np(self.start, np.int64).min())

    def release(self) -> None:
        """Drop the per-box numbers (after they were sorted)."""
        for name in ("track", "start", "dur", "name", "launch", "at", "size", "launch_rows", "launch_ids"):
            setattr(self, name, array(getattr(self, name).typecode))


def _np(a: array, dtype: Any) -> np.ndarray:
    return np.frombuffer(a, dtype=dtype) if len(a) else np.zeros(0, dtype=dtype)


# Below this many ns, ``ns / 1000.0`` is already :func:`to_us` (the float nearest the exact
# microseconds, which round(..., 3) keeps), so a column is converted at once.
_EXACT_US_NS = 1 << 50


def _us_column(ns: np.ndarray) -> np.ndarray:
    """:func:`to_us` of each of ``ns`` (>= 0)."""
    if not ns.size or int(ns.max()) < _EXACT_US_NS:
        return ns / 1000.0
    return np.array([to_us(v) for v in ns.tolist()], dtype=np.float64)


class RankPart:
    """One rank's part of a trace: its writer (lanes), ``ProfilerStep``, sort columns and
    what the summary counts (boxes and lanes, the ``ProfilerStep`` span not among them)."""

    def __init__(self, rows: RankRows, names: dict[str, int], facts: JobFacts, *, one_file: bool, origin: int,
                 process_label: str):
        self.rows = rows
        self.writer = RankWriter(rows.rank, [], facts, one_file=one_file, origin=origin,
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

    def head(self, facts: JobFacts) -> dict[str, Any]:
        backend = "nccl" if self.rows.on_gpu else "gloo"
        dist = {"backend": backend, "rank": self.rows.rank, "world_size": facts.world_size,
                "pg_config": facts.pg_config(self.rows.rank, backend)}
        dist["pg_count"] = len(dist["pg_config"])
        return dist


def sorted_events(parts: list[RankPart], names: dict[str, int], spool: Spool) -> Iterator[dict[str, Any]]:
    """The events of ``parts`` (ranks in order) in the trace's order: metadata, then boxes,
    flows and ``ProfilerStep`` sorted as the whole writer (:func:`.document.kineto_traces`) sorts its list."""
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
                yield flow(ph, corr, pid, tid, ts)
        flows.clear()


