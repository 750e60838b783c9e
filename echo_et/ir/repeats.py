"""Repeated blocks: work a graph stores once and runs many times (``GraphHeader.repeats``).

A traced step repeats most of its work: every micro-batch runs the same layers, forward and
backward. A :class:`~echo_et.ir.graph.Graph` may therefore store a *body* once (its nodes
``first_node..last_node``) and say where copies of it run (``RepeatInstance``: an id
offset, sequence-number offsets, annotation deltas and the copy's own dependencies on nodes
outside it). What the graph *means* is its expansion: the stored nodes and every copy, in
node-id order (``docs/formats.md``, "Repeated blocks").

This module is the one home of that meaning: how a copy is made from its body node
(:func:`copy_node`), the expansion as a stream (:func:`iter_expanded`, which holds the bodies
and one node per instance, never the expanded graph), the expanded node count, and the rules
a consistent set of blocks obeys (:func:`repeat_problems`, used by the checker).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from echo_et.ir.schema import pb

# Copies one graph may stand for, and the nodes its expansion may have: what a pass or an
# exporter that reads the expanded graph can hold in memory (about 0.7 KB a node: 16.7 million
# nodes is 12 GB), and what the simulator's per-item arrays of one rank hold easily. A
# full-size GPT stage with hundreds of micro-batches expands to a few hundred thousand.
MAX_INSTANCES = 1 << 20
MAX_EXPANDED_NODES = 1 << 24
ANNOTATION_DELTAS = ("layer", "microbatch", "stage")


def p2p_seq_key(group: str, peer: int, is_send: bool) -> str:
    """The ``seq_offsets`` key of a send or recv: one sequence per (group, peer, direction)."""
    return f"{group}/{peer}/{'send' if is_send else 'recv'}"


def seq_key(node: pb.Node) -> str | None:
    """The ``seq_offsets`` key that shifts ``node``'s sequence number, None for other kinds."""
    if node.kind == pb.KIND_COLLECTIVE:
        return node.collective.group
    if node.kind in (pb.KIND_SEND, pb.KIND_RECV):
        return p2p_seq_key(node.p2p.group, node.p2p.peer, node.kind == pb.KIND_SEND)
    return None


@dataclass(frozen=True)
class Body:
    """A block's body as the expansion needs it: the stored nodes and their id range."""

    block: pb.RepeatBlock
    nodes: tuple[pb.Node, ...]

    @property
    def first(self) -> int:
        return int(self.block.first_node)

    @property
    def last(self) -> int:
        return int(self.block.last_node)


def bodies(header: pb.GraphHeader, stored: Iterable[pb.Node], members: list[tuple[pb.Node, ...]] | None = None
           ) -> list[Body]:
    """Every block's body (its stored nodes in id order), in block order. ``members``: the
    bodies' nodes when known (:meth:`echo_et.ir.graph.Graph.bodies` keeps them)."""
    blocks = list(header.repeats)
    if not blocks:
        return []
    if members is not None:
        return [Body(b, m) for b, m in zip(blocks, members, strict=True)]
    ranges = sorted((int(b.first_node), int(b.last_node), k) for k, b in enumerate(blocks))
    starts = [r[0] for r in ranges]
    members: list[list[pb.Node]] = [[] for _ in blocks]
    for n in stored:
        j = bisect.bisect_right(starts, n.id) - 1
        if j >= 0 and n.id <= ranges[j][1]:
            members[ranges[j][2]].append(n)
    out = []
    for k, b in enumerate(blocks):
        nodes = sorted(members[k], key=lambda n: n.id)
        out.append(Body(b, tuple(nodes)))
    return out


