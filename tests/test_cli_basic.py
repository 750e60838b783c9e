"""The CLI on every real Chakra input (convert, check, inspect --json, export chakra) and on
bad input (one line on stderr, exit 2, nothing written).

Exit codes: 0 success; 1 ``check`` of a readable job that breaks invariants (the errors
are listed); 2 bad input or a bad request (unreadable, malformed, unknown format, ...).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from chakra_et import CUSTOM_RING, MICROBENCHMARKS, attr_value, decode, encode, feeder_trace, node, rank_files
from typer.testing import CliRunner

from echo_et import __version__
from echo_et.cli.main import app
from echo_et.ir import load_job, save_job

runner = CliRunner()

CHAKRA_TO_NAME = {et.ALL_REDUCE: "all_reduce", et.ALL_TO_ALL: "all_to_all", et.BROADCAST: "broadcast",
                  et.ALL_GATHER: "all_gather", et.REDUCE_SCATTER: "reduce_scatter"}


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def ok_json(*args: str) -> dict:
    r = run(*args, "--json")
    assert r.exit_code == 0, r.stderr or r.stdout
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    return json.loads(lines[0])


def expected_summary(files: list[Path]) -> dict:
    """inspect's numbers, computed from the decoded files."""
    kinds: Counter = Counter()
    colls: Counter = Counter()
    comm_bytes = 0
    dangling = 0
    for f in files:
        _, nodes = decode(f)
        ids = {n.id for n in nodes}
        dangling += sum(1 for n in nodes for d in n.ctrl_deps if d not in ids)
        for n in nodes:
            cpu = bool(attr_value(n, "is_cpu_op"))
            if n.type == et.COMM_COLL_NODE and not cpu:
                kinds["collective"] += 1
                colls[CHAKRA_TO_NAME[attr_value(n, "comm_type")]] += 1
                comm_bytes += attr_value(n, "comm_size")
            elif n.type == et.COMM_SEND_NODE:
                kinds["send"] += 1
                colls["send"] += 1
                comm_bytes += attr_value(n, "comm_size")
            elif n.type == et.COMM_RECV_NODE:
                kinds["recv"] += 1
                colls["recv"] += 1
            elif cpu:
                kinds["cpu_op"] += 1
            else:
                kinds["compute"] += 1
    return {"world_size": len(files), "ranks": len(files), "nodes": dict(kinds), "collectives": dict(colls),
            "comm_bytes": comm_bytes, "dangling": dangling}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(name, what to pass on the command line, the rank files)."""
    tmp = tmp_path_factory.mktemp("inputs")
    feeder = feeder_trace(tmp)
    out = [("feeder", feeder, [feeder])]
    for name, rel in sorted(MICROBENCHMARKS.items()):
        files = rank_files(rel)
        out.append((name, files[0].parent, files))
    files = rank_files(CUSTOM_RING)
    out.append(("custom_ring", files[0].parent, files))
    return out


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"echo-et {__version__}"


@pytest.mark.parametrize("args", [(), ("calibrate",), ("export",)])
def test_a_bare_command_group_prints_its_help_and_no_empty_error(args):
    """``echo-et`` (or a group such as ``echo-et calibrate``) with nothing after it: its help
    on stdout, exit 2 as click has it, and no ``error:`` line with nothing to say."""
    r = run(*args)
    assert r.exit_code == 2 and "Usage: echo-et" in r.stdout and "Commands" in r.stdout
    assert r.stderr == "", r.stderr


def test_convert_check_inspect_export_on_every_real_input(inputs, tmp_path):
    for name, arg, files in inputs:
        want = expected_summary(files)
        job_dir = tmp_path / name / "job"
        conv = ok_json("convert", arg, "-o", job_dir)
        assert conv["output"] == str(job_dir) and (job_dir / "manifest.pb").is_file()

        chk = ok_json("check", job_dir)
        assert chk == {"ok": True, "errors": []}
        assert ok_json("check", arg) == chk           # a trace is checked as converted

        s = ok_json("inspect", job_dir)
        for key in ("world_size", "ranks", "nodes", "collectives", "comm_bytes"):
            assert s[key] == want[key], (name, key, s[key], want[key])
        assert 1 <= s["graphs"] <= s["ranks"]
        assert s["dropped"].get("chakra: ctrl_deps naming no node dropped", 0) == want["dangling"]
        assert ok_json("inspect", arg) == s           # the same numbers straight from the trace

        prefix = tmp_path / name / "export" / "trace"
        exp = ok_json("export", "chakra", job_dir, "-o", prefix)
        assert exp["files"] == [f"{prefix}.{r}.et" for r in range(len(files))]
        for src, out in zip(files, exp["files"], strict=True):
            assert len(decode(Path(out))[1]) == len(decode(src)[1])
        # And the export converts again.
        again = ok_json("convert", *exp["files"], "-o", tmp_path / name / "again")
        assert again["nodes"] == s["nodes"] and again["collectives"] == s["collectives"]


def test_text_output(inputs, tmp_path):
    name, arg, files = inputs[-1]
    assert name == "custom_ring"
    r = run("convert", arg, "-o", tmp_path / "j")
    want = expected_summary(files)["collectives"]
    assert r.exit_code == 0 and f"dropped/guessed: chakra: empty GlobalMetadata.version={len(files)}" in r.stdout
    r = run("inspect", tmp_path / "j")
    assert r.exit_code == 0 and f"collectives: recv={want['recv']}, send={want['send']}" in r.stdout
    r = run("check", tmp_path / "j")
    assert r.exit_code == 0 and r.stdout.strip() == "ok"
    r = run("export", "chakra", tmp_path / "j", "-o", tmp_path / "x" / "t")
    assert r.exit_code == 0 and f"wrote {len(files)} files" in r.stdout


# -- bad input ------------------------------------------------------------------------------
def bad_files(tmp: Path) -> dict[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    good = encode([node(1, "a", et.COMP_NODE), node(2, "b" * 40, et.COMP_NODE, data=[1])])
    cases = {
        "empty": b"",
        "truncated": good[:-10],
        "random": random.Random(3).randbytes(2048),
        "json": b'{"schema": "1.0.2-chakra.0.0.4", "nodes": [{"id": 1}]}',
        "cycle": encode([node(1, "a", et.COMP_NODE, data=[2]), node(2, "b", et.COMP_NODE, data=[1])]),
        "duplicate": encode([node(1, "a", et.COMP_NODE), node(1, "b", et.COMP_NODE)]),
        "unknown_type": encode([node(1, "a", 12)]),
    }
    out = {}
    for name, data in cases.items():
        p = tmp / f"{name}.et"
        p.write_bytes(data)
        out[name] = p
    return out


CASES = ["empty", "truncated", "random", "json", "cycle", "duplicate", "unknown_type"]
WHAT = {"empty": "empty file", "truncated": "truncated", "random": "", "json": "JSON",
        "cycle": "cycle", "duplicate": "used twice", "unknown_type": "unknown Chakra node type 12"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("verb", ["convert", "check", "inspect"])
def test_bad_input_exits_2_with_one_line(tmp_path, verb, case):
    path = bad_files(tmp_path / "in")[case]
    out = tmp_path / "out"
    args = [verb, path, "--json"] + (["-o", out] if verb == "convert" else [])
    r = run(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {path}"), lines[0]
    assert WHAT[case] in lines[0]
    assert r.stdout == ""
    assert not out.exists()


def test_convert_refuses_to_overwrite_its_input(tmp_path):
    f = tmp_path / "t.et"
    f.write_bytes(encode([node(1, "a", et.COMP_NODE)]))
    r = run("convert", f, "-o", f)
    assert r.exit_code == 2 and "overwrite an input" in r.stderr
    assert f.read_bytes() == encode([node(1, "a", et.COMP_NODE)])


def test_inputs_are_never_modified(inputs, tmp_path):
    name, arg, files = inputs[-1]
    before = [f.read_bytes() for f in files]
    run("convert", arg, "-o", tmp_path / "j")
    run("export", "chakra", tmp_path / "j", "-o", tmp_path / "e" / "t")
    assert [f.read_bytes() for f in files] == before


def test_check_of_an_invalid_job_exits_1_and_lists_errors(tmp_path):
    f = tmp_path / "ok.et"
    f.write_bytes(encode([node(1, "a", et.COMP_NODE), node(2, "b", et.COMP_NODE, data=[1]),
                          node(3, "c", et.COMP_NODE, data=[2])]))
    assert run("convert", f, "-o", tmp_path / "job").exit_code == 0
    # Break the saved job: node 1 now waits for node 3, closing a cycle, and node 2 names a
    # missing one. The job still reads; it is invalid.
    job = load_job(tmp_path / "job").copy()
    g = job.graph(job.graph_ids()[0])
    g.nodes[0].deps.add(id=3)
    g.nodes[1].deps.add(id=99)
    save_job(job, tmp_path / "job")

    r = run("check", tmp_path / "job")
    assert r.exit_code == 1
    assert "[acyclic]" in r.stderr and "[dep-exists]" in r.stderr
    r = run("check", tmp_path / "job", "--json")
    assert r.exit_code == 1
    out = json.loads(r.stdout)
    assert out["ok"] is False and len(out["errors"]) == 2
    assert any("[dep-exists]" in e and "node 2 (b)" in e for e in out["errors"])


def test_export_of_an_invalid_job_exits_2_and_writes_nothing(tmp_path):
    f = tmp_path / "ok.et"
    f.write_bytes(encode([node(1, "a", et.COMP_NODE)]))
    run("convert", f, "-o", tmp_path / "job")
    job = load_job(tmp_path / "job").copy()
    job.graph(job.graph_ids()[0]).nodes[0].stream = 9
    save_job(job, tmp_path / "job")
    r = run("export", "chakra", tmp_path / "job", "-o", tmp_path / "x" / "t")
    assert r.exit_code == 2 and "[stream-declared]" in r.stderr
    assert not (tmp_path / "x").exists()


def test_export_needs_a_file_prefix(tmp_path):
    f = tmp_path / "ok.et"
    f.write_bytes(encode([node(1, "a", et.COMP_NODE)]))
    r = run("export", "chakra", f, "-o", tmp_path)
    assert r.exit_code == 2 and "give a file prefix" in r.stderr


def test_missing_input(tmp_path):
    r = run("inspect", tmp_path / "nope.et")
    assert r.exit_code == 2 and "no such file" in r.stderr
