"""Gloo (host) collectives: concurrent exchanges on their own streams, issued by their c10d
op like a launch; on small traces written here and on HTA's CPU-only trace."""

from __future__ import annotations

import json

import kineto_facts as facts
import pytest
from test_kineto_graph import convert, cpu, deps

from conftest import REPO, shared_path
from echo_et.ir import pb
from echo_et.sim import simulate

HTA = "traces/HolisticTraceAnalysis/tests/data"
FIXTURES = REPO / "fixtures"
GLOO_PG = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1],
            "backend_config": "cpu:gloo"}]


def _gloo_rank() -> list[dict]:
    """Two all-reduces issued 20 us apart run at the same time on gloo's two worker threads
    (tids 20 and 21); a third one later on the first worker."""
    def issue(ts, n, idx):
        return cpu("c10d::allreduce_", ts, 10, **{"Ev Idx": idx, "Input Dims": [[n]],
                                                   "Input type": ["float"]})

    def run(ts, dur, n, tid, idx):
        return cpu("gloo:all_reduce", ts, dur, cat="user_annotation", tid=tid,
                   **{"Ev Idx": idx, "Input Dims": [[n]], "Input type": ["float"]})

    return [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        issue(100, 256, 1), issue(120, 1024, 2), issue(600, 64, 3),
        run(105, 400, 256, 20, 4), run(125, 800, 1024, 21, 5), run(605, 100, 64, 20, 6),
    ]


