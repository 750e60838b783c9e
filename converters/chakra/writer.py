"""An echo-et Job as plain Chakra ET: ``PREFIX.{rank}.et`` for every rank, uncompressed.

Shared graphs are expanded per rank (group-local peers become global ranks, group keys
become pg_names). A graph with repeat blocks is expanded as it is written, node by node
(``Graph.iter_nodes``): what is held is the stored graph and the ids' spans
(``Graph.expanded_ids``, for control dependencies that name no node), never the expansion.

Every file is written under a temporary name; they are renamed into place only after all
ranks were written, so a failure leaves no file of this export behind.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Container
from pathlib import Path
from typing import Any

from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf import json_format

from echo_et import __version__
from echo_et.errors import EchoError
from echo_et.ir import Job, pb
from echo_et.ir.graph import Graph
from echo_et.ir.io import output_errors, publish_file, temp_file_beside, write_delimited
from echo_et.ir.schema import KERNEL_CLASS_NAMES, node_kind_name

from .attrs import KEPT_PREFIX, STANDARD_FIELD, str_attr, text_to_attr
from .mapping import COLL_TO_CHAKRA, ECHO_PREFIX, collective_out_bytes

CHAKRA_VERSION = "1.0.0"  # what GlobalMetadata.version says; the wire schema is 0.0.4's

# Kinds Chakra has a node type for; others are written with an ``echo.kind`` attribute.
_NATIVE_KINDS = frozenset(
    {pb.KIND_COMPUTE, pb.KIND_CPU_OP, pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV,
     pb.KIND_MEMCPY}
)
_CHAKRA_TYPE_BY_NAME = {name: value for name, value in et.NodeType.items()}
_DEP_DATA, _DEP_CONTROL = pb.DEP_DATA, pb.DEP_CONTROL


# An attribute to write, as (name, AttributeProto member, value): added to the node in place,
# which costs half of building an AttributeProto and copying it in.
AttrSpec = tuple[str, str, Any]


def _int(name: str, value: int) -> AttrSpec:
    """An integer attribute in its standard member (int64 when it has none)."""
    return (name, STANDARD_FIELD.get(name, "int64_val"), int(value))


def _bool(name: str, value: bool) -> AttrSpec:
    return (name, "bool_val", bool(value))


def _str(name: str, value: str) -> AttrSpec:
    return (name, "string_val", value)


def micros(ns: int, *, at_least_one: bool) -> int:
    """Nanoseconds to Chakra's integer microseconds: rounded to nearest (half up); a
    positive duration never becomes 0 µs (ASTRA-sim would replay 0 as 1 ns)."""
    us = (int(ns) + 500) // 1000
    if at_least_one and ns > 0 and us == 0:
        return 1
    return max(us, 0)


class _RankContext:
    """What turns a shared graph into one rank's file: its groups and their Chakra names."""

    def __init__(self, job: Job, rank: int, pg_names: dict[int, str]):
        self.job = job
        self.rank = rank
        self.pg_names = pg_names

    def group(self, key: str) -> pb.ProcessGroup:
        return self.job.resolve_group(self.rank, key)


def _pg_names(job: Job) -> dict[int, str]:
    """Chakra pg_name per group id: "" for the world group named "0"/"" (Chakra's default),
    else the group's own name, or its id when names are not unique."""
    groups = list(job.manifest.groups)
    names = [g.name for g in groups]
    unique = len(set(names)) == len(names)
    world = list(range(job.world_size))
    out = {}
    for g in groups:
        if g.name in ("", "0") and list(g.ranks) == world:
            out[g.id] = ""
        else:
            out[g.id] = g.name if unique and g.name else str(g.id)
    return out


