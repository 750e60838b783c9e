"""Writing plain Chakra ET: round trips on the real inputs, attribute types, determinism,
atomicity, and jobs that did not come from Chakra."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from chakra_et import CUSTOM_RING, MICROBENCHMARKS, attr_field, attr_value, decode, feeder_trace, rank_files

from echo_et.converters import ReadOptions
from echo_et.converters import chakra as chakra_conv
from echo_et.converters.chakra import writer
from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, check_job, pb

# What chakra-astrasim.md section 1.10 says each attribute's member must be.
STANDARD = {"is_cpu_op": "bool_val", "comm_type": "int64_val", "comm_size": "int64_val",
            "comm_src": "int32_val", "comm_dst": "int32_val", "comm_tag": "int32_val",
            "pg_name": "string_val", "num_ops": "int64_val", "tensor_size": "uint64_val"}


def read(paths):
    return chakra_conv.read([Path(p) for p in paths], ReadOptions())


def graph_signature(job) -> list:
    """What the issue's round trip must keep, per rank: node ids, names, kinds, dependencies
    (id and kind), collective type/bytes/group, P2P peer/bytes/tag, durations."""
    out = []
    for r in job.ranks():
        rows = []
        for n in job.graph_of(r).nodes:
            row = [n.id, n.name, n.kind, n.duration_ns, tuple((d.id, d.kind) for d in n.deps)]
            if n.kind == pb.KIND_COLLECTIVE:
                c = n.collective
                row += [c.type, c.in_bytes, c.out_bytes, job.resolve_group(r, c.group).ranks[:]]
            elif n.kind in (pb.KIND_SEND, pb.KIND_RECV):
                p = n.p2p
                row += [job.resolve_group(r, p.group).ranks[p.peer], p.bytes, p.tag]
            rows.append(tuple(row))
        out.append(rows)
    return out


def real_inputs(tmp_path: Path):
    yield "feeder", [feeder_trace(tmp_path / "feeder")]
    for name, rel in sorted(MICROBENCHMARKS.items()):
        yield name, rank_files(rel)
    yield "custom_ring", rank_files(CUSTOM_RING)


@pytest.fixture(scope="module")
def round_trips(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rt")
    out = {}
    for name, files in real_inputs(tmp):
        first = read(files)
        res1 = chakra_conv.write(first, tmp / name / "a" / "trace")
        res2 = chakra_conv.write(first, tmp / name / "b" / "trace")
        second = read(res1["files"])
        res3 = chakra_conv.write(second, tmp / name / "c" / "trace")
        out[name] = (files, first, second, res1, res2, res3)
    return out


CASES = ["feeder", "all_reduce", "all_to_all", "custom_ring"]


@pytest.mark.parametrize("case", CASES)
def test_round_trip_keeps_the_graph(round_trips, case):
    _, first, second, _, _, _ = round_trips[case]
    assert check_job(second) == []
    assert second.world_size == first.world_size
    assert graph_signature(second) == graph_signature(first)


@pytest.mark.parametrize("case", CASES)
def test_writing_twice_gives_identical_bytes(round_trips, case):
    _, _, _, res1, res2, res3 = round_trips[case]
    a = [Path(f).read_bytes() for f in res1["files"]]
    assert a == [Path(f).read_bytes() for f in res2["files"]]
    # Chakra -> Job -> Chakra -> Job -> Chakra: the second export is the first, byte for byte.
    assert a == [Path(f).read_bytes() for f in res3["files"]]


@pytest.mark.parametrize("case", CASES)
def test_output_follows_the_chakra_contract(round_trips, case):
    files, _, _, res, _, _ = round_trips[case]
    assert [Path(f).name for f in res["files"]] == [f"trace.{r}.et" for r in range(len(files))]
    assert res["ranks"] == len(files)
    total = 0
    for src, out in zip(files, res["files"], strict=True):
        meta, nodes = decode(Path(out))
        _, src_nodes = decode(src)
        total += len(nodes)
        assert meta.version
        assert len(nodes) == len(src_nodes)
        ids = {n.id for n in nodes}
        assert len(ids) == len(nodes)
        for n in nodes:
            assert n.ByteSize() > 0
            assert set(n.data_deps) <= ids and set(n.ctrl_deps) <= ids
            assert attr_field(n, "is_cpu_op") == "bool_val"
            for a in n.attr:
                if a.name in STANDARD:
                    assert a.WhichOneof("value") == STANDARD[a.name], (n.id, a.name)
        # Same Chakra types, sizes and durations as the source, node for node (by name).
        src_by_name = sorted((n.name, n.type, n.duration_micros, attr_value(n, "comm_size") or 0)
                             for n in src_nodes)
        out_by_name = sorted((n.name, n.type, n.duration_micros, attr_value(n, "comm_size") or 0)
                             for n in nodes)
        assert out_by_name == src_by_name
    assert res["nodes"] == total


def test_custom_ring_p2p_written_with_global_ranks(round_trips):
    files, _, _, res, _, _ = round_trips["custom_ring"]
    for rank, (src, out) in enumerate(zip(files, res["files"], strict=True)):
        _, a = decode(src)
        _, b = decode(Path(out))
        for x, y in zip(a, b, strict=True):
            if x.type == et.COMM_SEND_NODE:
                assert (attr_value(y, "comm_src"), attr_value(y, "comm_dst")) == (rank, attr_value(x, "comm_dst"))
            if x.type == et.COMM_RECV_NODE:
                assert (attr_value(y, "comm_src"), attr_value(y, "comm_dst")) == (attr_value(x, "comm_src"), rank)
            if x.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
                assert attr_value(y, "comm_tag") == attr_value(x, "comm_tag")


def test_feeder_ctrl_deps_written_only_to_existing_ids(round_trips):
    files, first, _, res, _, _ = round_trips["feeder"]
    _, src = decode(files[0])
    ids = {n.id for n in src}
    assert any(d not in ids for n in src for d in n.ctrl_deps)  # the source has dangling ones
    _, out = decode(Path(res["files"][0]))
    kept = sum(1 for n in first.graph_of(0).nodes for d in n.deps if d.kind == pb.DEP_CONTROL)
    assert sum(len(n.ctrl_deps) for n in out) == kept


# -- jobs built with the builders ----------------------------------------------------------
def built_job():
    """Two ranks, every node kind, a subgroup collective and P2P addressed in a 2-rank group."""
    jb = JobBuilder("built", 2, source_format="test")
    world = jb.group([0, 1], name="0", role="world")
    pp = jb.group([0, 1], name="7", role="pp")
    for rank in range(2):
        b = GraphBuilder(f"g{rank}")
        cpu = b.stream(pb.STREAM_CPU_THREAD, "main", native_id=4242)
        gpu = b.stream(pb.STREAM_GPU_COMPUTE, "stream 7", device=0, native_id=7)
        comm = b.stream(pb.STREAM_GPU_COMM, "stream 20", device=0, native_id=20)
        b.declare_group("dp", 2)
        b.declare_group("pp", 2)
        op = b.cpu_op("aten::mm", cpu, start_ns=1000, duration_ns=2500)
        op.annotations.phase = "forward"
        op.annotations.layer = 3
        launch = b.cpu_op("cudaLaunchKernel", cpu, kind=pb.KIND_LAUNCH, correlation=77,
                          deps=[(op.id, pb.DEP_CONTROL)], duration_ns=400)
        k = b.compute("sm90_gemm", gpu, kernel_class=pb.KC_GEMM, flops=2e9, bytes_=4096,
                      deps=[(launch.id, pb.DEP_LAUNCH)], duration_ns=12_345, start_ns=5_000)
        k.attrs["grid"] = "[1, 2, 3]"
        ms = b.memcpy("memset", gpu, nbytes=64, direction="memset", kind=pb.KIND_MEMSET, deps=[k.id])
        cp = b.memcpy("Memcpy DtoH", gpu, nbytes=128, direction="DtoH", deps=[ms.id])
        sync = b.cpu_op("cudaStreamSynchronize", cpu, kind=pb.KIND_SYNC, deps=[(cp.id, pb.DEP_SYNC)])
        ar = b.collective("nccl:all_reduce", comm, coll_type=pb.COLL_ALL_REDUCE, group="dp",
                          in_bytes=1 << 20, dtype="bf16", deps=[k.id])
        ag = b.collective("nccl:all_gather", comm, coll_type=pb.COLL_ALL_GATHER, group="dp",
                          in_bytes=512, out_bytes=1024, root=None, deps=[ar.id])
        ag.collective.algorithm = "ring"
        bc = b.collective("nccl:broadcast", comm, coll_type=pb.COLL_BROADCAST, group="pp",
                          in_bytes=8, root=1, deps=[ag.id])
        unk = b.node(pb.KIND_COMM_UNKNOWN, "mystery_comm", comm, deps=[bc.id], duration_ns=999)
        if rank == 0:
            b.p2p(True, "send", comm, group="pp", peer=1, nbytes=32, tag=5, deps=[unk.id])
        else:
            b.p2p(False, "recv", comm, group="pp", peer=0, nbytes=32, tag=5, deps=[unk.id])
        b.node(pb.KIND_CPU_OP, "tail", cpu, deps=[sync.id]).cpu.op = "tail_op"
        jb.add_graph(b.build())
        jb.bind(rank, f"g{rank}", {"dp": world, "pp": pp})
    return jb.build()


def test_built_job_round_trip(tmp_path):
    job = built_job()
    assert check_job(job) == []
    res = chakra_conv.write(job, tmp_path / "x" / "built")
    back = read(res["files"])
    assert check_job(back) == []
    assert [[(n.id, n.name, n.kind) for n in back.graph_of(r).nodes] for r in (0, 1)] == \
           [[(n.id, n.name, n.kind) for n in job.graph_of(r).nodes] for r in (0, 1)]
    a = {n.name: n for n in job.graph_of(0).nodes}
    b = {n.name: n for n in back.graph_of(0).nodes}
    # Fields Chakra has no place for travel in echo.* attributes and come back.
    assert b["aten::mm"].annotations == a["aten::mm"].annotations
    assert b["cudaLaunchKernel"].cpu.correlation == 77
    assert b["sm90_gemm"].compute.kernel_class == pb.KC_GEMM
    assert b["sm90_gemm"].compute.flops == 2e9 and b["sm90_gemm"].compute.bytes == 4096
    assert b["sm90_gemm"].attrs["grid"] == "[1, 2, 3]"
    assert (b["memset"].memcpy.direction, b["memset"].memcpy.bytes) == ("memset", 64)
    assert b["Memcpy DtoH"].memcpy.direction == "DtoH"
    assert b["nccl:all_reduce"].collective.dtype == "bf16"
    assert b["nccl:all_gather"].collective.algorithm == "ring"
    assert b["nccl:all_gather"].collective.out_bytes == 1024
    assert b["nccl:broadcast"].collective.root == 1
    assert b["tail"].cpu.op == "tail_op"
    # Durations in whole µs, rounded half up: 12 345 ns -> 12 µs, 2 500 ns -> 3 µs, 400 -> 1 (not 0).
    assert b["sm90_gemm"].duration_ns == 12_000
    assert b["aten::mm"].duration_ns == 3_000
    assert b["cudaLaunchKernel"].duration_ns == 1_000
    # Launch and sync deps become data deps; control deps stay control deps.
    assert [(d.kind) for d in b["sm90_gemm"].deps] == [pb.DEP_DATA]
    assert [(d.kind) for d in b["cudaLaunchKernel"].deps] == [pb.DEP_CONTROL]
    assert res["lossy"]["launch/sync deps written as data_deps"] == 4
    assert res["lossy"]["durations rounded to whole microseconds"] > 0
    # The P2P peer was a group index; in Chakra it is a global rank, and comes back as one.
    send = b["send"]
    assert back.resolve_group(0, send.p2p.group).ranks[send.p2p.peer] == 1


def test_built_job_attribute_types_and_pg_names(tmp_path):
    res = chakra_conv.write(built_job(), tmp_path / "built")
    _, nodes = decode(Path(res["files"][1]))
    n = {x.name: x for x in nodes}
    assert attr_value(n["nccl:all_reduce"], "pg_name") is None     # world group: no pg_name
    assert attr_value(n["nccl:broadcast"], "pg_name") == "7"      # its group's name
    assert (attr_value(n["recv"], "comm_src"), attr_value(n["recv"], "comm_dst")) == (0, 1)
    assert n["sm90_gemm"].type == et.COMP_NODE and attr_value(n["sm90_gemm"], "is_cpu_op") is False
    assert attr_value(n["sm90_gemm"], "stream") == 7
    assert attr_value(n["nccl:all_reduce"], "stream") == 20
    assert attr_value(n["aten::mm"], "stream") is None             # CPU threads carry no stream
    assert attr_value(n["aten::mm"], "is_cpu_op") is True
    assert attr_value(n["cudaLaunchKernel"], "echo.kind") == "launch"
    assert attr_value(n["mystery_comm"], "echo.kind") == "comm_unknown"
    for x in nodes:
        for a in x.attr:
            if a.name in STANDARD:
                assert a.WhichOneof("value") == STANDARD[a.name]


def test_micros_rounding_rule():
    m = writer.micros
    assert [m(v, at_least_one=True) for v in (0, 1, 499, 500, 1499, 1500, 2_000_000)] == \
           [0, 1, 1, 1, 1, 2, 2000]
    assert [m(v, at_least_one=False) for v in (0, 499, 500, 1500)] == [0, 0, 1, 2]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    job = built_job()
    per_rank = len(job.graph_of(0))
    calls = {"n": 0}
    real = writer._node

    def failing(n, ctx, ids, lossy):
        calls["n"] += 1
        if ctx.rank == 1 and calls["n"] > per_rank + 3:
            raise OSError("disk full")
        return real(n, ctx, ids, lossy)

    monkeypatch.setattr(writer, "_node", failing)
    out = tmp_path / "out"
    with pytest.raises(OSError):
        chakra_conv.write(job, out / "t")
    assert calls["n"] == per_rank + 4    # rank 0 was complete, rank 1 half written
    assert os.listdir(out) == []


def test_prefix_must_name_files(tmp_path):
    job = built_job()
    with pytest.raises(EchoError, match="give a file prefix"):
        chakra_conv.write(job, tmp_path)
    with pytest.raises(EchoError, match="give a file prefix"):
        chakra_conv.write(job, f"{tmp_path}/sub/")


def test_unchecked_job_with_a_bad_peer_is_refused_cleanly(tmp_path):
    job = built_job().copy()
    send = next(n for n in job.graph("g0").nodes if n.kind == pb.KIND_SEND)
    send.p2p.peer = 9
    with pytest.raises(EchoError, match=r"rank 0 node \d+ \(send\): peer 9 is outside group 'pp'"):
        chakra_conv.write(job, tmp_path / "x" / "t")
    assert not list((tmp_path / "x").iterdir())
