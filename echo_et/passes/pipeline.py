"""Re-stage a pipeline: new stage count and/or micro-batch count, from a traced Job's
per-layer measurements, with a regenerated 1F1B schedule.

Needs nodes annotated with ``phase`` (forward / backward / optimizer), ``microbatch`` and,
for transformer blocks, ``layer`` (the ex-situ tracer's workloads emit them). What is taken
from the trace, per tensor-parallel rank:

- per layer, the nodes of its forward and of its backward for one micro-batch: the one whose
  span is the median over the micro-batches (so one disturbed measurement does not become
  the model; the last micro-batch's backward, which carries the gradient-synchronisation
  hooks, is left out unless it is the only one), with measured durations and internal
  dependencies;
- the stage prologue of the first stage (embedding: the forward nodes before the first
  layer, the backward nodes after the last) and the epilogue of the last stage (final norm,
  head, loss);
- the optimizer phase of the old stage of the same kind (first / middle / last), its math
  scaled by the ratio of parameter bytes;
- activation bytes and the stream and duration of the traced send/recv;
- gradient sizes from the AccumulateGrad ops of each layer's backward (``cpu.shapes``),
  else the old stage's data-parallel bytes spread evenly over its layers and extras.

What is generated: layers split evenly over the new stages (contiguous, like Megatron-LM),
the non-interleaved 1F1B order (warm-up ``min(P - s - 1, M)`` forwards, steady 1F1B,
cool-down backwards) with send/recv on the pipeline group between neighbouring stages, the
data-parallel gradient buckets (reverse-ready order, cap from the old buckets) issued on
the old data-parallel stream when their last gradient is ready in the last micro-batch's
backward, and for ZeRO-1 the all-gathers after the optimizer. Nodes of the traced step that
belong to the schedule's machinery (unannotated host ops between micro-batches) are not
copied; their count is reported. Units are laid out back to back on a fresh clock; the
simulator recomposes the real timing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Graph, GraphBuilder, Job
from echo_et.ir.conventions import ISSUE_PREFIX
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.limits import MAX_GRAPH_NODES
from echo_et.ir.schema import pb
from echo_et.passes.derive import derived_job_builder
from echo_et.passes.gradients import ACCUMULATE_GRAD, Gradient, bucket_gradients, grad_bytes
from echo_et.passes.layout import LayoutDecision
from echo_et.passes.mesh import Mesh


# -- reading a traced stage -----------------------------------------------------------------
@dataclass
class Unit:
    """Nodes of one piece of work (a layer's forward for one micro-batch, ...); ``lead_ns``
    is the host time between the piece before it and this one in the trace (glue code that
    belongs to neither), kept when the unit is placed in a new schedule."""

    nodes: list[pb.Node] = field(default_factory=list)
    lead_ns: int = 0

    @property
    def start(self) -> int:
        return min((n.start_ns for n in self.nodes), default=0)

    @property
    def end(self) -> int:
        return max((n.start_ns + n.duration_ns for n in self.nodes), default=0)


@dataclass
class StagePieces:
    graph_id: str
    layers: list[int]
    fwd: dict[int, Unit]          # layer -> forward unit (representative micro-batch)
    bwd: dict[int, Unit]
    fwd_pre: Unit                 # before the first layer (embedding)
    fwd_post: Unit                # after the last layer (head, loss)
    bwd_pre: Unit                 # before the first layer's backward (loss/head backward)
    bwd_post: Unit                # after the last (embedding backward)
    optimizer: Unit
    prologue: Unit
    epilogue: Unit
    microbatches: int
    p2p_bytes: int = 0
    p2p_stream: tuple[int, str] | None = None
    p2p_duration: int = 0
    dp_stream: tuple[int, str] | None = None
    dp_dtype: str = ""
    dp_bytes: int = 0             # total data-parallel bytes of this stage (unpadded estimate)
    dp_buckets: list[int] = field(default_factory=list)
    dropped: int = 0
    glue_ns: int = 0              # host time between two micro-batch blocks, less P2P (median)
    # The first micro-batch's forward as measured (it runs colder than the median one).
    fwd0: dict[int, Unit] = field(default_factory=dict)
    fwd_pre0: Unit = field(default_factory=Unit)
    fwd_post0: Unit = field(default_factory=Unit)

    def forward_units(self, mb: int) -> tuple[dict[int, Unit], Unit, Unit]:
        """(per-layer, pre, post) forward units to copy for micro-batch ``mb``."""
        if mb == 0 and self.fwd0:
            return self.fwd0, self.fwd_pre0, self.fwd_post0
        return self.fwd, self.fwd_pre, self.fwd_post


def _unit_key(n: pb.Node) -> str:
    a = n.annotations
    return a.phase if a.phase else ""


def read_stage(graph: Graph, keys: dict[str, str]) -> StagePieces:
    """Cut one traced stage graph into units. ``keys`` maps role -> group key ("dp", "pp")."""
    dp_key, pp_key = keys.get("dp", ""), keys.get("pp", "")
    by_phase_mb: dict[tuple[str, int], list[pb.Node]] = defaultdict(list)
    optimizer = Unit()
    rest: list[pb.Node] = []
    p2p: list[pb.Node] = []
    dp_colls: list[pb.Node] = []
    streams = {s.id: (s.kind, s.name) for s in graph.header.streams}
    for n in graph.nodes:
        if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group == pp_key:
            p2p.append(n)
            continue
        if n.kind == pb.KIND_COLLECTIVE and n.collective.group == dp_key:
            dp_colls.append(n)
            continue
        a = n.annotations
        if a.phase in ("forward", "backward") and a.HasField("microbatch"):
            by_phase_mb[(a.phase, a.microbatch)].append(n)
        elif a.phase == "optimizer":
            optimizer.nodes.append(n)
        else:
            rest.append(n)
    if not by_phase_mb:
        raise EchoError(f"graph {graph.id}: no node carries phase and micro-batch annotations; "
                        "re-staging a pipeline needs a Job from `echo-et trace` (annotated layers)")
    mbs = sorted({mb for _, mb in by_phase_mb})
    fwd, fwd_pre, fwd_post = _median_units(by_phase_mb, "forward", mbs)
    # The last micro-batch's backward carries the gradient hooks: not representative.
    bwd, bwd_pre, bwd_post = _median_units(by_phase_mb, "backward", mbs[:-1] or mbs)
    annotated = [n for lst in by_phase_mb.values() for n in lst] + optimizer.nodes
    lo = min(n.start_ns for n in annotated)
    hi = max(n.start_ns + n.duration_ns for n in annotated)
    prologue = Unit([n for n in rest if n.start_ns + n.duration_ns <= lo])
    epilogue = Unit([n for n in rest if n.start_ns >= hi])
    pieces = StagePieces(
        graph_id=graph.id, layers=sorted(fwd), fwd=fwd, bwd=bwd, fwd_pre=fwd_pre,
        fwd_post=fwd_post, bwd_pre=bwd_pre, bwd_post=bwd_post, optimizer=optimizer,
        prologue=prologue, epilogue=epilogue, microbatches=len(mbs),
        dropped=len(rest) - len(prologue.nodes) - len(epilogue.nodes),
    )
    sends = [n for n in p2p if n.kind == pb.KIND_SEND]
    if p2p:
        pieces.p2p_bytes = max(n.p2p.bytes for n in p2p)
        pieces.p2p_stream = streams[p2p[0].stream]
        pieces.p2p_duration = min(n.duration_ns for n in (sends or p2p))
    if dp_colls:
        pieces.dp_stream = streams[dp_colls[0].stream]
        pieces.dp_dtype = dp_colls[0].collective.dtype
        grads = [c for c in dp_colls if c.collective.type in (pb.COLL_ALL_REDUCE, pb.COLL_REDUCE_SCATTER)]
        pieces.dp_buckets = [c.collective.in_bytes for c in grads]
        pieces.dp_bytes = sum(pieces.dp_buckets)
    pieces.glue_ns = _block_glue(by_phase_mb, p2p)
    first = _split_layers(by_phase_mb.get(("forward", mbs[0]), []))
    if sorted(first[0]) == pieces.layers:
        pieces.fwd0, pieces.fwd_pre0, pieces.fwd_post0 = first
    return pieces


def _split_at_issue(unit: Unit) -> tuple[Unit, Unit]:
    """``unit`` cut before its first communication issue (``issue:<op>`` spans of the
    tracer): what comes before belongs to the work before it, the rest is the P2P glue."""
    nodes = sorted(unit.nodes, key=lambda n: (n.start_ns, n.id))
    cut = next((i for i, n in enumerate(nodes) if n.name.startswith(ISSUE_PREFIX)), len(nodes))
    before, after = Unit(nodes[:cut], unit.lead_ns), Unit(nodes[cut:])
    if after.nodes:
        after.lead_ns = max(0, after.start - before.end) if before.nodes else unit.lead_ns
    return before, after


def _block_glue(by_phase_mb: dict[tuple[str, int], list[pb.Node]], p2p: list[pb.Node]) -> int:
    """Median time between the end of one micro-batch block (a forward or backward) and the
    start of the next, less the P2P time in between: the schedule's own host work (posting
    and waiting, Python), which no layer owns but every block transition pays."""
    spans = sorted((min(n.start_ns for n in ns), max(n.start_ns + n.duration_ns for n in ns))
                   for ns in by_phase_mb.values() if ns)
    p2p_spans = sorted((n.start_ns, n.start_ns + n.duration_ns) for n in p2p)
    glue = []
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        if start <= end:
            glue.append(0)
            continue
        covered, at = 0, end
        for a, b in p2p_spans:           # union of P2P time inside [end, start]
            a, b = max(a, at), min(b, start)
            if b > a:
                covered += b - a
                at = b
        glue.append(max(0, start - end - covered))
    glue.sort()
    return glue[(len(glue) - 1) // 2] if glue else 0


def _median_units(by_phase_mb: dict[tuple[str, int], list[pb.Node]], phase: str,
                  mbs: list[int]) -> tuple[dict[int, Unit], Unit, Unit]:
    """Per piece (each layer, pre, post), the micro-batch whose span is the median: one
    measurement disturbed by the machine (a descheduled thread) does not become the model."""
    cuts = [_split_layers(by_phase_mb.get((phase, mb), [])) for mb in mbs]

    def median(units: list[Unit]) -> Unit:
        units = [u for u in units if u.nodes]
        if not units:
            return Unit()
        units.sort(key=lambda u: (u.end - u.start, u.nodes[0].id))
        return units[(len(units) - 1) // 2]

    layers = sorted({layer for c in cuts for layer in c[0]})
    per_layer = {layer: median([c[0][layer] for c in cuts if layer in c[0]]) for layer in layers}
    return per_layer, median([c[1] for c in cuts]), median([c[2] for c in cuts])


def _split_layers(nodes: list[pb.Node]) -> tuple[dict[int, Unit], Unit, Unit]:
    """Per-layer units; unannotated nodes before the first layer node are 'pre', after the
    last 'post', in between they join the layer that precedes them."""
    nodes = sorted(nodes, key=lambda n: (n.start_ns, n.id))
    layered = [i for i, n in enumerate(nodes) if n.annotations.HasField("layer")]
    units: dict[int, Unit] = defaultdict(Unit)
    pre, post = Unit(), Unit()
    if not layered:
        return {}, Unit(list(nodes)), Unit()
    first, last = layered[0], layered[-1]
    last_end = max(nodes[i].start_ns + nodes[i].duration_ns for i in layered)
    current = nodes[first].annotations.layer
    for i, n in enumerate(nodes):
        if n.annotations.HasField("layer"):
            current = n.annotations.layer
            units[current].nodes.append(n)
        elif i < first:
            pre.nodes.append(n)
        elif i > last and n.start_ns >= last_end:
            post.nodes.append(n)
        else:
            units[current].nodes.append(n)
    ordered = sorted((u for u in [pre, *units.values(), post] if u.nodes), key=lambda u: u.start)
    for before, unit in zip(ordered, ordered[1:], strict=False):
        unit.lead_ns = max(0, unit.start - before.end)
    return dict(units), pre, post


# -- writing a new stage ------------------------------------------------------------------
class _Emitter:
    """Copies units into a GraphBuilder on a fresh clock, in schedule order."""

    def __init__(self, graph_id: str, source_streams: dict[str, dict[int, pb.Stream]]):
        self.b = GraphBuilder(graph_id)
        self.clock = 0
        self.source_streams = source_streams   # old graph id -> stream id -> Stream
        self.last_nodes: list[pb.Node] = []    # nodes of the unit just emitted
        self.waits: list[int] = []             # ids the next unit's first nodes wait for

    def stream_for(self, graph_id: str, sid: int) -> int:
        s = self.source_streams[graph_id][sid]
        return self.b.stream(s.kind, s.name, device=s.device, native_id=s.native_id)

    def unit(self, graph_id: str, unit: Unit, *, mb: int | None, stage: int,
             scale: float = 1.0, drop_ids: frozenset[int] = frozenset(),
             lead: int | None = None) -> list[pb.Node]:
        """Copy ``unit`` to the clock (after its lead, or ``lead`` when given)."""
        nodes = [n for n in sorted(unit.nodes, key=lambda n: n.id) if n.id not in drop_ids]
        if not nodes:
            return []
        if scale != 1.0:
            # The whole unit's timeline stretches (host loops over parameters, their
            # kernels, the gaps between them): nesting and order are kept.
            origin = min(n.start_ns for n in nodes)
            scaled = []
            for n in nodes:
                c = _copy(n)
                c.start_ns = origin + round((n.start_ns - origin) * scale)
                c.duration_ns = max(0, round((n.start_ns + n.duration_ns - origin) * scale)
                                    - (c.start_ns - origin))
                scaled.append(c)
            nodes = scaled
        start = min(n.start_ns for n in nodes)
        shift = self.clock + (unit.lead_ns if lead is None else lead) - start
        ids: dict[int, int] = {}
        made: list[pb.Node] = []
        first_on_stream: set[int] = set()
        for n in nodes:
            stream = self.stream_for(graph_id, n.stream)
            new = self._clone(n, stream, n.start_ns + shift)
            nid = new.id
            for d in n.deps:
                if d.id in ids:
                    new.deps.add(id=ids[d.id], kind=d.kind)
            if stream not in first_on_stream:
                first_on_stream.add(stream)
                for w in self.waits:
                    new.deps.add(id=w, kind=pb.DEP_SYNC)
            if mb is not None:
                new.annotations.microbatch = mb
            new.annotations.stage = stage
            ids[n.id] = nid
            made.append(new)
        self.waits = []
        self.clock = max(n.start_ns + n.duration_ns for n in made)
        self.last_nodes = made
        return made

    def _clone(self, n: pb.Node, stream: int, start: int) -> pb.Node:
        """A copy of ``n`` (payload, annotations, attrs; no deps) made through the builder,
        so that collective sequence numbers follow this graph's order."""
        kw = {"start_ns": start, "duration_ns": n.duration_ns}
        if n.kind == pb.KIND_COLLECTIVE and n.HasField("collective"):
            c = n.collective
            new = self.b.collective(n.name, stream, coll_type=c.type, group=c.group,
                                    in_bytes=c.in_bytes, out_bytes=c.out_bytes, dtype=c.dtype,
                                    root=c.root if c.HasField("root") else None, **kw)
            new.collective.algorithm = c.algorithm
        elif n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.HasField("p2p"):
            new = self.b.p2p(n.kind == pb.KIND_SEND, n.name, stream, group=n.p2p.group,
                             peer=n.p2p.peer, nbytes=n.p2p.bytes, tag=n.p2p.tag, **kw)
        else:
            new = self.b.node(n.kind, n.name, stream, **kw)
            which = n.WhichOneof("payload")
            if which:
                getattr(new, which).CopyFrom(getattr(n, which))
        new.annotations.CopyFrom(n.annotations)
        for k, v in n.attrs.items():
            new.attrs[k] = v
        return new

    def p2p(self, ops: list[tuple[bool, int]], *, key: str, nbytes: int, stream: tuple[int, str],
            duration: int, device: int) -> None:
        """Post ``ops`` ((is_send, peer) each) together; the next unit waits for all."""
        after = max(self.last_nodes, key=lambda n: (n.start_ns + n.duration_ns, n.id), default=None)
        made = []
        for is_send, peer in ops:
            sid = self.b.stream(stream[0], p2p_stream_name(stream[1], is_send, peer), device=device)
            deps = [(after.id, pb.DEP_SYNC)] if after is not None else []
            n = self.b.p2p(is_send, "pp:send" if is_send else "pp:recv", sid, group=key, peer=peer,
                           nbytes=nbytes, start_ns=self.clock, duration_ns=duration, deps=deps)
            made.append(n)
        self.clock += duration
        self.waits = [n.id for n in made]


