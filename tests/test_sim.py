"""Simulator semantics on small hand-built jobs whose timelines are computed by hand here."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from echo_et.errors import CheckError, EchoError
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import GraphBuilder, JobBuilder, check_job, pb
from echo_et.sim import Predictor, SimOptions, Simulator, simulate


def times(result, rank: int) -> dict[str, tuple[int, int]]:
    """Simulated (start, end) of every node of ``rank``, by node name."""
    tl = result.timeline
    graph = tl.state_of(rank).graph
    by_id = tl.node_times(rank)
    return {n.name: by_id[n.id] for n in graph.nodes if n.id in by_id}


def one_rank_job(build) -> object:
    jb = JobBuilder("t", 1)
    gb = GraphBuilder("g")
    build(gb)
    jb.add_graph(gb.build())
    jb.bind(0, "g")
    job = jb.build()
    assert check_job(job) == []
    return job


# -- streams, dependencies, launches, syncs -------------------------------------------------------
def _two_streams(gb: GraphBuilder) -> None:
    s0 = gb.stream(pb.STREAM_GPU_COMPUTE, "s0", device=0)
    s1 = gb.stream(pb.STREAM_GPU_COMPUTE, "s1", device=0)
    gb.compute("k1", s0, start_ns=0, duration_ns=100)
    k2 = gb.compute("k2", s0, start_ns=100, duration_ns=50)
    gb.compute("k3", s0, start_ns=150, duration_ns=100)
    gb.compute("k4", s1, start_ns=150, duration_ns=50, deps=[(k2.id, pb.DEP_SYNC)])


def test_replay_keeps_measured_times_on_streams() -> None:
    res = simulate(one_rank_job(_two_streams))
    t = times(res, 0)
    assert t == {"k1": (0, 100), "k2": (100, 150), "k3": (150, 250), "k4": (150, 200)}
    assert res.step_time_ns == 250
    assert res.ranks[0].compute_ns == 250  # union of both streams
    assert res.ranks[0].idle_ns == 0


def test_stream_order_and_cross_stream_dependency_under_slower_compute() -> None:
    # compute x2: s0 runs 0-200, 200-300, 300-500; k4 waits for k2 (ends 300) -> 300-400
    res = simulate(one_rank_job(_two_streams), options=SimOptions(compute_scale=2.0))
    assert times(res, 0) == {"k1": (0, 200), "k2": (200, 300), "k3": (300, 500), "k4": (300, 400)}
    assert res.step_time_ns == 500


def _launches(gb: GraphBuilder) -> None:
    cpu = gb.stream(pb.STREAM_CPU_THREAD, "main")
    gpu = gb.stream(pb.STREAM_GPU_COMPUTE, "s7", device=0)
    op = gb.cpu_op("op", cpu, start_ns=0, duration_ns=100)
    l1 = gb.cpu_op("L1", cpu, kind=pb.KIND_LAUNCH, start_ns=10, duration_ns=5, deps=[(op.id, pb.DEP_CONTROL)])
    l2 = gb.cpu_op("L2", cpu, kind=pb.KIND_LAUNCH, start_ns=50, duration_ns=5, deps=[(op.id, pb.DEP_CONTROL)])
    gb.compute("K1", gpu, start_ns=20, duration_ns=50, deps=[(l1.id, pb.DEP_LAUNCH)])
    gb.compute("K2", gpu, start_ns=70, duration_ns=20, deps=[(l2.id, pb.DEP_LAUNCH)])


def test_host_launches_gate_kernels() -> None:
    job = one_rank_job(_launches)
    assert times(simulate(job), 0) == {"op": (0, 100), "L1": (10, 15), "L2": (50, 55), "K1": (20, 70),
                                       "K2": (70, 90)}
    # A 2x faster GPU: K1 = 20-45 (10 ns launch latency kept); K2 cannot start before its
    # launch at 50 (it was stream-bound, so it gets no latency of its own): 50-60.
    res = simulate(job, options=SimOptions(compute_scale=0.5))
    t = times(res, 0)
    assert t["K1"] == (20, 45) and t["K2"] == (50, 60) and t["op"] == (0, 100)


def test_straggler_scales_host_time_and_kernels() -> None:
    # host segments x2: op 0-200 with L1 at 20-30, L2 at 100-110; K1 = L1 start + 10 -> 30-130;
    # K2 waits for K1 (its stream) -> 130-170.
    res = simulate(one_rank_job(_launches), options=SimOptions(stragglers={0: 2.0}))
    assert times(res, 0) == {"op": (0, 200), "L1": (20, 30), "L2": (100, 110), "K1": (30, 130),
                             "K2": (130, 170)}


def _sync(gb: GraphBuilder) -> None:
    cpu = gb.stream(pb.STREAM_CPU_THREAD, "main")
    gpu = gb.stream(pb.STREAM_GPU_COMPUTE, "s7", device=0)
    op = gb.cpu_op("op", cpu, start_ns=0, duration_ns=200)
    ctl = [(op.id, pb.DEP_CONTROL)]
    l1 = gb.cpu_op("L1", cpu, kind=pb.KIND_LAUNCH, start_ns=10, duration_ns=5, deps=ctl)
    k1 = gb.compute("K1", gpu, start_ns=20, duration_ns=100, deps=[(l1.id, pb.DEP_LAUNCH)])
    gb.cpu_op("S", cpu, kind=pb.KIND_SYNC, start_ns=30, duration_ns=95, deps=[*ctl, (k1.id, pb.DEP_SYNC)])
    l2 = gb.cpu_op("L2", cpu, kind=pb.KIND_LAUNCH, start_ns=130, duration_ns=5, deps=ctl)
    gb.compute("K2", gpu, start_ns=140, duration_ns=20, deps=[(l2.id, pb.DEP_LAUNCH)])


def test_sync_blocks_host_until_device_done() -> None:
    job = one_rank_job(_sync)
    res = simulate(job)
    assert times(res, 0)["S"] == (30, 125) and res.step_time_ns == 200
    assert res.ranks[0].host_wait_ns == 90  # 30 -> 120 waiting, 5 ns return latency
    # 2x faster GPU: K1 20-70, sync returns at 70 + 5 = 75, the host continues 5 ns later:
    # L2 at 80-85, K2 at 80 + 10 (its launch latency) = 90-100, op ends 85 + 65 = 150.
    t = times(simulate(job, options=SimOptions(compute_scale=0.5)), 0)
    assert t == {"op": (0, 150), "L1": (10, 15), "K1": (20, 70), "S": (30, 75), "L2": (80, 85), "K2": (90, 100)}


def test_dependency_on_a_later_node_of_the_same_stream_is_refused() -> None:
    def build(gb):
        s = gb.stream(pb.STREAM_GPU_COMPUTE, "s", device=0)
        gb.compute("a", s, duration_ns=10, deps=[(2, pb.DEP_DATA)])
        gb.compute("b", s, duration_ns=10)

    # The checker reports it (so `check` refuses what `simulate` refuses) ...
    jb = JobBuilder("t", 1)
    gb = GraphBuilder("g")
    build(gb)
    jb.add_graph(gb.build())
    jb.bind(0, "g")
    job = jb.build()
    assert [i.rule for i in check_job(job)] == ["stream-order"]
    # ... and the simulator, run without the checker, still refuses it by itself.
    with pytest.raises(EchoError, match="runs after it on the same stream"):
        simulate(job, options=SimOptions(check=False))


# -- collectives and P2P ---------------------------------------------------------------------------
def two_rank_allreduce(d0: int = 100, d1: int = 300, *, coll1: int = pb.COLL_ALL_REDUCE):
    """Each rank computes (rank 0: d0, rank 1: d1 ns) then all-reduces; the measured kernels
    end together at max(d0, d1) + 50, so each measured duration includes its wait."""
    end = max(d0, d1) + 50
    jb = JobBuilder("ar", 2)
    g = jb.group([0, 1], name="0")
    for r, d in ((0, d0), (1, d1)):
        gb = GraphBuilder(f"g{r}")
        gb.declare_group("dp", 2)
        s = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0)
        c = gb.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
        k = gb.compute("K", s, start_ns=0, duration_ns=d)
        gb.collective("AR", c, coll_type=pb.COLL_ALL_REDUCE if r == 0 else coll1, group="dp", in_bytes=4096,
                      dtype="float32", start_ns=d, duration_ns=end - d, deps=[(k.id, pb.DEP_SYNC)])
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"dp": g}, measured_step_ns=end)
    return jb.build()


def test_collective_starts_when_last_member_arrives_and_wait_is_not_counted_twice() -> None:
    res = simulate(two_rank_allreduce())
    # own time = the last arriver's kernel (50 ns); both run 300-350
    assert times(res, 0)["AR"] == (300, 350) and times(res, 1)["AR"] == (300, 350)
    assert res.ranks[0].sync_wait_ns == 200 and res.ranks[1].sync_wait_ns == 0
    assert res.ranks[0].comm_ns == 50 and res.ranks[0].step_time_ns == 350
    assert res.ranks[0].idle_ns == 200  # 100-300 waiting for rank 1
    assert res.ranks[0].bubble_ns == 200 and res.ranks[1].bubble_ns == 0  # all of it waiting for a peer
    # the timeline shows the kernel as a profiler would: from arrival, the wait inside
    ar0 = next(e for e in res.timeline_events([0]) if e.name.startswith("all_reduce"))
    assert (ar0.start_ns, ar0.duration_ns, ar0.args["wait_ns"]) == (100, 250, 200)


def _uneven_ends(clock1: int = 0):
    """gloo-like: rank 0 arrives at 100 and its all-reduce ends at 400; rank 1 arrives at
    300 and ends at 350 (ranks do not finish together)."""
    jb = JobBuilder("gloo", 2)
    g = jb.group([0, 1], name="0")
    for r, (arrive, end) in enumerate(((100, 400), (300, 350))):
        gb = GraphBuilder(f"g{r}")
        c = gb.stream(pb.STREAM_CPU_THREAD, "host-comm:0")
        s = gb.stream(pb.STREAM_CPU_THREAD, "main")
        k = gb.cpu_op("work", s, start_ns=0, duration_ns=arrive)
        gb.collective("AR", c, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=64, start_ns=arrive,
                      duration_ns=end - arrive, deps=[(k.id, pb.DEP_DATA)])
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"dp": g}, measured_step_ns=end, clock_offset_ns=clock1 if r else 0)
    return jb.build()


def test_replay_keeps_each_members_measured_tail_after_the_last_arrival() -> None:
    res = simulate(_uneven_ends())
    assert times(res, 0)["AR"] == (300, 400) and times(res, 1)["AR"] == (300, 350)
    assert [res.ranks[r].step_time_ns for r in (0, 1)] == [400, 350]
    # clocks that disagree (rank 1's clock 200 ns late: its kernel would end before rank 0's
    # aligned start): every member gets the shortest kernel instead
    skewed = simulate(_uneven_ends(clock1=200))
    assert times(skewed, 0)["AR"][1] - times(skewed, 0)["AR"][0] == 50


def test_collective_inside_a_host_thread_blocks_the_thread() -> None:
    """gloo called synchronously: the all-reduce is a leaf of the main thread's step."""
    jb = JobBuilder("cpu", 2)
    g = jb.group([0, 1], name="0")
    for r, d in ((0, 100), (1, 300)):
        gb = GraphBuilder(f"g{r}")
        t = gb.stream(pb.STREAM_CPU_THREAD, "main")
        step = gb.cpu_op("step", t, start_ns=0, duration_ns=400)
        ctl = [(step.id, pb.DEP_CONTROL)]
        gb.cpu_op("work", t, start_ns=0, duration_ns=d, deps=ctl)
        gb.collective("AR", t, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=64, start_ns=d,
                      duration_ns=350 - d, deps=ctl)
        gb.cpu_op("after", t, start_ns=350, duration_ns=50, deps=ctl)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"dp": g}, measured_step_ns=400)
    job = jb.build()
    res = simulate(job)
    assert times(res, 0) == {"step": (0, 400), "work": (0, 100), "AR": (300, 350), "after": (350, 400)}
    assert res.ranks[0].compute_ns == 400 - 50 - 200  # CPU-only: host operators are the compute
    res = simulate(job, "predict", comm_model=FakeComm(coll_ns=1000))
    assert times(res, 1) == {"step": (0, 1350), "work": (0, 300), "AR": (300, 1300), "after": (1300, 1350)}


