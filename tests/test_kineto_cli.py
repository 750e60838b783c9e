"""``echo-et convert`` on Kineto input that is wrong: one line, exit 2, nothing written."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, shared_path, unpack
from echo_et.cli.main import app

PARAM = "traces/param/et_replay/tests/inputs"


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> list[Path]:
    d = unpack(shared_path(f"{PARAM}/dlrm_kineto.tar.gz"), tmp_path_factory.mktemp("dlrm"))
    return sorted((d / "dlrm_kineto").glob("*.json"))


def fails(tmp_path: Path, inputs: list[Path], needle: str, *extra: str) -> str:
    out = tmp_path / "job"
    res = CliRunner().invoke(app, ["convert", *map(str, inputs), "-o", str(out), *extra])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert not out.exists() and not list(tmp_path.glob(".job*"))
    return lines[0]


def edited(src: Path, dest: Path, fn) -> Path:
    doc = json.loads(src.read_text())
    fn(doc)
    dest.write_text(json.dumps(doc))
    return dest


def test_truncated_file(tmp_path, dlrm):
    p = tmp_path / "rank0.json"
    p.write_bytes(dlrm[0].read_bytes()[: 200_000])
    line = fails(tmp_path, [p], "truncated")
    assert str(p) in line


def test_gzip_that_is_not(tmp_path, dlrm):
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(dlrm[0].read_bytes())
    fails(tmp_path, [p], "not gzip")


def test_broken_gzip(tmp_path, dlrm):
    p = tmp_path / "rank0.json.gz"
    data = gzip.compress(dlrm[0].read_bytes())
    p.write_bytes(data[: len(data) // 3])
    fails(tmp_path, [p], str(p))


def test_no_events(tmp_path):
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    fails(tmp_path, [p], "no events")


def test_world_sizes_disagree(tmp_path):
    gloo = sorted((FIXTURES / "kineto" / "gloo3").glob("*.json.gz"))
    fake = sorted((FIXTURES / "kineto" / "fake64").glob("*.json.gz"))
    fails(tmp_path, [gloo[0], fake[0]], "world size")


def test_two_files_one_rank(tmp_path, dlrm):
    twin = tmp_path / "copy_of_rank0.json"
    twin.write_bytes(dlrm[0].read_bytes())
    fails(tmp_path, [dlrm[0], twin], "claims rank 0")


def test_files_of_two_runs(tmp_path, dlrm):
    def later(doc):          # the same job shape, traced a day later
        for e in doc["traceEvents"]:
            if "ts" in e:
                e["ts"] += 86_400_000_000
    p = edited(dlrm[1], tmp_path / "worker1.json", later)
    fails(tmp_path, [dlrm[0], p], "not one job")


def test_no_common_step(tmp_path, dlrm):
    def renamed(doc):
        for e in doc["traceEvents"]:
            if e.get("name", "").startswith("ProfilerStep#"):
                e["name"] = "ProfilerStep#11"
    p = edited(dlrm[1], tmp_path / "worker1.json", renamed)
    fails(tmp_path, [dlrm[0], p], "no ProfilerStep is complete in every file")


def test_step_not_there(tmp_path, dlrm):
    fails(tmp_path, [dlrm[0]], "no ProfilerStep#99", "--step", "99")


def test_rank_beyond_world(tmp_path, dlrm):
    p = edited(dlrm[0], tmp_path / "worker0.json",
               lambda doc: doc["distributedInfo"].update(rank=9))
    fails(tmp_path, [p], "outside world size")


def test_conflicting_process_groups(tmp_path):
    gloo = sorted((FIXTURES / "kineto" / "gloo3").glob("*.json.gz"))
    with gzip.open(gloo[1], "rt") as f:
        doc = json.load(f)
    doc["distributedInfo"]["pg_config"][0]["ranks"] = [2, 1, 0]
    other = tmp_path / "rank1.json"
    other.write_text(json.dumps(doc))
    fails(tmp_path, [gloo[0], other, gloo[2]], "process group '0'")


def test_rank_of_unnamed_files_is_asked_for(tmp_path, dlrm):
    def anonymous(doc):
        doc.pop("distributedInfo")
    a = edited(dlrm[0], tmp_path / "a.json", anonymous)
    b = edited(dlrm[1], tmp_path / "b.json", anonymous)
    fails(tmp_path, [a, b], "cannot tell its rank")


def test_convert_and_inspect_json(tmp_path):
    folder = FIXTURES / "kineto" / "gloo3"
    out = tmp_path / "job"
    res = CliRunner().invoke(app, ["convert", str(folder), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["world_size"] == 3 and summary["source_format"] == "kineto"
    assert summary["dropped"]["outside_step"] > 0
    res = CliRunner().invoke(app, ["inspect", str(out), "--json"])
    assert json.loads(res.stdout)["dropped"] == summary["dropped"]
    assert CliRunner().invoke(app, ["check", str(out)]).exit_code == 0
    # byte-identical on rerun
    again = tmp_path / "again"
    assert CliRunner().invoke(app, ["convert", str(folder), "-o", str(again)]).exit_code == 0
    for f in sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()):
        assert (out / f).read_bytes() == (again / f).read_bytes(), f
