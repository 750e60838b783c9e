"""Charts of simulate, validate and the slowdown model: drawn with matplotlib, deterministic
bytes, and the numbers behind each bar or point checked."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from test_sim import dp_job, two_rank_allreduce
from typer.testing import CliRunner

from conftest import shared_path
from echo_et.cli.main import app
from echo_et.experiments.plots import (
    BREAKDOWN_PARTS,
    MAX_BARS,
    breakdown_rows,
    rank_breakdown_plot,
    slowdown_prediction_plot,
    validation_plot,
    validation_rows,
)
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import save_job
from echo_et.models.slowdown.evaluate import cross_validate, cross_validated_predictions, error_metrics
from echo_et.models.slowdown.fit import Sample
from echo_et.sim import SimOptions, simulate, validate

pytest.importorskip("matplotlib", reason="charts need matplotlib (the plot extra)")
runner = CliRunner()


def _png(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and b"matplotlib" not in data
    return struct.unpack(">II", data[16:24])


def test_breakdown_rows_add_up_to_each_rank_step() -> None:
    res = simulate(two_rank_allreduce())
    rows = breakdown_rows(res)
    assert [r["label"] for r in rows] == ["0", "1"]
    for row, rank in zip(rows, (0, 1), strict=True):
        assert sum(row[p] for p in BREAKDOWN_PARTS) == pytest.approx(res.ranks[rank].step_time_ns / 1e6)
    assert rows[0]["bubble"] == pytest.approx(200 / 1e6)   # rank 0 waited 200 ns for rank 1
    assert rows[1]["bubble"] == 0


def test_many_ranks_become_one_bar_per_distinct_step() -> None:
    res = simulate(gpt_3d_job(2, 4, 8, microbatches=2, layers=1), options=SimOptions(stragglers={5: 1.5}))
    assert len(res.ranks) == 64 > MAX_BARS
    rows = breakdown_rows(res)
    assert sum(len(r["ranks"]) for r in rows) == 64 and len(rows) < MAX_BARS
    assert rows[0]["ranks"][0] == res.slowest_rank and rows[0]["step_ms"] == res.step_time_ns / 1e6
    assert any(r["label"].endswith(")") for r in rows)   # "R (+k)": k more ranks with that step


def test_rank_breakdown_plot_is_a_deterministic_png(tmp_path) -> None:
    res = simulate(dp_job(4))
    a, b = rank_breakdown_plot(res, tmp_path / "a.png"), rank_breakdown_plot(res, tmp_path / "b.png")
    assert a.read_bytes() == b.read_bytes() and _png(a)[0] >= 640
    slower = simulate(dp_job(4), options=SimOptions(stragglers={2: 3.0}))
    rank_breakdown_plot(slower, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes() != a.read_bytes()   # the bytes follow the data


def test_validation_plot_rows_and_png(tmp_path) -> None:
    from test_sim_golden import LinearModel

    report = validate(two_rank_allreduce(), comm_model=LinearModel())
    rows = validation_rows(report)
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        src = report["ranks"][str(row["rank"])]
        assert row["measured"] == src["measured_step_ns"] / 1e6 and row["replay"] == src["replay_step_ns"] / 1e6
        assert row["predict"] == src["predict_step_ns"] / 1e6
    validation_plot(report, tmp_path / "v.png")
    validation_plot(report, tmp_path / "w.png")
    assert (tmp_path / "v.png").read_bytes() == (tmp_path / "w.png").read_bytes()
    _png(tmp_path / "v.png")


def _samples() -> list[Sample]:
    rng = np.random.default_rng(0)
    out = []
    for k in range(6):
        for _ in range(5):
            iso = float(rng.uniform(1e3, 1e5))
            ov = float(rng.uniform(0.2, 1.0))
            out.append(Sample(f"k{k}", f"k{k}", "gemm" if k % 2 else "norm", iso, iso * (1 + 0.3 * ov * (k + 1)), ov))
    return out


def test_slowdown_chart_shows_the_cross_validated_predictions(tmp_path) -> None:
    samples = _samples()
    preds = cross_validated_predictions(samples, 3)
    cv = cross_validate(samples, 3)
    ov = preds["overlapped"]
    # the points are the predictions whose errors the cross-validation reports
    assert error_metrics(preds["model"][ov], preds["observed"][ov], preds["fold"][ov]) == cv["model"]
    assert list(preds["isolated"]) == [x.isolated_ns for x in samples]
    slowdown_prediction_plot(preds, tmp_path / "a.png")
    slowdown_prediction_plot(preds, tmp_path / "b.png")
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


def test_cli_plots(tmp_path) -> None:
    job = save_job(dp_job(4), tmp_path / "job")
    r = runner.invoke(app, ["simulate", str(job), "--plot", str(tmp_path / "s.png"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["plot"] == str(tmp_path / "s.png") and _png(tmp_path / "s.png")
    bad = runner.invoke(app, ["simulate", str(job), "--plot", str(tmp_path / "missing" / "s.png")])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "does not exist" in bad.stderr


def test_cli_calibrate_slowdown_plot(tmp_path) -> None:
    csv = shared_path("slowdown/echo-a100-gpt2/merged_features.csv")
    r = runner.invoke(app, ["calibrate", "slowdown", str(csv), "-o", str(tmp_path / "m.json"),
                            "--plot", str(tmp_path / "cv.png")])
    assert r.exit_code == 0, r.output
    assert _png(tmp_path / "cv.png") == (640, 600) and "wrote" in r.stdout
