"""Exports run on the real ASTRA-sim analytical binary: every rank prints its ``finished``
line. Opt-in: set ``ASTRA_SIM_BIN`` to a built ``AstraSim_Analytical_Congestion_Aware`` or
``..._Unaware`` (docs/export.md, *Running the real ASTRA-sim*); without it these tests skip,
since ASTRA-sim is not a package any registry this project installs from carries."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, shared_path
from echo_et.converters import ReadOptions, read
from echo_et.converters.astra_sim import ExportOptions, export
from echo_et.ir import load_job

BIN = os.environ.get("ASTRA_SIM_BIN", "")
pytestmark = pytest.mark.skipif(
    not BIN or not os.access(BIN, os.X_OK),
    reason="ASTRA_SIM_BIN is not set to an executable ASTRA-sim analytical binary")


def _run(folder: Path) -> str:
    r = subprocess.run(["sh", str(folder / "run.sh")], cwd=folder, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "ASTRA_SIM_BIN": BIN})
    assert r.returncode == 0, r.stderr[-2000:]
    return (folder / "log" / "stdout.txt").read_text()


def _finished(stdout: str) -> dict[int, int]:
    return {int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"sys\[(\d+)\] finished, (\d+) cycles", stdout)}


def test_reference_all_reduce_runs_as_in_astra_sims_own_regression_test(tmp_path) -> None:
    src = shared_path("traces/astra-sim/examples/workload/microbenchmarks/all_reduce/8npus_1MB")
    job = read(sorted(src.glob("*.et")), "chakra", ReadOptions())
    export(job, tmp_path / "ar", ExportOptions(topology="Ring", intra_bw=50, latency=500))
    done = _finished(_run(tmp_path / "ar"))
    assert sorted(done) == list(range(8))
    assert set(done.values()) == {117780}   # tests/rt_template/refs/stdout.txt of ASTRA-sim


def test_traced_gpt_job_runs_to_the_end_on_every_rank(tmp_path) -> None:
    job = load_job(REPO / "fixtures" / "jobs" / "gpt-tp2-pp2-dp2")
    export(job, tmp_path / "gpt", ExportOptions())
    done = _finished(_run(tmp_path / "gpt"))
    assert sorted(done) == list(range(job.world_size))
