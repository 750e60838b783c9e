"""Timeline export in Kineto's trace schema: layout, ns precision, collective metadata,
correlation, determinism, both forms (a folder of rank files, one file), CLI."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from test_astra_sim_support import uniform_job
from typer.testing import CliRunner

from conftest import shared_path, unpack
from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.converters.chrome import (
    HOST_PID_BASE,
    TimelineEvent,
    chrome_trace,
    job_timeline,
    kineto_traces,
    write,
    write_timeline,
    write_timeline_whole,
)
from echo_et.errors import EchoError
from echo_et.ir import save_job
from echo_et.ir.schema import pb

NCCL_KERNEL = re.compile(r"^nccl.*Kernel")   # what HTA (and our reader) call communication


def _build(gb, r, s):
    op = gb.cpu_op("aten::mm", s["cpu"], start_ns=1_000_000 + 1_234, duration_ns=10_001)
    launch = gb.cpu_op("cudaLaunchKernel", s["cpu"], kind=pb.KIND_LAUNCH, start_ns=1_000_000 + 2_000,
                       duration_ns=3_000, deps=[(op.id, pb.DEP_CONTROL)])
    k = gb.compute("gemm", s["compute"], start_ns=1_000_000 + 5_678, duration_ns=12_345,
                   deps=[(launch.id, pb.DEP_LAUNCH)])
    gb.collective("nccl:all_reduce", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world",
                  in_bytes=3 << 20, dtype="bf16", start_ns=1_000_000 + 20_000 + r, duration_ns=99_999,
                  deps=[k.id])
    gb.p2p(r == 0, "nccl:send" if r == 0 else "nccl:recv", s["comm"], group="world",
           peer=1 - r, nbytes=512, start_ns=1_200_000, duration_ns=1)


def _boxes(trace, *, steps: bool = False):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"
            and (steps or not e["name"].startswith("ProfilerStep#"))]


def test_per_rank_trace_is_kineto_schema():
    job = uniform_job(2, _build)
    job.manifest.bindings[1].clock_offset_ns = 7   # rank 1's clock is 7 ns behind the job clock
    traces = kineto_traces(job_timeline(job), job)
    assert sorted(traces) == [0, 1]
    t0, t1 = traces[0], traces[1]
    assert t0["schemaVersion"] == 1 and t0["displayTimeUnit"] == "ms"
    assert t0["baseTimeNanoseconds"] == 1_001_234            # the job-clock instant of ts 0
    info = t1["distributedInfo"]
    assert (info["rank"], info["world_size"], info["backend"]) == (1, 2, "nccl")
    assert info["pg_config"] == [{"pg_name": "world0", "pg_desc": "world0", "backend_config": "cuda:nccl",
                                  "pg_size": 2, "ranks": [0, 1]}]
    boxes = _boxes(t1)
    cats = Counter(b["cat"] for b in boxes)
    assert cats == {"cpu_op": 1, "cuda_runtime": 1, "kernel": 3}
    gemm = next(b for b in boxes if b["name"] == "gemm")
    assert gemm["ts"] == 4.451 and gemm["dur"] == 12.345       # µs with ns kept: 5_678 + 7 - 1_234
    assert gemm["pid"] == 0 and gemm["tid"] == gemm["args"]["stream"] > 0 and gemm["args"]["device"] == 0
    launch = next(b for b in boxes if b["cat"] == "cuda_runtime")
    assert launch["pid"] == HOST_PID_BASE + 1 and launch["args"]["correlation"] == gemm["args"]["correlation"] > 0
    # past int16, so that HTA (pandas 3) loads a trace of more than 32,767 events (CORRELATION_BASE)
    assert launch["args"]["correlation"] > 32_767
    flows = [e for e in t1["traceEvents"] if e["ph"] in ("s", "f")]
    assert {(e["ph"], e["id"]) for e in flows} == {("s", launch["args"]["correlation"]),
                                                   ("f", launch["args"]["correlation"])}
    ar = next(b for b in boxes if b["args"].get("Collective name") == "allreduce")
    assert NCCL_KERNEL.match(ar["name"]) and ar["args"]["op"] == "nccl:all_reduce"
    assert ar["args"]["In msg nelems"] == (3 << 20) // 2 and ar["args"]["dtype"] == "BFloat16"
    assert ar["args"]["Group size"] == 2 and ar["args"]["Process Group Name"] == "world0"
    assert ar["args"]["Process Group Ranks"] == "[0, 1]"
    recv = next(b for b in boxes if b["args"].get("Collective name") == "recv")
    assert recv["args"]["Src Rank"] == 0 and recv["args"]["In msg nelems"] == 512 and recv["dur"] == 0.001
    step = next(b for b in _boxes(t1, steps=True) if b["name"].startswith("ProfilerStep#"))
    assert step["cat"] == "user_annotation" and step["pid"] == HOST_PID_BASE + 1
    ends = [b["ts"] + b["dur"] for b in boxes]
    assert step["ts"] == min(b["ts"] for b in boxes) and step["ts"] + step["dur"] == pytest.approx(max(ends))
    names = {(e["pid"], e["args"]["labels"]) for e in t0["traceEvents"] if e["name"] == "process_labels"}
    assert names == {(HOST_PID_BASE, "CPU"), (0, "GPU 0")}


def test_one_file_keeps_ranks_apart():
    job = uniform_job(2, _build)
    trace = chrome_trace(job_timeline(job), job)
    boxes = _boxes(trace)
    hosts = {b["pid"] for b in boxes if b["cat"] in ("cpu_op", "cuda_runtime")}
    gpus = {b["pid"] for b in boxes if b["cat"] == "kernel"}
    assert hosts == {HOST_PID_BASE, HOST_PID_BASE + 1} and len(gpus) == 2 and not hosts & gpus
    assert trace["distributedInfo"]["ranks"] == [0, 1]


def test_both_forms_are_byte_identical_on_rerun(tmp_path):
    job = uniform_job(2, _build)
    for dest in ("a.json", "a.json.gz", "folder"):
        write(job, tmp_path / dest)
        first = {p.name: p.read_bytes() for p in sorted((tmp_path / dest).glob("*"))} \
            if (tmp_path / dest).is_dir() else (tmp_path / dest).read_bytes()
        write(job, tmp_path / dest)                     # an earlier output is replaced
        again = {p.name: p.read_bytes() for p in sorted((tmp_path / dest).glob("*"))} \
            if (tmp_path / dest).is_dir() else (tmp_path / dest).read_bytes()
        assert first and first == again
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == ["rank-0.json", "rank-1.json"]
    # HTA finds a file's rank by the text '"rank": N'
    assert '"rank": 1,' in (tmp_path / "folder" / "rank-1.json").read_text()


def test_a_folder_that_is_no_timeline_is_not_replaced(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(EchoError, match="refusing to replace"):
        write(uniform_job(2, _build), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_write_timeline_takes_hand_made_events(tmp_path):
    events = [TimelineEvent(3, "compute", "k", 500, 1500, "kernel", 1, {"x": 1}),
              TimelineEvent(3, "host", "step", 0, 2500, "cpu_op", 0),
              TimelineEvent(0, "compute", "k", 0, 10, "kernel", 1)]
    res = write_timeline(events, tmp_path / "sim.json", metadata={"mode": "predict"},
                         process_label="simulated rank")
    trace = json.loads((tmp_path / "sim.json").read_text())
    assert res["events"] == 3 and res["ranks"] == 2 and res["files"] == 1
    assert trace["otherData"]["mode"] == "predict"
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"simulated rank 0", "simulated rank 3"}
    k3 = next(b for b in _boxes(trace) if b["name"] == "k" and b["ts"] == 0.5)
    assert (k3["dur"], k3["cat"], k3["args"]["x"], k3["args"]["stream"] > 0) == (1.5, "kernel", 1, True)


def test_rank_selection_and_unknown_rank(tmp_path):
    job = uniform_job(2, _build)
    assert {e.rank for e in job_timeline(job, [1])} == {1}
    with pytest.raises(EchoError, match="rank 5 is not in the job"):
        job_timeline(job, [5])


def test_cli_export_chrome(tmp_path):
    job = save_job(uniform_job(2, _build), tmp_path / "job")
    runner = CliRunner()
    res = runner.invoke(app, ["export", "chrome", str(job), "-o", str(tmp_path / "t.json"),
                              "--rank", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ranks"] == 1
    res = runner.invoke(app, ["export", "chrome", str(job), "-o", str(tmp_path / "trace")])
    assert res.exit_code == 0, res.output
    assert "2 file(s)" in res.stdout and (tmp_path / "trace" / "rank-1.json").is_file()
    bad = runner.invoke(app, ["export", "chrome", str(job), "-o", str(tmp_path / "u.json"),
                              "--rank", "9"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "u.json").exists()
    missing = runner.invoke(app, ["export", "chrome", str(job), "-o", str(tmp_path / "no" / "t")])
    assert missing.exit_code == 2 and "does not exist" in missing.stderr


def _dlrm(tmp_path):
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    files = sorted(unpack(archive, tmp_path / "in").rglob("*.json"))
    return files, read(files, "kineto", ReadOptions())


def test_dlrm_measured_timeline_and_round_trip(tmp_path):
    files, job = _dlrm(tmp_path)
    write(job, tmp_path / "dlrm")
    for r, f in enumerate(files):
        trace = json.loads((tmp_path / "dlrm" / f"rank-{r}.json").read_text())
        assert trace["distributedInfo"]["rank"] == r
        ours = [b for b in _boxes(trace) if b["cat"] == "kernel" and b["args"].get("Collective name") == "allreduce"]
        kernels = [e for e in json.loads(f.read_text())["traceEvents"]
                   if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel_AllReduce")]
        assert len(ours) == len(kernels)
        assert all(NCCL_KERNEL.match(b["name"]) for b in ours)
        # Kineto's own µs durations survive (to the ns the IR keeps).
        assert sorted(round(b["dur"], 3) for b in ours) == sorted(round(k["dur"], 3) for k in kernels)
        per_cat = Counter(b["cat"] for b in _boxes(trace))
        assert per_cat["kernel"] > 0 and per_cat["cuda_runtime"] > 0 and per_cat["cpu_op"] > 0
    # Our own reader takes the folder back: the same collectives, the same replayed step.
    from echo_et.sim import simulate

    again = read([tmp_path / "dlrm"], "kineto", ReadOptions())
    assert again.world_size == 8
    for r in range(8):
        def colls(j, rank=r):
            return [(n.collective.type, n.collective.in_bytes) for n in j.graph_of(rank).nodes
                    if n.kind == pb.KIND_COLLECTIVE]
        assert colls(again) == colls(job)
    assert simulate(again).step_time_ns == simulate(job).step_time_ns


# -- the streamed writer equals the whole one ----------------------------------------------------
# `write` makes each rank's events in the trace's order from the stored nodes and repeat blocks
# without expanding a graph; `write_timeline_whole(job_timeline(...))` makes them all from the
# expanded graph and sorts them. Both must give the same bytes, on every form.

def _flat(job):
    out = job.copy()
    for g in out.graphs():
        g.expand()
    return out


def _whole(job, dest, ranks=None):
    meta = {"world_size": job.world_size, "source_format": job.manifest.provenance.source_format}
    return write_timeline_whole(job_timeline(_flat(job), ranks), dest, job=job, metadata=meta)


def _same_output(job, tmp, ranks=None) -> None:
    import shutil
    for name in ("tl", "one.json", "one.json.gz"):
        a, b = tmp / f"a-{name}", tmp / f"b-{name}"
        got = write(job, a, ranks)
        want = _whole(job, b, ranks)
        assert {**got, "output": ""} == {**want, "output": ""}
        if a.is_dir():
            assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
            for p in a.iterdir():
                assert p.read_bytes() == (b / p.name).read_bytes(), p.name
            shutil.rmtree(a)
            shutil.rmtree(b)
        else:
            assert a.read_bytes() == b.read_bytes(), name
            a.unlink()
            b.unlink()


@pytest.mark.parametrize("name", ["ddp-dp4", "gpt-dp4-zero1", "gpt-tp2-pp2-dp2"])
def test_streamed_export_equals_the_whole_writer_on_fixture_jobs(name, tmp_path) -> None:
    from pathlib import Path

    from echo_et.ir import load_job
    job = load_job(Path(__file__).parent.parent / "fixtures" / "jobs" / name)
    _same_output(job, tmp_path)
    _same_output(job, tmp_path, job.ranks()[-2:])


def test_streamed_export_equals_the_whole_writer_on_the_sample_job(tmp_path) -> None:
    _same_output(uniform_job(2, _build), tmp_path)


def test_a_job_file_with_kernels_and_no_gpu_communication_says_nccl(tmp_path) -> None:
    """The backend of one file is that of the folder's rank files: NCCL when any box is on a
    GPU stream (the whole writer once said gloo unless communication ran on one)."""
    def build(gb, r, s):
        gb.compute("gemm", s["compute"], start_ns=1_000, duration_ns=2_000)

    job = uniform_job(2, build)
    write(job, tmp_path / "t.json")
    write(job, tmp_path / "tl")
    assert json.loads((tmp_path / "t.json").read_text())["distributedInfo"]["backend"] == "nccl"
    assert json.loads((tmp_path / "tl" / "rank-0.json").read_text())["distributedInfo"]["backend"] == "nccl"
    assert chrome_trace(job_timeline(job), job)["distributedInfo"]["backend"] == "nccl"


_KINDS = [pb.KIND_CPU_OP, pb.KIND_LAUNCH, pb.KIND_LAUNCH, pb.KIND_LAUNCH, pb.KIND_COMPUTE, pb.KIND_COMPUTE,
          pb.KIND_COMPUTE, pb.KIND_COLLECTIVE, pb.KIND_MEMCPY, pb.KIND_SYNC, pb.KIND_SEND]


def _arbitrary_job(world, nodes, blocks):
    """One graph bound to every rank: nodes on a host thread, two GPU streams and an
    undeclared one; deps of any kind to any id; repeat blocks with time offsets and their
    own dependencies (launches across a copy's edge, kernels sharing a launch)."""
    from echo_et.ir import GraphBuilder, JobBuilder

    jb = JobBuilder("fuzz", world)
    gid = jb.group(list(range(world)), name="world")
    b = GraphBuilder("g")
    streams = [b.stream(pb.STREAM_CPU_THREAD, "host", native_id=7),
               b.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0),
               b.stream(pb.STREAM_GPU_COMM, "comm", device=1), 9]
    for i, (kind, stream, start, dur, name, deps) in enumerate(nodes, start=1):
        if kind == pb.KIND_COLLECTIVE:
            n = b.collective(name, streams[stream], coll_type=pb.COLL_ALL_REDUCE, group="w", in_bytes=abs(dur) * 100)
        elif kind == pb.KIND_SEND:
            n = b.p2p(True, name, streams[stream], group="w", peer=0, nbytes=abs(dur))
        else:
            n = b.node(kind, name, streams[stream])
        assert n.id == i
        n.start_ns, n.duration_ns = start, dur
        for d, dk in deps:
            n.deps.add(id=d, kind=dk)
    g = b.build()
    # Blocks valid by construction: bodies apart, copies after every stored node and apart.
    free, body_end = len(nodes) + 1, 0
    for k, (first, length, insts) in enumerate(sorted(blocks), start=1):
        first = max(first, body_end + 1)
        last = min(first + length, len(nodes))
        if first > last:
            continue
        body_end = last
        blk = g.header.repeats.add(id=k, name=f"b{k}", first_node=first, last_node=last)
        for gap, toff, deps in insts:
            off = free + gap - first
            free = last + off + 1
            inst = blk.instances.add(id_offset=off, time_offset_ns=toff)
            for node, dep, dk in deps:   # on a stored node, or on the same node of the last copy
                target = 1 + dep % len(nodes) if dep % 3 or len(blk.instances) < 2 else 0
                at = first + node % (last - first + 1)
                inst.deps.add(node=at, id=target or at + blk.instances[-2].id_offset, kind=dk)
    jb.add_graph(g)
    for r in range(world):
        jb.bind(r, "g", {"w": gid}, clock_offset_ns=r * 250)
    return jb.build()



