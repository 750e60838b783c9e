"""Chakra ET files (one per rank) into an echo-et Job.

What the mapping does, and what it counts in ``manifest.dropped`` (see docs/chakra.md):

- COMP_NODE -> compute (GPU) or cpu_op (``is_cpu_op`` true); COMM_COLL_NODE -> collective,
  or cpu_op when ``is_cpu_op`` is true (old PyTorch converters typed the host-side
  ``c10d::allreduce_`` call as a collective); COMM_SEND/RECV -> send/recv in the world group
  with the peer's global rank from ``comm_dst``/``comm_src`` (comm_unknown when the peer is
  missing); MEM_LOAD/STORE -> memcpy; METADATA and INVALID nodes -> cpu_op, their Chakra
  type kept in ``attrs["chakra_type"]``.
- ``data_deps`` -> DEP_DATA, ``ctrl_deps`` -> DEP_CONTROL; ctrl deps naming no node are
  dropped; data deps naming no node are an error.
- Ids that are not in dependency order are renumbered topologically, the original id kept
  in ``attrs["chakra_id"]``.
- Times: ``*_micros`` x 1000 -> ns.
- Groups: ``pg_name`` "", "0" or absent -> the world group (key "0"); another pg_name -> a
  group whose members are the ranks whose files use it (a guess, counted).

A file is read twice and never held decoded: the first pass keeps, per node, its id, where
its message is, its kind and its deps in flat arrays (a few bytes per node and per dep),
which is all that ordering needs; the second decodes each node again, in the new order, and
emits it. Errors come out as a one-pass reader meets them: malformed messages and duplicate
ids in file order, then dependency errors, then unreadable kinds (first in program order),
then what converting a node finds.
"""

from __future__ import annotations

import functools
import json
import re
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf import json_format

from echo_et.errors import EchoError, OptionError
from echo_et.ir import GraphBuilder, Job, JobBuilder, pb
from echo_et.ir.graph import Graph
from echo_et.ir.schema import KERNEL_CLASS_BY_NAME, NODE_KIND_BY_NAME

from .attrs import KEPT_PREFIX, AttrReader, attr_to_text
from .mapping import (
    CHAKRA_TO_COLL,
    ECHO_PREFIX,
    WORLD_KEY,
    collective_out_bytes,
    infer_collective,
)
from .order import DataCycle, DuplicateId, MissingDataDep, RankOrder, first_duplicate, order_rank
from .wire import NodeFrames, looks_like_text, scan_nodes

_RANK_NAME = re.compile(r"^(?P<prefix>.*)\.(?P<rank>\d+)\.et(?:\.gz)?$")
_ET_SUFFIX = re.compile(r"\.et(?:\.gz)?$")

# Streams a node goes to when it carries no ``stream`` attribute.
_CPU, _COMPUTE, _COMM, _COPY = "cpu", "gpu:compute", "gpu:comm", "gpu:copy"
_STREAM_KIND = {
    _CPU: pb.STREAM_CPU_THREAD,
    _COMPUTE: pb.STREAM_GPU_COMPUTE,
    _COMM: pb.STREAM_GPU_COMM,
    _COPY: pb.STREAM_GPU_COPY,
}
_HOST_KINDS = frozenset({pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC})
_COMM_NODE_KINDS = frozenset(
    {pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV, pb.KIND_COMM_UNKNOWN}
)


def rank_of_name(path: Path) -> tuple[str, int] | None:
    m = _RANK_NAME.match(path.name)
    return (m.group("prefix"), int(m.group("rank"))) if m else None


@dataclass
class _Plan:
    """Which file is which rank."""

    files: list[tuple[int, Path]]   # (rank in the job, file)
    file_rank: dict[Path, int]      # rank the file itself claims (name or --rank)
    world: int
    name: str


