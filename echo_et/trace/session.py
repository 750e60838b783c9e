"""Trace one rank: play rank r of the world on this device, profile one step, splice.

Order of events for rank r (one process plays the ranks one after another):

1. ``init_process_group("echo-record", rank=r, world_size=N)`` with an in-memory store;
2. ``build_fn(ctx)`` and the warm-up step(s) (one by default; DDP rebuilds its buckets
   in its second step, so DDP workloads want two), measured for peak memory;
3. one step under ``torch.profiler`` (CPU ops; CUDA kernels too on a GPU), exported as a
   Kineto trace into a temporary folder and read back with the Kineto reader;
4. the recording replaces the communication spans (:mod:`echo_et.trace.splice`);
5. with ``measured_steps`` > 1, steps 3-4 run that many times and the steps are combined,
   each operator keeping its shortest time (:mod:`echo_et.trace.steps`);
6. the process group is destroyed and the rank's objects freed.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` over build, warm-up and measured
step (minus what was allocated before the build). On CPU, the largest running sum of the
profiler's allocation events (``profile_memory=True``) over build and warm-up: the bytes of
live tensors, like ``max_memory_allocated``; the measured step is profiled without memory
events so that they do not slow the timings. An allocation failure, or a peak over
``memory_limit_bytes``, is reported as :class:`TraceOutOfMemory` naming layout and rank.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir import Graph
from echo_et.ir.limits import MAX_GRAPH_NODES, format_size
from echo_et.trace.context import RankContext
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.quiet import profiler_chatter_filtered
from echo_et.trace.records import CommRecord
from echo_et.trace.splice import splice
from echo_et.trace.steps import StepCombiner, step_span_ns

KeyFn = Callable[[int, CommRecord], str]
_PARTIAL_JOB_REASONS = frozenset({"ranks_not_traced", "untraced_ranks_copied",
                                  "partial_job_group_split"})


class TraceOutOfMemory(EchoError):
    """A traced rank does not fit in the device memory (or the given limit)."""


@dataclass
class RankRun:
    rank: int
    graph: Graph
    records: list[CommRecord]
    peak_memory_bytes: int
    measured_step_ns: int
    wall_s: float
    dropped: Counter = field(default_factory=Counter)
    measured_steps: int = 1


@dataclass
class _MeasuredStep:
    graph: Graph | None
    records: list[CommRecord]
    keys: list[str]
    step_ns: int
    dropped: Counter


def _measure_step(step: Callable, activities: list, layout: ParallelLayout, rank: int,
                  device: str, dev, cuda: bool, key_of: KeyFn, k: int, total: int
                  ) -> _MeasuredStep:
    """Profile one call of ``step`` with the recorder on; splice the recording in."""
    import torch
    from torch.profiler import profile

    from echo_et.converters import ReadOptions, read
    from echo_et.trace.recording import RECORDER

    what = "the measured step" if total == 1 else f"measured step {k + 1}"
    RECORDER.reset()
    RECORDER.enabled = True
    with tempfile.TemporaryDirectory(prefix="echo-trace-") as tmp:
        path = Path(tmp) / f"rank{rank}.json"
        with profiler_chatter_filtered(), profile(activities=activities, record_shapes=True) as prof:
            _user_call(step, what, layout, rank, device)
            if cuda:
                torch.cuda.synchronize(dev)
        RECORDER.enabled = False
        prof.export_chrome_trace(str(path))
        del prof
        check_profile_size(path, layout, rank, what)
        try:
            job = read([path], "kineto", ReadOptions(rank=rank))
        except EchoError as e:
            raise EchoError(f"{where(layout, rank)}: the profile of {what} cannot be "
                            f"converted: {str(e).replace(str(path) + ': ', '')}") from None
    records = list(RECORDER.records)
    RECORDER.reset()
    keys = [key_of(rank, r) for r in records]
    # The file is one rank of an N-rank world: the reader makes a partial Job of it,
    # whose rank bookkeeping does not concern the one graph taken from it.
    src = next(job.graphs())
    dropped = Counter({k: v for k, v in job.manifest.dropped.items()
                       if k not in _PARTIAL_JOB_REASONS})
    step_ns = step_span_ns(src)
    res = splice(src, records, keys, graph_id=f"rank{rank}", device=device,
                 where=where(layout, rank))
    dropped.update(res.dropped)
    return _MeasuredStep(graph=res.graph, records=records, keys=keys, step_ns=int(step_ns),
                         dropped=dropped)


# The most bytes one event of an exported profile takes (a kernel with its args and shapes runs
# 300-700 bytes): a profile larger than this per node of a graph holds more events than a graph
# may have nodes, and reading it would take minutes and gigabytes.
MAX_PROFILE_BYTES_PER_EVENT = 1024


def check_profile_size(path: Path, layout: ParallelLayout, rank: int, what: str) -> None:
    """Refuse, before reading it, the profile of a step that recorded more events than a
    graph may have nodes (a user's script is not estimated before it runs)."""
    size = path.stat().st_size
    if size > MAX_PROFILE_BYTES_PER_EVENT * MAX_GRAPH_NODES:
        raise EchoError(f"{where(layout, rank)}: the profile of {what} is {format_size(size)}: more than "
                        f"{MAX_GRAPH_NODES:,} events (at most {MAX_PROFILE_BYTES_PER_EVENT} bytes each), the limit "
                        "of nodes per graph")


def where(layout: ParallelLayout, rank: int) -> str:
    return f"layout {layout.describe()}, rank {rank}"


def _is_oom(e: BaseException) -> bool:
    import torch

    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    if isinstance(e, (MemoryError, *oom_types)):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text
                                            or "out of memory" in text.lower())