def test_straggler_delays_the_collective_for_everyone() -> None:
    res = simulate(two_rank_allreduce(), options=SimOptions(stragglers={1: 2.0}))
    assert times(res, 0)["AR"] == (600, 650) and res.ranks[0].step_time_ns == 650


@dataclass
class Est:
    time_ns: float
    algorithm: str = "ring"
    protocol: str = "simple"


class FakeComm:
    """A CC model that records its calls."""

    def __init__(self, coll_ns: int = 1000, p2p_ns: int = 500):
        self.coll_ns, self.p2p_ns = coll_ns, p2p_ns
        self.calls: list[tuple] = []

    def estimate(self, name, nbytes, ranks, dtype="float32", gpus_per_node=None):
        self.calls.append((name, nbytes, tuple(ranks), dtype))
        return Est(self.coll_ns)

    def p2p(self, nbytes, src, dst, gpus_per_node=None):
        self.calls.append(("p2p", nbytes, src, dst))
        return Est(self.p2p_ns)


def test_predict_takes_collective_time_from_the_cc_model() -> None:
    comm = FakeComm(coll_ns=1000)
    res = simulate(two_rank_allreduce(), "predict", comm_model=comm)
    assert comm.calls == [("all_reduce", 4096, (0, 1), "float32")]
    assert times(res, 0)["AR"] == (300, 1300) and res.step_time_ns == 1300
    with pytest.raises(EchoError, match="communication model"):
        simulate(two_rank_allreduce(), "predict", comm_model=None)


