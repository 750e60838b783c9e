"""Writing a new pipeline stage's nodes: traced units copied onto a fresh clock, the
pipeline's send/recv between them, collectives on groups the stage has no part in left out.
Apart from the pass (:mod:`echo_et.passes.pipeline`), which decides what goes where, so
that how nodes are laid down is in one place.
"""

from __future__ import annotations

from echo_et.ir import GraphBuilder
from echo_et.ir.conventions import ISSUE_PREFIX, WORK_SCALE_ATTR
from echo_et.ir.schema import pb
from echo_et.passes.stage_read import Unit, node_copy


class Emitter:
    """Copies units into a GraphBuilder on a fresh clock, in schedule order. Public because
    the pass (:mod:`echo_et.passes.pipeline`) writes each new stage through it."""

    def __init__(self, graph_id: str, source_streams: dict[str, dict[int, pb.Stream]]):
        self.b = GraphBuilder(graph_id)
        self.clock = 0
        self.source_streams = source_streams   # old graph id -> stream id -> Stream
        self.last_nodes: list[pb.Node] = []    # nodes of the unit just emitted
        self.waits: list[int] = []             # ids the next unit's first nodes wait for
        self.drop_groups: frozenset[str] = frozenset()   # group keys this graph has no part in
        self.last_on: dict[int, int] = {}      # stream -> its last node so far
        # Whether the host waits, too, for what the next unit waits for: in a measured trace
        # it did (a CPU run's wait() blocks); on a GPU only the device streams wait, and a
        # host that blocks does so through a sync node of its own (the meta device's).
        self.host_waits = True

    def stream_for(self, graph_id: str, sid: int) -> int:
        s = self.source_streams[graph_id][sid]
        return self.b.stream(s.kind, s.name, device=s.device, native_id=s.native_id)

    def unit(self, graph_id: str, unit: Unit, *, mb: int | None, stage: int,
             scale: float = 1.0, launch_scale: float | None = None, drop_ids: frozenset[int] = frozenset(),
             lead: int | None = None) -> list[pb.Node]:
        """Copy ``unit`` to the clock (after its lead, or ``lead`` when given), less the
        collectives on ``drop_groups`` and the host time spent on them."""
        dropped = drop_ids | _collectives_on(unit.nodes, self.drop_groups)
        nodes = [n for n in sorted(unit.nodes, key=lambda n: n.id) if n.id not in dropped]
        if not nodes:
            return []
        if len(nodes) < len(unit.nodes):
            nodes = _close_host_gaps(nodes, [n for n in unit.nodes if n.id in dropped],
                                     self.source_streams[graph_id])
        if scale != 1.0:
            # The whole unit's timeline stretches (host loops over parameters, their
            # kernels, the gaps between them): nesting and order are kept.
            origin = min(n.start_ns for n in nodes)
            scaled = []
            for n in nodes:
                c = node_copy(n)
                c.start_ns = origin + round((n.start_ns - origin) * scale)
                c.duration_ns = max(0, round((n.start_ns + n.duration_ns - origin) * scale)
                                    - (c.start_ns - origin))
                scaled.append(c)
            nodes = scaled
            # An untimed graph has no duration to stretch: whoever prices a node scales it, a
            # kernel by the work, the launch that issues it by how many such calls there are.
            for n in nodes:
                factor = {pb.KIND_COMPUTE: scale, pb.KIND_LAUNCH: launch_scale or scale}.get(n.kind)
                if factor is not None:
                    n.attrs[WORK_SCALE_ATTR] = f"{factor * float(n.attrs.get(WORK_SCALE_ATTR, '1')):.6g}"
        start = min(n.start_ns for n in nodes)
        shift = self.clock + (unit.lead_ns if lead is None else lead) - start
        ids: dict[int, int] = {}
        made: list[pb.Node] = []
        first_on_stream: set[int] = set()
        waited = False
        for n in nodes:
            stream = self.stream_for(graph_id, n.stream)
            new = self._clone(n, stream, n.start_ns + shift)
            nid = new.id
            for d in n.deps:
                if d.id in ids:
                    new.deps.add(id=ids[d.id], kind=d.kind)
            if stream not in first_on_stream:
                first_on_stream.add(stream)
                if self.host_waits or self.source_streams[graph_id][n.stream].kind != pb.STREAM_CPU_THREAD:
                    for w in self.waits:
                        new.deps.add(id=w, kind=pb.DEP_SYNC)
                    waited = True
            if mb is not None:
                new.annotations.microbatch = mb
            new.annotations.stage = stage
            ids[n.id] = nid
            made.append(new)
            self.last_on[stream] = nid
        if waited:
            self.waits = []   # else the first unit with device work waits
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

    def _kind(self, stream: int) -> int:
        return next((st.kind for st in self.b.graph.header.streams if st.id == stream), pb.STREAM_UNKNOWN)

    def p2p(self, ops: list[tuple[bool, int]], *, key: str, nbytes: int, stream: tuple[int, str],
            duration: int, device: int, sync: tuple[int, str] | None = None) -> None:
        """Post ``ops`` ((is_send, peer) each) together; the next unit waits for all. With
        ``sync`` (a host stream), the host then waits for the whole device, as Megatron's
        p2p calls do."""
        # after the unit before (its host posts the transfer) and the last kernel so far on
        # each compute stream (what is sent; an untimed graph orders by ids, not times)
        before = max(self.last_nodes, key=lambda n: (n.start_ns + n.duration_ns, n.id), default=None)
        kernels = [nid for sid, nid in self.last_on.items() if self._kind(sid) == pb.STREAM_GPU_COMPUTE]
        after = sorted({*([before.id] if before is not None else []), *kernels})
        made = []
        for is_send, peer in ops:
            sid = self.b.stream(stream[0], p2p_stream_name(stream[1], is_send, peer), device=device)
            deps = [(i, pb.DEP_SYNC) for i in after]
            n = self.b.p2p(is_send, "pp:send" if is_send else "pp:recv", sid, group=key, peer=peer,
                           nbytes=nbytes, start_ns=self.clock, duration_ns=duration, deps=deps)
            made.append(n)
            self.last_on[sid] = n.id
        self.clock += duration
        self.waits = [n.id for n in made]
        if sync is not None:
            host = self.b.stream(sync[0], sync[1], device=-1)
            n = self.b.node(pb.KIND_SYNC, "sync", host, start_ns=self.clock,
                            deps=[(i, pb.DEP_SYNC) for i in sorted(self.last_on.values())])
            self.last_on[host] = n.id
            self.waits.append(n.id)


