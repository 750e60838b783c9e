"""A rank's step as a SimAI / AICB text workload (the input of SimAI's ``astra-sim-alibabacloud``).

SimAI runs one layer list on every rank (``converters/simai.py`` reads the format and says
how SimAI runs it): forward rows in order, compute then a blocking collective; then the rows
backward, each an input-gradient compute and blocking collective, then a weight-gradient
compute and a collective nothing waits for. A step of echo-et becomes such a list from the
timeline of one *representative* rank (measured or simulated, the caller's choice):

- The rank's time is cut at its collectives. The time between two cuts is compute, whatever
  filled it (kernels, host time, idle), so the rows add up to the rank's step.
- A collective is *blocking* when nothing else of the rank started before it ended and no
  compute ran through it (the rank waited for it; a collective that only queued behind it on
  its own stream does not count); otherwise it ran under other work and is written where
  SimAI does not wait for it (a weight-gradient column). Compute that idled until such a
  background collective ended waited for it: that stretch is the collective's, not compute.
- Rows are forward until the first node of the backward (its ``phase`` annotation) or the
  first collective that nothing waited for, whichever comes first; the rest are backward
  rows, written in reverse, because SimAI runs the backward from the last row.
- Groups: SimAI knows the tensor-parallel (TP), data-parallel (DP), expert (EP) and DP-within-
  EP groups of its own layout. A collective's group is matched by its role and size (rank
  order may differ from SimAI's, which places groups itself), else by its ranks.

What SimAI cannot express is kept as time and counted (``dropped`` in the report, never
silent): collectives of other types or groups, and blocking ones where the column cannot hold
their group, stay compute time. In a pipeline, send/recv become SimAI's ``pp_comm`` header and
the time the rank waited for them is left out, because SimAI adds the pipeline bubble itself;
without pipeline stages their waits stay compute time. docs/export.md ("SimAI") has the rules
and the report.
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.collectives import SIMAI_NAMES
from echo_et.ir.intervals import covered_length, merge_intervals
from echo_et.ir.io import atomic_file
from echo_et.ir.job import Job
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent

from .simai import Layout

POLICY = "HYBRID_TRANSFORMER_FWD_IN_BCKWD"
_TOKEN = {v: k for k, v in SIMAI_NAMES.items() if k != "BROADCAST"}  # SimAI ignores broadcasts
_TYPE_BY_NAME = {"all_reduce": pb.COLL_ALL_REDUCE, "all_gather": pb.COLL_ALL_GATHER,
                 "reduce_scatter": pb.COLL_REDUCE_SCATTER, "all_to_all": pb.COLL_ALL_TO_ALL}
_GPU_WORK = frozenset({pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET})
_P2P = frozenset({pb.KIND_SEND, pb.KIND_RECV})
INT32_MAX = (1 << 31) - 1     # SimAI reads the header's numbers with std::stoi
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:+-]+")
_NAME_MAX = 48

# Column suffix of each SimAI group: forward and input-gradient columns default to TP,
# the weight-gradient column to DP (SimAI's Workload::initialize_workload).
_BLOCKING_SUFFIX = {"tp": "", "ep": "_EP", "dp_ep": "_DP_EP"}
_ASYNC_SUFFIX = {"dp": "", "ep": "_EP", "dp_ep": "_DP_EP"}


@dataclass(frozen=True)
class SimaiLayout:
    """The header's parallel layout; ``dp`` = world / (tp x pp)."""

    world: int
    tp: int
    pp: int
    ep: int
    vpp: int
    ga: int

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def groups(self) -> Layout:
        return Layout(self.world, self.tp, self.pp, self.dp, self.ep)