def copy_node(body: Body, node: pb.Node, inst: pb.RepeatInstance,
              deps_of: dict[int, list[tuple[int, int]]] | None = None) -> pb.Node:
    """The copy of body node ``node`` that instance ``inst`` stands for (a new message).
    ``deps_of``: the instance's own dependencies by body node id (:func:`instance_deps`)."""
    out = pb.Node()
    out.CopyFrom(node)
    off = int(inst.id_offset)
    out.id = node.id + off
    if inst.time_offset_ns:
        out.start_ns = node.start_ns + inst.time_offset_ns
    first, last = body.first, body.last
    extra = (deps_of if deps_of is not None else instance_deps(inst)).get(node.id) or ()
    del out.deps[:]
    # The copy's own dependencies take the places of the body node's outside ones, in order
    # (the rest follow): a producer that lists them in that order gets the flat graph's
    # dependency order back.
    k = 0
    for d in node.deps:
        if first <= d.id <= last:
            out.deps.add(id=d.id + off, kind=d.kind)
        elif k < len(extra):
            out.deps.add(id=extra[k][0], kind=extra[k][1])
            k += 1
    for dep_id, kind in extra[k:]:
        out.deps.add(id=dep_id, kind=kind)
    if inst.seq_offsets:
        key = seq_key(node)
        if key is not None and key in inst.seq_offsets:
            if node.kind == pb.KIND_COLLECTIVE:
                out.collective.seq = node.collective.seq + inst.seq_offsets[key]
            else:
                out.p2p.seq = node.p2p.seq + inst.seq_offsets[key]
    if inst.annotation_deltas and node.HasField("annotations"):
        a, src = out.annotations, node.annotations
        for name, delta in inst.annotation_deltas.items():
            if name in ANNOTATION_DELTAS and src.HasField(name):
                setattr(a, name, getattr(src, name) + delta)
    return out


def instance_deps(inst: pb.RepeatInstance) -> dict[int, list[tuple[int, int]]]:
    """An instance's own dependencies, by the body node id whose copy has them."""
    out: dict[int, list[tuple[int, int]]] = {}
    for d in inst.deps:
        out.setdefault(int(d.node), []).append((int(d.id), int(d.kind)))
    return out


def _instance_stream(body: Body, nodes: Sequence[pb.Node], inst: pb.RepeatInstance, order: int
                     ) -> Iterator[tuple[int, int, pb.Node]]:
    deps_of = instance_deps(inst)
    off = int(inst.id_offset)
    for n in nodes:
        yield n.id + off, order, copy_node(body, n, inst, deps_of)


def iter_expanded(header: pb.GraphHeader, stored: Sequence[pb.Node],
                  kinds: Collection[int] | None = None, known: list[Body] | None = None) -> Iterator[pb.Node]:
    """The expanded graph's nodes in id order (only those of ``kinds`` when given): stored
    nodes as they are (the same messages), copies as new messages made one at a time.
    Holds the bodies, not the expansion."""
    blocks = known if known is not None else bodies(header, stored)
    if kinds is not None:
        stored = [n for n in stored if n.kind in kinds]
    if not blocks:
        yield from stored
        return
    if all(stored[i].id < stored[i + 1].id for i in range(len(stored) - 1)):
        base: Iterable[pb.Node] = stored
    else:
        base = sorted(stored, key=lambda n: n.id)
    streams: list[Iterator[tuple[int, int, pb.Node]]] = [((n.id, 0, n) for n in base)]
    order = 1
    for body in blocks:
        nodes = body.nodes if kinds is None else [n for n in body.nodes if n.kind in kinds]
        if not nodes:
            continue
        for inst in body.block.instances:
            streams.append(_instance_stream(body, nodes, inst, order))
            order += 1
    for _, _, node in heapq.merge(*streams, key=lambda t: (t[0], t[1])):
        yield node


def expand_into(out: Any, header: pb.GraphHeader, stored: Sequence[pb.Node],
                known: list[Body] | None = None) -> None:
    """Append the expanded graph's nodes, in id order, to ``out`` (a repeated Node field):
    what :func:`iter_expanded` yields, built in bulk (a copy is made in place in ``out``,
    its dependencies shifted where they are, the order of whole runs sorted once)."""
    blocks = known if known is not None else bodies(header, stored)
    in_body = {n.id for b in blocks for n in b.nodes}
    # Runs in id order: a stored node outside every body, a body, or an instance's copies.
    runs: list[tuple[int, int, Any, Any]] = [(n.id, 0, n, None) for n in stored if n.id not in in_body]
    for body in blocks:
        if body.nodes:
            runs.append((body.nodes[0].id, 1, body, None))
            for inst in body.block.instances:
                runs.append((body.nodes[0].id + int(inst.id_offset), 2, body, inst))
    runs.sort(key=lambda r: r[0])
    plans = {id(b): _copy_plan(b) for b in blocks}
    add = out.add
    for _, what, ref, inst in runs:
        if what == 0:
            add().CopyFrom(ref)
        elif what == 1:
            for n in ref.nodes:
                add().CopyFrom(n)
        else:
            _append_copies(add, ref, inst, plans[id(ref)])


