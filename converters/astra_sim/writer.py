"""Writing an ASTRA-sim export: one ``workload.{rank}.et`` per rank plus its configuration.

Each distinct graph is planned once (:mod:`.plan`); ranks bound to it differ only in their
start offset (the first node), process-group ids, peers and tags, which are appended to
pre-serialised node bytes, so exporting thousands of ranks that share a graph costs little
more than writing the bytes. Only graphs with an uneven all-to-all (sent as per-peer
send/recv, whose count and sizes depend on the rank) are built message by message.

The folder is written under a temporary name, passes the contract check (:mod:`.check`)
and is then renamed into place: a failed export leaves nothing behind.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et

from echo_et.errors import CheckError, EchoError, OptionError
from echo_et.ir.io import atomic_dir, encode_varint, written_by
from echo_et.ir.job import Job
from echo_et.ir.job_checker import check_job
from echo_et.ir.schema import pb

from . import configs
from .configs import FILE_NAMES, WORKLOAD_PREFIX, ExportOptions
from .mapping import comm_size_of, comm_type_of
from .plan import concurrent_collectives, plan_graph
from .planned import COLL, COMP, GPU, GraphPlan, PlannedNode, exported_us, round_us

# What an export writes, and so the only folder an export replaces (see written_by).
is_export_folder = written_by(*FILE_NAMES.values(), f"{WORKLOAD_PREFIX}.*.et", required=FILE_NAMES["network"])

METADATA_VERSION = "0.0.4"
MIN_NPUS = 2               # every network dimension needs more than one NPU
A2A_TAG_BASE = 1 << 30     # tags of send/recv made from uneven all-to-all
MAX_IR_TAG = 1 << 30       # IR tags at or above this are replaced by the P2P sequence number
SPLIT_ATTR = "in_split_bytes"
STREAM_FILES = 256         # rank files a streamed graph writes at once
_ATTR_FIELD = b"\x52"      # Node.attr: field 10, wire type 2


# -- small encoders ---------------------------------------------------------------------------
def _attr(name: str, **value) -> et.AttributeProto:
    return et.AttributeProto(name=name, **value)


class _AttrBytes:
    """Serialised ``Node.attr`` entries, cached by (name, type, value)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, object], bytes] = {}

    def get(self, name: str, kind: str, value: object) -> bytes:
        key = (name, kind, value)
        b = self._cache.get(key)
        if b is None:
            data = _attr(name, **{kind: value}).SerializeToString(deterministic=True)
            b = _ATTR_FIELD + encode_varint(len(data)) + data
            if len(self._cache) < 1_000_000:
                self._cache[key] = b
        return b


def _delimited(data: bytes) -> bytes:
    return encode_varint(len(data)) + data


# -- what a planned node becomes --------------------------------------------------------------
def _coll_size(pn: PlannedNode, group_size: int, splits: int) -> tuple[int, bool]:
    return comm_size_of(pn.node.collective.type, pn.in_bytes, pn.out_bytes, group_size, splits)


def _base_node(pn: PlannedNode, node_id: int, deps: Iterable[int], is_cpu: bool,
               origin_ns: int = 0) -> et.Node:
    n = pn.node
    out = et.Node(id=node_id, name=pn.name)
    out.data_deps.extend(deps)
    out.start_time_micros = round_us(max(0, pn.start_ns - origin_ns))
    out.attr.append(_attr("is_cpu_op", bool_val=is_cpu))
    if pn.role == COMP:
        out.type = et.COMP_NODE
        out.duration_micros = exported_us(pn)
        if (pn.lane == GPU and n is not None and n.kind == pb.KIND_COMPUTE and n.compute.flops > 0
                and n.compute.bytes > 0):
            out.attr.append(_attr("num_ops", int64_val=int(n.compute.flops)))
            out.attr.append(_attr("tensor_size", uint64_val=int(n.compute.bytes)))
    return out


