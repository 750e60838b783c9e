"""Helpers shared by the ASTRA-sim export tests (no tests of its own): small Jobs built
with the IR builders, and decoding/re-encoding of ``.et`` rank files."""

from __future__ import annotations

from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et

from echo_et.ir import GraphBuilder, JobBuilder
from echo_et.ir.io import encode_varint, iter_delimited
from echo_et.ir.schema import pb


def read_et(path: Path) -> tuple[et.GlobalMetadata, list[et.Node]]:
    with open(path, "rb") as f:
        it = iter_delimited(f)
        meta = et.GlobalMetadata.FromString(next(it))
        return meta, [et.Node.FromString(d) for d in it]


def write_et(path: Path, meta: et.GlobalMetadata, nodes: list[et.Node]) -> None:
    parts = []
    for m in [meta, *nodes]:
        data = m.SerializeToString()
        parts.append(encode_varint(len(data)) + data)
    Path(path).write_bytes(b"".join(parts))


def attrs_of(node: et.Node) -> dict[str, tuple[str, object]]:
    out = {}
    for a in node.attr:
        kind = a.WhichOneof("value")
        out[a.name] = (kind, getattr(a, kind))
    return out


def attr_value(node: et.Node, name: str):
    a = attrs_of(node).get(name)
    return None if a is None else a[1]


def set_attr(node: et.Node, name: str, **value) -> None:
    """Replace (or add) attribute ``name`` of ``node`` with the given fields."""
    for a in node.attr:
        if a.name == name:
            a.Clear()
            a.name = name
            for k, v in value.items():
                setattr(a, k, v)
            return
    node.attr.append(et.AttributeProto(name=name, **value))


def drop_attr(node: et.Node, name: str) -> None:
    keep = [a for a in node.attr if a.name != name]
    del node.attr[:]
    node.attr.extend(keep)


def uniform_job(world: int, build, *, groups: dict[str, list[list[int]]] | None = None,
                name: str = "t"):
    """A Job whose ranks each get a graph made by ``build(gb, rank, streams)``; ``groups``
    maps a group key to the rank lists of its groups (default: "world" = all ranks)."""
    groups = groups or {"world": [list(range(world))]}
    jb = JobBuilder(name, world)
    ids: dict[str, list[tuple[list[int], int]]] = {}
    for key, lists in groups.items():
        ids[key] = [(ranks, jb.group(ranks, name=f"{key}{i}", role="custom"))
                    for i, ranks in enumerate(lists)]
    for r in range(world):
        gb = GraphBuilder(f"g{r}")
        streams = {
            "cpu": gb.stream(pb.STREAM_CPU_THREAD, "thread 1"),
            "compute": gb.stream(pb.STREAM_GPU_COMPUTE, "stream 7", device=0),
            "comm": gb.stream(pb.STREAM_GPU_COMM, "stream 20", device=0),
            "copy": gb.stream(pb.STREAM_GPU_COPY, "stream 9", device=0),
        }
        binding = {}
        for key, lst in ids.items():
            for ranks, gid in lst:
                if r in ranks:
                    binding[key] = gid
                    gb.declare_group(key, len(ranks))
        build(gb, r, streams)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", binding)
    return jb.build()