def _copy_plan(body: Body) -> list[tuple[str | None, bool, tuple[str, ...]]]:
    """Per body node: its seq_offsets key, whether it has outside dependencies, and the
    annotations it carries that a delta may shift."""
    first, last = body.first, body.last
    plan = []
    for n in body.nodes:
        outside = any(not first <= d.id <= last for d in n.deps)
        ann = tuple(a for a in ANNOTATION_DELTAS if n.HasField("annotations") and n.annotations.HasField(a))
        plan.append((seq_key(n), outside, ann))
    return plan


def _append_copies(add, body: Body, inst: pb.RepeatInstance, plan) -> None:
    off = int(inst.id_offset)
    t_off = inst.time_offset_ns
    seqs = dict(inst.seq_offsets)
    deltas = {k: v for k, v in inst.annotation_deltas.items() if k in ANNOTATION_DELTAS}
    deps_of = instance_deps(inst)
    for n, (key, outside, ann) in zip(body.nodes, plan, strict=True):
        out = add()
        out.CopyFrom(n)
        out.id = n.id + off
        if t_off:
            out.start_ns = n.start_ns + t_off
        if outside or n.id in deps_of:
            tmp = copy_node(body, n, inst, deps_of)
            del out.deps[:]
            out.deps.extend(tmp.deps)
        else:
            for d in out.deps:
                d.id += off
        if key is not None and key in seqs:
            if n.kind == pb.KIND_COLLECTIVE:
                out.collective.seq = n.collective.seq + seqs[key]
            else:
                out.p2p.seq = n.p2p.seq + seqs[key]
        if deltas and ann:
            a = out.annotations
            for name in ann:
                if name in deltas:
                    setattr(a, name, getattr(n.annotations, name) + deltas[name])


def expanded_count(header: pb.GraphHeader, stored: Sequence[pb.Node], known: list[Body] | None = None) -> int:
    """Nodes of the expanded graph, without expanding it."""
    if not header.repeats:
        return len(stored)
    blocks = known if known is not None else bodies(header, stored)
    return len(stored) + sum(len(b.nodes) * len(b.block.instances) for b in blocks)


