"""inject: turn a trace of one model copy into a data-parallel Job, as DDP runs it.

Rules (PyTorch DistributedDataParallel, torch/nn/parallel/distributed.py and reducer.cpp):

- **Gradients and their order.** A gradient is ready when autograd's AccumulateGrad for its
  parameter runs (the ``torch::autograd::AccumulateGrad`` host op; the
  ``autograd::engine::evaluate_function: ...AccumulateGrad`` wrapper when only that exists).
  DDP rebuilds its buckets after the first iteration in the order gradients became ready,
  so the buckets follow the order of those ops in the trace (for a sequential model that is
  reverse parameter order, the order DDP starts from). With gradient accumulation only the
  last backward's (DDP's ``no_sync`` until then; :func:`echo_et.passes.gradients.last_backward`);
  on a pipeline stage that receives its input, not the received activation's (a leaf whose
  gradient autograd accumulates too, last in the backward).
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

A multi-rank Job traced with one replica (its ranks split one model copy by TP or PP) gets
the same buckets in each distinct graph, over a one-rank data-parallel group per rank; then
:func:`echo_et.passes.scale.scale_dp` makes the replicas as it does for a traced
data-parallel Job (groups re-derived, ZeRO-1 shards and optimizer time per shard).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Graph, GraphBuilder, Job
from echo_et.ir.schema import COMM_KINDS, ROLE_BY_NAME, pb
from echo_et.passes.derive import check_gpus_per_node, derived_job_builder
from echo_et.passes.gradients import (
    ACCUMULATE_GRAD,
    EVALUATE_PREFIX,
    OPTIMIZER_PREFIX,
    Gradient,
    bucket_gradients,
    grad_bytes,
    last_backward,
    op_name,
    undefined_input,
)
from echo_et.passes.layout import LayoutDecision, infer_layout
from echo_et.passes.scale import scale_dp

DEFAULT_FIRST_BUCKET_BYTES = 1 << 20
DEFAULT_BUCKET_MB = 25.0
INJECT_RULE = "ddp-buckets-ready-order"


@dataclass
class GraphInjection:
    """What was added to one distinct graph."""

    graph: str
    ranks: int = 0               # ranks of the traced Job that run it
    param_bytes: int = 0
    param_source: str = ""
    gradients: int = 0
    bucket_bytes: list[int] = field(default_factory=list)
    comm_stream: str = ""
    waits_on_buckets: list[int] = field(default_factory=list)  # node ids made to wait

    def to_json(self) -> dict[str, Any]:
        return {"graph": self.graph, "ranks": self.ranks, "param_bytes": self.param_bytes,
                "param_source": self.param_source, "gradients": self.gradients,
                "buckets": len(self.bucket_bytes), "bucket_bytes": list(self.bucket_bytes),
                "comm_stream": self.comm_stream, "waits_on_buckets": list(self.waits_on_buckets)}


@dataclass
class InjectReport:
    """What inject did. For a multi-rank Job the totals are over one replica's ranks (the
    model's parameters, however TP and PP shard them); ``per_graph`` has each graph's."""

    dp: int
    zero: int
    world_size: int = 0
    per_graph: list[GraphInjection] = field(default_factory=list)
    collectives: int = 0         # per replica

    @property
    def param_bytes(self) -> int:
        return sum(g.param_bytes * g.ranks for g in self.per_graph)

    @property
    def param_source(self) -> str:
        return "; ".join(sorted({g.param_source for g in self.per_graph}))

    @property
    def buckets(self) -> int:
        return sum(len(g.bucket_bytes) * g.ranks for g in self.per_graph)

    @property
    def gradients(self) -> int:
        return sum(g.gradients * g.ranks for g in self.per_graph)

    @property
    def bucket_bytes(self) -> list[int]:
        """Each distinct graph's buckets, graph after graph."""
        return [x for g in self.per_graph for x in g.bucket_bytes]

    @property
    def comm_stream(self) -> str:
        return "; ".join(sorted({g.comm_stream for g in self.per_graph}))

    @property
    def waits_on_buckets(self) -> list[int]:
        return [x for g in self.per_graph for x in g.waits_on_buckets]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"world_size": self.world_size, "dp": self.dp, "zero": self.zero,
                               "param_bytes": self.param_bytes, "param_source": self.param_source,
                               "gradients": self.gradients,
                               "buckets": self.buckets, "collectives": self.collectives}
        if len(self.per_graph) == 1 and self.per_graph[0].ranks == 1:
            one = self.per_graph[0]
            out.update(bucket_bytes=list(one.bucket_bytes), comm_stream=one.comm_stream,
                       waits_on_buckets=list(one.waits_on_buckets))
        else:
            out["per_graph"] = [g.to_json() for g in self.per_graph]
        return out


