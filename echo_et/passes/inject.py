"""inject: turn a single-GPU trace (no communication) into a data-parallel Job, as DDP runs it.

Rules (PyTorch DistributedDataParallel, torch/nn/parallel/distributed.py and reducer.cpp):

- **Gradients and their order.** A gradient is ready when autograd's AccumulateGrad for its
  parameter runs (the ``torch::autograd::AccumulateGrad`` host op; the
  ``autograd::engine::evaluate_function: ...AccumulateGrad`` wrapper when only that exists).
  DDP rebuilds its buckets after the first iteration in the order gradients became ready,
  so the buckets follow the order of those ops in the trace (for a sequential model that is
  reverse parameter order, the order DDP starts from).
- **Gradient sizes.** The shape and dtype of each AccumulateGrad's input (``cpu.shapes`` /
  ``cpu.dtypes``, from Kineto's ``Input Dims`` / ``Input type`` or the host ET). Fallback,
  when the trace has no such shapes or ``--param-bytes`` is given: that total spread evenly
  over the AccumulateGrad ops, or over the backward ops (``autograd::engine::
  evaluate_function: *`` host ops or nodes annotated phase=backward) when there are none.
- **Buckets.** Gradients join the current bucket until it reaches its cap (the bucket may
  exceed it by its last gradient, as in ``compute_bucket_assignment_by_size``). With the
  default cap (25 MiB) the first bucket's cap is 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``);
  when ``--bucket-mb`` is given, the first bucket has that cap too (DDP's
  ``_BucketCapacityConfig``: the small first bucket only comes with the default). MiB =
  2**20 bytes. Gradients of different dtypes never share a bucket.
- **Issue point.** A bucket is reduced when its last gradient is ready: the collective runs
  on a new communication stream, after the host op of that AccumulateGrad (DEP_DATA) and
  after the latest GPU kernel launched before it (DEP_SYNC: DDP's stream wait).
- **Completion.** DDP's ``finalize_backward`` makes the compute stream wait for every bucket:
  the first GPU kernel launched after the last gradient (the optimizer's) waits for all of
  them (DEP_SYNC); in a CPU-only trace the first host op after the backward waits (gloo's
  ``work.wait()`` blocks the host).
- **ZeRO-1** (``--zero 1``): each bucket is a reduce-scatter at the same point (input the
  bucket padded to a multiple of dp, output the 1/dp shard), and an all-gather of the shard
  per bucket is issued after the last node of the step (the optimizer), before the next
  forward. Optimizer time is kept as traced (the full model's update: an upper bound).

The new Job binds ``dp`` ranks to the one (copied) graph; its collectives' durations are
left to the simulator's communication model (measured durations do not exist): 0 ns.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Graph, GraphBuilder, Job
from echo_et.ir.schema import COMM_KINDS, pb
from echo_et.passes.derive import check_gpus_per_node, derived_job_builder
from echo_et.passes.gradients import (
    ACCUMULATE_GRAD,
    EVALUATE_PREFIX,
    OPTIMIZER_PREFIX,
    Gradient,
    bucket_gradients,
    grad_bytes,
)

DEFAULT_FIRST_BUCKET_BYTES = 1 << 20
DEFAULT_BUCKET_MB = 25.0


@dataclass
class InjectReport:
    dp: int
    zero: int
    param_bytes: int = 0
    param_source: str = ""
    gradients: int = 0
    buckets: int = 0
    bucket_bytes: list[int] = field(default_factory=list)
    collectives: int = 0
    comm_stream: str = ""
    waits_on_buckets: list[int] = field(default_factory=list)  # node ids made to wait

    def to_json(self) -> dict[str, Any]:
        return {
            "world_size": self.dp, "dp": self.dp, "zero": self.zero,
            "param_bytes": self.param_bytes, "param_source": self.param_source,
            "gradients": self.gradients, "buckets": self.buckets,
            "bucket_bytes": list(self.bucket_bytes), "collectives": self.collectives,
            "comm_stream": self.comm_stream, "waits_on_buckets": list(self.waits_on_buckets),
        }


# -- reading the trace ----------------------------------------------------------------------
def _op_name(n: pb.Node) -> str:
    return n.cpu.op if n.HasField("cpu") and n.cpu.op else n.name


def _host_nodes(graph: Graph) -> list[pb.Node]:
    host = {s.id for s in graph.header.streams if s.kind == pb.STREAM_CPU_THREAD}
    return [n for n in graph.nodes if n.stream in host]


def find_gradients(graph: Graph, param_bytes: int | None) -> tuple[list[Gradient], str]:
    """Gradients in ready order and where their sizes came from."""
    host = sorted(_host_nodes(graph), key=lambda n: (n.start_ns + n.duration_ns, n.id))
    accs = [n for n in host if _op_name(n) == ACCUMULATE_GRAD]
    if not accs:
        accs = [n for n in host if _op_name(n) == EVALUATE_PREFIX + ACCUMULATE_GRAD]
    if accs and param_bytes is None:
        sized = [(grad_bytes(n), n) for n in accs]
        if all(s is not None for s, _ in sized):
            return [Gradient(n, s[0], s[1]) for s, n in sized], "AccumulateGrad input shapes"  # type: ignore[index]
        missing = sum(1 for s, _ in sized if s is None)
        raise OptionError("param_bytes", f"{missing} of {len(accs)} AccumulateGrad ops have no usable "
                                         "shape/dtype (trace recorded without record_shapes?); give the "
                                         "total parameter bytes")
    if param_bytes is None:
        raise OptionError("param_bytes", "the trace has no AccumulateGrad ops to size gradients from; "
                                         "give the total parameter bytes to spread over the backward ops")
    anchors = accs
    source = f"parameter bytes given, spread over {len(accs)} AccumulateGrad ops"
    if not anchors:
        anchors = [n for n in host if _op_name(n).startswith(EVALUATE_PREFIX)]
        if not anchors:
            anchors = sorted((n for n in graph.nodes if n.annotations.phase == "backward"
                              and not any(d.kind == pb.DEP_CONTROL for d in n.deps)),
                             key=lambda n: (n.start_ns + n.duration_ns, n.id))
        if not anchors:
            raise EchoError("the trace has no backward pass (no AccumulateGrad, no "
                            "autograd::engine::evaluate_function ops, no phase=backward nodes); "
                            "cannot place gradient buckets")
        source = f"parameter bytes given, spread over {len(anchors)} backward ops"
    each, rest = divmod(param_bytes, len(anchors))
    grads = [Gradient(n, each + (1 if i < rest else 0), "") for i, n in enumerate(anchors)]
    return [g for g in grads if g.nbytes], source


# -- rewriting ------------------------------------------------------------------------------
class _DeviceTimeline:
    """GPU compute nodes by the time their work was issued (launch start, or kernel start
    when the trace has no launch links), to find "the latest kernel issued before t"."""

    def __init__(self, graph: Graph):
        compute = {s.id for s in graph.header.streams
                   if s.kind in (pb.STREAM_GPU_COMPUTE, pb.STREAM_GPU_COPY)}
        launches = {n.id: n for n in graph.nodes if n.kind == pb.KIND_LAUNCH}
        items = []
        for n in graph.nodes:
            if n.stream not in compute:
                continue
            issued = next((launches[d.id].start_ns for d in n.deps
                           if d.kind == pb.DEP_LAUNCH and d.id in launches), n.start_ns)
            items.append((issued, n.id, n))
        items.sort(key=lambda t: (t[0], t[1]))
        self.times = [t for t, _, _ in items]
        self.nodes = [n for _, _, n in items]

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def last_before(self, t: int) -> pb.Node | None:
        i = bisect.bisect_right(self.times, t)
        return self.nodes[i - 1] if i else None

    def first_after(self, t: int) -> pb.Node | None:
        i = bisect.bisect_right(self.times, t)
        return self.nodes[i] if i < len(self.nodes) else None


def _end(n: pb.Node) -> int:
    return n.start_ns + n.duration_ns


def inject_dp(job: Job, *, dp: int, bucket_mb: float | None = None,
              first_bucket_mb: float | None = None, zero: int = 0, param_bytes: int | None = None,
              gpus_per_node: int | None = None) -> tuple[Job, InjectReport]:
    """A ``dp``-rank data-parallel Job from the single-rank ``job`` (not modified).
    ``bucket_mb=None`` is DDP's default (25 MiB, first bucket 1 MiB)."""
    if first_bucket_mb is None:
        first_bucket_mb = DEFAULT_FIRST_BUCKET_BYTES / (1 << 20) if bucket_mb is None else bucket_mb
    if bucket_mb is None:
        bucket_mb = DEFAULT_BUCKET_MB
    if dp < 1:
        raise OptionError("dp", f"dp must be >= 1, got {dp}")
    if zero not in (0, 1):
        raise OptionError("zero", f"ZeRO stage must be 0 (all-reduce) or 1 (reduce-scatter + all-gather), got {zero}")
    if bucket_mb <= 0 or first_bucket_mb <= 0:
        raise OptionError("bucket_mb", f"bucket caps must be positive, got {bucket_mb} and {first_bucket_mb} MiB")
    check_gpus_per_node(dp, gpus_per_node, job.manifest.hardware.gpus_per_node)
    if job.world_size != 1:
        raise EchoError(f"{job.source or 'job'}: inject needs a single-rank trace, this job has "
                        f"{job.world_size} ranks (use `echo-et scale` for multi-rank jobs)")
    src = job.graph_of(0)
    comm = [n for n in src.nodes if n.kind in COMM_KINDS]
    if comm:
        raise EchoError(f"{job.source or 'job'}: the trace already communicates (node {comm[0].id} "
                        f"{comm[0].name}); inject needs a trace without communication")
    graph = src.copy()
    report = InjectReport(dp=dp, zero=zero)
    grads, report.param_source = find_gradients(graph, param_bytes)
    report.gradients = len(grads)
    report.param_bytes = sum(g.nbytes for g in grads)
    buckets = bucket_gradients(grads, int(first_bucket_mb * (1 << 20)), int(bucket_mb * (1 << 20)))
    report.buckets = len(buckets)
    report.bucket_bytes = [sum(g.nbytes for g in b) for b in buckets]

    device = _DeviceTimeline(graph)
    gpu = next((s for s in graph.header.streams if s.kind == pb.STREAM_GPU_COMPUTE), None)
    b = GraphBuilder.extend(graph)
    if gpu is not None:
        stream = b.stream(pb.STREAM_GPU_COMM, "nccl:dp", device=gpu.device)
        report.comm_stream = "nccl:dp (GPU communication stream)"
    else:
        stream = b.stream(pb.STREAM_CPU_THREAD, "host-comm:dp")
        report.comm_stream = "host-comm:dp (host communication thread, as gloo; no GPU stream)"
    b.declare_group("dp", dp)

    reduce_nodes = []
    for i, bucket in enumerate(buckets):
        last = bucket[-1].node
        size = report.bucket_bytes[i]
        deps: list = [(last.id, pb.DEP_DATA)]
        start = _end(last)
        kern = device.last_before(_end(last)) if device else None
        if kern is not None:
            deps.append((kern.id, pb.DEP_SYNC))
            start = max(start, _end(kern))
        if zero:
            shard = math.ceil(size / dp)
            n = b.collective(f"ddp:reduce_scatter bucket {i}", stream, coll_type=pb.COLL_REDUCE_SCATTER,
                             group="dp", in_bytes=shard * dp, out_bytes=shard,
                             dtype=bucket[-1].dtype, start_ns=start, deps=deps)
        else:
            n = b.collective(f"ddp:all_reduce bucket {i}", stream, coll_type=pb.COLL_ALL_REDUCE,
                             group="dp", in_bytes=size, dtype=bucket[-1].dtype, start_ns=start,
                             deps=deps)
        n.attrs["bucket_gradients"] = str(len(bucket))
        n.annotations.phase = "backward"
        reduce_nodes.append(n)

    # What waits for the buckets: the first kernel (or host op) after the backward.
    backward_end = max(_end(g.node) for g in grads)
    waiter = device.first_after(backward_end) if device else None
    if waiter is None:
        # The outermost host op that starts after the backward (nested ops share its start
        # or start later; an enclosing ProfilerStep started before the backward).
        host = [n for n in _host_nodes(graph) if n.start_ns >= backward_end
                and n.stream != stream and n.kind != pb.KIND_COLLECTIVE]
        opt = [n for n in host if _op_name(n).startswith(OPTIMIZER_PREFIX)]
        waiter = min(opt or host, key=lambda n: (n.start_ns, n.id), default=None)
    if waiter is not None:
        for r in reduce_nodes:
            waiter.deps.add(id=r.id, kind=pb.DEP_SYNC)
        report.waits_on_buckets.append(waiter.id)

    if zero:
        tail = _last_node(graph, {stream})
        for i, bucket in enumerate(buckets):
            size = report.bucket_bytes[i]
            shard = math.ceil(size / dp)
            deps = [(tail.id, pb.DEP_SYNC)] if tail is not None else []
            n = b.collective(f"zero1:all_gather bucket {i}", stream, coll_type=pb.COLL_ALL_GATHER,
                             group="dp", in_bytes=shard, out_bytes=shard * dp,
                             dtype=bucket[-1].dtype, start_ns=_end(tail) if tail else 0, deps=deps)
            n.annotations.phase = "optimizer"
    report.collectives = len(buckets) * (2 if zero else 1)

    jb = derived_job_builder(job, dp, gpus_per_node)
    m = jb.job.manifest
    m.attrs["inject.rule"] = "ddp-buckets-ready-order"
    m.attrs["inject.param_source"] = report.param_source
    gid = jb.group(list(range(dp)), name="dp", desc="data parallel (injected)", role="dp")
    jb.add_graph(graph)
    for r in range(dp):
        jb.bind(r, graph.id, {"dp": gid})
    out = jb.build()
    m.layout.CopyFrom(pb.Layout(dp=dp, tp=1, pp=1, zero_stage=zero, source="injected"))
    return out, report


def _last_node(graph: Graph, exclude_streams: set[int]) -> pb.Node | None:
    """The node that ends last outside ``exclude_streams``: the end of the step."""
    cands = [n for n in graph.nodes if n.stream not in exclude_streams
             and n.kind not in COMM_KINDS]
    return max(cands, key=lambda n: (_end(n), n.id), default=None)