def repeat_problems(header: pb.GraphHeader, stored: Sequence[pb.Node], known: list[Body] | None = None
                    ) -> list[str]:
    """What makes the blocks inconsistent, one message per problem naming the block (empty:
    the expansion is well defined). Rules: a body holds at least one stored node; ids are
    >= 1 and unique; 1 <= instances <= MAX_INSTANCES; every copy lies after its body and
    clear of stored nodes, bodies and other copies; an instance's dependency names a body
    node and a node that exists and is not in the same copy; seq_offsets and annotation
    deltas name keys the body uses."""
    blocks = list(header.repeats)
    if not blocks:
        return []
    problems: list[str] = []
    ids = sorted(n.id for n in stored)
    seen_ids: set[int] = set()
    for b in blocks:
        where = f"repeat block {b.id} ({b.name or 'unnamed'})"
        if b.id < 1 or b.id in seen_ids:
            problems.append(f"{where}: block id must be >= 1 and unique")
        seen_ids.add(b.id)
        if b.first_node > b.last_node:
            problems.append(f"{where}: body first_node {b.first_node} > last_node {b.last_node}")
        n_inst = len(b.instances)
        if n_inst < 1 or n_inst > MAX_INSTANCES:
            problems.append(f"{where}: {n_inst} instances (must be 1..{MAX_INSTANCES})")
    if problems:
        return problems
    all_bodies = known if known is not None else bodies(header, stored)
    spans: list[tuple[int, int, str]] = []     # occupied id ranges: (lo, hi, what)
    total = len(stored)
    for body in all_bodies:
        b = body.block
        where = f"repeat block {b.id} ({b.name or 'unnamed'})"
        if not body.nodes:
            problems.append(f"{where}: its body {b.first_node}..{b.last_node} holds no stored node")
            continue
        spans.append((b.first_node, b.last_node, f"{where} body"))
        total += len(body.nodes) * len(b.instances)
        keys = {k for n in body.nodes if (k := seq_key(n)) is not None}
        body_ids = {n.id for n in body.nodes}
        for k, inst in enumerate(b.instances):
            lo, hi = b.first_node + inst.id_offset, b.last_node + inst.id_offset
            if inst.id_offset < 1:
                problems.append(f"{where}, instance {k}: id_offset {inst.id_offset} (must be > 0: "
                                "a copy comes after its body; a block cannot repeat itself in place)")
                continue
            spans.append((lo, hi, f"{where} instance {k}"))
            for key in inst.seq_offsets:
                if key not in keys:
                    problems.append(f"{where}, instance {k}: seq_offsets names {key!r}, which no "
                                    "body node uses")
            for name in inst.annotation_deltas:
                if name not in ANNOTATION_DELTAS:
                    problems.append(f"{where}, instance {k}: annotation delta {name!r} (known: "
                                    f"{', '.join(ANNOTATION_DELTAS)})")
            for d in inst.deps:
                if d.node not in body_ids:
                    problems.append(f"{where}, instance {k}: dependency of node {d.node}, which is "
                                    "not in the body")
                elif lo <= d.id <= hi:
                    problems.append(f"{where}, instance {k}: node {d.node} depends on {d.id}, inside "
                                    "its own copy (the block refers to itself; body dependencies "
                                    "are copied already)")
            if len(problems) > 50:
                return problems
    if total > MAX_EXPANDED_NODES:
        problems.append(f"repeat blocks expand to {total} nodes (at most {MAX_EXPANDED_NODES})")
    spans.sort()
    for (lo1, hi1, w1), (lo2, hi2, w2) in zip(spans, spans[1:], strict=False):
        if lo2 <= hi1:
            problems.append(f"{w2} (ids {lo2}..{hi2}) overlaps {w1} (ids {lo1}..{hi1})")
    for lo, hi, w in spans:
        if w.endswith(" body"):
            continue
        j = bisect.bisect_left(ids, lo)
        if j < len(ids) and ids[j] <= hi:
            problems.append(f"{w} (ids {lo}..{hi}) overlaps stored node {ids[j]}")
    if problems:
        return problems
    # Dependencies of copies must name nodes of the expanded graph.
    idset = set(ids)
    inst_spans = sorted((lo, hi) for lo, hi, w in spans if not w.endswith(" body"))
    starts = [s[0] for s in inst_spans]
    offsets_of: dict[tuple[int, int], tuple[Body, int]] = {}
    for body in all_bodies:
        for inst in body.block.instances:
            offsets_of[(body.first + inst.id_offset, body.last + inst.id_offset)] = (body, int(inst.id_offset))
    body_id_sets = {id(b): {n.id for n in b.nodes} for b in all_bodies}
    for body in all_bodies:
        where = f"repeat block {body.block.id} ({body.block.name or 'unnamed'})"
        for k, inst in enumerate(body.block.instances):
            for d in inst.deps:
                if d.id in idset:
                    continue
                j = bisect.bisect_right(starts, d.id) - 1
                if j >= 0 and d.id <= inst_spans[j][1]:
                    other, off = offsets_of[inst_spans[j]]
                    if d.id - off in body_id_sets[id(other)]:
                        continue
                problems.append(f"{where}, instance {k}: node {d.node} depends on {d.id}, which is "
                                "not a node of the graph")
                if len(problems) > 50:
                    return problems
    return problems