def _plan(paths: list[Path], options) -> _Plan:
    if not paths:
        raise EchoError("no Chakra ET input given")
    if len(paths) == 1:
        p = paths[0]
        parsed = rank_of_name(p)
        own = options.rank if options.rank is not None else (parsed[1] if parsed else 0)
        name = options.name or (parsed[0] if parsed else _ET_SUFFIX.sub("", p.name))
        return _Plan([(0, p)], {p: own}, 1, name)
    by_rank: dict[int, Path] = {}
    prefixes = set()
    for p in paths:
        parsed = rank_of_name(p)
        if parsed is None:
            raise EchoError(f"{p}: cannot tell its rank: name the files of a job PREFIX.{{rank}}.et")
        prefixes.add(parsed[0])
        if parsed[1] in by_rank:
            raise EchoError(f"{p}: rank {parsed[1]} is also given by {by_rank[parsed[1]]}")
        by_rank[parsed[1]] = p
    if len(prefixes) > 1:
        raise EchoError(f"inputs mix Chakra traces with different prefixes "
                        f"({', '.join(sorted(prefixes))}); convert one job at a time")
    world = len(by_rank)
    missing = sorted(set(range(world)) - set(by_rank))
    if missing:
        raise EchoError(f"Chakra files of ranks {missing[:8]} are missing: a job needs "
                        f"PREFIX.0.et .. PREFIX.{world - 1}.et")
    if options.world_size is not None and options.world_size != world:
        raise OptionError("world_size", f"world size {options.world_size} asked for, but {world} rank files were given")
    files = sorted(by_rank.items())
    return _Plan(files, {p: r for r, p in files}, world, options.name or prefixes.pop())


@dataclass
class _RankGraph:
    graph: Graph
    keys: set[str] = field(default_factory=set)   # group keys the graph's nodes use
    # pg_name -> (global ranks, or None for all; pg_desc), from process_group:init metadata
    pg_config: dict[str, tuple[list[int] | None, str]] = field(default_factory=dict)


_ECHO_KIND, _ECHO_OP, _ECHO_KERNEL_CLASS, _ECHO_CORRELATION, _ECHO_ANNOTATIONS, _ECHO_ATTR = (
    ECHO_PREFIX + k for k in ("kind", "op", "kernel_class", "correlation", "annotations", "attr."))
_KEEPS_SHAPES = frozenset({pb.KIND_COMPUTE, *_HOST_KINDS})   # kinds whose input shapes are kept

# Marks in _Scan.kinds for a node whose kind, or whose ``stream`` attribute, did not read.
_DECIDE_FAILED, _STREAM_FAILED = -1, -2


@dataclass
class _Scan:
    """One file after the first pass: per node (file order) its id, where its message is
    (offset, size), its kind (or a mark), and its deps flat with offsets (node i's data deps are
    ``data[data_ptr[i]:data_ptr[i + 1]]``), in arrays of 8 bytes per value."""

    meta: et.GlobalMetadata = field(default_factory=et.GlobalMetadata)
    ids: array = field(default_factory=lambda: array("Q"))
    offsets: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))
    kinds: array = field(default_factory=lambda: array("b"))
    data: array = field(default_factory=lambda: array("Q"))
    data_ptr: array = field(default_factory=lambda: array("q", [0]))
    ctrl: array = field(default_factory=lambda: array("Q"))
    ctrl_ptr: array = field(default_factory=lambda: array("q", [0]))
    streams: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # CUDA stream -> kinds


