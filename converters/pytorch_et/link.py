"""Linking host execution traces to a Job read from Kineto traces of the same run.

Pairing: a host trace goes to the rank in its file name, else to the rank its own
collectives state (``record_param_comms`` carries it), else, when the counts are equal, by
order. Host traces of ranks the Job does not have are left out and counted. A partial
Kineto job renumbers its ranks and keeps the original in the graph header attr
``kineto.rank``, which pairing follows. Only the host ops of the Job's ``ProfilerStep`` are
linked when the host trace has that step too.

Per rank, host ops are linked to Kineto CPU op nodes:

1. by record-function id, when the ids agree: the relation ``et rf_id == kineto id + d`` is
   tried for d in -2..2 and kept when at least 80 % of the candidates have equal names
   (torch 2.13 writes Kineto ``Record function id`` == ET ``rf_id``; HTA's 2023
   ``benchmark_simple_add`` pair has ET ``rf_id`` == ``Ev Idx`` + 1; the 2023 DLRM and
   ``linear`` pairs agree on no offset);
2. what ids leave unlinked (everything, when no offset fits) by aligning the op-name sequences
   thread by thread (:mod:`.align`): ET threads are paired with Kineto CPU streams by the
   multiset overlap of their op names.

A linked Kineto node gains the host trace's input shapes/types (when it has none), the ET
node id (``et_id``) and tensor ids (``et_in_tensors``/``et_out_tensors``); a Kineto
communication node whose host op is linked gains dtype, bytes and ``record_param_comms``
attributes it lacks. ``## process_group:init ##`` definitions fill in group descriptions and
add groups the Kineto trace did not list. Manifest attrs ``host_et_linked`` and
``host_et_link_method`` report the result; ``dropped`` counts ``host_et_unlinked_cpu_ops``
(Kineto CPU ops without a host op), ``host_et_unlinked_et_ops`` (host ops in the window without
a Kineto op) and ``host_et_linked_by_sequence`` (links that rest on name alignment alone).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from echo_et.converters.pytorch_et.align import align
from echo_et.converters.pytorch_et.comms import RECV, SEND, CommCall, PgDef
from echo_et.converters.pytorch_et.schema import PG_INIT_NAME, EtOp, causal_of
from echo_et.converters.pytorch_et.trace import MALFORMED, HostTrace, expand_paths, load
from echo_et.errors import EchoError
from echo_et.ir import Graph, Job, pb
from echo_et.ir.attention import CAUSAL_ATTR

_RF_DELTAS = (0, 1, -1, 2, -2)
_RF_MIN_AGREEMENT = 0.8
_COMM_KINDS = (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV, pb.KIND_COMM_UNKNOWN)


@dataclass
class LinkStats:
    linked: int = 0
    by_sequence: int = 0
    unlinked_cpu: int = 0
    unlinked_et: int = 0
    comm_filled: int = 0
    shared_graph_skipped: int = 0
    unpaired: int = 0
    methods: dict[int, str] = field(default_factory=dict)


def link(job: Job, host_et_paths: list[Path]) -> Job:
    """A new Job: ``job`` (from Kineto) with the host traces' information linked in."""
    files = expand_paths(host_et_paths)
    traces = [load(p) for p in files]
    out = job.copy()
    pairs, unpaired = pair_traces(out, traces)
    stats = LinkStats(unpaired=unpaired)
    done: dict[str, int] = {}
    step = out.manifest.step if out.manifest.step >= 0 else None
    for rank, trace in sorted(pairs.items()):
        gid = out.binding(rank).graph
        if gid in done:
            stats.shared_graph_skipped += 1
            continue
        done[gid] = rank
        graph = out.graph(gid)
        window = trace.steps.get(step) if step is not None else None
        try:
            stats.methods[rank] = link_graph(graph, trace, window, stats)
        except MALFORMED as e:
            raise EchoError(f"{trace.path}: malformed host execution trace "
                            f"({type(e).__name__}: {str(e)[:120]})") from None
    _merge_groups(out, traces)
    m = out.manifest
    m.attrs["host_et_linked"] = str(stats.linked)
    m.attrs["host_et_link_method"] = ",".join(f"{r}:{v}" for r, v in sorted(stats.methods.items()))
    m.provenance.inputs.extend(p.name for p in files)
    for reason, count in (("host_et_unlinked_cpu_ops", stats.unlinked_cpu),
                          ("host_et_unlinked_et_ops", stats.unlinked_et),
                          ("host_et_linked_by_sequence", stats.by_sequence),
                          ("host_et_comm_filled", stats.comm_filled),
                          ("host_et_shared_graph_skipped", stats.shared_graph_skipped),
                          ("host_et_traces_unpaired", stats.unpaired)):
        if count:
            m.dropped[reason] = m.dropped.get(reason, 0) + count
    out.invalidate()
    return out