def p2p_stream_name(traced: str, is_send: bool, peer: int) -> str:
    """The stream of a send/recv to ``peer``: the tracer's ``<base>:send|recv:<peer>`` naming
    (one stream per direction and peer, so that a send and a recv posted together do not
    wait on each other) when the traced stream follows it, else the traced stream."""
    for d in (":send:", ":recv:"):
        if d in traced:
            base = traced[:traced.rindex(d)]
            return f"{base}:{'send' if is_send else 'recv'}:{peer}"
    return traced


def _copy(n: pb.Node) -> pb.Node:
    c = pb.Node()
    c.CopyFrom(n)
    return c


# -- the pass -----------------------------------------------------------------------------
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


def _role_keys(job: Job, decision: LayoutDecision, rank: int) -> dict[str, str]:
    """role -> graph-local key on ``rank``; keys of other roles cannot be re-derived."""
    out = {}
    for key, gid in sorted(job.binding(rank).groups.items()):
        role = decision.roles.get(gid, "")
        if role in ("tp", "dp", "pp") and role not in out:
            out[role] = key
        else:
            raise EchoError(f"rank {rank} uses group key {key!r} (group {gid}, role {role or 'unknown'}), "
                            "which re-staging cannot re-derive (only tp, dp and pp groups)")
    return out