class _Exporter:
    def __init__(self, job: Job, options: ExportOptions):
        self.job = job
        self.opts = options
        self.world = job.world_size
        self.npus = max(MIN_NPUS, self.world)
        self.splits = options.splits
        self.attrs = _AttrBytes()
        self.mapped: Counter[str] = Counter()
        self.merged: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.offsets_us: dict[int, int] = {}
        self.used_groups: dict[int, list[int]] = {}
        self.world_groups: set[int] = set()
        self.explicit_world = False
        self._coll_keys: dict[str, set[str]] = {}
        self.plans: dict[str, GraphPlan] = {}
        self.key_sizes: dict[str, dict[str, int]] = {}
        self._coll_by_seq: dict[tuple[str, str], dict[int, pb.Node]] = {}
        self._key_of_group: dict[int, dict[int, str]] = {}
        self._group_sig: dict[int, set[tuple[str, str]]] | None = None
        self._matrices: dict[tuple, list[list[int]] | None] = {}
        for g in job.manifest.groups:
            if list(g.ranks) == list(range(self.world)):
                self.world_groups.add(g.id)

    # -- planning -------------------------------------------------------------------------
    def plan(self) -> None:
        ranks_of = self.job.ranks_of_graph()
        for gid in sorted(ranks_of):
            sizes: dict[str, int] = {}
            for r in ranks_of[gid]:
                b = self.job.binding(r)
                for key, pg_id in b.groups.items():
                    size = len(self.job.group(pg_id).ranks)
                    if sizes.setdefault(key, size) != size:
                        raise EchoError(
                            f"graph {gid}: group key {key!r} is bound to groups of different sizes "
                            f"({sizes[key]} and {size}); ASTRA-sim export needs one size per key"
                        )
            self.key_sizes[gid] = sizes
        merges = self._merges(ranks_of)
        for gid in sorted(ranks_of):
            try:
                self.plans[gid] = plan_graph(self.job.graph(gid), self.key_sizes[gid],
                                             fold_host=self.opts.host_time == "fold", merge=merges.get(gid),
                                             stream=True)
            except EchoError as e:
                raise EchoError(f"graph {gid}: {e}") from None
        # Each rank starts at its measured offset from the earliest rank (on the job clock).
        raw = {r: self.plans[self.job.binding(r).graph].origin_ns + self.job.binding(r).clock_offset_ns
               for r in self.job.ranks()}
        low = min(raw.values(), default=0)
        for r, v in raw.items():
            self.offsets_us[r] = 0 if self.opts.align_start else round_us(v - low)
        # ASTRA-sim numbers collectives on the implicit world with a counter that collectives
        # of smaller groups advance too, so a rank that ran more of those pairs its world
        # collectives with the wrong ones and every rank hangs: when smaller groups are used,
        # the world is written as an explicit group of every NPU as well.
        used: set[int] = set()
        for r in self.job.ranks():
            b = self.job.binding(r)
            keys = self._coll_keys.setdefault(b.graph, set(self.plans[b.graph].coll_groups))
            used.update(b.groups[k] for k in keys)
        self.explicit_world = any(g not in self.world_groups for g in used)
        # With every rank starting at 0 the start node says nothing: it is left out.
        self.omit_start = not any(self.offsets_us.values())

    def _merges(self, ranks_of: dict[str, list[int]]) -> dict[str, dict[str, frozenset[int]]]:
        """Per graph and group key, the collectives merged into the previous one of their
        group (:func:`.plan.concurrent_collectives`): only those that ran concurrently on
        every member of every group the key is bound to, so that all members write the
        same collective sequence."""
        cand = {gid: concurrent_collectives(self.job.graph(gid), self.key_sizes[gid]) for gid in ranks_of}
        if not any(cand.values()):
            return {}
        sets: dict[tuple[str, str], frozenset[int]] = {}
        pairs_of_group: dict[int, set[tuple[str, str]]] = {}
        for gid, ranks in ranks_of.items():
            for r in ranks:
                for key, pg_id in self.job.binding(r).groups.items():
                    sets[(gid, key)] = cand[gid].get(key, frozenset())
                    pairs_of_group.setdefault(pg_id, set()).add((gid, key))
        changed = True
        while changed:
            changed = False
            for pairs in pairs_of_group.values():
                common = frozenset.intersection(*(sets[p] for p in pairs))
                for p in pairs:
                    if sets[p] != common:
                        sets[p], changed = common, True
        out: dict[str, dict[str, frozenset[int]]] = {}
        for (gid, key), seqs in sets.items():
            if seqs:
                out.setdefault(gid, {})[key] = seqs
        return out

    def _colls(self, graph_id: str, key: str) -> dict[int, pb.Node]:
        k = (graph_id, key)
        m = self._coll_by_seq.get(k)
        if m is None:
            m = {n.collective.seq: n for n in self.job.graph(graph_id).nodes
                 if n.kind == pb.KIND_COLLECTIVE and n.collective.group == key}
            self._coll_by_seq[k] = m
        return m

    def _group_signature(self, pg_id: int) -> set[tuple[str, str]]:
        if self._group_sig is None:
            sig: dict[int, set[tuple[str, str]]] = {}
            for b in self.job.manifest.bindings:
                for key, g in b.groups.items():
                    sig.setdefault(g, set()).add((b.graph, key))
            self._group_sig = sig
        return self._group_sig.get(pg_id, set())

    def _member_node(self, rank: int, pg_id: int, seq: int) -> pb.Node:
        keys = self._key_of_group.get(rank)
        b = self.job.binding(rank)
        if keys is None:
            keys = {g: k for k, g in sorted(b.groups.items(), reverse=True)}
            self._key_of_group[rank] = keys
        return self._colls(b.graph, keys[pg_id])[seq]

    # -- all-to-all -----------------------------------------------------------------------
    @staticmethod
    def _explicit_splits(node: pb.Node, n: int) -> list[int] | None:
        """Per-peer bytes from the ``in_split_bytes`` attribute (group order), if present."""
        raw = node.attrs.get(SPLIT_ATTR, "")
        if not raw:
            return None
        try:
            vals = [int(v) for v in raw.replace("[", "").replace("]", "").split(",") if v.strip()]
        except ValueError:
            raise EchoError(f"node {node.id} ({node.name}): attribute {SPLIT_ATTR}={raw!r} "
                            "is not a list of integers") from None
        if len(vals) != n or min(vals) < 0:
            raise EchoError(f"node {node.id} ({node.name}): {SPLIT_ATTR} lists {len(vals)} "
                            f"sizes for a group of {n}")
        return vals

    @staticmethod
    def _proportional_row(send: int, outs: list[int]) -> list[int]:
        """Bytes one rank sends to each member when only totals are known: its input split in
        proportion to what each member receives (the independent, maximum-entropy guess; it
        keeps every rank's send total exact and receive totals within a byte per peer).
        Floors, then the remainder to the largest fractions (ties to the lower index)."""
        total = sum(outs)
        n = len(outs)
        if total <= 0:
            return [send // n + (1 if j < send % n else 0) for j in range(n)]
        exact = [send * o for o in outs]
        row = [e // total for e in exact]
        left = send - sum(row)
        by_frac = sorted(range(n), key=lambda j: (-(exact[j] % total), j))
        for j in by_frac[:left]:
            row[j] += 1
        return row

    def _a2a_matrix(self, rank: int, pn: PlannedNode) -> list[list[int]] | None:
        """The bytes matrix [sender][receiver] in group order of an all-to-all written as
        per-peer send/recv; None when it is written as ASTRA-sim's ALL_TO_ALL (even on every
        member, with the ``ring`` all-to-all mapping)."""
        b = self.job.binding(rank)
        coll = pn.node.collective
        pg_id = b.groups[coll.group]
        if self._group_signature(pg_id) == {(b.graph, coll.group)}:
            # Every member runs this very node: the answer is the same for all such groups.
            key: tuple = ("node", b.graph, coll.group, coll.seq)
        else:
            key = ("instance", pg_id, coll.seq)
        if key not in self._matrices:
            self._matrices[key] = self._compute_a2a_matrix(rank, pn)
        return self._matrices[key]

    def _compute_a2a_matrix(self, rank: int, pn: PlannedNode) -> list[list[int]] | None:
        node = pn.node
        b = self.job.binding(rank)
        pg_id = b.groups[node.collective.group]
        members = list(self.job.group(pg_id).ranks)
        n = len(members)
        sig = self._group_signature(pg_id)
        if sig == {(b.graph, node.collective.group)}:
            nodes = [node] * n
        else:
            nodes = [self._member_node(m, pg_id, node.collective.seq) for m in members]
        explicit = [self._explicit_splits(x, n) for x in nodes]
        ins = [x.collective.in_bytes for x in nodes]
        outs = [x.collective.out_bytes for x in nodes]
        ring = self.opts.all_to_all == "ring"
        if ring and all(e is None for e in explicit) and len(set(ins)) == 1 and len(set(outs)) == 1:
            return None
        matrix = [e if e is not None else self._proportional_row(ins[i], outs)
                  for i, e in enumerate(explicit)]
        off_diag = {v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j}
        if ring and len(off_diag) == 1 and len(set(ins)) == 1:
            return None  # explicit splits that are even after all
        return matrix

    @staticmethod
    def _is_even(matrix: list[list[int]]) -> bool:
        """Every rank sends every other the same bytes (up to the remainder of a division)."""
        off = [v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j]
        return max(off, default=0) - min(off, default=0) <= 1

    # -- per rank -------------------------------------------------------------------------
    def _pg_attr(self, rank: int, key: str) -> bytes:
        pg_id = self.job.binding(rank).groups[key]
        if pg_id in self.world_groups and not self.explicit_world:
            return b""
        if pg_id not in self.used_groups:
            self.used_groups[pg_id] = list(self.job.group(pg_id).ranks)
        return self.attrs.get("pg_name", "string_val", str(pg_id))

    def _p2p_attrs(self, rank: int, node: pb.Node) -> bytes:
        p = node.p2p
        pg = self.job.resolve_group(rank, p.group)
        peer = pg.ranks[p.peer]
        src, dst = (rank, peer) if node.kind == pb.KIND_SEND else (peer, rank)
        tag = p.tag if 0 <= p.tag < MAX_IR_TAG else p.seq % MAX_IR_TAG
        return (self.attrs.get("comm_src", "int32_val", src)
                + self.attrs.get("comm_dst", "int32_val", dst)
                + self.attrs.get("comm_tag", "int32_val", int(tag)))

    def _static_tail(self, pn: PlannedNode, gid: str) -> tuple[list[bytes], int]:
        """Attribute bytes that are the same on every rank (after ``_base_node``'s), and the
        count of size raises they imply."""
        n = pn.node
        if pn.role == COLL:
            size, raised = _coll_size(pn, self.key_sizes[gid][n.collective.group], self.splits)
            return [self.attrs.get("comm_type", "int64_val", comm_type_of(n)),
                    self.attrs.get("comm_size", "int64_val", size)], int(raised)
        if pn.role != COMP:  # P2P
            return [self.attrs.get("comm_size", "int64_val", max(1, n.p2p.bytes))], int(n.p2p.bytes == 0)
        return [], 0

    def _type_of(self, pn: PlannedNode) -> int:
        if pn.role == COMP:
            return et.COMP_NODE
        if pn.role == COLL:
            return et.COMM_COLL_NODE
        return et.COMM_SEND_NODE if pn.node.kind == pb.KIND_SEND else et.COMM_RECV_NODE

    def _head(self, pn: PlannedNode, node_id: int, deps: Iterable[int], gid: str) -> bytes:
        plan = self.plans[gid]
        base = _base_node(pn, node_id, deps, plan.is_cpu(pn), plan.origin_ns)
        base.type = self._type_of(pn)
        head = base.SerializeToString(deterministic=True)
        tail, _ = self._static_tail(pn, gid)
        return head + b"".join(tail)

    def _start_node(self, rank: int, plan: GraphPlan) -> bytes:
        """The rank's first node: its measured start offset, on the lane its host time uses."""
        pn = plan.first
        n = et.Node(id=1, name=pn.name, type=et.COMP_NODE, duration_micros=self.offsets_us[rank])
        n.start_time_micros = 0
        n.attr.append(_attr("is_cpu_op", bool_val=plan.is_cpu(pn)))
        return n.SerializeToString(deterministic=True)

    def _count_static(self, plan: GraphPlan, gid: str, ranks: int) -> None:
        for pn in plan.nodes:
            self._count_node(plan, pn, gid, ranks)
        self._count_plan(plan, ranks)

    def _count_plan(self, plan: GraphPlan, ranks: int) -> None:
        for what, counts in (("merged", plan.merged), ("dropped", plan.dropped)):
            for label, count in counts.items():
                getattr(self, what)[label] += count * ranks
        for key, v in plan.stats.items():
            self.stats[key] += v * ranks

    def _count_node(self, plan: GraphPlan, pn: PlannedNode, gid: str, ranks: int) -> None:
        if pn.index == 0 and self.omit_start:
            return
        if pn.role == COLL and pn.node.collective.type == pb.COLL_ALL_TO_ALL:
            return  # counted per rank: even or uneven
        label = pn.label + "(cpu)" if pn.role == COMP and plan.is_cpu(pn) else pn.label
        self.mapped[label] += ranks
        _, raised = self._static_tail(pn, gid)
        if raised:
            what = "comm_size" if pn.role == COLL else "p2p bytes 0"
            self.mapped[f"{what}->raised to {self.splits if pn.role == COLL else 1} B"] += ranks

    def write_rank_files(self, dest: Path) -> list[str]:
        names: list[str] = []
        ranks_of = self.job.ranks_of_graph()
        for gid in sorted(ranks_of):
            plan = self.plans[gid]
            ranks = ranks_of[gid]
            if plan.streamed and not plan.has_all_to_all:
                self._stream_ranks(dest, plan, gid, ranks)
                continue
            self._count_static(plan, gid, len(ranks))
            heads = None
            if not plan.has_all_to_all or not any(self._a2a_p2p_any(r, plan) for r in ranks):
                shift = 0 if self.omit_start else 1
                heads = [b"" if pn.index == 0 and self.omit_start else
                         self._head(pn, pn.index + shift, (d + shift for d in pn.deps if d or shift), gid)
                         for pn in plan.nodes]
            for r in ranks:
                name = f"{WORKLOAD_PREFIX}.{r}.et"
                data = (self._fast_rank(r, plan, heads) if heads is not None
                        else self._general_rank(r, plan, gid))
                (dest / name).write_bytes(data)
        for r in range(self.world, self.npus):
            # ASTRA-sim needs at least 2 NPUs: pad with idle ranks of one 1 µs compute node.
            idle = et.Node(id=1, name="idle (padding: ASTRA-sim needs at least 2 NPUs)",
                           type=et.COMP_NODE, duration_micros=1)
            idle.attr.append(_attr("is_cpu_op", bool_val=False))
            data = self._metadata() + _delimited(idle.SerializeToString(deterministic=True))
            (dest / f"{WORKLOAD_PREFIX}.{r}.et").write_bytes(data)
            self.mapped["idle rank added (ASTRA-sim needs >= 2 NPUs)"] += 1
        for r in range(self.npus):
            names.append(f"{WORKLOAD_PREFIX}.{r}.et")
        return names

    def _stream_ranks(self, dest: Path, plan: GraphPlan, gid: str, ranks: list[int]) -> None:
        """Write the files of ``ranks`` (bound to the streamed plan ``plan``) side by side, node
        by node as the plan makes them: each node's rank-independent bytes once, then each
        rank's own attributes. The same bytes as :meth:`_fast_rank`; what is held is the
        plan's id map and one node, whatever the graph's repeat count. At most
        ``STREAM_FILES`` files are open at once (more ranks: the graph is planned again)."""
        shift = 0 if self.omit_start else 1
        meta = self._metadata()
        for lo in range(0, len(ranks), STREAM_FILES):
            chunk = ranks[lo:lo + STREAM_FILES]
            files = [open(dest / f"{WORKLOAD_PREFIX}.{r}.et", "wb", buffering=1 << 16)  # noqa: SIM115
                     for r in chunk]
            try:
                for f in files:
                    f.write(meta)
                for pn in plan.iter_nodes():
                    if lo == 0:
                        self._count_node(plan, pn, gid, len(ranks))
                    if pn.index == 0:
                        if self.omit_start:
                            continue
                        for r, f in zip(chunk, files, strict=True):
                            f.write(_delimited(self._start_node(r, plan)))
                        continue
                    head = self._head(pn, pn.index + shift, (d + shift for d in pn.deps if d or shift), gid)
                    if pn.role == COMP:
                        data = _delimited(head)
                        for f in files:
                            f.write(data)
                    elif pn.role == COLL:
                        group = pn.node.collective.group
                        for r, f in zip(chunk, files, strict=True):
                            f.write(_delimited(head + self._pg_attr(r, group)))
                    else:
                        for r, f in zip(chunk, files, strict=True):
                            f.write(_delimited(head + self._p2p_attrs(r, pn.node)))
            finally:
                for f in files:
                    f.close()
        self._count_plan(plan, len(ranks))

    def time_report(self) -> dict:
        """What the export did with the measured time, summed over ranks, and the ranks whose
        measured busy time lost more than 1 % (no counterpart in the export)."""
        out = {k: int(v) for k, v in sorted(self.stats.items())}
        lossy = []
        for r in self.job.ranks():
            st = self.plans[self.job.binding(r).graph].stats
            busy, lost = st.get("busy_ns", 0), st.get("lost_busy_ns", 0)
            if busy and lost > 0.01 * busy:
                lossy.append({"rank": r, "busy_ns": busy, "lost_ns": lost,
                              "lost_pct": round(100.0 * lost / busy, 2)})
        out["ranks_losing_over_1pct"] = lossy
        return out

    def _a2a_p2p_any(self, rank: int, plan: GraphPlan) -> bool:
        return any(pn.role == COLL and pn.node.collective.type == pb.COLL_ALL_TO_ALL
                   and self._a2a_matrix(rank, pn) is not None for pn in plan.nodes)

    def _metadata(self) -> bytes:
        return _delimited(et.GlobalMetadata(version=METADATA_VERSION).SerializeToString(
            deterministic=True))

    def _fast_rank(self, rank: int, plan: GraphPlan, heads: list[bytes]) -> bytes:
        parts = [self._metadata()]
        for pn, head in zip(plan.nodes, heads, strict=True):
            if pn.index == 0:
                if self.omit_start:
                    continue
                data = self._start_node(rank, plan)
            elif pn.role == COLL:
                if pn.node.collective.type == pb.COLL_ALL_TO_ALL:
                    self.mapped["all_to_all(even)->ALL_TO_ALL"] += 1
                data = head + self._pg_attr(rank, pn.node.collective.group)
            elif pn.role == COMP:
                data = head
            else:
                data = head + self._p2p_attrs(rank, pn.node)
            parts.append(_delimited(data))
        return b"".join(parts)

    def _general_rank(self, rank: int, plan: GraphPlan, gid: str) -> bytes:
        """Message-by-message build, for graphs whose uneven all-to-all becomes send/recv."""
        parts = [self._metadata()]
        out_ids: list[list[int]] = []
        next_id = 1
        a2a_tags = self._a2a_tags(rank, plan)
        for pn in plan.nodes:
            deps = sorted({i for d in pn.deps for i in out_ids[d]})
            if pn.index == 0:
                if self.omit_start:
                    out_ids.append([])
                    continue
                parts.append(_delimited(self._start_node(rank, plan)))
                out_ids.append([next_id])
                next_id += 1
                continue
            matrix = (self._a2a_matrix(rank, pn)
                      if pn.role == COLL and pn.node.collective.type == pb.COLL_ALL_TO_ALL else None)
            if matrix is None:
                if pn.role == COLL and pn.node.collective.type == pb.COLL_ALL_TO_ALL:
                    self.mapped["all_to_all(even)->ALL_TO_ALL"] += 1
                data = self._head(pn, next_id, deps, gid)
                if pn.role == COLL:
                    data += self._pg_attr(rank, pn.node.collective.group)
                elif pn.role != COMP:
                    data += self._p2p_attrs(rank, pn.node)
                parts.append(_delimited(data))
                out_ids.append([next_id])
                next_id += 1
                continue
            ids = []
            if self._is_even(matrix):
                self.mapped["all_to_all(even)->COMM_SEND_NODE/COMM_RECV_NODE per peer"] += 1
            else:
                how = ("in_split_bytes" if SPLIT_ATTR in pn.node.attrs
                       else "sizes proportional to output bytes")
                self.mapped[f"all_to_all(uneven, {how})->COMM_SEND_NODE/COMM_RECV_NODE per peer"] += 1
            for msg in self._a2a_messages(rank, pn, matrix, a2a_tags):
                kind, peer, size, tag = msg
                n = _base_node(pn, next_id, deps, False, plan.origin_ns)
                n.name = f"{pn.node.name}[a2a#{pn.node.collective.seq} {kind}:{peer}]"
                n.type = et.COMM_SEND_NODE if kind == "send" else et.COMM_RECV_NODE
                src, dst = (rank, peer) if kind == "send" else (peer, rank)
                n.attr.extend([_attr("comm_size", int64_val=size),
                               _attr("comm_src", int32_val=src),
                               _attr("comm_dst", int32_val=dst),
                               _attr("comm_tag", int32_val=tag)])
                parts.append(_delimited(n.SerializeToString(deterministic=True)))
                ids.append(next_id)
                next_id += 1
            out_ids.append(ids)
        return b"".join(parts)

    def _a2a_instances(self, rank: int, plan: GraphPlan):
        b = self.job.binding(rank)
        for pn in plan.nodes:
            if pn.role == COLL and pn.node.collective.type == pb.COLL_ALL_TO_ALL:
                matrix = self._a2a_matrix(rank, pn)
                if matrix is not None:
                    pg_id = b.groups[pn.node.collective.group]
                    yield pn, (pg_id, pn.node.collective.seq), matrix

    def _a2a_tags(self, rank: int, plan: GraphPlan) -> dict[tuple[int, int, int, str], int]:
        """Tags of the send/recv that uneven all-to-alls become: per (sender, receiver), the
        messages are numbered in (group id, seq) order, which both ends compute alike."""
        per_pair: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for _pn, inst, matrix in self._a2a_instances(rank, plan):
            members = list(self.job.group(inst[0]).ranks)
            me = members.index(rank)
            for j, peer in enumerate(members):
                if j == me:
                    continue
                if matrix[me][j] > 0:
                    per_pair.setdefault(("send", peer), []).append(inst)
                if matrix[j][me] > 0:
                    per_pair.setdefault(("recv", peer), []).append(inst)
        tags: dict[tuple[int, int, int, str], int] = {}
        for (kind, peer), insts in per_pair.items():
            for i, inst in enumerate(sorted(insts)):
                tags[(inst[0], inst[1], peer, kind)] = A2A_TAG_BASE + i
        return tags

    def _a2a_messages(self, rank: int, pn: PlannedNode, matrix: list[list[int]],
                      tags: dict[tuple[int, int, int, str], int]):
        pg_id = self.job.binding(rank).groups[pn.node.collective.group]
        members = list(self.job.group(pg_id).ranks)
        me = members.index(rank)
        n = len(members)
        seq = pn.node.collective.seq
        order = [(me + k) % n for k in range(1, n)]  # ring order spreads the load
        for j in order:
            if matrix[me][j] > 0:
                yield "send", members[j], matrix[me][j], tags[(pg_id, seq, members[j], "send")]
        for j in order:
            if matrix[j][me] > 0:
                yield "recv", members[j], matrix[j][me], tags[(pg_id, seq, members[j], "recv")]


class ExportPlan:
    """An export planned but not yet written: :meth:`write` writes the folder, :meth:`view`
    gives the exported nodes as an echo-et Job (for echo-et's own replay of the export)."""

    def __init__(self, job: Job, options: ExportOptions | None = None):
        opts = options or ExportOptions()
        if opts.host_time not in ("keep", "fold"):
            raise OptionError("host_time", f"host time {opts.host_time!r}: use keep or fold")
        if opts.all_to_all not in configs.ALL_TO_ALL_MAPPINGS:
            raise OptionError("all_to_all", f"all-to-all mapping {opts.all_to_all!r}: use "
                              + " or ".join(configs.ALL_TO_ALL_MAPPINGS))
        issues = check_job(job)
        if issues:
            more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
            raise CheckError(f"job fails check: {issues[0]}{more}")
        hw = job.manifest.hardware
        self.job = job
        self.options = opts
        self.network = configs.network_for(max(MIN_NPUS, job.world_size), hw.gpus_per_node,
                                           hw.intra_node_bw_gbps, hw.inter_node_bw_gbps, opts)
        self._ex = _Exporter(job, opts)
        self._ex.plan()

    @property
    def plans(self) -> dict[str, GraphPlan]:
        return self._ex.plans

    def with_network(self, options: ExportOptions) -> ExportPlan:
        """The same plan with the network of ``options`` (bandwidths, latencies, topology);
        the node lists do not depend on the network."""
        hw = self.job.manifest.hardware
        if ((options.align_start, options.host_time, options.all_to_all)
                != (self.options.align_start, self.options.host_time, self.options.all_to_all)):
            return ExportPlan(self.job, options)
        out = ExportPlan.__new__(ExportPlan)
        out.job, out.options, out._ex = self.job, options, self._ex
        self._ex.opts, self._ex.splits = options, options.splits   # sizes are set at writing
        out.network = configs.network_for(max(MIN_NPUS, self.job.world_size), hw.gpus_per_node,
                                          hw.intra_node_bw_gbps, hw.inter_node_bw_gbps, options)
        return out

    @property
    def offsets_us(self) -> dict[int, int]:
        """Each rank's start offset (whole µs) as written in its first node."""
        return dict(self._ex.offsets_us)

    def view(self) -> Job:
        from .view import view_job

        return view_job(self.job, self._ex.plans, self._ex.offsets_us)

    def write(self, dest: str | os.PathLike[str]) -> dict:
        """Write the folder at ``dest`` (atomically, after the contract check); returns what
        was written (``workload_prefix``, ``ranks``, ``files``, ``mapped``/``merged``/
        ``dropped`` counts, ``time``, ``start_offsets_us``, network, groups)."""
        from .check import check_export

        ex, net, opts = self._ex, self.network, self.options
        dest = Path(dest)
        with atomic_dir(dest, replaceable=is_export_folder,
                        kind="an ASTRA-sim export") as tmp:
            files = ex.write_rank_files(tmp)
            (tmp / FILE_NAMES["network"]).write_text(configs.network_yaml(net))
            (tmp / FILE_NAMES["system"]).write_text(configs.system_json(len(net.npus_count), opts.splits))
            (tmp / FILE_NAMES["remote_memory"]).write_text(configs.remote_memory_json())
            (tmp / FILE_NAMES["comm_group"]).write_text(configs.comm_group_json(ex.used_groups))
            (tmp / FILE_NAMES["offsets"]).write_text(configs.offsets_json(ex.offsets_us, net.npus))
            run = tmp / FILE_NAMES["run"]
            run.write_text(configs.run_sh(net.npus, bool(ex.used_groups)))
            run.chmod(0o755)
            problems = check_export(tmp)
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                raise EchoError(f"export fails the ASTRA-sim contract check: {problems[0]}{more}")
        return {
            "output": str(dest),
            "workload_prefix": str(dest / WORKLOAD_PREFIX),
            "ranks": net.npus,
            "job_ranks": self.job.world_size,
            "files": files + sorted(FILE_NAMES.values()),
            "mapped": dict(sorted(ex.mapped.items())),
            "merged": dict(sorted(ex.merged.items())),
            "dropped": dict(sorted(ex.dropped.items())),
            "time": ex.time_report(),
            "start_offsets_us": {str(r): v for r, v in sorted(ex.offsets_us.items()) if v},
            "groups": len(ex.used_groups),
            "network": {"topology": net.topology, "npus_count": net.npus_count,
                        "bandwidth_gbps": net.bandwidth, "latency_ns": net.latency},
            "preferred_dataset_splits": opts.splits,
            "command": "ASTRA_SIM_BIN=<binary> sh " + str(dest / FILE_NAMES["run"]),
        }


def export(job: Job, dest: str | os.PathLike[str], options: ExportOptions | None = None) -> dict:
    """Write ``job`` as an ASTRA-sim input folder at ``dest``; returns what was written
    (see :meth:`ExportPlan.write`)."""
    return ExportPlan(job, options).write(dest)


__all__ = ["A2A_TAG_BASE", "ExportPlan", "export"]
