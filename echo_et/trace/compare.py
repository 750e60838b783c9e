"""Compare an ex-situ Job with a real run of the same workload, rank by rank.

What is compared (the ex-situ = in-situ test and ``benchmarks``):

- the communication sequence of each rank: (type, bytes, group role) of every collective
  and send/recv in issue order. In-situ it is read from the ``c10d::*`` host ops of the
  converted trace (one per call, in program order), their bytes from the collective node
  the Kineto reader made for them or, for send/recv, from the ``gloo:*`` span they started,
  and their group from the ``echo:group=<desc>`` span the workload put around the call
  (gloo traces do not say which group an op used). Ex-situ it is read from the Job's
  collective/send/recv nodes, the group role from the rank's binding;
- the host operators each rank ran, as a count per name, without what belongs to
  communication (c10d/gloo ops and everything inside them; the tracer's issue/wait nodes)
  and without the workload's ``echo:`` annotations.
"""

from __future__ import annotations

import json
from collections import Counter
from math import prod

from echo_et.ir import Graph, Job
from echo_et.ir.collectives import collective_word
from echo_et.ir.conventions import ISSUE_PREFIX
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.schema import COLLECTIVE_NAMES, ROLE_NAMES, pb
from echo_et.trace import annotations

Comm = tuple[str, int, str]  # (type name, bytes, group role/desc)

def _c10d_type(name: str) -> str | None:
    if not name.startswith("c10d::"):
        return None
    c = collective_word(name[len("c10d::"):])
    return COLLECTIVE_NAMES[c] if isinstance(c, int) else c


def _parents(graph: Graph) -> dict[int, int]:
    out = {}
    for n in graph.nodes:
        for d in n.deps:
            if d.kind == pb.DEP_CONTROL:
                out[n.id] = d.id
                break
    return out


def _in(a: pb.Node, b: pb.Node) -> bool:
    """``a`` starts inside ``b`` on the same stream."""
    return a.stream == b.stream and b.start_ns <= a.start_ns <= b.start_ns + b.duration_ns


def in_situ_comms(graph: Graph) -> list[Comm]:
    """The communication sequence of one rank of a converted real run (see module doc)."""
    nodes = sorted(graph.nodes, key=lambda n: n.id)
    parent = _parents(graph)
    comm_of_op: dict[int, pb.Node] = {}
    for n in nodes:
        if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV) and n.id in parent:
            comm_of_op[parent[n.id]] = n
    group_spans = []
    gloo_spans = []
    for n in nodes:
        parsed = annotations.parse(n.name)
        if parsed and "group" in parsed[1]:
            group_spans.append(n)
        elif n.name.startswith("gloo:"):
            gloo_spans.append(n)
    out: list[Comm] = []
    for n in nodes:
        typ = _c10d_type(n.name) if n.kind == pb.KIND_CPU_OP else None
        if typ is None:
            continue
        enclosing = [s for s in group_spans if _in(n, s)]
        group = str(annotations.parse(enclosing[-1].name)[1]["group"]) if enclosing else ""
        c = comm_of_op.get(n.id)
        if c is not None and c.kind == pb.KIND_COLLECTIVE:
            nbytes = int(c.collective.in_bytes)
        elif c is not None and c.kind in (pb.KIND_SEND, pb.KIND_RECV):
            nbytes = int(c.p2p.bytes)
        else:
            nbytes = _bytes_from_gloo(n, gloo_spans)
        out.append((typ, nbytes, group))
    return out


def _bytes_from_gloo(op: pb.Node, gloo_spans: list[pb.Node]) -> int:
    for s in gloo_spans:
        if _in(s, op):
            try:
                dims = json.loads(s.cpu.shapes)[0]
                dtype = json.loads(s.cpu.dtypes)[0]
            except (ValueError, IndexError, TypeError):
                return -1
            return prod(dims) * (dtype_size(str(dtype)) or 0)
    return -1


def comm_sequence(job: Job, rank: int) -> list[tuple]:
    """Every collective and P2P of ``rank`` in program order, with concrete group members:
    ("coll", type, key, members, in bytes, out bytes) or ("p2p", kind, key, peer rank,
    bytes). Two Jobs that agree on it issue the same communication on that rank."""
    out: list[tuple] = []
    for n in job.graph_of(rank).nodes:
        if n.kind == pb.KIND_COLLECTIVE:
            c = n.collective
            out.append(("coll", c.type, c.group, tuple(job.resolve_group(rank, c.group).ranks),
                        c.in_bytes, c.out_bytes))
        elif n.kind in (pb.KIND_SEND, pb.KIND_RECV):
            p = n.p2p
            out.append(("p2p", n.kind, p.group, job.resolve_group(rank, p.group).ranks[p.peer],
                        p.bytes))
    return out


def ex_situ_comms(job: Job, rank: int) -> list[Comm]:
    """The communication sequence of ``rank`` in an ex-situ Job, group as its role."""
    g = job.graph_of(rank)
    b = job.binding(rank)
    out: list[Comm] = []
    for n in sorted(g.nodes, key=lambda n: n.id):
        if n.kind == pb.KIND_COLLECTIVE:
            key = n.collective.group
            typ, nbytes = COLLECTIVE_NAMES[n.collective.type], int(n.collective.in_bytes)
        elif n.kind in (pb.KIND_SEND, pb.KIND_RECV):
            key = n.p2p.group
            typ, nbytes = ("send" if n.kind == pb.KIND_SEND else "recv"), int(n.p2p.bytes)
        else:
            continue
        pg = job.group(b.groups[key])
        role = ROLE_NAMES.get(pg.role, "")
        out.append((typ, nbytes, pg.desc if role in ("custom", "unknown") else role))
    return out


