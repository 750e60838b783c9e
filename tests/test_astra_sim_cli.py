"""``echo-et export astra-sim`` and ``echo-et check --astra-sim`` from the command line."""

from __future__ import annotations

import json

from test_astra_sim_support import uniform_job
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.ir import save_job
from echo_et.ir.schema import pb

runner = CliRunner()


def _job_dir(tmp_path, sizes=(4096, 4096)):
    def build(gb, r, s):
        k = gb.compute("k", s["compute"], duration_ns=2_500)
        gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world",
                      in_bytes=sizes[r], deps=[k.id])
    return save_job(uniform_job(2, build), tmp_path / "job")


def test_export_astra_sim_json(tmp_path):
    job = _job_dir(tmp_path)
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out"),
                              "--intra-bw", "100", "--latency", "250", "--topology", "ring", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["workload_prefix"] == str(tmp_path / "out" / "workload")
    assert out["ranks"] == 2
    assert out["files"][:2] == ["workload.0.et", "workload.1.et"]
    assert out["mapped"] == {"all_reduce->ALL_REDUCE": 2, "compute->COMP_NODE": 2}
    assert out["network"] == {"topology": ["Ring"], "npus_count": [2], "bandwidth_gbps": [100.0],
                              "latency_ns": [250.0]}
    ok = runner.invoke(app, ["check", "--astra-sim", str(tmp_path / "out"), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout) == {"errors": [], "ok": True}


def test_check_astra_sim_reports_a_broken_export(tmp_path):
    job = _job_dir(tmp_path)
    assert runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out")]).exit_code == 0
    (tmp_path / "out" / "workload.1.et").unlink()
    res = runner.invoke(app, ["check", "--astra-sim", str(tmp_path / "out"), "--json"])
    assert res.exit_code == 1
    body = json.loads(res.stdout)
    assert body["ok"] is False
    assert any("[files-present]" in e and "rank 1" in e for e in body["errors"])


def test_job_failing_check_exits_2_with_one_line_and_no_output(tmp_path):
    job = _job_dir(tmp_path, sizes=(4096, 2048))
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "job fails check" in lines[0] and "collective-sequence" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_missing_job_and_bad_option_exit_2(tmp_path):
    res = runner.invoke(app, ["export", "astra-sim", str(tmp_path / "nope"), "-o", str(tmp_path / "o")])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    job = _job_dir(tmp_path)
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "o"),
                              "--topology", "Hypercube"])
    assert res.exit_code == 2 and "Hypercube" in res.stderr
    assert not (tmp_path / "o").exists()
