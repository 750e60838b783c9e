"""Issue 14's cases, one test each: out-of-range numbers in files and options, unbounded work
from one number, output-side failures and leftovers, and Jobs that `check` must refuse.

Every case asserts the promise: exit 2 with one line on stderr naming what is wrong (the
field, the value, the file or the user's path), or a Job that `check` accepts and
`simulate` runs. Commands run in-process (typer's CliRunner) to keep the suite fast.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import math
import multiprocessing
import os
import stat
from pathlib import Path

import pytest
from test_kineto_graph import base_events, write
from typer.testing import CliRunner

from conftest import FIXTURES, dead_pid, shared_path, unpack
from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, check_job, load_job, pb, save_job
from echo_et.ir import io as ir_io

runner = CliRunner()
JOB = FIXTURES / "jobs" / "gpt-tp2-pp2-dp2"


def cli(*args) -> tuple[int, str, str]:
    r = runner.invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception  # a traceback is a failure of its own
    return r.exit_code, r.stdout, r.stderr


def refused(*args, match: str | list[str]) -> str:
    """The command exits 2 with exactly one line on stderr containing ``match``."""
    code, out, err = cli(*args)
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for m in [match] if isinstance(match, str) else match:
        assert m in lines[0], lines[0]
    return lines[0]


def accepted(job_dir: Path) -> None:
    """The promise's other branch: check accepts the Job and simulate runs it."""
    code, out, err = cli("check", job_dir)
    assert code == 0 and out.strip() == "ok", (out, err)
    code, out, err = cli("simulate", job_dir, "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_ns"] > 0


def kineto(tmp_path: Path, label: str, mutate) -> Path:
    evs = base_events()
    mutate(evs)
    return write(tmp_path, evs, name=f"{label}.json")


def event(evs: list[dict], name: str) -> dict:
    return next(e for e in evs if e.get("name") == name)


# -- numbers in Kineto traces ---------------------------------------------------------------------
@pytest.mark.parametrize("field,value,shown", [
    ("dur", math.nan, "dur = nan"), ("dur", math.inf, "dur = inf"), ("ts", -math.inf, "ts = -inf"),
    ("dur", 1e300, "dur = 1e+300"), ("ts", 1e300, "ts = 1e+300"), ("ts", -1e300, "ts = -1e+300"),
])
def test_kineto_times_out_of_range(tmp_path, field, value, shown):
    p = kineto(tmp_path, "t", lambda evs: event(evs, "aten::addmm").__setitem__(field, value))
    refused("convert", p, "-o", tmp_path / "job", match=[str(p), "aten::addmm", shown])
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("value,shown", [(-100, "= -100 is out of range"), (1e30, "= 1e+30")])
def test_kineto_memcpy_bytes_out_of_range(tmp_path, value, shown):
    memcpy = "Memcpy HtoD (Pinned -> Device)"
    p = kineto(tmp_path, "m", lambda evs: event(evs, memcpy)["args"].__setitem__("bytes", value))
    refused("convert", p, "-o", tmp_path / "job", match=[str(p), "bytes of", shown])


def test_kineto_input_dims_that_are_no_shape_leave_the_size_unknown(tmp_path):
    def mutate(evs):
        event(evs, "c10d::alltoall_base_")["args"]["Input Dims"] = [[-1, 1e20], [64], [], [], [], []]
        event(evs, "nccl:all_to_all")["args"]["Input Dims"] = [[-1, 1e20]]
    p = kineto(tmp_path, "d", mutate)
    code, _, err = cli("convert", p, "-o", tmp_path / "job")
    assert code == 0, err
    accepted(tmp_path / "job")


def test_kineto_collective_size_beyond_int64(tmp_path):
    p = kineto(tmp_path, "n", lambda evs: event(evs, "record_param_comms")["args"].__setitem__(
        "In msg nelems", 2 ** 63))
    refused("convert", p, "-o", tmp_path / "job", match=[str(p), "in_bytes = ", "out of range"])


