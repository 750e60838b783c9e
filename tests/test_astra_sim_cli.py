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
                              "--intra-bw", "100GB/s", "--latency", "250", "--topology", "ring", "--json"])
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


def _timed_job_dir(tmp_path):
    def build(gb, r, s):
        op = gb.cpu_op("step", s["cpu"], start_ns=0, duration_ns=60_000)
        launch = gb.cpu_op("cudaLaunchKernel", s["cpu"], kind=pb.KIND_LAUNCH, start_ns=1_000,
                           duration_ns=2_000, deps=[(op.id, pb.DEP_CONTROL)])
        k = gb.compute("k", s["compute"], start_ns=5_000, duration_ns=20_000, deps=[(launch.id, pb.DEP_LAUNCH)])
        ar = gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=1 << 20,
                           start_ns=25_000, duration_ns=15_000, deps=[k.id])
        gb.cpu_op("cudaStreamSynchronize", s["cpu"], kind=pb.KIND_SYNC, start_ns=30_000,
                  duration_ns=12_000, deps=[(ar.id, pb.DEP_SYNC)])
    return save_job(uniform_job(2, build), tmp_path / "job")


def test_export_fits_the_network_to_a_preset_and_reports_the_expected_step(tmp_path):
    job = _timed_job_dir(tmp_path)
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out"), "--preset",
                              "a100-ib", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    fit = out["network_fit"]
    assert fit["source"].startswith("model:") and len(fit["bandwidth_gbps"]) == 1
    (row,) = fit["residuals"]
    assert (row["collective"], row["bytes"], row["group_size"]) == ("all_reduce", 1 << 20, 2)
    assert abs(row["error_pct"]) < 1                       # one size: the fit is exact
    assert out["network"]["bandwidth_gbps"] == fit["bandwidth_gbps"]
    assert out["expected_comm"] == "model" and out["replay_step_ns"] == 60_000
    assert out["expected_step_ns"] > 0
    text = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out"), "--preset",
                               "a100-ib"])
    assert "network fitted to model:" in text.stdout and "expected step" in text.stdout


def test_export_measured_network_and_expected_step_keep_the_replay(tmp_path):
    job = _timed_job_dir(tmp_path)
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out"),
                              "--measured-network", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["network_fit"]["source"] == "measured"
    assert out["expected_comm"] == "measured"
    assert out["expected_step_ns"] == out["replay_step_ns"] == 60_000
    assert out["time"]["host_waits_elastic"] == 2 and out["merged"]["sync (into host segments)"] == 2


def test_export_warns_when_busy_time_has_no_counterpart(tmp_path):
    job = _timed_job_dir(tmp_path)
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out"),
                              "--host-time", "fold", "--json"])
    assert res.exit_code == 0
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning: rank")]
    assert len(warnings) == 2 and "has no counterpart in the export" in warnings[0]
    out = json.loads(res.stdout)
    assert out["dropped"]["host time (folded)"] > 0
    assert out["expected_step_ns"] < out["replay_step_ns"]
    clean = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out2"), "--json"])
    assert "warning" not in clean.stderr
    quick = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "out3"), "--json",
                                "--no-expected"])
    assert quick.exit_code == 0
    assert json.loads(quick.stdout)["expected_step_ns"] is None


def test_export_network_source_options_are_exclusive(tmp_path):
    job = _timed_job_dir(tmp_path)
    for extra in (["--preset", "a100-ib", "--measured-network"], ["--preset", "a100-ib", "--profile", "x.json"],
                  ["--preset", "no-such-preset"], ["--host-time", "drop"]):
        res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "o"), *extra])
        assert res.exit_code == 2, extra
        assert len(res.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "o").exists()


def _a2a_job_dir(tmp_path):
    def build(gb, r, s):
        gb.collective("a2a", s["comm"], coll_type=pb.COLL_ALL_TO_ALL, group="world", in_bytes=4096, out_bytes=4096)
    return save_job(uniform_job(4, build), tmp_path / "a2a_job")


def test_all_to_all_mapping_option(tmp_path):
    job = _a2a_job_dir(tmp_path)
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "p2p"), "--json", "--no-expected"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["mapped"] == {"all_to_all(even)->COMM_SEND_NODE/COMM_RECV_NODE per peer": 4}
    res = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "ring"), "--all-to-all", "ring",
                              "--json", "--no-expected"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["mapped"] == {"all_to_all(even)->ALL_TO_ALL": 4}
    bad = runner.invoke(app, ["export", "astra-sim", str(job), "-o", str(tmp_path / "bad"), "--all-to-all", "direct"])
    assert bad.exit_code == 2
    assert bad.stderr.strip() == "error: --all-to-all: all-to-all mapping 'direct': use p2p or ring"
    assert not (tmp_path / "bad").exists()