class ExpandedIds:
    """Membership in the expanded graph's ids without expanding it: the stored ids, and each
    copy's span with its body's ids shifted. Holds the stored ids and one entry per
    instance, never an id per copy."""

    __slots__ = ("_stored", "_starts", "_spans")

    def __init__(self, header: pb.GraphHeader, stored: Iterable[pb.Node], known: list[Body] | None = None):
        stored = list(stored) if not isinstance(stored, Sequence) else stored
        self._stored = {n.id for n in stored}
        blocks = known if known is not None else (bodies(header, stored) if header.repeats else [])
        spans: list[tuple[int, int, int, frozenset[int]]] = []
        for body in blocks:
            ids = frozenset(n.id for n in body.nodes)
            for inst in body.block.instances:
                off = int(inst.id_offset)
                spans.append((body.first + off, body.last + off, off, ids))
        spans.sort(key=lambda s: s[0])
        self._starts = [s[0] for s in spans]
        self._spans = spans

    def __contains__(self, node_id: object) -> bool:
        if node_id in self._stored:
            return True
        if not isinstance(node_id, int) or not self._spans:
            return False
        j = bisect.bisect_right(self._starts, node_id) - 1
        if j < 0:
            return False
        lo, hi, off, ids = self._spans[j]
        return node_id <= hi and node_id - off in ids


def starts_uniform(header: pb.GraphHeader, stored: Sequence[pb.Node], known: list[Body] | None = None) -> bool:
    """Whether every node of the expansion starts at the same time (an untimed graph), found
    from the stored starts and the instances' time offsets."""
    starts = {n.start_ns for n in stored}
    if len(starts) > 1:
        return False
    if not header.repeats:
        return True
    blocks = known if known is not None else bodies(header, stored)
    return not any(inst.time_offset_ns for b in blocks if b.nodes for inst in b.block.instances)


def deps_point_back(header: pb.GraphHeader, stored: Sequence[pb.Node], known: list[Body] | None = None) -> bool:
    """Whether every dependency of the expansion names a smaller id than its node's (or the
    node itself), found from the stored nodes and the instances' own dependencies: a copy's
    dependencies inside its body are shifted with it, the others are the instance's."""
    if not all(d.id <= n.id for n in stored for d in n.deps):
        return False
    if not header.repeats:
        return True
    blocks = known if known is not None else bodies(header, stored)
    return all(d.id <= d.node + inst.id_offset for b in blocks for inst in b.block.instances for d in inst.deps)


class ExpandedNodes:
    """Which node an id of the expanded graph stands for, without expanding it: a stored
    node (with no instance), or a copy's body node with the body and instance that copy it.
    Holds an id map of the stored nodes and one entry per instance, never one per copy."""

    __slots__ = ("_stored", "_starts", "_spans")

    def __init__(self, header: pb.GraphHeader, stored: Sequence[pb.Node], known: list[Body] | None = None):
        self._stored = {n.id: n for n in stored}
        blocks = known if known is not None else (bodies(header, stored) if header.repeats else [])
        spans: list[tuple[int, int, int, Body, pb.RepeatInstance]] = []
        for body in blocks:
            for inst in body.block.instances:
                off = int(inst.id_offset)
                spans.append((body.first + off, body.last + off, off, body, inst))
        spans.sort(key=lambda s: s[0])
        self._starts = [s[0] for s in spans]
        self._spans = spans

    def source(self, node_id: int) -> tuple[pb.Node, Body | None, pb.RepeatInstance | None] | None:
        """(node, body, instance): the stored node ``node_id`` (body and instance None), or
        the body node whose copy by ``instance`` has that id; None when no node has it."""
        n = self._stored.get(node_id)
        if n is not None:
            return n, None, None
        j = bisect.bisect_right(self._starts, node_id) - 1
        if j < 0:
            return None
        lo, hi, off, body, inst = self._spans[j]
        if node_id > hi:
            return None
        k = bisect.bisect_left(body.nodes, node_id - off, key=lambda m: m.id)
        if k < len(body.nodes) and body.nodes[k].id == node_id - off:
            return body.nodes[k], body, inst
        return None

    def kind(self, node_id: int) -> int | None:
        """The kind of node ``node_id`` (None when no node has that id)."""
        src = self.source(node_id)
        return None if src is None else src[0].kind
