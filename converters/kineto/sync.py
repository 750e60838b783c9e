"""Host/device and cross-stream synchronisation turned into DEP_SYNC pairs.

Exact when the trace has Kineto's ``cuda_sync`` activities (PyTorch's
``enable_cuda_sync_events``): each names the waiting ``stream``, the ``wait_on_stream`` and
the correlation id of the ``cudaEventRecord`` it waits for. Most traces lack them; then the
call's stream is inferred from the launches around it on the same host thread, the way
PyTorch issues them (``stream.wait_event`` right before launching on the waiting stream;
``cudaStreamSynchronize`` on the stream last launched to), and each such guess is counted.

A cross-stream wait becomes a dependency of the first GPU op launched on the waiting
stream after the wait on the last GPU op launched on the recording stream before the
record; a host sync becomes a dependency of the sync call on the last GPU op launched
before it on each stream it waits for.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable

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


class LaunchIndex:
    """Kept GPU ops by stream in launch order, and launches by host thread."""

    def __init__(self, gpu_ops: list[Ev], launch_of: Callable[[Ev], Ev | None]):
        per_stream: dict[Stream, list[tuple[int, int, Ev]]] = defaultdict(list)
        per_thread: dict[tuple, list[tuple[int, Stream]]] = defaultdict(list)
        for g in gpu_ops:
            launch = launch_of(g)
            t = launch.ts if launch is not None else g.ts
            per_stream[g.thread].append((t, g.ts, g))
            if launch is not None:
                per_thread[launch.thread].append((launch.ts, g.thread))
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


def resolve(calls: list[Ev], acts_by_corr: dict[int, Ev], runtime_by_corr: dict[int, Ev],
            index: LaunchIndex, count: Callable[[str], None]) -> list[tuple[Ev, Ev]]:
    """DEP_SYNC pairs (waiter, waited-for) from the kept sync/record/wait runtime calls."""
    deps: list[tuple[Ev, Ev]] = []
    records = sorted((c for c in calls if c.name in EVENT_RECORD), key=lambda c: (c.ts, c.idx))
    rec_by_thread: dict[tuple, list[Ev]] = defaultdict(list)
    for r in records:
        rec_by_thread[r.thread].append(r)
    rec_times = {th: [r.ts for r in rs] for th, rs in rec_by_thread.items()}
    rec_stream_cache: dict[int, Stream | None] = {}

    def rec_stream(r: Ev) -> Stream | None:
        s = rec_stream_cache.get(r.idx, ())
        if s == ():
            act = acts_by_corr.get(r.corr)
            s = act.thread if act is not None else index.stream_launched_before(r.thread, r.ts)
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
                waiting = index.stream_launched_after(c.thread, c.ts)
                rec = None
                if waiting is not None:
                    rec = recent_record(c.thread, c.ts, waiting)
                    if rec is None:
                        for th in rec_by_thread:
                            if th != c.thread:
                                cand = recent_record(th, c.ts, waiting)
                                if cand is not None and (rec is None or cand.ts > rec.ts):
                                    rec = cand
                if waiting is None:
                    count("event_wait_unresolved")
                    continue
                if rec is not None:
                    src_stream = rec_stream(rec)
                    t_rec = rec.ts
                    count("event_wait_paired_by_heuristic")
                else:
                    # No cudaEventRecord in the trace (older Kineto): the event was
                    # recorded on the stream most recently launched to, other than ours.
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