def _user_call(fn: Callable, what: str, layout: ParallelLayout, rank: int, device: str):
    try:
        return fn()
    except EchoError as e:
        msg = str(e)
        if f"rank {rank}" not in msg:
            msg = f"{where(layout, rank)}: {msg.removeprefix(f'layout {layout.describe()}: ')}"
        raise type(e)(msg) from None
    except Exception as e:  # noqa: BLE001 - user code: one line, never a traceback
        if _is_oom(e):
            raise TraceOutOfMemory(f"{where(layout, rank)}: out of memory on {device} during "
                                   f"{what} ({str(e).splitlines()[0][:200]})") from None
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise EchoError(f"{where(layout, rank)}: {what} raised {type(e).__name__}"
                        f"{': ' + first if first else ''}") from None


def _cpu_peak(prof) -> int:
    """Largest running sum of CPU allocation events seen by ``prof``."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
              and str(e.device_type()).endswith("CPU")]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def trace_rank(build_fn: Callable, layout: ParallelLayout, rank: int, *, device: str,
               key_of: KeyFn, memory_limit_bytes: int | None = None,
               warmup_steps: int = 1, measured_steps: int = 1, replay: bool = True,
               memo: bool = True) -> RankRun:
    """Run and profile rank ``rank`` (see the module docstring)."""
    if device == "meta":
        return _trace_rank_meta(build_fn, layout, rank, key_of=key_of,
                                warmup_steps=warmup_steps, replay=replay, memo=memo)
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from echo_et.trace.recording import BACKEND_NAME, RECORDER, register_backend

    t0 = time.perf_counter()
    register_backend()
    if dist.is_initialized():
        raise EchoError(f"{where(layout, rank)}: torch.distributed is already initialised in "
                        "this process; the tracer needs to own the default process group")
    cuda = device.startswith("cuda")
    dev = torch.device(device)
    if cuda and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=layout.world_size,
                            store=dist.HashStore())
    RECORDER.reset()
    RECORDER.enabled = False
    step = None
    try:
        ctx = RankContext(rank, layout, device)
        if cuda:
            torch.cuda.set_device(dev)
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.synchronize(dev)
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            if memory_limit_bytes:
                total = torch.cuda.get_device_properties(dev).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, memory_limit_bytes / total), dev)
            step = _user_call(lambda: build_fn(ctx), "build_fn", layout, rank, device)
            if not callable(step):
                raise EchoError(f"{where(layout, rank)}: build_fn returned "
                                f"{type(step).__name__}, not a step function")
            for _ in range(warmup_steps):
                _user_call(step, "the warm-up step", layout, rank, device)
            torch.cuda.synchronize(dev)
        else:
            with profiler_chatter_filtered(), \
                    profile(activities=[ProfilerActivity.CPU], profile_memory=True) as mem_prof:
                step = _user_call(lambda: build_fn(ctx), "build_fn", layout, rank, device)
                if not callable(step):
                    raise EchoError(f"{where(layout, rank)}: build_fn returned "
                                    f"{type(step).__name__}, not a step function")
                for _ in range(warmup_steps):
                    _user_call(step, "the warm-up step", layout, rank, device)
            peak = _cpu_peak(mem_prof)
            del mem_prof
            if memory_limit_bytes and peak > memory_limit_bytes:
                raise TraceOutOfMemory(
                    f"{where(layout, rank)}: out of memory: needs {peak} bytes of tensors, over "
                    f"the limit of {memory_limit_bytes} bytes")

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        combiner = StepCombiner(where=where(layout, rank))
        first: _MeasuredStep | None = None
        for k in range(measured_steps):
            got = _measure_step(step, activities, layout, rank, device, dev, cuda, key_of, k,
                                measured_steps)
            if first is None:
                first = got
            elif got.keys != first.keys:
                raise EchoError(f"{where(layout, rank)}: measured step {k + 1} issues different "
                                "collectives from step 1; the workload is not repeatable, "
                                "trace it with one measured step")
            if measured_steps > 1:
                combiner.add(got.graph)
                got.graph = None          # the combiner keeps what it needs
        assert first is not None
        if cuda:
            peak = torch.cuda.max_memory_allocated(dev) - base
        dropped = first.dropped
        if first.graph is not None:
            graph, step_ns = first.graph, first.step_ns
        else:
            graph = combiner.result(copy=False)
            step_ns = step_span_ns(graph)
        return RankRun(rank=rank, graph=graph, records=first.records,
                       peak_memory_bytes=int(peak), measured_step_ns=int(step_ns),
                       measured_steps=measured_steps,
                       wall_s=time.perf_counter() - t0, dropped=dropped)
    finally:
        RECORDER.enabled = False
        RECORDER.reset()
        step = None
        dist.destroy_process_group()
        gc.collect()
        if cuda:
            if memory_limit_bytes:
                torch.cuda.set_per_process_memory_fraction(1.0, dev)
            torch.cuda.empty_cache()


def _trace_rank_meta(build_fn: Callable, layout: ParallelLayout, rank: int, *, key_of: KeyFn,
                     warmup_steps: int, replay: bool, memo: bool = True) -> RankRun:
    """Record rank ``rank`` on the meta device (:mod:`echo_et.trace.direct`): no profiler,
    nothing timed, nothing allocated. The warm-up step(s) run recorded (so that repeated
    units are replayed there too) and are then forgotten."""
    import torch.distributed as dist

    from echo_et.trace.direct import DirectRecorder
    from echo_et.trace.direct_graph import build_graph
    from echo_et.trace.recording import BACKEND_NAME, RECORDER, register_backend

    t0 = time.perf_counter()
    register_backend()
    if dist.is_initialized():
        raise EchoError(f"{where(layout, rank)}: torch.distributed is already initialised in "
                        "this process; the tracer needs to own the default process group")
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=layout.world_size,
                            store=dist.HashStore())
    RECORDER.reset()
    RECORDER.enabled = False
    recorder = DirectRecorder(replay=replay, memo=memo)
    recorder.attach(lambda: RECORDER.records)
    step = None
    try:
        ctx = RankContext(rank, layout, "meta")
        step = _user_call(lambda: build_fn(ctx), "build_fn", layout, rank, "meta")
        if not callable(step):
            raise EchoError(f"{where(layout, rank)}: build_fn returned "
                            f"{type(step).__name__}, not a step function")
        with recorder:
            for _ in range(warmup_steps):
                RECORDER.reset()
                RECORDER.enabled = True
                recorder.recording = True
                _user_call(step, "the warm-up step", layout, rank, "meta")
                recorder.recording = False
                recorder.reset()
                recorder.forget_units()
            RECORDER.reset()
            RECORDER.enabled = True
            recorder.recording = True
            _user_call(step, "the measured step", layout, rank, "meta")
            recorder.recording = False
        RECORDER.enabled = False
        try:
            events = recorder.flat_events()
        except EchoError as e:
            raise EchoError(f"{where(layout, rank)}: {e}") from None
        res = build_graph(events, lambda rec: key_of(rank, rec), graph_id=f"rank{rank}",
                          where=where(layout, rank))
        dropped = Counter(res.dropped)
        for what in ("units_replayed", "regions_replayed"):
            if recorder.stats[what]:
                res.graph.header.attrs[f"trace.{what}"] = str(recorder.stats[what])
        return RankRun(rank=rank, graph=res.graph, records=res.records, peak_memory_bytes=0,
                       measured_step_ns=0, wall_s=time.perf_counter() - t0, dropped=dropped,
                       measured_steps=1)
    finally:
        RECORDER.enabled = False
        RECORDER.reset()
        step = None
        dist.destroy_process_group()
        # A meta rank frees no device memory: its model's reference cycles are left to the
        # collector's young generations (a full collection per rank costs a tenth of a second).
        gc.collect(1)