def layout_of(job: Job, rank: int) -> SimaiLayout:
    """The layout the Job records; where it records none, the sizes of ``rank``'s groups by
    role (a trace knows its groups, not always the layout they form)."""
    m = job.manifest
    sizes: dict[int, int] = {}
    for key in job.binding(rank).groups:
        pg = job.resolve_group(rank, key)
        sizes[pg.role] = max(sizes.get(pg.role, 1), len(pg.ranks))
    tp = m.layout.tp or sizes.get(pb.ROLE_TP, 1)
    pp = m.layout.pp or sizes.get(pb.ROLE_PP, 1)
    ep = m.layout.ep or sizes.get(pb.ROLE_EP, 1)
    world = m.world_size
    if world % (tp * pp):
        raise EchoError(f"world size {world} is not a multiple of TP {tp} x PP {pp}: SimAI's layout "
                        "cannot hold this job")
    if (world // (tp * pp)) % ep:
        raise EchoError(f"data-parallel size {world // (tp * pp)} is not a multiple of EP {ep}: "
                        "SimAI's layout cannot hold this job")
    return SimaiLayout(world, tp, pp, ep, m.layout.vpp or 1, m.layout.microbatches or 1)


@dataclass
class Comm:
    """One collective as a SimAI column holds it, with the time it took on the timeline."""

    token: str          # e.g. ALLREDUCE_EP
    key: str            # SimAI group: tp, dp, ep, dp_ep
    nbytes: int
    transfer_ns: int    # its time less the wait for its last member


@dataclass
class Row:
    """One line's half: forward (``fwd_*``) or backward (``ig_*``, ``wg_*``)."""

    start_ns: int                       # where its first compute began (for its name)
    compute_ns: int = 0                 # fwd or ig compute
    comm: Comm | None = None            # fwd or ig comm (blocking)
    wg_compute_ns: int = 0
    wg_comm: Comm | None = None         # nothing waits for it
    stage: int = 0                      # backward: 0 ig compute, 1 wg compute, 2 closed


@dataclass
class SimaiWorkload:
    """What :func:`plan` makes: the header, the lines, and what the mapping did."""

    rank: int
    layout: SimaiLayout
    pp_comm: int
    lines: list[tuple[str, Row | None, Row | None]]   # (name, forward half, backward half)
    mapped: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    time: dict[str, int] = field(default_factory=dict)
    # SimAI groups whose members differ from the job's (SimAI numbers ranks tp, then pipeline
    # stage, then data-parallel index, and places groups itself)
    regrouped: set[str] = field(default_factory=set)

    def header(self) -> str:
        lay = self.layout
        return (f"{POLICY} model_parallel_NPU_group: {lay.tp} ep: {lay.ep} pp: {lay.pp} vpp: {lay.vpp} "
                f"ga: {lay.ga} all_gpus: {lay.world} checkpoints: 0 checkpoint_initiates: 0 "
                f"pp_comm {self.pp_comm}")

    def text(self) -> str:
        out = [self.header(), str(len(self.lines))]
        for name, f, b in self.lines:
            cols = [name, "-1"]
            cols += _half(f.compute_ns if f else 0, f.comm if f else None)
            cols += _half(b.compute_ns if b else 0, b.comm if b else None)
            cols += _half(b.wg_compute_ns if b else 0, b.wg_comm if b else None)
            cols.append("0")     # update time: the timeline has no fixed delay after a collective
            out.append("\t".join(cols))
        return "\n".join(out) + "\n"

    def expected_step_ns(self) -> int:
        """The step SimAI's order gives these lines when every collective takes the time it
        took on the timeline: forward lines in order, backward lines in reverse, collectives
        of one group one after another (one communicator each)."""
        t = 0
        free: dict[str, int] = {}

        def run(c: Comm, at: int) -> int:
            start = max(at, free.get(c.key, 0))
            free[c.key] = start + c.transfer_ns
            return free[c.key]

        for _, f, _ in self.lines:
            if f is not None:
                t += f.compute_ns
                if f.comm is not None:
                    t = run(f.comm, t)
        for _, _, b in reversed(self.lines):
            if b is not None:
                t += b.compute_ns
                if b.comm is not None:
                    t = run(b.comm, t)
                t += b.wg_compute_ns
                if b.wg_comm is not None:
                    run(b.wg_comm, t)
        return max([t, *free.values()])

    def report(self) -> dict[str, object]:
        lay = self.layout
        return {
            "rank": self.rank, "lines": len(self.lines),
            "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "vpp": lay.vpp, "ga": lay.ga,
                       "world_size": lay.world, "pp_comm": self.pp_comm},
            "mapped": dict(sorted(self.mapped.items())), "dropped": dict(sorted(self.dropped.items())),
            "time": dict(sorted(self.time.items())), "expected_step_ns": self.expected_step_ns(),
            "regrouped": sorted(self.regrouped),
        }


