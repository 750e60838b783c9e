"""Fitting the compute model to measured iterations through GPU- and host-bound paths."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echo_et.experiments.iteration_fit import PathSample, fit_iterations, path_ns, predicted_ns
from echo_et.ir.schema import pb
from echo_et.models.compute import ComputeModel


def _mm(m: int) -> pb.Node:
    n = pb.Node(id=1, name="aten::mm", kind=pb.KIND_COMPUTE)
    n.compute.op = "aten::mm"
    n.compute.shapes = f"[[{m}, 2048], [2048, 2048]]"
    n.compute.dtypes = '["c10::Half", "c10::Half"]'
    return n


def _launch() -> pb.Node:
    n = pb.Node(id=2, name="launch", kind=pb.KIND_LAUNCH)
    n.cpu.op = "aten::mm"
    return n


def _samples(truth: ComputeModel):
    """Configurations from tiny (host-bound) to large (GPU-bound) GEMMs, 'measured' with a
    known model."""
    out = []
    for m in (16, 64, 256, 1024, 4096, 16384):
        for n_ops in (500, 2000):
            gpu = PathSample([(_mm(m), n_ops)], 1e6)
            host = PathSample([(_launch(), n_ops)], 2e5)
            out.append((gpu, host, predicted_ns(gpu, host, truth)))
    return out


def _comm_launch() -> pb.Node:
    n = pb.Node(id=3, name="launch", kind=pb.KIND_LAUNCH)
    n.cpu.op = "c10d::all_reduce"
    return n


def test_fit_tells_a_collective_call_host_time_from_an_operator_issue_time() -> None:
    """Host-bound configurations with different shares of communication calls identify the
    host time of a collective call apart from an operator's."""
    prior = ComputeModel.preset("a100")
    truth = ComputeModel(replace(prior.profile, params={**prior.profile.params, "host_launch_ns": 40_000.0,
                                                        "host_collective_ns": 5_000.0}))
    samples = []
    for m in (16, 4096, 16384):
        for n_ops, n_comm in ((500, 0), (2000, 0), (500, 300), (2000, 100)):
            gpu = PathSample([(_mm(m), n_ops)], 1e6)
            host = PathSample([(_launch(), n_ops), (_comm_launch(), n_comm)], 2e5)
            samples.append((gpu, host, predicted_ns(gpu, host, truth)))
    model, _ = fit_iterations(samples, prior)
    assert model.host_launch_ns == pytest.approx(40_000, rel=0.05)
    assert model.host_collective_ns == pytest.approx(5_000, rel=0.1)
    assert model.launch_ns("c10d::all_reduce") == model.host_collective_ns
    assert model.launch_ns("aten::mm") == model.host_launch_ns


def test_a_profile_without_a_collective_host_time_issues_collectives_like_operators(tmp_path) -> None:
    import json

    p = tmp_path / "old.json"
    ComputeModel.preset("a100").save(p)
    d = json.loads(p.read_text())
    d["params"].pop("host_collective_ns")
    d["params"]["host_launch_ns"] = 12_345.0
    p.write_text(json.dumps(d))
    old = ComputeModel.load(p)
    assert old.host_collective_ns == old.host_launch_ns == 12_345


def test_fit_recovers_the_host_issue_time_and_the_regimes() -> None:
    prior = ComputeModel.preset("a100")
    truth = ComputeModel(replace(prior.profile, params={**prior.profile.params, "host_launch_ns": 40_000.0}))
    samples = _samples(truth)
    assert any(path_ns(h, truth) > path_ns(g, truth) for g, h, _ in samples)   # both regimes present
    assert any(path_ns(g, truth) > path_ns(h, truth) for g, h, _ in samples)
    model, info = fit_iterations(samples, prior)
    assert model.host_launch_ns == pytest.approx(40_000, rel=0.05)
    for g, h, measured in samples:
        assert predicted_ns(g, h, model) == pytest.approx(measured, rel=0.05)
    assert info["host_bound"] == sum(1 for g, h, _ in samples if path_ns(h, truth) > path_ns(g, truth))
    assert info["train_mean_abs_log_error"] < 0.05


def test_path_sample_travels_between_processes() -> None:
    s = PathSample([(_mm(64), 3), (_launch(), 5)], 123.0)
    back = PathSample.from_wire(s.to_wire())
    assert [(n.kind, n.name, c) for n, c in back.calls] == [(n.kind, n.name, c) for n, c in s.calls]
    assert back.rest_ns == 123.0


# -- calibrate compute --iterations ------------------------------------------------------------------
TINY = ("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,measured_ms\n"
        "2,64,2,32,1,2,1,1,1,4.0\n"
        "2,64,2,32,1,4,1,2,1,9.0\n"
        "2,64,2,32,1,2,3,1,1,5.0\n")    # tp 3 does not divide 2 heads: excluded, named


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "echo_et.cli.main", *args], capture_output=True, text=True,
                          timeout=600)


