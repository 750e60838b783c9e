"""CLI: echo-et simulate / validate / calibrate slowdown, including bad input."""

from __future__ import annotations

import json

import pytest
from test_sim import dp_job, two_rank_allreduce
from typer.testing import CliRunner

from conftest import shared_path
from echo_et.cli.main import app
from echo_et.ir import save_job
from echo_et.sim import simulate

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture()
def job_dir(tmp_path):
    return save_job(dp_job(8), tmp_path / "job")


def test_simulate_json(job_dir) -> None:
    r = run("simulate", str(job_dir), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("step_time_ns", "ranks", "critical_path", "simulated_ranks", "events"):
        assert key in out
    assert out["simulated_ranks"] == 1 and len(out["ranks"]) == 8
    for rr in out["ranks"].values():
        assert set(rr) >= {"step_time_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "bubble_ns", "host_idle_ns"}
    assert out["step_time_ns"] == simulate(dp_job(8)).step_time_ns
    full = json.loads(run("simulate", str(job_dir), "--json", "--no-symmetry").stdout)
    assert full["simulated_ranks"] == 8 and full["ranks"] == out["ranks"] | {
        k: v | {"simulated_as": int(k)} for k, v in out["ranks"].items()}


def test_simulate_straggler_and_table(job_dir) -> None:
    base = json.loads(run("simulate", str(job_dir), "--json").stdout)
    slow = json.loads(run("simulate", str(job_dir), "--json", "--straggler", "2:2.0", "--straggler", "5:1.5").stdout)
    assert slow["step_time_ns"] > base["step_time_ns"] and slow["simulated_ranks"] == 3
    assert slow["options"]["stragglers"] == {"2": 2.0, "5": 1.5}
    r = run("simulate", str(job_dir))
    assert r.exit_code == 0 and "critical path" in r.stdout and "step time" in r.stdout


def test_simulate_timeline(job_dir, tmp_path) -> None:
    out = tmp_path / "sim.json"
    r = run("simulate", str(job_dir), "--timeline", str(out), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["distributedInfo"]["ranks"] == list(range(8))
    assert len({e["pid"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}) == 8
    assert json.loads(r.stdout)["timeline"]["events"] > 0
    # a folder of rank files, only the ranks asked for
    r = run("simulate", str(job_dir), "--timeline", str(tmp_path / "trace"), "--timeline-rank", "3",
            "--timeline-rank", "6", "--json")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "trace").iterdir()) == ["rank-3.json", "rank-6.json"]
    assert json.loads(r.stdout)["timeline"]["ranks"] == 2
    bad = run("simulate", str(job_dir), "--timeline", str(tmp_path / "t2"), "--timeline-rank", "8")
    assert bad.exit_code == 2 and "--timeline-rank 8" in bad.stderr and not (tmp_path / "t2").exists()
    assert run("simulate", str(job_dir), "--timeline-rank", "1").exit_code == 2


def test_simulate_predict_with_preset_and_what_ifs(job_dir) -> None:
    base = json.loads(run("simulate", str(job_dir), "--mode", "predict", "--preset", "a100-ib", "--json").stdout)
    assert base["mode"] == "predict" and base["slowdown"]["applied"]
    slow_net = json.loads(run("simulate", str(job_dir), "--mode", "predict", "--preset", "a100-ib",
                              "--inter-bw", "1GB/s", "--json").stdout)
    assert slow_net["step_time_ns"] > base["step_time_ns"]  # 8 ranks on 2 nodes (4 GPUs each)
    fast = json.loads(run("simulate", str(job_dir), "--mode", "predict", "--preset", "a100-ib",
                          "--compute-scale", "0.5", "--no-slowdown", "--json").stdout)
    assert fast["step_time_ns"] < base["step_time_ns"] and not fast["slowdown"]["applied"]
    one_node = json.loads(run("simulate", str(job_dir), "--mode", "predict", "--preset", "a100-ib",
                              "--gpus-per-node", "8", "--inter-bw", "1GB/s", "--json").stdout)
    assert one_node["step_time_ns"] < slow_net["step_time_ns"]  # all 8 ranks on one node now


def test_validate_json_and_table(tmp_path) -> None:
    job = two_rank_allreduce()
    job.manifest.hardware.gpu_name = "NVIDIA A100-SXM4-40GB"
    d = save_job(job, tmp_path / "j")
    r = run("validate", str(d), "--json")
    assert r.exit_code == 0, r.output
    v = json.loads(r.stdout)
    for key in ("measured_step_ns", "replay_step_ns", "predict_step_ns", "replay_error_pct", "predict_error_pct"):
        assert key in v and key in v["ranks"]["0"]
    assert v["measured_step_ns"] == 350 and v["replay_step_ns"] == 350 and v["replay_error_pct"] == 0.0
    t = run("validate", str(d), "--preset", "a100-ib")
    assert t.exit_code == 0 and "measured" in t.stdout and "predict" in t.stdout


def _one_line_error(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def test_bad_inputs_exit_2_with_one_line(job_dir, tmp_path) -> None:
    assert "no such file" in _one_line_error(run("simulate", str(tmp_path / "missing"), "--json"))
    bad = save_job(two_rank_allreduce(coll1=3), tmp_path / "bad")  # all_reduce vs reduce_scatter
    assert "collective-sequence" in _one_line_error(run("simulate", str(bad)))
    assert "RANK:FACTOR" in _one_line_error(run("simulate", str(job_dir), "--straggler", "3"))
    assert "not in the job" in _one_line_error(run("simulate", str(job_dir), "--straggler", "99:2"))
    assert "only apply with --mode predict" in _one_line_error(run("simulate", str(job_dir), "--inter-bw", "5GB/s"))
    assert "--mode" in _one_line_error(run("simulate", str(job_dir), "--mode", "fast"))
    assert "--compute-scale" in _one_line_error(run("simulate", str(job_dir), "--compute-scale", "0"))
    (tmp_path / "dir.json").mkdir()
    assert "is a directory" in _one_line_error(run("simulate", str(job_dir), "--timeline", str(tmp_path / "dir.json")))
    sd = tmp_path / "sd.json"
    sd.write_text("[]")
    msg = _one_line_error(run("simulate", str(job_dir), "--mode", "predict", "--preset", "a100-ib",
                              "--slowdown", str(sd)))
    assert "not an echo-et slowdown model" in msg
    assert "preset" in _one_line_error(run("simulate", str(job_dir), "--mode", "predict", "--preset", "nope"))


def test_deadlock_is_an_error_on_the_cli(tmp_path) -> None:
    from test_sim import _two_groups_opposite_order

    d = save_job(_two_groups_opposite_order(), tmp_path / "dl")
    assert "deadlock" in _one_line_error(run("simulate", str(d), "--json"))


def test_calibrate_slowdown_from_csv(tmp_path) -> None:
    csv = shared_path("slowdown/echo-a100-gpt2/merged_features.csv")
    out = tmp_path / "slowdown.json"
    r = run("calibrate", "slowdown", str(csv), "-o", str(out), "--json")
    assert r.exit_code == 0, r.output
    model = json.loads(out.read_text())
    assert model["format"] == "echo-et-slowdown/1" and "norm" in model["classes"]
    cv = model["fit"]["cross_validation"]
    assert cv["grouped_by"] == "kernel name" and cv["folds"] == 5
    assert json.loads(r.stdout)["output"] == str(out)
    before = out.read_bytes()
    assert run("calibrate", "slowdown", str(csv), "-o", str(out), "--json").exit_code == 0
    assert out.read_bytes() == before  # deterministic
    job = save_job(dp_job(8), tmp_path / "job")
    r = run("simulate", str(job), "--mode", "predict", "--preset", "a100-ib", "--slowdown", str(out), "--json")
    assert r.exit_code == 0, r.output


def test_calibrate_slowdown_bad_inputs(tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    out = tmp_path / "o.json"
    assert "missing column" in _one_line_error(run("calibrate", "slowdown", str(bad), "-o", str(out)))
    assert not out.exists() and not list(tmp_path.glob(".o.json*"))
    # a job where nothing overlaps communication has nothing to fit
    d = save_job(two_rank_allreduce(), tmp_path / "j")
    assert "nothing to fit" in _one_line_error(run("calibrate", "slowdown", str(d), "-o", str(out)))
    assert not out.exists()


def test_predict_with_a_calibrated_profile_and_a_bad_one(tmp_path) -> None:
    logs = sorted(shared_path("nccl-tests/echo-a100").glob("nccl_*.log"))
    prof = tmp_path / "a100.json"
    r = run("calibrate", "nccl-tests", *map(str, logs), "--gpus-per-node", "8", "-o", str(prof))
    assert r.exit_code == 0, r.output
    job = save_job(dp_job(8), tmp_path / "job")
    a = json.loads(run("simulate", str(job), "--mode", "predict", "--profile", str(prof), "--json").stdout)
    b = json.loads(run("simulate", str(job), "--mode", "predict", "--profile", str(prof), "--intra-bw", "10GB/s",
                       "--json").stdout)
    assert a["mode"] == "predict" and b["step_time_ns"] > a["step_time_ns"]  # 4 ranks per node share NVLink
    bad = tmp_path / "not_a_profile.json"
    bad.write_text(json.dumps({"format": "echo-et-slowdown/1"}))
    _one_line_error(run("simulate", str(job), "--mode", "predict", "--profile", str(bad)))
    assert "not both" in _one_line_error(run("simulate", str(job), "--mode", "predict", "--profile", str(prof),
                                              "--preset", "a100-ib"))


def test_an_unknown_preset_is_refused_before_the_job_is_read(tmp_path) -> None:
    """The name is checked with the other options: a Job that does not even exist is not
    reached (on a large Job, loading and retiming it took seconds before the error)."""
    r = run("simulate", str(tmp_path / "no-such-job"), "--mode", "predict", "--preset", "a100")
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: unknown preset 'a100' (presets: a100-ib, ")
