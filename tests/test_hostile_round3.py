"""Issue 26's cases (hostile input, round three), one test per class: the tracebacks of the
campaign, output folders that hold a user's files, work bounded before it starts, and the
error line itself.

Every case asserts the promise: exit 2 with one line on stderr naming what is wrong, or a
result `check` accepts. Commands run in-process (typer's CliRunner) to keep the suite fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hostile_input import cli, edit_manifest, refused, small_job
from test_kineto_graph import base_events, write

from conftest import FIXTURES
from echo_et.ir import GraphBuilder, JobBuilder, check_job, load_job, pb, save_job

DDP = FIXTURES / "traces" / "ddp_gloo4" / "rank0.kineto.json.gz"


def host_event(evs: list[dict], name: str = "aten::addmm") -> dict:
    return next(e for e in evs if e.get("name") == name)


# -- 1. a flipped byte in a gzipped trace ----------------------------------------------------------
def test_flipped_byte_in_a_gzipped_trace_is_one_line(tmp_path):
    data = bytearray(DDP.read_bytes())
    data[89] ^= 0xFF  # the campaign's reproducer: a deflate error the format sniffer met first
    p = tmp_path / "rank0.kineto.json.gz"
    p.write_bytes(bytes(data))
    refused("convert", p, "-o", tmp_path / "j", match=[str(p), "corrupt gzip data"])
    assert not (tmp_path / "j").exists()


# -- 2 and 4. thread ids of the wrong type or beyond int64 -------------------------------------------
@pytest.mark.parametrize("field", ["tid", "pid"])
@pytest.mark.parametrize("value,shown", [({}, "{}"), ([], "[]"), (2 ** 64, str(2 ** 64)), (1e30, "1e+30"),
                                         (True, "True"), (1.5, "1.5")])
def test_host_thread_ids_of_the_wrong_type_are_refused(tmp_path, field, value, shown):
    evs = base_events()
    host_event(evs)[field] = value
    p = write(tmp_path, evs, name="t.json")
    refused("convert", p, "-o", tmp_path / "j", match=[str(p), "aten::addmm", f"{field} = {shown}",
                                                     "is not a thread id"])


def test_device_stream_beyond_int64_is_refused(tmp_path):
    evs = base_events()
    kernel = next(e for e in evs if e.get("cat") == "kernel")
    kernel.setdefault("args", {})["stream"] = 2 ** 64
    p = write(tmp_path, evs, name="s.json")
    refused("convert", p, "-o", tmp_path / "j", match=[str(p), f"stream = {2 ** 64}"])


@pytest.mark.parametrize("value", [-1, "python", 4944])
def test_host_thread_ids_that_are_ints_or_names_still_convert(tmp_path, value):
    evs = base_events()
    host_event(evs)["tid"] = value
    p = write(tmp_path, evs, name="ok.json")
    code, _, err = cli("convert", p, "-o", tmp_path / "j")
    assert code == 0, err
    assert check_job(load_job(tmp_path / "j")) == []


# -- 3 and rank fields: distributedInfo of the wrong type ---------------------------------------------
@pytest.mark.parametrize("dist,shown", [
    ({"pg_config": 5}, "distributedInfo.pg_config = 5 is not a list"),
    ({"pg_config": "0"}, "distributedInfo.pg_config = '0' is not a list"),
    ({"rank": float("inf")}, "distributedInfo.rank = inf is not a finite number"),
    ({"rank": True}, "distributedInfo.rank = True is not a number"),
    ({"rank": [0]}, "distributedInfo.rank = [0] is not an integer"),
    ({"rank": {}}, "distributedInfo.rank = {} is not an integer"),
    ({"rank": 1.5}, "distributedInfo.rank = 1.5 is not an integer"),
])
def test_distributed_info_of_the_wrong_type_is_refused(tmp_path, dist, shown):
    p = write(tmp_path, base_events(), name="d.json", **dist)
    refused("convert", p, "-o", tmp_path / "j", match=[str(p), shown])


# -- 6. clock offsets: check is the authority ----------------------------------------------------------
JOB_VERBS = [["simulate"], ["validate", "--preset", "a100-ib"], ["export", "chrome", "-o", "{tmp}/c"],
             ["export", "astra-sim", "-o", "{tmp}/as"], ["export", "chakra", "-o", "{tmp}/ch/t"],
             ["export", "graphml", "-o", "{tmp}/g.graphml"], ["simulate", "--timeline", "{tmp}/tl"]]


def _args(cmd: list[str], job: Path, tmp: Path) -> list:
    head = cmd[:2] if cmd[0] == "export" else cmd[:1]
    rest = cmd[2:] if cmd[0] == "export" else cmd[1:]
    return [*head, job, *[a.format(tmp=tmp) for a in rest]]


@pytest.mark.parametrize("offset", [2 ** 63 - 1, -(2 ** 63)])
def test_clock_offset_beyond_the_bound_is_refused_by_check_and_every_verb(tmp_path, offset):
    save_job(small_job(), tmp_path / "job")
    edit_manifest(tmp_path / "job", lambda m: setattr(m.bindings[0], "clock_offset_ns", offset))
    code, out, _ = cli("check", tmp_path / "job", "--json")
    assert code == 1 and any("[binding-values]" in e for e in json.loads(out)["errors"]), out
    for cmd in JOB_VERBS:
        refused(*_args(cmd, tmp_path / "job", tmp_path), match="[binding-values]")


def test_clock_offset_at_the_bound_is_accepted_by_every_verb(tmp_path):
    save_job(small_job(), tmp_path / "job")
    edit_manifest(tmp_path / "job", lambda m: setattr(m.bindings[1], "clock_offset_ns", 1 << 60))
    assert check_job(load_job(tmp_path / "job")) == []
    for cmd in JOB_VERBS:
        code, _, err = cli(*_args(cmd, tmp_path / "job", tmp_path))
        assert code == 0, (cmd, err)


# -- 7. a send's peer outside its group ----------------------------------------------------------------
def p2p_job(peer: int):
    jb = JobBuilder("p", 2)
    gid = jb.group(range(2), name="0")
    for r in range(2):
        b = GraphBuilder(f"g{r}")
        comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
        b.declare_group("w", 2)
        b.p2p(r == 0, "sr", comm, group="w", peer=peer if r == 0 else 0, nbytes=100, duration_ns=10)
        jb.add_graph(b.build())
        jb.bind(r, f"g{r}", {"w": gid})
    return jb.build()


def test_peer_outside_its_group_is_refused_by_check_and_every_verb(tmp_path):
    save_job(p2p_job(5), tmp_path / "job")
    code, out, _ = cli("check", tmp_path / "job", "--json")
    assert code == 1 and any("peer 5 is outside group" in e for e in json.loads(out)["errors"])
    for cmd in JOB_VERBS:
        refused(*_args(cmd, tmp_path / "job", tmp_path), match="peer 5 is outside group")


def test_peer_inside_its_group_goes_through_every_verb(tmp_path):
    save_job(p2p_job(1), tmp_path / "job")
    for cmd in JOB_VERBS:
        code, _, err = cli(*_args(cmd, tmp_path / "job", tmp_path))
        assert code == 0, (cmd, err)


# -- 9. a CSV field beyond csv's limit ------------------------------------------------------------------
def test_config_csv_field_of_200000_digits(tmp_path):
    p = tmp_path / "configs.csv"
    p.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n"
                 + "9" * 200_000 + ",64,4,32,1,4,1,1,1\n")
    refused("sweep", "--configs", p, "--gpu", "a100", "-o", tmp_path / "out",
            match=["--configs", "configs.csv", "field larger than field limit"])
    assert not (tmp_path / "out").exists()


def test_slowdown_csv_field_beyond_the_limit(tmp_path):
    p = tmp_path / "merged_features.csv"
    p.write_text("kDemangledName,ground_truth,duration,overlap_ratio\n" + "k" * 200_000 + ",1,2,0.5\n")
    refused("calibrate", "slowdown", p, "-o", tmp_path / "s.json", match=[str(p), "field larger"])


# -- never delete what echo-et did not write ------------------------------------------------------------
JOB = FIXTURES / "jobs" / "ddp-dp4"
KINETO = FIXTURES / "traces" / "cpu_single" / "rank0.kineto.json.gz"
FOLDER_WRITERS = {
    "convert": ["convert", KINETO],
    "scale": ["scale", JOB, "--dp", "8"],
    "inject": ["inject", "{one}", "--dp", "4"],
    "select": ["select", JOB, "--ranks", "0-3"],
    "export astra-sim": ["export", "astra-sim", JOB, "--no-expected"],
    "export chrome": ["export", "chrome", JOB],
    "simulate --timeline": ["simulate", JOB, "--timeline"],
}


def _writer_args(verb: str, out: Path, tmp: Path) -> list:
    if verb == "inject" and not (tmp / "one").exists():
        from test_passes_inject import make_single_gpu_job
        save_job(make_single_gpu_job(), tmp / "one")
    args = [str(a).format(one=tmp / "one") for a in FOLDER_WRITERS[verb]]
    return [*args, out] if verb == "simulate --timeline" else [*args, "-o", out]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("verb", list(FOLDER_WRITERS))
def test_an_output_folder_holding_a_users_file_is_never_replaced(tmp_path, verb):
    out = tmp_path / "out"
    for _ in range(2):  # an earlier output of the same verb is replaced
        code, _, err = cli(*_writer_args(verb, out, tmp_path))
        assert code == 0, err
    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    refused(*_writer_args(verb, out, tmp_path), match=[str(out), "holds notes.txt, which echo-et did not write",
                                                      "refusing to replace it"])
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "one") == ["out"]


@pytest.mark.parametrize("verb", ["convert", "scale", "export astra-sim"])
def test_an_output_folder_with_a_nested_or_linked_extra_is_the_users(tmp_path, verb):
    out = tmp_path / "out"
    code, _, err = cli(*_writer_args(verb, out, tmp_path))
    assert code == 0, err
    sub = out / "graphs" if (out / "graphs").is_dir() else out
    (sub / "data").mkdir()
    refused(*_writer_args(verb, out, tmp_path), match="refusing to replace it")
    (sub / "data").rmdir()
    (sub / "link.graph").symlink_to(tmp_path)
    refused(*_writer_args(verb, out, tmp_path), match="refusing to replace it")
    assert (sub / "link.graph").is_symlink()


def test_trace_refuses_its_output_before_tracing(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    import echo_et.trace.tracer as tracer

    def never(*a, **k):
        raise AssertionError("traced before checking -o")

    monkeypatch.setattr(tracer, "trace", never)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused("trace", "--layers", "2", "--hidden", "16", "-o", mine, match=[str(mine), "refusing to replace it"])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    refused("trace", "--layers", "2", "--hidden", "16", "-o", blocker / "job", match=[str(blocker), "Not a directory"])
    assert (mine / "notes.txt").read_text() == "mine"


# -- bounded work, decided before it starts -----------------------------------------------------------
def test_select_of_a_billion_ranks_is_refused_before_the_list_is_built(tmp_path):
    refused("select", JOB, "--ranks", "0-1000000000", "-o", tmp_path / "s",
            match=["--ranks", "names 1000000001 ranks", "the limit is 262144"])
    refused("select", JOB, "--ranks", "0,1000000000", "-o", tmp_path / "s", match="up to rank 1000000000")
    assert not (tmp_path / "s").exists()


TRACE_BOUNDS = [
    (["--layers", "1000000"], ["at least 200,000,000 nodes", "the limit is 1,048,576 nodes"]),
    (["--warmup", "1000000000"], ["--warmup: 1,000,000,000 steps", "the limit is 100"]),
    # campaign seed 2026, case 2768: 1,000 meta warm-up steps ran for minutes (0.14 s of CPU each)
    (["--warmup", "1_000"], ["--warmup: 1,000 steps", "the limit is 100"]),
    (["--steps", "101"], ["--steps: 101 steps", "the limit is 100"]),
    (["--steps", "5000"], ["--steps: 5,000 steps"]),
    (["--seq", "1000000000"], ["tracing needs at least 48.0 GB of host memory", "tokens 48.0 GB",
                               "this machine has"]),
    (["--dp", "100000", "--pp", "4", "--layers", "4"], ["400,000 ranks", "the limits are 262,144 ranks"]),
    (["--global-batch", "100000000"], ["50,000,000 micro-batches"]),
    (["--device", "cpu", "--hidden", "65536", "--layers", "8"], ["weights 3298.9 GB"]),
]


@pytest.mark.parametrize("args,shown", TRACE_BOUNDS)
def test_trace_refuses_what_cannot_finish_before_tracing(tmp_path, monkeypatch, args, shown):
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    import echo_et.trace.session as session

    def never(*a, **k):
        raise AssertionError("a rank was traced before the bounds were checked")

    monkeypatch.setattr(session, "trace_rank", never)
    monkeypatch.setattr("echo_et.trace.tracer.trace_rank", never)
    device = [] if "--device" in args else ["--device", "meta"]
    refused("trace", *device, *args, "-o", tmp_path / "job", match=shown)  # one line: no progress before it
    assert list(tmp_path.iterdir()) == []


def test_trace_of_a_100000_rank_data_parallel_job_is_linear_in_its_ranks():
    """Each rank's groups come from one tuple per group: a dp group of 100K ranks was kept
    (and hashed) once per rank, 40 bytes x dp^2 (2.9 GB at dp 8,192)."""
    from echo_et.trace.layout import ParallelLayout

    lay = ParallelLayout(dp=100_000, pp=2)
    a, b = lay.group_ranks("dp", 5), lay.group_ranks("dp", 99_999)
    assert a is b and len(a) == 100_000
    assert lay.group_first("dp", 150_000) == 100_000 and lay.group_first("embd", 150_000) == 50_000
    assert [g[0] for g in lay.all_groups("dp")] == [0, 100_000]


def test_config_sweep_row_of_a_million_layers_is_that_rows_error(tmp_path):
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import predict_row

    row = dict(layers=1_000_000, hidden=64, heads=4, seq=32, micro_batch=1, global_batch=4, tp=1, pp=1, dp=2)
    out = predict_row(row, ConfigSweepOptions())
    assert "at least 200,000,000 nodes" in out["error"]


def test_calibrate_checks_its_output_before_fitting(tmp_path):
    log = tmp_path / "nccl_8.log"
    log.write_text("not read")
    mine = tmp_path / "mine"
    mine.mkdir()
    refused("calibrate", "nccl-tests", log, "--gpus-per-node", "8", "-o", mine, match="is a directory")
    blocker = tmp_path / "f"
    blocker.write_text("x")
    refused("calibrate", "nccl-tests", log, "--gpus-per-node", "8", "-o", blocker / "p.json",
            match=["cannot write", "Not a directory"])


# -- the error line itself ------------------------------------------------------------------------------
def _echo_et(*args: str, stdout) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from echo_et.cli.main import main; main()", *args],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)


def test_a_full_disk_on_stdout_has_one_error_prefix():
    with open("/dev/full", "w") as full:
        p = _echo_et("inspect", str(JOB), "--json", stdout=full)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["error: No space left on device"]


def test_a_closed_pipe_on_stdout_ends_quietly():
    r, w = os.pipe()
    os.close(r)
    try:
        p = _echo_et("inspect", str(JOB), "--json", stdout=w)
    finally:
        os.close(w)
    assert p.returncode == 141 and p.stderr == ""


# -- a Job whose replayed step leaves the IR's time range: check is the authority ---------------------------
def long_job(durations: list[int], offsets: tuple[int, int] = (0, 0)):
    """Two ranks sharing a graph of compute kernels run one after the other."""
    jb = JobBuilder("long", 2)
    b = GraphBuilder("g")
    gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
    k = None
    for i, d in enumerate(durations):
        k = b.compute(f"k{i}", gpu, duration_ns=d, deps=[k] if k is not None else []).id
    jb.add_graph(b.build())
    for r in range(2):
        jb.bind(r, "g", {}, clock_offset_ns=offsets[r])
    return jb.build()


def test_a_step_beyond_2_62_ns_is_refused_by_check_and_every_verb(tmp_path):
    """Each node fits (start + duration <= 2^62 ns), but run one after the other they pass
    the IR's range: check's step-bound rule refuses the Job, so every verb does, in one line
    (before, check accepted it and simulate alone refused it)."""
    save_job(long_job([(1 << 62) - 1] * 3), tmp_path / "job")
    code, out, _ = cli("check", tmp_path / "job", "--json")
    assert code == 1 and any("[step-bound]" in e for e in json.loads(out)["errors"]), out
    for cmd in JOB_VERBS:
        refused(*_args(cmd, tmp_path / "job", tmp_path), match="[step-bound]")
    refused("simulate", tmp_path / "job", "--mode", "predict", "--preset", "a100-ib", match="[step-bound]")


@pytest.mark.parametrize("durations,offsets,ok", [
    # every kernel starts at 0 as stored: span = one duration; bound = 3 durations + 1 stream x span
    ([1 << 60] * 3, (0, 0), True),              # 4 x 2^60 = 2^62: at the bound
    ([1 << 59] * 3, (0, 1 << 60), True),        # 2^61 + a start spread of 2^60
    ([1 << 60] * 3, (0, 1), False),             # 2^62 + 1
    ([1 << 61] * 2, (0, 0), False),             # 3 x 2^61
])
def test_step_bound_sums_durations_gaps_and_start_spread(tmp_path, durations, offsets, ok):
    save_job(long_job(durations, offsets), tmp_path / "job")
    issues = [i for i in check_job(load_job(tmp_path / "job")) if i.rule == "step-bound"]
    assert (issues == []) == ok, issues
    code, _, err = cli("simulate", tmp_path / "job")
    assert code == (0 if ok else 2), err


def test_a_step_priced_past_2_62_ns_is_one_line_from_simulate(tmp_path):
    """A Job check accepts, priced by the slowest link the options allow (1 bit/s): the
    prediction leaves the IR's range, one line naming it (the options' doing, not the Job's)."""
    job = small_job()
    g = job.graph("g").copy()
    g.nodes[1].collective.in_bytes = 1 << 50    # a PiB: 2^53 bits, 2^53 s at 1 bit/s
    job.add_graph(g)
    save_job(job, tmp_path / "job")
    assert check_job(load_job(tmp_path / "job")) == []
    refused("simulate", tmp_path / "job", "--mode", "predict", "--preset", "a100-ib", "--intra-bw", "1b/s",
            "--inter-bw", "1b/s", "--gpus-per-node", "1", match="exceeds 4611686018427387904 ns")