def p2p_job():
    """Rank 0 computes 100 ns then sends; rank 1 posted its recv at 0 (it waited) and then
    computes 50 ns on the received data."""
    jb = JobBuilder("p2p", 2)
    g = jb.group([0, 1], name="pp")
    gb = GraphBuilder("s0")
    s, c = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0), gb.stream(pb.STREAM_GPU_COMM, "p2p", device=0)
    k = gb.compute("K0", s, start_ns=0, duration_ns=100)
    gb.p2p(True, "send", c, group="pp", peer=1, nbytes=1 << 20, start_ns=100, duration_ns=30,
           deps=[(k.id, pb.DEP_SYNC)])
    jb.add_graph(gb.build())
    gb = GraphBuilder("s1")
    s, c = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0), gb.stream(pb.STREAM_GPU_COMM, "p2p", device=0)
    r = gb.p2p(False, "recv", c, group="pp", peer=0, nbytes=1 << 20, start_ns=0, duration_ns=130)
    gb.compute("K1", s, start_ns=130, duration_ns=50, deps=[(r.id, pb.DEP_SYNC)])
    jb.add_graph(gb.build())
    jb.bind(0, "s0", {"pp": g})
    jb.bind(1, "s1", {"pp": g})
    return jb.build()


def test_recv_completes_after_its_send() -> None:
    res = simulate(p2p_job())
    assert times(res, 0)["send"] == (100, 130) and times(res, 1)["recv"] == (100, 130)
    assert times(res, 1)["K1"] == (130, 180)
    assert res.ranks[1].sync_wait_ns == 100
    comm = FakeComm(p2p_ns=500)
    res = simulate(p2p_job(), "predict", comm_model=comm)
    assert comm.calls == [("p2p", 1 << 20, 0, 1)]
    assert times(res, 1)["K1"] == (600, 650)


