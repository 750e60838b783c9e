"""Turn one traced rank's converted profile into its ex-situ graph.

The Kineto reader gives the measured program of the rank: host operators (nested), and on
a GPU their launches and kernels. In it, each communication call is only a span
``echo:comm#k`` (with the local output fill of the recording process group inside) and its
completion a marker ``echo:wait#k``; workload annotations are spans and markers too
(:mod:`echo_et.trace.annotations`). This module rebuilds the graph with:

- every ``echo:comm#k`` span replaced by an *issue* host op (its self time: the fill is cut
  out and the rest of the thread moves earlier by the fill's duration) and a collective /
  send / recv node taken from record k (type, bytes, dtype, group key, peer, root) on a
  communication stream: ``host-comm:<key>`` for collectives and
  ``host-comm:<key>:send|recv:<peer>`` for point-to-point on CPU (``gpu<d>-comm:...`` on a
  GPU), so that async transfers to and from one peer never wait on each other. The
  communication node depends on its issue op (DEP_DATA on CPU, DEP_LAUNCH on GPU, plus
  DEP_SYNC on the last kernel issued before it: NCCL waits for the current stream);
- every ``echo:wait#k`` marker replaced, on CPU, by a KIND_SYNC host node with DEP_SYNC on
  communication k (gloo blocks the caller); on a GPU by a DEP_SYNC from the next kernel the
  thread launches (``work.wait()`` makes the current stream wait);
- communication whose wait was never seen (DDP hands its work to C++ as a future) waited
  for by one KIND_SYNC node at the end of the issuing thread, and counted in ``dropped``;
- annotation spans and markers removed, their layer/phase/micro-batch/stage copied onto
  the nodes they enclose (kernels inherit from their launch, communication from its issue);
- host threads renamed ``host:0``, ``host:1``, ... (in order of first activity) and
  native thread ids cleared, so the same program traced twice gives the same structure.

Communication nodes have ``duration_ns = 0`` and ``attrs["timing"] = "placeholder"``: the
one device measured compute only; the simulator's collective model supplies their time.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from echo_et.errors import EchoError
from echo_et.ir import Graph, GraphBuilder
from echo_et.ir.conventions import ISSUE_PREFIX, WAIT_PREFIX
from echo_et.ir.schema import COLLECTIVE_BY_NAME, pb
from echo_et.trace import annotations
from echo_et.trace.records import COMM_SPAN, WAIT_SPAN, CommRecord, span_index

_HOST_KINDS = frozenset({pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC})
_GPU_STREAMS = frozenset({pb.STREAM_GPU_COMPUTE, pb.STREAM_GPU_COPY, pb.STREAM_GPU_COMM})


@dataclass
class SpliceResult:
    graph: Graph
    dropped: Counter = field(default_factory=Counter)


@dataclass
class _Interval:
    stream: int
    start: int
    end: int
    attrs: dict[str, str | int]


def splice(graph: Graph, records: Sequence[CommRecord], keys: Sequence[str], *,
           graph_id: str, device: str, where: str) -> SpliceResult:
    """The ex-situ graph of one rank. ``keys[k]`` is the graph-local group key of record k.
    ``where`` names the rank and layout in error messages."""
    return _Splicer(graph, records, keys, graph_id, device, where).run()


class _Splicer:
    def __init__(self, graph: Graph, records: Sequence[CommRecord], keys: Sequence[str],
                 graph_id: str, device: str, where: str):
        self.src = graph
        self.records = list(records)
        self.keys = list(keys)
        self.graph_id = graph_id
        self.gpu = device != "cpu"
        self.where = where
        self.dropped: Counter = Counter()
        self.nodes = sorted(graph.nodes, key=lambda n: n.id)
        self.by_id = {n.id: n for n in self.nodes}
        self.streams = {s.id: s for s in graph.header.streams}
        self.parent: dict[int, int] = {}
        self.launch: dict[int, int] = {}
        self.children: dict[int, list[int]] = defaultdict(list)
        for n in self.nodes:
            for d in n.deps:
                if d.kind == pb.DEP_CONTROL and n.id not in self.parent:
                    self.parent[n.id] = d.id
                    self.children[d.id].append(n.id)
                elif d.kind == pb.DEP_LAUNCH and n.id not in self.launch:
                    self.launch[n.id] = d.id

    def is_host(self, n: pb.Node) -> bool:
        s = self.streams.get(n.stream)
        if s is not None and s.kind in _GPU_STREAMS:
            return False
        return n.kind in _HOST_KINDS or (s is not None and s.kind == pb.STREAM_CPU_THREAD)

    # -- classification ----------------------------------------------------------------
    def classify(self) -> None:
        self.comm_span: dict[int, pb.Node] = {}
        self.wait_mark: dict[int, pb.Node] = {}
        self.removed: set[int] = set()
        self.intervals: list[_Interval] = []
        open_marks: dict[int, list[tuple[pb.Node, dict]]] = defaultdict(list)
        for n in self.nodes:
            k = span_index(n.name, COMM_SPAN)
            if k is not None:
                if k in self.comm_span or not 0 <= k < len(self.records):
                    self.dropped["ex_situ_comm_span_without_record"] += 1
                    self.removed.add(n.id)
                    self._remove_subtree(n.id)
                    continue
                self.comm_span[k] = n
                self._remove_subtree(n.id)
                continue
            k = span_index(n.name, WAIT_SPAN)
            if k is not None:
                self.removed.add(n.id)
                if k not in self.wait_mark:
                    self.wait_mark[k] = n
                continue
            parsed = annotations.parse(n.name)
            if parsed is None:
                continue
            self.removed.add(n.id)
            kind, attrs = parsed
            if kind == "span":
                self.intervals.append(_Interval(n.stream, n.start_ns, n.start_ns + n.duration_ns,
                                                attrs))
            elif kind == "begin":
                open_marks[n.stream].append((n, attrs))
            else:
                stack = open_marks[n.stream]
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i][1] == attrs:
                        b = stack.pop(i)[0]
                        self.intervals.append(_Interval(n.stream, b.start_ns, n.start_ns, attrs))
                        break
                else:
                    self.dropped["ex_situ_annotation_end_without_begin"] += 1
        for stack in open_marks.values():
            self.dropped["ex_situ_annotation_begin_without_end"] += len(stack)
        missing = [k for k in range(len(self.records)) if k not in self.comm_span]
        if missing:
            r = self.records[missing[0]]
            raise EchoError(f"{self.where}: {len(missing)} recorded communication calls (first: "
                            f"#{missing[0]} {r.op}) are missing from the profile; were they issued "
                            "outside the profiled step or on a thread the profiler cannot see?")
        # Kernels launched from removed host nodes (fills on a GPU) go with them.
        for n in self.nodes:
            lid = self.launch.get(n.id)
            if lid is not None and lid in self.removed and not self.is_host(n):
                self.removed.add(n.id)

    def _remove_subtree(self, root: int) -> None:
        todo = list(self.children.get(root, ()))
        while todo:
            c = todo.pop()
            self.removed.add(c)
            todo.extend(self.children.get(c, ()))

    # -- annotations -------------------------------------------------------------------
    def annotate(self) -> dict[int, dict[str, str | int]]:
        """Node id -> annotations, for kept host nodes (others inherit later)."""
        per_stream: dict[int, list[_Interval]] = defaultdict(list)
        for iv in self.intervals:
            per_stream[iv.stream].append(iv)
        out: dict[int, dict[str, str | int]] = {}
        for sid, ivs in per_stream.items():
            ivs.sort(key=lambda iv: (iv.start, -iv.end))
            members = [n for n in self.nodes if n.stream == sid]
            stack: list[tuple[int, dict]] = []   # (end, merged attrs)
            j = 0
            for n in members:
                t = n.start_ns
                while j < len(ivs) and ivs[j].start <= t:
                    iv = ivs[j]
                    while stack and stack[-1][0] <= iv.start:
                        stack.pop()
                    merged = dict(stack[-1][1]) if stack else {}
                    merged.update(iv.attrs)
                    stack.append((iv.end, merged))
                    j += 1
                while stack and stack[-1][0] <= t:
                    stack.pop()
                if stack:
                    out[n.id] = stack[-1][1]
        # Host threads without their own scopes (a GPU autograd thread) take the phase,
        # micro-batch and stage of the scope that was open on any thread at that time.
        phases = sorted((iv for iv in self.intervals if "phase" in iv.attrs),
                        key=lambda iv: iv.start)
        starts = [iv.start for iv in phases]
        for n in self.nodes:
            if not self.is_host(n) or n.id in self.removed:
                continue
            have = out.get(n.id, {})
            if "phase" in have:
                continue
            i = bisect.bisect_right(starts, n.start_ns) - 1
            while i >= 0 and phases[i].end <= n.start_ns:
                i -= 1
            if i >= 0:
                fill = {k: v for k, v in phases[i].attrs.items() if k not in have}
                out[n.id] = {**fill, **have}
        return out

    # -- time shift --------------------------------------------------------------------
    def shifts(self) -> dict[int, tuple[list[int], list[int]]]:
        """Per host stream: sorted fill end times and the cumulative fill time up to them."""
        fills: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for span in self.comm_span.values():
            for c in self.children.get(span.id, ()):
                cn = self.by_id[c]
                if cn.stream == span.stream:
                    fills[span.stream].append((cn.start_ns + cn.duration_ns, cn.duration_ns))
        out = {}
        for sid, items in fills.items():
            items.sort()
            ends, cum, total = [], [], 0
            for end, dur in items:
                total += dur
                ends.append(end)
                cum.append(total)
            out[sid] = (ends, cum)
        return out

    @staticmethod
    def shift_at(table: tuple[list[int], list[int]] | None, t: int) -> int:
        if table is None:
            return 0
        ends, cum = table
        i = bisect.bisect_right(ends, t) - 1
        return cum[i] if i >= 0 else 0

    # -- emission ----------------------------------------------------------------------
    def run(self) -> SpliceResult:
        self.classify()
        notes = self.annotate()
        shift = self.shifts()
        gb = GraphBuilder(self.graph_id)
        src_streams = sorted(self.streams.values(), key=lambda s: s.id)
        first_start: dict[int, int] = {}
        for n in self.nodes:
            if n.id not in self.removed:
                first_start.setdefault(n.stream, n.start_ns)
        host_ids = [s.id for s in src_streams if s.kind == pb.STREAM_CPU_THREAD
                    and s.id in first_start]
        host_ids.sort(key=lambda sid: (first_start[sid], sid))
        host_name = {sid: f"host:{i}" for i, sid in enumerate(host_ids)}
        new_sid: dict[int, int] = {}
        for sid in host_ids:
            new_sid[sid] = gb.stream(pb.STREAM_CPU_THREAD, host_name[sid])
        for s in src_streams:
            if s.id in first_start and s.id not in new_sid:
                new_sid[s.id] = gb.stream(s.kind, s.name, device=s.device, native_id=s.native_id)
        gpu_device = next((s.device for s in src_streams if s.kind in _GPU_STREAMS), 0)

        new_id: dict[int, int] = {}
        comm_node: dict[int, int] = {}           # record index -> new node id
        issue_thread: dict[int, int] = {}        # record index -> source host stream
        pending_wait: dict[int, list[tuple[int, int]]] = defaultdict(list)  # stream -> [(t, k)]
        # GPU work in launch order: NCCL starts a collective after everything already
        # launched on the current stream, which may start after the collective's issue.
        launched = sorted((self.by_id[self.launch[n.id]].start_ns, n.id) for n in self.nodes
                          if n.id not in self.removed and not self.is_host(n)
                          and n.kind in (pb.KIND_COMPUTE, pb.KIND_MEMCPY, pb.KIND_MEMSET)
                          and self.launch.get(n.id) in self.by_id)
        launch_times = [t for t, _ in launched]
        stream_waits: list[tuple[int, int]] = []  # (comm node id, issue time)
        keys_used: dict[str, int] = {}

        def new_times(n: pb.Node) -> tuple[int, int]:
            if self.is_host(n):
                table = shift.get(n.stream)
                s = n.start_ns - self.shift_at(table, n.start_ns)
                e = n.start_ns + n.duration_ns
                e -= self.shift_at(table, e)
                return max(0, s), max(0, e - s)
            lid = self.launch.get(n.id)
            if lid is not None and lid in self.by_id:
                ln = self.by_id[lid]
                d = self.shift_at(shift.get(ln.stream), ln.start_ns)
                return max(0, n.start_ns - d), n.duration_ns
            return n.start_ns, n.duration_ns

        def kept_parent(nid: int) -> int | None:
            p = self.parent.get(nid)
            while p is not None and p in self.removed:
                p = self.parent.get(p)
            return new_id.get(p) if p is not None else None

        self.comm_span_ids = {n.id: k for k, n in self.comm_span.items()}
        for n in self.nodes:
            k = self.comm_span_ids.get(n.id)
            if k is not None:
                start, dur = new_times(n)
                rec = self.records[k]
                deps: list[tuple[int, int]] = []
                p = kept_parent(n.id)
                if p is not None:
                    deps.append((p, pb.DEP_CONTROL))
                issue = gb.cpu_op(f"{ISSUE_PREFIX}{rec.op}", new_sid[n.stream], start_ns=start,
                                  duration_ns=dur, deps=deps)
                new_id[n.id] = issue.id
                annotations.apply(issue, notes.get(n.id))
                c = self._emit_comm(gb, rec, self.keys[k], issue, start + dur, gpu_device)
                stream_waits.append((c.id, n.start_ns))
                annotations.apply(c, notes.get(n.id))
                comm_node[k] = c.id
                issue_thread[k] = n.stream
                keys_used[self.keys[k]] = len(rec.group_ranks)
                continue
            k = span_index(n.name, WAIT_SPAN)
            if k is not None and self.wait_mark.get(k) is n and k in comm_node:
                if self.gpu:
                    pending_wait[n.stream].append((n.start_ns, k))
                else:
                    start, dur = new_times(n)
                    deps = [(comm_node[k], pb.DEP_SYNC)]
                    p = kept_parent(n.id)
                    if p is not None:
                        deps.append((p, pb.DEP_CONTROL))
                    w = gb.cpu_op(f"{WAIT_PREFIX}{self.records[k].op}", new_sid[n.stream],
                                  kind=pb.KIND_SYNC, start_ns=start, duration_ns=dur, deps=deps)
                    annotations.apply(w, notes.get(n.id))
                continue
            if n.id in self.removed:
                continue
            start, dur = new_times(n)
            deps = []
            for d in n.deps:
                if d.kind == pb.DEP_CONTROL:
                    continue
                if d.id in new_id and (new_id[d.id], d.kind) not in deps:
                    deps.append((new_id[d.id], d.kind))
            p = kept_parent(n.id)
            if p is not None:
                deps.insert(0, (p, pb.DEP_CONTROL))
            host = self.is_host(n)
            lid = self.launch.get(n.id)
            if not host and lid is not None and lid in self.by_id:
                ln = self.by_id[lid]
                waits = pending_wait.get(ln.stream)
                if waits:
                    ready = [k for t, k in waits if t <= ln.start_ns]
                    for k in ready:
                        deps.append((comm_node[k], pb.DEP_SYNC))
                    pending_wait[ln.stream] = [(t, k) for t, k in waits if t > ln.start_ns]
            copy = gb.node(n.kind, n.name, new_sid[n.stream], start_ns=start, duration_ns=dur,
                           deps=deps)
            _copy_payload(n, copy)
            new_id[n.id] = copy.id
            if host:
                annotations.apply(copy, notes.get(n.id))
            elif lid is not None and lid in new_id:
                copy.annotations.CopyFrom(gb.graph.node(new_id[lid]).annotations)

        if self.gpu:
            for cid, t in stream_waits:
                i = bisect.bisect_right(launch_times, t) - 1
                if i >= 0 and launched[i][1] in new_id:
                    gb.graph.node(cid).deps.add(id=new_id[launched[i][1]], kind=pb.DEP_SYNC)
        self._wait_unobserved(gb, comm_node, issue_thread, new_sid)
        for key, size in sorted(keys_used.items()):
            gb.declare_group(key, size)
        return SpliceResult(gb.build(), self.dropped)

    def _emit_comm(self, gb: GraphBuilder, rec: CommRecord, key: str, issue: pb.Node,
                   start: int, gpu_device: int) -> pb.Node:
        if rec.is_p2p:
            sname = f"{key}:{rec.op}:{rec.peer}"
        else:
            sname = key
        if self.gpu:
            sid = gb.stream(pb.STREAM_GPU_COMM, f"gpu{gpu_device}-comm:{sname}", device=gpu_device)
            deps: list[tuple[int, int]] = [(issue.id, pb.DEP_LAUNCH)]
        else:
            sid = gb.stream(pb.STREAM_CPU_THREAD, f"host-comm:{sname}")
            deps = [(issue.id, pb.DEP_DATA)]
        if rec.is_p2p:
            assert rec.peer is not None
            n = gb.p2p(rec.op == "send", rec.op, sid, group=key, peer=rec.peer,
                       nbytes=rec.in_bytes if rec.op == "send" else rec.out_bytes, tag=rec.tag,
                       start_ns=start, duration_ns=0, deps=deps)
        else:
            coll = COLLECTIVE_BY_NAME.get(rec.op)
            if coll is None:
                raise EchoError(f"{self.where}: unknown collective {rec.op!r} in the recording")
            n = gb.collective(rec.op, sid, coll_type=coll, group=key, in_bytes=rec.in_bytes,
                              out_bytes=rec.out_bytes, dtype=rec.dtype, root=rec.root,
                              start_ns=start, duration_ns=0, deps=deps)
        n.attrs["timing"] = "placeholder"
        return n

    def _wait_unobserved(self, gb: GraphBuilder, comm_node: dict[int, int],
                         issue_thread: dict[int, int], new_sid: dict[int, int]) -> None:
        by_thread: dict[int, list[int]] = defaultdict(list)
        for k, rec in enumerate(self.records):
            if not rec.waited and k in comm_node:
                by_thread[issue_thread[k]].append(k)
        for src_sid, ks in sorted(by_thread.items()):
            sid = new_sid[src_sid]
            end = max((n.start_ns + n.duration_ns for n in gb.graph.nodes if n.stream == sid),
                      default=0)
            gb.cpu_op(f"{WAIT_PREFIX}unobserved", sid, kind=pb.KIND_SYNC, start_ns=end, duration_ns=0,
                      deps=[(comm_node[k], pb.DEP_SYNC) for k in ks])
            self.dropped["ex_situ_wait_not_observed"] += len(ks)


def _copy_payload(src: pb.Node, dst: pb.Node) -> None:
    """``src``'s payload and attrs onto ``dst`` (ids, times and deps are rebuilt)."""
    which = src.WhichOneof("payload")
    if which is not None:
        getattr(dst, which).CopyFrom(getattr(src, which))
        if which == "cpu":
            # Run-specific ids: they would make two traces of one program differ.
            dst.cpu.correlation = 0
            dst.cpu.rf_id = 0
    for k, v in src.attrs.items():
        if k != "rf_id_source":
            dst.attrs[k] = v
