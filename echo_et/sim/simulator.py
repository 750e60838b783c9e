"""The event-driven simulator: compose one training step over all ranks of a Job.

Shaped like ``torch.fx.Interpreter``: :meth:`Simulator.run` walks every rank's program and
asks one overridable method per kind of work how long it takes::

    run()
     ├─ compute(node, measured_ns, rank)      compute kernel (or host compute, CPU-only jobs)
     ├─ memcpy(node, measured_ns, rank)       memcpy / memset
     ├─ host(node, measured_ns, rank)         host time between and inside operators
     ├─ comm_unknown(node, measured_ns, rank) communication kernel of an unknown library
     ├─ collective(call) -> ns                own time of a collective, once all members arrived
     ├─ p2p(call) -> ns                       own time of a send/recv pair
     └─ slowdown(node, duration_ns, overlap_ratio, rank) -> factor
                                              compute that overlaps communication (predict)

:class:`Simulator` replays measured durations; :class:`Predictor` takes communication from a
CC model and applies the overlap-slowdown model. A what-if experiment is a subclass::

    class SlowTP(Predictor):
        def collective(self, call):
            t = super().collective(call)
            return 2 * t if call.group.role == pb.ROLE_TP else t

    result = SlowTP(job, options, comm_model=model).run()

Semantics (see ``docs/simulator.md``): each stream runs its items in order, one at a time;
an item starts when its stream is free and its dependencies are done, plus the measured
gap (see :mod:`echo_et.sim.program`); a collective starts on every member when the last
one arrives and runs for its own time (one for all members, or one per member: replay
keeps each member's measured time after the last arrival); a send and its recv start when
both are posted. Timing rules that depend on a rank's identity must also be
reflected in :meth:`symmetry_key` (or run with ``symmetry=False``), because ranks found
equivalent share one simulated timeline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.intervals import covered_length, merge_intervals
from echo_et.ir.job import Job
from echo_et.ir.job_checker import assert_valid
from echo_et.ir.limits import MAX_NS
from echo_et.ir.repeats import seq_key
from echo_et.ir.schema import collective_name, pb
from echo_et.ir.summary import comm_libraries
from echo_et.sim.blocks import CAT_MACRO, BlockRun, BlockTable, NotCompact, compile_compact, same_durations, unique_rows
from echo_et.sim.diagnose import check_collective_match, check_p2p_match, deadlock_message
from echo_et.sim.gc_pause import cyclic_gc_paused
from echo_et.sim.linked_blocks import Bundle, Ends, JointTables, Link, NotLinked, link_bundles
from echo_et.sim.meeting_keys import CollectiveMeetings
from echo_et.sim.program import (
    CAT_COLL,
    CAT_COMM_OTHER,
    CAT_COMPUTE,
    CAT_COPY,
    CAT_HOST,
    CAT_OTHER,
    CAT_P2P,
    CAT_SYNC,
    RENDEZVOUS_CATS,
    Program,
    compile_graph,
)
from echo_et.sim.replay_times import measured_tails, one_node_time
from echo_et.sim.result import RankResult, SimResult, SimTimeline
from echo_et.sim.state import CollectiveKey, Meeting, MeetingKey, P2PKey, ParticipantTuple, RankState
from echo_et.sim.symmetry import Partition, identity_partition, rank_partition

_new_tuple = tuple.__new__


class _BundleStuck(Exception):
    """Linked block occurrences wait for one another through the skeleton: simulate them
    expanded."""


@dataclass
class SimOptions:
    """What-if knobs and run settings shared by both modes."""

    compute_scale: float = 1.0                 # multiplies compute durations (0.5 = 2x faster GPU)
    stragglers: dict[int, float] = field(default_factory=dict)  # rank -> factor on its non-comm time
    symmetry: bool = True                      # simulate equivalent ranks once
    gpus_per_node: int | None = None           # overrides the job's hardware.gpus_per_node
    align_start: bool = False                  # start every rank at 0 instead of its measured offset
    slowdown_iterations: int = 6               # predict: max composer <-> slowdown rounds
    check: bool = True                         # run the IR checker first
    critical_top: int = 10                     # contributors listed in the critical path
    keep_acausal_deps: bool = False            # obey dependencies the measured times contradict
    p2p_eager_bytes: int = 4 << 20             # sends up to this size do not wait for their recv
    critical_nodes: bool = False               # count the nodes on the critical path (fits)
    repeats: bool = True                       # predict: place repeat blocks in closed form (exact); False expands them

    def to_json(self) -> dict[str, Any]:
        return {
            "compute_scale": self.compute_scale,
            "stragglers": {str(k): v for k, v in sorted(self.stragglers.items())},
            "symmetry": self.symmetry,
            "gpus_per_node": self.gpus_per_node,
            "align_start": self.align_start,
            "p2p_eager_bytes": self.p2p_eager_bytes,
        }


class CommCall:
    """One communication operation whose members have all arrived.

    ``measured_ns`` (each participant's measured kernel duration), ``ranks`` and ``nodes``
    are computed on first use."""

    __slots__ = ("op", "coll_type", "in_bytes", "out_bytes", "dtype", "group", "seq", "root", "src", "dst",
                 "_parts", "_one_node")

    def __init__(self, op: str, coll_type: int, in_bytes: int, out_bytes: int, dtype: str, group: pb.ProcessGroup,
                 seq: int, root: int, src: int, dst: int, parts: list[ParticipantTuple], one_node: bool = False):
        self.op = op                  # collective name ("all_reduce", ...) or "send_recv"
        self.coll_type = coll_type    # CollectiveType (0 for send/recv)
        self.in_bytes = in_bytes      # per-rank input bytes (send/recv: message bytes)
        self.out_bytes = out_bytes
        self.dtype = dtype
        self.group = group            # the concrete group (of the first member to arrive)
        self.seq = seq
        self.root = root              # group rank of the root, -1 when none
        self.src = src                # send/recv: global ranks; -1 for collectives
        self.dst = dst
        self._parts = parts
        self._one_node = one_node     # every member runs the same node of one shared graph

    @property
    def measured_ns(self) -> list[int]:
        return [st.program.measured_dur[it] for st, it, _ in self._parts]

    def shortest_measured_ns(self) -> int:
        """The shortest participant kernel: the last member to arrive waited least."""
        parts = self._parts
        st0, it0, _ = parts[0]
        if self._one_node or all(st.program is st0.program and it == it0 for st, it, _ in parts):
            return st0.program.measured_dur[it0]
        return min(self.measured_ns)

    def measured_tails_ns(self) -> int | list[int]:
        """Replay time of each participant after the last one arrived, as measured: its
        kernel end minus the start of the latest-starting member's kernel (job clock).
        Gloo (and a busy CPU) does not end a collective on every rank at once; NCCL
        kernels end within microseconds of each other. When the clocks of the ranks
        disagree (a tail below 0 or above the member's own kernel), all get the shortest
        kernel instead."""
        return measured_tails(self._parts, self._one_node)

    @property
    def last_arrival_ns(self) -> int:
        """When the last member arrived (simulated time): a collective starts on every member then."""
        return max(t for _, _, t in self._parts)

    @property
    def ranks(self) -> list[int]:
        """The simulated (representative) ranks taking part."""
        return [st.rank for st, _, _ in self._parts]

    @property
    def nodes(self) -> list[pb.Node]:
        return [st.node(it) for st, it, _ in self._parts]


class Simulator:
    """Replay: every measured duration is kept, and the simulator re-creates the waits
    between ranks. A collective (or send/recv) starts on every member when the last one
    arrives; each member then runs for its measured *tail*: its measured kernel end minus
    the measured start of the latest-starting member's kernel (job clock), so the measured
    wait inside the kernel is not counted twice. When the ranks' clocks disagree (a tail
    below 0 or longer than the member's own kernel), every member gets the shortest
    measured kernel instead (see :meth:`CommCall.measured_tails_ns`). See the module
    docstring for the override map."""

    mode = "replay"

    def __init__(self, job: Job, options: SimOptions | None = None):
        self.job = job
        self.options = options or SimOptions()
        gpn = self.options.gpus_per_node
        self.gpus_per_node = int(gpn if gpn else job.manifest.hardware.gpus_per_node or 0)
        self._programs: dict[str, Program] = {}
        self._states: list[RankState] = []
        self._meetings: dict[MeetingKey, Meeting] = {}
        self._active: list[RankState] = []    # ranks with ready items (each once: RankState.queued)
        self._events = 0
        self._partition: Partition | None = None
        self._origin: dict[int, int] = {}
        self._members_of: dict[int, frozenset[int]] = {}  # group class -> rank classes that meet on it
        self._meeting_size_of: dict[int, int] = {}       # group class -> members a collective waits for
        self._group_by_id = {g.id: g for g in job.manifest.groups}
        self._slowdown_info: dict[str, Any] = {}
        self._block_tables = BlockTable()
        self._joint_tables = JointTables()
        self._bundles: list[Bundle] = []
        self._graphs: dict[str, Graph] = {}      # graph id -> the graph its program was compiled from
        self._hot: list[tuple] = []              # class id -> what _drain reads (_hot_locals)
        # replay's own hooks (not overridden): a meeting's own time comes from replay_times directly
        self._replay_collective = type(self).collective is Simulator.collective
        self._replay_p2p = type(self).p2p is Simulator.p2p

    # -- override points ---------------------------------------------------------------------
    def straggler(self, rank: int) -> float:
        return float(self.options.stragglers.get(rank, 1.0))

    def compute(self, node: pb.Node | None, measured_ns: int, rank: int) -> int:
        return round(measured_ns * self.options.compute_scale * self.straggler(rank))

    def memcpy(self, node: pb.Node | None, measured_ns: int, rank: int) -> int:
        return round(measured_ns * self.straggler(rank))

    def host(self, node: pb.Node | None, measured_ns: int, rank: int) -> int:
        return round(measured_ns * self.straggler(rank))

    def comm_unknown(self, node: pb.Node | None, measured_ns: int, rank: int) -> int:
        return measured_ns

    def collective(self, call: CommCall) -> int | list[int]:
        """Own time of a collective once every member arrived: one value for all members,
        or one per member (in ``call.ranks`` order). Replay keeps each member's measured
        time after the last member arrived, so the waits are re-created, never counted
        twice."""
        return call.measured_tails_ns()

    def p2p(self, call: CommCall) -> int | list[int]:
        return call.measured_tails_ns()

    def slowdown(self, node: pb.Node, duration_ns: int, overlap_ratio: float, rank: int) -> float:
        """Factor on a compute kernel's duration when ``overlap_ratio`` of it overlaps
        communication. Replay keeps measured times, which already contain the slowdown."""
        return 1.0

    def uses_slowdown(self) -> bool:
        return False

    def symmetry_key(self, rank: int) -> Hashable:
        """Everything besides its graph that makes a rank's timeline differ from another's."""
        return self.straggler(rank)

    # -- running -----------------------------------------------------------------------------
    def run(self) -> SimResult:
        with cyclic_gc_paused():   # nothing the run allocates is cyclic garbage (see gc_pause)
            return self._run()

    def _run(self) -> SimResult:
        job = self.job
        if self.options.check:
            assert_valid(job)
        ranks = job.ranks()
        if not ranks:
            raise EchoError(f"{job.source or 'job'}: no rank is bound to a graph; nothing to simulate")
        for r in ranks:
            gid = job.binding(r).graph
            if gid not in self._programs:
                self._programs[gid] = self._compile(gid)
        self._partition = self._make_partition(ranks)
        self._setup_states()
        base = self._base_durations()
        if not self._link_blocks():
            self._setup_states()
            base = self._base_durations()
        durs = {id(st): base[st.durations_key] for st in self._states}
        try:
            self._simulate(durs)
        except _BundleStuck:
            # bundles that wait for one another through the skeleton: node by node
            self._expand_linked()
            self._setup_states()
            base = self._base_durations()
            durs = {id(st): base[st.durations_key] for st in self._states}
            self._simulate(durs)
        self._check_horizon()
        if self.uses_slowdown():
            self._iterate_slowdown(base)
        return self._result()

    def _check_horizon(self) -> None:
        """Every simulated time within MAX_NS (the IR's range, int64 with room for sums): a Job
        check accepts may still be priced beyond it (a link of 1e-30 GB/s), and that is one
        line, not an overflow in the analysis."""
        for st in self._states:
            if st.item_end and max(st.item_end) > MAX_NS:
                raise EchoError(f"rank {st.rank}: the simulated step runs past {MAX_NS} ns (146 years); "
                                "are the bandwidths, latencies and durations it is given plausible?")

    def keeps_blocks(self) -> bool:
        """Whether repeat blocks may be placed in closed form: predict mode (priced
        collectives), with symmetry (a block's collectives meet only their own class),
        without per-node critical-path counts."""
        o = self.options
        return o.repeats and o.symmetry and not o.critical_nodes and self.mode == "predict"

    def _compile(self, gid: str, *, blocks: bool = True) -> Program:
        """The program of graph ``gid``: its skeleton when its repeat blocks can be placed in
        closed form, else the expanded graph's (compiled from an expanded copy: the Job given
        to the simulator is never changed)."""
        graph = self.job.graph(gid)
        if graph.has_repeats:
            if blocks and self.keeps_blocks():
                try:
                    prog = compile_compact(graph)
                    self._graphs[gid] = graph
                    return prog
                except NotCompact:
                    pass
            graph = graph.copy()
            graph.expand()
        self._graphs[gid] = graph
        return compile_graph(graph, keep_acausal_deps=self.options.keep_acausal_deps)

    def _link_blocks(self) -> bool:
        """Bundle the block occurrences whose collectives, sends and recvs meet other rank
        classes (:mod:`echo_et.sim.linked_blocks`): they are placed together. When some cannot
        be (a partner outside every block or outside the job, members that disagree, a cycle,
        a communication hook of a subclass), their graphs are compiled expanded and False is
        returned (set up again)."""
        self._bundles = []
        holders = [st for st in self._states if st.blocks is not None and self._meets_others(st)]
        if not holders:
            return True
        try:
            bundles = self._bundle(holders)
        except NotLinked:
            self._expand_linked({st.program.graph_id for st in holders})
            return False
        for b in bundles:
            for m, (st, o) in enumerate(b.members):
                st.blocks.links[o] = Link(b, m)
        self._bundles = bundles
        return True

    def _meets_others(self, st: RankState) -> bool:
        """Whether a block of ``st`` holds a send, a recv, or a collective of a group that
        other rank classes are in."""
        part = self._partition
        assert part is not None
        for blk in st.program.compact.blocks:
            if blk.p2p:
                return True
            for rv in blk.rendezvous.values():
                g = st.group_of_key.get(rv.key)
                if g is None or self._meeting_size_of.get(part.group_class[g.id]) != 1:
                    return True
        return False

    def _bundle(self, holders: list[RankState]) -> list[Bundle]:
        if not self._meeting_hooks_pure():
            raise NotLinked("a communication hook of a subclass answers each meeting")
        part = self._partition
        assert part is not None
        bound = set(self.job.ranks())
        skeleton = [(0, k.group_class, 0, 0, k.seq) if isinstance(k, CollectiveKey) else
                    (1, k.group_class, k.sender, k.receiver, k.seq)
                    for st in self._states for k in st.meeting_key.values()]
        ends = Ends()
        nodes: list[tuple[RankState, int]] = []
        for st in holders:
            info = st.program.compact
            occs_of: dict[int, list[int]] = {}
            for o, occ in enumerate(info.occurrences):
                occs_of.setdefault(occ.block.index, []).append(o)
            for blk in info.blocks:
                rows, seq_keys = self._linked_items(st, blk, part, bound)
                if not rows:
                    continue
                at = occs_of.get(blk.index, [])
                names = sorted(set(seq_keys))
                offsets = np.zeros((len(at), len(names)), dtype=np.int64)
                for q, o in enumerate(at):
                    inst = info.occurrences[o].instance
                    if inst is not None and inst.seq_offsets:
                        offsets[q] = [inst.seq_offsets.get(k, 0) for k in names]
                rows_a = np.asarray([r[1:] for r in rows], dtype=np.int64)
                base_seq = np.asarray([r[0] for r in rows], dtype=np.int64)
                which = np.asarray([names.index(k) for k in seq_keys], dtype=np.int64)
                seqs = base_seq[None, :] + offsets[:, which]
                ends.add(rows_a, seqs, np.arange(len(nodes), len(nodes) + len(at), dtype=np.int64),
                         st.blocks.base[blk.index][rows_a[:, 0]])
                nodes.extend((st, o) for o in at)
        bundles = link_bundles(ends, nodes, np.asarray(skeleton, dtype=np.int64).reshape(-1, 5))
        for b in bundles:
            self._joint_tables.plan(b)
        return bundles

    def _linked_items(self, st: RankState, blk, part: Partition, bound: set[int]) -> tuple[list[tuple], list[str]]:
        """The items of block ``blk`` of ``st`` that meet other rank classes: per item (seq,
        local, kind, group class, a, b, members, send, eager, what), and its seq_offsets key."""
        rows: list[tuple] = []
        keys: list[str] = []
        for i, rv in sorted(blk.rendezvous.items()):
            g = st.group_of_key.get(rv.key)
            if g is None:
                raise NotLinked("a block's group key is not bound")
            gc = part.group_class[g.id]
            what = rv.in_bytes * 64 + rv.coll_type
            if rv.peer < 0:
                n = self._meeting_size_of.get(gc, 0)
                if n == 1:
                    continue        # meets only its own class: placed with its block alone
                rows.append((rv.seq, i, 0, gc, 0, 0, n, 0, 0, what))
            else:
                me = st.position_in_group.get(rv.key)
                if me is None or rv.peer >= len(g.ranks) or g.ranks[rv.peer] not in bound:
                    raise NotLinked("a send or recv whose partner is not simulated")
                a, b = (me, rv.peer) if rv.is_send else (rv.peer, me)
                eager = rv.is_send and rv.in_bytes <= self.options.p2p_eager_bytes
                rows.append((rv.seq, i, 1, gc, a, b, 2, int(rv.is_send), int(eager), what))
            keys.append(seq_key(blk.nodes[i]) or "")
        return rows, keys

    def _expand_linked(self, graphs: set[str] | None = None) -> None:
        """Compile expanded ``graphs`` (default: every graph with linked blocks); no bundle is
        left (the states are set up again)."""
        if graphs is None:
            graphs = {st.program.graph_id for st in self._states if st.blocks is not None and st.blocks.links}
        for gid in graphs:
            self._programs[gid] = self._compile(gid, blocks=False)
        self._bundles = []

    def _origins(self, ranks: list[int]) -> dict[int, int]:
        if self.options.align_start:
            return dict.fromkeys(ranks, 0)
        raw = {}
        for r in ranks:
            b = self.job.binding(r)
            raw[r] = self._programs[b.graph].measured_origin + b.clock_offset_ns
        low = min(raw.values())
        return {r: v - low for r, v in raw.items()}

    def _make_partition(self, ranks: list[int]) -> Partition:
        self._origin = self._origins(ranks)
        if not self.options.symmetry:
            return identity_partition(self.job)
        part = rank_partition(
            self.job,
            lambda r: (self.symmetry_key(r), self._origin[r]),
            lambda gid: self._programs[gid].ordered_keys,
            self.gpus_per_node,
        )
        # The quotient is only used when every representative binds distinct group classes.
        for r in part.reps:
            seen = [part.group_class[g] for g in self.job.binding(r).groups.values() if g in part.group_class]
            if len(seen) != len(set(seen)):
                return identity_partition(self.job)
        return part

    def _setup_states(self) -> None:
        """One RankState per class representative, with its groups bound and the meeting
        key of each of its rendezvous items."""
        job = self.job
        part = self._partition
        assert part is not None
        self._states = []
        self._members_of = self._group_members(part)
        self._meeting_size_of = {gc: len(members) for gc, members in self._members_of.items()}
        bound = set(job.ranks())
        collectives = CollectiveMeetings(self._meeting_size_of)
        for c, r in enumerate(part.reps):
            b = job.binding(r)
            prog = self._programs[b.graph]
            st = RankState(r, c, prog, self._graphs[b.graph], self._origin[r], int(b.clock_offset_ns),
                           durations_key=(b.graph, self.symmetry_key(r)))
            group_class = self._bind_groups(st, b)
            collectives.bind(st, group_class)
            self._p2p_meetings(st, group_class, bound)
            self._states.append(st)

    def _group_members(self, part: Partition) -> dict[int, frozenset[int]]:
        """Group class -> the rank classes bound to a group of that class (who a collective
        on it waits for)."""
        incidence: dict[int, set[tuple[int, str]]] = {}
        for r in self.job.ranks():
            for key, gid in self.job.binding(r).groups.items():
                incidence.setdefault(gid, set()).add((part.class_of[r], key))
        out: dict[int, frozenset[int]] = {}
        for gid, inc in incidence.items():
            gc = part.group_class[gid]
            if gc not in out:
                out[gc] = frozenset(c for c, _ in inc)
        return out

    def _bind_groups(self, st: RankState, binding: pb.RankBinding) -> dict[str, int]:
        """Resolve the rank's group keys; returns key -> group class."""
        part = self._partition
        assert part is not None
        prog, r = st.program, st.rank
        group_class: dict[str, int] = {}
        for key, gid in binding.groups.items():
            g = self._group_by_id.get(gid)
            if g is None:
                raise EchoError(f"rank {r}: group key {key!r} is bound to undefined group {gid}")
            st.group_of_key[key] = g
            group_class[key] = part.group_class[g.id]
            if key in prog.ordered_keys and r in g.ranks:
                st.position_in_group[key] = list(g.ranks).index(r)
        for key in prog.group_keys:
            if key not in group_class and any(rv.key == key for rv in prog.rendezvous.values()):
                it = next(i for i, rv in prog.rendezvous.items() if rv.key == key)
                raise EchoError(f"while simulating rank {r} {st.describe(it)}: group key {key!r} "
                                "is not bound for this rank")
        return group_class

    def _p2p_meetings(self, st: RankState, group_class: dict[str, int], bound: set[int]) -> None:
        """A send and its recv meet under one key (sender position, receiver position); a
        peer outside the job (a partial job) never comes, so only the local end is expected."""
        expected: dict[tuple[str, int], int] = {}
        for it, key, peer, seq, is_send in st.program.p2p_items:
            g = st.group_of_key[key]
            if peer >= len(g.ranks) or key not in st.position_in_group:
                raise EchoError(f"while simulating rank {st.rank} {st.describe(it)}: peer {peer} is not in "
                                f"group {g.id} of size {len(g.ranks)}")
            me = st.position_in_group[key]
            size = expected.get((key, peer))
            if size is None:
                size = 2 if g.ranks[peer] in bound else 1
                expected[(key, peer)] = size
            st.meeting_key[it] = _new_tuple(P2PKey, (group_class[key], me, peer, seq) if is_send
                                            else (group_class[key], peer, me, seq))
            st.meeting_size[it] = size
            if is_send and st.program.rendezvous[it].in_bytes <= self.options.p2p_eager_bytes:
                st.eager_sends.add(it)

    def _base_durations(self) -> dict[Hashable, list[int]]:
        """Each item's duration from the override points (rendezvous items get theirs when
        their members meet), once per distinct ``durations_key``."""
        out: dict[Hashable, list[int]] = {}
        for st in self._states:
            if st.program.compact is not None:
                st.blocks = BlockRun(st.program.compact, self._block_tables,
                                     [self._block_durations(st, blk) for blk in st.program.compact.blocks])
            if st.durations_key in out:
                continue
            prog, nodes, rank = st.program, st.graph.stored_nodes, st.rank
            durs = [0] * prog.n_items
            for it in range(prog.n_items):
                cat = prog.category[it]
                if cat in RENDEZVOUS_CATS:
                    continue
                idx = prog.node_of[it]
                node = nodes[idx] if idx >= 0 else None
                m = prog.measured_dur[it]
                try:
                    d = self._item_duration(cat, node, m, rank)
                except EchoError as e:
                    raise EchoError(f"while simulating rank {rank} {st.describe(it)}: {e}") from None
                durs[it] = max(0, int(d))
            out[st.durations_key] = durs
        return out

    def _item_duration(self, cat: int, node: pb.Node | None, measured_ns: int, rank: int) -> int:
        """The override point that times an item of this category (not a rendezvous)."""
        if cat == CAT_COMPUTE:
            return self.compute(node, measured_ns, rank)
        if cat == CAT_COPY:
            return self.memcpy(node, measured_ns, rank)
        if cat == CAT_COMM_OTHER:
            return self.comm_unknown(node, measured_ns, rank)
        if cat in (CAT_HOST, CAT_SYNC, CAT_OTHER):
            return self.host(node, measured_ns, rank)
        return measured_ns

    def _block_durations(self, st: RankState, blk) -> np.ndarray:
        """Base duration of each item of a block's body on ``st``, from the override points
        (a collective priced for the group its key is bound to on this rank)."""
        out = np.zeros(blk.n, dtype=np.int64)
        rank = st.rank
        for i, node in enumerate(blk.nodes):
            cat = blk.category[i]
            m = max(0, node.duration_ns)
            try:
                if cat == CAT_COLL:
                    rv = blk.rendezvous[i]
                    own = self.collective(CommCall(collective_name(rv.coll_type), rv.coll_type, rv.in_bytes,
                                                   rv.out_bytes, rv.dtype, st.group_of_key[rv.key], rv.seq,
                                                   rv.root, -1, -1, []))
                    d = own[0] if isinstance(own, list | tuple) else own
                elif cat == CAT_P2P:
                    d = self._block_p2p(st, blk.rendezvous[i])
                else:
                    d = self._item_duration(cat, node, m, rank)
            except EchoError as e:
                raise EchoError(f"while simulating rank {rank} node {node.id} ({node.name}): {e}") from None
            out[i] = max(0, int(d))
        return out

    def _block_p2p(self, st: RankState, rv) -> int:
        """A block's send or recv: the transfer of its message, priced from its sender."""
        g = st.group_of_key.get(rv.key)
        if g is None or rv.peer >= len(g.ranks) or not self._meeting_hooks_pure():
            return 0        # not linked (_bundle): simulated expanded, where its meeting prices it
        me, peer = st.rank, int(g.ranks[rv.peer])
        src, dst = (me, peer) if rv.is_send else (peer, me)
        own = self.p2p(CommCall("send_recv", 0, rv.in_bytes, rv.out_bytes, "", g, rv.seq, -1, src, dst, []))
        return own[0] if isinstance(own, list | tuple) else own

    def _place(self, st: RankState, macro: int) -> int:
        """Every input of a block occurrence is done: place it (its ports get their times and
        release what waits for them). Returns the items done (the macro and its ports)."""
        run = st.blocks
        o = run.info.occurrence_of_macro[macro]
        occ = run.info.occurrences[o]
        start, end, origin = st.item_start, st.item_end, st.origin_ns
        x = np.array([origin if q < 0 else (start[q] if fs else end[q]) for q, fs in occ.inputs], dtype=np.int64)
        link = run.links.get(o)
        if link is not None:
            self._bundle_arrive(link, x)
            return 1
        s, e, shift = run.place(o, x)
        for local, p in occ.ports:
            start[p] = int(s[local]) + shift
            end[p] = int(e[local]) + shift
            self._release(st, p)
        return 1 + len(occ.ports)

    def _bundle_arrive(self, link: Link, x: np.ndarray) -> None:
        """A member of a bundle has its inputs: the last one places every member's occurrence,
        gives their ports their times and queues the ranks it releases."""
        b = link.bundle
        b.arrived[link.member] = x
        b.count += 1
        if b.count < len(b.members):
            return
        placed, shift = self._joint_tables.place(b)
        active = self._active
        for (mst, mo), xm, (s, e, w) in zip(b.members, b.arrived, placed, strict=True):
            run = mst.blocks
            run.put(mo, xm, (s, e, shift), w)
            start, end = mst.item_start, mst.item_end
            ports = run.info.occurrences[mo].ports
            for local, p in ports:
                start[p] = int(s[local]) + shift
                end[p] = int(e[local]) + shift
                self._release(mst, p)
            mst.items_done += len(ports)
            self._events += len(ports)
            if mst.ready and not mst.queued:
                mst.queued = True
                active.append(mst)

    @staticmethod
    def _release(st: RankState, it: int) -> None:
        """Item ``it`` is done: its successors with nothing else to wait for become ready.
        (The event loop's hot path does the same inline.)"""
        pending, ready = st.pending_preds, st.ready
        for q in st.program.successors[it]:
            c = pending[q] - 1
            pending[q] = c
            if c == 0:
                ready.append(q)

    # -- the event loop ----------------------------------------------------------------------
    def _simulate(self, durs: dict[int, list[int]]) -> None:
        """Run every rank until no rank has a ready item. A rank runs (``_drain``) until it
        blocks at a meeting; the last member to arrive finishes the meeting and queues the
        ranks it unblocked."""
        self._meetings = {}
        self._events = 0
        self._active = []
        for b in self._bundles:
            b.reset()
        for st in self._states:
            st.reset(durs[id(st)])
            if st.blocks is not None:
                st.blocks.reset()
                if not st.blocks.durs:
                    st.blocks.use_base()
            if st.ready:
                st.queued = True
                self._active.append(st)
        self._joint_tables.new_run(self._bundles)
        # what _drain reads, per state (class id order), gathered once per run, not per call
        self._hot = [self._hot_locals(st) for st in self._states]
        active = self._active
        while active:
            st = active.pop()
            self._drain(st)     # still marked queued: what it finishes itself does not queue it again
            st.queued = False
        unfinished = [st for st in self._states if st.items_done < st.program.n_items]
        if unfinished and any(b.count for b in self._bundles):
            raise _BundleStuck()
        if unfinished or self._meetings:
            raise EchoError(self._deadlock_message(unfinished))

    @staticmethod
    def _hot_locals(st: RankState) -> tuple:
        """The lists and dicts ``_drain`` reads, in its order. ``_drain`` runs once per rank
        and meeting (131 thousand times at 1,024 ranks without symmetry): one tuple unpack
        instead of sixteen attribute reads there."""
        prog = st.program
        return (prog.stream_prev, prog.stream_gap, prog.start_preds, prog.end_waits, prog.successors,
                prog.is_rendezvous, prog.category, st.durations, st.item_start, st.item_end, st.pending_preds,
                st.ready, st.origin_ns, st.item_arrival, st.meeting_key, st.meeting_size)

    def _drain(self, st: RankState) -> None:
        """The hot loop: run the rank's ready items in stack order. An item starts at the
        latest of (its stream predecessor's end or the origin) + stream gap and every start
        gate's time + gap; a sync also ends no earlier than what it waits for. A rendezvous
        item arrives at its meeting instead of running."""
        (stream_prev, stream_gap, start_preds, end_waits, successors, is_rendezvous, category,
         dur, start, end, pending, ready, origin, arrival, meeting_key, meeting_size) = self._hot[st.class_id]
        meetings = self._meetings
        done = 0
        while ready:
            i = ready.pop()
            p = stream_prev[i]
            t = (end[p] if p >= 0 else origin) + stream_gap[i]
            for q, from_start, g in start_preds[i]:
                v = (start[q] if from_start else end[q]) + g
                if v > t:
                    t = v
            if is_rendezvous[i]:
                if category[i] == CAT_MACRO:
                    start[i] = end[i] = t
                    done += self._place(st, i)
                    continue
                arrival[i] = t
                key = meeting_key[i]
                if category[i] == CAT_P2P:
                    self._p2p_arrive(st, i, t, key)
                    continue
                m = meetings.get(key)
                if m is None:
                    m = Meeting(0, t, [])
                    meetings[key] = m
                m.arrived += 1
                m.parts.append((st, i, t))
                if t > m.last_arrival_ns:
                    m.last_arrival_ns = t
                if m.arrived >= meeting_size[i]:
                    del meetings[key]
                    self._complete(key, m.last_arrival_ns, m.parts)
                continue
            start[i] = t
            for q in end_waits[i]:
                v = end[q]
                if v > t:
                    t = v
            end[i] = t + dur[i]
            done += 1
            for s in successors[i]:
                c = pending[s] - 1
                pending[s] = c
                if c == 0:
                    ready.append(s)
        st.items_done += done
        self._events += done

    def _complete(self, key: MeetingKey, start_ns: int, parts: list[ParticipantTuple]) -> None:
        """All members of a collective arrived: it starts at ``start_ns`` on every one of them.
        (``_finish`` inlined: this runs once per member of every collective.)"""
        own = one_node_time(parts) if self._replay_collective else -1
        if own < 0:
            own = self._own_times(key, parts)
        active = self._active
        for n, (st, it, _) in enumerate(parts):
            st.item_start[it] = start_ns
            st.item_end[it] = start_ns + (own if type(own) is int else own[n])
            st.participants[it] = parts
            st.items_done += 1
            pending, ready = st.pending_preds, st.ready
            for q in st.program.successors[it]:
                c = pending[q] - 1
                pending[q] = c
                if c == 0:
                    ready.append(q)
            if ready and not st.queued:
                st.queued = True
                active.append(st)
        self._events += len(parts)

    def _p2p_arrive(self, st: RankState, item: int, t: int, key: MeetingKey) -> None:
        """A send or recv is posted. An eager send (small message: it goes to the peer's
        buffer) runs at once; its recv starts when both are posted and ends no earlier
        than the send. A larger send waits for its recv (rendezvous): both start when both
        are posted."""
        meetings = self._meetings
        m = meetings.get(key)
        if m is None:
            m = Meeting(0, t, [])
            meetings[key] = m
        m.arrived += 1
        m.parts.append((st, item, t))
        if t > m.last_arrival_ns:
            m.last_arrival_ns = t
        eager = item in st.eager_sends
        if m.arrived < st.meeting_size[item]:
            if eager:  # the recv is not posted yet: the send does not wait for it
                alone = [(st, item, t)]
                own = (st.program.measured_dur[item] if self._replay_p2p
                       else self._own(self._own_times(key, alone), 0))
                m.eager_send_end_ns = t + own
                self._finish(st, item, t, t + own, alone)
            return
        del meetings[key]
        parts, tmax, send_end = m.parts, m.last_arrival_ns, m.eager_send_end_ns
        own = self._own_times(key, parts)
        own = [own] * len(parts) if type(own) is int else own
        for (pst, pit, pt), o in zip(parts, own, strict=True):
            if pst.item_end[pit] >= 0:
                continue  # the eager send that ran already
            if pit in pst.eager_sends:
                # its recv was met first (the event loop goes rank by rank, not in time
                # order), but an eager send waits for nobody: it met only itself
                send_end = pt + o
                self._finish(pst, pit, pt, send_end, [(pst, pit, pt)])
        for (pst, pit, _), o in zip(parts, own, strict=True):
            if pst.item_end[pit] < 0:
                self._finish(pst, pit, tmax, max(tmax + o, send_end), parts)

    def _own_times(self, key: MeetingKey, parts: list[ParticipantTuple]) -> int | list[int]:
        """Own time of each participant from the ``collective`` / ``p2p`` hooks: one int when
        all members get the same, else one per participant."""
        st0, it0, _ = parts[0]
        rv0 = st0.program.rendezvous[it0]
        group = st0.group_of_key[rv0.key]
        try:
            if isinstance(key, CollectiveKey):
                prog0 = st0.program
                one_node = all(st.program is prog0 and it == it0 for st, it, _ in parts)
                if not one_node:
                    check_collective_match(parts, group)
                call = CommCall(collective_name(rv0.coll_type), rv0.coll_type, rv0.in_bytes, rv0.out_bytes,
                                rv0.dtype, group, rv0.seq, rv0.root, -1, -1, parts, one_node)
                own = self.collective(call)
            else:
                check_p2p_match(parts, group)
                if self._replay_p2p:
                    return measured_tails(parts)
                sender = next(((st, it) for st, it, _ in parts if st.program.rendezvous[it].is_send), None)
                if sender is not None:
                    s_st, s_it = sender
                    src = s_st.rank
                    dst = s_st.group_of_key[rv0.key].ranks[s_st.program.rendezvous[s_it].peer]
                else:
                    src, dst = group.ranks[key.sender], group.ranks[key.receiver]
                call = CommCall("send_recv", 0, rv0.in_bytes, rv0.out_bytes, "", group, rv0.seq, -1, src, dst,
                                parts)
                own = self.p2p(call)
        except EchoError as e:
            raise EchoError(f"while simulating rank {st0.rank} {st0.describe(it0)}: {e}") from None
        if type(own) is int:
            return own if own > 0 else 0
        if isinstance(own, list | tuple):
            if len(own) != len(parts):
                raise EchoError(f"while simulating rank {st0.rank} {st0.describe(it0)}: {len(own)} times for "
                                f"{len(parts)} participants")
            return [max(0, int(x)) for x in own]
        return max(0, int(own))

    @staticmethod
    def _own(own: int | list[int], n: int) -> int:
        """Participant ``n``'s own time from ``_own_times``' answer."""
        return own if type(own) is int else own[n]

    def _finish(self, st: RankState, it: int, start: int, end: int, parts: list[ParticipantTuple]) -> None:
        """A rendezvous item ran from ``start`` to ``end``: release its successors and queue
        the rank if it has ready items again."""
        st.item_start[it] = start
        st.item_end[it] = end
        st.participants[it] = parts
        st.items_done += 1
        self._events += 1
        self._release(st, it)
        if st.ready and not st.queued:
            st.queued = True
            self._active.append(st)

    def _deadlock_message(self, unfinished: list[RankState]) -> str:
        part = self._partition
        assert part is not None
        return deadlock_message(unfinished, self._meetings, self._states, part, self._members_of)

    # -- overlap slowdown --------------------------------------------------------------------
    def _iterate_slowdown(self, base: dict[Hashable, list[int]]) -> None:
        limit = max(1, self.options.slowdown_iterations)
        prev_steps = self._step_times()
        converged = False
        rounds = 0
        for rounds in range(1, limit + 1):  # noqa: B007 - reported below
            durs = {}
            same = self._meeting_hooks_pure()
            for st in self._states:
                before = st.blocks.durs if st.blocks is not None else None
                durs[id(st)] = self._slowed(st, base[st.durations_key])
                if same:
                    same = durs[id(st)] == st.durations and (before is None or same_durations(before, st.blocks.durs))
            if same:
                # Every duration is the one the last run used and the meeting hooks are pure:
                # running again would give the same times to the ns, so this round converges
                # at once without it (no compute overlapped communication, typically).
                self._repeat_round()
                converged = True
                break
            self._simulate(durs)
            self._check_horizon()
            steps = self._step_times()
            # converged: no rank's step time moved by more than 0.05 %
            if all(abs(steps[k] - prev_steps[k]) <= max(1, prev_steps[k] // 2000) for k in steps):
                converged = True
                break
            prev_steps = steps
        self._slowdown_info = {"applied": True, "rounds": rounds, "converged": converged}

    def _meeting_hooks_pure(self) -> bool:
        """Whether the hooks a run calls (``collective``, ``p2p``) are this class's own, which
        answer the same call the same way: then a run with unchanged durations repeats the
        last one exactly and need not run. A subclass that overrides them is always run."""
        return type(self).collective is Simulator.collective and type(self).p2p is Simulator.p2p

    def _repeat_round(self) -> None:
        """A slowdown round that would repeat the last run is not run: what a run counts
        beyond the states (none here) is counted as if it had."""

    def _slowed(self, st: RankState, base: list[int]) -> list[int]:
        if st.blocks is not None:
            return self._slowed_blocks(st, base)
        prog = st.program
        cats = np.asarray(prog.category)
        host = np.asarray(prog.host_stream)[np.asarray(prog.stream_of, dtype=np.int64)] if prog.n_items else cats
        start = np.asarray(st.item_start, dtype=np.int64)
        end = np.asarray(st.item_end, dtype=np.int64)
        comm = np.isin(cats, (CAT_COLL, CAT_P2P, CAT_COMM_OTHER))
        comp = np.flatnonzero((cats == CAT_COMPUTE) & ~host.astype(bool))
        out = list(base)
        if not comm.any() or comp.size == 0:
            return out
        lo, hi = merge_intervals(start[comm], end[comm])
        ov = covered_length(lo, hi, start[comp], end[comp])
        length = end[comp] - start[comp]
        nodes = st.graph.stored_nodes
        for k, it in enumerate(comp.tolist()):
            if ov[k] <= 0 or length[k] <= 0:
                continue
            r = float(ov[k]) / float(length[k])
            node = nodes[prog.node_of[it]]
            try:
                f = self.slowdown(node, base[it], min(1.0, r), st.rank)
            except EchoError as e:
                raise EchoError(f"while simulating rank {st.rank} {st.describe(it)}: {e}") from None
            out[it] = max(0, round(base[it] * f))
        return out

    def _slowed_blocks(self, st: RankState, base: list[int]) -> list[int]:
        """:meth:`_slowed` for a rank whose blocks were placed in closed form: the overlap of
        every compute item of the expanded step with every communication transfer, each
        occurrence's items slowed from its block's base durations. The ``slowdown`` hook is
        asked once per distinct (node, base duration, overlap): a steady pipeline repeats the
        same overlaps in every occurrence."""
        run = st.blocks
        info = run.info
        ft = run.flat(st.program, st.item_start, st.item_end, keep=False)
        out = list(base)
        per_occ = [run.base[occ.block.index] for occ in info.occurrences]
        comm = np.isin(ft.category, (CAT_COLL, CAT_P2P, CAT_COMM_OTHER))
        comp = np.flatnonzero((ft.category == CAT_COMPUTE) & ~ft.host)
        if comm.any() and comp.size:
            lo, hi = merge_intervals(ft.start[comm], ft.end[comm])
            ov = covered_length(lo, hi, ft.start[comp], ft.end[comp])
            length = ft.end[comp] - ft.start[comp]
            hit = np.flatnonzero((ov > 0) & (length > 0))
            at = comp[hit]
            occ, ref = ft.occ[at], ft.ref[at]
            block_of = np.asarray([o.block.index for o in info.occurrences] or [0], dtype=np.int64)
            slot = np.where(occ >= 0, block_of[np.maximum(occ, 0)], -1)   # -1: a skeleton item
            keys = np.stack((slot, ref, ov[hit], length[hit]), axis=1)
            uniq, inverse = unique_rows(keys)
            vals = np.empty(len(uniq), dtype=np.int64)
            nodes = st.graph.stored_nodes
            for u, (bk, rf, o_ns, l_ns) in enumerate(uniq.tolist()):
                r = min(1.0, float(o_ns) / float(l_ns))
                if bk < 0:
                    node, b = nodes[st.program.node_of[rf]], base[rf]
                else:
                    node, b = info.blocks[bk].nodes[rf], int(run.base[bk][rf])
                try:
                    f = self.slowdown(node, b, r, st.rank)
                except EchoError as e:
                    raise EchoError(f"while simulating rank {st.rank} node {node.id} ({node.name}): {e}") from None
                vals[u] = max(0, round(b * f))
            new = vals[inverse]
            sk = occ < 0
            for rf, v in zip(ref[sk].tolist(), new[sk].tolist(), strict=True):
                out[rf] = v
            bl = np.flatnonzero(~sk)
            if bl.size:
                order = bl[np.argsort(occ[bl], kind="stable")]
                o_sorted = occ[order]
                cuts = np.flatnonzero(np.diff(o_sorted)) + 1
                made: dict[bytes, np.ndarray] = {}    # equal slowed durations share one array
                for grp in np.split(order, cuts):
                    o = int(occ[grp[0]])
                    arr = per_occ[o].copy()
                    arr[ref[grp]] = new[grp]
                    per_occ[o] = made.setdefault(arr.tobytes(), arr)
        run.set_durations(per_occ)
        return out

    def _step_times(self) -> dict[int, int]:
        return {st.class_id: (max(st.item_end) - st.origin_ns if st.item_end else 0) for st in self._states}

    # -- results -----------------------------------------------------------------------------
    def _result(self) -> SimResult:
        from echo_et.sim.analysis import critical_path, critical_path_blocks, rank_breakdowns

        part = self._partition
        assert part is not None
        per_class = rank_breakdowns(self._states)
        ranks: dict[int, RankResult] = {}
        for r, c in part.class_of.items():
            b = per_class[c]
            ranks[r] = RankResult(rank=r, simulated_as=part.reps[c], **b)
        nodes: Counter | None = Counter() if self.options.critical_nodes else None
        if any(st.blocks is not None for st in self._states):
            cp = critical_path_blocks(self._states, part, self.options.critical_top)
        else:
            cp = critical_path(self._states, part, self.options.critical_top, nodes=nodes)
        for st in self._states:
            # the meetings' member lists hold the states themselves (a cycle between ranks):
            # the critical path was their last reader, and dropped here the states die with the
            # result by reference counting instead of waiting for a full cyclic collection (a
            # sweep's rows collect rarely: memory grew by tens of MB per row)
            st.participants = {}
        opts = self.options.to_json() | {"gpus_per_node": self.gpus_per_node}
        acausal = {gid: p.acausal_deps for gid, p in sorted(self._programs.items()) if p.acausal_deps}
        placeholders = sum(p.placeholder_comm for p in self._programs.values())
        return SimResult(
            mode=self.mode,
            ranks=ranks,
            critical_path=cp,
            simulated_ranks=len(self._states),
            events=self._events,
            slowdown=self._slowdown_info or {"applied": False},
            options=opts,
            diagnostics={"acausal_deps": acausal, "acausal_deps_kept": self.options.keep_acausal_deps,
                         "placeholder_comm_nodes": placeholders,
                         # communication of libraries the CC model does not price: measured time kept
                         "comm_kept_at_measured_time": comm_libraries(self.job)},
            timeline=SimTimeline(self._states, part, self.job),
            critical_nodes=dict(nodes) if nodes is not None else {},
        )