def late_receiver_job(nbytes: int = 1024):
    """Rank 0 sends at 0 (10 ns) and then computes 100 ns after the send; rank 1 computes
    200 ns before it posts the recv (measured 200-210)."""
    jb = JobBuilder("late", 2)
    g = jb.group([0, 1], name="pp")
    gb = GraphBuilder("r0")
    s, c = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0), gb.stream(pb.STREAM_GPU_COMM, "p2p", device=0)
    snd = gb.p2p(True, "send", c, group="pp", peer=1, nbytes=nbytes, start_ns=0, duration_ns=10)
    gb.compute("K0", s, start_ns=10, duration_ns=100, deps=[(snd.id, pb.DEP_SYNC)])
    jb.add_graph(gb.build())
    gb = GraphBuilder("r1")
    s, c = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0), gb.stream(pb.STREAM_GPU_COMM, "p2p", device=0)
    k = gb.compute("K1", s, start_ns=0, duration_ns=200)
    gb.p2p(False, "recv", c, group="pp", peer=0, nbytes=nbytes, start_ns=200, duration_ns=10,
           deps=[(k.id, pb.DEP_SYNC)])
    jb.add_graph(gb.build())
    jb.bind(0, "r0", {"pp": g})
    jb.bind(1, "r1", {"pp": g})
    return jb.build()