class _FileReader:
    """Converts one file; ``drop`` counts tolerances on the job."""

    def __init__(self, path: Path, rank: int, own_rank: int, plan: _Plan, jb: JobBuilder):
        self.path = path
        self.rank = rank
        self.own_rank = own_rank
        self.plan = plan
        self.jb = jb
        self.variants: dict[str, int] = {}

    def where(self, n: et.Node) -> str:
        return f"{self.path}: node {n.id} ({n.name})"

    def drop(self, reason: str, count: int = 1) -> None:
        self.jb.drop(reason, count)

    # -- pass 1: what ordering needs, in compact arrays ----------------------------------
    def scan(self) -> _Scan:
        """Read every node once, keeping its id, where it starts, its deps and its kind, but
        not the message: the second pass decodes each node again when it is emitted."""
        sc = _Scan()
        try:
            it = scan_nodes(self.path)
            meta = next(it)
            assert isinstance(meta, et.GlobalMetadata)
            sc.meta = meta
            ids, offsets, sizes, kinds = sc.ids, sc.offsets, sc.sizes, sc.kinds
            data, data_ptr, ctrl, ctrl_ptr = sc.data, sc.data_ptr, sc.ctrl, sc.ctrl_ptr
            classify, streams = self._classify, sc.streams
            for offset, size, n in it:  # type: ignore[misc]
                ids.append(n.id)
                offsets.append(offset)
                sizes.append(size)
                deps = n.data_deps
                if deps:
                    data.extend(deps)
                data_ptr.append(len(data))
                deps = n.ctrl_deps
                if deps:
                    ctrl.extend(deps)
                ctrl_ptr.append(len(ctrl))
                kinds.append(classify(n, streams))
        except EchoError:
            # A node id used twice before the bad message is what a one-pass read met first.
            self._refuse_duplicate(sc)
            raise
        return sc

    def _classify(self, n: et.Node, streams: dict[int, set[int]]) -> int:
        """The node's echo-et kind, noting the kinds on each CUDA ``stream``; a failure is
        only marked, to be raised after the ordering errors, for the first node in the new
        order (as converting in that order would)."""
        try:
            kind, r = self._decide(n)
        except EchoError:
            return _DECIDE_FAILED
        if kind not in _HOST_KINDS and r.has("stream"):
            try:
                streams[r.int("stream")].add(kind)
            except EchoError:
                return _STREAM_FAILED
        return kind

    def _node_at(self, sc: _Scan, i: int) -> et.Node:
        with NodeFrames(self.path, sc.offsets, sc.sizes) as frames:
            return frames.node(i, sc.ids[i])

    def _refuse_duplicate(self, sc: _Scan) -> None:
        dup = first_duplicate(np.frombuffer(sc.ids, dtype=np.uint64))
        if dup is not None:
            i, first = dup
            n = self._node_at(sc, i)
            raise EchoError(f"{self.where(n)}: node id {n.id} is used twice "
                            f"(nodes #{first} and #{i})")

    def order(self, sc: _Scan) -> RankOrder:
        """Where each node goes (see order.py); counts what the ordering dropped."""
        u64, i64 = np.uint64, np.int64
        try:
            plan = order_rank(np.frombuffer(sc.ids, dtype=u64), np.frombuffer(sc.data, dtype=u64),
                              np.frombuffer(sc.data_ptr, dtype=i64), np.frombuffer(sc.ctrl, dtype=u64),
                              np.frombuffer(sc.ctrl_ptr, dtype=i64))
        except DuplicateId:
            self._refuse_duplicate(sc)
            raise
        except MissingDataDep as e:
            n = self._node_at(sc, e.index)
            if looks_like_text(list(n.data_deps)):
                raise EchoError(f"{self.where(n)}: data_deps read as text "
                                f"({bytes(x for x in n.data_deps[:16])!r}): this is a "
                                "pre-Oct-2023 Chakra ET (string `inputs` at field 5), whose "
                                "wire format is incompatible; regenerate it with a current chakra") from None
            raise EchoError(f"{self.where(n)}: data_dep on node {e.dep}, "
                            "which is not in the file") from None
        except DataCycle as e:
            n = self._node_at(sc, e.index)
            raise EchoError(f"{self.where(n)}: data_deps form a cycle through this node") from None
        self.drop("chakra: ctrl_deps naming no node dropped", plan.dangling_ctrl)
        self.drop("chakra: ctrl_deps contradicting data_deps dropped", plan.ctrl_given_up)
        self.drop("chakra: node ids not in dependency order, renumbered", plan.renumbered)
        return plan

    def _refuse_marked(self, sc: _Scan, plan: RankOrder) -> None:
        """Raise the error of the first node, in the new order, that :meth:`_classify` marked."""
        kinds = np.frombuffer(sc.kinds, dtype=np.int8)
        for mark in (_DECIDE_FAILED, _STREAM_FAILED):
            marked = np.flatnonzero(kinds[plan.emit] == mark)
            if len(marked):
                n = self._node_at(sc, int(plan.emit[marked[0]]))
                _, r = self._decide(n)          # raises for _DECIDE_FAILED
                r.int("stream")                 # raises for _STREAM_FAILED
                raise AssertionError(f"{self.where(n)}: error did not repeat")

    # -- pass 2: decode each node again, in the new order, and emit it --------------------
    def convert(self) -> tuple[et.GlobalMetadata, _RankGraph]:
        sc = self.scan()
        meta = sc.meta
        if not meta.version:
            self.drop("chakra: empty GlobalMetadata.version")
        plan = self.order(sc)
        self._refuse_marked(sc, plan)
        stream_kinds = self._stream_kinds(sc.streams)
        b = GraphBuilder(f"rank{self.rank}", f"{self.plan.name} rank {self.rank}")
        rg = _RankGraph(b.graph)
        ids, kinds, data_ptr = sc.ids, sc.kinds, sc.data_ptr
        # Plain-int views of the plan's arrays, without copying them.
        data_deps, ctrl_deps = memoryview(plan.data_deps), memoryview(plan.ctrl_deps)
        ctrl_ptr, new_ids = memoryview(plan.ctrl_ptr), memoryview(plan.new_id)
        renumbered = plan.ids_changed
        sc.data = sc.ctrl = array("Q")     # the plan holds what emitting needs
        io_dropped = 0
        data_kind, ctrl_kind = pb.DEP_DATA, pb.DEP_CONTROL
        with NodeFrames(self.path, sc.offsets, sc.sizes) as frames:
            for i in memoryview(plan.emit):
                n = frames.node(i, ids[i])
                r = AttrReader(n.attr, functools.partial(self.where, n), self.variants)
                # Deps in the order written, each once (most nodes have none or one).
                a, z = data_ptr[i], data_ptr[i + 1]
                deps = ([(d, data_kind) for d in dict.fromkeys(data_deps[a:z])] if z - a > 1
                        else [(data_deps[a], data_kind)] if z > a else [])
                a, z = ctrl_ptr[i], ctrl_ptr[i + 1]
                if z - a > 1:
                    deps += [(d, ctrl_kind) for d in dict.fromkeys(ctrl_deps[a:z])]
                elif z > a:
                    deps.append((ctrl_deps[a], ctrl_kind))
                node = self._emit(b, rg, n, r, kinds[i], new_ids[i], deps, stream_kinds)
                if renumbered and "chakra_id" not in node.attrs:
                    node.attrs["chakra_id"] = str(n.id)
                io_dropped += self._keep_rest(n, r, node)
        self.drop("chakra: tensor values and outputs (IOInfo) not kept", io_dropped)
        for reason, count in sorted(self.variants.items()):
            self.drop(reason, count)
        return meta, rg

    def _decide(self, n: et.Node) -> tuple[int, AttrReader]:
        """The echo-et kind of a Chakra node."""
        r = AttrReader(n.attr, functools.partial(self.where, n), self.variants)
        if r.has(_ECHO_KIND):
            name = r.str(_ECHO_KIND)
            if name not in NODE_KIND_BY_NAME:
                raise EchoError(f"{self.where(n)}: unknown echo.kind {name!r}")
            return NODE_KIND_BY_NAME[name], r
        cpu = r.bool("is_cpu_op")
        t = n.type
        if t == et.COMP_NODE:
            return (pb.KIND_CPU_OP if cpu else pb.KIND_COMPUTE), r
        if t == et.COMM_COLL_NODE:
            if cpu:
                self.drop("chakra: COMM_COLL_NODE with is_cpu_op=true kept as a host cpu_op")
                return pb.KIND_CPU_OP, r
            return pb.KIND_COLLECTIVE, r
        if t in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
            other = "comm_dst" if t == et.COMM_SEND_NODE else "comm_src"
            if not r.has(other):
                self.drop(f"chakra: {et.NodeType.Name(t)} without {other} kept as comm_unknown")
                return pb.KIND_COMM_UNKNOWN, r
            return (pb.KIND_SEND if t == et.COMM_SEND_NODE else pb.KIND_RECV), r
        if t in (et.MEM_LOAD_NODE, et.MEM_STORE_NODE):
            return pb.KIND_MEMCPY, r
        # METADATA_NODE, INVALID_NODE
        self.drop(f"chakra: {et.NodeType.Name(t)} kept as a cpu_op")
        return pb.KIND_CPU_OP, r

    def _stream_kinds(self, seen: dict[int, set[int]]) -> dict[int, int]:
        """Kind of each CUDA stream named by a ``stream`` attribute: comm when it carries only
        communication, copy when only memcpy, else compute."""
        out = {}
        for s, kinds in seen.items():
            if kinds <= _COMM_NODE_KINDS:
                out[s] = pb.STREAM_GPU_COMM
            elif kinds <= {pb.KIND_MEMCPY}:
                out[s] = pb.STREAM_GPU_COPY
            else:
                out[s] = pb.STREAM_GPU_COMPUTE
        return out

    def _stream(self, b: GraphBuilder, kind: int, r: AttrReader, stream_kinds) -> int:
        if kind in _HOST_KINDS:
            return b.stream(pb.STREAM_CPU_THREAD, _CPU)
        if r.has("stream"):
            s = r.int("stream")
            return b.stream(stream_kinds[s], f"stream {s}", device=0, native_id=s)
        name = (_COMM if kind in _COMM_NODE_KINDS else _COPY if kind == pb.KIND_MEMCPY
                else _COMPUTE)
        return b.stream(_STREAM_KIND[name], name, device=0)

    def _global_to_job_rank(self, n: et.Node, g: int, attr: str) -> int:
        if self.plan.world == 1:
            if g == self.own_rank:
                return 0
            raise EchoError(f"{self.where(n)}: {attr} {g} names a rank with no input file "
                            "(give every rank's file: PREFIX.{rank}.et)")
        if not 0 <= g < self.plan.world:
            raise EchoError(f"{self.where(n)}: {attr} {g} is outside the {self.plan.world} ranks given")
        return g

    def _emit(self, b: GraphBuilder, rg: _RankGraph, n: et.Node, r: AttrReader, kind: int,
              node_id: int, deps, stream_kinds) -> pb.Node:
        sid = self._stream(b, kind, r, stream_kinds)
        kw = dict(start_ns=n.start_time_micros * 1000, duration_ns=n.duration_micros * 1000,
                  deps=deps, node_id=node_id)
        name = n.name
        op = r.str(_ECHO_OP) or name
        if kind == pb.KIND_COMPUTE:
            kc = r.str(_ECHO_KERNEL_CLASS, "other")
            inputs = n.inputs
            node = b.compute(name, sid, kernel_class=KERNEL_CLASS_BY_NAME.get(kc, pb.KC_OTHER),
                             op=op, flops=float(r.int("num_ops", 0) or 0),
                             bytes_=r.int("tensor_size", 0) or 0, shapes=inputs.shapes,
                             dtypes=inputs.types, **kw)
        elif kind in _HOST_KINDS:
            node = b.cpu_op(name, sid, kind=kind, op=op,
                            correlation=r.int(_ECHO_CORRELATION, 0) or 0, **kw)
            cpu, inputs, t = node.cpu, n.inputs, n.type
            cpu.rf_id = r.int("rf_id", 0) or 0
            cpu.shapes = inputs.shapes
            cpu.dtypes = inputs.types
            if t in (et.METADATA_NODE, et.INVALID_NODE, et.COMM_COLL_NODE):
                node.attrs["chakra_type"] = et.NodeType.Name(t)
                if t == et.METADATA_NODE and inputs.values:
                    node.attrs["chakra_inputs_values"] = inputs.values
                    rg.pg_config.update(parse_pg_config(inputs.values))
        elif kind == pb.KIND_COLLECTIVE:
            node = self._collective(b, rg, n, r, sid, kw)
        elif kind in (pb.KIND_SEND, pb.KIND_RECV):
            send = kind == pb.KIND_SEND
            attr = "comm_dst" if send else "comm_src"
            own_attr = "comm_src" if send else "comm_dst"
            own = r.int(own_attr)
            if own is not None and own != self.own_rank:
                raise EchoError(f"{self.where(n)}: {own_attr} {own} is not this file's rank "
                                f"{self.own_rank}")
            peer = self._global_to_job_rank(n, r.int(attr), attr)
            size = r.int("comm_size")
            if size is None:
                self.drop("chakra: send/recv without comm_size (0 bytes)")
            node = b.p2p(send, n.name, sid, group=WORLD_KEY, peer=peer, nbytes=size or 0,
                         tag=r.int("comm_tag", 0) or 0, **kw)
            rg.keys.add(WORLD_KEY)
        elif kind in (pb.KIND_MEMCPY, pb.KIND_MEMSET):
            direction = r.str(ECHO_PREFIX + "direction") or (
                "load" if n.type == et.MEM_LOAD_NODE else "store" if n.type == et.MEM_STORE_NODE
                else "")
            node = b.memcpy(n.name, sid, nbytes=r.int("tensor_size", 0) or 0,
                            direction=direction, kind=kind, **kw)
        else:  # comm_unknown, unknown
            node = b.node(kind, n.name, sid, **kw)
            if n.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
                node.attrs["chakra_type"] = et.NodeType.Name(n.type)
        if r.has(_ECHO_ANNOTATIONS):
            try:
                json_format.ParseDict(json.loads(r.str(_ECHO_ANNOTATIONS)), node.annotations)
            except (ValueError, json_format.ParseError) as e:
                raise EchoError(f"{self.where(n)}: echo.annotations does not parse ({e})") from None
        if r.has("chakra_id"):
            node.attrs["chakra_id"] = str(r.int("chakra_id"))
        return node

    def _collective(self, b: GraphBuilder, rg: _RankGraph, n: et.Node, r: AttrReader, sid: int,
                    kw) -> pb.Node:
        ct = r.int("comm_type")
        if ct is None:
            coll = infer_collective(n.name)
            self.drop("chakra: collective without comm_type, type inferred from its name"
                      if coll != pb.COLL_UNKNOWN else
                      "chakra: collective without comm_type and no type in its name (unknown)")
        elif ct in CHAKRA_TO_COLL:
            coll = CHAKRA_TO_COLL[ct]
            if ct == et.REDUCE_SCATTER_BLOCK:
                self.drop("chakra: REDUCE_SCATTER_BLOCK read as reduce_scatter")
        else:
            coll = pb.COLL_UNKNOWN
            self.drop("chakra: collective with an unknown comm_type (unknown)")
        size = r.int("comm_size")
        if size is None:
            self.drop("chakra: collective without comm_size (0 bytes)")
            size = 0
        pg = r.str("pg_name")
        key = WORLD_KEY if pg in ("", "0") else pg
        rg.keys.add(key)
        root = r.int(ECHO_PREFIX + "root")
        node = b.collective(n.name, sid, coll_type=coll, group=key, in_bytes=max(size, 0),
                            dtype=r.str(ECHO_PREFIX + "dtype"), root=root, **kw)
        node.collective.algorithm = r.str(ECHO_PREFIX + "algorithm")
        out = r.int(ECHO_PREFIX + "out_bytes")
        if out is not None:
            node.collective.out_bytes = out
            node.attrs["echo_out_bytes_given"] = "1"
        return node

    def _keep_rest(self, n: et.Node, r: AttrReader, node: pb.Node) -> int:
        """Keep the attributes the mapping did not consume; 1 when IOInfo was lost."""
        kind = node.kind
        used = _consumed(kind)
        by_name = r.by_name
        for name in sorted(by_name):
            if name in used or name.startswith(ECHO_PREFIX) and name[len(ECHO_PREFIX):] in _ECHO_FIELDS:
                continue
            if name.startswith(_ECHO_ATTR):
                node.attrs[name[len(_ECHO_ATTR):]] = r.str(name)
                continue
            text = attr_to_text(by_name[name])
            if text is not None:
                node.attrs[KEPT_PREFIX + name] = text
        inputs = n.inputs
        lost = bool(inputs.values and n.type != et.METADATA_NODE) or n.HasField("outputs")
        if kind not in _KEEPS_SHAPES:
            lost = lost or bool(inputs.shapes or inputs.types)
        return int(lost)


