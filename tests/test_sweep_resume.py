"""Sweeps that never lose work: the row log, --resume, worker death and the memory budget."""

from __future__ import annotations

import functools
import json
import multiprocessing
import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_passes_scale import make_3d_job
from typer.testing import CliRunner

from conftest import dead_pid
from echo_et.cli.main import app
from echo_et.errors import EchoError, OptionError
from echo_et.experiments import config_sweep, executors
from echo_et.experiments.executors import Failure, run_local
from echo_et.experiments.row_log import LOG_FILE, LogHeader, open_row_log
from echo_et.experiments.sweep import SweepSpec, is_sweep_dir, log_header, run_sweep
from echo_et.ir import load_job, save_job

runner = CliRunner()
HEADER = "layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp"
# tiny rows (0.1 s each once warm) and two of 4 layers and 16-32 micro-batches (0.4-0.6 s):
# the killed sweep below has time to be killed between rows
ROWS = ["2,64,4,32,1,4,2,1,2", "2,64,4,32,1,8,2,1,2", "4,64,4,32,1,32,1,2,1", "4,64,4,32,1,16,1,2,1",
        "2,64,4,32,1,4,1,2,1"]


def _csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def _log_rows(out: Path) -> list[dict]:
    lines = (out / LOG_FILE).read_bytes().split(b"\n")
    return [json.loads(line) for line in lines[1:] if line.strip()]


def _config_sweep(csv: Path, out: Path, *extra: str):
    return runner.invoke(app, ["sweep", "--configs", str(csv), "-o", str(out), "--workers", "1",
                               "--no-plot", *extra])


# -- the local workers -----------------------------------------------------------------------------
def _run(tasks, **kw) -> dict[int, object]:
    got: dict[int, object] = {}
    run_local(operator.call, operator.call, list(enumerate(tasks)), report=got.__setitem__, **kw)
    return got


def test_a_worker_killed_by_a_signal_is_its_rows_error_and_a_fresh_worker_goes_on() -> None:
    got = _run([functools.partial(os.getpid), functools.partial(signal.raise_signal, signal.SIGKILL),
                functools.partial(os.getpid), functools.partial(signal.raise_signal, signal.SIGSEGV),
                functools.partial(abs, -3)], workers=1, max_memory=None)
    assert got[1] == Failure("worker died: killed by signal 9 (out of memory?)")
    assert got[3] == Failure("worker died: killed by signal 11 (SIGSEGV)")
    assert got[4] == 3
    assert got[0] != got[2] != os.getpid()   # the killed worker was replaced


def test_a_row_past_its_memory_budget_is_its_error_not_the_workers_death() -> None:
    """RLIMIT_DATA in the worker: 4 GB asked of a 2 GB budget fails at once (nothing is
    touched), and the rows before and after run."""
    got = _run([functools.partial(len, "ab"), functools.partial(bytearray, 4 * 10**9),
                functools.partial(len, "abc")], workers=2, max_memory=2 * 10**9)
    assert got == {0: 2, 1: Failure("max_memory: row needs more than 2.0 GB"), 2: 3}