def test_small_sends_do_not_wait_for_their_recv_large_ones_do() -> None:
    job = late_receiver_job()
    res = simulate(job)  # eager: replay == measured
    assert times(res, 0) == {"send": (0, 10), "K0": (10, 110)} and times(res, 1)["recv"] == (200, 210)
    comm = FakeComm(p2p_ns=50)
    res = simulate(job, "predict", comm_model=comm)
    assert times(res, 0) == {"send": (0, 50), "K0": (50, 150)}
    assert times(res, 1)["recv"] == (200, 250)  # starts when posted, ends no earlier than the send
    # above the eager size the send waits for the recv (rendezvous): both run 200-250
    res = simulate(job, "predict", comm_model=comm, options=SimOptions(p2p_eager_bytes=512))
    assert times(res, 0) == {"send": (200, 250), "K0": (250, 350)} and times(res, 1)["recv"] == (200, 250)
    assert res.ranks[0].sync_wait_ns == 200


def test_replay_reproduces_measured_times_of_a_two_rank_job() -> None:
    """Host thread with nested ops, launches, a sync and a collective on two ranks whose
    measured all-reduce kernels end together: every node lands at its measured time."""
    jb = JobBuilder("two", 2)
    g = jb.group([0, 1], name="0")
    for r, d in ((0, 100), (1, 300)):
        gb = GraphBuilder(f"g{r}")
        gb.declare_group("dp", 2)
        cpu = gb.stream(pb.STREAM_CPU_THREAD, "main")
        s = gb.stream(pb.STREAM_GPU_COMPUTE, "s7", device=0)
        c = gb.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
        top = gb.cpu_op("step", cpu, start_ns=0, duration_ns=1000)
        ctl = (top.id, pb.DEP_CONTROL)
        fwd = gb.cpu_op("fwd", cpu, start_ns=5, duration_ns=40, deps=[ctl])
        l1 = gb.cpu_op("launch K", cpu, kind=pb.KIND_LAUNCH, start_ns=10, duration_ns=5,
                       deps=[(fwd.id, pb.DEP_CONTROL)])
        k1 = gb.compute("K", s, start_ns=20, duration_ns=d, deps=[(l1.id, pb.DEP_LAUNCH)])
        l2 = gb.cpu_op("launch AR", cpu, kind=pb.KIND_LAUNCH, start_ns=30, duration_ns=5,
                       deps=[(fwd.id, pb.DEP_CONTROL)])
        gb.collective("AR", c, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=1024, start_ns=20 + d,
                      duration_ns=350 - d, deps=[(l2.id, pb.DEP_LAUNCH), (k1.id, pb.DEP_SYNC)])
        ar = gb.graph.nodes[-1]
        gb.cpu_op("wait", cpu, kind=pb.KIND_SYNC, start_ns=50, duration_ns=330, deps=[ctl, (ar.id, pb.DEP_SYNC)])
        gb.cpu_op("opt", cpu, start_ns=400, duration_ns=600, deps=[ctl])
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"dp": g}, measured_step_ns=1000)
    job = jb.build()
    res = simulate(job)
    for r in (0, 1):
        graph = job.graph_of(r)
        want = {n.name: (n.start_ns, n.start_ns + n.duration_ns) for n in graph.nodes}
        got = times(res, r)
        ar = want.pop("AR")
        assert got.pop("AR") == (320, ar[1])  # the kernel starts at the last arrival, ends as measured
        assert got == want
        assert res.ranks[r].step_time_ns == job.binding(r).measured_step_ns
    cp = res.critical_path
    assert cp["length_ns"] == 1000 and sum(cp["by_category"].values()) == 1000


# -- bad inputs: mismatches, deadlocks -------------------------------------------------------------
def test_mismatched_collectives_name_group_and_sequence() -> None:
    job = two_rank_allreduce(coll1=pb.COLL_ALL_GATHER)
    with pytest.raises(CheckError, match="collective-sequence"):
        simulate(job)
    with pytest.raises(EchoError, match=r"mismatched collectives on group 1 .* sequence #0.*all_gather"):
        simulate(job, options=SimOptions(check=False))


