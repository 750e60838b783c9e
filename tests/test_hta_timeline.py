"""HolisticTraceAnalysis reads a simulated step: its temporal breakdown, communication /
computation overlap and kernel breakdown run unchanged on our Kineto-schema timelines, and
its numbers agree with ``simulate --json`` (and, for a replayed trace, with the measured
one). ``echo-et convert`` reads the same folders back."""

from __future__ import annotations

import json
import logging

import pytest
from typer.testing import CliRunner

from conftest import shared_path, unpack
from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.converters.chrome import job_timeline, write, write_timeline
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import save_job
from echo_et.sim import simulate

hta_analysis = pytest.importorskip("hta.trace_analysis", reason="needs HolisticTraceAnalysis (the dev extra)")
logging.getLogger("hta").setLevel(logging.ERROR)

runner = CliRunner()


def _hta(folder):
    return hta_analysis.TraceAnalysis(trace_dir=str(folder))


def _temporal(folder) -> dict[int, tuple[float, float, float, float]]:
    """rank -> (idle, compute, non-compute, kernel time) in µs, as HTA computes them."""
    df = _hta(folder).get_temporal_breakdown(visualize=False)
    return {int(r["rank"]): (float(r["idle_time(us)"]), float(r["compute_time(us)"]),
                             float(r["non_compute_time(us)"]), float(r["kernel_time(us)"]))
            for _, r in df.iterrows()}


def test_hta_breakdown_of_a_simulated_step_equals_simulate_json(tmp_path) -> None:
    # A GPU job (compute kernels, NCCL collectives, P2P) whose times are whole µs, so that
    # HTA's rounding to µs loses nothing.
    job = save_job(gpt_3d_job(2, 2, 2, microbatches=2, layers=1, hidden_bytes=8_000_000), tmp_path / "job")
    r = runner.invoke(app, ["simulate", str(job), "--json", "--timeline", str(tmp_path / "trace")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    got = _temporal(tmp_path / "trace")
    assert sorted(got) == list(range(8))
    for rank, (idle, compute, non_compute, kernel) in got.items():
        v = out["ranks"][str(rank)]
        # HTA: compute = compute kernels; non-compute = communication kernels (their waits
        # inside) not under compute; idle = no kernel at all. simulate: the same split.
        assert compute * 1000 == v["compute_ns"]
        assert non_compute * 1000 == v["exposed_comm_ns"] + v["bubble_ns"]
        assert idle * 1000 == v["host_idle_ns"]
        assert kernel * 1000 == v["step_time_ns"]
    ta = _hta(tmp_path / "trace")
    overlap = ta.get_comm_comp_overlap(visualize=False)
    assert len(overlap) == 8 and overlap["comp_comm_overlap_pctg"].between(0, 100).all()
    by_type, per_kernel = ta.get_gpu_kernel_breakdown(visualize=False)
    assert {"COMMUNICATION", "COMPUTATION"} <= set(by_type["kernel_type"])


def test_hta_sees_a_replayed_trace_as_the_measured_one(tmp_path) -> None:
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    job = read(sorted(unpack(archive, tmp_path / "in").rglob("*.json")), "kineto", ReadOptions())
    write(job, tmp_path / "measured", ranks=[0, 1])
    res = simulate(job)
    write_timeline(res.timeline_events([0, 1]), tmp_path / "replayed", job=job)
    measured, replayed = _temporal(tmp_path / "measured"), _temporal(tmp_path / "replayed")
    assert measured == replayed and all(v[1] > 0 and v[2] > 0 for v in measured.values())


def test_hta_on_a_predicted_1024_rank_step(tmp_path, monkeypatch) -> None:
    """DLRM measured on 8 V100s, scaled to 1,024 ranks and predicted with a CC preset: HTA
    analyses the predicted ranks like the measured ones; with slowdown off, the compute
    kernels keep their measured time. (Predicted kernels move by fractions of a µs; HTA
    rounds ns-resolution timestamps to whole µs unless told not to.)"""
    from echo_et.models.comm import CommModel

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    from echo_et.passes.scale import scale

    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    job = read(sorted(unpack(archive, tmp_path / "in").rglob("*.json")), "kineto", ReadOptions())
    big, _ = scale(job, dp=1024)
    assert big.world_size == 1024
    res = simulate(big, "predict", comm_model=CommModel.preset("a100-ib"))
    ranks = [0, 1, 1000]
    out = write_timeline(res.timeline_events(ranks), tmp_path / "predicted", job=big)
    assert out["files"] == 3
    info = json.loads((tmp_path / "predicted" / "rank-1000.json").read_text())["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (1000, 1024)
    write(job, tmp_path / "measured", ranks=[0, 1])
    predicted, measured = _temporal(tmp_path / "predicted"), _temporal(tmp_path / "measured")
    assert sorted(predicted) == ranks
    for rank in (0, 1):
        assert predicted[rank][1] == pytest.approx(measured[rank][1], abs=0.01)   # compute, µs
    twin = next(r for r in (0, 1) if big.binding(r).graph == big.binding(1000).graph)
    assert predicted[1000][1] == pytest.approx(measured[twin][1], abs=0.01)
    assert len(_hta(tmp_path / "predicted").get_comm_comp_overlap(visualize=False)) == 3
    # and our own reader takes the predicted folder back (a partial job of 3 traced ranks)
    again = read([tmp_path / "predicted"], "kineto", ReadOptions())
    assert again.manifest.attrs.get("kineto.traced_ranks")


def test_round_trip_of_a_predicted_cpu_traced_job(tmp_path) -> None:
    """An ex-situ job (CPU-timed compute, host-thread collectives) predicted, written as
    Kineto files, read back: replaying what was read gives the predicted step again."""
    from pathlib import Path

    from echo_et.models.comm import CommModel

    job = read([Path(__file__).parents[1] / "fixtures" / "jobs" / "ddp-dp4"], None, ReadOptions())
    res = simulate(job, "predict", comm_model=CommModel.preset("a100-ib"))
    write_timeline(res.timeline_events(), tmp_path / "trace", job=job)
    again = read([tmp_path / "trace"], "kineto", ReadOptions())
    replay = simulate(again)
    assert {r: v.step_time_ns for r, v in replay.ranks.items()} == \
        {r: v.step_time_ns for r, v in res.ranks.items()}
    # the measured timeline of the same job makes the same round trip
    write_timeline(job_timeline(job), tmp_path / "measured", job=job)
    assert read([tmp_path / "measured"], "kineto", ReadOptions()).world_size == 4