def test_a_worker_is_replaced_after_its_share_of_rows(monkeypatch) -> None:
    """A long-lived worker's heap only grows: a fresh one every ROWS_PER_WORKER rows."""
    monkeypatch.setattr(executors, "ROWS_PER_WORKER", 2)
    got = _run([functools.partial(os.getpid)] * 5, workers=1, max_memory=None)
    pids = [got[i] for i in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


def test_an_interrupted_sweep_kills_its_workers_at_once() -> None:
    def stop(i: int, out: object) -> None:
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_local(operator.call, operator.call, [(0, functools.partial(abs, 1)),
                                                 (1, functools.partial(time.sleep, 60))],
                  workers=2, max_memory=None, report=stop)
    assert time.monotonic() - t0 < 20   # the worker sleeping 60 s was killed, not waited for


def test_the_default_budget_shares_the_machines_memory() -> None:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert 0 < executors.total_memory() <= total
    assert executors.default_memory_budget(4) == executors.total_memory() // 4
    assert executors.format_size(8 * 10**9) == "8.0 GB" and executors.format_size(8 * 2**30) == "8.6 GB"


# -- the row log -----------------------------------------------------------------------------------
def _header(**kw) -> LogHeader:
    return LogHeader(**{"kind": "sweep", "rows": 3, "input_sha256": "a", "options_sha256": "b", **kw})


def test_the_row_log_cuts_a_torn_last_line_and_runs_failed_workers_again(tmp_path) -> None:
    with open_row_log(tmp_path, _header(), resume=False, replaceable=is_sweep_dir, kind="a sweep") as log:
        log.append(0, {"x": 1}, seconds={"trace_s": 0.5})
        log.append(1, {"error": "worker died: killed by signal 9"}, retry=True)
    with (tmp_path / LOG_FILE).open("ab") as f:
        f.write(b'{"i":2,"row":{"x"')          # a sweep killed in the middle of a write
    with open_row_log(tmp_path, _header(), resume=True, replaceable=is_sweep_dir, kind="a sweep") as log:
        assert log.done == {0: {"x": 1}} and log.seconds == {0: {"trace_s": 0.5}}
        log.append(1, {"x": 2})
        log.append(2, {"x": 3})
    text = (tmp_path / LOG_FILE).read_text()
    assert text.endswith("\n") and '"x"\n' not in text and len(text.splitlines()) == 5
    with open_row_log(tmp_path, _header(), resume=True, replaceable=is_sweep_dir, kind="a sweep") as log:
        assert log.done == {0: {"x": 1}, 1: {"x": 2}, 2: {"x": 3}}
    with pytest.raises(OptionError, match="written for another job"):
        open_row_log(tmp_path, _header(input_sha256="c", input_name="job"), resume=True,
                     replaceable=is_sweep_dir, kind="a sweep")
    with pytest.raises(OptionError, match="written for other options"):
        open_row_log(tmp_path, _header(options_sha256="c"), resume=True, replaceable=is_sweep_dir, kind="a sweep")
    with open_row_log(tmp_path, _header(), resume=False, replaceable=is_sweep_dir, kind="a sweep") as log:
        assert log.done == {}                  # without resuming: a new log
        with pytest.raises(EchoError, match="another sweep is writing to this folder"):
            open_row_log(tmp_path, _header(), resume=True, replaceable=is_sweep_dir, kind="a sweep")


def test_starting_over_says_what_an_interrupted_run_had_done(tmp_path) -> None:
    with open_row_log(tmp_path, _header(), resume=False, replaceable=is_sweep_dir, kind="a sweep") as log:
        log.append(0, {"x": 1})
        log.append(1, {"error": "worker died"}, retry=True)
    with open_row_log(tmp_path, _header(), resume=False, replaceable=is_sweep_dir, kind="a sweep") as log:
        assert log.replaced == 1 and log.done == {}
    with open_row_log(tmp_path, _header(options_sha256="c"), resume=False, replaceable=is_sweep_dir,
                      kind="a sweep") as log:
        assert log.replaced == 0               # another sweep's log: nothing of this one lost


def test_the_row_log_never_takes_a_folder_of_the_users(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(EchoError, match="exists and is not a sweep; refusing"):
        open_row_log(tmp_path, _header(), resume=True, replaceable=is_sweep_dir, kind="a sweep")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_folder_holding_only_a_killed_runs_log_temp_is_taken_and_cleaned(tmp_path) -> None:
    """A sweep killed while it put its first log in place leaves ``.rows.jsonl.PID-*.tmp``
    and nothing else (hostile seed 1249): the rerun is not refused as a folder of the user's,
    and the leftover is gone; a live writer's temporary file still counts as content."""
    stale = tmp_path / f".{LOG_FILE}.{dead_pid()}-abc123.tmp"
    stale.write_text('{"format": "echo-et row log 1"}')
    with open_row_log(tmp_path, _header(), resume=False, replaceable=is_sweep_dir, kind="a sweep"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_FILE]
    live = tmp_path / "live"
    live.mkdir()
    (live / f".{LOG_FILE}.{os.getpid()}-abc123.tmp").write_text("being written")
    with pytest.raises(EchoError, match="exists and is not a sweep; refusing"):
        open_row_log(live, _header(), resume=False, replaceable=is_sweep_dir, kind="a sweep")


def test_predict_takes_a_folder_holding_only_a_killed_runs_leftover(tmp_path) -> None:
    from echo_et.experiments.predict_step import check_output

    out = tmp_path / "pred"
    out.mkdir()
    (out / f".summary.json.{dead_pid()}-abc123.tmp").write_text("{")
    check_output(out)                  # no refusal
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EchoError, match="not an echo-et predict folder"):
        check_output(out)


# -- the configuration sweep -------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def forkserver_with_torch() -> None:
    """Local workers fork from one forkserver per process, which imports its modules once,
    when first started: ask for the configuration sweep's (torch's included), so that the
    workers these tests start do not import torch each (3.5 s). Inert once started."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(config_sweep.PRELOAD))


@pytest.fixture()
def torch_needed() -> None:
    pytest.importorskip("torch", reason="meta-device tracing needs torch (the trace extra)")


def test_a_killed_worker_is_its_rows_error_and_the_sweep_goes_on(tmp_path, monkeypatch, torch_needed) -> None:
    csv = _csv(tmp_path / "c.csv", ROWS[:2] + ROWS[4:])
    monkeypatch.setenv(executors.KILL_ROW_ENV, "1")
    r = _config_sweep(csv, tmp_path / "out", "--json")
    assert r.exit_code == 1, r.output
    rows = json.loads(r.stdout)["rows"]
    assert rows[1]["error"] == "worker died: killed by signal 9 (out of memory?)"
    assert rows[0]["predicted_ms"] > 0 and rows[2]["predicted_ms"] > 0
    assert r.stderr.splitlines()[-1] == f"1 of 3 rows failed (see {tmp_path / 'out' / 'results.json'})"
    assert [e["i"] for e in _log_rows(tmp_path / "out") if e.get("retry")] == [1]
    # resumed without the kill, the dead worker's row runs again and the sweep is whole
    monkeypatch.delenv(executors.KILL_ROW_ENV)
    again = _config_sweep(csv, tmp_path / "out", "--resume", "--json")
    assert again.exit_code == 0, again.output
    assert "resuming: 2 of 3 rows already done" in again.stderr
    assert json.loads(again.stdout)["rows"][1]["predicted_ms"] > 0


def test_max_memory_too_small_for_a_row_is_that_rows_error(tmp_path, monkeypatch, torch_needed) -> None:
    """The test hook makes row 1 allocate past the budget (a real RLIMIT_DATA overrun: the
    allocation fails); the other rows run within the same budget."""
    csv = _csv(tmp_path / "c.csv", ROWS[:2] + ROWS[4:])
    monkeypatch.setenv(executors.HOG_ROW_ENV, "1")
    r = _config_sweep(csv, tmp_path / "out", "--max-memory", "3GB", "--json")
    assert r.exit_code == 1, r.output
    rows = json.loads(r.stdout)["rows"]
    assert rows[1]["error"] == "max_memory: row needs more than 3.0 GB"
    assert rows[0]["predicted_ms"] > 0 and rows[2]["predicted_ms"] > 0
    bad = _config_sweep(csv, tmp_path / "bad", "--max-memory", "lots")
    assert bad.exit_code == 2 and bad.stderr.strip().splitlines() == [
        "error: --max-memory: 'lots' is not a size (e.g. 4096, 4KiB, 64MiB, 1GB (KB/MB/GB are powers of 1000, "
        "KiB/MiB/GiB of 1024))"]
    assert not (tmp_path / "bad").exists()


def test_a_killed_sweep_resumes_to_the_same_bytes(tmp_path, torch_needed) -> None:
    csv = _csv(tmp_path / "c.csv", ROWS)
    whole = _config_sweep(csv, tmp_path / "whole")
    assert whole.exit_code == 0, whole.output
    assert "trace_s" not in (tmp_path / "whole" / "results.json").read_text()
    assert len(json.loads((tmp_path / "whole" / "timings.json").read_text())["rows"]) == len(ROWS)

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "echo_et.cli.main", "sweep", "--configs", str(csv), "-o",
                             str(out), "--workers", "1", "--no-plot"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / LOG_FILE).is_file() and len(_log_rows(out)) >= 1:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    logged = len(_log_rows(out))
    assert 1 <= logged < len(ROWS), "the sweep was not killed between rows"
    assert not (out / "results.json").exists()
    with (out / LOG_FILE).open("ab") as f:
        f.write(b'{"i":4,"row":{"layers":2,"hid')    # and as if killed in the middle of a write

    r = _config_sweep(csv, out, "--resume")
    assert r.exit_code == 0, r.output
    assert f"resuming: {logged} of {len(ROWS)} rows already done" in r.stderr
    assert sum(line.startswith("[") for line in r.stderr.splitlines()) == len(ROWS) - logged
    for name in ("results.json", "table.txt"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    again = _config_sweep(csv, out, "--resume")       # nothing left to run: the same bytes again
    assert again.exit_code == 0 and (out / "results.json").read_bytes() == (
        tmp_path / "whole" / "results.json").read_bytes()


@pytest.mark.parametrize("change, needle", [
    ("csv", "was written for another configuration CSV"),
    ("options", "was written for other options"),
    ("preset", "was written for other options"),
])
def test_resume_refuses_a_log_of_another_csv_or_other_options(tmp_path, torch_needed, monkeypatch, change,
                                                              needle) -> None:
    """Another CSV, other options, or the shipped compute preset refitted since (another
    echo-et release, the same options): resuming would mix rows of two models."""
    csv = _csv(tmp_path / "c.csv", ROWS[:1])
    out = tmp_path / "out"
    assert _config_sweep(csv, out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    extra = []
    if change == "csv":
        _csv(csv, ROWS[1:2])
    elif change == "options":
        extra = ["--recompute"]
    else:
        import dataclasses

        from echo_et.models.compute import model as compute_model

        shipped = compute_model.load_preset

        def refitted(name: str):
            p = shipped(name)
            return dataclasses.replace(p, params={**p.params, "host_launch_ns": p.params["host_launch_ns"] + 1.0})

        monkeypatch.setattr(compute_model, "load_preset", refitted)
        monkeypatch.setattr(config_sweep, "_MODELS", {})
    r = _config_sweep(csv, out, "--resume", *extra)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --resume: ") and needle in lines[0], r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_new_sweep_keeps_the_users_files_in_an_earlier_sweeps_folder(tmp_path, torch_needed) -> None:
    csv = _csv(tmp_path / "c.csv", ROWS[:1])
    out = tmp_path / "out"
    assert _config_sweep(csv, out).exit_code == 0
    (out / "notes.txt").write_text("mine")
    (out / "predicted_vs_measured.png").write_bytes(b"an earlier sweep's chart")
    assert _config_sweep(csv, out).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "results.json", "rows.jsonl", "table.txt",
                                                      "timings.json"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    r = _config_sweep(csv, mine)
    assert r.exit_code == 2 and "not an echo-et configuration sweep folder" in r.stderr
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


# -- the layout sweep ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    job, _ = make_3d_job(2, 2, 2)
    return save_job(job, tmp_path_factory.mktemp("resume") / "job")


def test_the_layout_sweep_logs_each_point_as_it_finishes(job_dir, tmp_path) -> None:
    spec = SweepSpec(dp=[2, 4, 8], mode="replay")
    seen: list[int] = []

    def progress(done: int, total: int, row: dict) -> None:
        seen.append(len(_log_rows(tmp_path)))        # on disk before it is reported
        assert seen[-1] == done

    with open_row_log(tmp_path, log_header(job_dir, spec, load_job(job_dir)), resume=False, replaceable=is_sweep_dir,
                      kind="a sweep") as log:
        run_sweep(load_job(job_dir), spec, workers=2, progress=progress, log=log)
    assert sorted(seen) == [1, 2, 3]
    assert sorted(e["i"] for e in _log_rows(tmp_path)) == [0, 1, 2]


def test_a_predicting_layout_sweep_is_not_resumed_with_a_refitted_collective_preset(job_dir, tmp_path,
                                                                                     monkeypatch) -> None:
    import dataclasses

    import echo_et.models.comm as comm

    args = ["sweep", str(job_dir), "--dp", "2,4", "--mode", "predict", "--preset", "a100-ib", "--workers", "1",
            "--no-plot", "-o", str(tmp_path / "out")]
    assert runner.invoke(app, args).exit_code == 0
    assert runner.invoke(app, [*args, "--resume"]).exit_code == 0       # the same model: resumed
    shipped = comm.load_preset

    def refitted(name: str):
        p = shipped(name)
        return dataclasses.replace(p, params={**p.params, "net_gbps": p.params["net_gbps"] * 1.01})

    monkeypatch.setattr(comm, "load_preset", refitted)
    r = runner.invoke(app, [*args, "--resume"])
    assert r.exit_code == 2 and "was written for other options" in r.stderr, r.output


def test_the_layout_sweep_resumes_to_the_same_bytes(job_dir, tmp_path) -> None:
    args = ["sweep", str(job_dir), "--dp", "2,4,8", "--mode", "replay", "--workers", "1", "--no-plot"]
    out = tmp_path / "out"
    assert runner.invoke(app, [*args, "-o", str(out)]).exit_code == 0
    whole = {n: (out / n).read_bytes() for n in ("results.json", "table.txt")}
    log = (out / LOG_FILE).read_bytes().split(b"\n")
    (out / LOG_FILE).write_bytes(b"\n".join(log[:2]) + b'\n{"i":1,"ro')   # killed after one point
    (out / "results.json").unlink()
    r = runner.invoke(app, [*args, "-o", str(out), "--resume"])
    assert r.exit_code == 0, r.output
    assert "resuming: 1 of 3 points already done" in r.stderr
    assert sum(line.startswith("[") for line in r.stderr.splitlines()) == 2
    assert {n: (out / n).read_bytes() for n in whole} == whole
    other = runner.invoke(app, [*args[:3], "2,4", *args[4:], "-o", str(out), "--resume"])
    assert other.exit_code == 2 and "error: --resume: " in other.stderr and "other options" in other.stderr


@pytest.mark.parametrize("executor, package, hint", [
    ("dask", "distributed", "pip install 'dask[distributed]'"),
    ("ray", "ray", "pip install ray"),
])
def test_a_point_whose_worker_dies_is_its_error(job_dir, monkeypatch, executor, package, hint) -> None:
    pytest.importorskip(package, reason=f"the {executor} executor is optional ({hint})")
    monkeypatch.setenv(executors.KILL_ROW_ENV, "1")
    res = run_sweep(load_job(job_dir), SweepSpec(dp=[2, 4, 8], mode="replay"), executor=executor, workers=2)
    assert res.rows[1]["error"].startswith("worker died: ")
    assert res.rows[0]["step_time_ns"] > 0 and res.rows[2]["step_time_ns"] > 0