def p2p_stream_name(traced: str, is_send: bool, peer: int) -> str:
    """The stream of a send/recv to ``peer``: the tracer's ``<base>:send|recv:<peer>`` naming
    (one stream per direction and peer, so that a send and a recv posted together do not
    wait on each other) when the traced stream follows it, else the traced stream."""
    for d in (":send:", ":recv:"):
        if d in traced:
            base = traced[:traced.rindex(d)]
            return f"{base}:{'send' if is_send else 'recv'}:{peer}"
    return traced
def _collectives_on(nodes: list[pb.Node], keys: frozenset[str]) -> frozenset[int]:
    """Ids of the collectives on ``keys`` with what exists only for them: the host operator
    or launch that issues each, what that operator nests, and a host wait on nothing else."""
    if not keys:
        return frozenset()
    by_id = {n.id: n for n in nodes}
    out = {n.id for n in nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.group in keys}
    if not out:
        return frozenset()
    for cid in list(out):
        for d in by_id[cid].deps:
            issuer = by_id.get(d.id)
            if issuer is not None and (issuer.kind == pb.KIND_LAUNCH or issuer.name.startswith(ISSUE_PREFIX)):
                out.add(issuer.id)
    for n in sorted(nodes, key=lambda n: n.id):
        if any(d.kind == pb.DEP_CONTROL and d.id in out for d in n.deps):
            out.add(n.id)
        elif n.kind == pb.KIND_SYNC:
            waited = [d.id for d in n.deps if d.kind == pb.DEP_SYNC]
            if waited and all(w in out for w in waited):
                out.add(n.id)
    return frozenset(out)


def _close_host_gaps(kept: list[pb.Node], dropped: list[pb.Node],
                     streams: dict[int, pb.Stream]) -> list[pb.Node]:
    """Copies of ``kept`` with the host time of ``dropped`` taken out of the timeline: every
    instant moves earlier by the dropped host time before it, so that the simulator does not
    keep it as a gap (and an operator nesting dropped work gets shorter)."""
    spans = sorted((n.start_ns, n.start_ns + n.duration_ns) for n in dropped
                   if streams[n.stream].kind == pb.STREAM_CPU_THREAD and n.duration_ns > 0)
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if not merged:
        return kept

    def moved(t: int) -> int:
        return t - sum(max(0, min(b, t) - a) for a, b in merged)

    out = []
    for n in kept:
        c = node_copy(n)
        c.start_ns = moved(n.start_ns)
        c.duration_ns = moved(n.start_ns + n.duration_ns) - c.start_ns
        out.append(c)
    return out


__all__ = ["Emitter", "p2p_stream_name"]
