"""ASTRA-sim export: golden files, the rt_template oracle, every mapping, configs, atomicity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from test_astra_sim_support import attr_value, attrs_of, read_et, uniform_job

from conftest import shared_path
from echo_et.converters import ReadOptions, read
from echo_et.converters.astra_sim import ExportOptions, check_export, export
from echo_et.converters.astra_sim.check_configs import parse_network_yaml
from echo_et.errors import CheckError, EchoError, OptionError
from echo_et.ir import GraphBuilder, JobBuilder
from echo_et.ir.schema import pb

MICRO = "traces/astra-sim/examples/workload/microbenchmarks"
CUSTOM = "traces/astra-sim/examples/system/custom_collectives/custom_ring_allreduce_8npus_1MB"


def _rank_files(folder: Path, prefix: str) -> list[Path]:
    files = sorted(folder.glob(f"{prefix}.*.et"), key=lambda p: int(p.name.split(".")[-2]))
    assert files, f"no {prefix}.*.et in {folder}"
    return files


# -- golden files ---------------------------------------------------------------------------
@pytest.mark.parametrize("coll", ["all_reduce", "all_to_all"])
def test_microbenchmark_golden_files_are_reproduced(tmp_path, coll):
    src = shared_path(f"{MICRO}/{coll}/8npus_1MB")
    originals = _rank_files(src, coll)
    job = read([src], "chakra", ReadOptions())
    # ASTRA-sim's own all-to-all file is a native ALL_TO_ALL: the "ring" mapping keeps it.
    res = export(job, tmp_path / "out", ExportOptions(all_to_all="ring"))
    assert res["ranks"] == len(originals)
    for r, orig in enumerate(originals):
        ometa, onodes = read_et(orig)
        meta, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        assert meta.version == ometa.version
        assert len(nodes) == len(onodes)
        for a, b in zip(nodes, onodes, strict=True):
            # Ids may differ; everything else is the same message.
            assert (a.name, a.type, a.duration_micros, list(a.ctrl_deps)) == \
                (b.name, b.type, b.duration_micros, list(b.ctrl_deps))
            assert attrs_of(a) == attrs_of(b)
            assert [x.name for x in a.attr] == [x.name for x in b.attr]
    assert check_export(tmp_path / "out") == []


def test_custom_ring_allreduce_round_trips_p2p_attributes(tmp_path):
    src = shared_path(CUSTOM)
    originals = _rank_files(src, "custom_allreduce")
    job = read([src], "chakra", ReadOptions())
    export(job, tmp_path / "out")
    for r, orig in enumerate(originals):
        _, onodes = read_et(orig)
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        ours = {n.name: n for n in nodes}
        assert sorted(ours) == sorted(n.name for n in onodes)
        id_of = {n.id: n.name for n in onodes}
        our_id = {n.id: n.name for n in nodes}
        p2p = 0
        for o in onodes:
            n = ours[o.name]
            assert n.type == o.type
            if o.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
                p2p += 1
                send = o.type == et.COMM_SEND_NODE
                # The original leaves the own end implicit (ASTRA-sim defaults it to self).
                want_src = attr_value(o, "comm_src") if not send else r
                want_dst = attr_value(o, "comm_dst") if send else r
                assert attr_value(n, "comm_src") == want_src
                assert attr_value(n, "comm_dst") == want_dst
                assert attr_value(n, "comm_tag") == attr_value(o, "comm_tag")
                assert attr_value(n, "comm_size") == attr_value(o, "comm_size")
                assert attrs_of(n)["comm_size"][0] == "int64_val"
                assert attrs_of(n)["comm_tag"][0] == "int32_val"
            else:
                assert n.duration_micros == o.duration_micros
            # Every original dependency is kept (the export may add stream order).
            assert {id_of[d] for d in o.data_deps} <= {our_id[d] for d in n.data_deps}
        assert p2p == sum(o.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE) for o in onodes) > 0
    assert check_export(tmp_path / "out") == []


def test_rt_template_oracle_inputs_are_reproduced_exactly(tmp_path):
    """ASTRA-sim's tests/rt_template: 8 NPUs on a 50 GB/s, 500 ns ring, one 1 MiB all-reduce
    per rank (node id 1, "All-Reduce"); the reference run prints 117780 cycles per rank.
    Our files must be byte-identical to what its gen_chakra_traces.py writes."""
    from chakra.src.third_party.utils.protolib import encodeMessage

    jb = JobBuilder("rt_template", 8)
    world = jb.group(list(range(8)), name="0", role="world")
    for r in range(8):
        gb = GraphBuilder(f"g{r}")
        s = gb.stream(pb.STREAM_GPU_COMM, "comm", device=0)
        gb.collective("All-Reduce", s, coll_type=pb.COLL_ALL_REDUCE, group="0",
                      in_bytes=1_048_576, node_id=1)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"0": world})
    out = tmp_path / "out"
    export(jb.build(), out, ExportOptions(topology="Ring", intra_bw=50, latency=500))
    for npu_id in range(8):
        oracle = tmp_path / f"chakra_trace.{npu_id}.et"
        with open(oracle, "wb") as f:  # as tests/rt_template/inputs/workload/gen_chakra_traces.py
            encodeMessage(f, et.GlobalMetadata(version="0.0.4"))
            node = et.Node()
            node.id = 1
            node.name = "All-Reduce"
            node.type = et.COMM_COLL_NODE
            node.attr.append(et.AttributeProto(name="is_cpu_op", bool_val=False))
            node.attr.append(et.AttributeProto(name="comm_type", int64_val=et.ALL_REDUCE))
            node.attr.append(et.AttributeProto(name="comm_size", int64_val=1_048_576))
            encodeMessage(f, node)
        assert (out / f"workload.{npu_id}.et").read_bytes() == oracle.read_bytes()
    net = parse_network_yaml((out / "network.yml").read_text())
    assert net == {"topology": ["Ring"], "npus_count": ["8"], "bandwidth": ["50.0"],
                   "latency": ["500.0"]}
    system = json.loads((out / "system.json").read_text())
    assert system["scheduling-policy"] == "LIFO"
    assert system["endpoint-delay"] == 10
    assert system["active-chunks-per-dimension"] == 1
    assert system["preferred-dataset-splits"] == 4
    assert system["collective-optimization"] == "localBWAware"
    for k in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        assert system[f"{k}-implementation"] == ["ring"]
    assert json.loads((out / "remote_memory.json").read_text()) == {"memory-type": "NO_MEMORY_EXPANSION"}


# -- mappings -----------------------------------------------------------------------------------
def _host_and_kernels(gb, r, s):
    """Host thread launches K1 on the compute stream, synchronizes on it, then launches K2
    on the copy stream and a memset; an unknown-library comm kernel runs on the comm stream."""
    op = gb.cpu_op("aten::mm", s["cpu"], start_ns=0, duration_ns=50_000)
    l1 = gb.cpu_op("cudaLaunchKernel", s["cpu"], kind=pb.KIND_LAUNCH, start_ns=1_000,
                   duration_ns=4_000, deps=[(op.id, pb.DEP_CONTROL)])
    k1 = gb.compute("gemm", s["compute"], start_ns=6_000, duration_ns=12_345,
                    deps=[(l1.id, pb.DEP_LAUNCH)], flops=2e9, bytes_=4096)
    gb.cpu_op("cudaStreamSynchronize", s["cpu"], kind=pb.KIND_SYNC, start_ns=6_000,
              duration_ns=13_000, deps=[(k1.id, pb.DEP_SYNC)])
    l2 = gb.cpu_op("cudaMemcpyAsync", s["cpu"], kind=pb.KIND_LAUNCH, start_ns=20_000, duration_ns=2_000)
    gb.memcpy("Memcpy DtoH", s["copy"], nbytes=1 << 20, direction="DtoH", start_ns=23_000,
              duration_ns=300, deps=[(l2.id, pb.DEP_LAUNCH)])
    gb.memcpy("Memset", s["compute"], nbytes=64, direction="memset", kind=pb.KIND_MEMSET,
              start_ns=24_000, duration_ns=2_600)
    gb.node(pb.KIND_COMM_UNKNOWN, "hcclAllReduce_kernel", s["comm"], start_ns=30_000,
            duration_ns=7_499)


def test_host_time_becomes_cpu_nodes_and_every_node_starts_at_its_measured_time(tmp_path):
    job = uniform_job(2, _host_and_kernels)
    res = export(job, tmp_path / "out")
    _, nodes = read_et(tmp_path / "out" / "workload.0.et")
    got = [(n.name, n.duration_micros, attr_value(n, "is_cpu_op")) for n in nodes]
    # Host lane: 0-6 µs, the sync's wait (6-18.345 µs) as a join on the GEMM, 18-23, 23-50.
    # GPU lane: the GEMM at its measured 6 µs (the launch latency stays host time), the copy
    # at 23, its idle gap before the memset added to it, the memset and the gap to the
    # unknown-library kernel, which ends at 37.499 µs.
    assert got == [("host", 6, True), ("gemm", 12, False), ("host waits", 0, True), ("host", 5, True),
                   ("Memcpy DtoH", 1, False), ("host", 27, True), ("Memset", 6, False),
                   ("hcclAllReduce_kernel", 7, False)]
    by = {(n.name, n.duration_micros): n for n in nodes}
    host1, gemm, join = by[("host", 6)], by[("gemm", 12)], by[("host waits", 0)]
    host2, copy, host3 = by[("host", 5)], by[("Memcpy DtoH", 1)], by[("host", 27)]
    memset, hccl = by[("Memset", 6)], by[("hcclAllReduce_kernel", 7)]
    assert list(gemm.data_deps) == [host1.id]                  # the host reached its start
    assert sorted(join.data_deps) == [host1.id, gemm.id]       # the sync waits for the GEMM
    assert list(host2.data_deps) == [join.id]
    assert sorted(copy.data_deps) == [gemm.id, host2.id]       # GPU lane order + launch
    assert list(host3.data_deps) == [host2.id]
    assert sorted(memset.data_deps) == [gemm.id, copy.id]     # stream order + lane order
    assert list(hccl.data_deps) == [memset.id]
    assert attr_value(gemm, "num_ops") == 2_000_000_000       # roofline inputs kept when known
    assert attr_value(gemm, "tensor_size") == 4096
    assert all(n.ctrl_deps == [] for n in nodes)
    assert res["mapped"] == {
        "comm_unknown->COMP_NODE": 2, "compute->COMP_NODE": 2, "host time->COMP_NODE(cpu)": 6,
        "host wait (join)->COMP_NODE(cpu)": 2, "memcpy->COMP_NODE": 2, "memset->COMP_NODE": 2,
    }
    assert res["merged"] == {"cpu_op (into host segments)": 2, "launch (into host segments)": 4,
                             "sync (into host segments)": 2}
    t = res["time"]
    assert (t["host_waits_elastic"], t["host_wait_ns_elastic"]) == (2, 2 * 12_345)
    assert t["gpu_gaps_added_ns"] == 2 * (700 + 3_400)
    assert t["lost_busy_ns"] == 0 and t["ranks_losing_over_1pct"] == []
    assert check_export(tmp_path / "out") == []


def test_the_export_view_replays_to_the_measured_step(tmp_path):
    from echo_et.converters.astra_sim import ExportPlan
    from echo_et.sim import simulate

    job = uniform_job(2, _host_and_kernels)
    view = ExportPlan(job).view()
    assert simulate(view).step_time_ns == simulate(job).step_time_ns == 50_000


def test_overlapping_kernels_of_two_streams_are_clipped_to_one_gpu_lane(tmp_path):
    def build(gb, r, s):
        a = gb.compute("a", s["compute"], start_ns=0, duration_ns=10_000)
        gb.compute("b", s["copy"], start_ns=4_000, duration_ns=10_000)      # overlaps a by 6 µs
        gb.compute("c", s["copy"], start_ns=15_000, duration_ns=2_000)
        gb.compute("inside", s["comm"], start_ns=15_500, duration_ns=1_000)  # within c
        gb.compute("d", s["compute"], start_ns=20_000, duration_ns=1_000, deps=[a.id])

    res = export(uniform_job(2, build), tmp_path / "out")
    _, nodes = read_et(tmp_path / "out" / "workload.1.et")
    assert [(n.name, n.duration_micros) for n in nodes] == [("a", 10), ("b", 5), ("c", 5), ("d", 1)]
    assert res["merged"] == {"compute (covered by a concurrent kernel)": 2}
    assert res["time"]["gpu_clipped_ns"] == 2 * (6_000 + 1_000)
    for prev, n in zip(nodes, nodes[1:], strict=False):
        assert prev.id in n.data_deps                          # one GPU node at a time


def test_cpu_only_graph_exports_host_operators_as_compute(tmp_path):
    def build(gb, r, s):
        fwd = gb.cpu_op("forward", s["cpu"], start_ns=0, duration_ns=40_000)
        issue = gb.cpu_op("issue:all_reduce", s["cpu"], start_ns=40_000, duration_ns=2_000,
                          deps=[(fwd.id, pb.DEP_CONTROL)])
        ar = gb.collective("all_reduce", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world",
                           in_bytes=4096, start_ns=42_000, duration_ns=0, deps=[(issue.id, pb.DEP_DATA)])
        gb.cpu_op("wait:all_reduce", s["cpu"], kind=pb.KIND_SYNC, start_ns=43_000, duration_ns=5_000,
                  deps=[(ar.id, pb.DEP_SYNC)])

    res = export(uniform_job(2, build), tmp_path / "out")
    _, nodes = read_et(tmp_path / "out" / "workload.0.et")
    comp = [n for n in nodes if n.type == et.COMP_NODE]
    # No GPU work: the host operators are the compute, written as GPU compute nodes.
    assert sum(n.duration_micros for n in comp) == 48
    assert all(attr_value(n, "is_cpu_op") is False for n in nodes)
    coll = next(n for n in nodes if n.type == et.COMM_COLL_NODE)
    before = {n.id for n in comp if n.start_time_micros + n.duration_micros <= 42}
    assert set(coll.data_deps) <= before and coll.data_deps
    assert res["mapped"]["host compute->COMP_NODE"] >= 2


def test_concurrent_communication_is_serialised_and_counted(tmp_path):
    # Two groups of the same ranks (e.g. NCCL communicators on two streams).
    def build(gb, r, s):
        gb.collective("x", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="a", in_bytes=4096,
                      start_ns=0, duration_ns=10_000)
        gb.collective("y", s["copy"], coll_type=pb.COLL_ALL_REDUCE, group="b", in_bytes=4096,
                      start_ns=2_000, duration_ns=10_000)

    res = export(uniform_job(2, build, groups={"a": [[0, 1]], "b": [[0, 1]]}), tmp_path / "out")
    _, (x, y) = read_et(tmp_path / "out" / "workload.0.et")
    assert x.id in y.data_deps
    assert (res["time"]["comm_serialised"], res["time"]["comm_serialised_ns"]) == (2, 2 * 8_000)
    assert res["time"]["comm_merged"] == 0


def _two_buckets(overlap_on: set[int]):
    """Two all-reduces of one group on two threads (gloo's workers), concurrent on the
    ranks in ``overlap_on``, one after the other elsewhere."""
    def build(gb, r, s):
        t2 = gb.stream(pb.STREAM_CPU_THREAD, "gloo worker 2")
        gb.collective("bucket0", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=4096,
                      start_ns=0, duration_ns=10_000)
        gb.collective("bucket1", t2, coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=1024,
                      start_ns=2_000 if r in overlap_on else 10_000, duration_ns=9_000)
    return build


def test_concurrent_collectives_of_one_group_become_one_of_the_summed_bytes(tmp_path):
    # ASTRA-sim runs one communication node at a time; gloo ran the two buckets at once:
    # they become one all-reduce of 5120 B, lasting from the first start to the last end.
    res = export(uniform_job(2, _two_buckets({0, 1})), tmp_path / "out")
    for r in (0, 1):
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        colls = [n for n in nodes if n.type == et.COMM_COLL_NODE]
        assert [(n.name, attr_value(n, "comm_size")) for n in colls] == [("bucket0", 5120)]
    assert res["merged"] == {"all_reduce (concurrent with the previous one of its group: one collective of "
                             "the summed bytes)": 2}
    assert (res["time"]["comm_merged"], res["time"]["comm_merged_ns"]) == (2, 2 * 8_000)
    assert res["time"]["comm_serialised"] == 0
    assert check_export(tmp_path / "out") == []


def test_collectives_are_merged_only_where_every_member_ran_them_concurrently(tmp_path):
    # Rank 1 ran the buckets one after the other: merging on rank 0 alone would give the
    # group two different collective sequences (ASTRA-sim would hang), so nobody merges.
    res = export(uniform_job(2, _two_buckets({0})), tmp_path / "out")
    for r in (0, 1):
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        assert [attr_value(n, "comm_size") for n in nodes if n.type == et.COMM_COLL_NODE] == [4096, 1024]
    assert res["time"]["comm_merged"] == 0 and res["time"]["comm_serialised"] == 1


def test_ranks_keep_their_measured_start_offsets(tmp_path):
    def build(gb, r, s):
        gb.compute("k", s["compute"], start_ns=0, duration_ns=5_000)
        gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=4096,
                      start_ns=5_000, duration_ns=1_000)

    job = uniform_job(3, build)
    for r, off in enumerate([0, 7_400, 2_600]):
        job.manifest.bindings[r].clock_offset_ns = off
    res = export(job, tmp_path / "out")
    assert res["start_offsets_us"] == {"1": 7, "2": 3}
    assert json.loads((tmp_path / "out" / "start_offsets.json").read_text()) == {"start_offset_us": [0, 7, 3]}
    _, nodes = read_et(tmp_path / "out" / "workload.1.et")
    assert (nodes[0].name, nodes[0].duration_micros) == ("start (rank offset)", 7)
    assert nodes[0].id in nodes[1].data_deps
    res = export(job, tmp_path / "aligned", ExportOptions(align_start=True))
    assert res["start_offsets_us"] == {}
    _, nodes = read_et(tmp_path / "aligned" / "workload.1.et")
    assert [n.name for n in nodes] == ["k", "ar"]


def _rooted(gb, r, s):
    kw = {"group": "world"}
    gb.collective("bcast", s["comm"], coll_type=pb.COLL_BROADCAST, in_bytes=1000, root=0, **kw)
    gb.collective("reduce", s["comm"], coll_type=pb.COLL_REDUCE, in_bytes=4096, root=0, **kw)
    gb.collective("gather", s["comm"], coll_type=pb.COLL_GATHER, in_bytes=256,
                  out_bytes=1024 if r == 0 else 0, root=0, **kw)
    gb.collective("scatter", s["comm"], coll_type=pb.COLL_SCATTER, in_bytes=1024 if r == 0 else 0,
                  out_bytes=256, root=0, **kw)
    gb.collective("barrier", s["comm"], coll_type=pb.COLL_BARRIER, in_bytes=0, **kw)
    gb.collective("tiny", s["comm"], coll_type=pb.COLL_ALL_GATHER, in_bytes=2, **kw)


def test_unsupported_collectives_map_to_networked_ones(tmp_path):
    res = export(uniform_job(4, _rooted), tmp_path / "out")
    for r in range(4):
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        got = [(n.name, attr_value(n, "comm_type"), attr_value(n, "comm_size")) for n in nodes]
        assert got == [
            ("bcast", et.ALL_GATHER, 250),        # ceil(1000 / 4)
            ("reduce", et.REDUCE_SCATTER, 4096),
            ("gather", et.ALL_GATHER, 256),
            ("scatter", et.ALL_GATHER, 256),
            ("barrier", et.ALL_REDUCE, 8),
            ("tiny", et.ALL_GATHER, 4),           # raised to preferred-dataset-splits
        ]
        # Collectives of one group are chained in issue order.
        for a, b in zip(nodes, nodes[1:], strict=False):
            assert a.id in b.data_deps
    assert res["mapped"]["broadcast->ALL_GATHER"] == 4
    assert res["mapped"]["barrier->ALL_REDUCE"] == 4
    assert res["mapped"]["comm_size->raised to 4 B"] == 4
    assert check_export(tmp_path / "out") == []


def test_subgroups_get_pg_names_and_a_comm_group_file(tmp_path):
    def build(gb, r, s):
        gb.collective("ar_world", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=4096)
        gb.collective("ag_dp", s["comm"], coll_type=pb.COLL_ALL_GATHER, group="dp", in_bytes=512)
        gb.collective("solo", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="self", in_bytes=64)

    job = uniform_job(4, build, groups={"world": [[0, 1, 2, 3]], "dp": [[0, 2], [1, 3]],
                                        "self": [[0], [1], [2], [3]]})
    res = export(job, tmp_path / "out")
    groups = json.loads((tmp_path / "out" / "comm_group.json").read_text())
    ids = {g.id: list(g.ranks) for g in job.manifest.groups if g.name[:2] in ("dp", "wo")}
    # With smaller groups in use, the world is an explicit group too (ASTRA-sim's implicit
    # world is numbered by a counter the smaller groups advance).
    assert groups == {str(k): v for k, v in ids.items()}
    world_id = next(str(g.id) for g in job.manifest.groups if g.name.startswith("world"))
    for r in range(4):
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        assert [n.name for n in nodes] == ["ar_world", "ag_dp"]   # one-rank group folded
        assert attr_value(nodes[0], "pg_name") == world_id
        pg = attr_value(nodes[1], "pg_name")
        assert r in groups[pg]
    assert res["dropped"]["all_reduce(one-rank group)"] == 4
    assert "--comm-group-configuration=comm_group.json" in (tmp_path / "out" / "run.sh").read_text()


def test_p2p_peers_become_global_ranks(tmp_path):
    def build(gb, r, s):
        # pp group [r, partner]: group rank 0 sends to group rank 1.
        me = 0 if r < 2 else 1
        gb.p2p(me == 0, "act", s["comm"], group="pp", peer=1 - me, nbytes=3000, tag=7)

    job = uniform_job(4, build, groups={"pp": [[0, 2], [1, 3]]})
    export(job, tmp_path / "out")
    for r, (kind, src, dst) in enumerate([(et.COMM_SEND_NODE, 0, 2), (et.COMM_SEND_NODE, 1, 3),
                                         (et.COMM_RECV_NODE, 0, 2), (et.COMM_RECV_NODE, 1, 3)]):
        _, (n,) = read_et(tmp_path / "out" / f"workload.{r}.et")
        assert n.type == kind
        assert (attr_value(n, "comm_src"), attr_value(n, "comm_dst")) == (src, dst)
        assert (attr_value(n, "comm_tag"), attr_value(n, "comm_size")) == (7, 3000)


def _sends(folder: Path, rank: int) -> dict[int, int]:
    _, nodes = read_et(folder / f"workload.{rank}.et")
    return {attr_value(n, "comm_dst"): attr_value(n, "comm_size")
            for n in nodes if n.type == et.COMM_SEND_NODE}


def test_uneven_all_to_all_with_known_splits_becomes_exact_send_recv(tmp_path):
    splits = {0: [0, 10, 20], 1: [30, 0, 40], 2: [50, 60, 0]}

    def build(gb, r, s):
        n = gb.collective("a2a", s["comm"], coll_type=pb.COLL_ALL_TO_ALL, group="world",
                          in_bytes=sum(splits[r]), out_bytes=sum(splits[x][r] for x in range(3)))
        n.attrs["in_split_bytes"] = ",".join(map(str, splits[r]))
        gb.compute("after", s["compute"], duration_ns=1000, deps=[n.id])

    res = export(uniform_job(3, build), tmp_path / "out")
    out = tmp_path / "out"
    for r in range(3):
        assert _sends(out, r) == {j: splits[r][j] for j in range(3) if j != r}
        _, nodes = read_et(out / f"workload.{r}.et")
        recvs = {attr_value(n, "comm_src"): attr_value(n, "comm_size")
                 for n in nodes if n.type == et.COMM_RECV_NODE}
        assert recvs == {j: splits[j][r] for j in range(3) if j != r}
        after = next(n for n in nodes if n.name == "after")
        comm_ids = {n.id for n in nodes if n.type != et.COMP_NODE}
        assert comm_ids <= set(after.data_deps)   # waits for the whole exchange
    assert res["mapped"]["all_to_all(uneven, in_split_bytes)->COMM_SEND_NODE/COMM_RECV_NODE per peer"] == 3
    assert check_export(out) == []


def test_uneven_all_to_all_without_splits_uses_proportional_rule(tmp_path):
    # Every rank sends 12 B; ranks receive 6, 12 and 18 B: each row is split 1:2:3.
    outs = [6, 12, 18]

    def build(gb, r, s):
        gb.collective("a2a", s["comm"], coll_type=pb.COLL_ALL_TO_ALL, group="world",
                      in_bytes=12, out_bytes=outs[r])

    export(uniform_job(3, build), tmp_path / "out")
    for r in range(3):
        assert _sends(tmp_path / "out", r) == {j: 2 * (j + 1) for j in range(3) if j != r}


def test_even_all_to_all_becomes_send_recv_per_peer(tmp_path):
    # NCCL runs all-to-all as grouped send/recv: each rank sends 1/N of its input to every
    # other rank. ASTRA-sim runs one send at a time per rank, so the exchange costs
    # (N-1)/N of the bytes, as NCCL's does (its ring ALL_TO_ALL moves (N-1)/2).
    def build(gb, r, s):
        n = gb.collective("a2a", s["comm"], coll_type=pb.COLL_ALL_TO_ALL, group="world", in_bytes=4096)
        gb.compute("after", s["compute"], duration_ns=1000, deps=[n.id])

    res = export(uniform_job(4, build), tmp_path / "out")
    out = tmp_path / "out"
    for r in range(4):
        assert _sends(out, r) == {j: 1024 for j in range(4) if j != r}
        _, nodes = read_et(out / f"workload.{r}.et")
        assert not [n for n in nodes if n.type == et.COMM_COLL_NODE]
        recvs = {attr_value(n, "comm_src"): attr_value(n, "comm_size") for n in nodes if n.type == et.COMM_RECV_NODE}
        assert recvs == {j: 1024 for j in range(4) if j != r}
        # Sends go round the ring from the next rank on, so every step pairs distinct ranks.
        assert [attr_value(n, "comm_dst") for n in nodes if n.type == et.COMM_SEND_NODE] == \
            [(r + k) % 4 for k in (1, 2, 3)]
        after = next(n for n in nodes if n.name == "after")
        assert {n.id for n in nodes if n.type != et.COMP_NODE} <= set(after.data_deps)
    assert res["mapped"]["all_to_all(even)->COMM_SEND_NODE/COMM_RECV_NODE per peer"] == 4
    assert check_export(out) == []


def test_even_all_to_all_stays_a_collective_with_the_ring_mapping(tmp_path):
    def build(gb, r, s):
        gb.collective("a2a", s["comm"], coll_type=pb.COLL_ALL_TO_ALL, group="world", in_bytes=4096)

    res = export(uniform_job(4, build), tmp_path / "out", ExportOptions(all_to_all="ring"))
    _, (n,) = read_et(tmp_path / "out" / "workload.2.et")
    assert (n.type, attr_value(n, "comm_type"), attr_value(n, "comm_size")) == \
        (et.COMM_COLL_NODE, et.ALL_TO_ALL, 4096)
    assert res["mapped"] == {"all_to_all(even)->ALL_TO_ALL": 4}


def test_unknown_all_to_all_mapping_is_an_option_error(tmp_path):
    job = uniform_job(2, lambda gb, r, s: gb.compute("k", s["compute"], duration_ns=1000))
    with pytest.raises(OptionError, match="all-to-all mapping 'direct'"):
        export(job, tmp_path / "out", ExportOptions(all_to_all="direct"))
    assert not (tmp_path / "out").exists()


def test_single_rank_job_gets_an_idle_partner(tmp_path):
    res = export(uniform_job(1, lambda gb, r, s: gb.compute("k", s["compute"], duration_ns=5000)),
                 tmp_path / "out")
    assert res["ranks"] == 2 and res["job_ranks"] == 1
    _, nodes = read_et(tmp_path / "out" / "workload.1.et")
    assert len(nodes) == 1 and nodes[0].type == et.COMP_NODE
    assert check_export(tmp_path / "out") == []


def test_wire_encoding_is_canonical_protobuf(tmp_path):
    """The fast path appends pre-serialised attributes; the result must equal protobuf's own
    serialisation of the decoded node."""
    def build(gb, r, s):
        gb.compute("k", s["compute"], duration_ns=5000)
        gb.collective("ag", s["comm"], coll_type=pb.COLL_ALL_GATHER, group="dp", in_bytes=512)
        gb.p2p(r % 2 == 0, "x", s["comm"], group="dp", peer=1 - (r % 2), nbytes=64)

    export(uniform_job(4, build, groups={"dp": [[0, 1], [2, 3]]}), tmp_path / "out")
    from echo_et.ir.io import iter_delimited

    for r in range(4):
        with open(tmp_path / "out" / f"workload.{r}.et", "rb") as f:
            msgs = list(iter_delimited(f))
        for data in msgs[1:]:
            assert et.Node.FromString(data).SerializeToString(deterministic=True) == data


# -- refusals and atomicity ----------------------------------------------------------------------
def test_unmappable_node_kind_is_an_error_naming_the_node(tmp_path):
    job = uniform_job(2, lambda gb, r, s: gb.node(pb.KIND_UNKNOWN, "mystery_op", s["compute"]))
    with pytest.raises(EchoError, match=r"graph g0: node 1 \(mystery_op\): node kind unknown"):
        export(job, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


def test_unknown_collective_type_is_an_error_naming_the_node(tmp_path):
    job = uniform_job(2, lambda gb, r, s: gb.collective("weird", s["comm"], coll_type=pb.COLL_UNKNOWN,
                                                       group="world", in_bytes=8))
    with pytest.raises(EchoError, match=r"node 1 \(weird\): collective type unknown"):
        export(job, tmp_path / "out")


def test_job_failing_check_is_refused_with_the_checker_message(tmp_path):
    job = uniform_job(2, lambda gb, r, s: gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE,
                                                       group="world", in_bytes=100 + r))
    with pytest.raises(CheckError, match=r"job fails check: .*\[collective-sequence\]"):
        export(job, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_folder_that_is_not_an_export(tmp_path):
    dest = tmp_path / "precious"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    job = uniform_job(2, lambda gb, r, s: gb.compute("k", s["compute"], duration_ns=1000))
    with pytest.raises(EchoError, match="not an ASTRA-sim export"):
        export(job, dest)
    assert (dest / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]


def test_rerun_is_byte_identical_and_replaces_a_previous_export(tmp_path):
    job = uniform_job(4, _rooted)
    export(job, tmp_path / "a")
    export(job, tmp_path / "b")
    export(job, tmp_path / "b")   # replacing an earlier export is allowed
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# -- configuration --------------------------------------------------------------------------------
def _compute_only(world: int):
    return uniform_job(world, lambda gb, r, s: gb.compute("k", s["compute"], duration_ns=1000))


def test_network_defaults_and_options(tmp_path):
    export(_compute_only(4), tmp_path / "one")
    assert parse_network_yaml((tmp_path / "one" / "network.yml").read_text()) == {
        "topology": ["Switch"], "npus_count": ["4"], "bandwidth": ["400.0"], "latency": ["936.25"]}
    job = _compute_only(16)
    export(job, tmp_path / "two", ExportOptions(gpus_per_node=4, intra_bw=300, inter_bw=25,
                                                latency=700, topology="Ring,Switch"))
    assert parse_network_yaml((tmp_path / "two" / "network.yml").read_text()) == {
        "topology": ["Ring", "Switch"], "npus_count": ["4", "4"], "bandwidth": ["300.0", "25.0"],
        "latency": ["700.0", "700.0"]}
    system = json.loads((tmp_path / "two" / "system.json").read_text())
    assert system["all-reduce-implementation"] == ["ring", "ring"]
    # The Job's own hardware is the next default.
    job.manifest.hardware.gpus_per_node = 8
    job.manifest.hardware.intra_node_bw_gbps = 150
    job.manifest.hardware.inter_node_bw_gbps = 12.5
    export(job, tmp_path / "hw")
    assert parse_network_yaml((tmp_path / "hw" / "network.yml").read_text())["bandwidth"] == \
        ["150.0", "12.5"]


@pytest.mark.parametrize(("opts", "option", "message"), [
    (ExportOptions(gpus_per_node=3), "gpus_per_node", "not a multiple of 3 GPUs per node"),
    (ExportOptions(topology="Torus"), "topology", "not one of Ring, FullyConnected, Switch"),
    (ExportOptions(topology="Ring,Ring,Ring", gpus_per_node=4), "topology", "names 3 dimensions, the network has 2"),
    (ExportOptions(intra_bw=-1), "intra_bw", "intra-node bandwidth -1 GB/s is below 1 bit/s"),
    (ExportOptions(inter_bw=1e-300), "inter_bw", "inter-node bandwidth 1e-300 GB/s is below 1 bit/s"),
    (ExportOptions(intra_bw=1e30), "intra_bw", "faster than any link that exists"),
    (ExportOptions(latency=-5), "latency", "latency = -5 ns: must not be negative"),
    (ExportOptions(latency=5e-324), "latency", "below 1 ns"),
    (ExportOptions(host_time="drop"), "host_time", "use keep or fold"),
])
def test_bad_network_options_are_refused(tmp_path, opts, option, message):
    # The library speaks of values and names its option; the CLI maps it to its flag.
    with pytest.raises(OptionError, match=message) as e:
        export(_compute_only(16), tmp_path / "out", opts)
    assert e.value.option == option
    assert list(tmp_path.iterdir()) == []


def test_run_script_is_the_exact_command(tmp_path):
    res = export(_compute_only(4), tmp_path / "nonempty_dir")
    run = (tmp_path / "nonempty_dir" / "run.sh").read_text()
    assert run.startswith("#!/bin/sh\n")
    assert '"$ASTRA_SIM_BIN" \\\n  --workload-configuration=workload \\\n' in run
    for flag in ("--system-configuration=system.json", "--network-configuration=network.yml",
                 "--remote-memory-configuration=remote_memory.json", "--logging-folder=log"):
        assert flag in run
    # No groups: no comm-group flag (and never a path containing "empty").
    assert "--comm-group-configuration" not in run
    assert 'cd "$(dirname "$0")"' in run
    assert "-ne 4 ]" in run   # all 4 ranks must print their finished line
    assert (tmp_path / "nonempty_dir" / "run.sh").stat().st_mode & 0o111
    assert res["workload_prefix"] == str(tmp_path / "nonempty_dir" / "workload")
    assert res["files"][:4] == [f"workload.{r}.et" for r in range(4)]


def test_a_wait_is_elastic_only_where_no_other_host_thread_works(tmp_path):
    from echo_et.converters.astra_sim import ExportPlan
    from echo_et.sim import simulate

    def build(gb, r, s):
        t2 = gb.stream(pb.STREAM_CPU_THREAD, "thread 2")
        launch = gb.cpu_op("cudaLaunchKernel", s["cpu"], kind=pb.KIND_LAUNCH, start_ns=0, duration_ns=1_000)
        k = gb.compute("k", s["compute"], start_ns=1_000, duration_ns=20_000, deps=[(launch.id, pb.DEP_LAUNCH)])
        gb.cpu_op("cudaStreamSynchronize", s["cpu"], kind=pb.KIND_SYNC, start_ns=2_000, duration_ns=20_000,
                  deps=[(k.id, pb.DEP_SYNC)])
        # Another thread works from 5 to 9 µs, inside the wait (2 to 21 µs).
        gb.cpu_op("other thread", t2, start_ns=5_000, duration_ns=4_000)

    job = uniform_job(2, build)
    res = export(job, tmp_path / "out")
    # Only 9 to 21 µs of the wait is cut out (the other thread's boundaries stay host time).
    assert res["time"]["host_wait_ns_elastic"] == 2 * 12_000
    assert simulate(ExportPlan(job).view()).step_time_ns == simulate(job).step_time_ns == 22_000
