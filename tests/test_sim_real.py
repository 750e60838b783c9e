"""Replay and predict on real multi-rank traces: the simulator's own correctness test."""

from __future__ import annotations

import pytest

from conftest import shared_path, unpack
from echo_et.converters import ReadOptions, read
from echo_et.ir import check_job
from echo_et.sim import SimOptions, simulate, validate

# Replay must reproduce each rank's measured ProfilerStep time within this bound.
REPLAY_BOUND_PCT = 0.5
# Predict with the (uncalibrated) V100 preset: DLRM's step is host-bound, its collectives
# are tens of microseconds, so the model's error barely moves the step.
PREDICT_BOUND_PCT = 5.0


@pytest.fixture(scope="module")
def dlrm_job(tmp_path_factory):
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    root = unpack(archive, tmp_path_factory.mktemp("dlrm"))
    job = read([root / "dlrm_kineto"], "kineto", ReadOptions())
    assert check_job(job) == []
    return job


def test_dlrm_replay_reproduces_every_ranks_measured_step(dlrm_job) -> None:
    res = simulate(dlrm_job)
    assert sorted(res.ranks) == list(range(8))
    for r, rr in res.ranks.items():
        measured = dlrm_job.binding(r).measured_step_ns
        assert measured > 0
        err = 100.0 * abs(rr.step_time_ns - measured) / measured
        assert err <= REPLAY_BOUND_PCT, f"rank {r}: replay {rr.step_time_ns} vs measured {measured} ({err:.3f} %)"
    # The traced all-to-all kernels last from microseconds (the last rank to arrive) to
    # milliseconds (ranks that waited): replay re-creates those waits.
    assert max(rr.sync_wait_ns for rr in res.ranks.values()) > 1_000_000
    cp = res.critical_path
    assert cp["length_ns"] == res.step_time_ns
    assert sum(cp["by_category"].values()) == cp["length_ns"] - cp["start_offset_ns"]


def test_dlrm_replay_with_a_straggler_slows_everybody(dlrm_job) -> None:
    base = simulate(dlrm_job)
    slow = simulate(dlrm_job, options=SimOptions(stragglers={7: 1.5}))
    assert slow.ranks[7].step_time_ns > base.ranks[7].step_time_ns
    assert slow.ranks[0].step_time_ns > base.ranks[0].step_time_ns  # waits for rank 7 in collectives


def test_dlrm_validate_with_v100_preset(dlrm_job) -> None:
    from echo_et.models import comm
    from echo_et.models.slowdown import default_model

    v = validate(dlrm_job, comm_model=comm.CommModel.preset("v100-ib"), slowdown_model=default_model())
    assert v["replay_max_abs_error_pct"] <= REPLAY_BOUND_PCT
    assert v["predict_max_abs_error_pct"] <= PREDICT_BOUND_PCT
    for r, row in v["ranks"].items():
        assert row["measured_step_ns"] == dlrm_job.binding(int(r)).measured_step_ns
        assert row["measured_source"] == "binding"


def test_hta_nccl_trace_replays_its_measured_step() -> None:
    path = shared_path("traces/HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz")
    job = read([path], "kineto", ReadOptions())
    traced = [r for r in job.ranks() if job.binding(r).measured_step_ns > 0]
    assert traced
    res = simulate(job)
    for r in traced:
        measured = job.binding(r).measured_step_ns
        assert abs(res.ranks[r].step_time_ns - measured) / measured * 100 <= REPLAY_BOUND_PCT


def test_dlrm_replayed_timeline_lines_up_with_the_measured_one(dlrm_job) -> None:
    """Same processes, tracks and boxes as `export chrome` of the trace, and every box ends
    when it ended in the measurement (collectives start later: their wait is its own box)."""
    from echo_et.converters import chrome
    sim = chrome.chrome_trace(list(simulate(dlrm_job).timeline_events()))
    measured = chrome.chrome_trace(chrome.job_timeline(dlrm_job))
    assert [e for e in sim["traceEvents"] if e["ph"] == "M"] == [e for e in measured["traceEvents"] if e["ph"] == "M"]
    sim_end = {(e["pid"], e["tid"], e["args"]["id"]): e["ts"] + e["dur"]
               for e in sim["traceEvents"] if e["ph"] == "X" and e.get("cat") != "wait"}
    boxes = [e for e in measured["traceEvents"] if e["ph"] == "X"]
    assert len(sim_end) == len(boxes)
    off = [e for e in boxes if abs(sim_end[(e["pid"], e["tid"], e["args"]["id"])] - (e["ts"] + e["dur"])) > 0.001]
    assert not off, off[:3]
