"""`echo-et export simai`: a rank's step as a SimAI / AICB workload.

The strongest check is the round trip: every SimAI workload under ../shared/data, read,
simulated, exported and read back, simulates to the same step, with the same collectives
and the same compute. Traced fixtures check the mapping of a real step (forward and
backward rows, blocking and background collectives, pipeline transfers), and synthetic
timelines pin each rule of the mapping."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import shared_path, simai_workloads
from echo_et.cli.main import app
from echo_et.cli.sim_cmds import check_mode_options, run_simulation
from echo_et.converters import ReadOptions, read
from echo_et.converters.simai_writer import plan
from echo_et.errors import EchoError
from echo_et.ir import check_job
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent
from echo_et.sim import SimOptions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jobs"
PRESET = "a100-ib"


def _world(path: Path) -> int | None:
    return None if "all_gpus:" in path.read_text().splitlines()[0] else 16


def _export(job_path: Path, out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(app, ["export", "simai", str(job_path), "-o", str(out), "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _predict(job) -> int:
    """The step ``export simai --mode predict --preset PRESET --no-slowdown`` simulates."""
    cluster = check_mode_options("predict", profile=None, preset=PRESET, slowdown=None, gpu=None,
                                 gpus_per_node=None, intra_bw=None, inter_bw=None, nic_bw=None,
                                 compute_profile=None)
    _, res, _ = run_simulation(job, "predict", SimOptions(), cluster, profile=None, preset=PRESET,
                               slowdown=None, no_slowdown=True, compute_profile=None)
    return res.step_time_ns


def _collectives(job, rank: int) -> Counter:
    g = job.graph_of(rank)
    return Counter((n.collective.type, n.collective.in_bytes, n.collective.out_bytes)
                   for n in g.nodes if n.kind == pb.KIND_COLLECTIVE)


def _compute_ns(job, rank: int) -> int:
    return sum(n.duration_ns for n in job.graph_of(rank).nodes if n.kind == pb.KIND_COMPUTE)


# -- round trip on SimAI's and AICB's own workloads ------------------------------------------
@pytest.mark.parametrize("rel", simai_workloads())
def test_a_simai_workload_read_exported_and_read_back_simulates_to_the_same_step(rel, tmp_path):
    path = shared_path(rel)
    world = _world(path)
    job = read([path], "simai", ReadOptions(world_size=world))
    job_dir = tmp_path / "job"
    from echo_et.ir import save_job

    save_job(job, job_dir)
    out = tmp_path / "w.txt"
    # without the overlap slowdown: the file's compute times are then the workload's own (with
    # it, compute that ran under communication is written as long as it took, slowed)
    report = _export(job_dir, out, "--mode", "predict", "--preset", PRESET, "--no-slowdown")
    back = read([out], "simai", ReadOptions(world_size=world))
    rank = report["rank"]
    step = _predict(job)
    assert report["step_ns"] == step
    assert report["regrouped"] == []           # SimAI's own groups, read back as SimAI builds them
    # SimAI's order with the exported times is what echo-et simulates of the file read back
    assert _predict(back) == report["expected_step_ns"] == step
    # every collective SimAI knows survives with its sizes; the others (broadcasts) became
    # compute time, counted
    dropped = report["dropped"]
    kept = Counter({k: v for k, v in _collectives(job, rank).items() if k[0] != pb.COLL_BROADCAST})
    assert _collectives(back, rank) == kept
    broadcasts = sum(v for k, v in _collectives(job, rank).items() if k[0] == pb.COLL_BROADCAST)
    assert dropped.get("simai_comm_type_not_in_simai", 0) == broadcasts
    assert set(dropped) <= {"simai_comm_type_not_in_simai"}
    as_compute = report["time"].get("simai_comm_type_not_in_simai_ns", 0)
    assert _compute_ns(back, rank) == _compute_ns(job, rank) + as_compute == report["time"]["compute_ns"]
    head = out.read_text().splitlines()[0].split()
    assert head[0] == "HYBRID_TRANSFORMER_FWD_IN_BCKWD"
    assert head[head.index("all_gpus:") + 1] == str(job.world_size)
    assert head[head.index("model_parallel_NPU_group:") + 1] == str(job.manifest.layout.tp or 1)


# -- traced fixtures ----------------------------------------------------------------------------
def test_a_pipeline_rank_becomes_simai_rows_without_its_pipeline_waits(tmp_path):
    out = tmp_path / "w.txt"
    r = _export(FIXTURES / "gpt-tp2-pp2-dp2", out, "--mode", "predict", "--preset", PRESET, "--rank", "0")
    lay = r["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["ga"], lay["world_size"]) == (2, 2, 2, 4, 8)
    assert lay["pp_comm"] > 0                       # a stage's activation message, in the header
    t = r["time"]
    assert t["pipeline_wait_ns"] > 0
    # the rows hold the rank's time but its waits for pipeline neighbours (SimAI adds its bubble)
    assert t["compute_ns"] + t["comm_blocking_ns"] + t["pipeline_wait_ns"] == t["rank_step_ns"]
    assert r["expected_step_ns"] == t["rank_step_ns"] - t["pipeline_wait_ns"]
    assert r["dropped"] == {"simai_pipeline_transfer_not_modelled": 8}    # 4 micro-batches, 2 ways
    # Megatron's DP groups (ranks TP apart) are not SimAI's (TP x PP apart): said, not hidden
    assert r["regrouped"] == ["dp"]
    job = read([FIXTURES / "gpt-tp2-pp2-dp2"], None, ReadOptions())
    tp = sum(1 for n in job.graph_of(0).nodes
             if n.kind == pb.KIND_COLLECTIVE and n.collective.group == "tp")
    assert r["mapped"] == {"all_reduce/tp": tp, "all_reduce/dp": 1}
    rows = [ln.split("\t") for ln in out.read_text().splitlines()[2:]]
    assert len(rows) == r["lines"] and all(len(x) == 12 for x in rows)
    # TP all-reduces in the forward and input-gradient columns, the gradient all-reduce on DP
    # (written as SimAI's DP-within-EP group, the DP group when EP is 1, in a blocking column:
    # the optimizer waited for it)
    tokens = Counter(x[3] for x in rows) + Counter(x[6] for x in rows) + Counter(x[9] for x in rows)
    assert tokens["ALLREDUCE"] == tp and tokens["ALLREDUCE_DP_EP"] == 1
    # the same input gives the same bytes
    again = tmp_path / "again.txt"
    _export(FIXTURES / "gpt-tp2-pp2-dp2", again, "--mode", "predict", "--preset", PRESET, "--rank", "0")
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.parametrize("name", ["gpt-dp4-zero1", "ddp-dp4"])
def test_a_traced_data_parallel_step_read_back_simulates_to_the_expected_step(name, tmp_path):
    out = tmp_path / "w.txt"
    r = _export(FIXTURES / name, out, "--mode", "predict", "--preset", PRESET, "--no-slowdown")
    back = read([out], "simai", ReadOptions())
    assert back.world_size == 4
    assert _predict(back) == r["expected_step_ns"] == r["step_ns"]


def test_replay_keeps_the_measured_step(tmp_path):
    r = _export(FIXTURES / "gpt-dp4-zero1", tmp_path / "w.txt")
    assert r["mode"] == "replay" and r["expected_step_ns"] == r["time"]["rank_step_ns"] == r["step_ns"]


# -- the mapping's rules, on synthetic timelines ------------------------------------------------
@pytest.fixture(scope="module")
def tp2_job(tmp_path_factory):
    """A SimAI-read Job of 8 ranks, TP 2 (so DP 4), for its groups and layout."""
    p = tmp_path_factory.mktemp("job") / "w.txt"
    p.write_text("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 all_gpus: 8\n1\n"
                 "a -1 5 ALLREDUCE 64 5 ALLREDUCE 64 5 ALLREDUCE 64 0\n")
    return read([p], "simai", ReadOptions())


def _gid(job, key: str) -> int:
    return job.resolve_group(0, key).id


def _comp(t0, t1, phase="forward", name="gemm"):
    return TimelineEvent(rank=0, track="compute", name=name, start_ns=t0, duration_ns=t1 - t0,
                         kind=pb.KIND_COMPUTE, args={"phase": phase})


def _coll(job, t0, t1, key, typ="all_reduce", nbytes=1024, wait=0, out_bytes=None):
    args = {"type": typ, "bytes": nbytes, "out_bytes": out_bytes or nbytes, "group": key,
            "group_id": _gid(job, key), "wait_ns": wait}
    return TimelineEvent(rank=0, track=f"comm:{key}", name=typ, start_ns=t0, duration_ns=t1 - t0,
                         kind=pb.KIND_COLLECTIVE, args=args)


def _halves(w):
    return [(name, f and (f.compute_ns, f.comm and f.comm.token),
             b and (b.compute_ns, b.comm and b.comm.token, b.wg_compute_ns, b.wg_comm and b.wg_comm.token))
            for name, f, b in w.lines]


def test_blocking_and_background_collectives_land_in_simais_columns(tp2_job):
    j = tp2_job
    ev = [
        _comp(0, 100), _coll(j, 100, 130, "tp"),                        # forward, waited for
        _comp(130, 200, "backward"), _coll(j, 200, 220, "tp"),          # backward, waited for
        _comp(220, 300, "backward"), _coll(j, 300, 400, "dp"),          # gradients, in the background
        _comp(300, 380, "backward"),                                   # ... while compute runs on
        _comp(380, 390, "backward", "tail"),
    ]
    w = plan(ev, j, 0)
    # 1 forward row, 2 backward rows; the backward runs the lines from the last one
    lines = _halves(w)
    assert len(lines) == 2 and lines[0][1] == (100, "ALLREDUCE") and lines[1][1] is None
    backward = [b for _, _, b in reversed(lines) if b is not None]
    assert backward == [(70, "ALLREDUCE", 80, "ALLREDUCE"), (90, None, 0, None)]
    assert w.time["comm_blocking_ns"] == 50 and w.time["comm_background_ns"] == 100
    # the step ends when the background all-reduce does: the 10 ns after the tail kernel
    # are its wait, which SimAI runs itself, not compute
    assert w.time["idle_behind_background_comm_ns"] == 10
    assert w.time["rank_step_ns"] == 400 and w.expected_step_ns() == 400


def test_a_collective_is_waited_for_only_if_nothing_of_the_rank_ran_through_it(tp2_job):
    j = tp2_job
    # a long kernel runs through the DP all-reduce: nothing waited for it
    w = plan([_comp(0, 10), _coll(j, 10, 50, "dp"), _comp(5, 80, "backward")], j, 0)
    assert w.time.get("comm_background_ns") == 40 and "comm_blocking_ns" not in w.time
    # a collective that starts when the one before it on its own stream ends only queued there:
    # it does not make the first one "waited for"
    w = plan([_comp(0, 10, "backward"), _coll(j, 10, 50, "dp"), _coll(j, 50, 60, "dp"),
              _comp(20, 30, "backward")], j, 0)
    assert w.time["comm_background_ns"] == 50


def test_what_simai_cannot_hold_stays_time_and_is_counted(tp2_job):
    j = tp2_job
    # a broadcast (SimAI ignores it) waited for: its time stays, as compute
    w = plan([_comp(0, 10), _coll(j, 10, 30, "tp", typ="broadcast"), _comp(30, 40)], j, 0)
    assert w.dropped == {"simai_comm_type_not_in_simai": 1}
    assert w.time["compute_ns"] == 40 == w.expected_step_ns()
    # a TP collective in the background: SimAI's weight-gradient column cannot name TP
    w = plan([_comp(0, 10, "backward"), _coll(j, 10, 30, "tp"), _comp(12, 40, "backward")], j, 0)
    assert w.dropped == {"simai_comm_made_blocking": 1}
    assert [b.comm.token for _, _, b in w.lines if b is not None and b.comm] == ["ALLREDUCE"]


def test_a_send_recv_wait_outside_a_pipeline_stays_time(tp2_job):
    # SimAI has no send/recv rows; without pipeline stages no bubble of SimAI's stands for the
    # wait, so it stays (as compute), counted
    recv = TimelineEvent(rank=0, track="p2p", name="recv", start_ns=10, duration_ns=30, kind=pb.KIND_RECV,
                         args={"bytes": 4096})
    w = plan([_comp(0, 10), recv, _comp(40, 50)], tp2_job, 0)
    assert w.dropped == {"simai_send_recv_not_in_simai": 1}
    assert w.time["simai_send_recv_not_in_simai_ns"] == 30
    assert w.time["compute_ns"] == 50 == w.expected_step_ns() and "pipeline_wait_ns" not in w.time
    assert w.pp_comm == 0


def test_an_all_gathers_simai_size_is_its_output(tp2_job):
    j = tp2_job
    w = plan([_comp(0, 10), _coll(j, 10, 20, "tp", typ="all_gather", nbytes=512, out_bytes=1024),
              _comp(20, 30)], j, 0)
    assert w.lines[0][1].comm.token == "ALLGATHER" and w.lines[0][1].comm.nbytes == 1024


def test_a_pipeline_message_simai_cannot_hold_is_refused(tmp_path):
    job = read([FIXTURES / "gpt-tp2-pp2-dp2"], None, ReadOptions())
    g = job.resolve_group(0, "pp")
    send = TimelineEvent(rank=0, track="p2p", name="send", start_ns=10, duration_ns=5, kind=pb.KIND_SEND,
                         args={"bytes": 1 << 31, "group": "pp", "group_id": g.id})
    with pytest.raises(EchoError, match="32-bit"):
        plan([_comp(0, 10), send, _comp(15, 20)], job, 0)


def test_a_rank_with_nothing_on_its_timeline_is_an_error(tp2_job):
    with pytest.raises(EchoError, match="nothing on its timeline"):
        plan([], tp2_job, 0)


# -- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--rank", "9"], "--rank 9: not a rank of the job (world size 4)"),
    (["--preset", PRESET], "only apply with --mode predict"),
    (["--mode", "fast"], "--mode 'fast': use replay or predict"),
])
def test_bad_options_are_one_line_and_write_nothing(args, message, tmp_path):
    out = tmp_path / "w.txt"
    res = CliRunner().invoke(app, ["export", "simai", str(FIXTURES / "ddp-dp4"), "-o", str(out), *args])
    assert res.exit_code == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_output_never_replaces_the_input(tmp_path):
    src = shared_path("workloads/SimAI/example/microAllReduce.txt")
    mine = tmp_path / "w.txt"
    mine.write_bytes(src.read_bytes())
    res = CliRunner().invoke(app, ["export", "simai", str(mine), "-o", str(mine)])
    assert res.exit_code == 2 and "would overwrite the input" in res.stderr
    assert mine.read_bytes() == src.read_bytes()
    res = CliRunner().invoke(app, ["export", "simai", str(FIXTURES / "ddp-dp4"), "-o",
                                   str(tmp_path / "missing" / "w.txt")])
    assert res.exit_code == 2 and "does not exist" in res.stderr


def test_a_meta_device_trace_is_exported_from_its_prediction(tmp_path):
    """A Job traced on the meta device has no measured time: replay would write a workload of
    zeros, so it is refused with the way out; predict prices it."""
    res = CliRunner().invoke(app, ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32",
                                   "--global-batch", "4", "--tp", "2", "--dp", "2", "--gpu", "a100",
                                   "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "w.txt"
    res = CliRunner().invoke(app, ["export", "simai", str(tmp_path / "p" / "job"), "-o", str(out)])
    assert res.exit_code == 2 and "no measured times" in res.stderr and "--mode predict" in res.stderr
    assert not out.exists()
    r = _export(tmp_path / "p" / "job", out, "--mode", "predict", "--gpu", "a100")
    assert r["step_ns"] > 0 and r["time"]["rank_step_ns"] == r["step_ns"]
    assert r["mapped"].get("all_reduce/tp", 0) > 0
    head = out.read_text().splitlines()[0].split()
    assert head[head.index("model_parallel_NPU_group:") + 1] == "2" and head[head.index("all_gpus:") + 1] == "4"


# -- any timeline: a file SimAI's reader takes -----------------------------------------------------
_FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
_EVENT = st.tuples(
    st.sampled_from(["compute", "tp", "dp", "tp-broadcast", "recv"]),
    st.integers(0, 2_000), st.integers(0, 500),
    st.sampled_from(["forward", "backward", ""]),
    st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]),
    st.integers(0, 1 << 20),
)


@_FUZZ
@given(events=st.lists(_EVENT, min_size=1, max_size=40))
def test_any_timeline_gives_a_workload_simais_reader_takes(tp2_job, events, tmp_path):
    ev = []
    for what, t0, dur, phase, typ, nbytes in events:
        if what == "compute":
            ev.append(_comp(t0, t0 + dur, phase))
        elif what == "recv":
            ev.append(TimelineEvent(rank=0, track="p2p", name="recv", start_ns=t0, duration_ns=dur,
                                    kind=pb.KIND_RECV, args={"bytes": nbytes}))
        else:
            key = what.split("-")[0]
            ev.append(_coll(tp2_job, t0, t0 + dur, key, typ="broadcast" if "broadcast" in what else typ,
                            nbytes=nbytes, out_bytes=nbytes * 2))
    w = plan(ev, tp2_job, 0)
    step = max(e.start_ns + e.duration_ns for e in ev) - min(e.start_ns for e in ev)
    assert w.time["rank_step_ns"] == step
    assert 0 <= w.time["compute_ns"] <= step and w.expected_step_ns() >= w.time["compute_ns"]
    path = tmp_path / "w.txt"
    path.write_text(w.text())
    rows = path.read_text().splitlines()
    assert int(rows[1]) == len(rows) - 2 == len(w.lines) and all(len(r.split("\t")) == 12 for r in rows[2:])
    back = read([path], "simai", ReadOptions())
    assert check_job(back) == []
    # every collective written is one the file read back holds, on the group it was matched to
    written = sum(v for v in w.mapped.values())
    assert sum(1 for n in back.graph_of(0).nodes if n.kind == pb.KIND_COLLECTIVE) == written
