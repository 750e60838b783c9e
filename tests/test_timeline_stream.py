"""``write_timeline`` streams: each event is read once, kept in a scratch file beside the
output and a few numbers in memory, and its box is made again as it is written, in the trace's
order. The bytes are those of ``write_timeline_whole`` (every event, box and line held, then
sorted), on every form (folder, one file, gzip), for simulated Jobs (the fixtures, a traced
Megatron GPT whose repeat blocks are placed in closed form, a bounded prefix of it) and for
hand-made events built to hit the writer's ties (equal times, names and durations, a launch with
several kernels on one instant, duplicate launch ids, colliding process ids in one file).
``simulate --timeline --max-output`` estimates what ``--timeline-events`` keeps."""

from __future__ import annotations

import enum
import json
import random
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.converters.chrome import write_timeline, write_timeline_whole
from echo_et.ir import load_job, save_job
from echo_et.ir.budget import estimate_output
from echo_et.ir.schema import pb
from echo_et.ir.timeline import TimelineEvent, TimelineStream
from echo_et.sim import simulate
from echo_et.sim.timeline import first_start, timeline_events, window_end

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jobs"
FORMS = ["tl", "one.json", "one.json.gz"]
runner = CliRunner()


def _files(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {"": root.read_bytes()}
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _same(tmp: Path, make, dest: str, job=None, origin: int | None = None, meta=None) -> dict:
    """Write ``make()`` streamed and whole; both the same bytes and summary."""
    a = write_timeline(make(), tmp / "streamed" / dest, job=job, metadata=meta, origin_ns=origin)
    b = write_timeline_whole(list(make()), tmp / "whole" / dest, job=job, metadata=meta)
    fa, fb = _files(tmp / "streamed" / dest), _files(tmp / "whole" / dest)
    assert fa and fa == fb
    assert {**a, "output": ""} == {**b, "output": ""}
    return a


# -- simulated Jobs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dest", FORMS)
@pytest.mark.parametrize("name", ["ddp-dp4", "gpt-dp4-zero1", "gpt-tp2-pp2-dp2"])
def test_fixture_timelines_are_the_whole_writer_s(name, dest, tmp_path) -> None:
    job = load_job(FIXTURES / name)
    res = simulate(job)
    meta = {"world_size": job.world_size, "simulated": res.mode}
    # with the origin known beforehand (rank files written as each rank ends) and without
    origin = first_start(res)
    assert origin == min(e.start_ns for e in timeline_events(res))
    _same(tmp_path / "known", lambda: timeline_events(res), dest, job, origin, meta)
    got = _same(tmp_path / "found", lambda: timeline_events(res, [1, 3]), dest, job, None, meta)
    assert got["ranks"] == 2


@pytest.fixture(scope="module")
def traced_gpt():
    """A traced Megatron GPT, TP1 x PP4 x DP2, 16 micro-batches per pipeline and
    recomputation, predicted with its repeat blocks placed in closed form."""
    pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.cli.cluster_opts import cluster_from_options
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import predict_job, trace_row

    row = {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 1, "vocab": 256,
           "global_batch": 32, "tp": 1, "pp": 4, "dp": 2}
    opts = ConfigSweepOptions(cluster=cluster_from_options("a100", 8, None, "800Gb/s/node"), recompute=True)
    job = trace_row(row, opts, jobs=1)
    res, timed = predict_job(job, opts, repeats=True)
    assert any(st.blocks is not None for st in res.timeline.states)   # placed in closed form
    return res, timed


@pytest.mark.parametrize("dest", FORMS)
def test_traced_gpt_timeline_is_the_whole_writer_s(traced_gpt, dest, tmp_path) -> None:
    res, job = traced_gpt
    ranks = [members[0] for _, members in res.rank_classes()]
    _same(tmp_path / "all", lambda: timeline_events(res), dest, job, first_start(res), {"x": 1})
    # a bounded prefix, as `simulate --timeline-events` and `predict` write it
    until, total = window_end(res, ranks, 700)
    assert until is not None and total > 700
    origin = first_start(res, ranks, until_ns=until)
    assert origin == min(e.start_ns for e in timeline_events(res, ranks, until_ns=until))
    got = _same(tmp_path / "prefix", lambda: timeline_events(res, ranks, until_ns=until), dest, job, origin)
    assert 0 < got["events"] <= 700


# -- hand-made events: the writer's ties -----------------------------------------------------------
class _Word(enum.StrEnum):   # marshal refuses a str subclass: the record is pickled
    A = "a"


HOST = TimelineStream(1, "main", pb.STREAM_CPU_THREAD, -1, 4242)
GPU = [TimelineStream(7, "compute", pb.STREAM_GPU_COMPUTE, 0, 7), TimelineStream(8, "comm", pb.STREAM_GPU_COMM, 0, 0),
       TimelineStream(9, "copy", pb.STREAM_GPU_COPY, 1, 0)]


def _random_events(rng: random.Random, ranks: list[int], n: int, *, far_device: bool = False) -> list[TimelineEvent]:
    """Boxes on few instants, names and durations (many ties), launches with several
    kernels and kernels of launches that are not there, repeated launch ids, an odd box
    named ProfilerStep, args marshal refuses; ranks interleaved."""
    out = []
    gpus = [*GPU, TimelineStream(10, "far", pb.STREAM_GPU_COMPUTE, 100, 0)] if far_device else GPU
    for k in range(n):
        rank = rng.choice(ranks)
        start = rng.choice([0, 1000, 1000, 2500, 7000, 7001]) + rng.choice([0, 0, 999_999_999])
        dur = rng.choice([0, 0, 1, 500, 1000])
        node = rng.randint(1, 12)
        what = rng.random()
        if what < 0.35:
            out.append(TimelineEvent(rank, "main", rng.choice(["cudaLaunchKernel", "cudaMemcpyAsync"]), start, dur,
                                     "cuda_runtime", 0, {"id": node}, pb.KIND_LAUNCH, HOST, node))
        elif what < 0.75:
            s = rng.choice(gpus)
            cat = "gpu_memcpy" if s.kind == pb.STREAM_GPU_COPY else "kernel"
            out.append(TimelineEvent(rank, s.name, rng.choice(["gemm", "add", "ProfilerStep#9"]), start, dur, cat,
                                     2, {"id": 100 + k}, pb.KIND_COMPUTE, s, 100 + k, rng.randint(0, 14)))
        elif what < 0.85:
            s = GPU[1]
            out.append(TimelineEvent(rank, s.name, "all_reduce 4 MB", start, dur, "kernel", 2,
                                     {"op": rng.choice(["nccl:all_reduce", "ncclDevKernel_AllReduce"]),
                                      "type": "all_reduce", "bytes": 4 << 20, "dtype": "float32", "group_id": 0},
                                     pb.KIND_COLLECTIVE, s, 200 + k, rng.randint(0, 14)))
        elif what < 0.92:
            out.append(TimelineEvent(rank, "main", "aten::mm", start, dur, "cpu_op", 0,
                                     {"id": 300 + k, "tag": _Word.A, "device": 3}, pb.KIND_COMPUTE, HOST, 300 + k))
        else:
            out.append(TimelineEvent(rank, "gloo", "gloo:send", start, dur, "cpu_op", 1,
                                     {"bytes": 8, "group_peer": 1}, pb.KIND_SEND, None, 400 + k))
    return out


@pytest.mark.parametrize("dest", FORMS)
def test_hand_made_events_with_many_ties(dest, tmp_path) -> None:
    rng = random.Random(20261205)
    for case in range(12):
        events = _random_events(rng, [0, 1, 2] if case % 3 else [5], rng.choice([1, 5, 60, 400]),
                                far_device=case % 4 == 1)
        _same(tmp_path / str(case), lambda events=events: iter(events), dest, None, None, {"case": case})


def test_origin_ns_is_checked(tmp_path) -> None:
    job = load_job(FIXTURES / "ddp-dp4")
    res = simulate(job)
    origin = first_start(res)
    for wrong in (origin + 1, origin - 1):
        with pytest.raises(ValueError, match="origin_ns"):
            write_timeline(timeline_events(res), tmp_path / "tl", job=job, origin_ns=wrong)
        assert not (tmp_path / "tl").exists() and list(tmp_path.iterdir()) == []


# -- nothing held -----------------------------------------------------------------------------------
def _watched(events: list[TimelineEvent], seen: list, on_rank=None) -> Iterator[TimelineEvent]:
    """``events`` one at a time, checking as each is asked for that every event given
    before the last one is gone (the writer keeps none of them); ``on_rank(rank)`` when
    the second event of a rank is asked for (the writer has seen that its rank began)."""
    rank, k = None, 0
    while events:
        e = events.pop(0)
        alive = [w for w in seen[:-1] if w() is not None]
        assert not alive, f"{len(alive)} of {len(seen) - 1} events given are still held"
        rank, k = (rank, k + 1) if e.rank == rank else (e.rank, 0)
        if on_rank is not None and k == 1:
            on_rank(rank)
        seen.append(weakref.ref(e))
        yield e
        del e


@pytest.mark.parametrize("dest", FORMS)
def test_the_writer_holds_no_event(dest, tmp_path) -> None:
    job = load_job(FIXTURES / "ddp-dp4")
    res = simulate(job)
    events = list(timeline_events(res))
    n = len(events)
    seen: list = []
    ended: list[int] = []

    def on_rank(rank: int) -> None:
        # with origin_ns a folder's rank file is there before the next rank's first event is read
        if dest == "tl" and ended:
            assert list(tmp_path.glob(f"*/rank-{ended[-1]}.json")), f"rank {ended[-1]} not written yet"
        ended.append(rank)

    got = write_timeline(_watched(events, seen, on_rank), tmp_path / dest, job=job, origin_ns=first_start(res))
    assert len(seen) == n == got["events"] and ended == [0, 1, 2, 3]
    assert _files(tmp_path / dest) == _files(_whole(res, job, tmp_path / "whole" / dest))


def _whole(res, job, dest: Path) -> Path:
    write_timeline_whole(timeline_events(res), dest, job=job)
    return dest


# -- --max-output and --timeline-events ------------------------------------------------------------
def test_the_output_estimate_keeps_the_bound() -> None:
    job = load_job(FIXTURES / "ddp-dp4")
    whole = estimate_output(job, "chrome")
    bounded = estimate_output(job, "chrome", max_nodes=100)
    assert bounded.of == whole.nodes > 100 == bounded.nodes and bounded.bytes == 100 * whole.bytes // whole.nodes
    assert "the first 100 of" in bounded.describe()
    assert estimate_output(job, "chrome", max_nodes=whole.nodes) == whole


def test_max_output_estimates_what_timeline_events_keeps(tmp_path) -> None:
    job = tmp_path / "job"
    save_job(load_job(FIXTURES / "ddp-dp4"), job)
    nodes = estimate_output(load_job(job), "chrome").nodes   # >= 183,200 bytes; 600 of them 120,000

    def sim(*extra: str):
        out = tmp_path / "tl"
        return runner.invoke(app, ["simulate", str(job), "--timeline", str(out), "--max-output", "100KB", *extra])

    assert nodes == 916
    for refused, words in ((sim(), "at least 0.2 MB (916 nodes over 4 ranks"),
                           (sim("--timeline-events", "600"), "about 0.1 MB (the first 600 of 916 nodes over 4 ranks")):
        err = refused.stderr.strip().splitlines()
        assert refused.exit_code == 2 and len(err) == 1 and words in err[0], refused.output
        assert "the limit is 0.1 MB" in err[0] and not (tmp_path / "tl").exists()
    ok = sim("--timeline-events", "200", "--json")
    assert ok.exit_code == 0, ok.output
    w = json.loads(ok.stdout)["timeline"]["window"]
    assert 0 < w["events"] <= 200 and w["of"] == nodes and (tmp_path / "tl").is_dir()