def _two_groups_opposite_order():
    jb = JobBuilder("dl", 2)
    ga, gb_ = jb.group([0, 1], name="a"), jb.group([0, 1], name="b")
    for r in (0, 1):
        gb = GraphBuilder(f"g{r}")
        c = gb.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
        keys = ("a", "b") if r == 0 else ("b", "a")
        for k in keys:
            gb.collective(f"AR {k}", c, coll_type=pb.COLL_ALL_REDUCE, group=k, in_bytes=8, duration_ns=10)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"a": ga, "b": gb_})
    return jb.build()


def test_cyclic_wait_across_ranks_is_an_error_not_a_hang() -> None:
    job = _two_groups_opposite_order()
    assert check_job(job) == []  # every group sees the same sequence: only the order across groups is wrong
    with pytest.raises(EchoError, match=r"deadlock \(cyclic wait.*rank 0 waits at node 1 \(AR a\).*rank 1"):
        simulate(job)


def test_p2p_deadlock_both_ranks_receive_first() -> None:
    jb = JobBuilder("dl", 2)
    g = jb.group([0, 1], name="pp")
    for r in (0, 1):
        gb = GraphBuilder(f"g{r}")
        c = gb.stream(pb.STREAM_GPU_COMM, "p2p", device=0)
        gb.p2p(False, "recv", c, group="pp", peer=1 - r, nbytes=8, duration_ns=10)
        gb.p2p(True, "send", c, group="pp", peer=1 - r, nbytes=8, duration_ns=10)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"pp": g})
    job = jb.build()
    assert check_job(job) == []
    with pytest.raises(EchoError, match="deadlock .*recv from rank 1"):
        simulate(job)


def test_missing_member_collective_reports_who_never_arrives() -> None:
    jb = JobBuilder("x", 2)
    g = jb.group([0, 1], name="0")
    for r, n in ((0, 2), (1, 1)):
        gb = GraphBuilder(f"g{r}")
        c = gb.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
        for _ in range(n):
            gb.collective("AR", c, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=8, duration_ns=10)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"dp": g})
    job = jb.build()
    with pytest.raises(EchoError, match="rank 1 finished without issuing it"):
        simulate(job, options=SimOptions(check=False))


# -- symmetry ---------------------------------------------------------------------------------------
def dp_job(world: int = 8, coll_type: int = pb.COLL_ALL_REDUCE, root: int | None = None):
    """Data-parallel replicas sharing one graph: host launches, compute, a gradient all-reduce
    (or another collective)."""
    jb = JobBuilder("dp", world)
    jb.job.manifest.hardware.gpus_per_node = 4
    g = jb.group(list(range(world)), name="0")
    gb = GraphBuilder("replica")
    gb.declare_group("dp", world)
    cpu = gb.stream(pb.STREAM_CPU_THREAD, "main")
    s = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0)
    c = gb.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
    prev = None
    t = 0
    for i in range(4):
        lc = gb.cpu_op(f"launch k{i}", cpu, kind=pb.KIND_LAUNCH, start_ns=t, duration_ns=5)
        k = gb.compute(f"k{i}", s, start_ns=t + 10, duration_ns=100, deps=[(lc.id, pb.DEP_LAUNCH)])
        la = gb.cpu_op(f"launch ar{i}", cpu, kind=pb.KIND_LAUNCH, start_ns=t + 6, duration_ns=5)
        deps = [(la.id, pb.DEP_LAUNCH), (k.id, pb.DEP_SYNC)]
        prev = gb.collective(f"ar{i}", c, coll_type=coll_type, group="dp", in_bytes=1 << 20,
                             start_ns=t + 110, duration_ns=40, deps=deps,
                             **({} if root is None else {"root": root}))
        t += 20
    gb.cpu_op("sync", cpu, kind=pb.KIND_SYNC, start_ns=t, duration_ns=500, deps=[(prev.id, pb.DEP_SYNC)])
    jb.add_graph(gb.build())
    for r in range(world):
        jb.bind(r, "replica", {"dp": g})
    return jb.build()


def _per_rank(res) -> dict[int, dict]:
    return {r: {k: v for k, v in rr.to_json().items() if k != "simulated_as"} for r, rr in res.ranks.items()}


