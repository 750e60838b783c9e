"""benchmarks/calibrate_speed.py times another checkout side by side: its children must
import that checkout, not this one (``python -m`` puts the working folder first)."""

from __future__ import annotations

import sys

from conftest import load_benchmark, shared_path


def test_against_runs_the_other_checkouts_modules(tmp_path) -> None:
    bench = load_benchmark("calibrate_speed")
    tree = tmp_path / "other"
    (tree / "echo_et").mkdir(parents=True)
    (tree / "echo_et" / "__init__.py").write_text("MARK = 'other checkout'\n")
    work = tmp_path / "work"
    work.mkdir()
    env = bench.environment(work, tree, "against")
    got = bench.run([sys.executable, "-c", "import echo_et; print(echo_et.MARK)"], env, work)
    assert got["out"].strip() == "other checkout"
    assert got["wall_s"] > 0 and got["rss_mib"] > 0


def test_rows_name_the_shared_logs() -> None:
    bench = load_benchmark("calibrate_speed")
    data = shared_path("nccl-tests").parent
    named = [(name, [a for a in cmd if a.endswith(".log")]) for name, cmd in bench.rows(data)]
    assert [len(logs) for _, logs in named] == [6, 6, 5, 6]
