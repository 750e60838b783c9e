"""The timeline writer's scratch file: where it is made, how large it gets, and that the
free-space check before a write (``--max-output``'s) counts it: ``simulate --timeline``,
``export chrome`` when it cannot stream."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from test_astra_sim_support import uniform_job
from test_hostile_input import cli, refused

from conftest import FIXTURES
from echo_et.cli import common
from echo_et.cli.sim_cmds import sim_timeline_scratch
from echo_et.converters import chrome
from echo_et.converters.chrome import spool
from echo_et.ir import load_job, pb, save_job
from echo_et.ir.budget import BYTES_PER_NODE, nodes_by_rank

JOB = FIXTURES / "jobs" / "gpt-dp4-zero1"


@pytest.fixture
def scratch_files(monkeypatch) -> list[dict]:
    """Each scratch file the writer makes: the folder it is in and the most it held."""
    made: list[dict] = []
    make, put = tempfile.TemporaryFile, spool.Spool.put

    def temporary_file(*args, dir=None, **kwargs):   # noqa: A002 - tempfile's own keyword
        made.append({"dir": Path(dir), "peak": 0})
        return make(*args, dir=dir, **kwargs)

    def put_and_measure(self, e):
        got = put(self, e)
        made[-1]["peak"] = max(made[-1]["peak"], self.end)
        return got

    monkeypatch.setattr(spool.tempfile, "TemporaryFile", temporary_file)
    monkeypatch.setattr(spool.Spool, "put", put_and_measure)
    return made


def fake_free_space(monkeypatch, free: dict[str, tuple[int, int]]) -> None:
    """``free_space`` of a path: (device, free bytes) of the first of ``free``'s folders it
    lies in (longest first)."""
    def free_space(path):
        p = str(Path(path).absolute())
        for where in sorted(free, key=len, reverse=True):
            if p == where or p.startswith(where + "/"):
                return free[where]
        raise AssertionError(f"free space asked of {p}")

    monkeypatch.setattr(common, "free_space", free_space)


@pytest.mark.parametrize("name", ["t.json", "t"])
def test_the_scratch_file_is_in_the_outputs_folder_and_holds_at_least_the_estimate(tmp_path, scratch_files,
                                                                                   name) -> None:
    dest = tmp_path / name
    code, _, err = cli("simulate", JOB, "--timeline", dest)
    assert code == 0, err
    assert len(scratch_files) == 1
    made = scratch_files[0]
    # one file: beside it; a folder: in the temporary folder beside it (the output's file system)
    assert (made["dir"] if name.endswith(".json") else made["dir"].parent) == chrome.scratch_dir(dest) == tmp_path
    est = sim_timeline_scratch(load_job(JOB), dest, None, None)
    counts = list(nodes_by_rank(load_job(JOB)).values())
    # one file: every event; a folder rank by rank: the last rank's
    assert est.events == (sum(counts) if name.endswith(".json") else counts[-1])
    assert est.bytes <= made["peak"] <= 2 * est.bytes, (est, made)


@pytest.mark.parametrize("name", ["t.json", "t"])
def test_simulate_timeline_counts_the_scratch_file_in_the_free_space(tmp_path, monkeypatch, name) -> None:
    """The output alone fits; with its scratch file it does not: refused, nothing written."""
    job = load_job(JOB)
    dest = tmp_path / name
    counts = list(nodes_by_rank(job).values())
    out = sum(counts) * BYTES_PER_NODE["chrome"]
    scratch = (sum(counts) if name.endswith(".json") else counts[-1]) * chrome.RECORD_MIN_BYTES
    fake_free_space(monkeypatch, {str(tmp_path): (1, out + scratch - 1)})
    refused("simulate", JOB, "--timeline", dest,
            match=[f"{dest}: the simulated timeline would write at least", "and keep a scratch file of at least",
                   f"in {tmp_path} while it writes; their file system has"])
    assert list(tmp_path.iterdir()) == []
    fake_free_space(monkeypatch, {str(tmp_path): (1, out + scratch)})
    code, _, err = cli("simulate", JOB, "--timeline", dest)
    assert code == 0 and dest.exists(), err


def test_a_scratch_file_on_another_file_system_is_held_to_that_ones_free_space(tmp_path, monkeypatch) -> None:
    job = load_job(JOB)
    dest, elsewhere = tmp_path / "out" / "t.json", tmp_path / "scratch"
    dest.parent.mkdir()
    elsewhere.mkdir()
    out = sum(nodes_by_rank(job).values()) * BYTES_PER_NODE["chrome"]
    scratch = chrome.ScratchEstimate(elsewhere, 1000, 1000 * chrome.RECORD_MIN_BYTES)

    def check() -> None:
        common.check_output_budget(job, "chrome", dest, common.max_output_bytes(None), name="the simulated timeline",
                                   scratch=scratch)

    # the output's file system holds the output, not output + scratch: the scratch is not there
    fake_free_space(monkeypatch, {str(dest.parent): (1, out), str(elsewhere): (2, scratch.bytes)})
    check()
    fake_free_space(monkeypatch, {str(dest.parent): (1, out), str(elsewhere): (2, scratch.bytes - 1)})
    with pytest.raises(common.EchoError, match=f"^{elsewhere}: the simulated timeline would keep a scratch file of "
                                               r"at least 0.1 MB \(1,000 events, >= 100 bytes each\) in "
                                               f"{elsewhere} while it writes; its file system has 99,999 bytes free$"):
        check()
    # on the output's own file system the two add up
    fake_free_space(monkeypatch, {str(dest.parent): (1, out + scratch.bytes - 1), str(elsewhere): (1, 10**12)})
    with pytest.raises(common.EchoError, match="and keep a scratch file"):
        check()


def _shared_pid_job():
    """GPU 150 of rank 0 and GPU 50 of rank 1 are one process of a job file: export chrome
    cannot stream it and writes it through the timeline writer (tests/test_chrome_export.py)."""
    def build(gb, r, s):
        gpu = gb.stream(pb.STREAM_GPU_COMPUTE, "far", device=150 if r == 0 else 50)
        gb.compute("gemm", gpu, start_ns=1_000 + r, duration_ns=2_000)
        gb.compute("gemm2", s["compute"], start_ns=500, duration_ns=2_000)

    return uniform_job(2, build)


def test_export_chrome_counts_a_scratch_file_only_when_it_cannot_stream(tmp_path, monkeypatch,
                                                                         scratch_files) -> None:
    gpt = load_job(JOB)
    assert chrome.export_scratch(gpt, tmp_path / "t.json") is None        # streamed: no scratch
    assert chrome.export_scratch(gpt, tmp_path / "t") is None
    job = _shared_pid_job()
    assert chrome.export_scratch(job, tmp_path / "t") is None
    est = chrome.export_scratch(job, tmp_path / "t.json")
    assert est is not None and est.events == 4 and est.where == tmp_path
    save_job(job, tmp_path / "job")
    dest = tmp_path / "t.json"
    out = 4 * BYTES_PER_NODE["chrome"]
    fake_free_space(monkeypatch, {str(tmp_path): (1, out + est.bytes - 1)})
    refused("export", "chrome", tmp_path / "job", "-o", dest,
            match=[f"{dest}: export chrome would write at least 800 bytes", "scratch file of at least 400 bytes"])
    assert not dest.exists() and scratch_files == []
    fake_free_space(monkeypatch, {str(tmp_path): (1, out + est.bytes)})
    code, _, err = cli("export", "chrome", tmp_path / "job", "-o", dest)
    assert code == 0 and dest.exists(), err
    assert len(scratch_files) == 1 and scratch_files[0]["dir"] == tmp_path
    assert est.bytes <= scratch_files[0]["peak"]
    # a streamed export keeps no scratch file: the output alone is held to the free space
    fake_free_space(monkeypatch, {str(tmp_path): (1, sum(nodes_by_rank(gpt).values()) * BYTES_PER_NODE["chrome"])})
    code, _, err = cli("export", "chrome", JOB, "-o", tmp_path / "gpt.json")
    assert code == 0, err
    assert len(scratch_files) == 1


def test_free_space_is_that_of_the_nearest_existing_folder(tmp_path) -> None:
    import os
    import shutil

    got = common.free_space(tmp_path / "not" / "yet" / "there.json")
    assert got is not None and got[0] == os.stat(tmp_path).st_dev
    assert abs(got[1] - shutil.disk_usage(tmp_path).free) < 1 << 30   # the same file system, a moment later