def in_situ_ops(graph: Graph) -> Counter:
    """Host operators of one rank of a real run, without communication and annotations.

    Communication-internal ops are those that start inside a ``c10d::*`` op or an
    ``echo:group=`` span (a communication call or wait of the workload) on its thread, or
    inside a ``gloo:*`` span on a gloo worker thread (a thread issuing no c10d op). Time
    containment, not the converter's nesting: an async ``gloo:send`` span on the caller's
    thread lasts until its wait and overlaps the ops issued meanwhile."""
    c10d_streams = {n.stream for n in graph.nodes if n.name.startswith("c10d::")}
    spans: dict[int, list[tuple[int, int]]] = {}
    for n in graph.nodes:
        parsed = annotations.parse(n.name)
        if n.name.startswith("c10d::") or (parsed and "group" in parsed[1]) or (
                n.name.startswith("gloo:") and n.stream not in c10d_streams):
            spans.setdefault(n.stream, []).append((n.start_ns, n.start_ns + n.duration_ns))
    out: Counter = Counter()
    for n in graph.nodes:
        if n.kind != pb.KIND_CPU_OP or n.name.startswith((annotations.PREFIX, "c10d::", "gloo:")):
            continue
        if any(a <= n.start_ns <= b for a, b in spans.get(n.stream, ())):
            continue
        out[n.name] += 1
    return out


def ex_situ_ops(graph: Graph) -> Counter:
    """Host operators of an ex-situ graph, without the tracer's issue nodes."""
    return Counter(n.name for n in graph.nodes
                   if n.kind == pb.KIND_CPU_OP and not n.name.startswith(ISSUE_PREFIX))


# -- operator sequences (meta-device traces against CPU traces) -----------------------------------
Op = tuple[str, str, str, tuple]  # (name, shapes, dtypes, (phase, layer, microbatch, stage))


def _notes(n: pb.Node) -> tuple:
    a = n.annotations
    return (a.phase, a.layer if a.HasField("layer") else None,
            a.microbatch if a.HasField("microbatch") else None,
            a.stage if a.HasField("stage") else None)


def kernel_ops(graph: Graph) -> list[Op]:
    """The operators of a rank that run kernels, in program order, with their argument shapes
    and types and their annotations.

    A device graph (a meta-device trace: compute nodes carry the dispatch-level operator)
    gives its compute nodes. A host graph (a CPU trace: nested operators) gives each
    operator that is dispatch-level, i.e. not composite (``echo_et.trace.ops.decomposed``)
    and not inside another dispatch-level operator, and that runs a kernel
    (``echo_et.trace.ops.runs_kernel``)."""
    from echo_et.trace.ops import KERNEL_NAMESPACES, decomposed, runs_kernel

    computes = [n for n in graph.nodes if n.kind == pb.KIND_COMPUTE and n.compute.op]
    if computes and not any(n.kind == pb.KIND_CPU_OP for n in graph.nodes):
        return [(n.compute.op, n.compute.shapes, n.compute.dtypes, _notes(n)) for n in computes]
    parent = _parents(graph)
    by_id = {n.id: n for n in graph.nodes}
    level: dict[int, bool] = {}   # node id -> it or an ancestor is a dispatch-level operator

    def inside(nid: int) -> bool:
        got = level.get(nid)
        if got is None:
            n = by_id[nid]
            here = n.name.startswith(KERNEL_NAMESPACES) and not decomposed(n.name)
            p = parent.get(nid)
            got = here or (p is not None and p in by_id and inside(p))
            level[nid] = got
        return got

    out: list[Op] = []
    for n in sorted(graph.nodes, key=lambda n: (n.start_ns, n.id)):
        if n.kind != pb.KIND_CPU_OP or not n.name.startswith(KERNEL_NAMESPACES) or decomposed(n.name):
            continue
        p = parent.get(n.id)
        if p is not None and p in by_id and inside(p):
            continue
        if runs_kernel(n.name):
            out.append((n.name, n.cpu.shapes, n.cpu.dtypes, _notes(n)))
    return out


def comm_ops(graph: Graph) -> list[tuple]:
    """Collectives and send/recv of a graph in node order: (kind, type or op, group key,
    bytes, peer, seq, annotations)."""
    out = []
    for n in graph.nodes:
        if n.kind == pb.KIND_COLLECTIVE:
            c = n.collective
            out.append(("collective", COLLECTIVE_NAMES.get(c.type, "?"), c.group, c.in_bytes,
                        c.out_bytes, c.seq, _notes(n)))
        elif n.kind in (pb.KIND_SEND, pb.KIND_RECV):
            p = n.p2p
            out.append(("send" if n.kind == pb.KIND_SEND else "recv", p.group, p.peer, p.bytes,
                        p.tag, p.seq, _notes(n)))
    return out