# -- reading the trace ----------------------------------------------------------------------
def _host_nodes(graph: Graph) -> list[pb.Node]:
    """Host ops on threads that do not communicate (a comm thread's nodes are not the step's)."""
    host = {s.id for s in graph.header.streams if s.kind == pb.STREAM_CPU_THREAD}
    host -= {n.stream for n in graph.nodes if n.kind in COMM_KINDS}
    return [n for n in graph.nodes if n.stream in host]


def find_gradients(graph: Graph, param_bytes: int | None, *, one_rank: bool = True) -> tuple[list[Gradient], str]:
    """Gradients in ready order and where their sizes came from. Without their shapes a
    one-rank trace may be given its parameter bytes; a rank of a multi-rank Job may not
    (``one_rank`` False: the ranks hold different pieces of the model)."""
    host = _host_nodes(graph)
    ready = sorted(host, key=lambda n: (n.start_ns + n.duration_ns, n.id))
    accs = [n for n in ready if op_name(n) == ACCUMULATE_GRAD]
    if not accs:
        accs = [n for n in ready if op_name(n) == EVALUATE_PREFIX + ACCUMULATE_GRAD]
    accs = last_backward(accs, host)
    if accs and param_bytes is None:
        # an input recorded as no dense tensor (no dims, no dtype: a sparse gradient, as a
        # sparse embedding's) is not a bucket's: DDP reduces sparse gradients apart
        dense = [n for n in accs if not undefined_input(n)]
        sized = [(grad_bytes(n), n) for n in dense]
        if dense and all(s is not None for s, _ in sized):
            grads = [Gradient(n, s[0], s[1]) for s, n in sized]  # type: ignore[index]
            skipped = len(accs) - len(dense)
            source = "AccumulateGrad input shapes" + (f" ({skipped} without a dense gradient left out)"
                                                      if skipped else "")
            return _without_received_inputs(grads, graph), source
        missing = sum(1 for s, _ in sized if s is None) + len(accs) - len(dense)
        what = f"{missing} of {len(accs)} AccumulateGrad ops have no usable shape/dtype"
        if not one_rank:
            raise EchoError(f"graph {graph.id}: {what}; every rank's gradients need their shapes (profile "
                            "with record_shapes=True)")
        raise OptionError("param_bytes", f"{what} (trace recorded without record_shapes?); give the "
                                         "total parameter bytes")
    if not one_rank:
        raise EchoError(f"graph {graph.id}: no AccumulateGrad ops to size gradients from (a rank that "
                        "trains records one per parameter, with record_shapes=True)")
    if param_bytes is None:
        raise OptionError("param_bytes", "the trace has no AccumulateGrad ops to size gradients from; "
                                         "give the total parameter bytes to spread over the backward ops")
    anchors = accs
    source = f"parameter bytes given, spread over {len(accs)} AccumulateGrad ops"
    if not anchors:
        anchors = [n for n in ready if op_name(n).startswith(EVALUATE_PREFIX)]
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