def _node(n: pb.Node, ctx: _RankContext, ids: Container[int], lossy: Counter) -> et.Node:
    name, duration = n.name, n.duration_ns
    c = et.Node(id=n.id, name=name,
                start_time_micros=micros(n.start_ns, at_least_one=False),
                duration_micros=micros(duration, at_least_one=True))
    if duration % 1000:
        lossy["durations rounded to whole microseconds"] += 1
    data: list[int] = []
    ctrl: list[int] = []
    for d in n.deps:
        dep_kind, dep_id = d.kind, d.id
        if dep_kind == _DEP_CONTROL:
            if dep_id in ids:
                ctrl.append(dep_id)
            else:
                lossy["ctrl deps naming no node left out"] += 1
        else:
            if dep_kind != _DEP_DATA:
                lossy["launch/sync deps written as data_deps"] += 1
            data.append(dep_id)
    if data:
        c.data_deps.extend(dict.fromkeys(data))
    if ctrl:
        c.ctrl_deps.extend(dict.fromkeys(ctrl))
    attrs: list[AttrSpec] = []
    node_attrs = n.attrs
    chakra_type = node_attrs.get("chakra_type", "")
    kind = n.kind
    if kind == pb.KIND_COMPUTE:
        c.type = et.COMP_NODE
        attrs.append(_bool("is_cpu_op", False))
        info = n.compute
        _compute_attrs(info, name, attrs)
        inputs = c.inputs
        inputs.shapes, inputs.types = info.shapes, info.dtypes
    elif kind == pb.KIND_COLLECTIVE:
        c.type = et.COMM_COLL_NODE
        attrs.append(_bool("is_cpu_op", False))
        _collective_attrs(n, ctx, attrs, lossy)
    elif kind in (pb.KIND_SEND, pb.KIND_RECV):
        send = kind == pb.KIND_SEND
        c.type = et.COMM_SEND_NODE if send else et.COMM_RECV_NODE
        members = ctx.group(n.p2p.group).ranks
        if n.p2p.peer >= len(members):
            raise EchoError(f"{ctx.job.source or 'job'} rank {ctx.rank} node {n.id} ({n.name}): peer "
                            f"{n.p2p.peer} is outside group {n.p2p.group!r} of size {len(members)}")
        peer = members[n.p2p.peer]
        attrs.append(_bool("is_cpu_op", False))
        attrs.append(_int("comm_size", n.p2p.bytes))
        attrs.append(_int("comm_src", ctx.rank if send else peer))
        attrs.append(_int("comm_dst", peer if send else ctx.rank))
        attrs.append(_int("comm_tag", n.p2p.tag))
    elif kind in (pb.KIND_MEMCPY, pb.KIND_MEMSET):
        direction = n.memcpy.direction
        if kind == pb.KIND_MEMCPY and direction in ("load", "store"):
            c.type = et.MEM_LOAD_NODE if direction == "load" else et.MEM_STORE_NODE
        else:
            # Chakra has no device copy node: the PyTorch converter writes GPU memcpy as
            # a GPU COMP_NODE, and so does this writer.
            c.type = et.COMP_NODE
            if direction:
                attrs.append(_str(ECHO_PREFIX + "direction", direction))
        attrs.append(_bool("is_cpu_op", False))
        attrs.append(_int("tensor_size", n.memcpy.bytes))
    elif kind in (pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_SYNC):
        c.type = _CHAKRA_TYPE_BY_NAME.get(chakra_type, et.COMP_NODE)
        attrs.append(_bool("is_cpu_op", True))
        cpu = n.cpu
        op = cpu.op
        if op and op != name:
            attrs.append(_str(ECHO_PREFIX + "op", op))
        if cpu.correlation:
            attrs.append(_int(ECHO_PREFIX + "correlation", cpu.correlation))
        if cpu.rf_id:
            attrs.append(_int("rf_id", cpu.rf_id))
        inputs = c.inputs
        inputs.shapes, inputs.types = cpu.shapes, cpu.dtypes
        if "chakra_inputs_values" in node_attrs:
            inputs.values = node_attrs["chakra_inputs_values"]
    else:  # comm_unknown, unknown
        if chakra_type in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
            c.type = _CHAKRA_TYPE_BY_NAME[chakra_type]
        else:
            # Chakra cannot say "communication of an unknown kind"; a collective without
            # comm_type would be read as one, so write a GPU COMP_NODE marked echo.kind.
            c.type = et.COMP_NODE
        attrs.append(_bool("is_cpu_op", False))
    native = kind in _NATIVE_KINDS and not (kind == pb.KIND_MEMCPY and c.type == et.COMP_NODE)
    if not native and not (kind == pb.KIND_COMM_UNKNOWN and chakra_type):
        attrs.append(_str(ECHO_PREFIX + "kind", node_kind_name(kind)))
    if n.HasField("annotations") and n.annotations.ByteSize():
        text = json.dumps(json_format.MessageToDict(n.annotations), sort_keys=True)
        attrs.append(_str(ECHO_PREFIX + "annotations", text))
    free = dict(node_attrs) if node_attrs else {}
    if "chakra_id" in free:
        attrs.append(_int("chakra_id", int(free["chakra_id"])))
    kept: list[et.AttributeProto | AttrSpec] = []
    for key in sorted(free):
        if key.startswith(KEPT_PREFIX):
            a = text_to_attr(key[len(KEPT_PREFIX):], free[key])
            if a is None:
                lossy["kept Chakra attributes that do not parse left out"] += 1
            else:
                kept.append(a)
        elif key not in ("chakra_id", "chakra_type", "chakra_inputs_values"):
            kept.append(_str(f"{ECHO_PREFIX}attr.{key}", free[key]))
    add = c.attr.add
    for name, member, value in attrs:
        add(**{"name": name, member: value})
    have = {a[0] for a in attrs}
    for a in kept:
        if isinstance(a, tuple):
            if a[0] not in have:
                add(**{"name": a[0], a[1]: a[2]})
        elif a.name not in have:
            c.attr.append(a)
    return c


