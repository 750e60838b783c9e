"""Host/device and cross-stream synchronisation turned into DEP_SYNC pairs.

Exact when the trace has Kineto's ``cuda_sync`` activities (PyTorch's
``enable_cuda_sync_events``): each names the waiting ``stream``, the ``wait_on_stream`` and
the correlation id of the ``cudaEventRecord`` it waits for. Most traces lack them; then the
call's stream is inferred from the launches around it on the same host thread, the way
PyTorch issues them, and each such guess is counted:

* a thread's *current stream* is the stream of its latest launch that is not a
  communication kernel (c10d switches to its NCCL stream only inside the collective call);
* inside a communication op (the ``c10d::*`` / ``record_param_comms`` op that launched NCCL
  kernels), before the library call: PyTorch's ``syncStream`` makes the NCCL stream wait for
  the current stream (record on the current stream, wait on the NCCL stream);
* inside the library call (the ``nccl:*`` annotation, or from the first kernel launch on):
  NCCL records and waits events between the NCCL stream and its own internal streams, which
  run nothing the trace shows. Such waits order nothing we can see and are skipped
  (``event_wait_inside_comm_library``); records there are on the NCCL stream (the work's end
  event that ``work.wait()`` later waits for);
* elsewhere the waiting stream is the current stream (the next non-communication launch);
  inside a ``record_param_comms`` that launched nothing (c10d's ``work.wait()``) it waits for
  the communication stream of the latest collective launched before it;
* ``cudaStreamSynchronize`` is on the stream last launched to.

A cross-stream wait becomes a dependency of the first GPU op launched on the waiting
stream after the wait on the last GPU op launched on the recording stream before the
record; a host sync becomes a dependency of the sync call on the last GPU op launched
before it on each stream it waits for. The caller still checks every pair against the
measured times (build.py) and drops those the trace contradicts.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .events import Ev

STREAM_SYNC = frozenset({"cudaStreamSynchronize", "hipStreamSynchronize", "cuStreamSynchronize"})
DEVICE_SYNC = frozenset({"cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize",
                         "cudaThreadSynchronize"})
EVENT_SYNC = frozenset({"cudaEventSynchronize", "hipEventSynchronize", "cuEventSynchronize"})
EVENT_RECORD = frozenset({"cudaEventRecord", "cudaEventRecordWithFlags", "hipEventRecord",
                          "hipEventRecordWithFlags", "cuEventRecord", "cuEventRecordWithFlags"})
STREAM_WAIT = frozenset({"cudaStreamWaitEvent", "hipStreamWaitEvent", "cuStreamWaitEvent"})
HOST_SYNC = STREAM_SYNC | DEVICE_SYNC | EVENT_SYNC

Stream = tuple  # (device, stream)
_SEARCH_BACK = 64  # records inspected when pairing a wait heuristically


@dataclass(frozen=True)
class CommRegion:
    """Where one communication op ran on its host thread: ``start``..``end`` is the op (with
    the ``record_param_comms`` around it, if any); from ``library`` on it is inside the
    library call; ``stream`` is the stream of its kernels."""

    thread: tuple
    start: int
    library: int
    end: int
    stream: Stream


class Spans:
    """Host-op spans by thread (each with a payload), to find the one holding an instant.
    Spans of one thread are outermost ops, so they do not nest."""

    def __init__(self, spans: Iterable[tuple[tuple, int, int, object]] = ()):
        by_thread: dict[tuple, list[tuple[int, int, object]]] = defaultdict(list)
        for thread, start, end, payload in spans:
            by_thread[thread].append((start, end, payload))
        self._spans: dict[tuple, list[tuple[int, int, object]]] = {}
        self._starts: dict[tuple, list[int]] = {}
        for th, items in by_thread.items():
            items.sort(key=lambda x: (x[0], x[1]))
            self._spans[th] = items
            self._starts[th] = [x[0] for x in items]

    def at(self, thread: tuple, t: int) -> object | None:
        starts = self._starts.get(thread)
        if not starts:
            return None
        i = bisect_right(starts, t) - 1
        # Look back a little in case a short span starts inside a long one (clock rounding).
        for j in range(i, max(-1, i - 4), -1):
            start, end, payload = self._spans[thread][j]
            if start <= t <= end:
                return payload
        return None


class LaunchIndex:
    """Kept GPU ops by stream in launch order, and launches by host thread (all of them, and
    those that launched no communication kernel: the thread's current stream)."""

    def __init__(self, gpu_ops: list[Ev], launch_of: Callable[[Ev], Ev | None],
                 comm_ops: frozenset[int] | set[int] = frozenset()):
        per_stream: dict[Stream, list[tuple[int, int, Ev]]] = defaultdict(list)
        per_thread: dict[tuple, list[tuple[int, Stream]]] = defaultdict(list)
        per_thread_local: dict[tuple, list[tuple[int, Stream]]] = defaultdict(list)
        comm_launches: list[tuple[int, Stream]] = []
        for g in gpu_ops:
            launch = launch_of(g)
            t = launch.ts if launch is not None else g.ts
            per_stream[g.thread].append((t, g.ts, g))
            if launch is not None:
                per_thread[launch.thread].append((launch.ts, g.thread))
                if g.idx in comm_ops:
                    comm_launches.append((launch.ts, g.thread))
                else:
                    per_thread_local[launch.thread].append((launch.ts, g.thread))
        self.stream_ops: dict[Stream, list[Ev]] = {}
        self.stream_times: dict[Stream, list[int]] = {}
        for s, items in per_stream.items():
            items.sort(key=lambda x: (x[0], x[1], x[2].idx))
            self.stream_times[s] = [x[0] for x in items]
            self.stream_ops[s] = [x[2] for x in items]
        self.thread_times: dict[tuple, list[int]] = {}
        self.thread_streams: dict[tuple, list[Stream]] = {}
        every = sorted((t, s) for launches in per_thread.values() for t, s in launches)
        self.all_times = [t for t, _ in every]
        self.all_streams = [s for _, s in every]
        for th, launches in per_thread.items():
            launches.sort(key=lambda x: x[0])
            self.thread_times[th] = [x[0] for x in launches]
            self.thread_streams[th] = [x[1] for x in launches]
        self.local_times: dict[tuple, list[int]] = {}
        self.local_streams: dict[tuple, list[Stream]] = {}
        for th, launches in per_thread_local.items():
            launches.sort(key=lambda x: x[0])
            self.local_times[th] = [x[0] for x in launches]
            self.local_streams[th] = [x[1] for x in launches]
        comm_launches.sort(key=lambda x: x[0])
        self.comm_times = [t for t, _ in comm_launches]
        self.comm_streams = [s for _, s in comm_launches]

    def last_before(self, stream: Stream, t: int) -> Ev | None:
        times = self.stream_times.get(stream)
        if not times:
            return None
        i = bisect_right(times, t) - 1
        return self.stream_ops[stream][i] if i >= 0 else None

    def first_after(self, stream: Stream, t: int) -> Ev | None:
        times = self.stream_times.get(stream)
        if not times:
            return None
        i = bisect_right(times, t)
        return self.stream_ops[stream][i] if i < len(times) else None

    def stream_launched_before(self, thread: tuple, t: int) -> Stream | None:
        times = self.thread_times.get(thread)
        if not times:
            return None
        i = bisect_left(times, t) - 1
        return self.thread_streams[thread][i] if i >= 0 else None

    def other_stream_launched_before(self, t: int, avoid: Stream) -> Stream | None:
        """The stream of the latest launch (any thread) before ``t`` not onto ``avoid``."""
        i = bisect_left(self.all_times, t) - 1
        stop = max(-1, i - _SEARCH_BACK)
        while i > stop:
            if self.all_streams[i] != avoid:
                return self.all_streams[i]
            i -= 1
        return None

    def stream_launched_after(self, thread: tuple, t: int) -> Stream | None:
        times = self.thread_times.get(thread)
        if not times:
            return None
        i = bisect_right(times, t)
        return self.thread_streams[thread][i] if i < len(times) else None

    def current_stream_before(self, thread: tuple, t: int) -> Stream | None:
        """The thread's current stream at ``t``: its latest non-communication launch (else
        its latest launch)."""
        times = self.local_times.get(thread)
        if times:
            i = bisect_left(times, t) - 1
            if i >= 0:
                return self.local_streams[thread][i]
        return self.stream_launched_before(thread, t)

    def current_stream_after(self, thread: tuple, t: int) -> Stream | None:
        """The stream of the thread's next non-communication launch (else its next launch)."""
        times = self.local_times.get(thread)
        if times:
            i = bisect_right(times, t)
            if i < len(times):
                return self.local_streams[thread][i]
        return self.stream_launched_after(thread, t)

    def comm_stream_launched_before(self, t: int, avoid: Stream) -> Stream | None:
        """The stream of the latest communication kernel launched (any thread) before ``t``."""
        i = bisect_left(self.comm_times, t) - 1
        stop = max(-1, i - _SEARCH_BACK)
        while i > stop:
            if self.comm_streams[i] != avoid:
                return self.comm_streams[i]
            i -= 1
        return None


def resolve(calls: list[Ev], acts_by_corr: dict[int, Ev], runtime_by_corr: dict[int, Ev],
            index: LaunchIndex, count: Callable[[str], None], regions: Spans | None = None,
            work_waits: Spans | None = None) -> list[tuple[Ev, Ev]]:
    """DEP_SYNC pairs (waiter, waited-for) from the kept sync/record/wait runtime calls.
    ``regions`` holds the communication ops (payload: CommRegion), ``work_waits`` the
    ``record_param_comms`` ops of ``work.wait()`` (see the module docstring)."""
    regions = regions or Spans()
    work_waits = work_waits or Spans()
    deps: list[tuple[Ev, Ev]] = []
    records = sorted((c for c in calls if c.name in EVENT_RECORD), key=lambda c: (c.ts, c.idx))
    rec_by_thread: dict[tuple, list[Ev]] = defaultdict(list)
    for r in records:
        rec_by_thread[r.thread].append(r)
    rec_times = {th: [r.ts for r in rs] for th, rs in rec_by_thread.items()}
    rec_stream_cache: dict[int, Stream | None] = {}

    def region_at(c: Ev) -> CommRegion | None:
        r = regions.at(c.thread, c.ts)
        return r if isinstance(r, CommRegion) else None

    def rec_stream(r: Ev) -> Stream | None:
        s = rec_stream_cache.get(r.idx, ())
        if s == ():
            act = acts_by_corr.get(r.corr)
            if act is not None:
                s = act.thread
            else:
                reg = region_at(r)
                if reg is not None and r.ts >= reg.library:
                    s = reg.stream          # NCCL's records, and the work's end event
                else:
                    s = index.current_stream_before(r.thread, r.ts)
            rec_stream_cache[r.idx] = s
        return s

    def recent_record(thread: tuple, t: int, avoid: Stream | None) -> Ev | None:
        rs = rec_by_thread.get(thread)
        if not rs:
            return None
        i = bisect_right(rec_times[thread], t) - 1
        stop = max(-1, i - _SEARCH_BACK)
        while i > stop:
            s = rec_stream(rs[i])
            if s is not None and s != avoid:
                return rs[i]
            i -= 1
        return None

    for c in calls:
        name = c.name
        act = acts_by_corr.get(c.corr)
        if name in STREAM_WAIT:
            if act is not None and act.arg("wait_on_stream") is not None:
                waiting = act.thread
                src_stream = (act.thread[0], _int(act.arg("wait_on_stream")))
                rec = runtime_by_corr.get(_int(act.arg("wait_on_cuda_event_record_corr_id")))
                t_rec = rec.ts if rec is not None else c.ts
            else:
                reg = region_at(c)
                if reg is not None and c.ts >= reg.library:
                    count("event_wait_inside_comm_library")
                    continue
                if reg is not None:         # syncStream: the NCCL stream waits for ours
                    waiting = reg.stream
                else:
                    waiting = index.current_stream_after(c.thread, c.ts)
                if waiting is None:
                    count("event_wait_unresolved")
                    continue
                rec = recent_record(c.thread, c.ts, waiting)
                if rec is None:
                    for th in rec_by_thread:
                        if th != c.thread:
                            cand = recent_record(th, c.ts, waiting)
                            if cand is not None and (rec is None or cand.ts > rec.ts):
                                rec = cand
                if rec is not None:
                    src_stream = rec_stream(rec)
                    t_rec = rec.ts
                    count("event_wait_paired_by_heuristic")
                else:
                    # No cudaEventRecord in the trace (older Kineto): before a collective,
                    # the event was recorded on the current stream; in work.wait(), on the
                    # stream of the latest collective; else on the stream most recently
                    # launched to, other than ours.
                    if reg is not None:
                        src_stream = index.current_stream_before(c.thread, c.ts)
                    elif work_waits.at(c.thread, c.ts) is not None:
                        src_stream = index.comm_stream_launched_before(c.ts, waiting)
                    else:
                        src_stream = index.other_stream_launched_before(c.ts, waiting)
                    t_rec = c.ts
                    if src_stream is None:
                        count("event_wait_unresolved")
                        continue
                    count("event_wait_stream_guessed")
            if src_stream == waiting or src_stream is None:
                continue
            producer = index.last_before(src_stream, t_rec)
            consumer = index.first_after(waiting, c.ts)
            if producer is not None and consumer is not None and producer is not consumer:
                deps.append((consumer, producer))
        elif name in DEVICE_SYNC:
            device = act.thread[0] if act is not None else None
            for s in sorted(index.stream_ops, key=_stream_key):
                if device is not None and s[0] != device:
                    continue  # a context sync waits for its own device only
                g = index.last_before(s, c.ts)
                if g is not None:
                    deps.append((c, g))
        elif name in STREAM_SYNC:
            if act is not None:
                stream = act.thread
            else:
                stream = index.stream_launched_before(c.thread, c.ts)
                count("stream_sync_stream_guessed")
            g = index.last_before(stream, c.ts) if stream is not None else None
            if g is not None:
                deps.append((c, g))
        elif name in EVENT_SYNC:
            if act is not None and act.arg("wait_on_stream") is not None:
                stream = (act.thread[0], _int(act.arg("wait_on_stream")))
                rec = runtime_by_corr.get(_int(act.arg("wait_on_cuda_event_record_corr_id")))
                t = rec.ts if rec is not None else c.ts
            else:
                rec = recent_record(c.thread, c.ts, None)
                if rec is None:
                    for th in rec_by_thread:
                        cand = recent_record(th, c.ts, None)
                        if cand is not None and (rec is None or cand.ts > rec.ts):
                            rec = cand
                if rec is None:
                    count("event_sync_unresolved")
                    continue
                stream, t = rec_stream(rec), rec.ts
                count("event_sync_paired_by_heuristic")
            g = index.last_before(stream, t) if stream is not None else None
            if g is not None:
                deps.append((c, g))
    return deps


def _int(v) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def _stream_key(s: Stream) -> tuple:
    return tuple(-1 if x is None else x for x in s)