def _half(compute_ns: int, comm: Comm | None) -> list[str]:
    if comm is None:
        return [str(compute_ns), "NONE", "0"]
    return [str(compute_ns), comm.token, str(comm.nbytes)]


@dataclass
class _CommEvent:
    start: int
    end: int
    wait: int
    track: str
    kind: int
    order: int
    args: dict


class _Planner:
    def __init__(self, job: Job, rank: int, lay: SimaiLayout):
        self.job = job
        self.rank = rank
        self.lay = lay
        self.groups = lay.groups()
        self.by_id = {pg.id: pg for pg in job.manifest.groups}
        self.key_of_group: dict[int, str | None] = {}
        self.out = SimaiWorkload(rank, lay, 0, [])
        self.fwd: list[Row] = []
        self.bwd: list[Row] = []
        self.pending = 0                 # compute not yet placed in a row
        self.pending_from: int | None = None
        self.forward = True
        self.busy: _Busy | None = None
        self.inflight: list[tuple[int, int]] = []   # background collectives written so far

    def span(self, a: int, b: int) -> None:
        """[a, b] of the rank's time as compute, less where compute idled until a background
        collective had ended: that wait is the collective's, which SimAI runs itself. (An idle
        stretch that ended while the collective still ran waited for something else.)"""
        if b <= a:
            return
        self.inflight = [iv for iv in self.inflight if iv[1] > a]
        idle = 0
        if self.inflight and self.busy is not None:
            for x, y in self.busy.gaps(a, b):
                pieces = sorted((max(s, x), min(e, y)) for s, e in self.inflight if s < y and x < e <= y)
                lo = hi = -1
                for u, v in pieces:
                    if u > hi:
                        idle += hi - lo
                        lo, hi = u, v
                    else:
                        hi = max(hi, v)
                idle += hi - lo
        if idle:
            self.add_time("idle_behind_background_comm_ns", idle)
        self.compute(a, b - idle)

    # -- bookkeeping --------------------------------------------------------------------------
    def drop(self, reason: str, ns: int = 0) -> None:
        self.out.dropped[reason] = self.out.dropped.get(reason, 0) + 1
        if ns:
            self.out.time[f"{reason}_ns"] = self.out.time.get(f"{reason}_ns", 0) + ns

    def add_time(self, key: str, ns: int) -> None:
        self.out.time[key] = self.out.time.get(key, 0) + ns

    def compute(self, start: int, end: int) -> None:
        if end > start:
            if self.pending_from is None:
                self.pending_from = start
            self.pending += end - start

    def take(self) -> tuple[int, int | None]:
        got, frm = self.pending, self.pending_from
        self.pending, self.pending_from = 0, None
        return got, frm

    # -- groups -------------------------------------------------------------------------------
    def key_of(self, group_id: int) -> str | None:
        if group_id in self.key_of_group:
            return self.key_of_group[group_id]
        pg = self.by_id.get(group_id)
        key = None if pg is None else self._match(pg)
        self.key_of_group[group_id] = key
        if key is not None and set(pg.ranks) != set(self.groups.group_of(key, self.rank)):
            self.out.regrouped.add(key)
        return key

    def _match(self, pg: pb.ProcessGroup) -> str | None:
        lay, n = self.lay, len(pg.ranks)
        if n <= 1:
            return None
        by_role = {pb.ROLE_TP: ("tp", lay.tp), pb.ROLE_DP: ("dp", lay.dp), pb.ROLE_EP: ("ep", lay.ep)}
        if pg.role in by_role and by_role[pg.role][1] == n:
            return by_role[pg.role][0]
        if pg.role == pb.ROLE_WORLD and n == lay.world:
            if lay.dp == n:
                return "dp"
            if lay.tp == n:
                return "tp"
        members = set(pg.ranks)
        for key in ("tp", "dp", "ep", "dp_ep"):
            if self.groups.size(key) == n and set(self.groups.group_of(key, self.rank)) == members:
                return key
        return None

    def blocking_token(self, coll: str, key: str) -> tuple[str, str] | None:
        """(column token, the SimAI group it names) in a forward or input-gradient column."""
        if key == "dp" and self.lay.ep == 1:
            key = "dp_ep"      # with EP 1, SimAI's DP-within-EP group is the DP group
        suffix = _BLOCKING_SUFFIX.get(key)
        return None if suffix is None else (coll + suffix, key)

    @staticmethod
    def async_token(coll: str, key: str) -> tuple[str, str] | None:
        """(column token, SimAI group) in a weight-gradient column."""
        suffix = _ASYNC_SUFFIX.get(key)
        return None if suffix is None else (coll + suffix, key)

    # -- rows ---------------------------------------------------------------------------------
    def new_row(self) -> Row:
        got, frm = self.take()
        row = Row(start_ns=frm if frm is not None else -1, compute_ns=got)
        self.bwd.append(row)
        return row

    def blocking(self, comm: Comm) -> None:
        if self.forward:
            got, frm = self.take()
            self.fwd.append(Row(start_ns=frm if frm is not None else -1, compute_ns=got, comm=comm))
            return
        row = self.bwd[-1] if self.bwd and self.bwd[-1].stage == 0 else None
        if row is None:
            row = self.new_row()
        else:
            got, frm = self.take()
            row.compute_ns += got
            if row.start_ns < 0 and frm is not None:
                row.start_ns = frm
        row.comm = comm
        row.stage = 1

    def background(self, comm: Comm) -> None:
        row = self.bwd[-1] if self.bwd and self.bwd[-1].stage < 2 else None
        if row is None:
            row = self.new_row()
        else:
            got, frm = self.take()
            if row.stage == 0:
                row.compute_ns += got
            else:
                row.wg_compute_ns += got
            if row.start_ns < 0 and frm is not None:
                row.start_ns = frm
        row.wg_comm = comm
        row.stage = 2

    def finish(self) -> None:
        if self.pending:
            if self.forward:
                got, frm = self.take()
                self.fwd.append(Row(start_ns=frm if frm is not None else -1, compute_ns=got))
            elif self.bwd and self.bwd[-1].stage < 2:
                row = self.bwd[-1]
                got, _ = self.take()
                if row.stage == 0:
                    row.compute_ns += got
                else:
                    row.wg_compute_ns += got
            else:
                self.new_row().stage = 2