@pytest.mark.parametrize("dist,shown", [
    ({"world_size": 10 ** 9}, "distributedInfo.world_size = 1000000000 is out of range"),
    ({"world_size": -3}, "distributedInfo.world_size = -3"),
    ({"rank": 2 ** 40}, "rank = 1099511627776 is out of range"),
])
def test_kineto_world_size_and_rank_bounded(tmp_path, dist, shown):
    p = write(tmp_path, base_events(), name="w.json", **dist)
    refused("convert", p, "-o", tmp_path / "job", match=[str(p), shown])


def test_kineto_file_read_as_simai_is_one_line(tmp_path):
    p = tmp_path / "k.json"
    p.write_text("\n" + json.dumps({"traceEvents": base_events()}))
    refused("convert", p, "--from", "simai", "-o", tmp_path / "job", match=[str(p), "line 1"])


# -- numbers in SimAI workloads --------------------------------------------------------------------
SIMAI_HEAD = "HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 1 pp: 1 all_gpus: {gpus}\n1\n"
SIMAI_LAYER = "l0 -1 10 ALLREDUCE {size} 10 NONE 0 10 NONE 0 100\n"


def test_simai_size_of_40_digits(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text(SIMAI_HEAD.format(gpus=4) + SIMAI_LAYER.format(size="1" * 40))
    refused("convert", p, "-o", tmp_path / "job", match=[str(p), "line 3", "forward comm bytes", "out of range"])


def test_simai_all_gpus_beyond_plausible(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text(SIMAI_HEAD.format(gpus=10 ** 6) + SIMAI_LAYER.format(size=1024))
    refused("convert", p, "-o", tmp_path / "job", match=[str(p), "all_gpus 1000000 is out of range"])


# -- options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,shown", [
    (["simulate", JOB, "--compute-scale", "nan"], "--compute-scale = nan is not a finite number"),
    (["simulate", JOB, "--compute-scale", "inf"], "--compute-scale = inf is not a finite number"),
    (["simulate", JOB, "--straggler", "0:nan"], "--straggler '0:nan'"),
    (["simulate", JOB, "--straggler", "0:inf"], "--straggler '0:inf'"),
    (["simulate", JOB, "--gpus-per-node", "-8"], "--gpus-per-node = -8 is out of range"),
    (["estimate", "all_reduce", "--bytes", "1024", "--ranks", "4294967296"], "--ranks = 4294967296 is out of range"),
    (["estimate", "all_reduce", "--bytes", "1024", "--ranks", "99999999999999999999"], "--ranks = 9999999999"),
    (["estimate", "all_reduce", "--bytes", "99999999999999999999999999GiB", "--ranks", "8"], "--bytes: '9999"),
    (["scale", JOB, "--microbatches", "100000", "-o", "{tmp}/s"], "--microbatches = 100000 is out of range"),
    (["export", "astra-sim", JOB, "--latency", "nan", "-o", "{tmp}/a"], "--latency = nan is not a finite number"),
    (["simulate", JOB, "--mode", "predict", "--preset", "a100-ib", "--intra-bw", "inf"],
     "--intra-bw: 'inf' is not a bandwidth"),
])
def test_options_out_of_range(tmp_path, args, shown):
    refused(*[str(a).format(tmp=tmp_path) for a in args], match=shown)
    assert not any(tmp_path.iterdir())


def test_microbatches_bounded_by_the_graphs_they_would_make(tmp_path):
    # 4096 is a plausible count, but on this job the graphs would pass a million nodes.
    refused("scale", JOB, "--microbatches", "4096", "-o", tmp_path / "s", match=["4096 micro-batches",
                                                                              "the limit is"])


# -- Jobs that check must refuse (and then every other command refuses the same way) --------------------
def small_job(world: int = 2):
    jb = JobBuilder("t", world)
    gid = jb.group(range(world), name="0")
    b = GraphBuilder("g")
    comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
    b.declare_group("w", world)
    k = b.compute("k", gpu, duration_ns=1000).id
    b.collective("bc", comm, coll_type=pb.COLL_BROADCAST, group="w", in_bytes=4096, root=0, deps=[k],
                 duration_ns=500)
    jb.add_graph(b.build())
    for r in range(world):
        jb.bind(r, "g", {"w": gid})
    return jb.build()


def edit_manifest(job_dir: Path, edit) -> None:
    m = pb.JobManifest()
    m.ParseFromString((job_dir / "manifest.pb").read_bytes())
    edit(m)
    (job_dir / "manifest.pb").write_bytes(m.SerializeToString())


