"""echo-et predict: a model configuration to a predicted GPU step in one folder (summary,
timeline per class of equivalent ranks, chart, Job), the same bytes on every run, bad input
one line with nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app

pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")

runner = CliRunner()
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--micro-batch", "1",
        "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--vocab", "256", "--gpu", "a100"]


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_predict_writes_one_folder_the_same_bytes_each_run(tmp_path) -> None:
    a = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "a")])
    assert a.exit_code == 0, a.output
    lines = a.stdout.splitlines()
    assert lines[0].startswith("GPT 2 layers, hidden 64") and "= 8 a100 GPUs" in lines[0]
    assert lines[1].startswith("predict: step time ")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["world_size"] == 8 and summary["config"]["tp"] == 2 and summary["prediction"]["cluster"]["gpu"]
    classes = summary["rank_classes"]
    assert sorted(r for c in classes for r in c) == list(range(8))
    timeline = sorted(p.name for p in (tmp_path / "a" / "timeline").iterdir())
    assert timeline == sorted(f"rank-{c[0]}.json" for c in classes)   # one file per class
    assert (tmp_path / "a" / "job" / "manifest.pb").is_file()
    b = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "b")])
    assert b.exit_code == 0, b.output
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    again = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "a")])   # an earlier output: replaced
    assert again.exit_code == 0, again.output


def test_predict_bad_input_is_one_line_and_writes_nothing(tmp_path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    cases = [
        (["predict", *TINY, "-o", str(mine)], "not an echo-et predict folder"),
        (["predict", *[("3" if a == "4" and i == 5 else a) for i, a in enumerate(TINY)], "-o", str(tmp_path / "x")],
         "must divide"),
        (["predict", *TINY[:-1], "tpu", "-o", str(tmp_path / "x")], "--gpu"),
        (["predict", *TINY, "--dtype", "int8", "-o", str(tmp_path / "x")], "--dtype"),
    ]
    for args, words in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        err = res.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert _files(mine) == {"notes.txt": b"keep"}
    assert not (tmp_path / "x").exists()


def test_predicts_default_nodes_are_recorded_only_where_the_layout_fills_them(tmp_path) -> None:
    """Without --gpus-per-node predict runs on nodes of 8; its Job records them for 8 ranks, but
    not for 12 (a node would be partly filled: the checker's node-fill rule), and stays valid."""
    from echo_et.ir import check_job, load_job

    for dp, gpn in (("2", 8), ("3", 0)):
        args = list(TINY)
        args[args.index("--dp") + 1] = dp
        args[args.index("--global-batch") + 1] = str(4 * int(dp))
        res = runner.invoke(app, ["predict", *args, "-o", str(tmp_path / dp)])
        assert res.exit_code == 0, res.output
        job = load_job(tmp_path / dp / "job")
        assert (job.world_size, job.manifest.hardware.gpus_per_node) == (4 * int(dp), gpn)
        assert check_job(job) == []