def _sorted_comms(comms: list[_CommEvent]) -> list[_CommEvent]:
    return sorted(comms, key=lambda c: (c.start, c.order))


def plan(events: Iterable[TimelineEvent], job: Job, rank: int) -> SimaiWorkload:
    """The SimAI workload of ``rank``'s step from its timeline ``events`` (one rank's boxes,
    any order; e.g. ``SimResult.timeline_events([rank])``)."""
    lay = layout_of(job, rank)
    p = _Planner(job, rank, lay)
    work = {True: _Work(), False: _Work()}   # GPU work; host operators (the compute of a CPU-only job)
    comms: list[_CommEvent] = []
    first: int | None = None
    last = 0
    for k, ev in enumerate(events):
        if ev.rank != rank:
            continue
        end = ev.start_ns + ev.duration_ns
        first = ev.start_ns if first is None else min(first, ev.start_ns)
        last = max(last, end)
        if ev.kind == pb.KIND_COLLECTIVE or ev.kind in _P2P:
            args = dict(ev.args)
            comms.append(_CommEvent(ev.start_ns, end, int(args.get("wait_ns") or 0), ev.track, ev.kind, k, args))
        elif ev.kind in _GPU_WORK or ev.kind == pb.KIND_CPU_OP:
            phase = str(ev.args.get("phase", ""))
            work[ev.kind in _GPU_WORK].add(ev.start_ns, end, ev.name, bool(phase) and phase != "forward")
    if first is None:
        raise EchoError(f"rank {rank} has nothing on its timeline to export")
    ordered = _sorted_comms(comms)
    gpu_job = len(work[True].starts) > 0
    # A host operator that holds a collective (the framework call around it) is no compute that
    # ran through it: in a CPU-only job such wrappers leave out of the busy time.
    chosen = (work[True] if gpu_job else work[False]).sorted(None if gpu_job else ordered)
    work_starts = chosen.starts
    backward_at = chosen.first_backward()
    p.busy = chosen.busy
    # per stream, the sorted starts of its communication: what started after a collective on
    # another stream, less those that only waited for the previous one on their own stream
    by_track: dict[str, list[int]] = {}
    track_end: dict[str, int] = {}
    for c in ordered:
        if track_end.get(c.track, -1) < c.start:
            by_track.setdefault(c.track, []).append(c.start)
        track_end[c.track] = max(track_end.get(c.track, -1), c.end)
    pos = first
    sends = 0
    for c in ordered:
        w = int(np.searchsorted(work_starts, c.start, side="left"))
        nexts = [int(work_starts[w])] if w < len(work_starts) else []
        for track, starts in by_track.items():
            if track != c.track:
                after = bisect.bisect_right(starts, c.start)
                if after < len(starts):
                    nexts.append(starts[after])
        # waited: nothing of the rank started while it ran, nor did compute run through it
        waited = (min(nexts) >= c.end and chosen.busy.covered(c.start, c.end) < c.end - c.start
                  if nexts else True)
        if c.kind in _P2P:
            # SimAI has no send/recv rows. In a pipeline its bubble (from pp_comm) stands for
            # them, so the rank's wait for its neighbours is left out; otherwise the wait stays
            # time, as compute.
            if c.kind == pb.KIND_SEND:
                sends = max(sends, int(c.args.get("bytes", 0)))
            waited_ns = c.end - max(pos, c.start) if waited and c.end > pos else 0
            if lay.pp > 1:
                p.drop("simai_pipeline_transfer_not_modelled")
            else:
                p.drop("simai_send_recv_not_in_simai", waited_ns)
            if waited_ns:
                p.span(pos, c.start)
                if lay.pp > 1:
                    p.add_time("pipeline_wait_ns", waited_ns)
                else:
                    p.compute(max(pos, c.start), c.end)
                pos = c.end
            continue
        if p.forward and (not waited or (backward_at is not None and c.start >= backward_at)):
            p.forward = False
        coll = _TOKEN.get(_TYPE_BY_NAME.get(str(c.args.get("type", "")), -1))
        key = p.key_of(int(c.args.get("group_id", 0)))
        transfer = max(0, c.end - c.start - c.wait)
        # SimAI's size: the buffer its ring cuts into one chunk per rank (an all-gather's output)
        nbytes = int(c.args.get("out_bytes" if coll == "ALLGATHER" else "bytes", 0))
        token = None
        if coll is not None and key is not None and nbytes > 0:
            if nexts and not waited:
                token = p.async_token(coll, key)
                if token is None:       # SimAI's weight-gradient column cannot hold this group
                    token = p.blocking_token(coll, key)
                    if token is not None:
                        p.drop("simai_comm_made_blocking")
                        waited = True
            elif not nexts:     # the step's last: nothing waits for it either way
                token = p.async_token(coll, key)
                waited = token is None
                if token is None:
                    token = p.blocking_token(coll, key)
            else:
                token = p.blocking_token(coll, key)
        if token is None:
            why = ("simai_comm_type_not_in_simai" if coll is None else
                   "simai_comm_group_not_in_layout" if key is None else
                   "simai_zero_byte_comm" if nbytes <= 0 else "simai_comm_group_not_in_column")
            if waited and c.end > pos:      # the rank waited: its time stays, as compute
                p.drop(why, c.end - max(pos, c.start))
                p.span(pos, c.start)
                p.compute(max(pos, c.start), c.end)
                pos = c.end
            else:
                p.drop(why)
            continue
        comm = Comm(token[0], token[1], nbytes, transfer)
        p.span(pos, c.start)
        label = f"{c.args.get('type')}/{key}"
        p.out.mapped[label] = p.out.mapped.get(label, 0) + 1
        if waited:
            p.blocking(comm)
            p.add_time("comm_blocking_ns", transfer)
            if c.wait:
                p.add_time("comm_wait_ns", min(c.wait, max(0, c.end - pos)))
            pos = max(pos, c.end)
        else:
            if p.forward:
                p.forward = False
            p.background(comm)
            p.inflight.append((c.start, c.end))
            p.add_time("comm_background_ns", transfer)
            pos = max(pos, c.start)
    p.span(pos, last)
    p.finish()
    p.out.time["rank_step_ns"] = last - first
    p.out.time["compute_ns"] = sum(r.compute_ns + r.wg_compute_ns for r in p.fwd + p.bwd)
    if lay.pp > 1:
        if not sends:
            sends = max((int(c.args.get("bytes", 0)) for c in ordered if c.kind == pb.KIND_RECV), default=0)
        if not sends:     # a SimAI workload read back: its header's value
            sends = int(job.manifest.attrs.get("simai_pp_comm", "0") or 0)
        if not sends:
            raise EchoError(f"rank {rank} of a {lay.pp}-stage pipeline sends nothing to its neighbours: "
                            "SimAI needs the bytes a stage sends (pp_comm)")
        if sends > INT32_MAX:
            raise EchoError(f"a pipeline message of {sends} bytes is more than SimAI's header can hold "
                            f"(pp_comm is read as a 32-bit integer, at most {INT32_MAX})")
        p.out.pp_comm = sends
    for what, v in (("world size", lay.world), ("TP", lay.tp), ("PP", lay.pp), ("EP", lay.ep),
                    ("VPP", lay.vpp), ("micro-batches", lay.ga)):
        if v > INT32_MAX:
            raise EchoError(f"{what} {v} is more than SimAI's header can hold (at most {INT32_MAX})")
    p.out.lines = _lines(p.fwd, p.bwd, chosen)
    return p.out


