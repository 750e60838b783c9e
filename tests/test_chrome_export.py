"""Chrome/Perfetto timeline export: layout, ns precision, labels, determinism, CLI."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from test_astra_sim_support import uniform_job
from typer.testing import CliRunner

from conftest import shared_path, unpack
from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.converters.chrome import TimelineEvent, job_timeline, write, write_timeline
from echo_et.errors import EchoError
from echo_et.ir import save_job
from echo_et.ir.schema import pb


def _build(gb, r, s):
    op = gb.cpu_op("aten::mm", s["cpu"], start_ns=1_000_000 + 1_234, duration_ns=10_001)
    k = gb.compute("gemm", s["compute"], start_ns=1_000_000 + 5_678, duration_ns=12_345,
                   deps=[(op.id, pb.DEP_LAUNCH)])
    gb.collective("nccl:all_reduce", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world",
                  in_bytes=3 << 20, start_ns=1_000_000 + 20_000 + r, duration_ns=99_999,
                  deps=[k.id])
    gb.p2p(r == 0, "nccl:send" if r == 0 else "nccl:recv", s["comm"], group="world",
           peer=1 - r, nbytes=512, start_ns=1_200_000, duration_ns=1)


def _boxes(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_layout_precision_and_labels(tmp_path):
    job = uniform_job(2, _build)
    job.manifest.bindings[1].clock_offset_ns = 7   # rank 1's clock is 7 ns behind the job clock
    res = write(job, tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    assert trace["displayTimeUnit"] == "ns"
    assert trace["otherData"]["time_origin_ns"] == 1_001_234
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"} == \
        {(0, "rank 0"), (1, "rank 1")}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    # Host thread first, then compute, then communication; one track per stream used.
    assert [threads[(0, t)] for t in range(3)] == ["thread 1", "stream 7", "stream 20"]
    boxes = _boxes(trace)
    assert res == {"output": str(tmp_path / "t.json"), "events": 8, "ranks": 2, "tracks": 6}
    gemm = next(b for b in boxes if b["name"] == "gemm" and b["pid"] == 0)
    assert gemm["ts"] == 4.444 and gemm["dur"] == 12.345         # µs, ns kept
    ar = next(b for b in boxes if b["pid"] == 1 and b["args"].get("type") == "all_reduce")
    assert ar["name"] == "all_reduce 3.0 MiB"
    assert ar["ts"] == 18.774                                     # 20_001 + 7 - 1_234 ns
    assert ar["args"]["bytes"] == 3 << 20 and ar["args"]["group_size"] == 2
    assert ar["args"]["op"] == "nccl:all_reduce"
    send = next(b for b in boxes if b["pid"] == 0 and b["name"].startswith("send"))
    assert send["name"] == "send to 1 512 B" and send["dur"] == 0.001
    assert all(b["tid"] in {t for (p, t) in threads if p == b["pid"]} for b in boxes)


def test_rerun_is_byte_identical(tmp_path):
    job = uniform_job(2, _build)
    write(job, tmp_path / "a.json")
    write(job, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_write_timeline_takes_any_events(tmp_path):
    """The simulator writes its simulated timeline with the same function."""
    events = [TimelineEvent(3, "compute", "k", 500, 1500, "compute", 1, {"x": 1}),
              TimelineEvent(3, "comm", "all_reduce 1 KiB", 1000, 250, "communication", 2),
              TimelineEvent(0, "compute", "k", 0, 10, "compute", 1)]
    res = write_timeline(events, tmp_path / "sim.json", metadata={"mode": "predict"},
                         process_label="simulated rank")
    trace = json.loads((tmp_path / "sim.json").read_text())
    assert res["events"] == 3 and res["ranks"] == 2
    assert trace["otherData"]["mode"] == "predict"
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "simulated rank 0", 3: "simulated rank 3"}
    k3 = next(b for b in _boxes(trace) if b["pid"] == 3 and b["name"] == "k")
    assert (k3["ts"], k3["dur"], k3["cat"], k3["args"]) == (0.5, 1.5, "compute", {"x": 1})


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
    bad = runner.invoke(app, ["export", "chrome", str(job), "-o", str(tmp_path / "u.json"),
                              "--rank", "9"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "u.json").exists()


def test_dlrm_measured_timeline(tmp_path):
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    files = sorted(unpack(archive, tmp_path / "in").rglob("*.json"))
    job = read(files, "kineto", ReadOptions())
    write(job, tmp_path / "dlrm.json")
    trace = json.loads((tmp_path / "dlrm.json").read_text())
    boxes = _boxes(trace)
    per_rank = Counter(b["pid"] for b in boxes)
    assert per_rank == {r: len(job.graph_of(r).nodes) for r in range(8)}
    for r, f in enumerate(files):
        kernels = [e for e in json.loads(f.read_text())["traceEvents"]
                   if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel_AllReduce")]
        ours = [b for b in boxes if b["pid"] == r and b["name"].startswith("all_reduce ")]
        assert len(ours) == len(kernels)
        # Kineto's own µs durations survive (to the ns the IR keeps).
        assert sorted(round(b["dur"], 3) for b in ours) == sorted(round(k["dur"], 3) for k in kernels)