_ECHO_FIELDS = frozenset(
    {"kind", "op", "kernel_class", "correlation", "annotations", "dtype", "root", "algorithm",
     "out_bytes", "direction"}
)


@functools.cache
def _consumed(kind: int) -> frozenset[str]:
    """Attributes the mapping of this node turned into typed fields."""
    used = {"is_cpu_op", "chakra_id"}
    if kind == pb.KIND_COMPUTE:
        used |= {"num_ops", "tensor_size", "stream"}
    elif kind in _HOST_KINDS:
        used |= {"rf_id"}
    elif kind == pb.KIND_COLLECTIVE:
        used |= {"comm_type", "comm_size", "pg_name", "stream"}
    elif kind in (pb.KIND_SEND, pb.KIND_RECV):
        used |= {"comm_size", "comm_src", "comm_dst", "comm_tag", "stream"}
    elif kind in (pb.KIND_MEMCPY, pb.KIND_MEMSET):
        used |= {"tensor_size", "stream"}
    else:
        used |= {"stream"}
    return frozenset(used)


def parse_pg_config(values: str) -> dict[str, tuple[list[int] | None, str]]:
    """Process groups from a PyTorch ``## process_group:init ##`` METADATA node, whose
    ``inputs.values`` is the Python repr of a one-string list holding a JSON list of
    ``{"pg_name", "pg_desc", "ranks", ...}`` (read the same way ASTRA-sim does: drop two
    characters at each end). Empty ``ranks`` means every rank. {} when it does not parse."""
    text = values.strip()
    if len(text) < 4 or text[:2] not in ("['", '["') or text[-2:] not in ("']", '"]'):
        return {}
    try:
        groups = json.loads(text[2:-2])
    except ValueError:
        return {}
    out: dict[str, tuple[list[int] | None, str]] = {}
    if not isinstance(groups, list):
        return {}
    for g in groups:
        if not isinstance(g, dict) or not isinstance(g.get("pg_name"), str):
            continue
        ranks = g.get("ranks", [])
        if not isinstance(ranks, list) or not all(isinstance(r, int) and r >= 0 for r in ranks):
            continue
        out[g["pg_name"]] = (sorted(ranks) or None, str(g.get("pg_desc", "")))
    return out


