"""Reading Chakra ET: the real files under ../shared/data, every tolerance, every refusal.

Expected numbers are taken from the files themselves (decoded here with the mlc-chakra
schema), never from the converter's own output.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from chakra_et import (
    CUSTOM_RING,
    MICROBENCHMARKS,
    attr_value,
    decode,
    encode,
    feeder_trace,
    frame,
    node,
    rank_files,
    varint,
    write_et,
)

from echo_et.converters import ReadOptions
from echo_et.converters import chakra as chakra_conv
from echo_et.converters import read as read_any
from echo_et.errors import EchoError
from echo_et.ir import check_job, pb

COLL_OF_CHAKRA = {
    et.ALL_REDUCE: pb.COLL_ALL_REDUCE, et.ALL_GATHER: pb.COLL_ALL_GATHER,
    et.ALL_TO_ALL: pb.COLL_ALL_TO_ALL, et.REDUCE_SCATTER: pb.COLL_REDUCE_SCATTER,
    et.BROADCAST: pb.COLL_BROADCAST,
}


def read(paths, **opts):
    return chakra_conv.read([Path(p) for p in paths], ReadOptions(**opts))


def nodes_of(job, rank=0):
    return list(job.graph_of(rank).nodes)


def original_id(n: pb.Node) -> int:
    return int(n.attrs.get("chakra_id", n.id))


# -- the real ResNet DDP trace -------------------------------------------------------------
@pytest.fixture(scope="module")
def feeder(tmp_path_factory):
    path = feeder_trace(tmp_path_factory.mktemp("feeder"))
    meta, nodes = decode(path)
    return path, meta, nodes, read([path])


def test_feeder_counts_match_the_file(feeder):
    path, meta, nodes, job = feeder
    ids = {n.id for n in nodes}
    colls = [n for n in nodes if n.type == et.COMM_COLL_NODE]
    host_colls = [n for n in colls if attr_value(n, "is_cpu_op")]
    no_type = [n for n in colls if attr_value(n, "comm_type") is None]
    dangling = sum(1 for n in nodes for d in n.ctrl_deps if d not in ids)
    # The facts the issue states about this file, checked on the file itself.
    assert (len(nodes), len(colls), len(no_type), dangling) == (3664, 21, 14, 1277)
    assert meta.version == ""

    got = nodes_of(job)
    assert len(got) == len(nodes)
    kinds = Counter(n.kind for n in got)
    assert kinds[pb.KIND_COLLECTIVE] == len(colls) - len(host_colls)
    cpu = sum(1 for n in nodes if attr_value(n, "is_cpu_op"))
    assert kinds[pb.KIND_CPU_OP] == cpu
    assert kinds[pb.KIND_COMPUTE] == len(nodes) - cpu - (len(colls) - len(host_colls))
    dropped = dict(job.manifest.dropped)
    assert dropped["chakra: ctrl_deps naming no node dropped"] == dangling
    assert dropped["chakra: COMM_COLL_NODE with is_cpu_op=true kept as a host cpu_op"] == len(host_colls)
    assert dropped["chakra: empty GlobalMetadata.version"] == 1
    assert check_job(job) == []


def test_feeder_collectives_keep_type_size_and_time(feeder):
    _, _, nodes, job = feeder
    by_id = {n.id: n for n in nodes}
    seen = 0
    for n in nodes_of(job):
        src = by_id[original_id(n)]
        assert n.name == src.name
        assert n.duration_ns == src.duration_micros * 1000
        if n.kind == pb.KIND_COLLECTIVE:
            seen += 1
            assert n.collective.type == COLL_OF_CHAKRA[attr_value(src, "comm_type")]
            assert n.collective.in_bytes == attr_value(src, "comm_size")
            assert n.collective.out_bytes == n.collective.in_bytes  # all-reduce/broadcast, world 1
            assert n.collective.group == "0"
    assert seen == sum(1 for n in nodes if n.type == et.COMM_COLL_NODE and not attr_value(n, "is_cpu_op"))


def test_feeder_dependencies_are_kept_and_ids_follow_them(feeder):
    _, _, nodes, job = feeder
    by_id = {n.id: n for n in nodes}
    ids = set(by_id)
    got = nodes_of(job)
    new_to_old = {n.id: original_id(n) for n in got}
    # Ids were not in dependency order in the file (a node data-depends on a later id)...
    assert any(d > n.id for n in nodes for d in n.data_deps)
    dropped_ctrl = 0
    for n in got:
        src = by_id[new_to_old[n.id]]
        data = [new_to_old[d.id] for d in n.deps if d.kind == pb.DEP_DATA]
        ctrl = [new_to_old[d.id] for d in n.deps if d.kind == pb.DEP_CONTROL]
        assert data == list(dict.fromkeys(src.data_deps))
        valid_ctrl = [d for d in dict.fromkeys(src.ctrl_deps) if d in ids]
        assert set(ctrl) <= set(valid_ctrl)
        dropped_ctrl += len(valid_ctrl) - len(ctrl)
        # ...so they were renumbered: every dependency now points to a smaller id.
        assert all(d.id < n.id for d in n.deps)
    reason = "chakra: ctrl_deps contradicting data_deps dropped"
    assert job.manifest.dropped.get(reason, 0) == dropped_ctrl


def test_feeder_dropped_ctrl_deps_really_contradict_data_order(feeder):
    """Every ctrl dep given up is one whose parent data-depends (transitively) on the child."""
    import networkx as nx

    _, _, nodes, job = feeder
    ids = {n.id for n in nodes}
    g = nx.DiGraph()
    g.add_nodes_from(ids)
    g.add_edges_from((d, n.id) for n in nodes for d in n.data_deps)
    got = {original_id(n): n for n in nodes_of(job)}
    new_to_old = {n.id: original_id(n) for n in got.values()}
    for n in nodes:
        kept = {new_to_old[d.id] for d in got[n.id].deps if d.kind == pb.DEP_CONTROL}
        for d in set(n.ctrl_deps) & ids:
            if d not in kept and d not in n.data_deps:
                assert nx.has_path(g, n.id, d)


# -- ASTRA-sim microbenchmarks and the custom ring ------------------------------------------
@pytest.mark.parametrize("coll", sorted(MICROBENCHMARKS))
def test_microbenchmarks(coll):
    files = rank_files(MICROBENCHMARKS[coll])
    job = read(files)
    assert job.world_size == len(files) == 8
    assert check_job(job) == []
    world = [g for g in job.manifest.groups if g.name == "0"]
    assert len(world) == 1 and list(world[0].ranks) == list(range(8))
    for rank, f in enumerate(files):
        _, src = decode(f)
        got = nodes_of(job, rank)
        assert [n.id for n in got] == [n.id for n in src]
        for n, s in zip(got, src, strict=True):
            assert n.kind == pb.KIND_COLLECTIVE
            assert n.collective.type == COLL_OF_CHAKRA[attr_value(s, "comm_type")]
            assert n.collective.in_bytes == attr_value(s, "comm_size")
            assert n.collective.out_bytes == attr_value(s, "comm_size")
    assert job.manifest.attrs["chakra_version"] == decode(files[0])[0].version


def test_custom_ring_send_recv_pass_the_p2p_rule():
    files = rank_files(CUSTOM_RING)
    job = read(files)
    assert job.world_size == 8
    assert check_job(job) == []
    for rank, f in enumerate(files):
        _, src = decode(f)
        got = {n.id: n for n in nodes_of(job, rank)}
        for s in src:
            n = got[s.id]
            if s.type == et.COMM_SEND_NODE:
                assert n.kind == pb.KIND_SEND
                assert n.p2p.peer == attr_value(s, "comm_dst")
            elif s.type == et.COMM_RECV_NODE:
                assert n.kind == pb.KIND_RECV
                assert n.p2p.peer == attr_value(s, "comm_src")
            else:
                assert n.kind == pb.KIND_COMPUTE
                continue
            assert n.p2p.bytes == attr_value(s, "comm_size")
            assert n.p2p.tag == attr_value(s, "comm_tag")
            assert n.p2p.group == "0"
            assert [d.id for d in n.deps] == list(s.data_deps)
    assert job.manifest.dropped["chakra: empty GlobalMetadata.version"] == 8


def test_custom_ring_with_one_wrong_recv_size_fails_p2p_match(tmp_path):
    files = rank_files(CUSTOM_RING)
    for f in files:
        shutil.copy(f, tmp_path / f.name)
    target = tmp_path / files[3].name
    meta, nodes = decode(target)
    recv = next(n for n in nodes if n.type == et.COMM_RECV_NODE)
    for a in recv.attr:
        if a.name == "comm_size":
            a.int64_val += 8
    target.write_bytes(encode(nodes, meta.version))
    issues = check_job(read(sorted(tmp_path.glob("*.et"))))
    assert [i.rule for i in issues] == ["p2p-match"]
    assert f"node {recv.id}" in str(issues[0]) and "rank 3" in str(issues[0])


def test_gzip_input_reads_like_plain(tmp_path):
    files = rank_files(MICROBENCHMARKS["all_reduce"])
    gz = []
    for f in files:
        out = tmp_path / (f.name + ".gz")
        out.write_bytes(gzip.compress(f.read_bytes(), mtime=0))
        gz.append(out)
    a, b = read(files), read(gz)
    for r in range(8):
        assert [x.SerializeToString(deterministic=True) for x in nodes_of(a, r)] == \
               [x.SerializeToString(deterministic=True) for x in nodes_of(b, r)]


def test_folder_input_is_detected_as_chakra():
    folder = rank_files(CUSTOM_RING)[0].parent
    job = read_any([folder])
    assert job.manifest.provenance.source_format == "chakra"
    assert job.world_size == 8


# -- tolerances (synthetic files) ----------------------------------------------------------
def coll(node_id, name, **attrs):
    return node(node_id, name, et.COMM_COLL_NODE, is_cpu_op=("bool_val", False), **attrs)


def test_single_file_without_rank_is_rank_0_of_1(tmp_path):
    f = write_et(tmp_path / "trace.et", [node(1, "k", et.COMP_NODE, dur=3)])
    job = read([f])
    assert job.world_size == 1 and job.ranks() == [0]
    assert job.manifest.name == "trace"
    n = nodes_of(job)[0]
    assert (n.kind, n.duration_ns) == (pb.KIND_COMPUTE, 3000)


def test_collective_without_comm_type_is_inferred_from_its_name(tmp_path):
    f = write_et(tmp_path / "t.et", [
        coll(1, "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", comm_size=("int64_val", 64)),
        coll(2, "mystery_comm_kernel", comm_size=("int64_val", 8), data=[1]),
    ])
    job = read([f])
    a, b = nodes_of(job)
    assert a.collective.type == pb.COLL_ALL_GATHER
    assert b.collective.type == pb.COLL_UNKNOWN
    d = job.manifest.dropped
    assert d["chakra: collective without comm_type, type inferred from its name"] == 1
    assert d["chakra: collective without comm_type and no type in its name (unknown)"] == 1
    assert check_job(job) == []


@pytest.mark.parametrize("field", ["int32_val", "uint64_val", "uint32_val", "sint64_val", "fixed64_val"])
def test_integer_attribute_variants_are_read_and_counted(tmp_path, field):
    f = write_et(tmp_path / "t.et", [coll(1, "ar", comm_type=("int64_val", 0), comm_size=(field, 4096))])
    job = read([f])
    assert nodes_of(job)[0].collective.in_bytes == 4096
    reasons = [k for k in job.manifest.dropped if "comm_size" in k]
    assert reasons == [f"chakra: attribute comm_size stored as {field} (standard int64_val), read as integer"]


def test_non_integer_size_is_refused(tmp_path):
    f = write_et(tmp_path / "t.et", [coll(1, "ar", comm_type=("int64_val", 0), comm_size=("string_val", "big"))])
    with pytest.raises(EchoError, match=r"t\.et: node 1 \(ar\): attribute comm_size holds string_val"):
        read([f])


def test_dangling_ctrl_deps_are_dropped_and_counted(tmp_path):
    f = write_et(tmp_path / "t.et", [
        node(1, "a", et.COMP_NODE, ctrl=[77]),
        node(2, "b", et.COMP_NODE, data=[1], ctrl=[1, 99, 98]),
    ])
    job = read([f])
    a, b = nodes_of(job)
    assert [(d.id, d.kind) for d in b.deps] == [(1, pb.DEP_DATA), (1, pb.DEP_CONTROL)]
    assert not a.deps
    assert job.manifest.dropped["chakra: ctrl_deps naming no node dropped"] == 3


def test_ids_out_of_dependency_order_are_renumbered(tmp_path):
    # 10 waits for 30, which waits for 20: program order is 20, 30, 10.
    f = write_et(tmp_path / "t.et", [
        node(10, "last", et.COMP_NODE, data=[30]),
        node(20, "first", et.COMP_NODE),
        node(30, "middle", et.COMP_NODE, data=[20]),
    ])
    job = read([f])
    got = nodes_of(job)
    assert [(n.id, n.name, n.attrs["chakra_id"]) for n in got] == [
        (1, "first", "20"), (2, "middle", "30"), (3, "last", "10")]
    assert [d.id for d in got[2].deps] == [2]
    assert job.manifest.dropped["chakra: node ids not in dependency order, renumbered"] == 3
    assert check_job(job) == []


def test_ids_in_order_are_kept(tmp_path):
    f = write_et(tmp_path / "t.et", [node(5, "a", et.COMP_NODE), node(9, "b", et.COMP_NODE, data=[5])])
    got = nodes_of(read([f]))
    assert [n.id for n in got] == [5, 9]
    assert all("chakra_id" not in n.attrs for n in got)


def test_node_types_map_to_kinds_and_streams(tmp_path):
    f = write_et(tmp_path / "t.et", [
        node(1, "## process_group:init ##", et.METADATA_NODE),
        node(2, "aten::mm", et.COMP_NODE, is_cpu_op=("bool_val", True), data=[1]),
        node(3, "gemm_kernel", et.COMP_NODE, data=[2], num_ops=("int64_val", 1000),
             tensor_size=("uint64_val", 64)),
        node(4, "load", et.MEM_LOAD_NODE, tensor_size=("uint64_val", 128)),
        node(5, "store", et.MEM_STORE_NODE, tensor_size=("uint64_val", 256)),
        node(6, "send_no_peer", et.COMM_SEND_NODE, comm_size=("int64_val", 8)),
        node(7, "inv", et.INVALID_NODE),
    ])
    job = read([f])
    g = job.graph_of(0)
    got = {n.id: n for n in g.nodes}
    kind = {i: n.kind for i, n in got.items()}
    assert kind == {1: pb.KIND_CPU_OP, 2: pb.KIND_CPU_OP, 3: pb.KIND_COMPUTE, 4: pb.KIND_MEMCPY,
                    5: pb.KIND_MEMCPY, 6: pb.KIND_COMM_UNKNOWN, 7: pb.KIND_CPU_OP}
    assert got[1].attrs["chakra_type"] == "METADATA_NODE"
    assert got[7].attrs["chakra_type"] == "INVALID_NODE"
    assert got[6].attrs["chakra_type"] == "COMM_SEND_NODE"
    assert (got[3].compute.flops, got[3].compute.bytes) == (1000.0, 64)
    assert (got[4].memcpy.direction, got[4].memcpy.bytes) == ("load", 128)
    assert (got[5].memcpy.direction, got[5].memcpy.bytes) == ("store", 256)
    stream_kind = {s.id: s.kind for s in g.header.streams}
    assert stream_kind[got[2].stream] == pb.STREAM_CPU_THREAD
    assert stream_kind[got[3].stream] == pb.STREAM_GPU_COMPUTE
    assert stream_kind[got[6].stream] == pb.STREAM_GPU_COMM
    assert stream_kind[got[4].stream] == pb.STREAM_GPU_COPY
    d = job.manifest.dropped
    assert d["chakra: METADATA_NODE kept as a cpu_op"] == 1
    assert d["chakra: INVALID_NODE kept as a cpu_op"] == 1
    assert d["chakra: COMM_SEND_NODE without comm_dst kept as comm_unknown"] == 1
    assert check_job(job) == []


def test_stream_attribute_makes_one_stream_per_cuda_stream(tmp_path):
    f = write_et(tmp_path / "t.et", [
        node(1, "k1", et.COMP_NODE, stream=("int64_val", 7)),
        coll(2, "ar", comm_type=("int64_val", 0), comm_size=("int64_val", 4), stream=("int64_val", 20)),
        node(3, "k2", et.COMP_NODE, stream=("int64_val", 7)),
        node(4, "k3", et.COMP_NODE),
    ])
    g = read([f]).graph_of(0)
    by_name = {s.name: s for s in g.header.streams}
    assert set(by_name) == {"stream 7", "stream 20", "gpu:compute"}
    assert by_name["stream 20"].kind == pb.STREAM_GPU_COMM
    assert (by_name["stream 7"].kind, by_name["stream 7"].native_id) == (pb.STREAM_GPU_COMPUTE, 7)
    n = {x.name: x for x in g.nodes}
    assert n["k1"].stream == n["k2"].stream == by_name["stream 7"].id


def test_pg_names_become_groups_inferred_from_usage(tmp_path):
    # ranks 0,1 use pg "1"; ranks 2,3 use pg "2"; all use the world group (pg_name "0" / none).
    for r in range(4):
        pg = "1" if r < 2 else "2"
        write_et(tmp_path / f"job.{r}.et", [
            coll(1, "ar_world", comm_type=("int64_val", 0), comm_size=("int64_val", 64),
                 pg_name=("string_val", "0")),
            coll(2, "ag_sub", comm_type=("int64_val", 2), comm_size=("int64_val", 16),
                 pg_name=("string_val", pg), data=[1]),
            coll(3, "rs_world", comm_type=("int64_val", 7), comm_size=("int64_val", 64), data=[2]),
        ])
    job = read(sorted(tmp_path.glob("*.et")))
    assert check_job(job) == []
    groups = {g.name: list(g.ranks) for g in job.manifest.groups}
    assert groups == {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}
    assert job.manifest.dropped["chakra: process group membership inferred from the ranks that use it"] == 2
    ag = [n for n in nodes_of(job, 2) if n.name == "ag_sub"][0]
    assert (ag.collective.in_bytes, ag.collective.out_bytes) == (16, 32)   # shard x group size
    rs = [n for n in nodes_of(job, 2) if n.name == "rs_world"][0]
    assert (rs.collective.in_bytes, rs.collective.out_bytes) == (64, 16)   # full buffer / 4
    # Ranks 0 and 1 run the same program on the same group: one shared graph.
    assert job.binding(0).graph == job.binding(1).graph
    assert job.binding(0).graph != job.binding(2).graph
    assert len(job.graph_ids()) == 2


def test_rank_option_names_a_single_file(tmp_path):
    f = write_et(tmp_path / "one.et", [
        node(1, "send", et.COMM_SEND_NODE, comm_dst=("int32_val", 3), comm_size=("int64_val", 4),
             comm_tag=("int32_val", 0)),
    ])
    # To itself (rank 3 given) the send is legal; read as rank 0 it names a rank with no file.
    job = read([f], rank=3)
    assert nodes_of(job)[0].p2p.peer == 0
    with pytest.raises(EchoError, match="comm_dst 3 names a rank with no input file"):
        read([f])


# -- refusals ------------------------------------------------------------------------------
def one_line_error(paths, match, **opts):
    with pytest.raises(EchoError) as e:
        read(paths, **opts)
    msg = str(e.value)
    assert "\n" not in msg
    assert re.search(match, msg), msg
    return msg


def test_empty_file(tmp_path):
    f = tmp_path / "e.et"
    f.write_bytes(b"")
    msg = one_line_error([f], "empty file")
    assert msg.startswith(str(f))


def test_truncated_file(tmp_path):
    f = write_et(tmp_path / "t.et", [node(1, "a", et.COMP_NODE), node(2, "b" * 50, et.COMP_NODE)])
    f.write_bytes(f.read_bytes()[:-20])
    one_line_error([f], r"t\.et: truncated message")


def test_random_bytes(tmp_path):
    f = tmp_path / "r.et"
    f.write_bytes(random.Random(7).randbytes(4096))
    one_line_error([f], r"r\.et: ")


def test_json_passed_as_et(tmp_path):
    f = tmp_path / "j.et"
    f.write_text('{"schema": "1.0.1", "nodes": []}')
    one_line_error([f], r"j\.et: this is JSON")


def test_dependency_cycle(tmp_path):
    f = write_et(tmp_path / "c.et", [node(1, "a", et.COMP_NODE, data=[3]), node(2, "b", et.COMP_NODE, data=[1]),
                                     node(3, "c", et.COMP_NODE, data=[2]), node(4, "d", et.COMP_NODE, data=[3])])
    one_line_error([f], r"c\.et: node [123] \([abc]\): data_deps form a cycle")


def test_duplicate_ids(tmp_path):
    f = write_et(tmp_path / "d.et", [node(1, "a", et.COMP_NODE), node(1, "b", et.COMP_NODE)])
    one_line_error([f], r"d\.et: node 1 \(b\): node id 1 is used twice")


def test_unknown_node_type(tmp_path):
    f = write_et(tmp_path / "u.et", [node(1, "a", et.COMP_NODE), node(2, "storage", 9)])
    one_line_error([f], r"u\.et: node 2 \(storage\): unknown Chakra node type 9")


def test_dangling_data_dep(tmp_path):
    f = write_et(tmp_path / "g.et", [node(1, "a", et.COMP_NODE, data=[42])])
    one_line_error([f], r"g\.et: node 1 \(a\): data_dep on node 42, which is not in the file")


def test_missing_rank_files_and_mixed_prefixes(tmp_path):
    a = write_et(tmp_path / "x.0.et", [node(1, "a", et.COMP_NODE)])
    c = write_et(tmp_path / "x.2.et", [node(1, "a", et.COMP_NODE)])
    one_line_error([a, c], r"ranks \[1\] are missing")
    b = write_et(tmp_path / "y.1.et", [node(1, "a", et.COMP_NODE)])
    one_line_error([a, b], "different prefixes")


# -- the pre-Oct-2023 schema ---------------------------------------------------------------
# Hand-encoded in the old layout (chakra-astrasim.md section 1.1): Node{id=1, name=2,
# type=3, parent=4 (uint64), inputs=5 (string), input_shapes=6 (string), input_types=7
# (string), ...}, AttributeProto{name=1, type=2 (enum), ...}. No protobuf class can write
# these (the current schema gives the same numbers other types), so the bytes are spelled
# out with wire tags: (field << 3) | wire type.
def _key(field: int, wire: int) -> bytes:
    return varint((field << 3) | wire)


def _ld(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + varint(len(payload)) + payload


def _vi(field: int, value: int) -> bytes:
    return _key(field, 0) + varint(value)


def old_node(node_id: int, *, with_shapes: bool = True, with_attr: bool = False) -> bytes:
    b = _vi(1, node_id) + _ld(2, b"aten::add") + _vi(3, 4) + _vi(4, 0)
    b += _ld(5, b"[[430, 431, 0, 53120, 4, 'cuda:0']]")
    if with_shapes:
        b += _ld(6, b"[[53120]]") + _ld(7, b"['Tensor(float)']")
    if with_attr:
        b += _ld(10, _ld(1, b"is_cpu_op") + _vi(2, 1) + _vi(3, 1))
    return b


def test_old_format_without_global_metadata_is_refused(tmp_path):
    f = tmp_path / "old.0.et"
    f.write_bytes(frame(old_node(1), old_node(2)))
    msg = one_line_error([f], r"old\.0\.et: first message is not a Chakra GlobalMetadata")
    assert "pre-Oct-2023" in msg


def test_old_format_nodes_after_metadata_are_refused(tmp_path):
    meta = et.GlobalMetadata(version="0.0.3").SerializeToString()
    f = tmp_path / "old.et"
    f.write_bytes(frame(meta, old_node(1), old_node(2)))
    msg = one_line_error([f], r"old\.et: node #0 \(id 1\) has field 6 with wire type 2")
    assert "pre-Oct-2023" in msg


def test_old_format_attribute_is_refused(tmp_path):
    meta = et.GlobalMetadata(version="0.0.3").SerializeToString()
    f = tmp_path / "old.et"
    f.write_bytes(frame(meta, old_node(1, with_shapes=False, with_attr=True)))
    one_line_error([f], r"old\.et: node #0 \(id 1\) has field 2 with wire type 0.*pre-Oct-2023")


def test_old_format_inputs_string_read_as_data_deps_is_refused(tmp_path):
    """The subtlest case: only fields 1-5, which all decode under the new schema; the
    string ``inputs`` turns into data_deps that read as text."""
    meta = et.GlobalMetadata(version="0.0.3").SerializeToString()
    f = tmp_path / "old.et"
    f.write_bytes(frame(meta, old_node(1, with_shapes=False)))
    # The bytes really do decode with the current schema, into nonsense.
    n = et.Node()
    n.ParseFromString(old_node(1, with_shapes=False))
    assert list(n.data_deps)[:2] == [ord("["), ord("[")]
    one_line_error([f], r"old\.et: node 1 \(aten::add\): data_deps read as text.*pre-Oct-2023")


def test_sniff(tmp_path):
    good = write_et(tmp_path / "noext", [node(1, "a", et.COMP_NODE)])
    assert chakra_conv.sniff(good)
    assert not chakra_conv.sniff(tmp_path)
    js = tmp_path / "x.json"
    js.write_text("{}")
    assert not chakra_conv.sniff(js)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01\x02garbage")
    assert not chakra_conv.sniff(junk)


def pg_init(node_id: int, groups: list[dict]) -> et.Node:
    n = node(node_id, "## process_group:init ##", et.METADATA_NODE)
    n.inputs.values = repr([json.dumps(groups)])
    return n


def test_pg_membership_from_process_group_init_metadata(tmp_path):
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": 4},
              {"pg_name": "5", "pg_desc": "even", "ranks": [0, 2], "group_size": 2},
              {"pg_name": "6", "pg_desc": "odd", "ranks": [1, 3], "group_size": 2}]
    for r in range(4):
        write_et(tmp_path / f"pt.{r}.et", [
            pg_init(1, groups),
            coll(2, "ar", comm_type=("int64_val", 0), comm_size=("int64_val", 8),
                 pg_name=("string_val", "5" if r % 2 == 0 else "6"), data=[1]),
        ])
    job = read(sorted(tmp_path.glob("*.et")))
    assert check_job(job) == []
    got = {g.name: (list(g.ranks), g.desc) for g in job.manifest.groups}
    assert got == {"0": ([0, 1, 2, 3], "default_pg"), "5": ([0, 2], "even"), "6": ([1, 3], "odd")}
    d = job.manifest.dropped
    assert d["chakra: process group membership read from process_group:init metadata"] == 2
    assert "chakra: process group membership inferred from the ranks that use it" not in d
    meta = nodes_of(job)[0]
    assert meta.attrs["chakra_type"] == "METADATA_NODE"
    assert meta.attrs["chakra_inputs_values"] == repr([json.dumps(groups)])


def test_inconsistent_pg_metadata_falls_back_to_usage(tmp_path):
    groups = [{"pg_name": "5", "ranks": [0], "group_size": 1}]   # but ranks 0 and 1 use it
    for r in range(2):
        write_et(tmp_path / f"pt.{r}.et", [
            pg_init(1, groups),
            coll(2, "ar", comm_type=("int64_val", 0), comm_size=("int64_val", 8),
                 pg_name=("string_val", "5"), data=[1]),
        ])
    job = read(sorted(tmp_path.glob("*.et")))
    assert {g.name: list(g.ranks) for g in job.manifest.groups}["5"] == [0, 1]
    assert job.manifest.dropped["chakra: process group membership inferred from the ranks that use it"] == 1


@pytest.mark.parametrize("values", ["", "[]", "['not json']", "['{\"a\": 1}']", "['[{\"pg_name\": 5}]']",
                                    "['[{\"pg_name\": \"1\", \"ranks\": [-1]}]']"])
def test_unparseable_pg_metadata_is_ignored(values):
    from echo_et.converters.chakra.reader import parse_pg_config

    assert parse_pg_config(values) == {}