class _Work:
    """The rank's compute boxes, as arrays (a step may hold millions): start, name, whether
    the backward had begun."""

    def __init__(self) -> None:
        self.starts = array("q")
        self.ends = array("q")
        self.name_ids = array("i")
        self.backward = array("b")
        self.names: list[str] = []
        self._ids: dict[str, int] = {}

    def add(self, start: int, end: int, name: str, backward: bool) -> None:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        self.starts.append(start)
        self.ends.append(end)
        self.name_ids.append(i)
        self.backward.append(backward)

    def sorted(self, wrapped: list[_CommEvent] | None = None) -> _SortedWork:
        """Sorted by start; with ``wrapped``, boxes that hold one of these communications
        from its start to its end count as no busy time."""
        starts = np.frombuffer(self.starts, dtype=np.int64) if len(self.starts) else np.zeros(0, np.int64)
        order = np.argsort(starts, kind="stable")
        ids = np.frombuffer(self.name_ids, dtype=np.int32) if len(self.name_ids) else np.zeros(0, np.int32)
        bwd = np.frombuffer(self.backward, dtype=np.int8) if len(self.backward) else np.zeros(0, np.int8)
        ends = np.frombuffer(self.ends, dtype=np.int64) if len(self.ends) else np.zeros(0, np.int64)
        s_sorted, e_sorted = starts[order], ends[order]
        if wrapped:
            c_start = np.asarray([c.start for c in wrapped], dtype=np.int64)
            c_end = np.asarray([c.end for c in wrapped], dtype=np.int64)
            k = np.searchsorted(c_start, s_sorted, side="left")
            inside = k < c_start.size
            holds = np.zeros(s_sorted.size, dtype=bool)
            holds[inside] = (c_start[k[inside]] <= e_sorted[inside]) & (c_end[k[inside]] <= e_sorted[inside])
            busy = _Busy(s_sorted[~holds], e_sorted[~holds])
        else:
            busy = _Busy(s_sorted, e_sorted)
        return _SortedWork(s_sorted, ids[order], bwd[order], self.names, busy)