@pytest.mark.parametrize("mode", ["replay", "predict"])
def test_symmetric_replicas_are_simulated_once_with_the_same_answer(mode: str) -> None:
    job = dp_job()
    kw = {"comm_model": FakeComm(coll_ns=777)} if mode == "predict" else {}
    sym = simulate(job, mode, **kw)
    full = simulate(job, mode, options=SimOptions(symmetry=False), **kw)
    assert sym.simulated_ranks == 1 and full.simulated_ranks == 8
    assert _per_rank(sym) == _per_rank(full)
    assert sym.step_time_ns == full.step_time_ns
    assert full.events == 8 * sym.events


@pytest.mark.parametrize(("coll_type", "classes"), [(pb.COLL_BROADCAST, 1), (pb.COLL_REDUCE, 1),
                                                    (pb.COLL_GATHER, 8), (pb.COLL_SCATTER, 8)])
def test_a_root_splits_the_members_only_where_its_sizes_are_its_own(coll_type: int, classes: int) -> None:
    """A broadcast or reduce is priced the same for every member whichever is the root (the
    members stay one class: Megatron's per-micro-batch broadcast of the tokens keeps the
    tensor-parallel ranks one class, and their repeat blocks placed in closed form); a
    gather's or scatter's root is told apart."""
    job = dp_job(coll_type=coll_type, root=2)
    kw = {"comm_model": FakeComm(coll_ns=777)}
    sym = simulate(job, "predict", **kw)
    full = simulate(job, "predict", options=SimOptions(symmetry=False), **kw)
    assert sym.simulated_ranks == classes
    assert _per_rank(sym) == _per_rank(full)


def test_a_straggler_breaks_symmetry_correctly() -> None:
    job = dp_job()
    opts = {"stragglers": {3: 1.5}}
    sym = simulate(job, options=SimOptions(**opts))
    full = simulate(job, options=SimOptions(symmetry=False, **opts))
    assert sym.simulated_ranks == 2  # the straggler, and everybody else
    assert _per_rank(sym) == _per_rank(full)
    base = simulate(job)
    assert sym.step_time_ns > base.step_time_ns
    # every rank waits for the straggler: the last all-reduce ends together everywhere
    assert len({times(sym, r)["ar3"] for r in range(8)}) == 1
    assert len({sym.ranks[r].step_time_ns for r in range(8) if r != 3}) == 1
    assert sym.ranks[0].sync_wait_ns > base.ranks[0].sync_wait_ns


def test_3d_parallel_job_symmetry_is_exact() -> None:
    job = gpt_3d_job(2, 2, 2, microbatches=4, layers=2, gpus_per_node=2)
    assert check_job(job) == []
    sym = simulate(job)
    full = simulate(job, options=SimOptions(symmetry=False))
    assert sym.simulated_ranks == 2 and full.simulated_ranks == 8  # one per pipeline stage
    assert _per_rank(sym) == _per_rank(full)
    comm = FakeComm(coll_ns=5000, p2p_ns=3000)
    assert _per_rank(simulate(job, "predict", comm_model=comm)) == _per_rank(
        simulate(job, "predict", comm_model=comm, options=SimOptions(symmetry=False)))
    # the pipeline has a bubble: stage 0 idles while later stages work
    assert sym.ranks[0].idle_ns > 0


@pytest.mark.parametrize("tp,pp,dp,gpus_per_node", [(4, 2, 4, 8), (4, 2, 4, 6), (2, 3, 4, 5)])
def test_symmetry_is_exact_with_the_cc_model_irregular_placement_and_slowdown(tp, pp, dp, gpus_per_node) -> None:
    """TP groups that straddle nodes (6 or 5 GPUs per node) are priced differently: they
    must land in different classes, and the answer must not change."""
    from echo_et.models import comm
    from echo_et.models.slowdown import default_model

    job = gpt_3d_job(tp, pp, dp, microbatches=4, layers=2, gpus_per_node=gpus_per_node)
    kw = dict(comm_model=comm.CommModel.preset("a100-ib"), slowdown_model=default_model())
    sym = simulate(job, "predict", options=SimOptions(stragglers={3: 1.2}), **kw)
    full = simulate(job, "predict", options=SimOptions(stragglers={3: 1.2}, symmetry=False), **kw)
    assert _per_rank(sym) == _per_rank(full)
    assert sym.simulated_ranks <= full.simulated_ranks == tp * pp * dp


# -- override points --------------------------------------------------------------------------------
def test_a_what_if_subclass_overrides_one_method() -> None:
    class HalfComm(Predictor):
        def collective(self, call):
            return super().collective(call) // 2

    res = HalfComm(two_rank_allreduce(), comm_model=FakeComm(coll_ns=1000)).run()
    assert times(res, 0)["AR"] == (300, 800)