def test_calibrate_compute_fits_measured_iterations(tmp_path) -> None:
    import json

    csv = tmp_path / "iterations.csv"
    csv.write_text(TINY)
    out = tmp_path / "p.json"
    r = _cli("calibrate", "compute", "--iterations", str(csv), "--recompute", "--intra-bw", "150GB/s",
             "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    (src,) = prof["sources"]
    assert (src["file"], src["kind"], src["samples"], src["excluded"]) == ("iterations.csv", "iterations", 2, 1)
    it = prof["fit"]["iterations"]
    assert it["configurations"] == 2 and it["settings"]["recompute"] is True
    assert it["settings"]["cluster"]["intra_bw_gbps_per_gpu"] == 150.0
    assert "tp (3) must divide heads (2)" in json.dumps(prof["fit"]["excluded"])
    # the fitted model is what the profile says: the end-to-end parameters moved from the data sheet's
    assert prof["params"]["host_launch_ns"] != it["before"]["host_launch_ns"]
    again = tmp_path / "q.json"
    assert _cli("calibrate", "compute", "--iterations", str(csv), "--recompute", "--intra-bw", "150GB/s",
                "-o", str(again)).returncode == 0
    assert again.read_bytes() == out.read_bytes()        # deterministic


def test_calibrate_compute_iterations_with_a_collective_profile(tmp_path) -> None:
    """--comm-profile prices the measured runs' collectives with that profile; the fitted
    profile names it by file and hash, and a slower collective model leaves less for compute."""
    import json
    from pathlib import Path

    import echo_et.models.comm as comm_pkg

    csv = tmp_path / "iterations.csv"
    csv.write_text(TINY.replace("2,64,2,32,1,2,1,1,1,4.0", "2,64,2,32,1,2,2,1,1,4.0"))   # one TP row
    preset = json.loads((Path(comm_pkg.__file__).parent / "presets/a100-ib.json").read_text())
    slow = json.loads(json.dumps(preset))
    slow["name"] = "slow"
    slow["params"]["nvlink_gbps"] /= 100.0       # NVLink 100x slower
    fast_p, slow_p = tmp_path / "fast.json", tmp_path / "slow.json"
    fast_p.write_text(json.dumps(preset))
    slow_p.write_text(json.dumps(slow))
    outs = {}
    for name, prof in (("fast", fast_p), ("slow", slow_p)):
        out = tmp_path / f"{name}-compute.json"
        r = _cli("calibrate", "compute", "--iterations", str(csv), "--recompute", "--comm-profile", str(prof),
                 "-o", str(out), "--json")
        assert r.returncode == 0, r.stderr
        outs[name] = json.loads(out.read_text())
    settings = outs["slow"]["fit"]["iterations"]["settings"]["comm_profile"]
    assert settings["file"] == "slow.json" and len(settings["sha256"]) == 64
    assert outs["slow"]["params"] != outs["fast"]["params"]
    r = _cli("calibrate", "compute", "--iterations", str(csv), "--comm-profile", str(tmp_path / "none.json"),
             "-o", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "--comm-profile" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(("text", "args", "message"), [
    ("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n2,64,2,32,1,2,1,1,1\n", [],
     "line 2: no measured_ms"),
    ("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,speed\n", [], "unknown column 'speed'"),
    ("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,measured_ms,gpus\n2,64,2,32,1,2,1,1,1,4,8\n", [],
     "gpus 8 is not tp x pp x dp"),
    (TINY, ["--dtype", "int3"], "'int3' is not one of"),
    # below a nanosecond an error over it overflows to infinity (the hostile campaign, seed 1244)
    *((TINY.rsplit("\n", 2)[0] + f"\n2,64,2,32,1,2,1,1,1,{t}\n", [],
       f"measured_ms '{t}' is not a number of milliseconds from 1e-06") for t in ("1e-320", "0", "-3", "nan", "1e13")),
    (None, ["--recompute"], "--recompute only apply with --iterations"),
    (None, ["--comm-profile", "x.json"], "--comm-profile only apply with --iterations"),
])
def test_calibrate_compute_iterations_bad_input_is_one_line(tmp_path, text, args, message) -> None:
    out = tmp_path / "p.json"
    if text is None:
        r = _cli("calibrate", "compute", "--kernels", str(tmp_path / "k.csv"), *args, "-o", str(out))
    else:
        csv = tmp_path / "it.csv"
        csv.write_text(text)
        r = _cli("calibrate", "compute", "--iterations", str(csv), *args, "-o", str(out))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert not out.exists()


def test_vtrain_columns_read_as_configuration_columns(tmp_path) -> None:
    from echo_et.experiments.config_csv import read_configs

    p = tmp_path / "gt.csv"
    p.write_text("\ufeff# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                 "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
                 "8,32,4,1024,16,24,1024,2,2,2,219.732754\n")
    (row,) = read_configs(p)
    assert row == {"gpus": 8, "global_batch": 32, "micro_batch": 4, "hidden": 1024, "heads": 16, "layers": 24,
                   "seq": 1024, "tp": 2, "dp": 2, "pp": 2, "measured_ms": 219.732754}