def _without_received_inputs(grads: list[Gradient], graph: Graph) -> list[Gradient]:
    """``grads`` less the gradients of the activations a pipeline stage received. The
    received tensor is a leaf that requires grad, so autograd accumulates its gradient too,
    last in the backward (it is the first layer's input); it is sent back, not reduced.
    Known by its size: a receive's, or what an all-gather of a received piece makes (the TP
    ranks' scatter/gather of pipeline tensors)."""
    received = {n.p2p.bytes for n in graph.nodes if n.kind == pb.KIND_RECV}
    if not received:
        return grads
    received |= {n.collective.out_bytes for n in graph.nodes
                 if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_GATHER
                 and n.collective.in_bytes in received}
    end = len(grads)
    while end > 1 and grads[end - 1].nbytes in received:
        end -= 1
    return grads[:end]


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
              gpus_per_node: int | None = None,
              layout: str | dict[str, Any] | LayoutDecision | None = None) -> tuple[Job, InjectReport]:
    """A ``dp``-replica data-parallel Job from ``job`` (not modified), which was traced with
    one replica: a single rank, or the TP/PP ranks of one model copy (``layout`` as
    :func:`echo_et.passes.layout.infer_layout` takes it, for those).
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
    caps = (int(first_bucket_mb * (1 << 20)), int(bucket_mb * (1 << 20)))
    if job.world_size != 1:
        return _inject_replicas(job, dp=dp, caps=caps, zero=zero, param_bytes=param_bytes,
                                gpus_per_node=gpus_per_node, layout=layout)
    check_gpus_per_node(dp, gpus_per_node, job.manifest.hardware.gpus_per_node)
    src = job.graph_of(0)
    comm = [n for n in src.nodes if n.kind in COMM_KINDS]
    if comm:
        raise EchoError(f"{job.source or 'job'}: the trace already communicates (node {comm[0].id} "
                        f"{comm[0].name}); inject needs a trace without communication")
    report = InjectReport(dp=dp, zero=zero, world_size=dp)
    graph, done = _inject_graph(src, key="dp", size=dp, caps=caps, zero=zero, param_bytes=param_bytes,
                                where=job.source or "job")
    done.ranks = 1
    report.per_graph.append(done)
    report.collectives = len(done.bucket_bytes) * (2 if zero else 1)

    jb = derived_job_builder(job, dp, gpus_per_node)
    m = jb.job.manifest
    m.attrs["inject.rule"] = INJECT_RULE
    m.attrs["inject.param_source"] = done.param_source
    gid = jb.group(list(range(dp)), name="dp", desc="data parallel (injected)", role="dp")
    jb.add_graph(graph)
    for r in range(dp):
        jb.bind(r, graph.id, {"dp": gid})
    out = jb.build()
    m.layout.CopyFrom(pb.Layout(dp=dp, tp=1, pp=1, zero_stage=zero, source="injected"))
    return out, report


def _inject_graph(src: Graph, *, key: str, size: int, caps: tuple[int, int], zero: int,
                  param_bytes: int | None, where: str, one_rank: bool = True) -> tuple[Graph, GraphInjection]:
    """A copy of ``src`` with DDP's gradient buckets reduced over the group bound to ``key``
    (``size`` ranks) on a new communication stream (rules: the module docstring)."""
    if src.header.attrs.get("trace.timing") == "untimed":
        raise EchoError(f"{where}: graph {src.id} was traced on the meta device and has no times to "
                        "place gradient buckets by; trace it at the data-parallel degree wanted "
                        "(`echo-et trace`, which takes as long)")
    graph = src.copy()
    graph.expand()
    done = GraphInjection(graph=graph.id)
    grads, done.param_source = find_gradients(graph, param_bytes, one_rank=one_rank)
    done.gradients = len(grads)
    done.param_bytes = sum(g.nbytes for g in grads)
    buckets = bucket_gradients(grads, *caps)
    done.bucket_bytes = [sum(g.nbytes for g in b) for b in buckets]

    device = _DeviceTimeline(graph)
    gpu = next((s for s in graph.header.streams if s.kind == pb.STREAM_GPU_COMPUTE), None)
    b = GraphBuilder.extend(graph)
    if gpu is not None:
        stream = b.stream(pb.STREAM_GPU_COMM, _new_stream_name(graph, f"nccl:{key}"), device=gpu.device)
        done.comm_stream = f"{graph.header.streams[-1].name} (GPU communication stream)"
    else:
        stream = b.stream(pb.STREAM_CPU_THREAD, _new_stream_name(graph, f"host-comm:{key}"))
        done.comm_stream = f"{graph.header.streams[-1].name} (host communication thread, as gloo; no GPU stream)"
    b.declare_group(key, size)

    reduce_nodes = []
    for i, bucket in enumerate(buckets):
        last = bucket[-1].node
        nbytes = done.bucket_bytes[i]
        deps: list = [(last.id, pb.DEP_DATA)]
        start = _end(last)
        kern = device.last_before(_end(last)) if device else None
        if kern is not None:
            deps.append((kern.id, pb.DEP_SYNC))
            start = max(start, _end(kern))
        if zero:
            shard = math.ceil(nbytes / size)
            n = b.collective(f"ddp:reduce_scatter bucket {i}", stream, coll_type=pb.COLL_REDUCE_SCATTER,
                             group=key, in_bytes=shard * size, out_bytes=shard,
                             dtype=bucket[-1].dtype, start_ns=start, deps=deps)
        else:
            n = b.collective(f"ddp:all_reduce bucket {i}", stream, coll_type=pb.COLL_ALL_REDUCE,
                             group=key, in_bytes=nbytes, dtype=bucket[-1].dtype, start_ns=start,
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
        host = [n for n in _host_nodes(graph) if n.start_ns >= backward_end and n.stream != stream]
        opt = [n for n in host if op_name(n).startswith(OPTIMIZER_PREFIX)]
        waiter = min(opt or host, key=lambda n: (n.start_ns, n.id), default=None)
    if waiter is not None:
        for r in reduce_nodes:
            waiter.deps.add(id=r.id, kind=pb.DEP_SYNC)
        done.waits_on_buckets.append(waiter.id)

    if zero:
        tail = _last_node(graph, {stream})
        for i, bucket in enumerate(buckets):
            shard = math.ceil(done.bucket_bytes[i] / size)
            deps = [(tail.id, pb.DEP_SYNC)] if tail is not None else []
            n = b.collective(f"zero1:all_gather bucket {i}", stream, coll_type=pb.COLL_ALL_GATHER,
                             group=key, in_bytes=shard, out_bytes=shard * size,
                             dtype=bucket[-1].dtype, start_ns=_end(tail) if tail else 0, deps=deps)
            n.annotations.phase = "optimizer"
    return graph, done


def _new_stream_name(graph: Graph, name: str) -> str:
    taken = {s.name for s in graph.header.streams}
    k = 1
    out = name
    while out in taken:
        k += 1
        out = f"{name}#{k}"
    return out


def _inject_replicas(job: Job, *, dp: int, caps: tuple[int, int], zero: int, param_bytes: int | None,
                     gpus_per_node: int | None,
                     layout: str | dict[str, Any] | LayoutDecision | None) -> tuple[Job, InjectReport]:
    """Data parallelism for a Job traced with one replica of several ranks (TP, PP): each
    distinct graph gets its own gradients' buckets on a one-rank data-parallel group, then
    :func:`echo_et.passes.scale.scale_dp` grows those groups to ``dp`` replicas, copying
    every other group into each replica, as it scales a traced data-parallel Job."""
    where = job.source or "job"
    decision = layout if isinstance(layout, LayoutDecision) else infer_layout(job, layout)
    if decision.dp != 1:
        raise EchoError(f"{where}: already data-parallel (layout {decision.mesh.describe()}): grow it "
                        f"with `echo-et scale`; if its {job.world_size} ranks are one model copy split by "
                        f"tensor or pipeline parallelism, declare that layout (e.g. tp={job.world_size})")
    if param_bytes is not None:
        raise OptionError("param_bytes", "a total parameter size is for a single-rank trace; the ranks of "
                                         "a multi-rank Job need their gradients' shapes")
    world = job.world_size * dp
    check_gpus_per_node(world, gpus_per_node, job.manifest.hardware.gpus_per_node)

    manifest = pb.JobManifest()
    manifest.CopyFrom(job.manifest)
    roles = dict(decision.roles)
    key = _dp_key(job, roles)
    next_id = max((g.id for g in manifest.groups), default=0) + 1
    for b in manifest.bindings:
        if key not in b.groups:
            manifest.groups.add(id=next_id, name=f"dp{b.rank}", desc="data parallel (injected)",
                                ranks=[b.rank], role=ROLE_BY_NAME["dp"])
            b.groups[key] = next_id
            roles[next_id] = "dp"
            next_id += 1

    report = InjectReport(dp=dp, zero=zero, world_size=world)
    graphs: dict[str, Graph] = {}
    users: dict[str, int] = {}
    for b in manifest.bindings:
        users[b.graph] = users.get(b.graph, 0) + 1
    for gid in sorted(users):
        src = job.graph(gid)
        used = next((n for n in src.nodes if n.kind in COMM_KINDS and _group_of(n) == key), None)
        if used is not None:
            raise EchoError(f"{where}: graph {gid} already communicates over its data-parallel group "
                            f"{key!r} (node {used.id} {used.name}); grow it with `echo-et scale`")
        graphs[gid], done = _inject_graph(src, key=key, size=1, caps=caps, zero=zero, param_bytes=None,
                                          where=where, one_rank=False)
        done.ranks = users[gid]
        report.per_graph.append(done)
        report.collectives += len(done.bucket_bytes) * (2 if zero else 1) * users[gid]
    manifest.layout.zero_stage = zero
    one = Job(manifest, graphs, source=job.source)
    scaled = dataclasses.replace(decision, roles=roles, zero=zero)
    out = scale_dp(one, scaled, dp, gpus_per_node=gpus_per_node)
    m = out.manifest
    m.attrs["inject.rule"] = INJECT_RULE
    m.attrs["inject.param_source"] = report.param_source
    m.attrs["inject.from"] = m.attrs.pop("scale.from")
    m.attrs["inject.rank_order"] = m.attrs.pop("scale.rank_order")
    m.attrs.pop("scale.a2a", None)
    m.layout.source = f"injected({decision.source})"
    return out, report


def _group_of(n: pb.Node) -> str:
    return n.collective.group if n.kind == pb.KIND_COLLECTIVE else n.p2p.group


def _dp_key(job: Job, roles: dict[int, str]) -> str:
    """The binding key of the new data-parallel group: the one every rank already binds to a
    one-rank data-parallel group (the tracer declares them at dp = 1), else a new one."""
    common = None
    for b in job.manifest.bindings:
        keys = {k for k, gid in b.groups.items() if roles.get(gid) == "dp" and len(job.group(gid).ranks) == 1}
        common = keys if common is None else common & keys
    if common:
        return sorted(common)[0]
    taken = {k for b in job.manifest.bindings for k in b.groups}
    key = "dp"
    while key in taken:
        key = f"_{key}"
    return key


def _last_node(graph: Graph, exclude_streams: set[int]) -> pb.Node | None:
    """The node that ends last outside ``exclude_streams``: the end of the step."""
    cands = [n for n in graph.nodes if n.stream not in exclude_streams
             and n.kind not in COMM_KINDS]
    return max(cands, key=lambda n: (_end(n), n.id), default=None)
