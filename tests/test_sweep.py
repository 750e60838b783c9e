"""sweep: every grid point scaled and simulated, on a local process pool and on Dask/Ray."""

from __future__ import annotations

import json
import struct
import sys
import zlib

import pytest
from test_passes_scale import make_3d_job
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError, OptionError
from echo_et.experiments.plots import sweep_step_time_plot
from echo_et.experiments.sweep import SweepSpec, check_sweep, run_point, run_sweep, write_outputs
from echo_et.ir import load_job, save_job
from echo_et.passes import scale
from echo_et.sim import simulate

MODE = "replay"


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    job, _ = make_3d_job(2, 2, 2)
    return save_job(job, tmp_path_factory.mktemp("sweep") / "job")


@pytest.fixture(scope="module")
def job(job_dir):
    return load_job(job_dir)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", data[8:16])
    assert tag == b"IHDR" and length == 13
    w, h = struct.unpack(">II", data[16:24])
    crc = struct.unpack(">I", data[29:33])[0]
    assert crc == zlib.crc32(data[12:29])
    return w, h


ROWS = [{"tp": 2, "pp": 2, "microbatches": 4, "world_size": w, "step_time_ns": t}
        for w, t in ((8, 1_000_000), (64, 2_000_000))]


def test_sweep_plot_is_a_deterministic_matplotlib_png(tmp_path) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    sweep_step_time_plot(ROWS, a)
    sweep_step_time_plot([*ROWS, {"dp": 3, "error": "x"}], b)  # failed points are left out
    assert a.read_bytes() == b.read_bytes() and _png_size(a.read_bytes()) == (720, 480)
    assert b"matplotlib" not in a.read_bytes()  # no version stamp: bytes depend on the data only
    sweep_step_time_plot([{**ROWS[0], "step_time_ns": 5_000_000}, ROWS[1]], b)
    assert a.read_bytes() != b.read_bytes()