def pair_traces(job: Job, traces: list[HostTrace]) -> tuple[dict[int, HostTrace], int]:
    """Job rank -> host trace (see the module docstring for the order of rules), and how many
    host traces named a rank the Job does not have (left out)."""
    ranks = job.ranks()
    original = _original_ranks(job)
    for rule in (lambda t: t.name_rank, lambda t: t.comm_rank()):
        claimed = [rule(t) for t in traces]
        if any(r is None for r in claimed):
            continue
        got: dict[int, HostTrace] = {}
        for t, r in zip(traces, claimed, strict=True):
            jr = original.get(r)
            if jr is not None:
                if jr in got:
                    raise EchoError(f"{t.path}: rank {r} is also claimed by {got[jr].path.name}")
                got[jr] = t
        if got:
            return got, len(traces) - len(got)
    if len(traces) == len(ranks):
        return dict(zip(ranks, traces, strict=True)), 0
    if len(traces) < len(ranks):
        raise EchoError(f"{traces[0].path}: cannot tell which of ranks {ranks[:8]} the "
                        f"{len(traces)} host trace(s) belong to (put the rank in the file name, "
                        "e.g. rank3.et.json)")
    raise EchoError(f"{len(traces)} host traces for a job of {len(ranks)} traced ranks, and "
                    "their ranks are not in their file names")


def _original_ranks(job: Job) -> dict[int, int]:
    """Rank as the traces numbered it -> rank in the job (Kineto renumbers partial jobs and
    keeps the original in the graph header attr ``kineto.rank``)."""
    out: dict[int, int] = {}
    for b in job.manifest.bindings:
        r = job.graph(b.graph).header.attrs.get("kineto.rank", "")
        shared = sum(1 for x in job.manifest.bindings if x.graph == b.graph) > 1
        out[int(r) if r.lstrip("-").isdigit() and not shared else b.rank] = b.rank
    return out


def _et_ops(trace: HostTrace, window: tuple[int, int] | None) -> list[EtOp]:
    return [op for op in trace.ops
            if not op.is_root and op.name != PG_INIT_NAME
            and (window is None or window[0] <= op.id <= window[1])]


def link_graph(graph: Graph, trace: HostTrace, window: tuple[int, int] | None,
               stats: LinkStats) -> str:
    """Link one rank's graph in place (the caller owns the copy); returns the method used."""
    ops = _et_ops(trace, window)
    cands = [n for n in graph.nodes if n.kind == pb.KIND_CPU_OP]
    pairs, method = _by_rf_id(cands, ops)
    if pairs is None:
        pairs, method = [], ""
    done_k = {n.id for n, _ in pairs}
    done_e = {op.id for _, op in pairs}
    rest = _by_sequence([n for n in cands if n.id not in done_k],
                        [op for op in ops if op.id not in done_e])
    if rest or not method:
        method = f"{method}+sequence" if method else "sequence"
    stats.by_sequence += len(rest)
    pairs += rest
    linked: dict[int, EtOp] = {}
    for node, op in pairs:
        _annotate(node, op)
        linked[node.id] = op
    stats.linked += len(pairs)
    stats.unlinked_cpu += len(cands) - len(pairs)
    stats.unlinked_et += len(ops) - len(pairs)
    window_calls = [c for oid, c in trace.comms.items()
                    if window is None or window[0] <= oid <= window[1]]
    anchors = _anchor_of(trace, {op.id: op for op in trace.ops})
    stats.comm_filled += _fill_comms(graph, linked, anchors, window_calls)
    return method