@pytest.mark.parametrize("args,shown", [
    (["--dp", ",".join(str(i) for i in range(1, 201)), "--pp", ",".join(str(i) for i in range(1, 101))],
     "--dp: 200 dp x 100 pp x 1 micro-batch values make 20,000 layouts; the limit is 10,000"),
    (["--dp", "4,99999999999"], "--dp: 99999999999 is out of range (1..262,144)"),
    (["--dp", "4", "--microbatches", "5000"], "--microbatches: 5000 is out of range (1..4,096)"),
])
def test_sweep_grid_is_counted_before_it_is_built(tmp_path, args, shown):
    refused("sweep", JOB, *args, "--preset", "a100-ib", "-o", tmp_path / "s", match=shown)
    assert not (tmp_path / "s").exists()


def test_config_csv_rows_and_size_are_bounded_before_any_row_runs(tmp_path):
    head = "layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n"
    many = tmp_path / "many.csv"
    many.write_text(head + "2,64,4,32,1,4,1,1,2\n" * 10_001)
    refused("sweep", "--configs", many, "--gpu", "a100", "-o", tmp_path / "o",
            match="more than 10,000 configuration rows")
    huge = tmp_path / "huge.csv"
    with open(huge, "w") as f:
        f.write(head)
        f.truncate(65 << 20)  # sparse: 65 MiB that are never read
    refused("sweep", "--configs", huge, "--gpu", "a100", "-o", tmp_path / "o",
            match=["huge.csv: 68.2 MB", "at most 67.1 MB"])
    assert not (tmp_path / "o").exists()