def test_a_plot_without_matplotlib_is_one_clear_error(tmp_path, monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(EchoError, match=r"matplotlib.*pip install 'echo-et\[plot\]'"):
        sweep_step_time_plot(ROWS, tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_sweep_local_pool_matches_direct_scale_and_simulate(job_dir, tmp_path) -> None:
    spec = SweepSpec(dp=[2, 8, 4], mode=MODE)
    seen = []
    res = run_sweep(load_job(job_dir), spec, executor="local", workers=2,
                    progress=lambda d, t, row: seen.append((d, t)))
    assert [r["dp"] for r in res.rows] == [2, 4, 8]
    assert [r["world_size"] for r in res.rows] == [8, 16, 32]
    assert sorted(seen) == [(1, 3), (2, 3), (3, 3)]
    direct = simulate(scale(load_job(job_dir), dp=8)[0], MODE)
    assert res.rows[2]["step_time_ns"] == direct.step_time_ns
    files = write_outputs(res, tmp_path / "out")
    assert files == ["results.json", "table.txt", "step_time.png"]
    assert _png_size((tmp_path / "out" / "step_time.png").read_bytes()) == (720, 480)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [p["dp"] for p in data["points"]] == [2, 4, 8]


def test_sweep_point_errors_are_rows_not_crashes(job) -> None:
    row = run_point(job, {"dp": 3, "pp": None, "microbatches": None},
                    SweepSpec(dp=[3], gpus_per_node=8, mode=MODE))
    assert row["error"].startswith("gpus_per_node: ") and "per node" in row["error"]


def test_a_point_that_cannot_fill_nodes_is_an_error_row_without_running(job) -> None:
    spec = SweepSpec(dp=[2, 3], gpus_per_node=8, mode=MODE)  # 8 and 12 ranks
    assert check_sweep(job, spec)[0] is None and "per node" in check_sweep(job, spec)[1]
    res = run_sweep(job, spec, workers=1)
    assert res.rows[0]["step_time_ns"] > 0 and "per node" in res.rows[1]["error"]


@pytest.mark.parametrize(("changes", "option"), [
    ({"gpus_per_node": 8, "dp": [3, 5]}, "gpus_per_node"),  # no point fills whole nodes
    ({"preset": "no-such-preset", "mode": "predict"}, None),  # the CC model's own error
    ({"a2a": "sideways"}, "a2a"),
    ({"zero": 3}, "zero"),
    ({"mode": "fast"}, "mode"),
    ({"layout": "dp=3"}, "layout"),
])
def test_options_every_point_shares_are_checked_once_before_fan_out(job, monkeypatch, changes, option) -> None:
    import echo_et.experiments.executors as executors
    import echo_et.experiments.sweep as sweep_mod

    def must_not_run(*a, **k):
        raise AssertionError("the sweep fanned out")

    monkeypatch.setattr(executors, "run_rows", must_not_run)
    monkeypatch.setattr(sweep_mod, "run_point", must_not_run)
    spec = SweepSpec(**{"dp": [2, 4], "mode": MODE, **changes})
    with pytest.raises(EchoError) as err:
        run_sweep(job, spec, workers=1)
    if option is not None:
        assert isinstance(err.value, OptionError) and err.value.option == option
    assert "--" not in str(err.value)  # the library names values, not flags


def test_an_existing_folder_that_is_no_sweep_is_never_replaced(job, tmp_path) -> None:
    res = run_sweep(job, SweepSpec(dp=[2], mode=MODE), workers=1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(EchoError, match="not an echo-et sweep folder"):
        write_outputs(res, mine, plot=False)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    out = tmp_path / "out"
    assert write_outputs(res, out, plot=False) == ["results.json", "table.txt"]
    (out / "step_time.png").write_bytes(b"old")
    write_outputs(res, out, plot=False)  # an earlier sweep is replaced whole
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "table.txt"]


def test_sweep_on_a_local_dask_cluster(job) -> None:
    pytest.importorskip("distributed", reason="the dask executor is optional (pip install 'dask[distributed]')")
    res = run_sweep(job, SweepSpec(dp=[2, 4], mode=MODE), executor="dask", workers=1)
    assert res.executor == "dask"
    assert [r["world_size"] for r in res.rows] == [8, 16]
    assert all(r["step_time_ns"] > 0 for r in res.rows)


def test_sweep_on_local_ray(job) -> None:
    pytest.importorskip("ray", reason="the ray executor is optional (pip install ray)")
    res = run_sweep(job, SweepSpec(dp=[2, 4], mode=MODE), executor="ray", workers=1)
    assert [r["world_size"] for r in res.rows] == [8, 16]


def test_sweep_cli(job_dir, tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["sweep", str(job_dir), "--dp", "2,4", "--mode", MODE, "--workers", "1",
                              "-o", str(tmp_path / "sw"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [p["dp"] for p in out["points"]] == [2, 4]
    assert (tmp_path / "sw" / "step_time.png").is_file()
    assert "[2/2]" in res.stderr
    bad = runner.invoke(app, ["sweep", str(job_dir), "--dp", "2,x", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and not (tmp_path / "bad").exists()
    bad = runner.invoke(app, ["sweep", str(job_dir), "--dp", "3", "--gpus-per-node", "8", "--mode", MODE,
                              "--workers", "1", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "gpus-per-node" in bad.stderr and not (tmp_path / "bad").exists()
    assert "[1/" not in bad.stderr  # refused before any point ran


def test_sweep_predict_prices_communication_at_each_size(job_dir, job) -> None:
    """Predict mode: the dp all-reduce is priced at the new group size, so exposed
    communication does not shrink as the job grows across nodes."""
    res = run_sweep(job, SweepSpec(dp=[2, 64], preset="a100-ib", gpus_per_node=8), workers=1)
    small, big = res.rows
    assert small["mode"] == big["mode"] == "predict"
    assert big["world_size"] == 256 and big["exposed_comm_ns"] >= small["exposed_comm_ns"] > 0
    bad = run_point(job, {"dp": 2, "pp": None, "microbatches": None},
                    SweepSpec(dp=[2], preset="no-such-preset"))
    assert "no-such-preset" in bad["error"]


def test_the_base_install_never_imports_matplotlib() -> None:
    import subprocess

    code = ("import sys\n"
            "import echo_et.cli.main, echo_et.experiments.sweep, echo_et.experiments.plots\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported at import time'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_sweep_cli_without_matplotlib(job_dir, tmp_path, monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    runner = CliRunner()
    args = ["sweep", str(job_dir), "--dp", "2", "--mode", MODE, "--workers", "1"]
    asked = runner.invoke(app, [*args, "--plot", "-o", str(tmp_path / "a")])
    assert asked.exit_code == 2 and asked.stderr.strip().splitlines() == [
        "error: --plot needs matplotlib (pip install 'echo-et[plot]')"]
    assert not (tmp_path / "a").exists()
    quiet = runner.invoke(app, [*args, "-o", str(tmp_path / "b")])
    assert quiet.exit_code == 0, quiet.output
    assert "matplotlib is not installed" in quiet.stderr
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["results.json", "rows.jsonl", "table.txt"]