def _by_rf_id(cpu: list[pb.Node], ops: list[EtOp]):
    """Pairs by record-function id when one offset makes (nearly) all names agree."""
    by_rf: dict[int, EtOp] = {}
    for op in ops:
        if op.rf_id is not None:
            by_rf.setdefault(op.rf_id, op)
    cands = [n for n in cpu if "rf_id_source" in n.attrs]
    if not cands or not by_rf:
        return None, ""
    keys = [(n.cpu.rf_id, n.name) for n in cands]
    best, best_hits = 0, -1
    for d in _RF_DELTAS:
        hits = 0
        for rf, name in keys:
            op = by_rf.get(rf + d)
            hits += op is not None and op.name == name
        if hits > best_hits:
            best, best_hits = d, hits
    if best_hits < _RF_MIN_AGREEMENT * min(len(cands), len(by_rf)):
        return None, ""
    pairs = []
    used: set[int] = set()
    for n in cands:
        op = by_rf.get(n.cpu.rf_id + best)
        if op is not None and op.name == n.name and op.id not in used:
            used.add(op.id)
            pairs.append((n, op))
    source = cands[0].attrs["rf_id_source"]
    return pairs, f"{source}{best:+d}" if best else source


def _by_sequence(cpu: list[pb.Node], ops: list[EtOp]) -> list[tuple[pb.Node, EtOp]]:
    """Pairs by aligning op names, each ET thread with the Kineto stream it shares most with."""
    k_threads: dict[int, list[pb.Node]] = defaultdict(list)
    for n in cpu:
        k_threads[n.stream].append(n)
    for v in k_threads.values():
        v.sort(key=lambda n: n.id)
    e_threads: dict[int, list[EtOp]] = defaultdict(list)
    for op in ops:
        e_threads[op.tid].append(op)
    overlap = []
    k_names = {s: Counter(n.name for n in v) for s, v in k_threads.items()}
    for tid, v in e_threads.items():
        ec = Counter(op.name for op in v)
        for s, kc in k_names.items():
            common = sum((ec & kc).values())
            if common:
                overlap.append((common, tid, s))
    overlap.sort(key=lambda x: (-x[0], x[1], x[2]))
    pairs: list[tuple[pb.Node, EtOp]] = []
    used_t: set[int] = set()
    used_s: set[int] = set()
    for _, tid, s in overlap:
        if tid in used_t or s in used_s:
            continue
        used_t.add(tid)
        used_s.add(s)
        ev, kv = e_threads[tid], k_threads[s]
        for i, j in align([op.name for op in ev], [n.name for n in kv]):
            pairs.append((kv[j], ev[i]))
    return pairs


def _annotate(node: pb.Node, op: EtOp) -> None:
    if node.WhichOneof("payload") == "cpu":
        if not node.cpu.shapes and op.in_shapes:
            node.cpu.shapes = op.in_shapes
        if not node.cpu.dtypes and op.in_types:
            node.cpu.dtypes = op.in_types
    elif op.in_shapes and "et_shapes" not in node.attrs:
        node.attrs["et_shapes"] = op.in_shapes
    node.attrs["et_id"] = str(op.id)
    if CAUSAL_ATTR not in node.attrs and op.in_values and (causal := causal_of(op)):
        node.attrs[CAUSAL_ATTR] = causal
    if op.rf_id is not None:
        node.attrs["et_rf_id"] = str(op.rf_id)
    if op.in_tensors:
        node.attrs["et_in_tensors"] = ",".join(str(t[0]) for t in op.in_tensors)
    if op.out_tensors:
        node.attrs["et_out_tensors"] = ",".join(str(t[0]) for t in op.out_tensors)


def _anchor_of(trace: HostTrace, by_id: dict[int, EtOp]) -> dict[int, CommCall]:
    """ET op id -> the communication call it belongs to: the anchor itself, the ops nested in
    it (``nccl:*`` under ``record_param_comms``) and the ``c10d::*`` ops around it."""
    out: dict[int, CommCall] = {}
    for op in trace.ops:           # ids ascend, so a parent is resolved before its children
        call = trace.comms.get(op.id)
        if call is None and op.parent != op.id:
            call = out.get(op.parent)
        if call is not None:
            out[op.id] = call
    for oid, call in trace.comms.items():
        p = by_id[oid].parent
        while p in by_id and p not in out and by_id[p].name.startswith("c10d::"):
            out[p] = call
            p = by_id[p].parent
    return out