def test_streamed_export_orders_a_copy_s_launch_flow_on_its_host_lane(tmp_path) -> None:
    """A copy's kernel and its launch on the host: in one file the launch's ``s`` flow sorts
    before every GPU event (host processes come first), in a rank file after them."""
    cpu, launch = pb.KIND_CPU_OP, pb.KIND_LAUNCH
    nodes = [(cpu, 0, 0, -3, "a", [])] * 9 + [(cpu, 2, 0, -3, "a", [(11, pb.DEP_LAUNCH)]),
                                               (launch, 0, 0, -3, "a", []), (cpu, 0, 0, -3, "a", [])]
    job = _arbitrary_job(1, nodes, [(1, 4, [(0, 0, [])]), (1, 5, [(0, 0, [])])])
    assert job.graph("g").has_repeats
    _same_output(job, tmp_path)


def test_streamed_export_equals_the_whole_writer_on_arbitrary_blocks() -> None:
    import tempfile
    from pathlib import Path

    from hypothesis import HealthCheck, assume, given, settings
    from hypothesis import strategies as st

    from echo_et.ir.repeats import repeat_problems

    dep = st.tuples(st.integers(min_value=1, max_value=12),
                    st.sampled_from([pb.DEP_LAUNCH, pb.DEP_LAUNCH, pb.DEP_DATA, pb.DEP_SYNC]))
    node = st.tuples(st.sampled_from(_KINDS), st.integers(min_value=0, max_value=3),
                     st.sampled_from([0, 0, 1000, 1500, 2001]), st.sampled_from([-3, 0, 500, 500, 999]),
                     st.sampled_from(["a", "b", "nccl:x"]), st.lists(dep, max_size=3))
    inst = st.tuples(st.integers(min_value=0, max_value=3), st.sampled_from([0, 0, 7, 1000, 123456]),
                     st.lists(st.tuples(st.integers(min_value=0, max_value=6), st.integers(min_value=1, max_value=40),
                                        st.sampled_from([pb.DEP_LAUNCH, pb.DEP_DATA])), max_size=3))
    block = st.tuples(st.integers(min_value=1, max_value=10), st.integers(min_value=0, max_value=5),
                      st.lists(inst, min_size=1, max_size=4))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(world=st.integers(min_value=1, max_value=2), nodes=st.lists(node, min_size=1, max_size=12),
           blocks=st.lists(block, max_size=2))
    def check(world, nodes, blocks):
        job = _arbitrary_job(world, nodes, blocks)
        g = job.graph("g")
        assume(not repeat_problems(g.header, g.stored_nodes))
        with tempfile.TemporaryDirectory() as d:
            _same_output(job, Path(d))

    check()


def test_streamed_export_of_ranks_that_share_a_process_id_and_of_an_empty_rank(tmp_path) -> None:
    """GPU 150 of rank 0 and GPU 50 of rank 1 are one process of a job file (2,000,000 +
    100 x rank + device): the whole writer orders them, the same bytes; a rank with no node
    has no file and is not in the job file."""
    def build(gb, r, s):
        if r == 2:
            return
        gpu = gb.stream(pb.STREAM_GPU_COMPUTE, "far", device=150 if r == 0 else 50)
        gb.compute("gemm", gpu, start_ns=1_000 + r, duration_ns=2_000)
        gb.compute("gemm2", s["compute"], start_ns=500, duration_ns=2_000)

    job = uniform_job(3, build)
    _same_output(job, tmp_path)
    assert sorted(p.name for p in (write(job, tmp_path / "tl") and (tmp_path / "tl")).iterdir()) == \
        ["rank-0.json", "rank-1.json"]
