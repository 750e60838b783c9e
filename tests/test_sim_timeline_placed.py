"""``echo-et simulate --timeline`` places repeat blocks in closed form, as ``simulate``
without a timeline and ``echo-et predict`` do, and writes each copy's box from the placement:
the timeline files are the bytes the node-by-node simulation writes (what ``--timeline`` did
until 2026-12-05), and what it prints and ``--json`` gives is the same but for ``events``
(the simulator's own count: a placed occurrence is one)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import echo_et.sim as sim
from echo_et.cli.main import app
from echo_et.ir import save_job

runner = CliRunner()
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "jobs"


def _files(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {root.name: root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _simulate_twice(monkeypatch, tmp_path: Path, job_dir: Path, args: list[str], dest: str):
    """(placed run, node-by-node run, their results): the same command, the second with
    ``SimOptions(repeats=False)`` forced on, as ``--timeline`` set it before."""
    real = sim.simulate
    results: dict[str, object] = {}

    def run(tag: str, repeats: bool):
        def wrapped(job, mode="replay", *, options=None, **kw):
            opts = options if repeats else dataclasses.replace(options, repeats=False)
            results[tag] = real(job, mode, options=opts, **kw)
            return results[tag]

        monkeypatch.setattr(sim, "simulate", wrapped)
        out = tmp_path / tag / dest
        out.parent.mkdir()
        res = runner.invoke(app, ["simulate", str(job_dir), *args, "--timeline", str(out)])
        assert res.exit_code == 0, res.output
        return res.stdout, _files(out)

    placed = run("placed", True)
    expanded = run("expanded", False)
    monkeypatch.setattr(sim, "simulate", real)
    return placed, expanded, results["placed"], results["expanded"]


def _same_but_events(a: str, b: str, as_json: bool) -> None:
    if as_json:
        ja, jb = json.loads(a), json.loads(b)
        ja.pop("events")
        jb.pop("events")
        ja["timeline"].pop("output", None)
        jb["timeline"].pop("output", None)
        assert ja == jb
        return
    # the first line says "N events"; the last names the output path
    strip = [(re.compile(r"\d+ events$"), "N events"), (re.compile(r"/(placed|expanded)/"), "/X/")]
    la, lb = a.splitlines(), b.splitlines()
    for pat, rep in strip:
        la = [pat.sub(rep, x) for x in la]
        lb = [pat.sub(rep, x) for x in lb]
    assert la == lb


def _boxes(data: bytes) -> set[str]:
    events = json.loads(data)["traceEvents"]
    threads = {(e["pid"], e["tid"]): re.sub(r"^\w+ \d+ ", "", e["args"]["name"]) for e in events
               if e.get("name") == "thread_name"}
    named = ({**e, "tid": threads[e["pid"], e["tid"]], "args": {**e["args"], "stream": None}} for e in events
             if e.get("ph") == "X" and not e["name"].startswith("ProfilerStep#"))
    return {json.dumps(e, sort_keys=True) for e in named}


@pytest.fixture(scope="module")
def traced_gpt(tmp_path_factory) -> Path:
    """A traced Megatron GPT, TP1 x PP4 x DP2 with 16 micro-batches per pipeline (warm-up,
    steady 1F1B, drain) and recomputation: repeat blocks in every stage."""
    pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.cli.cluster_opts import cluster_from_options
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import trace_row

    row = {"layers": 4, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 1, "vocab": 256,
           "global_batch": 32, "tp": 1, "pp": 4, "dp": 2}
    opts = ConfigSweepOptions(cluster=cluster_from_options("a100", 8, None, "800Gb/s/node"), recompute=True)
    job = trace_row(row, opts, jobs=1)
    assert any(job.graph(g).has_repeats for g in job.graph_ids())
    return save_job(job, tmp_path_factory.mktemp("gpt") / "job")


@pytest.mark.parametrize("as_json", [True, False])
@pytest.mark.parametrize("dest,extra", [("tl", []), ("one.json", ["--timeline-rank", "0", "--timeline-rank", "7"])])
def test_traced_gpt_timeline_is_the_node_by_node_one(traced_gpt, monkeypatch, tmp_path, as_json, dest, extra) -> None:
    args = ["--mode", "predict", *extra, *(["--json"] if as_json else [])]
    (out_a, files_a), (out_b, files_b), placed, expanded = _simulate_twice(monkeypatch, tmp_path, traced_gpt,
                                                                           args, dest)
    assert any(st.blocks is not None for st in placed.timeline.states)    # placed in closed form
    assert all(st.blocks is None for st in expanded.timeline.states)
    assert placed.events < expanded.events
    assert files_a and files_a == files_b
    if dest == "tl":
        assert len(files_a) == 8    # every rank, each its own file
    _same_but_events(out_a, out_b, as_json)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if (p / "manifest.pb").is_file()))
@pytest.mark.parametrize("mode", ["replay", "predict"])
def test_fixture_jobs_timeline_unchanged(name, mode, monkeypatch, tmp_path) -> None:
    """The fixture Jobs (no repeat blocks): the same bytes and output as before."""
    args = ["--mode", mode, *(["--preset", "a100-ib"] if mode == "predict" else []), "--json"]
    (out_a, files_a), (out_b, files_b), placed, expanded = _simulate_twice(monkeypatch, tmp_path,
                                                                           FIXTURES / name, args, "tl")
    assert files_a and files_a == files_b
    assert placed.events == expanded.events
    _same_but_events(out_a, out_b, True)


def test_a_bounded_timeline_is_a_prefix_of_the_step(traced_gpt, monkeypatch, tmp_path) -> None:
    """``--timeline-events N``: the step's longest prefix of at most N boxes, all files
    together, the same bytes placed or node by node; without it (above) the whole step."""
    args = ["--mode", "predict", "--timeline-events", "500", "--json"]
    (out_a, files_a), (out_b, files_b), _, _ = _simulate_twice(monkeypatch, tmp_path, traced_gpt, args, "tl")
    assert files_a and files_a == files_b
    _same_but_events(out_a, out_b, True)
    w = json.loads(out_a)["timeline"]["window"]
    whole = runner.invoke(app, ["simulate", str(traced_gpt), "--mode", "predict", "--timeline",
                                str(tmp_path / "whole"), "--json"])
    assert whole.exit_code == 0, whole.output
    total = json.loads(whole.stdout)["timeline"]["events"]
    assert w["of"] == total > 500 >= w["events"] > 0 and w["until_ns"] > w["from_ns"]
    assert json.loads(out_a)["timeline"]["events"] == w["events"]
    # every kept box is one of the whole step's, at the same place (threads are numbered by
    # the streams a file holds, so they are compared by name; the step's own box spans the file)
    whole_files = _files(tmp_path / "whole")
    assert set(files_a) == set(whole_files)
    for name, data in files_a.items():
        kept, every = _boxes(data), _boxes(whole_files[name])
        assert kept and kept <= every and len(kept) < len(every)
    text = runner.invoke(app, ["simulate", str(traced_gpt), "--mode", "predict", "--timeline", str(tmp_path / "t"),
                               "--timeline-events", "500"])
    assert text.exit_code == 0 and "boxes (--timeline-events N)" in text.stdout.splitlines()[-1]


def test_timeline_events_bad_input(tmp_path) -> None:
    job = FIXTURES / "ddp-dp4"
    for args, words in ((["--timeline", str(tmp_path / "a"), "--timeline-events", "0"], "--timeline-events"),
                        (["--timeline-events", "10"], "--timeline-events needs --timeline")):
        res = runner.invoke(app, ["simulate", str(job), *args])
        err = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0], res.output
        assert not (tmp_path / "a").exists()
    # a bound above the step's boxes writes the whole step, the same bytes
    big = runner.invoke(app, ["simulate", str(job), "--timeline", str(tmp_path / "big"), "--timeline-events",
                              "100000000", "--json"])
    plain = runner.invoke(app, ["simulate", str(job), "--timeline", str(tmp_path / "plain"), "--json"])
    assert big.exit_code == 0 and plain.exit_code == 0
    assert _files(tmp_path / "big") == _files(tmp_path / "plain")
    w = json.loads(big.stdout)["timeline"]["window"]
    assert w["until_ns"] is None and w["events"] == w["of"] == json.loads(plain.stdout)["timeline"]["events"]
