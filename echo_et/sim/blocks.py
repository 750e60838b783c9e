"""Repeat blocks in the simulator: each block's work is simulated once per distinct set of
durations, and each of its occurrences is placed in closed form.

A graph with repeat blocks (``GraphHeader.repeats``, :mod:`echo_et.ir.repeats`) is compiled
into a *skeleton* :class:`~echo_et.sim.program.Program`: one item per node that is in no
block's body, and for every *occurrence* of a block (its body's own run and each instance)
one **macro** item plus one **port** item for each of the occurrence's nodes that something
outside it waits for (its last node on each stream, and every node an outside dependency
names). The skeleton runs in the ordinary event loop; a macro item is ready when every
outside item its occurrence depends on is done, and then places the whole occurrence:

Inside an occurrence every item starts at ``max over its predecessors (their time + gap)``
and every collective meets only its own rank class (checked: otherwise the graph is
simulated expanded), so the start of local item ``i`` is a max-plus linear function of the
occurrence's inputs ``x`` (the outside items' times, and the rank's origin where a stream
starts inside the occurrence): ``S_i = max_j (x_j + D[i, j])``, where ``D[i, j]`` is the
longest path from input ``j`` to ``i``. ``D`` depends on the block, on which outside
dependencies the occurrence has, and on the durations of its items, and is computed once for
each distinct combination (:class:`BlockTable`); every occurrence then costs one
``(items x inputs)`` numpy max. This is not an approximation: it is the same recurrence the
event loop evaluates item by item, so step time, breakdown and critical path equal those of
the expanded graph to the nanosecond (``tests/test_repeats.py``).

Used for untimed graphs (meta-device traces: no measured gaps) in predict mode; a timed
graph is simulated expanded, as before. A block whose sends, recvs or collectives meet
other rank classes is placed together with the occurrences it meets
(:mod:`echo_et.sim.linked_blocks`), or expanded when it cannot be.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from echo_et.ir.graph import Graph
from echo_et.ir.schema import pb
from echo_et.sim.program import (
    CAT_COLL,
    CAT_OTHER,
    CAT_P2P,
    DEVICE_CATEGORY,
    HOST_KINDS,
    Program,
    Rendezvous,
    rendezvous_of,
)

CAT_MACRO = 8   # an occurrence of a repeat block: places its items when its inputs are done
CAT_PORT = 9    # an occurrence's node that something outside it waits for
NEG = -(1 << 62)   # "no path" in D; x + NEG stays below every real time


@dataclass
class Block:
    """One block's body, compiled to local items (a local item is the body node at that
    position, in id order, which is a topological order)."""

    index: int
    block: pb.RepeatBlock
    nodes: list[pb.Node]
    node_index: list[int]                 # index of each body node in graph.stored_nodes
    ids: list[int]
    stream: list[int]                     # dense stream index of each local item
    category: list[int]
    host: list[bool]                      # on a host stream
    stream_prev: list[int]                # local predecessor on the same stream, -1: the stream enters here
    local_gates: list[list[tuple[int, bool]]]   # per item: (local item, from start) in dependency order
    dep_order: list[list[tuple[bool, int, bool]]]  # per item: (outside?, local item or outside slot, from start)
    streams: list[int]                    # dense streams the body runs on, ascending
    first_on: dict[int, int]              # dense stream -> first local item on it
    last_on: dict[int, int]               # dense stream -> last local item on it
    rendezvous: dict[int, Rendezvous]     # local collectives, sends and recvs
    p2p: list[int] = field(default_factory=list)   # local sends and recvs: they meet other ranks (linked_blocks)
    by_stream: dict[int, list[int]] = field(default_factory=dict)
    local_of: dict[int, int] = field(default_factory=dict)   # body node id -> local item
    all_named: bool = True                # every body node has a name (labels name no copy's id)
    category_np: np.ndarray | None = None
    by_stream_np: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.nodes)


@dataclass
class Occurrence:
    """One run of a block in the graph: the body's own (offset 0) or an instance's."""

    block: Block
    offset: int
    inputs: list[tuple[int, bool]]        # per input j: (program item, from start); item -1 = the origin
    ports: list[tuple[int, int]]          # (local item, program port item)
    macro: int = -1
    sig: tuple = ()                       # what D depends on besides durations
    outside_all: list[tuple[int, int, bool]] = field(default_factory=list)  # (local, input or -1: implied, from start)
    instance: pb.RepeatInstance | None = None   # None: the body's own run

    @property
    def outside(self) -> list[tuple[int, bool]]:
        """(local item, from start) of each outside dependency that is an input (not implied
        by stream order), in input order."""
        return [(local, fs) for local, j, fs in self.outside_all if j >= 0]


@dataclass
class CompactInfo:
    """What a skeleton program adds to a flat one."""

    blocks: list[Block]
    occurrences: list[Occurrence]
    occurrence_of_macro: dict[int, int]   # macro item -> occurrence index
    port_of: dict[int, tuple[int, int]]   # port item -> (occurrence index, local item)
    # per dense stream, in id order: (skeleton item, -1) or (occurrence, that stream)
    stream_runs: list[list[tuple[int, int]]]
    expanded_items: int = 0
    flat_layout: Any = None               # FlatLayout, made on first use


class NotCompact(Exception):
    """This graph is simulated expanded (the reason is for tests and diagnostics)."""


def compile_compact(graph: Graph) -> Program:
    """The skeleton program of an untimed graph with repeat blocks (module docstring).
    Raises NotCompact when the graph must be simulated expanded."""
    if not graph.has_repeats:
        raise NotCompact("no repeat blocks")
    if graph.header.attrs.get("trace.timing") != "untimed":
        raise NotCompact("a timed graph (measured gaps are laid out on the expanded graph)")
    stored = list(graph.stored_nodes)
    if any(n.start_ns for n in stored):
        raise NotCompact("measured start times")
    body_list = graph.bodies()
    index_of = {n.id: i for i, n in enumerate(stored)}
    in_body: dict[int, int] = {}
    for b, body in enumerate(body_list):
        for n in body.nodes:
            in_body[n.id] = b
    declared = {s.id: s for s in graph.header.streams}
    stream_ids = sorted({n.stream for n in stored})
    dense = {sid: k for k, sid in enumerate(stream_ids)}
    host_stream = [False] * len(stream_ids)
    for n in stored:
        if n.kind in HOST_KINDS:
            host_stream[dense[n.stream]] = True
    kinds = {n.kind for n in stored}
    device_compute = any(n.kind in (pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET)
                         and not host_stream[dense[n.stream]] for n in stored)
    if pb.KIND_LAUNCH not in kinds and not device_compute:
        raise NotCompact("a CPU-only graph")

    blocks = [_compile_block(b, body, index_of, dense, host_stream) for b, body in enumerate(body_list)]

    # Every occurrence with its id range; the expanded graph's nodes, as (id, what) runs.
    occs: list[Occurrence] = []
    ranges: list[tuple[int, int, int]] = []        # (first id, last id, occurrence)
    for blk in blocks:
        occs.append(Occurrence(blk, 0, [], []))
        ranges.append((blk.ids[0], blk.ids[-1], len(occs) - 1))
        for inst in blk.block.instances:
            occs.append(Occurrence(blk, int(inst.id_offset), [], [], instance=inst))
            ranges.append((blk.ids[0] + int(inst.id_offset), blk.ids[-1] + int(inst.id_offset), len(occs) - 1))
    ranges.sort()
    firsts = [r[0] for r in ranges]                 # bisected with ints, not tuples
    skeleton = [n for n in stored if n.id not in in_body]
    # A stream's sequence in id order: skeleton nodes and occurrences (each once per stream
    # it runs on, where its first node on that stream is).
    seq: dict[int, list[tuple[int, int, int]]] = {k: [] for k in range(len(stream_ids))}  # (id, kind 0/1, ref)
    for n in skeleton:
        seq[dense[n.stream]].append((n.id, 0, index_of[n.id]))
    for _, _, o in ranges:
        blk = occs[o].block
        for k in blk.streams:
            seq[k].append((blk.ids[blk.first_on[k]] + occs[o].offset, 1, o))
    prog = Program(graph_id=graph.id)
    prog.untimed = True
    prog.streams = [declared.get(sid) or pb.Stream(id=sid, name=f"stream {sid}") for sid in stream_ids]
    prog.host_stream = host_stream
    prog.measured_origin = 0
    n_nodes = len(stored)
    prog.node_start_item = [-1] * n_nodes
    prog.node_end_item = [-1] * n_nodes
    # Items: skeleton nodes and ports, stream by stream in id order; macros at the end.
    item_of_node: dict[int, int] = {}                  # skeleton node id -> item
    port_item: dict[tuple[int, int], int] = {}         # (occurrence, local item) -> port item
    outside_of = [_outside_deps(occ.block, occ, occ.instance) for occ in occs]   # walked once, used twice
    needed = _needed_ports(occs, outside_of, skeleton, ranges, firsts)
    stream_runs: list[list[tuple[int, int]]] = []
    for k in range(len(stream_ids)):
        runs: list[tuple[int, int]] = []
        seq[k].sort()
        prev = -1
        for _, what, ref in seq[k]:
            if what == 0:
                node = stored[ref]
                it = prog.add_item(k, DEVICE_CATEGORY.get(node.kind, CAT_OTHER), ref, node.duration_ns)
                prog.stream_prev.append(prev)
                prog.node_start_item[ref] = prog.node_end_item[ref] = it
                item_of_node[node.id] = it
                runs.append((it, -1))
                prev = it
            else:
                occ = occs[ref]
                blk = occ.block
                # ports of this occurrence on this stream: its last node, and any other node
                # something outside waits for, in local order
                locals_here = sorted({blk.last_on[k], *(i for i in needed.get(ref, ()) if blk.stream[i] == k)})
                for i in locals_here:
                    it = prog.add_item(k, CAT_PORT, -1, 0)
                    prog.stream_prev.append(-1)
                    port_item[(ref, i)] = it
                    occ.ports.append((i, it))
                runs.append((ref, k))
                prev = port_item[(ref, blk.last_on[k])]
        stream_runs.append(runs)
    # Macros (one per occurrence), on a stream of their own (index len(streams)).
    macro_stream = len(stream_ids)
    occurrence_of_macro: dict[int, int] = {}
    for o, occ in enumerate(occs):
        it = prog.add_item(macro_stream, CAT_MACRO, -1, 0)
        prog.stream_prev.append(-1)
        occ.macro = it
        occurrence_of_macro[it] = o
    prog.streams.append(pb.Stream(id=(1 << 32) - 1, name="repeat blocks"))
    prog.host_stream.append(False)

    def target_item(node_id: int) -> tuple[int, int]:
        """(program item, occurrence or -1) of the node ``node_id`` of the expanded graph."""
        it = item_of_node.get(node_id)
        if it is not None:
            return it, -1
        o = _occurrence_at(ranges, firsts, node_id)
        occ = occs[o]
        local = occ.block.local_of[node_id - occ.offset]
        return port_item[(o, local)], o

    # Gates of skeleton items, and every occurrence's inputs.
    start_preds: list[list[tuple[int, bool, int]]] = [[] for _ in range(prog.n_items)]
    for n in skeleton:
        it = item_of_node[n.id]
        k = prog.stream_of[it]
        for d in n.deps:
            fs = d.kind in (pb.DEP_LAUNCH, pb.DEP_CONTROL)
            q, _ = target_item(d.id)
            if prog.stream_of[q] == k:
                continue    # implied by stream order
            gate = (q, fs, 0)
            if gate not in start_preds[it]:
                start_preds[it].append(gate)
    prev_on: dict[tuple[int, int], int] = {}     # (occurrence, stream) -> the item before it on that stream
    for runs in stream_runs:
        before = -1
        for ref, kk in runs:
            if kk == -1:
                before = ref
            else:
                prev_on[(ref, kk)] = before
                blk = occs[ref].block
                before = port_item[(ref, blk.last_on[kk])]
    for o, occ in enumerate(occs):
        blk = occ.block
        outside = outside_of[o]
        inputs: list[tuple[int, bool]] = [(prev_on[(o, k)], False) for k in blk.streams]
        for local, dep_id, kind in outside:
            fs = kind in (pb.DEP_LAUNCH, pb.DEP_CONTROL)
            q, _ = target_item(dep_id)
            if prog.stream_of[q] == blk.stream[local]:
                occ.outside_all.append((local, -1, fs))
                continue    # implied by stream order
            occ.outside_all.append((local, len(inputs), fs))
            inputs.append((q, fs))
        occ.inputs = inputs
        occ.sig = (blk.index, tuple(occ.outside))
        m = occ.macro
        start_preds[m] = [(q, fs, 0) for q, fs in inputs if q >= 0]
    prog.start_preds = [tuple(g) for g in start_preds]
    prog.stream_gap = [0] * prog.n_items
    prog.end_waits = [()] * prog.n_items
    prog.measured_start = [0] * prog.n_items
    # Successors: stream order, gates; a port's only predecessor is its macro.
    succs: list[list[int]] = [[] for _ in range(prog.n_items)]
    pred_count = [0] * prog.n_items
    for it in range(prog.n_items):
        preds: set[int] = set()
        if prog.stream_prev[it] >= 0:
            preds.add(prog.stream_prev[it])
        preds.update(q for q, _, _ in prog.start_preds[it])
        pred_count[it] = len(preds)
        for p in preds:
            succs[p].append(it)
    for occ in occs:
        for _, p in occ.ports:
            pred_count[p] = 1
            succs[occ.macro].append(p)
    prog.successors = [tuple(s) for s in succs]
    prog.pred_count = pred_count
    prog.roots = [it for it in range(prog.n_items) if pred_count[it] == 0]
    # Rendezvous: skeleton communication meets other ranks; a block's collectives are local.
    prog.is_rendezvous = [False] * prog.n_items
    keys: set[str] = set(graph.header.group_sizes)
    ordered: set[str] = set()
    for n in skeleton:
        if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV):
            it = item_of_node[n.id]
            rv = rendezvous_of(graph, n)
            prog.rendezvous[it] = rv
    for it, rv in sorted(prog.rendezvous.items()):
        prog.is_rendezvous[it] = True
        if rv.peer < 0:
            prog.collective_items.append((it, rv.key, rv.seq))
        else:
            prog.p2p_items.append((it, rv.key, rv.peer, rv.seq, rv.is_send))
        keys.add(rv.key)
        if rv.position_matters:
            ordered.add(rv.key)
    for blk in blocks:
        for rv in blk.rendezvous.values():
            keys.add(rv.key)
            if rv.position_matters:
                ordered.add(rv.key)
    for m in occurrence_of_macro:
        prog.is_rendezvous[m] = True       # handled in the rendezvous branch of the event loop
    prog.group_keys = sorted(keys)
    prog.ordered_keys = frozenset(ordered)
    prog.placeholder_comm = sum(
        (1 + (len(blocks[in_body[n.id]].block.instances) if n.id in in_body else 0))
        for n in stored if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)
        and n.attrs.get("timing") == "placeholder")
    port_of = {p: (o, i) for o, occ in enumerate(occs) for i, p in occ.ports}
    prog.compact = CompactInfo(blocks, occs, occurrence_of_macro, port_of, stream_runs,
                               expanded_items=len(skeleton) + sum(occ.block.n for occ in occs))
    return prog


def _occurrence_at(ranges: list[tuple[int, int, int]], firsts: list[int], node_id: int) -> int:
    j = bisect_right(firsts, node_id) - 1
    if j < 0 or not ranges[j][0] <= node_id <= ranges[j][1]:
        raise NotCompact(f"node {node_id} is in no occurrence")
    return ranges[j][2]


def _outside_deps(blk: Block, occ: Occurrence, inst: pb.RepeatInstance | None) -> list[tuple[int, int, int]]:
    """(local item, node id depended on, dep kind) of the occurrence's outside dependencies,
    in the order a copy lists them (:func:`echo_et.ir.repeats.copy_node`)."""
    first, last = blk.ids[0], blk.ids[-1]
    out: list[tuple[int, int, int]] = []
    if inst is None:
        for i, n in enumerate(blk.nodes):
            for d in n.deps:
                if not first <= d.id <= last:
                    out.append((i, int(d.id), int(d.kind)))
        return out
    for d in inst.deps:
        out.append((blk.local_of[int(d.node)], int(d.id), int(d.kind)))
    return out


def _needed_ports(occs: list[Occurrence], outside_of: list[list[tuple[int, int, int]]], skeleton: list[pb.Node],
                  ranges: list[tuple[int, int, int]], firsts: list[int]) -> dict[int, set[int]]:
    """Occurrence -> its local items that a node outside it depends on."""
    need: dict[int, set[int]] = {}

    def mark(dep_id: int, own: int) -> None:
        j = _maybe_occurrence(ranges, firsts, dep_id)
        if j is not None and j != own:
            occ = occs[j]
            need.setdefault(j, set()).add(occ.block.local_of[dep_id - occ.offset])

    for n in skeleton:
        for d in n.deps:
            mark(int(d.id), -1)
    for o, outside in enumerate(outside_of):
        for _, dep_id, _ in outside:
            mark(dep_id, o)
    return need


def _maybe_occurrence(ranges: list[tuple[int, int, int]], firsts: list[int], node_id: int) -> int | None:
    """The occurrence whose id range holds ``node_id`` (``firsts``: each range's first id,
    ascending), or None."""
    j = bisect_right(firsts, node_id) - 1
    if j < 0 or not ranges[j][0] <= node_id <= ranges[j][1]:
        return None
    return ranges[j][2]


def _compile_block(b: int, body, index_of: dict[int, int], dense: dict[int, int],
                   host_stream: list[bool]) -> Block:
    nodes = list(body.nodes)
    ids = [n.id for n in nodes]
    local_of = {nid: i for i, nid in enumerate(ids)}
    stream = [dense[n.stream] for n in nodes]
    category: list[int] = []
    rendezvous: dict[int, Rendezvous] = {}
    p2p: list[int] = []
    for i, n in enumerate(nodes):
        cat = DEVICE_CATEGORY.get(n.kind, CAT_OTHER)
        category.append(cat)
        if cat == CAT_COLL:
            if n.collective.type == pb.COLL_UNKNOWN:
                raise NotCompact("a collective of unknown type inside a repeat block")
            rendezvous[i] = rendezvous_of(None, n)
        elif cat == CAT_P2P:
            if host_stream[dense[n.stream]]:
                raise NotCompact("a send/recv on a host stream inside a repeat block")
            rendezvous[i] = rendezvous_of(None, n)
            p2p.append(i)
    stream_prev = [-1] * len(nodes)
    last: dict[int, int] = {}
    first_on: dict[int, int] = {}
    by_stream: dict[int, list[int]] = {}
    for i, k in enumerate(stream):
        if k in last:
            stream_prev[i] = last[k]
        else:
            first_on[k] = i
        last[k] = i
        by_stream.setdefault(k, []).append(i)
    local_gates: list[list[tuple[int, bool]]] = []
    dep_order: list[list[tuple[bool, int, bool]]] = []
    for i, n in enumerate(nodes):
        gates: list[tuple[int, bool]] = []
        order: list[tuple[bool, int, bool]] = []
        slot = 0
        for d in n.deps:
            fs = d.kind in (pb.DEP_LAUNCH, pb.DEP_CONTROL)
            q = local_of.get(d.id)
            if q is None:
                order.append((True, slot, fs))
                slot += 1
                continue
            if stream[q] == stream[i]:
                continue
            if (q, fs) not in gates:
                gates.append((q, fs))
                order.append((False, q, fs))
        local_gates.append(gates)
        dep_order.append(order)
    return Block(index=b, block=body.block, nodes=nodes, node_index=[index_of[x] for x in ids], ids=ids,
                 stream=stream, category=category, host=[host_stream[k] for k in stream],
                 stream_prev=stream_prev, local_gates=local_gates, dep_order=dep_order,
                 streams=sorted(first_on), first_on=first_on, last_on=last, rendezvous=rendezvous, p2p=p2p,
                 by_stream=by_stream, local_of=local_of, all_named=all(n.name for n in nodes),
                 category_np=np.asarray(category, dtype=np.int64),
                 by_stream_np={k: np.asarray(v, dtype=np.int64) for k, v in by_stream.items()})


def unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of the 2-D int array ``keys``, in lexicographic order; each row's
    index among them): ``np.unique(keys, axis=0, return_inverse=True)`` by one lexsort, several
    times faster on millions of rows."""
    n = keys.shape[0]
    if n == 0:
        return keys[:0], np.zeros(0, dtype=np.int64)
    order = np.lexsort(keys.T[::-1])
    srt = keys[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return srt[new], inverse


# -- the max-plus table of a block -------------------------------------------------------------------
class BlockTable:
    """``D`` (longest path from each input to each local item's start) per distinct
    (block, outside dependencies, durations)."""

    def __init__(self) -> None:
        self._tables: dict[tuple, np.ndarray] = {}
        self.computed = 0

    def table(self, occ: Occurrence, durs: np.ndarray, key_bytes: bytes) -> np.ndarray:
        key = (occ.sig, key_bytes)
        got = self._tables.get(key)
        if got is None:
            got = _longest_paths(occ.block, occ.outside, durs)
            self._tables[key] = got
            self.computed += 1
        return got


def _longest_paths(blk: Block, outside: Sequence[tuple[int, bool]], durs: np.ndarray) -> np.ndarray:
    n_in = len(blk.streams) + len(outside)
    entry = {k: j for j, k in enumerate(blk.streams)}
    ext_of: dict[int, list[tuple[int, bool]]] = {}
    for j, (local, fs) in enumerate(outside):
        ext_of.setdefault(local, []).append((len(blk.streams) + j, fs))
    d = durs.tolist()
    rows: list[list[int]] = []
    neg = NEG
    for i in range(blk.n):
        row = [neg] * n_in
        p = blk.stream_prev[i]
        if p >= 0:
            src, dp = rows[p], d[p]
            row = [v + dp if v > neg else neg for v in src]
        else:
            row[entry[blk.stream[i]]] = 0
        for q, fs in blk.local_gates[i]:
            src = rows[q]
            add = 0 if fs else d[q]
            for j in range(n_in):
                v = src[j]
                if v > neg and v + add > row[j]:
                    row[j] = v + add
        for j, _ in ext_of.get(i, ()):
            if row[j] < 0:
                row[j] = 0
        rows.append(row)
    return np.array(rows, dtype=np.int64).reshape(blk.n, n_in)


PLACE_ROWS = 4096   # rows of a table summed with the inputs at a time: the sum stays in cache


def place(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Start of every local item for inputs ``x``: ``max_j (x_j + D[i, j])``. A large table
    (a context-parallel ring's bundle: 110,000 rows by 96) is summed a few thousand rows at
    a time into one buffer: half the time of one sum the table's size (measured at CP16)."""
    n = table.shape[0]
    if n <= PLACE_ROWS:
        return (table + x[None, :]).max(axis=1)
    out = np.empty(n, dtype=np.int64)
    buf = np.empty((PLACE_ROWS, table.shape[1]), dtype=np.int64)
    for a in range(0, n, PLACE_ROWS):
        part = buf[:min(n, a + PLACE_ROWS) - a]
        np.add(table[a:a + part.shape[0]], x, out=part)
        part.max(axis=1, out=out[a:a + part.shape[0]])
    return out


# -- one rank's run of its blocks -------------------------------------------------------------------
def same_durations(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Two lists of per-occurrence durations hold the same values (mostly the same arrays)."""
    return len(a) == len(b) and all(x is y or np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def shared_durations(per_occurrence: list[np.ndarray]) -> tuple[list[np.ndarray], list[bytes]]:
    """(the durations, each occurrence's key): occurrences with equal durations share one
    array and one key. The slowdown gives most occurrences of a block the same values, and a
    long-context rank has thousands of occurrences of thousands of items (two copies each
    were 1.8 GB at CP16)."""
    by_value: dict[bytes, tuple[np.ndarray, bytes]] = {}
    by_id: dict[int, tuple[np.ndarray, bytes]] = {}     # the arrays given live through the loop
    durs: list[np.ndarray] = []
    keys: list[bytes] = []
    for d in per_occurrence:
        got = by_id.get(id(d))
        if got is None:
            raw = d.tobytes()
            got = by_id[id(d)] = by_value.setdefault(raw, (d, raw))
        durs.append(got[0])
        keys.append(got[1])
    return durs, keys


@dataclass
class BlockRun:
    """The durations and inputs of every occurrence on one simulated rank.

    Placing is shift-equivariant (``S(x + c) = S(x) + c``), and in a steady pipeline almost
    every occurrence sees the inputs of an earlier one shifted in time: each distinct
    (table, inputs relative to their latest) is evaluated once, and an occurrence keeps
    that relative solution and its shift."""

    info: CompactInfo
    tables: BlockTable
    base: list[np.ndarray]                         # per block: its items' base durations
    durs: list[np.ndarray] = field(default_factory=list)    # per occurrence: this round's durations
    keys: list[bytes] = field(default_factory=list)         # per occurrence: durs[o].tobytes()
    x: list[np.ndarray | None] = field(default_factory=list)  # per occurrence: its inputs, once placed
    _placed: dict[int, tuple[np.ndarray, np.ndarray, int]] = field(default_factory=dict)  # o -> (S rel, E rel, shift)
    # (id of the table, inputs minus their latest) -> (S rel, E rel, the table: kept alive with its id)
    _relative: dict[tuple[int, bytes], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    _flat: FlatTimes | None = None
    # occurrences placed with others (echo_et.sim.linked_blocks): occurrence -> its link there
    links: dict[int, Any] = field(default_factory=dict)
    _waits: dict[int, np.ndarray] = field(default_factory=dict)   # linked o -> each local item's wait (ns)

    def set_durations(self, per_occurrence: list[np.ndarray]) -> None:
        """This round's durations; the placements and flat times made with the same values
        stay (a run resets them before it places anything)."""
        same = same_durations(self.durs, per_occurrence)
        self.durs, self.keys = shared_durations(per_occurrence)
        if not same:
            self._placed = {}
            self._waits = {}
            self._flat = None

    def flat(self, prog: Program, item_start: list[int], item_end: list[int], *, keep: bool = True) -> FlatTimes:
        """:func:`flat_times` of this run (kept until the next simulation or durations; with
        ``keep=False`` made, or taken, without keeping it: the slowdown and the breakdown read
        every rank's once, and at 32 ranks of 500,000 items kept they would hold 800 MB)."""
        got = self._flat
        if got is None:
            got = flat_times(prog, self, item_start, item_end)
            if keep:
                self._flat = got
        return got

    def use_base(self) -> None:
        self.set_durations([self.base[occ.block.index] for occ in self.info.occurrences])

    def reset(self) -> None:
        self.x = [None] * len(self.info.occurrences)
        self._placed = {}
        self._waits = {}
        self._flat = None

    def put(self, o: int, x: np.ndarray, placed: tuple[np.ndarray, np.ndarray, int], waits: np.ndarray) -> None:
        """Occurrence ``o`` of a bundle (placed with the occurrences it meets): its inputs,
        (start, end) relative to the shift and the shift, and how long each local item waited
        at its meeting (0 but for the items that meet other ranks)."""
        self.x[o] = x
        self._placed[o] = placed
        self._waits[o] = waits

    def waits(self, o: int) -> np.ndarray | None:
        """Each local item's wait at its meeting in a linked occurrence; None: no wait."""
        return self._waits.get(o)

    def place(self, o: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(start, end) of every local item of occurrence ``o`` relative to ``shift``, and
        ``shift`` (ns): the occurrence's inputs are ``x``."""
        self.x[o] = x
        got = self._placed.get(o)
        if got is None:
            got = self._solve(o, x)
        return got

    def _solve(self, o: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        if o in self.links:
            raise ValueError(f"occurrence {o} is placed with its bundle, not alone")
        occ = self.info.occurrences[o]
        table = self.tables.table(occ, self.durs[o], self.keys[o])
        shift = int(x.max()) if x.size else 0
        rel = x - shift
        key = (id(table), rel.tobytes())     # the table lives as long as the simulator's BlockTable
        sol = self._relative.get(key)
        if sol is None:
            s = place(table, rel)
            sol = self._relative[key] = (s, s + self.durs[o], table)
        got = (sol[0], sol[1], shift)
        self._placed[o] = got
        return got

    def times(self, o: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, end) of every local item of occurrence ``o`` (after it was placed)."""
        s, e, shift = self.relative_times(o)
        return s + shift, e + shift

    def relative_times(self, o: int) -> tuple[np.ndarray, np.ndarray, int]:
        """:meth:`place`'s answer for a placed occurrence (without adding the shift)."""
        got = self._placed.get(o)
        if got is None:
            x = self.x[o]
            if x is None:
                raise ValueError(f"occurrence {o} was not placed")
            got = self._solve(o, x)
        return got


@dataclass
class FlatTimes:
    """A compact rank's items in the expanded graph's item order (stream by stream, node id
    order within a stream): where each one is (occurrence or -1, local item or program
    item), and its times and category."""

    occ: np.ndarray
    ref: np.ndarray
    start: np.ndarray
    end: np.ndarray
    category: np.ndarray
    host: np.ndarray
    wait: np.ndarray            # ns a meeting item of a linked occurrence waited before its start; else 0


@dataclass
class FlatLayout:
    """Where each item of the expanded graph's item order takes its times from (the same for
    every simulation of a program): a program item (``occ`` -1, ``ref`` the item) or local
    item ``ref`` of occurrence ``occ``."""

    occ: np.ndarray
    ref: np.ndarray
    category: np.ndarray
    host: np.ndarray
    skeleton_at: np.ndarray     # positions of program items
    block_at: np.ndarray        # positions of occurrences' local items


def flat_layout(prog: Program) -> FlatLayout:
    """The program's :class:`FlatLayout`, made once (kept on its CompactInfo). Built from one
    piece per skeleton run and per occurrence's stream (a block's local items and their
    categories are the same arrays for each of its occurrences), joined by one concatenation:
    a few numpy calls per program instead of four per piece."""
    info = prog.compact
    if info.flat_layout is not None:
        return info.flat_layout
    cats = np.asarray(prog.category, dtype=np.int64)
    refs: list[np.ndarray] = []       # per piece: program items, or an occurrence's local items
    cat_p: list[np.ndarray] = []
    piece_occ: list[int] = []         # per piece: -1 (skeleton run) or the occurrence
    piece_host: list[bool] = []
    piece_len: list[int] = []
    local_cats: dict[tuple[int, int], np.ndarray] = {}   # (block, stream) -> its local items' categories
    for k, runs in enumerate(info.stream_runs):
        host = bool(prog.host_stream[k])
        items: list[int] = []
        for ref, kk in [*runs, (-1, -2)]:     # a sentinel flushes the last skeleton run
            if kk == -1:
                items.append(ref)
                continue
            if items:
                idx = np.asarray(items, dtype=np.int64)
                refs.append(idx)
                cat_p.append(cats[idx])
                piece_occ.append(-1)
                piece_host.append(host)
                piece_len.append(len(items))
                items = []
            if kk == -2:
                break
            blk = info.occurrences[ref].block
            local = blk.by_stream_np[kk]
            lc = local_cats.get((blk.index, kk))
            if lc is None:
                lc = local_cats[(blk.index, kk)] = blk.category_np[local]
            refs.append(local)
            cat_p.append(lc)
            piece_occ.append(ref)
            piece_host.append(host)
            piece_len.append(local.size)
    if not refs:
        z = np.zeros(0, dtype=np.int32)
        layout = FlatLayout(z, z, np.zeros(0, dtype=np.int8), np.zeros(0, dtype=bool), z, z)
    else:
        lens = np.asarray(piece_len, dtype=np.int64)
        total = int(lens.sum())
        # narrow columns: a rank of a long-context pipeline has millions of items, and every
        # simulated rank keeps its layout (int64 columns were 33 bytes an item, 3.6 GB at CP16)
        index = np.int32 if max(total, len(info.occurrences), len(prog.category)) < (1 << 31) else np.int64
        occ = np.repeat(np.asarray(piece_occ, dtype=index), lens)
        host_a = np.repeat(np.asarray(piece_host, dtype=bool), lens)
        layout = FlatLayout(occ, np.concatenate(refs).astype(index), np.concatenate(cat_p).astype(np.int8), host_a,
                            np.flatnonzero(occ < 0).astype(index), np.flatnonzero(occ >= 0).astype(index))
    info.flat_layout = layout
    return layout


def flat_times(prog: Program, run: BlockRun, item_start: list[int], item_end: list[int]) -> FlatTimes:
    """Every item of the expanded graph, with the times the skeleton and the placed
    occurrences give it (macro and port items are left out: a port is its local item)."""
    layout = flat_layout(prog)
    n_occ = len(prog.compact.occurrences)
    # the distinct relative solutions once, each occurrence an offset into them and a shift
    first_of: dict[int, int] = {}
    sol_s: list[np.ndarray] = []
    sol_e: list[np.ndarray] = []
    sol_w: list[np.ndarray] = []
    waited = False
    offset = np.empty(n_occ, dtype=np.int64)
    shift = np.empty(n_occ, dtype=np.int64)
    at = 0
    for o in range(n_occ):
        s, e, c = run.relative_times(o)
        j = first_of.get(id(s))
        if j is None:
            j = first_of[id(s)] = at
            sol_s.append(s)
            sol_e.append(e)
            w = run.waits(o)
            waited |= w is not None
            sol_w.append(w if w is not None else np.zeros(s.size, dtype=np.int64))
            at += s.size
        offset[o] = j
        shift[o] = c
    n = layout.occ.size
    start = np.empty(n, dtype=np.int64)
    end = np.empty(n, dtype=np.int64)
    sk = layout.skeleton_at
    items = layout.ref[sk]
    start[sk] = np.asarray(item_start, dtype=np.int64)[items]
    end[sk] = np.asarray(item_end, dtype=np.int64)[items]
    bl = layout.block_at
    wait = np.zeros(n, dtype=np.int64)
    if bl.size:
        o = layout.occ[bl]
        src = offset[o] + layout.ref[bl]
        add = shift[o]
        start[bl] = np.concatenate(sol_s)[src] + add
        end[bl] = np.concatenate(sol_e)[src] + add
        if waited:
            wait[bl] = np.concatenate(sol_w)[src]
    return FlatTimes(layout.occ, layout.ref, start, end, layout.category, layout.host, wait)