def edit_graph(job_dir: Path, edit) -> None:
    """Rewrite the job's one graph after ``edit`` and record its new hash (a consistent edit)."""
    job = load_job(job_dir)
    g = job.graph("g").copy()
    edit(g)
    ir_io.write_graph(g, job_dir / "graphs" / "g.graph")
    digest = hashlib.sha256((job_dir / "graphs" / "g.graph").read_bytes()).hexdigest()
    edit_manifest(job_dir, lambda m: setattr(m.graphs[0], "sha256", digest))


JOB_READERS = [["check"], ["inspect"], ["simulate"], ["export", "chrome", "-o", "{tmp}/c.json"],
               ["export", "graphml", "-o", "{tmp}/g.graphml"], ["export", "chakra", "-o", "{tmp}/ch/t"],
               ["export", "astra-sim", "-o", "{tmp}/as"], ["export", "simai", "-o", "{tmp}/w.txt"],
               ["scale", "--dp", "4", "-o", "{tmp}/sc"],
               ["validate", "--preset", "a100-ib"]]


def every_reader_refuses(job_dir: Path, tmp: Path, match: str) -> None:
    for cmd in JOB_READERS:
        args = [cmd[0], *cmd[1:2]] if cmd[0] == "export" else [cmd[0]]
        rest = cmd[2:] if cmd[0] == "export" else cmd[1:]
        refused(*args, job_dir, *[a.format(tmp=tmp) for a in rest], match=match)


@pytest.mark.parametrize("edit,shown", [
    (lambda m: setattr(m.graphs[0], "sha256", "0" * 64), "does not match the manifest's sha256"),
    (lambda m: setattr(m.graphs[0], "sha256", ""), "is not a SHA-256 hex digest"),
    (lambda m: setattr(m.graphs[0], "path", "../../etc/passwd"), "is not a relative path inside"),
    (lambda m: setattr(m.graphs[0], "path", "/etc/passwd"), "is not a relative path inside"),
    # a zeroed byte in the path (hostile seed 1247): no path the OS can open
    (lambda m: setattr(m.graphs[0], "path", "graphs/g\x00.graph"), "is not a relative path inside"),
    (lambda m: m.graphs.append(m.graphs[0]), "is listed twice"),
])
def test_manifest_graph_refs_refused_by_every_reader(tmp_path, edit, shown):
    save_job(small_job(), tmp_path / "job")
    edit_manifest(tmp_path / "job", edit)
    every_reader_refuses(tmp_path / "job", tmp_path, shown)


def test_graph_path_through_a_symlink_out_of_the_job_is_refused(tmp_path):
    save_job(small_job(), tmp_path / "job")
    outside = tmp_path / "outside.graph"
    os.replace(tmp_path / "job" / "graphs" / "g.graph", outside)
    os.symlink(outside, tmp_path / "job" / "graphs" / "g.graph")
    refused("check", tmp_path / "job", match="leads outside the job directory")


@pytest.mark.parametrize("edit,rule", [
    (lambda m: setattr(m, "schema_version", "echo-et/2"), "schema-version"),
    (lambda m: setattr(m, "world_size", 4294967295), "world-size"),
    (lambda m: m.layout.CopyFrom(pb.Layout(dp=0, tp=2, pp=1)), "layout"),
    (lambda m: setattr(m.hardware, "intra_node_bw_gbps", math.nan), "hardware"),
    (lambda m: setattr(m.hardware, "inter_node_bw_gbps", -5.0), "hardware"),
    (lambda m: setattr(m.hardware, "gpus_per_node", 10 ** 6), "hardware"),
])
def test_manifest_values_check_reports(tmp_path, edit, rule):
    save_job(small_job(), tmp_path / "job")
    edit_manifest(tmp_path / "job", edit)
    code, out, err = cli("check", tmp_path / "job", "--json")
    assert code == 1 and any(f"[{rule}]" in e for e in json.loads(out)["errors"]), out
    refused("simulate", tmp_path / "job", match=f"[{rule}]")
    refused("export", "astra-sim", tmp_path / "job", "-o", tmp_path / "as", match=f"[{rule}]")


