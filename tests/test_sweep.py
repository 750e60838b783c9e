"""sweep: every grid point scaled and simulated, on a local process pool and on Dask/Ray."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from test_passes_scale import make_3d_job
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.ir import save_job
from echo_et.passes import scale
from echo_et.passes.plot import line_plot
from echo_et.passes.sweep import SweepSpec, run_point, run_sweep, write_outputs
from echo_et.sim import simulate

MODE = "replay"


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    job, _ = make_3d_job(2, 2, 2)
    return save_job(job, tmp_path_factory.mktemp("sweep") / "job")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, tag = struct.unpack(">I4s", data[8:16])
    assert tag == b"IHDR" and length == 13
    w, h = struct.unpack(">II", data[16:24])
    crc = struct.unpack(">I", data[29:33])[0]
    assert crc == zlib.crc32(data[12:29])
    return w, h


def test_png_writer_is_valid_and_deterministic() -> None:
    a = line_plot({"pp=2": [(8, 1.0), (64, 2.0)]}, title="t", width=200, height=120)
    b = line_plot({"pp=2": [(8, 1.0), (64, 2.0)]}, title="t", width=200, height=120)
    assert a == b and _png_size(a) == (200, 120)
    # Decode IDAT and check the first series colour was drawn.
    idat = a[a.index(b"IDAT") + 4:a.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    assert len(raw) == 120 * (1 + 3 * 200)
    assert bytes((31, 119, 180)) in raw


def test_sweep_local_pool_matches_direct_scale_and_simulate(job_dir, tmp_path) -> None:
    spec = SweepSpec(dp=[2, 8, 4], mode=MODE)
    seen = []
    res = run_sweep(job_dir, spec, executor="local", workers=2,
                    progress=lambda d, t, row: seen.append((d, t)))
    assert [r["dp"] for r in res.rows] == [2, 4, 8]
    assert [r["world_size"] for r in res.rows] == [8, 16, 32]
    assert sorted(seen) == [(1, 3), (2, 3), (3, 3)]
    from echo_et.ir import load_job

    direct = simulate(scale(load_job(job_dir), dp=8)[0], MODE)
    assert res.rows[2]["step_time_ns"] == direct.step_time_ns
    files = write_outputs(res, tmp_path / "out")
    assert files == ["results.json", "table.txt", "step_time.png"]
    assert _png_size((tmp_path / "out" / "step_time.png").read_bytes()) == (720, 480)
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [p["dp"] for p in data["points"]] == [2, 4, 8]


def test_sweep_point_errors_are_rows_not_crashes(job_dir) -> None:
    row = run_point(str(job_dir), {"dp": 3, "pp": None, "microbatches": None},
                    SweepSpec(dp=[3], gpus_per_node=8, mode=MODE))
    assert "gpus-per-node" in row["error"]


def test_sweep_on_a_local_dask_cluster(job_dir) -> None:
    pytest.importorskip("distributed")
    res = run_sweep(job_dir, SweepSpec(dp=[2, 4], mode=MODE), executor="dask", workers=1)
    assert res.executor == "dask"
    assert [r["world_size"] for r in res.rows] == [8, 16]
    assert all(r["step_time_ns"] > 0 for r in res.rows)


def test_sweep_on_local_ray(job_dir) -> None:
    pytest.importorskip("ray")
    res = run_sweep(job_dir, SweepSpec(dp=[2, 4], mode=MODE), executor="ray", workers=1)
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


def test_sweep_predict_prices_communication_at_each_size(job_dir) -> None:
    """Predict mode: the dp all-reduce is priced at the new group size, so exposed
    communication does not shrink as the job grows across nodes."""
    res = run_sweep(job_dir, SweepSpec(dp=[2, 64], preset="a100-ib", gpus_per_node=8), workers=1)
    small, big = res.rows
    assert small["mode"] == big["mode"] == "predict"
    assert big["world_size"] == 256 and big["exposed_comm_ns"] >= small["exposed_comm_ns"] > 0
    bad = run_point(str(job_dir), {"dp": 2, "pp": None, "microbatches": None},
                    SweepSpec(dp=[2], preset="no-such-preset"))
    assert "no-such-preset" in bad["error"]