def _compute_attrs(info: pb.ComputeInfo, name: str, attrs: list[AttrSpec]) -> None:
    if info.flops:
        attrs.append(_int("num_ops", round(info.flops)))
    if info.bytes:
        attrs.append(_int("tensor_size", info.bytes))
    if info.kernel_class != pb.KC_OTHER:
        attrs.append(_str(ECHO_PREFIX + "kernel_class",
                          KERNEL_CLASS_NAMES.get(info.kernel_class, "other")))
    if info.op and info.op != name:
        attrs.append(_str(ECHO_PREFIX + "op", info.op))


def _collective_attrs(n: pb.Node, ctx: _RankContext, attrs: list[AttrSpec],
                      lossy: Counter) -> None:
    info = n.collective
    group = ctx.group(info.group)
    if info.type in COLL_TO_CHAKRA:
        attrs.append(_int("comm_type", COLL_TO_CHAKRA[info.type]))
    else:
        lossy["collectives of unknown type written without comm_type"] += 1
    attrs.append(_int("comm_size", info.in_bytes))
    pg_name = ctx.pg_names[group.id]
    if pg_name:
        attrs.append(_str("pg_name", pg_name))
    if info.out_bytes != collective_out_bytes(info.type, info.in_bytes, len(group.ranks)):
        attrs.append(_int(ECHO_PREFIX + "out_bytes", info.out_bytes))
    if info.dtype:
        attrs.append(_str(ECHO_PREFIX + "dtype", info.dtype))
    if info.HasField("root"):
        attrs.append(_int(ECHO_PREFIX + "root", info.root))
    if info.algorithm:
        attrs.append(_str(ECHO_PREFIX + "algorithm", info.algorithm))


def _stream_attr(graph: Graph) -> dict[int, int]:
    """CUDA stream per echo stream id, for GPU streams that carry one (``stream`` attr)."""
    out = {}
    for s in graph.header.streams:
        if s.kind != pb.STREAM_CPU_THREAD and (s.native_id or s.name == f"stream {s.native_id}"):
            out[s.id] = s.native_id
    return out


def _output_files(prefix: str | os.PathLike[str], ranks: list[int]) -> list[Path]:
    p = Path(prefix)
    if str(prefix).endswith(("/", os.sep)) or p.is_dir() or not p.name:
        raise EchoError(f"{prefix}: give a file prefix such as out/trace "
                        "(writes out/trace.0.et, out/trace.1.et, ...)")
    return [p.with_name(f"{p.name}.{r}.et") for r in ranks]


def write(job: Job, prefix: str | os.PathLike[str], options: dict[str, Any] | None = None) -> dict:
    """Write ``PREFIX.{rank}.et`` for every rank of ``job``; returns what was written:
    ``files``, ``ranks``, ``nodes``, ``bytes`` and ``lossy`` (what Chakra could not hold)."""
    ranks = job.ranks()
    if not ranks:
        raise EchoError(f"{job.source or 'job'}: has no ranks to write")
    files = _output_files(prefix, ranks)
    pg_names = _pg_names(job)
    lossy: Counter = Counter()
    temps: list[str] = []
    total_nodes = 0
    total_bytes = 0
    try:
        id_sets: dict[str, Container[int]] = {}
        for rank, dest in zip(ranks, files, strict=True):
            graph = job.graph_of(rank)
            ids = id_sets.get(graph.id)
            if ids is None:
                ids = id_sets.setdefault(graph.id, graph.expanded_ids())
            streams = _stream_attr(graph)
            ctx = _RankContext(job, rank, pg_names)
            fd, tmp = temp_file_beside(dest)
            temps.append(tmp)
            with os.fdopen(fd, "wb") as f, output_errors(dest, Path(tmp)):
                meta = et.GlobalMetadata(version=CHAKRA_VERSION)
                meta.attr.append(str_attr("schema", f"echo-et {__version__}"))
                write_delimited(f, meta)
                for n in graph.iter_nodes():   # streamed: repeat blocks are not expanded in memory
                    c = _node(n, ctx, ids, lossy)
                    if n.stream in streams:
                        name, member, value = _int("stream", streams[n.stream])
                        c.attr.add(**{"name": name, member: value})
                    write_delimited(f, c)
                    total_nodes += 1
                total_bytes += f.tell()
        for tmp, dest in zip(temps, files, strict=True):
            publish_file(tmp, dest)
        temps = []
    finally:
        for tmp in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return {
        "format": "chakra",
        "prefix": str(prefix),
        "files": [str(f) for f in files],
        "ranks": len(ranks),
        "nodes": total_nodes,
        "bytes": total_bytes,
        "lossy": dict(sorted(lossy.items())),
    }
