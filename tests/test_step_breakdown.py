"""One vocabulary for where a step goes: the table in docs/step-breakdown.md names every
time key that simulate --json, the layout sweep and the configuration sweep write, and the
words the tables and the chart use; the four parts add up to the step."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from conftest import REPO
from echo_et.cli.main import app
from echo_et.experiments.config_sweep import summarize
from echo_et.experiments.plots import BREAKDOWN_PARTS
from echo_et.experiments.sweep import SweepSpec, run_point
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import save_job
from echo_et.sim import simulate
from echo_et.sim.result import LABELS, STEP_PARTS

DOC = REPO / "docs" / "step-breakdown.md"
COLUMNS = ("quantity", "simulate", "layout", "config", "label", "meaning")


def _table() -> list[dict[str, str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| quantity") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == len(COLUMNS), line
            rows.append(dict(zip(COLUMNS, [c.strip("`") for c in cells], strict=True)))
    assert rows, "docs/step-breakdown.md has its table"
    return rows


def _column(name: str) -> set[str]:
    return {r[name] for r in _table() if r[name]}


def _time_keys(d: dict, drop: tuple[str, ...] = ()) -> set[str]:
    return {k for k in d if re.search(r"_(ns|ms)$", k) and k not in drop}


@pytest.fixture(scope="module")
def job():
    return gpt_3d_job(2, 2, 2, microbatches=4, layers=1)


def test_simulate_json_keys_are_the_documented_ones(job, tmp_path) -> None:
    path = save_job(job, tmp_path / "job")
    res = CliRunner().invoke(app, ["simulate", str(path), "--json"])
    assert res.exit_code == 0, res.output
    for v in json.loads(res.stdout)["ranks"].values():
        assert _time_keys(v) == _column("simulate")
        assert sum(v[k] for k in STEP_PARTS) == v["step_time_ns"]


def test_layout_sweep_keys_are_the_documented_ones(job) -> None:
    row = run_point(job, {"dp": 4, "pp": None, "microbatches": None}, SweepSpec(dp=[4], mode="replay"))
    assert "error" not in row, row
    assert _time_keys(row) == _column("layout")
    assert sum(row[k] for k in STEP_PARTS) == row["step_time_ns"]
    assert row["max_bubble_ns"] >= row["bubble_ns"]


def test_config_sweep_keys_are_the_documented_ones(job) -> None:
    res = simulate(job)
    row = summarize({"layers": 1, "tp": 2, "pp": 2, "dp": 2, "measured_ms": 10.0}, res)
    assert _time_keys(row, drop=("measured_ms",)) == _column("config")
    parts = [k.removesuffix("_ns") + "_ms" for k in STEP_PARTS]
    assert sum(row[k] for k in parts) == pytest.approx(row["predicted_ms"], abs=1e-3)


def test_table_and_chart_words_are_the_documented_ones() -> None:
    documented = {r["simulate"]: r["label"] for r in _table() if r["simulate"] and r["label"]}
    assert documented == LABELS
    assert BREAKDOWN_PARTS == tuple(LABELS[k] for k in STEP_PARTS)


def test_simulate_table_speaks_the_vocabulary_one_row_per_rank_class(job, tmp_path) -> None:
    path = save_job(job, tmp_path / "job")
    out = CliRunner().invoke(app, ["simulate", str(path)], terminal_width=200).stdout
    head = next(line for line in out.splitlines() if line.lstrip().startswith("ranks"))
    for k in ("step_time_ns", *STEP_PARTS, "comm_ns", "sync_wait_ns"):
        assert LABELS[k] in head, head
    res = simulate(job)
    classes = res.rank_classes()
    rows = [line for line in out.splitlines()[2:2 + len(classes)]]
    assert len(classes) < len(res.ranks) and sum(len(m) for _, m in classes) == len(res.ranks)
    for (rep, members), line in zip(classes, rows, strict=True):
        assert line.split()[1] == f"{rep.step_time_ns / 1e6:.3f}"
        assert all(res.ranks[r].breakdown() == rep.breakdown() for r in members)


def test_rank_ranges_are_compact() -> None:
    from echo_et.cli.sim_cmds import rank_ranges

    assert rank_ranges([8, 0, 1, 2, 3, 5]) == "0-3,5,8"
    assert rank_ranges([7]) == "7"
