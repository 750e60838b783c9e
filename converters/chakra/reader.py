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
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf import json_format

from echo_et.errors import EchoError
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
from .order import needs_renumbering, node_on_cycle, topological
from .wire import iter_messages, looks_like_text

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
        raise EchoError(f"--world-size {options.world_size} but {world} rank files were given")
    files = sorted(by_rank.items())
    return _Plan(files, {p: r for r, p in files}, world, options.name or prefixes.pop())


@dataclass
class _RankGraph:
    graph: Graph
    keys: set[str] = field(default_factory=set)   # group keys the graph's nodes use
    # pg_name -> (global ranks, or None for all; pg_desc), from process_group:init metadata
    pg_config: dict[str, tuple[list[int] | None, str]] = field(default_factory=dict)


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

    # -- reading and ordering ---------------------------------------------------------------
    def read(self) -> tuple[et.GlobalMetadata, list[et.Node]]:
        it = iter_messages(self.path)
        meta = next(it)
        assert isinstance(meta, et.GlobalMetadata)
        nodes: list[et.Node] = []
        first_at: dict[int, int] = {}
        for n in it:
            assert isinstance(n, et.Node)
            if n.id in first_at:
                raise EchoError(f"{self.where(n)}: node id {n.id} is used twice "
                                f"(nodes #{first_at[n.id]} and #{len(nodes)})")
            first_at[n.id] = len(nodes)
            nodes.append(n)
        return meta, nodes

    def order(self, nodes: list[et.Node]) -> tuple[dict[int, int], dict[int, list[int]],
                                                   dict[int, list[int]]]:
        """New id per Chakra id, and the kept data and ctrl deps (Chakra ids)."""
        ids = {n.id for n in nodes}
        data: dict[int, list[int]] = {}
        ctrl: dict[int, list[int]] = {}
        dangling = 0
        for n in nodes:
            missing = [d for d in n.data_deps if d not in ids]
            if missing:
                if looks_like_text(list(n.data_deps)):
                    raise EchoError(f"{self.where(n)}: data_deps read as text "
                                    f"({bytes(x for x in n.data_deps[:16])!r}): this is a "
                                    "pre-Oct-2023 Chakra ET (string `inputs` at field 5), whose "
                                    "wire format is incompatible; regenerate it with a current chakra")
                raise EchoError(f"{self.where(n)}: data_dep on node {missing[0]}, "
                                "which is not in the file")
            data[n.id] = list(dict.fromkeys(n.data_deps))
            kept = [d for d in dict.fromkeys(n.ctrl_deps) if d in ids]
            dangling += len(n.ctrl_deps) - len([d for d in n.ctrl_deps if d in ids])
            ctrl[n.id] = kept
        self.drop("chakra: ctrl_deps naming no node dropped", dangling)

        sorted_ids = sorted(ids)
        union = {i: data[i] + [d for d in ctrl[i] if d not in data[i]] for i in sorted_ids}
        if not needs_renumbering(union):
            return {i: i for i in sorted_ids}, data, ctrl
        result = topological(sorted_ids, data, ctrl)
        if result is None:
            bad = node_on_cycle(sorted_ids, data)
            n = next(x for x in nodes if x.id == bad)
            raise EchoError(f"{self.where(n)}: data_deps form a cycle through this node")
        order, given_up = result
        cut = 0
        for i, gone in given_up.items():
            cut += len(gone)
            ctrl[i] = [d for d in ctrl[i] if d not in gone]
        self.drop("chakra: ctrl_deps contradicting data_deps dropped", cut)
        self.drop("chakra: node ids not in dependency order, renumbered", len(order))
        return {old: k + 1 for k, old in enumerate(order)}, data, ctrl

    # -- mapping --------------------------------------------------------------------------------
    def convert(self) -> tuple[et.GlobalMetadata, _RankGraph]:
        meta, nodes = self.read()
        if not meta.version:
            self.drop("chakra: empty GlobalMetadata.version")
        new_id, data, ctrl = self.order(nodes)
        renumbered = any(k != v for k, v in new_id.items())
        b = GraphBuilder(f"rank{self.rank}", f"{self.plan.name} rank {self.rank}")
        rg = _RankGraph(b.graph)
        by_id = {n.id: n for n in nodes}
        decided = [(self._decide(by_id[old]), by_id[old])
                   for old, _ in sorted(new_id.items(), key=lambda kv: kv[1])]
        stream_kinds = self._stream_kinds(decided)
        io_dropped = 0
        for (kind, r), n in decided:
            deps = [(new_id[d], pb.DEP_DATA) for d in data[n.id]]
            deps += [(new_id[d], pb.DEP_CONTROL) for d in ctrl[n.id]]
            node = self._emit(b, rg, n, r, kind, new_id[n.id], deps, stream_kinds)
            if renumbered and "chakra_id" not in node.attrs:
                node.attrs["chakra_id"] = str(n.id)
            io_dropped += self._keep_rest(n, r, node)
        self.drop("chakra: tensor values and outputs (IOInfo) not kept", io_dropped)
        for reason, count in sorted(self.variants.items()):
            self.drop(reason, count)
        return meta, rg

    def _decide(self, n: et.Node) -> tuple[int, AttrReader]:
        """The echo-et kind of a Chakra node."""
        r = AttrReader(n.attr, lambda: self.where(n), self.variants)
        if r.has(ECHO_PREFIX + "kind"):
            name = r.str(ECHO_PREFIX + "kind")
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

    def _stream_kinds(self, decided) -> dict[int, int]:
        """Kind of each CUDA stream named by a ``stream`` attribute: comm when it carries only
        communication, copy when only memcpy, else compute."""
        seen: dict[int, set[int]] = defaultdict(set)
        for (kind, r), _ in decided:
            if kind not in _HOST_KINDS and r.has("stream"):
                seen[r.int("stream")].add(kind)
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
        op = r.str(ECHO_PREFIX + "op") or n.name
        if kind == pb.KIND_COMPUTE:
            kc = r.str(ECHO_PREFIX + "kernel_class", "other")
            node = b.compute(n.name, sid, kernel_class=KERNEL_CLASS_BY_NAME.get(kc, pb.KC_OTHER),
                             op=op, flops=float(r.int("num_ops", 0) or 0),
                             bytes_=r.int("tensor_size", 0) or 0, shapes=n.inputs.shapes,
                             dtypes=n.inputs.types, **kw)
        elif kind in _HOST_KINDS:
            node = b.cpu_op(n.name, sid, kind=kind, op=op,
                            correlation=r.int(ECHO_PREFIX + "correlation", 0) or 0, **kw)
            node.cpu.rf_id = r.int("rf_id", 0) or 0
            node.cpu.shapes = n.inputs.shapes
            node.cpu.dtypes = n.inputs.types
            if n.type in (et.METADATA_NODE, et.INVALID_NODE, et.COMM_COLL_NODE):
                node.attrs["chakra_type"] = et.NodeType.Name(n.type)
                if n.type == et.METADATA_NODE and n.inputs.values:
                    node.attrs["chakra_inputs_values"] = n.inputs.values
                    rg.pg_config.update(parse_pg_config(n.inputs.values))
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
        if r.has(ECHO_PREFIX + "annotations"):
            try:
                json_format.ParseDict(json.loads(r.str(ECHO_PREFIX + "annotations")),
                                      node.annotations)
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
        used = _consumed(node.kind)
        for name, a in sorted(r.by_name.items()):
            if name in used or name.startswith(ECHO_PREFIX) and name[len(ECHO_PREFIX):] in _ECHO_FIELDS:
                continue
            if name.startswith(ECHO_PREFIX + "attr."):
                node.attrs[name[len(ECHO_PREFIX + "attr."):]] = r.str(name)
                continue
            text = attr_to_text(a)
            if text is not None:
                node.attrs[KEPT_PREFIX + name] = text
        lost = bool(n.inputs.values and n.type != et.METADATA_NODE) or n.HasField("outputs")
        if node.kind not in (pb.KIND_COMPUTE, *_HOST_KINDS):
            lost = lost or bool(n.inputs.shapes or n.inputs.types)
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