def test_a_symlink_loop_is_one_line(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    refused("convert", tmp_path / "a", "-o", tmp_path / "j", match="Symlink loop")
    refused("scale", tmp_path / "a", "--dp", "4", "-o", tmp_path / "s", match="Symlink loop")
    save_job(small_job(), tmp_path / "job")
    graph = next((tmp_path / "job" / "graphs").iterdir())
    graph.unlink()
    graph.symlink_to(graph)
    for verb in ("check", "simulate", "inspect"):
        refused(verb, tmp_path / "job", match=["Symlink loop", graph.name])


@pytest.mark.parametrize("value", ["1e400", "inf", "nan"])
def test_slowdown_csv_durations_must_be_finite(tmp_path, value):
    p = tmp_path / "merged_features.csv"
    p.write_text(f"kDemangledName,ground_truth,duration,overlap_ratio\nk,{value},2,0.5\nk,1,2,0.5\n")
    refused("calibrate", "slowdown", p, "-o", tmp_path / "s.json", match=[f"{p}:2", "finite"])
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("name,text", [
    ("deep.json", '{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}"),
    ("deep.et.json", '{"schema": "1.0.1", "nodes": [{"id": 1, "inputs": ' + "[" * 100_000 + "]" * 100_000 + "}]}"),
])
def test_json_nested_a_hundred_thousand_deep_is_one_line(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    refused("convert", p, "-o", tmp_path / "j", match=[str(p), "nested too deeply"])


def test_a_profile_nested_a_hundred_thousand_deep_is_one_line(tmp_path):
    p = tmp_path / "prof.json"
    p.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused("simulate", JOB, "--mode", "predict", "--profile", p, match="nested too deeply")


# -- --gpus-per-node that leaves a node partly filled: one meaning in every verb ---------------------------
DDP4 = FIXTURES / "jobs" / "ddp-dp4"
GPN_VERBS = [
    ["simulate", DDP4], ["simulate", DDP4, "--mode", "predict", "--preset", "a100-ib"],
    ["validate", DDP4, "--preset", "a100-ib"], ["scale", DDP4, "--dp", "4", "-o", "{tmp}/s"],
    ["export", "astra-sim", DDP4, "--no-expected", "-o", "{tmp}/as"],
    ["convert", FIXTURES / "traces" / "ddp_gloo4", "-o", "{tmp}/c"],
    ["estimate", "all_reduce", "--bytes", "1MB", "--ranks", "4"],
    ["trace", "--device", "meta", "--dp", "4", "-o", "{tmp}/t"],
    ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--global-batch", "4",
     "--dp", "4", "-o", "{tmp}/p"],
]


@pytest.mark.parametrize("cmd", GPN_VERBS, ids=lambda c: "-".join(str(a) for a in c[:2] if "/" not in str(a)))
def test_gpus_per_node_leaving_a_node_partly_filled_is_refused_by_every_verb(tmp_path, cmd):
    """4 ranks on nodes of 3 GPUs (one full node and one of 1): refused in one line naming the
    option, before any work (simulate, validate, estimate and convert used to take it)."""
    args = [str(a).format(tmp=tmp_path) for a in cmd]
    refused(*args, "--gpus-per-node", "3", match="--gpus-per-node: world size 4 is not a multiple of 3 GPUs "
            "per node (nodes would be partly filled: 1 full and one of 1)")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("gpn", ["2", "4", "8"])
def test_gpus_per_node_filling_whole_nodes_or_one_is_accepted(tmp_path, gpn):
    """4 ranks on 2 nodes of 2, one node of 4, or part of one node of 8."""
    for cmd in GPN_VERBS[:5] + GPN_VERBS[6:7]:
        args = [str(a).format(tmp=tmp_path / gpn) for a in cmd]
        code, _, err = cli(*args, "--gpus-per-node", gpn)
        assert code == 0, (cmd, err)


# -- exports estimated before a byte is written -------------------------------------------------------------
def repeated_job(world: int = 8, instances: int = 2000):
    """``world`` ranks sharing one graph: a collective and 4 kernels, two of which repeat
    ``instances`` times (a few KB stored, ``world x (5 + 2 x instances)`` nodes written)."""
    jb = JobBuilder("rep", world)
    gid = jb.group(range(world), name="0")
    b = GraphBuilder("g")
    gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
    comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    b.declare_group("w", world)
    k = [b.compute(f"k{i}", gpu, start_ns=100 * i, duration_ns=50).id for i in range(4)]
    b.collective("ar", comm, coll_type=pb.COLL_ALL_REDUCE, group="w", in_bytes=4096, deps=[k[3]],
                 start_ns=500, duration_ns=50)
    g = b.build()
    block = g.header.repeats.add(id=1, name="body", first_node=k[1], last_node=k[2])
    for i in range(instances):
        block.instances.add(id_offset=1000 + 2 * i, time_offset_ns=1000 * (i + 1))
    jb.add_graph(g)
    for r in range(world):
        jb.bind(r, "g", {"w": gid})
    return jb.build()


def test_the_output_estimate_counts_ranks_and_repeat_copies_without_expanding():
    from echo_et.ir.budget import estimate_output

    job = repeated_job()
    assert check_job(job) == []
    assert estimate_output(job, "chakra").nodes == 8 * (5 + 2 * 2000)
    assert estimate_output(job, "chrome", [0, 3, 99]).nodes == 2 * (5 + 2 * 2000)
    assert estimate_output(job, "graphml", per_rank=False).nodes == 5 + 2 * 2000
    assert estimate_output(job, "astra-sim").nodes == 8            # one collective per rank
    assert len(job.graph("g").stored_nodes) == 5                 # nothing was expanded


EXPORTS = [["export", "chakra", "{job}", "-o", "{tmp}/ch/t"], ["export", "chrome", "{job}", "-o", "{tmp}/c"],
           ["export", "chrome", "{job}", "-o", "{tmp}/c.json"], ["export", "graphml", "{job}", "-o", "{tmp}/g.graphml"],
           ["export", "astra-sim", "{job}", "--no-expected", "-o", "{tmp}/as"],
           ["simulate", "{job}", "--timeline", "{tmp}/tl"]]


@pytest.mark.parametrize("cmd", EXPORTS, ids=lambda c: "-".join(c[:2]) + c[-1][-4:])
def test_an_export_beyond_max_output_is_refused_before_writing(tmp_path, cmd):
    save_job(repeated_job(), tmp_path / "job")
    (tmp_path / "ch").mkdir()
    args = [a.format(job=tmp_path / "job", tmp=tmp_path) for a in cmd]
    limit = "100B" if cmd[1] == "astra-sim" else "50KB"   # 8 collectives x 20 B; 32,040 nodes x 80+ B
    shown = "100 bytes" if cmd[1] == "astra-sim" else "50,000 bytes"
    refused(*args, "--max-output", limit, match=f"the limit is {shown} (--max-output SIZE raises it)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ch", "job"] and not any((tmp_path / "ch").iterdir())
    code, _, err = cli(*args, "--max-output", "1GB")
    assert code == 0, err


@pytest.mark.parametrize("cmd", EXPORTS, ids=lambda c: "-".join(c[:2]) + c[-1][-4:])
def test_a_bad_max_output_is_refused_before_the_job_is_read(tmp_path, cmd):
    """The size is read once, first: a Job that does not exist is not what the error names."""
    args = [a.format(job=tmp_path / "nowhere", tmp=tmp_path) for a in cmd]
    refused(*args, "--max-output", "lots", match="--max-output")


def test_exports_are_bounded_by_default(tmp_path, monkeypatch):
    """Without --max-output the default limit applies (64 GB, here lowered to keep the test small)."""
    from echo_et.ir import budget

    save_job(repeated_job(), tmp_path / "job")
    monkeypatch.setattr(budget, "DEFAULT_MAX_OUTPUT_BYTES", 10**6)
    refused("export", "chrome", tmp_path / "job", "-o", tmp_path / "c",
            match="export chrome would write at least 6.4 MB (32,040 nodes over 8 ranks, >= 200 bytes each); "
                  "the limit is 1.0 MB")
    assert not (tmp_path / "c").exists()


# -- a user's script: bounded before it runs (the layout) and as it records ---------------------------------
USER_DDP = FIXTURES / "jobs" / "user_ddp.py"
ENDLESS = '''
import torch


def build(ctx):
    x = torch.zeros(4, device=ctx.device)

    def step():
        y = x
        for _ in range(10 ** 9):      # never ends on its own
            y = y + 1
    return step
'''


def test_trace_of_a_script_on_an_absurd_layout_is_refused_before_it_runs(tmp_path, monkeypatch):
    import echo_et.trace.tracer as tracer

    monkeypatch.setattr(tracer, "trace", lambda *a, **k: pytest.fail("traced an absurd layout"))
    refused("trace", "--script", f"{USER_DDP}:build", "--dp", "262144", "--verify", "all", "--device", "meta",
            "-o", tmp_path / "t", match="--verify all: tracing runs the model at least 524,288 times "
            "(262,144 ranks x 2 steps); the limit is 65,536")
    refused("trace", "--script", f"{USER_DDP}:build", "--dp", "40000", "--verify", "all", "--warmup", "0",
            "--steps", "2", "-o", tmp_path / "t", match="80,000 times (40,000 ranks x 2 steps)")
    assert not (tmp_path / "t").exists()


def test_a_script_that_records_without_end_stops_at_the_node_limit(tmp_path, monkeypatch):
    import echo_et.trace.direct as direct

    (tmp_path / "endless.py").write_text(ENDLESS)
    monkeypatch.setattr(direct, "MAX_GRAPH_NODES", 20_000)
    refused("trace", "--script", f"{tmp_path / 'endless.py'}:build", "--device", "meta", "--jobs", "1",
            "-o", tmp_path / "t", match=["rank 0", "the step recorded more than 20,000 operators, the limit of "
                                         "nodes per graph"])
    assert not (tmp_path / "t").exists()


def test_a_script_whose_recording_passes_the_memory_budget_stops(tmp_path, monkeypatch):
    import echo_et.trace.direct as direct

    (tmp_path / "endless.py").write_text(ENDLESS)
    monkeypatch.setattr(direct, "total_memory", lambda: 10 ** 6)
    refused("trace", "--script", f"{tmp_path / 'endless.py'}:build", "--device", "meta", "--jobs", "1",
            "-o", tmp_path / "t", match=["recording the step took", "of memory after 16,384 operators; the limit "
                                         "is 0.9 MB (9/10 of this machine's memory)"])


def test_a_profile_beyond_the_node_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """On cpu/cuda the step runs under torch.profiler: its exported profile is measured
    before the reader loads it (here the bytes-per-event bound is lowered to trip it)."""
    import echo_et.trace.session as session
    from echo_et.converters import kineto

    monkeypatch.setattr(session, "MAX_PROFILE_BYTES_PER_EVENT", 0)
    monkeypatch.setattr(kineto, "read", lambda *a, **k: pytest.fail("read the profile"), raising=False)
    refused("trace", "--script", f"{USER_DDP}:build", "--device", "cpu", "--jobs", "1", "-o", tmp_path / "t",
            match=["the profile of the measured step is", "more than 1,048,576 events"])


# -- a CC profile re-typed (campaign seed 2026, case 1194: hardware = 5 was an AttributeError) ---------------
PRESET = Path(__file__).resolve().parents[1] / "echo_et" / "models" / "comm" / "presets" / "a100-ib.json"


@pytest.mark.parametrize("path,value,shown", [
    (["hardware"], 5, "hardware must be an object, got 5"),
    (["gpu_match"], {"a": 1}, "gpu_match must be a list"),
    (["fit"], [], "fit must be an object, got []"),
    (["calibrated"], "yes", "calibrated must be true or false"),
    (["nccl", "node", "nvls"], {"rank": 0}, "NCCL node fact nvls = {'rank': 0} is not true or false"),
    (["nccl", "node", "nic_bw"], "25", "NCCL node fact nic_bw = 25 is not a number"),
    (["nccl", "node", "nics_per_node"], 1e30, "NCCL node fact nics_per_node = 1e+30 is not a number"),
    # beyond an int64: refused by the model-file reader before the loader's 1..32
    (["nccl", "max_channels"], 2 ** 64, "nccl.max_channels = 18446744073709551616 is beyond a 64-bit integer"),
    (["nccl", "max_channels"], 2 ** 40, "nccl.max_channels = 1099511627776 is out of range (1..32)"),
    (["params", "nvlink_gbps"], 5e-324, "parameter nvlink_gbps = 4.94066e-324 is out of range (1e-12 to 1e+15)"),
    (["params", "host_launch_us"], 1e300, "parameter host_launch_us = 1e+300 is out of range"),
])
def test_a_comm_profile_of_the_wrong_types_or_magnitudes_is_one_line(tmp_path, path, value, shown):
    doc = json.loads(PRESET.read_text())
    node = doc
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value
    (tmp_path / "p.json").write_text(json.dumps(doc))
    refused("estimate", "all_reduce", "--bytes", "1MB", "--ranks", "8", "--profile", tmp_path / "p.json",
            match=shown)


# -- a warning before an error is two lines (campaign seed 2026 after the fixes, cases 18, 471, 494) -----------
def test_a_truncated_log_refused_later_prints_its_error_alone(tmp_path, shared_data):
    """A truncated nccl-tests log (a warning naming its missing sizes when it is fitted) beside
    a log of another node type (refused): the error line comes alone, the warning only when
    the fit goes ahead."""
    h100 = (shared_data / "nccl-tests" / "h100-c01" / "1n8g-all_gather.log").read_bytes()
    cut = tmp_path / "h100.log"
    cut.write_bytes(h100[:2479])
    a100 = shared_data / "nccl-tests" / "echo-a100" / "nccl_8.log"
    refused("calibrate", "nccl-tests", cut, a100, "--gpus-per-node", "8", "-o", tmp_path / "p.json",
            match="the logs name GPUs of different node types")
    code, _, err = cli("calibrate", "nccl-tests", cut, "--gpus-per-node", "8", "-o", tmp_path / "p.json")
    assert code == 0 and err.startswith("warning: h100.log:") and "are missing (a truncated log?)" in err, err


@pytest.mark.parametrize("key", ["Ev Idx", "Record function id"])
@pytest.mark.parametrize("value", [2 ** 64, -(2 ** 63) - 1])
def test_record_function_id_beyond_int64_links_nothing(tmp_path, key, value):
    # found by the hostile campaign (seed 1208): a host op's id that no int64 holds was a
    # protobuf ValueError traceback; it is no record-function id, so it links nothing
    from echo_et.converters import ReadOptions, read

    evs = base_events()
    op = next(e for e in evs if e["name"] == "aten::linear")
    op["args"][key] = value
    if key == "Record function id":   # the ids that are ints stay linked
        next(e for e in evs if e["name"] == "aten::addmm")["args"][key] = 7
    p = write(tmp_path, evs, name="rf.json")
    job = read([p], "kineto", ReadOptions())
    nodes = {n.name: n for n in job.graph(job.graph_ids()[0]).iter_nodes()}
    assert nodes["aten::linear"].cpu.rf_id == 0 and "rf_id_source" not in nodes["aten::linear"].attrs
    assert nodes["aten::addmm"].cpu.rf_id == (7 if key == "Record function id" else 3)
    assert cli("convert", p, "-o", tmp_path / "j")[0] == 0