@pytest.mark.parametrize("edit,rule", [
    (lambda g: setattr(g.nodes[1].collective, "root", 5), "collective-root"),
    (lambda g: setattr(g.nodes[1].collective, "in_bytes", 2 ** 63), "node-values"),
    (lambda g: g.nodes[0].collective.CopyFrom(pb.CollectiveInfo(group="w")), "payload-kind"),
])
def test_graph_values_check_reports(tmp_path, edit, rule):
    save_job(small_job(), tmp_path / "job")
    edit_graph(tmp_path / "job", edit)
    code, out, _ = cli("check", tmp_path / "job", "--json")
    assert code == 1 and any(f"[{rule}]" in e for e in json.loads(out)["errors"]), out
    refused("simulate", tmp_path / "job", match=f"[{rule}]")
    refused("export", "chakra", tmp_path / "job", "-o", tmp_path / "c" / "t", match=f"[{rule}]")


def test_gpus_per_node_zero_means_unknown_everywhere(tmp_path):
    save_job(small_job(), tmp_path / "job")
    edit_manifest(tmp_path / "job", lambda m: m.hardware.CopyFrom(pb.Hardware(gpu_name="A100", gpus_per_node=0)))
    accepted(tmp_path / "job")
    code, _, err = cli("export", "astra-sim", tmp_path / "job", "-o", tmp_path / "as")
    assert code == 0, err
    code, _, err = cli("simulate", tmp_path / "job", "--mode", "predict", "--preset", "a100-ib")
    assert code == 0, err


def test_manifest_world_size_of_four_billion_is_checked_quickly(tmp_path):
    save_job(small_job(), tmp_path / "job")
    edit_manifest(tmp_path / "job", lambda m: setattr(m, "world_size", 4294967295))
    job = load_job(tmp_path / "job")
    assert [i.rule for i in check_job(job)] == ["world-size"]


def test_fifo_in_place_of_a_graph_file(tmp_path):
    save_job(small_job(), tmp_path / "job")
    g = tmp_path / "job" / "graphs" / "g.graph"
    g.unlink()
    os.mkfifo(g)
    refused("check", tmp_path / "job", match=[str(g), "not a regular file"])


def test_fifo_as_an_input(tmp_path):
    os.mkfifo(tmp_path / "trace.json")
    refused("convert", tmp_path / "trace.json", "-o", tmp_path / "job", match="not a regular file")


def test_corrupt_gzip_block_in_a_graph_file_is_one_line_everywhere(tmp_path):
    save_job(small_job(), tmp_path / "job")
    g = tmp_path / "job" / "graphs" / "g.graph"
    data = bytearray(gzip.compress(g.read_bytes() * 50, mtime=0))
    data[len(data) // 2] ^= 0xFF  # a flipped byte inside the deflate stream
    g.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()
    edit_manifest(tmp_path / "job", lambda m: setattr(m.graphs[0], "sha256", digest))
    every_reader_refuses(tmp_path / "job", tmp_path, "g.graph")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_real_chakra_feeder_trace_checks_and_simulates(tmp_path):
    unpack(shared_path("traces/chakra/tests/data/feeder_tests_trace.tar.gz"), tmp_path)
    code, out, err = cli("convert", tmp_path / "tests" / "data" / "chakra.0.et", "-o", tmp_path / "job", "--json")
    assert code == 0, err
    assert json.loads(out)["dropped"]["chakra: untimed nodes given start times in dependency order"] > 0
    accepted(tmp_path / "job")


# -- output side -------------------------------------------------------------------------------------
def _raise_errno(code):
    def fail(*a, **k):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_job_write_on_a_read_only_or_full_file_system(tmp_path, monkeypatch, code):
    monkeypatch.setattr(ir_io.os, "replace", _raise_errno(code))
    line = refused("convert", FIXTURES / "traces" / "cpu_single" / "rank0.kineto.json.gz", "-o",
                   tmp_path / "out", match=[str(tmp_path / "out"), os.strerror(code)])
    assert ".tmp" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.EROFS, errno.ENOSPC])
def test_file_write_on_a_read_only_or_full_file_system(tmp_path, monkeypatch, code):
    monkeypatch.setattr(ir_io.os, "replace", _raise_errno(code))
    for cmd in (["export", "chrome"], ["export", "graphml"]):
        line = refused(*cmd, JOB, "-o", tmp_path / "out.x", match=[str(tmp_path / "out.x"), os.strerror(code)])
        assert ".tmp" not in line
    assert list(tmp_path.iterdir()) == []


