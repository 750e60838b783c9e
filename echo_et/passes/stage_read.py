"""Reading a traced pipeline stage into pieces (units of work per layer, the stage's edges,
its optimizer; its transfers and gradient reduction): what re-staging takes from a trace,
in one place, apart from how a new stage is written (:mod:`echo_et.passes.stage_write`) and
from the pass that orders it (:mod:`echo_et.passes.pipeline`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from echo_et.errors import EchoError
from echo_et.ir import Graph
from echo_et.ir.conventions import EMBEDDING_GROUP, ISSUE_PREFIX, WAIT_PREFIX
from echo_et.ir.schema import pb


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
    optimizer: Unit               # after the data-parallel reduction
    prologue: Unit
    epilogue: Unit
    microbatches: int
    p2p_bytes: int = 0
    p2p_stream: tuple[int, str] | None = None
    p2p_duration: int = 0
    p2p_sync: tuple[int, str] | None = None   # host stream of a device sync after each transfer
    dp_stream: tuple[int, str] | None = None
    dp_dtype: str = ""
    dp_bytes: int = 0             # total data-parallel bytes of this stage (unpadded estimate)
    dp_buckets: list[int] = field(default_factory=list)
    dp_after_backward: bool = False   # reduced once the schedule is done (Megatron's local DDP), not in hooks
    shared_bytes: int = 0         # gradient bytes reduced over the embedding group (shared with the other end)
    optimizer_pre: Unit = field(default_factory=Unit)   # before a reduction after the backward
    header_attrs: dict[str, str] = field(default_factory=dict)   # what the graph says of its timing
    tp_after_bytes: int = 0       # bytes all-reduced over tp after the backward (sequence parallelism's norms)
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


def read_stage(graph: Graph, keys: dict[str, str]) -> StagePieces:
    """Cut one traced stage graph into units. ``keys`` maps role -> group key ("dp", "pp")."""
    dp_key, pp_key = keys.get("dp", ""), keys.get("pp", "")
    by_phase_mb: dict[tuple[str, int], list[pb.Node]] = defaultdict(list)
    optimizer = Unit()
    rest: list[pb.Node] = []
    p2p: list[pb.Node] = []
    dp_colls: list[pb.Node] = []
    streams = {s.id: (s.kind, s.name) for s in graph.header.streams}
    for n in _launches_annotated(graph.nodes):
        if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group == pp_key:
            p2p.append(n)
            continue
        a = n.annotations
        if n.kind == pb.KIND_COLLECTIVE and n.collective.group == dp_key and a.phase != "forward":
            # the gradients' reduction; one in a forward (Megatron averaging each
            # micro-batch's loss over the replicas) stays with its micro-batch
            dp_colls.append(n)
            continue
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
    # Before the first annotated node and after the last; ids order what time does not (a
    # meta-device trace has every node at 0), so no node is both.
    lo = min((n.start_ns, n.id) for n in annotated)
    hi = max((n.start_ns + n.duration_ns, n.id) for n in annotated)
    prologue = Unit([n for n in rest if (n.start_ns + n.duration_ns, n.id) < lo])
    epilogue = Unit([n for n in rest if (n.start_ns, n.id) > hi])
    pieces = StagePieces(
        graph_id=graph.id, layers=sorted(fwd), fwd=fwd, bwd=bwd, fwd_pre=fwd_pre,
        fwd_post=fwd_post, bwd_pre=bwd_pre, bwd_post=bwd_post, optimizer=optimizer,
        prologue=prologue, epilogue=epilogue, microbatches=len(mbs),
        dropped=len(rest) - len(prologue.nodes) - len(epilogue.nodes),
    )
    sends = [n for n in p2p if n.kind == pb.KIND_SEND]
    p2p_ids = {n.id for n in p2p}
    # Megatron's p2p calls synchronise the device after posting their transfers (a sync,
    # not the wait on one transfer that every trace has)
    synced = next((n for n in rest if n.kind == pb.KIND_SYNC and not n.name.startswith(WAIT_PREFIX)
                   and any(d.kind == pb.DEP_SYNC and d.id in p2p_ids for d in n.deps)), None)
    if synced is not None:
        pieces.p2p_sync = streams[synced.stream]
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
        pieces.dp_after_backward = bool(grads) and all(c.annotations.phase == "optimizer" for c in grads)
        if pieces.dp_after_backward:
            # what the step does before reducing (Megatron divides the buffer by dp), cut at
            # the first reduction's issue: ids follow the tracer's program order
            first = min(grads, key=lambda c: c.id)
            cut = min([first.id, *(d.id for d in first.deps if d.kind in (pb.DEP_LAUNCH, pb.DEP_DATA))])
            pieces.optimizer_pre = Unit([n for n in optimizer.nodes if n.id < cut])
            pieces.optimizer = Unit([n for n in optimizer.nodes if n.id >= cut])
    tp_key = keys.get("tp")
    pieces.tp_after_bytes = sum(n.collective.in_bytes for n in optimizer.nodes
                                if n.kind == pb.KIND_COLLECTIVE and tp_key and n.collective.group == tp_key)
    embd_key = keys.get(EMBEDDING_GROUP)
    pieces.shared_bytes = sum(n.collective.in_bytes for n in optimizer.nodes
                              if n.kind == pb.KIND_COLLECTIVE and embd_key and n.collective.group == embd_key)
    pieces.glue_ns = _block_glue(by_phase_mb, p2p)
    # an untimed (meta-device) graph stays untimed: the simulator times it from its models
    pieces.header_attrs = {k: graph.header.attrs[k] for k in _CARRIED_HEADER_ATTRS if k in graph.header.attrs}
    first = _split_layers(by_phase_mb.get(("forward", mbs[0]), []))
    if sorted(first[0]) == pieces.layers:
        pieces.fwd0, pieces.fwd_pre0, pieces.fwd_post0 = first
    return pieces


_CARRIED_HEADER_ATTRS = ("trace.timing", "trace.device")


def _launches_annotated(nodes: list[pb.Node]) -> list[pb.Node]:
    """``nodes``, where a launch the tracer left unannotated (the meta device's) is a copy
    carrying the annotations of the kernel it launches: it belongs to that kernel's piece
    of work, and its host time moves with it."""
    launched = {d.id: n for n in nodes for d in n.deps if d.kind == pb.DEP_LAUNCH}
    out = []
    for n in nodes:
        kernel = launched.get(n.id) if n.kind == pb.KIND_LAUNCH and not n.annotations.phase else None
        if kernel is not None and kernel.annotations.phase:
            n = node_copy(n)
            n.annotations.CopyFrom(kernel.annotations)
        out.append(n)
    return out


def split_at_issue(unit: Unit) -> tuple[Unit, Unit]:
    """``unit`` cut before its first communication issue (``issue:<op>`` spans of the
    tracer): what comes before belongs to the work before it, the rest is the P2P glue.
    Public because the pass cuts a stage's edges with it (the send after a backward, the
    first layer's own tail) when it lays out a new stage."""
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


def node_copy(n: pb.Node) -> pb.Node:
    """Public because writing a stage (:mod:`echo_et.passes.stage_write`) copies the nodes
    it moves or stretches the same way: the traced graph's own nodes stay as read."""
    c = pb.Node()
    c.CopyFrom(n)
    return c


__all__ = ["StagePieces", "Unit", "node_copy", "read_stage", "split_at_issue"]