class _Busy:
    """The union of the compute boxes, to measure how much of a span compute covered and
    where it idled."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        self.lo, self.hi = merge_intervals(starts, ends)

    def gaps(self, a: int, b: int) -> list[tuple[int, int]]:
        """The stretches of [a, b] that no compute box covers."""
        i = int(np.searchsorted(self.hi, a, side="right"))
        j = int(np.searchsorted(self.lo, b, side="left"))
        out = []
        cur = a
        for lo, hi in zip(self.lo[i:j].tolist(), self.hi[i:j].tolist(), strict=True):
            if lo > cur:
                out.append((cur, lo))
            cur = max(cur, hi)
        if cur < b:
            out.append((cur, b))
        return out

    def covered(self, a: int, b: int) -> int:
        """ns of [a, b] that some compute box covers."""
        if b <= a:
            return 0
        return int(covered_length(self.lo, self.hi, np.array([a], dtype=np.int64),
                                  np.array([b], dtype=np.int64))[0])


@dataclass
class _SortedWork:
    starts: np.ndarray
    name_ids: np.ndarray
    backward: np.ndarray
    names: list[str]
    busy: _Busy

    def first_backward(self) -> int | None:
        hit = np.flatnonzero(self.backward)
        return int(self.starts[hit[0]]) if hit.size else None

    def name_at(self, t: int) -> str | None:
        i = int(np.searchsorted(self.starts, t, side="left"))
        return self.names[int(self.name_ids[i])] if i < len(self.starts) else None


def _name(rows: list[Row | None], work: _SortedWork) -> str:
    for r in rows:
        if r is not None and r.start_ns >= 0:
            got = work.name_at(r.start_ns)
            clean = _NAME_CHARS.sub("_", got or "").strip("_")[:_NAME_MAX]
            if clean and clean != "embedding_layer":   # SimAI treats that name specially
                return clean
    return "comm" if any(r is not None and (r.comm or r.wg_comm) for r in rows) else "compute"


def _lines(fwd: list[Row], bwd: list[Row], work: _SortedWork) -> list[tuple[str, Row | None, Row | None]]:
    n = max(len(fwd), len(bwd))
    out = []
    for j in range(n):
        f = fwd[j] if j < len(fwd) else None
        t = n - 1 - j                  # the backward runs the lines from the last one
        b = bwd[t] if t < len(bwd) else None
        out.append((_name([f, b], work), f, b))
    return out


def write(workload: SimaiWorkload, dest: str | Path) -> int:
    """Write the workload text to ``dest`` (atomically); the bytes written."""
    data = workload.text().encode()
    with atomic_file(dest) as f:
        f.write(data)
    return len(data)


__all__ = ["SimaiLayout", "SimaiWorkload", "layout_of", "plan", "write"]