def test_no_space_while_writing_bytes(tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._f, name)

    monkeypatch.setattr(ir_io.os, "fdopen", lambda *a, **k: Full(real_fdopen(*a, **k)))
    refused("export", "chrome", JOB, "-o", tmp_path / "t.json", match=[str(tmp_path / "t.json"), "No space"])
    assert list(tmp_path.iterdir()) == []


def test_read_only_directory_when_not_root(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories; the monkeypatched EROFS tests cover this")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        refused("export", "chrome", JOB, "-o", ro / "t.json", match=[str(ro / "t.json"), "Permission denied"])
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("cmd", [["export", "chrome", JOB], ["export", "graphml", JOB], ["export", "simai", JOB],
                                 ["calibrate", "slowdown", "slowdown/echo-a100-gpt2/merged_features.csv"]])
def test_output_naming_a_directory(tmp_path, cmd):
    if cmd[0] == "calibrate":
        cmd = [*cmd[:2], shared_path(cmd[2]), "--folds", "2"]
    # (export chrome writes a folder of rank files to a name without .json: a folder named
    # like a file is what it must refuse)
    out = tmp_path / ("existing.json" if cmd[1] == "chrome" else "existing")
    out.mkdir()
    refused(*cmd, "-o", out, match=[str(out), "is a directory"])
    assert list(tmp_path.iterdir()) == [out] and list(out.iterdir()) == []


def test_output_naming_a_character_device_is_never_replaced(tmp_path, monkeypatch):
    real_replace = os.replace

    def guarded_replace(src, dst, *a, **k):
        assert not str(dst).startswith("/dev/"), "a device was about to be replaced"
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(ir_io.os, "replace", guarded_replace)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    for cmd in (["export", "chrome"], ["export", "graphml"], ["export", "simai"]):
        refused(*cmd, JOB, "-o", "/dev/null", match=["/dev/null", "not a regular file"])
    with pytest.raises(EchoError, match="not a regular file"):
        ir_io.check_output_file("/dev/null")


def test_stale_temporaries_of_killed_runs_are_removed(tmp_path):
    dead = dead_pid()
    stale_dir = tmp_path / f".out.{dead}-abc123.tmp"
    stale_dir.mkdir()
    (stale_dir / "manifest.pb").write_bytes(b"partial")
    stale_old = tmp_path / f".out.{dead}-def456.old"
    stale_old.mkdir()
    live = tmp_path / f".out.{os.getppid()}-live01.tmp"   # a live writer's: kept
    live.mkdir()
    other = tmp_path / f".other.{dead}-abc123.tmp"          # another output's: not ours
    other.mkdir()
    save_job(small_job(), tmp_path / "out")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["out", live.name, other.name])


def _save_many(dest: str, n: int) -> None:
    for _ in range(n):
        save_job(small_job(), dest)


def test_concurrent_writers_to_one_output_all_succeed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path / "out"), 15)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert check_job(load_job(tmp_path / "out")) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_sigterm_removes_the_temporary_output(tmp_path):
    """A terminated convert leaves nothing behind (SIGTERM unwinds like Ctrl-C)."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys, time\n"
            "from echo_et.ir import io\n"
            "from echo_et.cli import main\n"
            "real = io.save_job\n"
            "def slow(job, dest, **k):\n"
            "    with io.atomic_dir(dest) as tmp:\n"
            "        (tmp / 'x').write_text('partial'); print('ready', flush=True); time.sleep(60)\n"
            "import echo_et.ir as ir; ir.save_job = slow\n"
            "sys.argv = ['echo-et', 'convert', sys.argv[1], '-o', sys.argv[2]]\n"
            "main.main()\n")
    src = FIXTURES / "traces" / "cpu_single" / "rank0.kineto.json.gz"
    p = subprocess.Popen([sys.executable, "-c", code, str(src), str(tmp_path / "out")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.strip().splitlines() == ["error: interrupted"]
    deadline = time.time() + 5
    while any(tmp_path.iterdir()) and time.time() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.iterdir()) == []
