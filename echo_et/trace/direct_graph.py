"""Meta-device tracing, its second half: a rank's recorded event list as the rank's graph.

:class:`echo_et.trace.direct.DirectRecorder` records one event list per rank (the event kinds
are defined here: tuples ``(kind, payload...)``); :func:`build_graph` turns it into the
rank's graph, shaped like a GPU trace without its host side:

- ``gpu0-compute`` (GPU compute stream): one compute node per operator, payload
  ``compute`` with ``op``, ``kernel_class``, ``shapes`` and ``dtypes`` in the text form the
  Kineto reader gives CPU operators (the profiler's "Input Dims" / "Input type": one entry
  per schema argument), ``attrs["out_shapes"]`` (JSON list of output shapes) unless the
  output is shaped like the first input, ``attrs["is_causal"] = "0"`` for attention called
  with ``is_causal=False`` (the compute model takes attention as causal otherwise),
  ``duration_ns = 0``;
- communication on ``gpu0-comm:<key>`` (collectives) and ``gpu0-comm:<key>:send|recv:<peer>``
  (point-to-point), with NCCL's stream semantics: a communication node has DEP_SYNC on the
  last compute node issued before it (and on what the compute stream waited for since); the
  first compute node after a ``wait()`` has DEP_SYNC on the communication waited for;
- the host that issues this work, on ``host:0``: one KIND_LAUNCH node (``cpu.op`` = the
  operator or ``c10d::<collective>``) before each compute and communication node, which
  depends on it (DEP_LAUNCH), and a KIND_SYNC node wherever the workload blocks the host on
  the device (an ``echo:sync`` span: ``torch.cuda.synchronize()``), with DEP_SYNC on the
  last node of every device stream so far, or on the compute stream (``echo:stream_sync``:
  ``.item()``, ``.cpu()``), with DEP_SYNC on its last kernel and the communications it has
  waited for since. A compute model gives launches their host
  cost; an iteration whose kernels are shorter than that is then bound by the host, as real
  eager PyTorch runs of small models are;
- annotations (phase, layer, micro-batch, stage) as the profiler-based splice gives them;
- every start time 0 (an untimed layout: the simulator adds no gaps and keeps every
  dependency); header attribute ``trace.timing = "untimed"``.

Apart from the recorder because building needs no torch: the graph half can be read, tested
and reused without it (importing this module does not import torch).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir import Graph, GraphBuilder
from echo_et.ir.attention import CAUSAL_ATTR
from echo_et.ir.repeats import p2p_seq_key
from echo_et.ir.schema import COLLECTIVE_BY_NAME, pb
from echo_et.trace import annotations
from echo_et.trace.ops import kernel_class
from echo_et.trace.records import CommRecord

# Event kinds. Events are tuples (kind, payload...), cheap to copy.
OP = 0          # (OP, name, shapes_text, dtypes_text, out_shapes_text or "", is_causal "0" or "")
SPAN_IN = 1     # (SPAN_IN, attrs)
SPAN_OUT = 2    # (SPAN_OUT,)
MARK_BEGIN = 3  # (MARK_BEGIN, attrs)
MARK_END = 4    # (MARK_END, attrs)
COMM = 5        # (COMM, CommRecord)
WAIT = 6        # (WAIT, CommRecord)
SLOT = 7        # (SLOT, slot): a unit's backward, filled when its template is known
SYNC = 8        # (SYNC,): the host waits for the device (``echo:sync``); (SYNC, STREAM): for
#                 the compute stream only (``echo:stream_sync``: ``.item()``, ``.cpu()``)
STREAM = "stream"
REGION_IN = 9   # (REGION_IN, Region): a repeated region's first run begins
REGION_OUT = 10  # (REGION_OUT, Region): ... and ends
REPEAT = 11     # (REPEAT, Region, labels): the region again, with these annotation values

# The streams of a meta-device graph.
HOST_STREAM = "host:0"

COMPUTE_STREAM = "gpu0-compute"
COMM_STREAM_PREFIX = "gpu0-comm:"


@dataclass
class Region:
    """A repeated region's recorded first run. Public because both halves hold it: the
    recorder makes and replays it, the builder copies it or makes it a repeat block."""

    events: list
    labels: dict
    out_meta: tuple | None
    _facts: tuple[bool, int] | None = None

    def facts(self) -> tuple[bool, int]:
        """(holds a host sync, communication calls it never waits for): read once per region,
        asked at every replay."""
        if self._facts is None:
            self._facts = (any(e[0] == SYNC for e in self.events), _unwaited(self.events))
        return self._facts


def copied(events: list) -> list:
    """Copies of ``events`` for another run of the same work: communication gets fresh
    records (its own issue order and wait). Public: the recorder copies replayed units with
    it, the builder replayed regions."""
    out = []
    fresh: dict[int, CommRecord] = {}
    for e in events:
        kind = e[0]
        if kind == COMM:
            rec = replace(e[1], index=-1, waited=False)
            fresh[id(e[1])] = rec
            out.append((COMM, rec))
        elif kind == WAIT:
            out.append((WAIT, fresh.get(id(e[1]), e[1])))
        else:
            out.append(e)
    return out


def relabel(events: list, subs: dict[str, tuple[Any, Any]]) -> list:
    """``events`` with annotation values replaced: ``subs[key] = (old, new)``. Public: the
    recorder relabels replayed units with it, the builder replayed regions."""
    subs = {k: v for k, v in subs.items() if v[0] is not None and v[0] != v[1]}
    if not subs:
        return events
    out = []
    for e in events:
        if e[0] in (SPAN_IN, MARK_BEGIN, MARK_END):
            attrs = e[1]
            changed = None
            for k, (old, new) in subs.items():
                if attrs.get(k) == old:
                    changed = changed if changed is not None else dict(attrs)
                    changed[k] = new
            out.append((e[0], changed) if changed is not None else e)
        else:
            out.append(e)
    return out


# -- the graph ----------------------------------------------------------------------------------
@dataclass
class DirectResult:
    graph: Graph
    records: list[CommRecord]
    keys: list[str]
    dropped: Counter


# Annotation labels a region substitutes, and the Annotations field each one sets.
_LABEL_FIELD = {"layer": "layer", "mb": "microbatch", "stage": "stage"}


@dataclass
class _Body:
    """The first run of a repeated region, as built: what its copies are made from."""

    first_id: int
    pos: int                           # index of its first node in the graph's store
    current: dict
    stack_len: int
    entry: list[int | None]            # entry state slots (see _Build.slots)
    coll_seq: dict[str, int]
    p2p_seq: dict[tuple, int]
    rec_start: int
    syncs: bool
    shape: tuple
    last_id: int = 0
    ext_deps: list[tuple[int, int, int]] = field(default_factory=list)   # (node id, slot, dep kind)
    exit: list[tuple[bool, int]] = field(default_factory=list)   # waited + last compute: (internal, rel or slot)
    wrote: dict[int, int] = field(default_factory=dict)            # stream -> its last body node (rel)
    coll_counts: dict[str, int] = field(default_factory=dict)
    p2p_counts: dict[tuple, int] = field(default_factory=dict)
    label_values: dict[str, Any] = field(default_factory=dict)   # the region's labels in this body
    labels: dict[str, set] = field(default_factory=dict)          # label -> values its nodes carry
    block: pb.RepeatBlock | None = None
    ok: bool = True


class _Build:
    """Builds one rank's graph from its event list (see the module docstring). A region
    replayed with the same entry state as its first run becomes an instance of a repeat
    block (``GraphHeader.repeats``) instead of copies of its nodes."""

    def __init__(self, key_of: Callable[[CommRecord], str], graph_id: str, where: str, *,
                 compact: bool):
        self.key_of, self.where, self.compact = key_of, where, compact
        self.gb = gb = GraphBuilder(graph_id)
        gb.graph.header.attrs["trace.timing"] = "untimed"
        self.host = gb.stream(pb.STREAM_CPU_THREAD, HOST_STREAM)
        self.compute = gb.stream(pb.STREAM_GPU_COMPUTE, COMPUTE_STREAM, device=0)
        self.store = gb.graph.stored_nodes
        self.new_node = self.store.add
        self.last_on: dict[int, int] = {}               # device stream -> its last node
        self.comm_streams: dict[str, int] = {}
        self.stack: list[tuple[str, dict, dict]] = []   # (kind, raw attrs, merged attrs)
        self.current: dict = {}
        self.last_compute: int | None = None
        self.waited: list[int] = []                     # comm nodes the compute stream waits for
        self.comm_of: dict[int, int] = {}               # id(record) -> node id
        self.records: list[CommRecord] = []
        self.keys: list[str] = []
        self.keys_used: dict[str, int] = {}
        self.dropped: Counter = Counter()
        self.next_id = 1
        self.coll_seq: dict[str, int] = {}
        self.p2p_seq: dict[tuple, int] = {}
        self.bodies: dict[tuple, _Body] = {}            # (id(region), build state shape) -> body
        self.open_body: tuple[int, _Body] | None = None
        self.unwaited_extra = 0

    # -- events --------------------------------------------------------------------------
    def run(self, events: list[tuple]) -> DirectResult:
        for e in events:
            self.event(e)
        if self.stack:
            self.dropped["ex_situ_annotation_begin_without_end"] += sum(1 for s in self.stack if s[0] == "mark")
        unwaited = _unwaited(events) + self.unwaited_extra
        if unwaited:
            self.dropped["ex_situ_wait_not_observed"] += unwaited
        for key, size in sorted(self.keys_used.items()):
            self.gb.declare_group(key, size)
        graph = self.gb.build()
        for body in sorted((b for b in self.bodies.values() if b.block is not None),
                           key=lambda b: b.first_id):
            graph.header.repeats.append(body.block)
        return DirectResult(graph, self.records, self.keys, self.dropped)

    def event(self, e: tuple) -> None:
        kind = e[0]
        if kind == OP:
            self.op(e)
        elif kind == COMM:
            self.comm(e[1])
        elif kind == WAIT:
            nid = self.comm_of.get(id(e[1]))
            if nid is not None and nid not in self.waited:
                self.waited.append(nid)
        elif kind == SYNC:
            n = self.new_node(id=self.next_id, name="sync", kind=pb.KIND_SYNC, stream=self.host)
            self.next_id += 1
            if len(e) > 1:      # the compute stream: its last kernel and what it has waited for since
                on = ([] if self.last_compute is None else [self.last_compute]) + self.waited
            else:
                on = list(self.last_on.values())
            for nid in sorted(set(on)):
                n.deps.add(id=nid, kind=pb.DEP_SYNC)
            self.annotate(n)
        elif kind in (SPAN_IN, MARK_BEGIN):
            merged = {**self.current, **e[1]}
            self.stack.append(("span" if kind == SPAN_IN else "mark", e[1], merged))
            self.current = merged
        elif kind in (SPAN_OUT, MARK_END):
            want = "span" if kind == SPAN_OUT else "mark"
            for i in range(len(self.stack) - 1, -1, -1):
                if self.stack[i][0] == want and (kind == SPAN_OUT or self.stack[i][1] == e[1]):
                    del self.stack[i]
                    break
            else:
                self.dropped["ex_situ_annotation_end_without_begin"] += 1
            self.current = self.stack[-1][2] if self.stack else {}
        elif kind == REGION_IN:
            self.region_in(e[1])
        elif kind == REGION_OUT:
            self.region_out(e[1])
        elif kind == REPEAT:
            self.repeat(e[1], e[2])
        elif kind == SLOT:
            raise EchoError(f"{self.where}: internal: unfilled placeholder in a flat event list")

    def annotate(self, n: pb.Node) -> None:
        annotations.apply(n, self.current)

    def op(self, e: tuple) -> None:
        nid = self.next_id
        launch = self.new_node(id=nid, name="launch", kind=pb.KIND_LAUNCH, stream=self.host)
        launch.cpu.op = e[1]
        n = self.new_node(id=nid + 1, name=e[1], kind=pb.KIND_COMPUTE, stream=self.compute)
        n.deps.add(id=nid, kind=pb.DEP_LAUNCH)
        self.next_id += 2
        c = n.compute
        c.op = e[1]
        c.kernel_class = kernel_class(e[1])
        c.shapes = e[2]
        c.dtypes = e[3]
        if e[4]:
            n.attrs["out_shapes"] = e[4]
        if len(e) > 5 and e[5]:
            n.attrs[CAUSAL_ATTR] = e[5]
        for w in self.waited:
            n.deps.add(id=w, kind=pb.DEP_SYNC)
        self.waited = []
        self.annotate(n)
        self.last_compute = nid + 1
        self.last_on[self.compute] = nid + 1

    def comm(self, rec: CommRecord) -> None:
        original = rec
        rec = replace(rec, index=len(self.records))
        key = self.key_of(rec)
        self.records.append(rec)
        self.keys.append(key)
        self.keys_used[key] = len(rec.group_ranks)
        sname = f"{key}:{rec.op}:{rec.peer}" if rec.is_p2p else key
        sid = self.comm_streams.get(sname)
        if sid is None:
            sid = self.gb.stream(pb.STREAM_GPU_COMM, COMM_STREAM_PREFIX + sname, device=0)
            self.comm_streams[sname] = sid
        nid = self.next_id
        launch = self.new_node(id=nid, name="launch", kind=pb.KIND_LAUNCH, stream=self.host)
        launch.cpu.op = f"c10d::{rec.op}"
        deps: list[tuple[int, int]] = [(nid, pb.DEP_LAUNCH)]
        if self.last_compute is not None:
            deps.append((self.last_compute, pb.DEP_SYNC))
        deps.extend((w, pb.DEP_SYNC) for w in self.waited)
        if rec.is_p2p:
            assert rec.peer is not None
            send = rec.op == "send"
            n = self.new_node(id=nid + 1, name=rec.op, stream=sid,
                              kind=pb.KIND_SEND if send else pb.KIND_RECV)
            pkey = (key, rec.peer, send)
            n.p2p.group = key
            n.p2p.peer = rec.peer
            n.p2p.bytes = rec.in_bytes if send else rec.out_bytes
            n.p2p.tag = rec.tag
            n.p2p.seq = self.p2p_seq.get(pkey, 0)
            self.p2p_seq[pkey] = n.p2p.seq + 1
        else:
            coll = COLLECTIVE_BY_NAME.get(rec.op)
            if coll is None:
                raise EchoError(f"{self.where}: unknown collective {rec.op!r} in the recording")
            n = self.new_node(id=nid + 1, name=rec.op, stream=sid, kind=pb.KIND_COLLECTIVE)
            c = n.collective
            c.type = coll
            c.group = key
            c.in_bytes = rec.in_bytes
            c.out_bytes = rec.out_bytes
            c.dtype = rec.dtype
            c.seq = self.coll_seq.get(key, 0)
            self.coll_seq[key] = c.seq + 1
            if rec.root is not None:
                c.root = rec.root
        self.next_id += 2
        for d, dk in deps:
            n.deps.add(id=d, kind=dk)
        n.attrs["timing"] = "placeholder"
        self.annotate(n)
        self.annotate(launch)
        self.comm_of[id(original)] = n.id
        self.last_on[sid] = n.id

    # -- repeated regions ------------------------------------------------------------------
    def slots(self, with_streams: bool) -> list[int | None]:
        """The build state a region's nodes can depend on from outside, as slots: every
        waited communication node, the last compute node and, for a region that holds a
        host sync (which waits for every device stream), the last node of every stream."""
        out: list[int | None] = [*self.waited, self.last_compute]
        if with_streams:
            out.extend(self.last_on.get(s) for s in self.streams_seen())
        return out

    def streams_seen(self) -> list[int]:
        return [self.compute, *sorted(self.comm_streams.values())]

    def shape(self, with_streams: bool) -> tuple:
        """What must agree between a region's first run and a replay for the replay to be a
        copy: how many waits are pending, which slots are empty, which are equal."""
        vals = self.slots(with_streams)
        first: dict[int, int] = {}
        pattern = tuple(-1 if v is None else first.setdefault(v, i) for i, v in enumerate(vals))
        return len(self.waited), pattern, tuple(self.streams_seen()) if with_streams else ()

    def region_in(self, region: Region) -> None:
        if self.compact and self.open_body is None:
            self.open_region(region, dict(region.labels))

    def open_region(self, region: Region, labels: dict[str, Any]) -> None:
        """Start the body of ``region`` for the current build state, unless one exists."""
        syncs = region.facts()[0]
        shape = self.shape(syncs)
        key = (id(region), shape)
        if key in self.bodies:
            return
        body = _Body(first_id=self.next_id, pos=len(self.store), current=dict(self.current),
                     stack_len=len(self.stack), entry=self.slots(syncs), coll_seq=dict(self.coll_seq),
                     p2p_seq=dict(self.p2p_seq), rec_start=len(self.records), syncs=syncs,
                     shape=shape, label_values=labels)
        self.open_body = (id(region), body)
        self.bodies[key] = body

    def region_out(self, region: Region) -> None:
        if self.open_body is None or self.open_body[0] != id(region):
            return
        _, body = self.open_body
        self.open_body = None
        body.last_id = self.next_id - 1
        body.ok = self.region_summary(body)

    def region_summary(self, body: _Body) -> bool:
        """Fill in what a copy needs from the body; False when a copy of it cannot be told
        by slots (the region reads build state this summary does not capture)."""
        if body.last_id < body.first_id or self.current != body.current or len(self.stack) != body.stack_len:
            return False
        if body.syncs and tuple(self.streams_seen()) != body.shape[2]:
            return False
        slot_of: dict[int, int] = {}
        for i, v in enumerate(body.entry):
            if v is not None:
                slot_of.setdefault(v, i)
        for n in self.store[body.pos:]:
            for d in n.deps:
                if d.id < body.first_id:
                    slot = slot_of.get(d.id)
                    if slot is None:
                        return False
                    body.ext_deps.append((n.id, slot, d.kind))
            if n.kind in (pb.KIND_COMPUTE, pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV):
                body.wrote[n.stream] = n.id - body.first_id
            if n.HasField("annotations"):
                a = n.annotations
                for label, name in _LABEL_FIELD.items():
                    if a.HasField(name):
                        body.labels.setdefault(label, set()).add(getattr(a, name))
        for v in [*self.waited, self.last_compute]:
            if v is None:
                body.exit.append((False, -1))
            elif v >= body.first_id:
                body.exit.append((True, v - body.first_id))
            elif v in slot_of:
                body.exit.append((False, slot_of[v]))
            else:
                return False
        body.coll_counts = {k: v - body.coll_seq.get(k, 0) for k, v in self.coll_seq.items()
                            if v != body.coll_seq.get(k, 0)}
        body.p2p_counts = {k: v - body.p2p_seq.get(k, 0) for k, v in self.p2p_seq.items()
                           if v != body.p2p_seq.get(k, 0)}
        return True

    def repeat(self, region: Region, labels: dict[str, Any]) -> None:
        """A replay of ``region`` with annotation values ``labels``: an instance of the body
        built for the same build state when there is one, else copies of its events (which
        become that state's body)."""
        syncs, unwaited = region.facts()
        self.unwaited_extra += unwaited
        body = self.bodies.get((id(region), self.shape(syncs))) if self.open_body is None else None
        deltas = self.deltas(body, labels) if body is not None else None
        if body is None or deltas is None:
            opened = False
            if self.compact and self.open_body is None and body is None:
                self.open_region(region, {**region.labels, **labels})
                opened = self.open_body is not None
            subs = {k: (region.labels.get(k), v) for k, v in labels.items()}
            for e in copied(relabel(region.events, subs)):
                self.event(e)
            if opened:
                self.region_out(region)
            return
        self.instance(body, region, deltas)

    def instance(self, body: _Body, region: Region, deltas: dict[str, int]) -> None:
        """Record a copy of ``body`` here and move the build state past it."""
        entry = self.slots(body.syncs)
        off = self.next_id - body.first_id
        if body.block is None:
            body.block = pb.RepeatBlock(id=sum(1 for b in self.bodies.values() if b.block) + 1,
                                        name=_block_name(body.label_values),
                                        first_node=body.first_id, last_node=body.last_id)
        inst = body.block.instances.add(id_offset=off)
        for k, n in sorted(body.coll_counts.items()):
            now, then = self.coll_seq.get(k, 0), body.coll_seq.get(k, 0)
            if now != then:
                inst.seq_offsets[k] = now - then
            self.coll_seq[k] = now + n
        for pk, n in sorted(body.p2p_counts.items()):
            now, then = self.p2p_seq.get(pk, 0), body.p2p_seq.get(pk, 0)
            if now != then:
                inst.seq_offsets[p2p_seq_key(*pk)] = now - then
            self.p2p_seq[pk] = now + n
        for name, delta in sorted(deltas.items()):
            inst.annotation_deltas[name] = delta
        for node_id, slot, kind in body.ext_deps:
            target = entry[slot]
            assert target is not None
            inst.deps.add(node=node_id, id=target, kind=kind)
        # The copy's calls are the body's (same groups, same sizes): listed again, as they are.
        n_recs = sum(body.coll_counts.values()) + sum(body.p2p_counts.values())
        self.records.extend(self.records[body.rec_start:body.rec_start + n_recs])
        self.keys.extend(self.keys[body.rec_start:body.rec_start + n_recs])
        base = self.next_id
        self.next_id += body.last_id - body.first_id + 1
        exit_vals = [base + rel if internal else (entry[rel] if rel >= 0 else None)
                     for internal, rel in body.exit]
        self.waited = [v for v in exit_vals[:-1] if v is not None]
        self.last_compute = exit_vals[-1]
        for sid, rel in body.wrote.items():
            self.last_on[sid] = base + rel

    def deltas(self, body: _Body, labels: dict[str, Any]) -> dict[str, int] | None:
        """The annotation deltas of a replay of ``body`` with ``labels``, or None when it
        cannot be an instance."""
        if not body.ok or self.current != body.current or len(self.stack) != body.stack_len:
            return None
        out: dict[str, int] = {}
        for k, v in labels.items():
            old = body.label_values.get(k)
            if old == v:
                continue
            name = _LABEL_FIELD.get(k)
            if name is None or not isinstance(v, int) or not isinstance(old, int):
                return None
            seen = body.labels.get(k)
            if seen:
                if seen != {old}:
                    return None
                out[name] = v - old
        return out


def _unwaited(events: list) -> int:
    """Communication calls of ``events`` that no wait of ``events`` waits for."""
    waits = {id(e[1]) for e in events if e[0] == WAIT}
    return sum(1 for e in events if e[0] == COMM and id(e[1]) not in waits)


def _block_name(labels: dict[str, Any]) -> str:
    return "region " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items(), key=lambda kv: kv[0]))


def build_graph(events: list[tuple], key_of: Callable[[CommRecord], str], *, graph_id: str,
                where: str, compact: bool = True) -> DirectResult:
    """The device graph of one rank from its event list (see the module docstring).
    ``compact``: replayed regions become instances of repeat blocks where their entry state
    agrees with the first run (else, and when False, their events are built as copies)."""
    return _Build(key_of, graph_id, where, compact=compact).run(events)
