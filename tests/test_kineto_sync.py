"""Event waits around NCCL calls and the measured-time check of every sync dependency, on
small traces written here event by event (the pattern of the DLRM trace: c10d's syncStream
wait before the library call, NCCL's own waits inside it, work.wait() later; no
cudaEventRecord recorded)."""

from __future__ import annotations

from test_kineto_graph import by_name, convert, cpu, deps, gpu, rt, write

from echo_et.ir import pb

SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"


def _nccl_call_events() -> list[dict]:
    return [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        cpu("aten::mm", 10, 20, **{"Ev Idx": 1}),
        rt("cudaLaunchKernel", 12, 2, 1),
        gpu("gemm_kernel", 20, 40, 1, 7),
        cpu("c10d::alltoall_base_", 100, 60, **{
            "Ev Idx": 2, "Input Dims": [[16], [16], [], [], [], []],
            "Input type": ["float", "float", "", "", "", "Scalar"]}),
        cpu("record_param_comms", 101, 58, **{"Ev Idx": 3}),
        rt("cudaStreamWaitEvent", 102, 1, 2),          # syncStream: NCCL stream waits for ours
        cpu("nccl:all_to_all", 105, 50, cat="user_annotation", **{
            "Ev Idx": 4, "Input Dims": [[16]], "Input type": ["float"]}),
        rt("cudaStreamWaitEvent", 106, 1, 3),          # NCCL's own waits (internal streams)
        rt("cudaLaunchKernel", 108, 2, 4),
        gpu(SENDRECV, 115, 400, 4, 20),
        rt("cudaStreamWaitEvent", 112, 1, 5),
        rt("cudaStreamWaitEvent", 114, 1, 6),
        # Compute launched after the call runs while the all-to-all still runs: it did not
        # wait for it, whatever NCCL's waits above were.
        cpu("aten::add", 200, 20, **{"Ev Idx": 5}),
        rt("cudaLaunchKernel", 205, 2, 7),
        gpu("add_kernel", 210, 10, 7, 7),
        # A copy on a third stream, then c10d's work.wait(): the current stream waits for
        # the communication stream (not for the stream launched to last).
        cpu("aten::copy_", 585, 10, **{"Ev Idx": 6}),
        rt("cudaMemcpyAsync", 590, 2, 10),
        gpu("Memcpy HtoD (Pinned -> Device)", 592, 2, 10, 22, cat="gpu_memcpy", bytes=64),
        cpu("All2All_Wait", 600, 50, cat="user_annotation", **{"Ev Idx": 7}),
        cpu("record_param_comms", 601, 10, **{"Ev Idx": 8}),
        rt("cudaStreamWaitEvent", 602, 1, 8),
        cpu("aten::cat", 620, 20, **{"Ev Idx": 9}),
        rt("cudaLaunchKernel", 625, 2, 9),
        gpu("cat_kernel", 630, 10, 9, 7),
    ]


def test_waits_around_an_nccl_call(tmp_path):
    job = convert(write(tmp_path, _nccl_call_events()))
    g = job.graph_of(0)
    a2a = by_name(g, SENDRECV)
    assert a2a.kind == pb.KIND_COLLECTIVE
    # The wait before the library call: the all-to-all waits for the gemm on stream 7.
    assert deps(a2a, pb.DEP_SYNC) == [by_name(g, "gemm_kernel").id]
    # NCCL's waits inside the call order nothing the trace shows.
    assert deps(by_name(g, "add_kernel"), pb.DEP_SYNC) == []
    assert job.manifest.dropped["event_wait_inside_comm_library"] == 3
    # work.wait(): the kernel launched after it waits for the all-to-all, not the copy.
    assert deps(by_name(g, "cat_kernel"), pb.DEP_SYNC) == [a2a.id]
    assert job.manifest.dropped["event_wait_stream_guessed"] == 2
    assert "sync_dep_contradicted_by_times" not in job.manifest.dropped


def _sync_act(name: str, stream: int, corr: int, ts: int, **args) -> dict:
    return {"ph": "X", "cat": "cuda_sync", "name": name, "pid": 0, "tid": stream, "ts": ts,
            "dur": 0, "args": {"device": 0, "stream": stream, "correlation": corr, **args}}


def test_sync_dependencies_the_times_contradict_are_dropped(tmp_path):
    """Even an exact wait (named by a ``cuda_sync`` activity) is left out when the measured
    times contradict it: the waiting kernel starts before the recorded one ends, or a host
    sync returns before it. A sync that starts early but returns after is kept (it blocks)."""
    evs = [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        rt("cudaLaunchKernel", 10, 2, 1),
        gpu("long_kernel", 20, 280, 1, 7),                     # ends at 300
        rt("cudaEventRecord", 15, 1, 2),
        {"ph": "X", "cat": "cuda_event", "name": "Event Record", "pid": 0, "tid": 7,
         "ts": 15, "dur": 0, "args": {"device": 0, "stream": 7, "correlation": 2}},
        rt("cudaStreamWaitEvent", 16, 1, 3),
        _sync_act("Stream Wait Event", 21, 3, 16, wait_on_stream=7,
                  wait_on_cuda_event_record_corr_id=2),
        rt("cudaLaunchKernel", 17, 2, 4),
        gpu("early_kernel", 30, 10, 4, 21),                     # starts at 30 < 300
        rt("cudaStreamSynchronize", 50, 5, 5),                  # returns at 55 < 300
        _sync_act("Stream Sync", 7, 5, 50),
        rt("cudaStreamSynchronize", 100, 250, 6),               # returns at 350
        _sync_act("Stream Sync", 7, 6, 100),
    ]
    job = convert(write(tmp_path, evs))
    g = job.graph_of(0)
    assert deps(by_name(g, "early_kernel"), pb.DEP_SYNC) == []
    early, late = sorted((n for n in g.nodes if n.name == "cudaStreamSynchronize"),
                         key=lambda n: n.start_ns)
    assert deps(early, pb.DEP_SYNC) == []
    assert deps(late, pb.DEP_SYNC) == [by_name(g, "long_kernel").id]
    assert job.manifest.dropped["sync_dep_contradicted_by_times"] == 2
    assert not [k for k in job.manifest.dropped if "heuristic" in k or "guessed" in k]