def _refuse_other_schedules(job: Job) -> None:
    """A Job traced with the interleaved schedule has each stage's layers in several chunks,
    not the contiguous stage this pass reads; one traced under DeepSpeed's pipeline engine
    moves its tensors in calls this pass does not regenerate (its 1F1B is Megatron-LM's)."""
    import json

    text = job.manifest.attrs.get("trace.workload")
    try:
        workload = json.loads(text) if text else {}
        virtual = workload.get("layers_per_virtual_stage")
        engine = workload.get("pipeline_engine")
    except (ValueError, AttributeError):
        virtual = engine = None
    if virtual:
        raise EchoError(f"{job.source or 'job'}: traced with the interleaved pipeline schedule "
                        f"({virtual} layers per virtual stage), whose stages are not contiguous "
                        "layers; re-trace it at the new pipeline depth instead of re-staging it")
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
            keys0 = keys0 or keys
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
    if bucket_bytes is None:
        olds = [b for p in pieces.values() for b in p.dp_buckets]
        bucket_bytes = max(olds) if olds else 25 << 20
    dropped = sum(p.dropped for p in read.values())

    new_mesh = old.with_sizes(pp=pp)
    jb = derived_job_builder(job, new_mesh.world, None)
    group_ids: dict[tuple[str, tuple[int, ...]], int] = {}

    def gid(role: str, ranks: list[int]) -> int:
        k = (role, tuple(ranks))
        if k not in group_ids:
            group_ids[k] = jb.group(ranks, name=f"{role}{ranks[0]}", desc=role, role=role)
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
                bucket_bytes=bucket_bytes, dp=new_mesh.dp)).build()
            graphs[(t, s)] = g
    # Graphs identical across tp ranks are shared (proved by content hash).
    by_hash: dict[str, str] = {}
    graph_of: dict[tuple[int, int], str] = {}
    for (t, s), g in sorted(graphs.items()):
        h = g.content_hash()
        if h not in by_hash:
            by_hash[h] = g.id
            jb.add_graph(g)
        graph_of[(t, s)] = by_hash[h]
    roles: dict[int, str] = {}
    for r in range(new_mesh.world):
        c = new_mesh.coords(r)
        groups = {}
        for role in ("tp", "dp", "pp"):
            key = keys0.get(role)
            if key is None:
                continue
            groups[key] = gid(role, new_mesh.group_ranks(r, [role]))
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
        "activation_bytes": p2p_bytes, "bucket_cap_bytes": bucket_bytes,
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
        self.e = _Emitter(x.graph_id, x.streams)
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
        _, self.send_bwd = _split_at_issue(self.plast.bwd_post)
        head = x.layers[0] if x.layers else None
        self.head_src = x.piece_of_layer(head) if head is not None else None
        hs = self.head_src
        self.head_tail = (_split_at_issue(hs.bwd_post)[0]
                          if hs is not None and hs is not self.p0 and hs.layers and hs.layers[0] == head
                          else Unit())
        self.lead_after_recv_bwd = self.p0.bwd[max(self.p0.bwd)].lead_ns if self.edges and self.p0.bwd else None
        # What the last micro-batch's backward leaves for the gradient buckets.
        self.last_bwd_nodes: list[pb.Node] = []
        self.unit_ends: list[tuple[pb.Node, int]] = []   # (last node of a unit with params, share key)
        self.grad_source = ""
        self.reduce_ids: list[int] = []
        self.bucket_sizes: list[int] = []
        self.dtype = x.dp_source.dp_dtype if x.dp_source else ""
        self.elem = dtype_size(self.dtype) or 1

    def build(self) -> tuple[Graph, str]:
        x, e = self.inp, self.e
        old = x.old_mesh
        for role in ("tp", "dp", "pp"):
            if role in x.keys:
                e.b.declare_group(x.keys[role], {"tp": old.tp, "dp": old.dp, "pp": x.stages}[role])
        e.unit(self.template.graph_id, self.template.prologue, mb=None, stage=x.stage)
        p2p_src = x.p2p_source
        p2p = dict(key=self.pp_key, nbytes=x.p2p_bytes,
                   stream=p2p_src.p2p_stream or (pb.STREAM_CPU_THREAD, "p2p"),
                   duration=p2p_src.p2p_duration, device=self.device)
        for item in schedule(x.stage, x.stages, x.microbatches):
            if item[0] == "F":
                self.forward(item[1])
            elif item[0] == "B":
                self.backward(item[1])
                if item[1] == x.microbatches - 1:
                    self.gradient_buckets()
            else:
                e.p2p([(is_send, x.stage + off) for is_send, off in item[1]], **p2p)
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
                self.unit_ends.append((made[-1], -2))
        elif self.edges:
            e.unit(p0.graph_id, self.recv_bwd, mb=mb, stage=s)
        for i, layer in enumerate(reversed(x.layers)):
            src = x.piece_of_layer(layer)
            lead = self.lead_after_recv_bwd if i == 0 and not x.last else None
            got = e.unit(src.graph_id, src.bwd[layer], mb=mb, stage=s, lead=lead)
            made += got
            if final and got:
                self.unit_ends.append((max(got, key=lambda n: (n.start_ns + n.duration_ns, n.id)), layer))
        if x.first:
            got = e.unit(p0.graph_id, p0.bwd_post, mb=mb, stage=s)
            made += got
            if final and got:
                self.unit_ends.append((got[-1], -1))
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

    def gradient_buckets(self) -> None:
        """Data-parallel gradient buckets over the last micro-batch's backward, issued (in
        program order) right after it, before the send of its input gradient, as DDP's
        hooks do."""
        x, e = self.inp, self.e
        dp_src = x.dp_source
        if not (self.dp_key and dp_src is not None and dp_src.dp_stream is not None and x.dp > 1):
            return
        grads, self.grad_source = _gradients(self.last_bwd_nodes, self.unit_ends, x)
        buckets = bucket_gradients(grads, x.bucket_bytes, x.bucket_bytes)
        sid = self._dp_stream()
        for k, bucket in enumerate(buckets):
            size = sum(g.nbytes for g in bucket)
            hook = bucket[-1].node
            deps = [(hook.id, pb.DEP_SYNC)]
            at = hook.start_ns + hook.duration_ns
            if x.zero:
                shard = self._shard_bytes(size)
                n = e.b.collective(f"dp:reduce_scatter bucket {k}", sid, coll_type=pb.COLL_REDUCE_SCATTER,
                                   group=self.dp_key, in_bytes=shard * x.dp, out_bytes=shard, dtype=self.dtype,
                                   start_ns=at, deps=deps)
            else:
                n = e.b.collective(f"dp:all_reduce bucket {k}", sid, coll_type=pb.COLL_ALL_REDUCE,
                                   group=self.dp_key, in_bytes=size, dtype=self.dtype, start_ns=at, deps=deps)
            n.annotations.phase = "backward"
            n.annotations.stage = x.stage
            self.reduce_ids.append(n.id)
            self.bucket_sizes.append(size)

    def optimizer(self) -> None:
        """The template stage's optimizer, scaled by parameter bytes, after the gradient
        buckets; for ZeRO-1, the all-gathers of the updated shards after it."""
        x, e, tmpl = self.inp, self.e, self.template
        e.waits = list(self.reduce_ids)
        ratio = 1.0
        new_bytes = sum(self.bucket_sizes)
        if tmpl.dp_bytes and new_bytes:
            ratio = new_bytes / tmpl.dp_bytes
        made = e.unit(tmpl.graph_id, tmpl.optimizer, mb=None, stage=x.stage, scale=ratio)
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


