"""Re-stage a pipeline: new stage count and/or micro-batch count, from a traced Job's
per-layer measurements, with a regenerated 1F1B schedule.

Needs nodes annotated with ``phase`` (forward / backward / optimizer), ``microbatch`` and,
for transformer blocks, ``layer`` (the ex-situ tracer's workloads emit them; a launch the
meta-device tracer leaves unannotated goes with the kernel it launches). What is taken
from the trace, per tensor-parallel rank:

- per layer, the nodes of its forward and of its backward for one micro-batch: the one whose
  span is the median over the micro-batches (so one disturbed measurement does not become
  the model; the last micro-batch's backward, which carries the gradient-synchronisation
  hooks, is left out unless it is the only one), with measured durations and internal
  dependencies;
- the stage prologue of the first stage (embedding: the forward nodes before the first
  layer, the backward nodes after the last) and the epilogue of the last stage (final norm,
  head, loss);
- the optimizer phase of the old stage of the same kind (first / middle / last), carried to
  the new stage's parameters (measured: stretched by their bytes; untimed: marked with
  ``work_scale``, kernels by bytes and launches by count, for pricing to apply);
- activation bytes, the stream and duration of the traced send/recv, and whether a device
  sync followed each (Megatron's p2p calls);
- gradient sizes from the AccumulateGrad ops of each layer's backward (``cpu.shapes``), else
  per parameter from its in-place accumulations (``aten::add_``) in the units of the old
  stage's data-parallel bytes, else those bytes spread evenly over its layers and extras;
- whether the data-parallel reduction ran in the backward's hooks or after the schedule
  (Megatron's local DDP: one buffer, after whatever the step did first).

What is generated: layers split evenly over the new stages (contiguous, like Megatron-LM),
the non-interleaved 1F1B order (warm-up ``min(P - s - 1, M)`` forwards, steady 1F1B,
cool-down backwards) with send/recv on the pipeline group between neighbouring stages, each
after the kernels making what it sends; the data-parallel gradient buckets (reverse-ready
order, cap from the traced workload or the old buckets) issued on the old data-parallel
stream when their last gradient is ready in the last micro-batch's backward, or one buffer
after the schedule; and for ZeRO-1 the all-gathers after the optimizer. Groups are
re-derived at the new depth: tp, dp, pp, the world, and the groups the tracer derives
(Megatron's embedding group between the two ends, its model-parallel group); a stage that
has no part in one (a middle stage's embedding group; one stage) loses its collectives on
it with the host time spent on them. Nodes of the traced step that belong to the
schedule's machinery (unannotated host ops between micro-batches) are not copied; their
count is reported. Units are laid out back to back on a fresh clock (an untimed graph stays
untimed, and there only the device streams wait for a transfer); the simulator recomposes
the real timing.

Reading a traced stage is :mod:`echo_et.passes.stage_read`, writing a new stage's nodes
:mod:`echo_et.passes.stage_write`; this module is the pass (the schedule, groups, buckets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Graph, Job
from echo_et.ir.conventions import (
    EMBEDDING_GROUP,
    MODEL_PARALLEL_GROUP,
    derived_group_coords,
    traced_workload,
)
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.limits import MAX_GRAPH_NODES
from echo_et.ir.schema import pb
from echo_et.passes.derive import derived_job_builder
from echo_et.passes.gradients import (
    ACCUMULATE_GRAD,
    Gradient,
    accumulated_bytes,
    bucket_gradients,
    grad_bytes,
    op_name,
)
from echo_et.passes.layout import LayoutDecision
from echo_et.passes.mesh import Mesh
from echo_et.passes.stage_read import StagePieces, Unit, read_stage, split_at_issue
from echo_et.passes.stage_write import Emitter


def _split(layers: list[int], stages: int) -> list[list[int]]:
    if len(layers) % stages:
        raise OptionError("pp", f"the job has {len(layers)} annotated layers, which {stages} stages "
                                "do not divide evenly")
    k = len(layers) // stages
    return [layers[i * k:(i + 1) * k] for i in range(stages)]


def schedule(stage: int, stages: int, microbatches: int) -> list[tuple]:
    """The 1F1B order of ``stage`` with its transfers, as Megatron-LM's (and the workload's)
    ``forward_backward_pipelining_without_interleaving`` posts them: ("F", mb), ("B", mb), and
    ("P2P", ((is_send, peer_offset), ...)) for transfers posted together."""
    first, last = stage == 0, stage == stages - 1
    warmup = min(stages - stage - 1, microbatches)
    remaining = microbatches - warmup
    out: list[tuple] = []

    def p2p(*ops: tuple[bool, int]) -> None:
        out.append(("P2P", ops))

    f = b = 0
    for _ in range(warmup):
        if not first:
            p2p((False, -1))                       # recv_forward
        out.append(("F", f))
        f += 1
        if not last:
            p2p((True, 1))                         # send_forward
    if remaining and not first:
        p2p((False, -1))                           # recv_forward
    for i in range(remaining):
        out.append(("F", f))
        f += 1
        if not last:
            p2p((True, 1), (False, 1))             # send_forward_recv_backward
        out.append(("B", b))
        b += 1
        if not first:
            if i == remaining - 1:
                p2p((True, -1))                    # send_backward
            else:
                p2p((True, -1), (False, -1))       # send_backward_recv_forward
    for _ in range(warmup):
        if not last:
            p2p((False, 1))                        # recv_backward
        out.append(("B", b))
        b += 1
        if not first:
            p2p((True, -1))                        # send_backward
    return out


_AXIS_ROLES = ("tp", "dp", "pp")
_DERIVED_ROLES = (EMBEDDING_GROUP, MODEL_PARALLEL_GROUP)


def _role_keys(job: Job, decision: LayoutDecision, rank: int) -> dict[str, str]:
    """role -> graph-local key on ``rank``: the layout's axes (as the layout decision reads
    the groups), the world, and the groups the tracer derives from the layout (by the
    description it gives them: at pp 2 an embedding group has a pipeline group's ranks);
    groups of other roles cannot be re-derived."""
    out = {}
    for key, gid in sorted(job.binding(rank).groups.items()):
        group = job.group(gid)
        if group.desc in _DERIVED_ROLES:
            role = group.desc
        elif group.role == pb.ROLE_WORLD:
            role = "world"
        else:
            role = decision.roles.get(gid, "")
        if role in (*_AXIS_ROLES, "world", *_DERIVED_ROLES) and role not in out:
            out[role] = key
        else:
            raise EchoError(f"rank {rank} uses group key {key!r} (group {gid}, role {role or 'unknown'}), "
                            "which re-staging cannot re-derive (only tp, dp, pp, world, and the "
                            "embedding and model-parallel groups the tracer derives)")
    return out


def restaged_group(mesh: Mesh, role: str, rank: int) -> list[int] | None:
    """Members of ``rank``'s group of ``role`` in ``mesh``, as the tracer derives them; None
    where the workload would not use one: an embedding group at one stage or on a middle
    stage, a model-parallel group of one rank."""
    if role in _AXIS_ROLES:
        return mesh.group_ranks(rank, [role])
    if role == "world":
        return list(range(mesh.world))
    c = mesh.coords(rank)
    if role == MODEL_PARALLEL_GROUP and mesh.tp * mesh.pp == 1:
        return None
    if role == EMBEDDING_GROUP and (mesh.pp == 1 or c["pp"] not in (0, mesh.pp - 1)):
        return None
    return [mesh.rank(m) for m in derived_group_coords(role, c, mesh.tp, mesh.pp)]


def _traced_bucket_bytes(job: Job) -> int | None:
    """The gradient bucket cap the traced workload ran with (its ``bucket_mb``), if it says."""
    mb = traced_workload(job.manifest).get("bucket_mb")
    return int(mb * 1024 * 1024) if isinstance(mb, int | float) and mb > 0 else None


def _refuse_other_schedules(job: Job) -> None:
    """A Job traced with the interleaved schedule has each stage's layers in several chunks,
    not the contiguous stage this pass reads; one traced with uneven stages would come out
    even; one traced under DeepSpeed's pipeline engine
    moves its tensors in calls this pass does not regenerate (its 1F1B is Megatron-LM's); one
    traced with the weights' all-gathers in the forward (Megatron-Core's overlapped param
    gather) waits for them inside its first micro-batch's layers, which this pass does not
    regenerate either."""
    workload = traced_workload(job.manifest)
    if workload.get("overlap_param_gather"):
        raise EchoError(f"{job.source or 'job'}: traced with the weights' all-gathers overlapped with the "
                        "forward, which re-staging does not regenerate; re-trace it at the new pipeline "
                        "depth instead")
    virtual = [f"{n} {what}" for key, what in (("layers_per_virtual_stage", "layers per virtual stage"),
                                               ("virtual_stages_per_rank", "virtual stages per pipeline rank"))
               if (n := workload.get(key))]
    engine = workload.get("pipeline_engine")
    if virtual:
        raise EchoError(f"{job.source or 'job'}: traced with the interleaved pipeline schedule "
                        f"({virtual[0]}), whose stages are not contiguous "
                        "layers; re-trace it at the new pipeline depth instead of re-staging it")
    uneven = {k: workload.get(f"{k}_stage_layers") for k in ("first", "last")}
    if any(uneven.values()):
        given = " and ".join(f"{n} layers on the {k} stage" for k, n in uneven.items() if n)
        raise EchoError(f"{job.source or 'job'}: traced with uneven pipeline stages ({given}), which "
                        "re-staging (it splits the layers evenly) would not keep; re-trace it at the new "
                        "pipeline depth or micro-batch count instead")
    if engine and engine != "megatron":
        raise EchoError(f"{job.source or 'job'}: traced under {engine}'s pipeline engine, whose schedule "
                        "re-staging does not regenerate; re-trace it at the new pipeline depth instead")


def restage(job: Job, decision: LayoutDecision, *, pp: int, microbatches: int | None,
            bucket_bytes: int | None = None) -> tuple[Job, LayoutDecision, dict[str, Any]]:
    """A Job at pipeline depth ``pp`` and ``microbatches`` micro-batches (dp, tp unchanged)."""
    old: Mesh = decision.mesh
    if pp < 1:
        raise OptionError("pp", f"pp must be >= 1, got {pp}")
    if job.world_size != old.world:
        raise EchoError(f"{job.source or 'job'}: {job.world_size} ranks, but layout {old.describe()} "
                        f"has {old.world}")
    _refuse_other_schedules(job)
    # Read every old stage of replica 0 (the template, as for dp scaling), per tp rank;
    # each distinct graph once.
    pieces: dict[tuple[int, int], StagePieces] = {}
    keys0: dict[str, str] = {}
    streams: dict[str, dict[int, pb.Stream]] = {}
    read: dict[tuple[str, tuple], StagePieces] = {}
    for t in range(old.tp):
        for s in range(old.pp):
            r = old.rank({"tp": t, "dp": 0, "pp": s})
            keys = _role_keys(job, decision, r)
            for role, key in keys.items():
                keys0.setdefault(role, key)
            gid_ = job.binding(r).graph
            ck = (gid_, tuple(sorted(keys.items())))
            if ck not in read:
                g = job.graph(gid_)
                streams[g.id] = {st.id: st for st in g.header.streams}
                read[ck] = read_stage(g, keys)
            pieces[(t, s)] = read[ck]
    layers = sorted({layer for p in pieces.values() for layer in p.layers})
    if not layers:
        raise EchoError("no node carries a layer annotation; re-staging a pipeline needs a Job "
                        "from `echo-et trace` (annotated layers)")
    old_m = max(p.microbatches for p in pieces.values())
    new_m = microbatches or decision.microbatches or old_m
    if new_m < 1:
        raise OptionError("microbatches", f"micro-batches must be >= 1, got {new_m}")
    _refuse_unbounded(job, old_m, new_m, decision.mesh.pp, pp)
    if pp > 1 and not any(p.p2p_bytes for p in pieces.values()):
        raise OptionError("pp", "the job has no pipeline send/recv to size activations from (traced at "
                                "pp=1); re-trace it with pp >= 2 to re-stage it")
    split = _split(layers, pp)
    where_layer = {layer: s for (t, s), p in pieces.items() if t == 0 for layer in p.layers}
    ref = pieces[(0, 0)]
    p2p_bytes = max(p.p2p_bytes for p in pieces.values())
    p2p_src = next((p for p in pieces.values() if p.p2p_stream), ref)
    dp_src = next((p for p in pieces.values() if p.dp_stream), None)
    after_backward = dp_src is not None and dp_src.dp_after_backward
    if bucket_bytes is None:
        olds = [b for p in pieces.values() for b in p.dp_buckets]
        # reduced after the backward: one buffer per stage, whatever its size; else the
        # traced workload's cap, or the largest bucket seen
        bucket_bytes = ((1 << 62) if after_backward else _traced_bucket_bytes(job)
                        or (max(olds) if olds else 25 << 20))
    shared_bytes = max((p.shared_bytes for p in pieces.values()), default=0)
    dropped = sum(p.dropped for p in read.values())
    # Megatron-Core's overlapped sync buckets the first stage only: one buffer elsewhere
    core = bool(traced_workload(job.manifest).get("overlap_grad_reduce"))

    new_mesh = old.with_sizes(pp=pp)
    jb = derived_job_builder(job, new_mesh.world, None)
    group_ids: dict[tuple[str, tuple[int, ...]], int] = {}

    def gid(role: str, ranks: list[int]) -> int:
        k = (role, tuple(ranks))
        if k not in group_ids:
            group_ids[k] = jb.group(ranks, name=f"{role}{ranks[0]}", desc=role,
                                    role="custom" if role in _DERIVED_ROLES else role)
        return group_ids[k]

    graphs: dict[tuple[int, int], Graph] = {}
    grad_source = ""
    built: dict[tuple[str, ...], int] = {}   # tp ranks whose old stages are the same graphs
    for t in range(old.tp):
        sig = tuple(pieces[(t, s)].graph_id for s in range(old.pp))
        if sig in built:
            for s in range(pp):
                graphs[(t, s)] = graphs[(built[sig], s)]
            continue
        built[sig] = t
        for s in range(pp):
            g, grad_source = _StageBuilder(StageInputs(
                graph_id=f"t{t}s{s}", tp_rank=t, stage=s, stages=pp, microbatches=new_m, layers=split[s],
                pieces=pieces, stage_of_layer=where_layer, old_mesh=old, streams=streams, keys=keys0,
                p2p_bytes=p2p_bytes, p2p_source=p2p_src, dp_source=dp_src, zero=decision.zero,
                bucket_bytes=(1 << 62) if core and s > 0 else bucket_bytes, dp=new_mesh.dp,
                dp_after_backward=after_backward,
                shared_bytes=shared_bytes)).build()
            graphs[(t, s)] = g
    # Graphs identical across tp ranks are shared (proved by content hash; a graph built
    # once for several tp ranks is hashed once).
    by_hash: dict[str, str] = {}
    hashed: dict[int, str] = {}
    graph_of: dict[tuple[int, int], str] = {}
    for (t, s), g in sorted(graphs.items()):
        h = hashed.get(id(g)) or hashed.setdefault(id(g), g.content_hash())
        if h not in by_hash:
            by_hash[h] = g.id
            jb.add_graph(g)
        graph_of[(t, s)] = by_hash[h]
    roles: dict[int, str] = {}
    for r in range(new_mesh.world):
        c = new_mesh.coords(r)
        groups = {}
        for role, key in sorted(keys0.items()):
            ranks = restaged_group(new_mesh, role, r)
            if ranks is not None:
                groups[key] = gid(role, ranks)
                roles[groups[key]] = role
        jb.bind(r, graph_of[(c["tp"], c["pp"])], groups)
    out = jb.build()
    m = out.manifest
    source = f"restaged({decision.source})"
    m.layout.CopyFrom(pb.Layout(dp=new_mesh.dp, tp=new_mesh.tp, pp=pp, microbatches=new_m,
                                zero_stage=decision.zero, ep=decision.ep, source=source))
    new_decision = LayoutDecision(mesh=new_mesh, ep=decision.ep, microbatches=new_m,
                                  zero=decision.zero, source=source, roles=roles,
                                  reasons=[*decision.reasons, f"re-staged to pp={pp}, {new_m} micro-batches"])
    info = {
        "pp": {"from": old.pp, "to": pp}, "microbatches": {"from": old_m, "to": new_m},
        "layers": len(layers), "layers_per_stage": [len(x) for x in split],
        "activation_bytes": p2p_bytes, "bucket_cap_bytes": None if after_backward else bucket_bytes,
        "gradient_sizes": grad_source, "dropped_schedule_nodes": dropped,
        "graphs": len(by_hash),
    }
    return out, new_decision, info


def _refuse_unbounded(job: Job, old_m: int, new_m: int, old_pp: int, pp: int) -> None:
    """The work a re-staging costs grows with the graphs it makes: refuse, before building
    them, graphs larger than any one rank's program plausibly is (limits.MAX_GRAPH_NODES)."""
    biggest = max((len(job.graph(gid).nodes) for gid in job.graph_ids()), default=0)
    estimate = biggest * new_m / max(old_m, 1) * max(1.0, old_pp / max(pp, 1))
    if estimate > MAX_GRAPH_NODES:
        raise EchoError(f"{new_m} micro-batches at pipeline depth {pp} would make graphs of about "
                        f"{int(estimate):,} nodes (from {biggest:,} at {old_m} micro-batches); the limit is "
                        f"{MAX_GRAPH_NODES:,}")


def _stage_kind(s: int, n: int) -> str:
    return "first" if s == 0 else ("last" if s == n - 1 else "middle")


def _template_stage(kind: str, old_pp: int) -> int:
    if kind == "first":
        return 0
    if kind == "last":
        return old_pp - 1
    return 1 if old_pp > 2 else 0


@dataclass(frozen=True)
class StageInputs:
    """What building one stage of the re-staged pipeline reads."""

    graph_id: str
    tp_rank: int                                   # the tensor-parallel rank whose graphs these are
    stage: int                                     # the new stage, 0 .. stages - 1
    stages: int                                    # new pipeline depth
    microbatches: int                              # new micro-batch count
    layers: list[int]                              # the layers this stage runs, in order
    pieces: dict[tuple[int, int], StagePieces]     # (tp rank, old stage) -> what was read from it
    stage_of_layer: dict[int, int]                 # layer -> old stage that ran it
    old_mesh: Mesh
    streams: dict[str, dict[int, pb.Stream]]       # old graph id -> stream id -> Stream
    keys: dict[str, str]                           # role (tp, dp, pp) -> graph-local group key
    p2p_bytes: int                                 # activation bytes of a pipeline send/recv
    p2p_source: StagePieces                        # the old stage whose send/recv stream and time are copied
    dp_source: StagePieces | None                  # the old stage whose data-parallel stream and dtype are used
    zero: int                                      # ZeRO stage (0 or 1)
    bucket_bytes: int                              # gradient bucket cap
    dp: int                                        # data-parallel degree
    dp_after_backward: bool = False                # gradients reduced after the whole schedule
    shared_bytes: int = 0                          # gradient bytes the two ends share (tied embedding)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def old_piece(self, old_stage: int) -> StagePieces:
        return self.pieces[(self.tp_rank, old_stage)]

    def piece_of_layer(self, layer: int) -> StagePieces:
        return self.old_piece(self.stage_of_layer[layer])


class _StageBuilder:
    """One new stage's graph, in schedule order: prologue, the 1F1B items (forwards,
    backwards, pipeline send/recv; the data-parallel gradient buckets after the last
    micro-batch's backward), the optimizer (scaled by parameter bytes; ZeRO-1 all-gathers
    after it) and the epilogue."""

    def __init__(self, inputs: StageInputs):
        self.inp = x = inputs
        self.e = Emitter(x.graph_id, x.streams)
        old = x.old_mesh
        self.p0, self.plast = x.old_piece(0), x.old_piece(old.pp - 1)
        self.template = x.old_piece(_template_stage(_stage_kind(x.stage, x.stages), old.pp))
        self.pp_key = x.keys.get("pp", "pp")
        self.dp_key = x.keys.get("dp", "")
        self.device = next((st.device for st in x.streams[self.template.graph_id].values()
                            if st.kind == pb.STREAM_GPU_COMPUTE), -1)
        # Host work at a stage's edges that no layer owns: receiving activations (a stage
        # that is not first), sending them (not last), and the same for gradients; taken
        # from the traced stages that had that edge, with the gap the first layer after a
        # receive had there.
        self.edges = old.pp > 1
        self.p1 = x.old_piece(1) if self.edges else self.p0
        self.recv_bwd = self.p0.bwd_pre
        # After a non-first stage's backward: the first layer's own tail (its boundary's
        # backward, which the trace does not attribute to the layer), then the send.
        _, self.send_bwd = split_at_issue(self.plast.bwd_post)
        head = x.layers[0] if x.layers else None
        self.head_src = x.piece_of_layer(head) if head is not None else None
        hs = self.head_src
        self.head_tail = (split_at_issue(hs.bwd_post)[0]
                          if hs is not None and hs is not self.p0 and hs.layers and hs.layers[0] == head
                          else Unit())
        self.lead_after_recv_bwd = self.p0.bwd[max(self.p0.bwd)].lead_ns if self.edges and self.p0.bwd else None
        # What the last micro-batch's backward leaves for the gradient buckets.
        self.last_bwd_nodes: list[pb.Node] = []
        # The last micro-batch's backward units that may hold parameters: (which: a layer, -1
        # the embedding, -2 the head; the unit's nodes; the node that ends it)
        self.final_units: list[tuple[int, list[pb.Node], pb.Node]] = []
        self.grad_source = ""
        self.reduce_ids: list[int] = []
        self.buckets: list[list[Gradient]] = []
        self.bucket_sizes: list[int] = []
        self.dtype = x.dp_source.dp_dtype if x.dp_source else ""
        self.elem = dtype_size(self.dtype) or 1

    def build(self) -> tuple[Graph, str]:
        x, e = self.inp, self.e
        new_mesh = x.old_mesh.with_sizes(pp=x.stages)
        rank = new_mesh.rank({"tp": x.tp_rank, "dp": 0, "pp": x.stage})
        drop = []
        for role, key in sorted(x.keys.items()):
            ranks = restaged_group(new_mesh, role, rank)
            if ranks is None:
                drop.append(key)
            else:
                e.b.declare_group(key, len(ranks))
        e.drop_groups = frozenset(drop)
        e.b.graph.header.attrs.update(self.template.header_attrs)
        e.host_waits = self.template.header_attrs.get("trace.timing") != "untimed"
        e.unit(self.template.graph_id, self.template.prologue, mb=None, stage=x.stage)
        p2p_src = x.p2p_source
        p2p = dict(key=self.pp_key, nbytes=x.p2p_bytes,
                   stream=p2p_src.p2p_stream or (pb.STREAM_CPU_THREAD, "p2p"),
                   duration=p2p_src.p2p_duration, device=self.device, sync=p2p_src.p2p_sync)
        for item in schedule(x.stage, x.stages, x.microbatches):
            if item[0] == "F":
                self.forward(item[1])
            elif item[0] == "B":
                self.backward(item[1])
                if item[1] == x.microbatches - 1 and not x.dp_after_backward:
                    self.plan_buckets()
                    self.issue_buckets()
            else:
                e.p2p([(is_send, x.stage + off) for is_send, off in item[1]], **p2p)
        if x.dp_after_backward:
            self.plan_buckets()
            waits = list(e.waits)
            e.waits = []
            made = e.unit(self.template.graph_id, self.template.optimizer_pre, mb=None, stage=x.stage,
                          **self.optimizer_scales())
            self.resize_layer_sync(made)
            self.issue_buckets(after=waits + [n.id for n in made[-1:]])
        self.optimizer()
        e.unit(self.template.graph_id, self.template.epilogue, mb=None, stage=x.stage)
        return e.b.build(), self.grad_source

    def forward(self, mb: int) -> None:
        x, e, p0, p1, plast = self.inp, self.e, self.p0, self.p1, self.plast
        s = x.stage
        e.clock += self.template.glue_ns
        if x.first:
            e.unit(p0.graph_id, p0.forward_units(mb)[1], mb=mb, stage=s)
        elif self.edges:
            e.unit(p1.graph_id, p1.forward_units(mb)[1], mb=mb, stage=s)
        for i, layer in enumerate(x.layers):
            src = x.piece_of_layer(layer)
            lead = None
            if i == 0 and not x.first and self.edges:
                after_recv = p1.forward_units(mb)[0]
                lead = after_recv[min(after_recv)].lead_ns
            e.unit(src.graph_id, src.forward_units(mb)[0][layer], mb=mb, stage=s, lead=lead)
        if x.last:
            e.unit(plast.graph_id, plast.forward_units(mb)[2], mb=mb, stage=s)
        elif self.edges:
            e.unit(p0.graph_id, p0.forward_units(mb)[2], mb=mb, stage=s)

    def backward(self, mb: int) -> None:
        x, e, p0, plast = self.inp, self.e, self.p0, self.plast
        s, final = x.stage, mb == x.microbatches - 1
        e.clock += self.template.glue_ns
        made: list[pb.Node] = []
        if x.last:
            made += e.unit(plast.graph_id, plast.bwd_pre, mb=mb, stage=s)
            if final and made:
                self.final_units.append((-2, list(made), made[-1]))
        elif self.edges:
            e.unit(p0.graph_id, self.recv_bwd, mb=mb, stage=s)
        for i, layer in enumerate(reversed(x.layers)):
            src = x.piece_of_layer(layer)
            lead = self.lead_after_recv_bwd if i == 0 and not x.last else None
            got = e.unit(src.graph_id, src.bwd[layer], mb=mb, stage=s, lead=lead)
            made += got
            if final and got:
                self.final_units.append((layer, got, max(got, key=lambda n: (n.start_ns + n.duration_ns, n.id))))
        if x.first:
            got = e.unit(p0.graph_id, p0.bwd_post, mb=mb, stage=s)
            made += got
            if final and got:
                self.final_units.append((-1, got, got[-1]))
        elif self.edges:
            if self.head_src is not None and self.head_tail.nodes:
                e.unit(self.head_src.graph_id, self.head_tail, mb=mb, stage=s)
            e.unit(plast.graph_id, self.send_bwd, mb=mb, stage=s)
        if final:
            self.last_bwd_nodes.extend(made)

    def _dp_stream(self) -> int:
        dp_src = self.inp.dp_source
        assert dp_src is not None and dp_src.dp_stream is not None
        return self.e.b.stream(dp_src.dp_stream[0], dp_src.dp_stream[1], device=self.device)

    def _shard_bytes(self, size: int) -> int:
        """A ZeRO shard of ``size`` bytes: whole elements, padded to dp shards."""
        return math.ceil(size / self.elem / self.inp.dp) * self.elem

    def plan_buckets(self) -> None:
        """The data-parallel gradient buckets of the last micro-batch's backward."""
        x = self.inp
        dp_src = x.dp_source
        if not (self.dp_key and dp_src is not None and dp_src.dp_stream is not None and x.dp > 1):
            return
        grads, self.grad_source = _gradients(self.last_bwd_nodes, self.final_units, x)
        self.buckets = bucket_gradients(grads, x.bucket_bytes, x.bucket_bytes)
        self.bucket_sizes = [sum(g.nbytes for g in b) for b in self.buckets]

    def issue_buckets(self, after: list[int] | None = None) -> None:
        """Reduce each bucket once its last gradient is ready: right after the last
        backward, before the send of its input gradient, as DDP's hooks do; or, when
        ``after`` names the end of the schedule, once it is done, as Megatron's local DDP
        does."""
        x, e = self.inp, self.e
        if not self.buckets:
            return
        sid = self._dp_stream()
        for k, (bucket, size) in enumerate(zip(self.buckets, self.bucket_sizes, strict=True)):
            hook = bucket[-1].node
            deps = [(hook.id, pb.DEP_SYNC), *((i, pb.DEP_SYNC) for i in after or ())]
            at = max(hook.start_ns + hook.duration_ns, e.clock if after else 0)
            if x.zero:
                shard = self._shard_bytes(size)
                n = e.b.collective(f"dp:reduce_scatter bucket {k}", sid, coll_type=pb.COLL_REDUCE_SCATTER,
                                   group=self.dp_key, in_bytes=shard * x.dp, out_bytes=shard, dtype=self.dtype,
                                   start_ns=at, deps=deps)
            else:
                n = e.b.collective(f"dp:all_reduce bucket {k}", sid, coll_type=pb.COLL_ALL_REDUCE,
                                   group=self.dp_key, in_bytes=size, dtype=self.dtype, start_ns=at, deps=deps)
            n.annotations.phase = "optimizer" if after else "backward"
            n.annotations.stage = x.stage
            self.reduce_ids.append(n.id)

    def optimizer_scales(self) -> dict[str, float]:
        """The template's optimizer carried to this stage's parameters: its work by their
        bytes, its calls by their number (a loop over parameters issues one call or more
        per parameter). Both from the gradients one micro-batch's backward accumulates in
        each stage, else the bytes from the data-parallel buckets."""
        x, tmpl = self.inp, self.template
        mine = [x.piece_of_layer(layer).bwd.get(layer, Unit()) for layer in x.layers]
        mine += [self.p0.bwd_post] if x.first else []
        mine += [self.plast.bwd_pre] if x.last else []
        new, old = _parameters(mine), _parameters([*tmpl.bwd.values(), tmpl.bwd_pre, tmpl.bwd_post])
        if x.first and x.last and x.old_mesh.pp > 1 and x.shared_bytes and new[1] > 1:
            new = (max(0, new[0] - x.shared_bytes), new[1] - 1)   # the tied embedding, once
        if old[0] and old[1]:
            return {"scale": new[0] / old[0], "launch_scale": new[1] / old[1]}
        new_bytes, old_bytes = sum(self.bucket_sizes), tmpl.dp_bytes
        return {"scale": new_bytes / old_bytes if new_bytes and old_bytes else 1.0}

    def resize_layer_sync(self, made: list[pb.Node]) -> None:
        """An all-reduce over tp after the backward (Megatron's sequence parallelism reduces
        its layers' norm and bias gradients in one flattened call) sized for this stage's
        layers: so much per layer as the old first stage reduced per layer, plus, on the
        last stage, what the old last stage reduced beyond its layers (the final norm)."""
        x = self.inp
        tp_key = x.keys.get("tp")
        syncs = [n for n in made if n.kind == pb.KIND_COLLECTIVE and tp_key and n.collective.group == tp_key]
        first, last = x.old_piece(0), x.old_piece(x.old_mesh.pp - 1)
        if len(syncs) != 1 or not first.tp_after_bytes or not first.layers:
            return
        per_layer = first.tp_after_bytes / len(first.layers)
        extra = max(0.0, last.tp_after_bytes - per_layer * len(last.layers)) if x.last else 0.0
        elem = dtype_size(syncs[0].collective.dtype) or 1
        nbytes = round((per_layer * len(x.layers) + extra) / elem) * elem
        syncs[0].collective.in_bytes = syncs[0].collective.out_bytes = nbytes

    def optimizer(self) -> None:
        """The template stage's optimizer, scaled by parameter bytes, after the gradient
        buckets; for ZeRO-1, the all-gathers of the updated shards after it."""
        x, e, tmpl = self.inp, self.e, self.template
        e.waits = list(self.reduce_ids)
        made = e.unit(tmpl.graph_id, tmpl.optimizer, mb=None, stage=x.stage, **self.optimizer_scales())
        self.resize_layer_sync(made)
        if not (x.zero and self.reduce_ids):
            return
        tail = max(made, key=lambda n: (n.start_ns + n.duration_ns, n.id)) if made else None
        sid = self._dp_stream()
        for k, size in enumerate(self.bucket_sizes):
            shard = self._shard_bytes(size)
            n = e.b.collective(f"dp:all_gather bucket {k}", sid, coll_type=pb.COLL_ALL_GATHER,
                               group=self.dp_key, in_bytes=shard, out_bytes=shard * x.dp, dtype=self.dtype,
                               start_ns=e.clock, deps=[(tail.id, pb.DEP_SYNC)] if tail else [])
            n.annotations.phase = "optimizer"
            n.annotations.stage = x.stage


def _gradients(nodes: list[pb.Node], units: list[tuple[int, list[pb.Node], pb.Node]],
               inputs: StageInputs) -> tuple[list[Gradient], str]:
    """Gradients of the new stage in ready order: AccumulateGrad shapes when every one has
    them; else, per parameter, the bytes each in-place accumulation of the backward adds (a
    meta-device trace records no AccumulateGrad: autograd's accumulation into a preset
    gradient, or Megatron's into ``main_grad``, shows as ``aten::add_``), in the units of
    the old stage's data-parallel bytes; else those bytes spread evenly over the old stage's
    layers and extras, one gradient at the end of each."""
    # Both ends in one stage: the parameter they shared (the tied word embedding) is one
    # gradient; the old last stage's copy of it is not reduced again.
    shared = inputs.shared_bytes if inputs.first and inputs.last and inputs.old_mesh.pp > 1 else 0
    accs = [n for n in nodes if op_name(n) == ACCUMULATE_GRAD]
    sized = [(grad_bytes(n), n) for n in accs]
    if accs and all(sz is not None for sz, _ in sized):
        grads = [Gradient(n, sz[0], "") for sz, n in sized]  # type: ignore[index]
        copy = next((i for i, g in enumerate(grads) if shared and g.nbytes == shared), None)
        return [g for i, g in enumerate(grads) if i != copy], "AccumulateGrad input shapes"
    out: list[Gradient] = []
    how = set()
    for what, made, end in units:
        src = _piece_of(inputs, what)
        total = sum(_accumulation_weights(src).values())
        if total:
            mine = [Gradient(n, src.dp_bytes * b // total, "") for n in made if (b := accumulated_bytes(n))]
            how.add("split over the parameters by the bytes each accumulates")
        else:
            mine = [Gradient(end, src.dp_bytes // max(1, _even_shares(src)), "")]
            how.add("spread evenly over their layers")
        if what == -2 and shared and mine:
            big = max(range(len(mine)), key=lambda i: mine[i].nbytes)   # the tied copy
            mine[big] = Gradient(mine[big].node, max(0, mine[big].nbytes - shared), "")
        out += mine
    out.sort(key=lambda g: (g.node.start_ns + g.node.duration_ns, g.node.id))
    return [g for g in out if g.nbytes], f"old stages' data-parallel bytes {' or '.join(sorted(how))}"


def _parameters(units: list[Unit]) -> tuple[int, int]:
    """(bytes, count) of the gradients ``units`` accumulate: their AccumulateGrad ops when
    there are any, else their in-place accumulations."""
    nodes = [n for u in units for n in u.nodes]
    accs = [b[0] for n in nodes if op_name(n) == ACCUMULATE_GRAD
            and (b := grad_bytes(n)) is not None]
    if accs:
        return sum(accs), len(accs)
    adds = [b for n in nodes if (b := accumulated_bytes(n))]
    return sum(adds), len(adds)


def _piece_of(inputs: StageInputs, what: int) -> StagePieces:
    """The old stage that ran ``what``: a layer, -1 the first stage's embedding, -2 the last
    stage's head."""
    if what >= 0:
        return next(p for (t, _), p in inputs.pieces.items() if t == inputs.tp_rank and what in p.layers)
    return inputs.old_piece(0) if what == -1 else inputs.old_piece(inputs.old_mesh.pp - 1)


def _accumulation_weights(src: StagePieces) -> dict[int, int]:
    """Per piece of ``src``'s backward (layer, -1 embedding, -2 head), the bytes it adds in place."""
    def weight(unit: Unit) -> int:
        return sum(accumulated_bytes(n) for n in unit.nodes)

    out = {layer: weight(unit) for layer, unit in src.bwd.items()}
    out[-1], out[-2] = weight(src.bwd_post), weight(src.bwd_pre)
    return out


def _even_shares(src: StagePieces) -> int:
    return len(src.layers) + (1 if src.fwd_pre.nodes or src.bwd_post.nodes else 0) \
        + (1 if src.fwd_post.nodes or src.bwd_pre.nodes else 0)


__all__ = ["restage", "restaged_group", "schedule"]
