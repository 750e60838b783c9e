"""How Kineto events become nodes and dependencies, on small traces written here event by
event (so each expectation follows from the events listed in the test)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from echo_et.converters import ReadOptions, read
from echo_et.errors import EchoError
from echo_et.ir import check_job, pb

TID = 10
PID = 1


def cpu(name, ts, dur, cat="cpu_op", tid=TID, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def rt(name, ts, dur, corr, tid=TID):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
            "dur": dur, "args": {"correlation": corr, "cbid": 1}}


def gpu(name, ts, dur, corr, stream, cat="kernel", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


NCCL_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_SR = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def base_events() -> list[dict]:
    return [
        cpu("ProfilerStep#1", 100, 500, cat="user_annotation", **{"Ev Idx": 0}),
        cpu("early_op", 50, 10, **{"Ev Idx": 1}),                    # before the step
        cpu("aten::linear", 110, 90, **{"Ev Idx": 2, "Input Dims": [[8, 16], [32, 16]],
                                        "Input type": ["float", "float"]}),
        cpu("aten::addmm", 120, 70, **{"Ev Idx": 3}),
        rt("cudaLaunchKernel", 130, 5, 1),
        gpu("void gemm_kernel<float>(float*)", 140, 20, 1, 7),
        rt("cudaMemcpyAsync", 205, 3, 2),
        gpu("Memcpy HtoD (Pinned -> Device)", 210, 2, 2, 22, cat="gpu_memcpy", bytes=1024),
        rt("cudaEventRecord", 215, 1, 3),
        rt("cudaLaunchKernel", 217, 1, 11),
        gpu("void other_kernel(float*)", 219, 3, 11, 21),
        rt("cudaEventRecord", 218, 1, 12),
        cpu("c10d::allreduce_", 220, 40, **{"Ev Idx": 4}),
        cpu("record_param_comms", 222, 36, **{
            "Ev Idx": 5, "Collective name": "allreduce", "In msg nelems": 100,
            "Out msg nelems": 100, "dtype": "Float", "Group size": 2,
            "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "Process Group Description": "default_pg"}),
        rt("cudaStreamWaitEvent", 224, 1, 4),
        rt("cudaLaunchKernel", 226, 4, 5),
        gpu(NCCL_AR, 235, 65, 5, 20),
        rt("cudaGetDevice", 300, 1, 13),
        rt("cudaStreamSynchronize", 310, 90, 6),
        rt("cudaLaunchKernel", 410, 2, 7),
        gpu("void cross_device_reduce_1stage<float, 2>(float*)", 415, 15, 7, 7),
        gpu("orphan_kernel", 450, 10, 99, 7),                        # no launch recorded
        cpu("c10d::alltoall_base_", 470, 50, **{
            "Ev Idx": 6, "Input Dims": [[32], [64], [], [], [], []],
            "Input type": ["float", "float", "", "", "", "Scalar"]}),
        cpu("nccl:all_to_all", 471, 48, cat="user_annotation", **{
            "Ev Idx": 7, "Input Dims": [[64]], "Input type": ["float"]}),
        rt("cudaLaunchKernel", 475, 1, 9),
        rt("cudaLaunchKernel", 480, 1, 10),
        gpu(NCCL_SR, 490, 5, 9, 20),
        gpu(NCCL_SR, 496, 4, 10, 20),
        rt("cudaDeviceSynchronize", 560, 30, 14),
        rt("cudaLaunchKernel", 650, 2, 8),                            # after the step
        gpu("late_kernel", 655, 5, 8, 7),
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": 0, "dur": 1000},
        {"ph": "f", "id": 1, "pid": PID, "tid": TID, "ts": 130, "cat": "ac2g", "name": "ac2g"},
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": TID, "args": {"name": "main"}},
    ]


def write(tmp_path: Path, evs: list[dict], name="rank0.json", **dist) -> Path:
    info = {"backend": "nccl", "rank": 0, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]}
    info.update(dist)
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": info,
                             "deviceProperties": [{"id": 0, "name": "Test GPU"}],
                             "traceEvents": evs}))
    return p


def convert(path: Path, **kw):
    job = read([path], "kineto", ReadOptions(**kw))
    assert check_job(job) == []
    return job


def by_name(graph, name, kind=None) -> pb.Node:
    (n,) = [n for n in graph.nodes if n.name == name and (kind is None or n.kind == kind)]
    return n


def deps(n, kind) -> list[int]:
    return [d.id for d in n.deps if d.kind == kind]


def test_nodes_nesting_launches_and_window(tmp_path):
    job = convert(write(tmp_path, base_events()))
    g = job.graph_of(0)
    names = [n.name for n in g.nodes]
    assert "early_op" not in names and "late_kernel" not in names
    assert "cudaGetDevice" not in names and "cudaEventRecord" not in names
    linear, addmm = by_name(g, "aten::linear"), by_name(g, "aten::addmm")
    step = by_name(g, "ProfilerStep#1")
    assert deps(linear, pb.DEP_CONTROL) == [step.id] and deps(addmm, pb.DEP_CONTROL) == [linear.id]
    launch = by_name(g, "cudaLaunchKernel") if names.count("cudaLaunchKernel") == 1 else \
        next(n for n in g.nodes if n.name == "cudaLaunchKernel" and deps(n, pb.DEP_CONTROL) == [addmm.id])
    assert launch.kind == pb.KIND_LAUNCH and launch.cpu.correlation == 1
    gemm = by_name(g, "void gemm_kernel<float>(float*)")
    assert gemm.kind == pb.KIND_COMPUTE and deps(gemm, pb.DEP_LAUNCH) == [launch.id]
    assert gemm.compute.kernel_class == pb.KC_GEMM
    assert linear.cpu.rf_id == 2 and linear.attrs["rf_id_source"] == "ev_idx"
    assert json.loads(linear.cpu.shapes) == [[8, 16], [32, 16]]
    assert json.loads(linear.cpu.dtypes) == ["float", "float"]
    # times: ns on the rank's clock, 0 at the step start
    assert (step.start_ns, step.duration_ns) == (0, 500_000)
    assert (gemm.start_ns, gemm.duration_ns) == (40_000, 20_000)
    assert job.binding(0).measured_step_ns == 500_000 and job.manifest.step == 1
    memcpy = by_name(g, "Memcpy HtoD (Pinned -> Device)")
    assert (memcpy.kind, memcpy.memcpy.bytes, memcpy.memcpy.direction) == (pb.KIND_MEMCPY, 1024, "HtoD")
    d = job.manifest.dropped
    assert d["outside_step"] == 3 and d["gpu_op_without_launch"] == 1
    assert d["runtime_call_without_gpu_work"] == 1 and d["event_record_wait_calls"] == 3


def test_streams_and_execution_order(tmp_path):
    g = convert(write(tmp_path, base_events())).graph_of(0)
    kinds = {s.native_id: s.kind for s in g.header.streams if s.device == 0}
    assert kinds == {7: pb.STREAM_GPU_COMM, 20: pb.STREAM_GPU_COMM, 21: pb.STREAM_GPU_COMPUTE,
                     22: pb.STREAM_GPU_COPY}
    (cpu_stream,) = [s for s in g.header.streams if s.kind == pb.STREAM_CPU_THREAD]
    assert cpu_stream.native_id == TID and cpu_stream.device == -1
    for s in g.header.streams:
        on = sorted((n.id, n.start_ns) for n in g.nodes if n.stream == s.id)
        assert [t for _, t in on] == sorted(t for _, t in on)


def test_collectives_from_args_and_from_host_ops(tmp_path):
    job = convert(write(tmp_path, base_events()))
    g = job.graph_of(0)
    ar = by_name(g, NCCL_AR)
    c = ar.collective
    assert (c.type, c.in_bytes, c.out_bytes, c.dtype, c.group, c.seq, c.algorithm) == \
        (pb.COLL_ALL_REDUCE, 400, 400, "Float", "0", 0, "ring_ll")
    assert ar.attrs["comm_source"].startswith("record_param_comms")
    # Two SendRecv kernels under one all-to-all op: one all-to-all, from the first start to
    # the last end, waiting for both launches; sizes from the annotation and the c10d op.
    (a2a,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_TO_ALL]
    assert (a2a.start_ns, a2a.duration_ns) == (390_000, 10_000)
    assert len(deps(a2a, pb.DEP_LAUNCH)) == 2
    assert (a2a.collective.in_bytes, a2a.collective.out_bytes, a2a.collective.seq) == (256, 128, 1)
    assert a2a.attrs["group_guess"] == "group_name_guessed"
    assert job.manifest.dropped["comm_kernels_merged"] == 1
    # A kernel of another communication library: communication, type unknown, never compute.
    other = by_name(g, "void cross_device_reduce_1stage<float, 2>(float*)")
    assert other.kind == pb.KIND_COMM_UNKNOWN and other.attrs["comm_library"] == "custom_allreduce"
    assert job.manifest.dropped["comm_kernel_unknown_library"] == 1
    # The one traced rank of two stands for both (same program, world group only).
    assert job.world_size == 2 and job.binding(1).graph == job.binding(0).graph
    assert [list(p.ranks) for p in job.manifest.groups] == [[0, 1]]


def test_syncs_by_heuristic(tmp_path):
    g = convert(write(tmp_path, base_events())).graph_of(0)
    ar = by_name(g, NCCL_AR)
    other = by_name(g, "void other_kernel(float*)")
    # The wait before the all-reduce pairs with the latest record on a different stream
    # (at 218, after a launch on stream 21).
    assert deps(ar, pb.DEP_SYNC) == [other.id]
    ssync = by_name(g, "cudaStreamSynchronize")
    assert ssync.kind == pb.KIND_SYNC and deps(ssync, pb.DEP_SYNC) == [ar.id]
    dsync = by_name(g, "cudaDeviceSynchronize")
    (a2a,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_TO_ALL]
    last = {7: by_name(g, "orphan_kernel").id, 20: a2a.id, 21: other.id,
            22: by_name(g, "Memcpy HtoD (Pinned -> Device)").id}
    assert sorted(deps(dsync, pb.DEP_SYNC)) == sorted(last.values())


def test_syncs_from_cuda_sync_events_are_exact(tmp_path):
    evs = base_events() + [
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20,
         "ts": 224, "dur": 0, "args": {"device": 0, "stream": 20, "correlation": 4,
                                       "wait_on_stream": 22,
                                       "wait_on_cuda_event_record_corr_id": 3}},
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7,
         "ts": 310, "dur": 90, "args": {"device": 0, "stream": 7, "correlation": 6}},
    ]
    job = convert(write(tmp_path, evs))
    g = job.graph_of(0)
    memcpy = by_name(g, "Memcpy HtoD (Pinned -> Device)")
    assert deps(by_name(g, NCCL_AR), pb.DEP_SYNC) == [memcpy.id]
    assert deps(by_name(g, "cudaStreamSynchronize"), pb.DEP_SYNC) == \
        [by_name(g, "void gemm_kernel<float>(float*)").id]
    assert not [k for k in job.manifest.dropped if "heuristic" in k or "sync_stream_guessed" in k]


def test_event_records_with_their_stream(tmp_path):
    """A ``cuda_event`` activity names the stream a record was made on."""
    evs = base_events() + [
        {"ph": "X", "cat": "cuda_event", "name": "Event Record", "pid": 0, "tid": 22,
         "ts": 218, "dur": 0, "args": {"device": 0, "stream": 22, "correlation": 12}}]
    g = convert(write(tmp_path, evs)).graph_of(0)
    assert deps(by_name(g, NCCL_AR), pb.DEP_SYNC) == [by_name(g, "Memcpy HtoD (Pinned -> Device)").id]


def test_steps_choice_and_errors(tmp_path):
    evs = base_events() + [cpu("ProfilerStep#2", 610, 300, cat="user_annotation", **{"Ev Idx": 9})]
    p = write(tmp_path, evs)
    # Step 2 holds one op against step 1's many: cut short by the profiler stop.
    assert convert(p).manifest.step == 1
    assert convert(p, step=2).manifest.step == 2
    with pytest.raises(EchoError, match=r"no ProfilerStep#5 \(steps: 1, 2\)"):
        read([p], "kineto", ReadOptions(step=5))


def _host_all_reduce_step(group: str = "0", **args) -> list[dict]:
    """A step whose host all-reduces 10 floats over ``group`` (ranks 0 and 1), as a CPU
    backend's ``record_param_comms`` says it (``args``: more of its fields)."""
    return [
        cpu("ProfilerStep#3", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        cpu("c10d::allreduce_", 100, 200, **{"Ev Idx": 1}),
        cpu("record_param_comms", 101, 198, **{
            "Ev Idx": 2, "Collective name": "allreduce", "In msg nelems": 10,
            "Out msg nelems": 10, "dtype": "Float", "Process Group Name": group,
            "Process Group Ranks": "[0, 1]", "Group size": 2, **args}),
    ]


def _gloo_rank(rank: int) -> list[dict]:
    p2p = ("send", "Dst Rank", 1) if rank == 0 else ("recv", "Src Rank", 0)
    return [
        *_host_all_reduce_step(),
        cpu(f"c10d::{p2p[0]}", 400, 50, **{"Ev Idx": 3}),
        cpu("record_param_comms", 401, 48, **{
            "Ev Idx": 4, "Collective name": p2p[0], "In msg nelems": 6, "Out msg nelems": 6,
            "dtype": "Long", "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "Group size": 2, p2p[1]: p2p[2]}),
    ]


def test_host_collectives_from_record_param_comms(tmp_path):
    """CPU-only (gloo) traces: record_param_comms carries the collective; no kernel exists."""
    paths = [write(tmp_path, _gloo_rank(r), f"rank{r}.json", backend="gloo", rank=r)
             for r in (0, 1)]
    job = convert(paths[0].parent)          # a folder of per-rank files
    assert job.world_size == 2 and "kineto.partial" not in job.manifest.attrs
    g = job.graph_of(0)
    (ar,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert (ar.collective.type, ar.collective.in_bytes, ar.collective.group) == (pb.COLL_ALL_REDUCE, 40, "0")
    assert ar.name == "c10d::allreduce_"
    issuer = by_name(g, "c10d::allreduce_", pb.KIND_CPU_OP).id
    assert deps(ar, pb.DEP_CONTROL) == [issuer] and deps(ar, pb.DEP_LAUNCH) == [issuer]
    assert (ar.start_ns, ar.duration_ns) == (100_000, 200_000)
    stream = next(s for s in g.header.streams if s.id == ar.stream)
    assert stream.name == "host-comm:0" and stream.kind == pb.STREAM_CPU_THREAD
    (send,) = [n for n in g.nodes if n.kind == pb.KIND_SEND]
    (recv,) = [n for n in job.graph_of(1).nodes if n.kind == pb.KIND_RECV]
    assert (send.p2p.peer, send.p2p.bytes, send.p2p.group) == (1, 48, "0")
    assert (recv.p2p.peer, recv.p2p.bytes) == (0, 48)


def test_send_to_an_untraced_rank(tmp_path):
    """Rank 1 was not traced and rank 0 sends to it: the job keeps rank 0 alone and the send
    becomes communication of unknown peer (it could never be matched)."""
    job = convert(write(tmp_path, _gloo_rank(0), backend="gloo"))
    assert job.manifest.attrs["kineto.partial"] == "renumbered" and job.world_size == 1
    g = job.graph_of(0)
    assert not [n for n in g.nodes if n.kind == pb.KIND_SEND]
    (lost,) = [n for n in g.nodes if n.kind == pb.KIND_COMM_UNKNOWN]
    assert lost.attrs["comm"] == "send"
    assert job.manifest.dropped["p2p_peer_not_traced"] == 1
    assert [list(p.ranks) for p in job.manifest.groups] == [[0]]


def test_rank_from_the_file_name_and_option(tmp_path):
    evs = base_events()
    doc = {"traceEvents": evs}
    for name, want in (("trace.rank-3.json", 3), ("worker5_step_1.json", 5), ("job.7.json", 7)):
        p = tmp_path / name
        p.write_text(json.dumps(doc))
        job = read([p], "kineto", ReadOptions())
        assert job.graph_of(0).header.attrs["kineto.rank"] == str(want)
    q = tmp_path / "plain.json"
    q.write_text(json.dumps(doc))
    job = read([q], "kineto", ReadOptions(rank=4))
    assert job.graph_of(0).header.attrs["kineto.rank"] == "4"


def test_host_et_goes_to_the_linker(tmp_path, monkeypatch):
    p = write(tmp_path, base_events())
    calls = []
    fake = types.ModuleType("echo_et.converters.pytorch_et")

    def link(job, paths):
        calls.append((job, paths))
        return job

    fake.link = link  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "echo_et.converters.pytorch_et", fake)
    job = read([p], "kineto", ReadOptions(host_et=[tmp_path / "et.json"]))
    assert calls and calls[0][0] is job and calls[0][1] == [tmp_path / "et.json"]
    monkeypatch.setitem(sys.modules, "echo_et.converters.pytorch_et", types.ModuleType("x"))
    with pytest.raises(EchoError, match="linker"):
        read([p], "kineto", ReadOptions(host_et=[tmp_path / "et.json"]))


def test_sniff(tmp_path):
    from echo_et.converters import kineto

    assert kineto.sniff(write(tmp_path, base_events()))
    et = tmp_path / "host.json"
    et.write_text(json.dumps({"schema": "1.0.1", "pid": 1, "nodes": []}))
    assert not kineto.sniff(et)
    arr = tmp_path / "array.json"
    arr.write_text(json.dumps([{"ph": "X", "ts": 1, "dur": 1, "name": "a"}]))
    assert kineto.sniff(arr)
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    assert kineto.sniff(broken)      # so that the reader, not "unknown format", explains it
    assert not kineto.sniff(tmp_path / "missing.json") and not kineto.sniff(tmp_path)


@pytest.mark.parametrize("devices, gpn", [(1, 1), (2, 2), (4, 4), (3, 0)])
def test_the_traced_devices_are_the_nodes_only_where_the_world_fills_them(tmp_path, devices, gpn):
    """A trace's device list (the GPUs the process saw) is recorded as GPUs per node when the
    job's 4 ranks fill such nodes or fit in one; 3 devices would leave a node of 4 ranks partly
    filled (the checker's node-fill rule), so the nodes stay unknown; --gpus-per-node wins."""
    p = write(tmp_path, base_events(), world_size=4,
              pg_config=[{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]}])
    obj = json.loads(p.read_text())
    obj["deviceProperties"] = [{"id": i, "name": "Test GPU"} for i in range(devices)]
    p.write_text(json.dumps(obj))
    assert convert(p).manifest.hardware.gpus_per_node == gpn
    assert convert(p, gpus_per_node=2).manifest.hardware.gpus_per_node == 2


def test_megatron_group_names_state_the_layout(tmp_path):
    """Megatron-core names its groups (``group_desc``, Kineto's ``Process Group
    Description``): the tensor-parallel group's role is read from its name, and the layout
    from the roles, where the groups alone read two ranks on one group as data parallelism."""
    from echo_et.passes import infer_layout

    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]},
              {"pg_name": "1", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP", "pg_size": 2, "ranks": [0, 1]}]
    for r in (0, 1):
        write(tmp_path, _host_all_reduce_step("1", **{"Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP"}),
              f"rank{r}.json", backend="gloo", rank=r, pg_config=groups)
    job = convert(tmp_path)
    (tp,) = [g for g in job.manifest.groups if g.desc == "TENSOR_MODEL_PARALLEL_GROUP"]
    assert tp.role == pb.ROLE_TP
    d = infer_layout(job)
    assert (d.dp, d.tp, d.pp, d.source) == (1, 2, 1, "stated:group-roles")
    tp.desc, tp.role = "undefined", pb.ROLE_UNKNOWN     # an older PyTorch, or no names
    job.invalidate()
    assert (infer_layout(job).dp, infer_layout(job).tp) == (2, 1)