def _members(key: str, users: set[int], config, world: int, jb: JobBuilder) -> tuple[list[int], str]:
    """Members of group ``key``: from the metadata when it lists them consistently, else the
    ranks that use it (a guess, counted)."""
    if key in config:
        ranks, desc = config[key]
        members = list(range(world)) if ranks is None else ranks
        if users <= set(members) and all(r < world for r in members):
            jb.drop("chakra: process group membership read from process_group:init metadata")
            return members, desc
    jb.drop("chakra: process group membership inferred from the ranks that use it")
    return sorted(users), ""


def read(paths: list[Path], options) -> Job:
    plan = _plan([Path(p) for p in paths], options)
    jb = JobBuilder(plan.name, plan.world, source_format="chakra")
    m = jb.job.manifest
    graphs: list[tuple[int, _RankGraph]] = []
    usage: dict[str, set[int]] = defaultdict(set)
    config: dict[str, tuple[list[int] | None, str]] = {}
    for rank, path in plan.files:
        meta, rg = _FileReader(path, rank, plan.file_rank[path], plan, jb).convert()
        if rank == 0:
            m.attrs["chakra_version"] = meta.version
            for a in meta.attr:
                if a.name == "schema" and a.WhichOneof("value") == "string_val":
                    m.attrs["chakra_schema"] = a.string_val
        m.provenance.inputs.append(path.name)
        graphs.append((rank, rg))
        for key in rg.keys:
            usage[key].add(rank)
        for key, value in rg.pg_config.items():
            config.setdefault(key, value)

    world_gid = jb.group(range(plan.world), name=WORLD_KEY, desc="default_pg", role="world")
    group_of = {WORLD_KEY: world_gid}
    sizes = {WORLD_KEY: plan.world}
    for key in sorted(k for k in usage if k != WORLD_KEY):
        members, desc = _members(key, usage[key], config, plan.world, jb)
        group_of[key] = jb.group(members, name=key, desc=desc)
        sizes[key] = len(members)

    by_hash: dict[str, str] = {}
    for rank, rg in graphs:
        g = rg.graph
        for key in sorted(rg.keys | {WORLD_KEY}):
            g.header.group_sizes[key] = sizes[key]
        for node in g.nodes:
            if node.kind == pb.KIND_COLLECTIVE:
                c = node.collective
                if "echo_out_bytes_given" in node.attrs:  # (a protobuf map's pop() inserts)
                    del node.attrs["echo_out_bytes_given"]
                else:
                    c.out_bytes = collective_out_bytes(c.type, c.in_bytes, sizes[c.group])
        h = g.content_hash()
        gid = by_hash.setdefault(h, g.id)
        if gid == g.id:
            jb.add_graph(g)
        jb.bind(rank, gid, {k: group_of[k] for k in g.header.group_sizes})
    return jb.build()