def _gradients(nodes: list[pb.Node], unit_ends: list[tuple[pb.Node, int]],
               inputs: StageInputs) -> tuple[list[Gradient], str]:
    """Gradients of the new stage in ready order: AccumulateGrad shapes when every one has
    them, else each old stage's data-parallel bytes spread over its layers and extras."""
    accs = [n for n in nodes if (n.cpu.op if n.HasField("cpu") and n.cpu.op else n.name) == ACCUMULATE_GRAD]
    sized = [(grad_bytes(n), n) for n in accs]
    if accs and all(sz is not None for sz, _ in sized):
        return [Gradient(n, sz[0], "") for sz, n in sized], "AccumulateGrad input shapes"  # type: ignore[index]
    out = []
    t = inputs.tp_rank
    for node, what in unit_ends:
        if what >= 0:
            src = next(p for (tt, _), p in inputs.pieces.items() if tt == t and what in p.layers)
        else:
            src = inputs.old_piece(0) if what == -1 else inputs.old_piece(inputs.old_mesh.pp - 1)
        shares = len(src.layers) + (1 if src.fwd_pre.nodes or src.bwd_post.nodes else 0) \
            + (1 if src.fwd_post.nodes or src.bwd_pre.nodes else 0)
        out.append(Gradient(node, src.dp_bytes // max(1, shares), ""))
    return [g for g in out if g.nbytes], "old stages' data-parallel bytes spread over their layers"


__all__ = ["StagePieces", "Unit", "read_stage", "restage", "schedule"]