def _fill_comms(graph: Graph, linked: dict[int, EtOp], anchor_of: dict[int, CommCall],
                calls: list[CommCall]) -> int:
    """Give Kineto communication nodes what the host trace knows and they lack. A node finds
    its call through the host op that issued it (launch / nesting deps to a linked op); the
    rest are matched, in order, to the calls of the same type that no node claimed."""
    if not calls:
        return 0
    by_id = {n.id: n for n in graph.nodes}
    comm_nodes = [n for n in graph.nodes if n.kind in _COMM_KINDS]
    found: dict[int, CommCall] = {}
    for n in comm_nodes:
        call = _call_for(n, by_id, linked, anchor_of)
        if call is not None:
            found[n.id] = call
    claimed = {id(c) for c in found.values()}
    left_nodes = [n for n in comm_nodes if n.id not in found]
    left_calls = [c for c in calls if id(c) not in claimed]
    if left_nodes and left_calls:
        for i, j in align([_comm_kind(n) for n in left_nodes], [c.kind for c in left_calls],
                          second_pass=False):
            found[left_nodes[i].id] = left_calls[j]
    filled = 0
    for n in comm_nodes:
        call = found.get(n.id)
        if call is not None:
            filled += _fill_one(n, call)
    return filled


def _comm_kind(n: pb.Node) -> int | str:
    if n.kind == pb.KIND_COLLECTIVE:
        return n.collective.type
    return {pb.KIND_SEND: SEND, pb.KIND_RECV: RECV}.get(n.kind, "unknown")


def _fill_one(n: pb.Node, call: CommCall) -> bool:
    changed = False
    if n.kind == pb.KIND_COLLECTIVE:
        c = n.collective
        if not c.dtype and call.dtype:
            c.dtype, changed = call.dtype, True
        if not c.in_bytes and call.in_bytes:
            c.in_bytes, changed = call.in_bytes, True
        if not c.out_bytes and call.out_bytes:
            c.out_bytes, changed = call.out_bytes, True
    elif n.kind in (pb.KIND_SEND, pb.KIND_RECV) and not n.p2p.bytes and call.in_bytes:
        n.p2p.bytes, changed = call.in_bytes, True
    for k, v in call.attrs.items():
        if k not in n.attrs:
            n.attrs[k] = v
            changed = True
    n.attrs.setdefault("et_id", str(call.op_id))
    return changed


def _call_for(n: pb.Node, by_id, linked, anchor_of) -> CommCall | None:
    """Walk from a comm node through its launch and nesting parents to a linked host op."""
    op = linked.get(n.id)
    if op is not None and op.id in anchor_of:
        return anchor_of[op.id]
    seen = 0
    frontier = [d.id for d in n.deps if d.kind in (pb.DEP_LAUNCH, pb.DEP_CONTROL)]
    while frontier and seen < 32:
        nid = frontier.pop(0)
        seen += 1
        op = linked.get(nid)
        if op is not None and op.id in anchor_of:
            return anchor_of[op.id]
        parent = by_id.get(nid)
        if parent is not None:
            frontier.extend(d.id for d in parent.deps if d.kind in (pb.DEP_LAUNCH, pb.DEP_CONTROL))
    return None


def _merge_groups(job: Job, traces: list[HostTrace]) -> None:
    m = job.manifest
    defs: dict[str, PgDef] = {}
    for t in traces:
        for p in t.pg_defs:
            defs.setdefault(p.name, p)
    if not defs:
        return
    by_name = {g.name: g for g in m.groups}
    next_id = max((g.id for g in m.groups), default=0) + 1
    added = 0
    for name, p in sorted(defs.items()):
        g = by_name.get(name)
        members = p.members()
        if g is not None:
            if not g.desc and p.desc:
                g.desc = p.desc
            continue
        if not members or max(members) >= m.world_size:
            continue
        m.groups.add(id=next_id, name=name, desc=p.desc, ranks=members,
                     role=pb.ROLE_WORLD if len(members) == m.world_size else pb.ROLE_UNKNOWN)
        next_id += 1
        added += 1
    if added:
        m.attrs["host_et_groups_added"] = str(added)