def test_errors_from_hooks_name_rank_and_node() -> None:
    class Broken(Simulator):
        def compute(self, node, measured_ns, rank):
            raise EchoError("no kernel model")

    with pytest.raises(EchoError, match=r"while simulating rank 0 node 1 \(K\): no kernel model"):
        Broken(two_rank_allreduce()).run()


# -- overlap slowdown --------------------------------------------------------------------------------
class LinearSlowdown:
    """factor = 1 + overlap_ratio (s = 1 for every kernel)."""

    def factor(self, node, duration_ns, overlap_ratio):
        return 1.0 + overlap_ratio


def test_slowdown_reaches_the_self_consistent_fixed_point() -> None:
    # K (100 ns isolated) runs beside a 50 ns all-reduce that starts with it. With s = 1,
    # its duration x satisfies x = 100 * (1 + 50 / x): x = 50 + sqrt(7500) = 136.6 ns.
    jb = JobBuilder("ov", 1)
    g = jb.group([0], name="0")
    gb = GraphBuilder("g")
    s, c = gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0), gb.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
    gb.compute("K", s, start_ns=0, duration_ns=100_000)
    gb.collective("AR", c, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=8, start_ns=0, duration_ns=50_000)
    jb.add_graph(gb.build())
    jb.bind(0, "g", {"dp": g})
    job = jb.build()
    res = simulate(job, "predict", comm_model=FakeComm(coll_ns=50_000), slowdown_model=LinearSlowdown(),
                   options=SimOptions(slowdown_iterations=30))
    k = times(res, 0)["K"]
    assert k[0] == 0 and abs((k[1] - k[0]) - 136_603) <= 50
    assert res.slowdown["applied"] and res.slowdown["converged"]
    off = simulate(job, "predict", comm_model=FakeComm(coll_ns=50_000))
    assert times(off, 0)["K"] == (0, 100_000) and off.slowdown == {"applied": False}


# -- timeline ---------------------------------------------------------------------------------------
def test_timeline_has_the_export_chrome_layout(tmp_path) -> None:
    import json

    from echo_et.converters import chrome

    job = dp_job(4)
    res = simulate(job)
    out = chrome.write_timeline(list(res.timeline_events()), tmp_path / "t", job=job)
    assert out["files"] == 4 and out["ranks"] == 4
    doc = json.loads((tmp_path / "t" / "rank-2.json").read_text())
    boxes = [e for e in doc["traceEvents"] if e["ph"] == "X" and not e["name"].startswith("ProfilerStep")]
    graph = job.graph("replica")
    assert len(boxes) == len(graph.nodes)
    ar = next(e for e in boxes if e["args"].get("op") == "ar0")
    assert ar["cat"] == "kernel" and ar["args"]["Collective name"] == "allreduce"
    assert ar["args"]["bytes"] == 1 << 20 and ar["args"]["seq"] == 0 and "wait_ns" in ar["args"]
    # the same processes, threads and names as the measured timeline of `export chrome`
    measured = chrome.kineto_traces(chrome.job_timeline(job), job)[2]
    def key(events):
        return {(e["pid"], e["tid"], e["name"]) for e in events if e["ph"] == "X"}
    assert key(measured["traceEvents"]) == key(doc["traceEvents"])
    assert [e for e in measured["traceEvents"] if e["ph"] == "M"] == [e for e in doc["traceEvents"] if e["ph"] == "M"]
    chrome.write_timeline(list(simulate(job).timeline_events()), tmp_path / "t2", job=job)
    assert (tmp_path / "t2" / "rank-2.json").read_bytes() == (tmp_path / "t" / "rank-2.json").read_bytes()


def test_symmetric_ranks_keep_their_own_groups_on_the_timeline() -> None:
    """Rank 5 shares rank 1's simulated timeline, but its collectives are on its own groups."""
    job = gpt_3d_job(2, 2, 2, microbatches=2, layers=1)
    res = simulate(job)
    assert res.ranks[5].simulated_as != 5
    ids = {e.args["group_id"] for e in res.timeline_events([5]) if "group_id" in e.args}
    mine = set(job.binding(5).groups.values())
    assert ids and ids <= mine
