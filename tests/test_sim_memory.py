"""A simulation leaves no cyclic garbage: once its result is dropped, the per-rank states
(programs, graphs, meeting lists) are freed by reference counting. A sweep raises the cyclic
collector's thresholds (config_sweep.quiet_gc), so a cycle here held every row's states
until a rare full collection: a sweep's worker grew by tens of MB per row."""

from __future__ import annotations

import gc

import pytest

from conftest import REPO
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import load_job
from echo_et.models.comm import CommModel
from echo_et.sim import SimOptions, simulate
from echo_et.sim.state import RankState


@pytest.mark.parametrize("mode", ["replay", "predict"])
@pytest.mark.parametrize("source", ["synthetic", "fixture"])
def test_dropping_the_result_frees_every_rank_state(mode: str, source: str) -> None:
    job = (gpt_3d_job(dp=2, tp=2, pp=2, layers=2, microbatches=4) if source == "synthetic"
           else load_job(REPO / "fixtures/jobs/gpt-tp2-pp2-dp2"))
    comm = CommModel.preset("a100-ib") if mode == "predict" else None
    gc.collect()
    res = simulate(job, mode, options=SimOptions(critical_nodes=True), comm_model=comm)
    assert res.critical_path and res.timeline.states
    n = len(res.timeline.states)
    del res
    # what reference counting did not free, the collector finds unreachable: keep it to look at
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left = sum(type(o) is RankState for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == 0, f"{left} of {n} rank states outlived their result (a reference cycle)"
