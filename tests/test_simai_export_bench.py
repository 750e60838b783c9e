"""benchmarks/simai_export.py: its rows are the export's own report and the file read back,
computed as a user runs the commands (what docs/export.md's SimAI table is made of)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import shared_path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "simai_export.py"


def _rows(only: str, tmp_path: Path) -> list[list[str]]:
    out = subprocess.run([sys.executable, str(BENCH), "--only", only], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| input | ranks | mode | lines | rank step ms | expected ms | read back ms")
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]


def test_a_simai_workload_row_goes_round_trip(tmp_path):
    shared_path("workloads/SimAI/example/microAllReduce.txt")    # skips without ../shared/data
    (row,) = _rows("SimAI microAllReduce", tmp_path)
    name, ranks, mode, lines, step, expected, back, dropped, secs, mib = row
    assert (name, ranks, mode, lines, dropped) == ("SimAI microAllReduce", "8", "predict", "2", "-")
    assert step == expected == back and float(step) > 0
    assert float(secs) > 0 and float(mib) > 0


def test_a_fixture_row_reads_back_its_expected_step(tmp_path):
    (row,) = _rows("fixture ddp-dp4", tmp_path)
    assert row[0] == "fixture ddp-dp4" and row[1] == "4" and row[5] == row[6]
