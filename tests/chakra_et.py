"""Test helpers for Chakra ET files, independent of the converter under test: a varint
framing of their own, the mlc-chakra schema, and the real inputs under ../shared/data."""

from __future__ import annotations

import gzip
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et

from conftest import shared_path, unpack

ASTRA = "traces/astra-sim/examples"
MICROBENCHMARKS = {
    "all_reduce": f"{ASTRA}/workload/microbenchmarks/all_reduce/8npus_1MB",
    "all_to_all": f"{ASTRA}/workload/microbenchmarks/all_to_all/8npus_1MB",
}
CUSTOM_RING = f"{ASTRA}/system/custom_collectives/custom_ring_allreduce_8npus_1MB"
FEEDER_ARCHIVE = "traces/chakra/tests/data/feeder_tests_trace.tar.gz"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def frame(*messages: bytes) -> bytes:
    return b"".join(varint(len(m)) + m for m in messages)


def split_frames(data: bytes) -> list[bytes]:
    out = []
    pos = 0
    while pos < len(data):
        n = shift = 0
        while True:
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append(data[pos:pos + n])
        pos += n
    return out


def decode(path: Path) -> tuple[et.GlobalMetadata, list[et.Node]]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    frames = split_frames(data)
    meta = et.GlobalMetadata()
    meta.ParseFromString(frames[0])
    nodes = []
    for f in frames[1:]:
        n = et.Node()
        n.ParseFromString(f)
        nodes.append(n)
    return meta, nodes


def encode(nodes: list[et.Node], version: str = "0.0.4") -> bytes:
    meta = et.GlobalMetadata(version=version)
    return frame(meta.SerializeToString(), *(n.SerializeToString() for n in nodes))


def write_et(path: Path, nodes: list[et.Node], version: str = "0.0.4") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(nodes, version))
    return path


def attr(name: str, **value) -> et.AttributeProto:
    return et.AttributeProto(name=name, **value)


def node(node_id: int, name: str, ntype: int, *, data=(), ctrl=(), dur=0, **attrs) -> et.Node:
    """A Chakra node; keyword attrs are ``name=(field, value)``."""
    n = et.Node(id=node_id, name=name, type=ntype, duration_micros=dur)
    n.data_deps.extend(data)
    n.ctrl_deps.extend(ctrl)
    for k, (field, v) in attrs.items():
        n.attr.append(attr(k, **{field: v}))
    return n


def attr_value(n: et.Node, name: str):
    for a in n.attr:
        if a.name == name:
            return getattr(a, a.WhichOneof("value"))
    return None


def attr_field(n: et.Node, name: str) -> str | None:
    for a in n.attr:
        if a.name == name:
            return a.WhichOneof("value")
    return None


def rank_files(rel: str) -> list[Path]:
    folder = shared_path(rel)
    return sorted(folder.glob("*.et"), key=lambda p: int(p.name.split(".")[-2]))


def feeder_trace(tmp: Path) -> Path:
    archive = shared_path(FEEDER_ARCHIVE)
    unpack(archive, tmp)
    found = list(tmp.rglob("chakra.0.et"))
    assert found, "feeder_tests_trace.tar.gz holds no chakra.0.et"
    return found[0]