def _write_job(tmp_path, evs=None):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps({
            "schemaVersion": 1, "traceEvents": evs if evs is not None else _gloo_rank(),
            "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2, "pg_config": GLOO_PG}}))
    return tmp_path


def test_concurrent_gloo_collectives_get_their_own_streams(tmp_path):
    job = convert(_write_job(tmp_path))
    g = job.graph_of(0)
    names = {s.id: s.name for s in g.header.streams}
    colls = sorted((n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE), key=lambda n: n.id)
    # Sequence numbers follow the issue order; bytes and times are the exchanges'.
    assert [(n.collective.seq, n.collective.in_bytes, n.start_ns // 1000) for n in colls] == \
        [(0, 1024, 105), (1, 4096, 125), (2, 256, 605)]
    assert [names[n.stream] for n in colls] == ["host-comm:0:20", "host-comm:0:21", "host-comm:0:20"]
    # Each waits for the op that issued it like a kernel for its launch (and keeps the
    # nesting link); the issuing ops are on the caller's thread.
    issuers = sorted((n for n in g.nodes if n.name == "c10d::allreduce_" and n.kind == pb.KIND_CPU_OP),
                     key=lambda n: n.start_ns)
    for c, op in zip(colls, issuers, strict=True):
        assert deps(c, pb.DEP_LAUNCH) == [op.id] and deps(c, pb.DEP_CONTROL) == [op.id]
        assert op.start_ns <= c.start_ns
    # Replay keeps them concurrent: the step lasts what it measured (serialized on one
    # stream, the second all-reduce would end at 505 + 800 = 1305 us).
    res = simulate(job)
    for r in (0, 1):
        assert res.ranks[r].step_time_ns == job.binding(r).measured_step_ns == 1_000_000


def test_a_group_on_one_thread_keeps_one_stream(tmp_path):
    """Without the concurrent exchange (worker 21 and its issuing op), the group's exchanges
    ran on one thread: one stream, named after the group alone."""
    evs = [e for e in _gloo_rank() if e["tid"] != 21 and e["args"]["Ev Idx"] != 2]
    job = convert(_write_job(tmp_path, evs))
    g = job.graph_of(0)
    (stream,) = {n.stream for n in g.nodes if n.kind == pb.KIND_COLLECTIVE}
    s = next(s for s in g.header.streams if s.id == stream)
    assert (s.name, s.kind, s.native_id) == ("host-comm:0", pb.STREAM_CPU_THREAD, 20)


@pytest.fixture(scope="module")
def cpu_only(tmp_path_factory):
    from echo_et.converters import ReadOptions, read

    (path,) = sorted(shared_path(f"{HTA}/cpu_only").glob("*.json.gz"))
    job = read([path], "kineto", ReadOptions())
    return path, job


def test_cpu_only_overlapping_exchanges_run_concurrently(cpu_only):
    """HTA's CPU-only trace: in the step two gloo all-reduces overlap on two worker threads.
    Each thread is a stream, so the replay reproduces the measured step (on one stream the
    simulator serialized them: 362 ms for 210 ms measured)."""
    path, job = cpu_only
    doc = facts.load(path)
    rank = doc["distributedInfo"]["rank"]
    win = facts.window(doc, job.manifest.step)
    gloo = sorted((e for e in facts.events(doc) if e["name"].startswith("gloo:")
                   and win[0] <= e["ts"] < win[1]), key=lambda e: e["ts"])
    overlapping = [(a, b) for i, a in enumerate(gloo) for b in gloo[i + 1:]
                   if b["ts"] < a["ts"] + a["dur"]]
    assert overlapping and all(a["tid"] != b["tid"] for a, b in overlapping)
    g = job.graph_of(rank)
    names = {s.id: s.name for s in g.header.streams}
    colls = sorted((n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE), key=lambda n: n.id)
    assert [names[n.stream] for n in colls] == [f"host-comm:0:{e['tid']}" for e in gloo]
    assert [n.collective.seq for n in colls] == list(range(len(gloo)))
    for sid in {n.stream for n in colls}:
        on = [n for n in colls if n.stream == sid]
        assert all(a.start_ns + a.duration_ns <= b.start_ns for a, b in zip(on, on[1:], strict=False))
    res = simulate(job)
    assert res.ranks[rank].step_time_ns == job.binding(rank).measured_step_ns


def _ring_rank(rank: int) -> list[dict]:
    """A 2-rank exchange as PyTorch 2.13 records an ``isend`` then ``irecv`` on gloo: the
    ``gloo:send`` span opens inside ``c10d::send`` and lasts until the work's wait, so the
    ``c10d::recv_`` issued meanwhile starts inside it (as in fixtures/traces/ddp_gloo4)."""
    peer = 1 - rank

    def p2p(name, ts, dur, idx):
        return cpu(name, ts, dur, **{"Ev Idx": idx, "Input Dims": [[[24]], [], [], []],
                                     "Input type": ["TensorList", "", "Scalar", "Scalar"],
                                     "Concrete Inputs": ["", "", str(peer), "0"]})

    def span(name, ts, dur, idx):
        return cpu(name, ts, dur, cat="user_annotation",
                   **{"Ev Idx": idx, "Input Dims": [[24]], "Input type": ["float"]})

    return [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        p2p("c10d::send", 100, 50, 1), span("gloo:send", 140, 400, 2),
        p2p("c10d::recv_", 200, 50, 3), span("gloo:recv", 240, 300, 4),
    ]


def test_async_gloo_send_span_does_not_swallow_the_recv(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps({
            "schemaVersion": 1, "traceEvents": _ring_rank(r),
            "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2, "pg_config": GLOO_PG}}))
    job = convert(tmp_path)   # checks p2p-match: every send meets its recv
    for r in (0, 1):
        g = job.graph_of(r)
        p2p = sorted((n for n in g.nodes if n.kind in (pb.KIND_SEND, pb.KIND_RECV)), key=lambda n: n.id)
        assert [(n.kind, n.p2p.peer, n.p2p.bytes, n.start_ns // 1000, n.duration_ns // 1000) for n in p2p] == \
            [(pb.KIND_SEND, 1 - r, 96, 140, 400), (pb.KIND_RECV, 1 - r, 96, 240, 300)]
        # The recv op is a child of the step, not of the send's exchange span.
        step = next(n for n in g.nodes if n.name == "ProfilerStep#1")
        recv_op = next(n for n in g.nodes if n.name == "c10d::recv_" and n.kind == pb.KIND_CPU_OP)
        assert deps(recv_op, pb.DEP_CONTROL) == [step.id]
        assert deps(p2p[1], pb.DEP_LAUNCH) == [recv_op.id]
    # The spans cross (gloo:send outlives c10d::send, c10d::recv_ starts inside it): the
    # host thread's boundaries are replayed in time order, so the step is the measured one.
    res = simulate(job)
    assert {r: res.ranks[r].step_time_ns for r in (0, 1)} == {r: job.binding(r).measured_step_ns for r in (0, 1)}


@pytest.mark.parametrize("folder", ["traces/ddp_gloo4", "kineto/gloo3"])
def test_real_gloo_traces_replay_their_measured_step_on_every_rank(folder):
    # 4 DDP processes whose step ends in a ring of isend/irecv (async gloo:send / gloo:recv
    # spans crossing c10d::send / c10d::recv_ on the main thread), and 3 processes with a
    # subgroup and point-to-point: replay gives every rank its ProfilerStep (it used to be
    # up to +20 % when crossing spans put a thread's boundaries out of time order).
    from echo_et.converters import ReadOptions, read

    path = FIXTURES / folder
    job = read(sorted(p for p in path.glob("*.json.gz") if ".et." not in p.name), "kineto", ReadOptions())
    res = simulate(job)
    for r in job.ranks():
        assert res.ranks[r].step_time_ns == job.binding(r).measured_step_ns > 0, r


def test_a_span_outlasting_its_parent_contains_only_what_the_parent_does():
    from echo_et.converters.kineto.events import Ev
    from echo_et.converters.kineto.nesting import assign_parents

    def ev(idx, ts, dur):
        return Ev(1, f"op{idx}", (1, 1), ts, dur, -1, idx, None)

    outer, op, async_span, later, inner = ev(0, 0, 100), ev(1, 10, 20), ev(2, 25, 60), ev(3, 40, 5), ev(4, 27, 2)
    parents, overlaps = assign_parents([outer, op, async_span, later, inner])
    assert {k: v.idx for k, v in parents.items()} == {1: 0, 2: 1, 3: 0, 4: 2}
    assert [e.idx for e in overlaps] == [2]
