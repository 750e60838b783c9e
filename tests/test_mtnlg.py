"""The public validation targets of ``benchmarks/mtnlg.py`` (Megatron-Turing NLG 530B,
arXiv 2201.11990, section 2.4) agree with themselves: every run's published throughput
follows from its published iteration time by the Megatron-LM paper's FLOPs count, and its
layout divides the model and the batch; a mistyped value is caught."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def mtnlg():
    return load_benchmark("mtnlg")


def test_transcribed_runs_are_consistent(mtnlg) -> None:
    assert mtnlg.table_problems() == []
    rows = mtnlg.mtnlg_rows()
    assert [r["dp"] for r in rows] == [8, 10, 12]
    assert [r["measured_ms"] for r in rows] == [60100.0, 50200.0, 44400.0]
    assert all(r["tp"] * r["pp"] == 280 and r["micro_batch"] == 1 and r["layers"] % r["pp"] == 0 for r in rows)


def test_a_mistyped_run_is_caught(mtnlg, monkeypatch) -> None:
    runs = list(mtnlg.MTNLG_RUNS)
    runs[1] = (350, 52.0, 121)           # the time does not give the throughput
    monkeypatch.setattr(mtnlg, "MTNLG_RUNS", tuple(runs))
    assert mtnlg.table_problems() == ["350 servers: 52.0 s gives 116.3 TFLOP/s, not 121"]
    runs[1] = (351, 50.2, 121)           # 2,808 GPUs are not a multiple of TP8 x PP35
    monkeypatch.setattr(mtnlg, "MTNLG_RUNS", tuple(runs))
    assert "351 servers: the layout does not divide the model or the batch" in mtnlg.table_problems()


def test_bad_options_are_one_line_exit_2(mtnlg, capsys) -> None:
    assert mtnlg.main(["--micro-batch", "7"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --micro-batch 7 does not divide every run's batch\n"
    assert mtnlg.main(["--compute-profile", "/nonexistent/candidate.json"]) == 2
    assert capsys.readouterr().err.startswith("error: --compute-profile")
