"""A first run that tells the truth: readable --help, a pytest summary, no profiler noise,
one-line errors for output folders that do not exist, and validate saying what an ex-situ
measurement is."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import click
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from conftest import FIXTURES, REPO
from echo_et.cli.main import app
from echo_et.ir import save_job

runner = CliRunner()
PYTHON_TYPE = re.compile(r"<(?:int|str|bool|float|path|list\[[^\]]*\]|Path)>|\b(?:TEXT|INTEGER|FLOAT|BOOLEAN)\b")
PRESETS = sorted(p.stem for p in (REPO / "echo_et" / "models" / "comm" / "presets").glob("*.json"))


def _commands(cmd: click.Command, path: tuple[str, ...] = ()):
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(get_command(app)))


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "echo-et")
def test_help_shows_what_to_type_not_python_types(path) -> None:
    res = runner.invoke(app, [*path, "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert not PYTHON_TYPE.search(res.stdout), res.stdout


def test_every_option_of_every_verb_has_help_and_a_metavar() -> None:
    ctx = click.Context(get_command(app))
    missing = []
    for path, cmd in COMMANDS:
        for p in cmd.params:
            where = f"{' '.join(path)} {p.opts[0]}"
            if not getattr(p, "help", None):
                missing.append(f"{where}: no help")
            if isinstance(p, click.Option) and not p.is_flag and not p.metavar:
                missing.append(f"{where}: no metavar")
            shown = p.display_type_rich(ctx) if hasattr(p, "display_type_rich") else None
            if shown and PYTHON_TYPE.search(shown):
                missing.append(f"{where}: shows {shown}")
    assert not missing, "\n".join(missing)


def test_every_command_lists_with_a_one_line_summary() -> None:
    """A group's command list shows each command's first paragraph rewrapped, not the
    docstring's own line breaks (typer's rich mode keeps them)."""
    for path, cmd in COMMANDS:
        summary = cmd.short_help if path else None
        if summary is not None:
            assert "\n" not in summary and summary == " ".join(summary.split()), (path, summary)
    out = runner.invoke(app, ["--help"]).stdout   # rich's 80 columns: the break is rich's own
    assert "the TP/PP ranks of one replica): DDP gradient buckets" in out, out


def test_preset_help_lists_the_presets() -> None:
    assert PRESETS
    for verb in (["simulate"], ["validate"], ["sweep"], ["estimate"]):
        out = runner.invoke(app, [*verb, "--help"], terminal_width=200).stdout
        assert all(name in out for name in PRESETS), (verb, out)


def test_pytest_q_prints_its_summary() -> None:
    """``addopts = "-q"`` plus ``-q`` on the command line silences the summary line."""
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-q" not in str(conf.get("addopts", "")).split()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_ir_vocab.py", "-k", "strict_words"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^1 passed", proc.stdout, re.MULTILINE), proc.stdout


def test_profiler_chatter_is_filtered_and_the_rest_passed_on(capfd) -> None:
    import os

    from echo_et.trace.quiet import profiler_chatter_filtered

    with profiler_chatter_filtered():
        os.write(2, b"USDT:2026-12-03 09:26:53 27791:27791 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"STAGE:2026-12-03 09:27:20 28549:28549 SyncActivityProfilerHandler.cpp:51] Completed Stage\n")
        os.write(2, b"ERROR:2026-12-03 09:26:53 1:1 CuptiActivityApi.cpp:9] a real problem\n")
        print("a user's warning", file=sys.stderr)
    err = capfd.readouterr().err
    assert "USDT" not in err and "STAGE" not in err
    assert "a real problem" in err and "a user's warning" in err


def test_trace_keeps_profiler_noise_off_the_terminal(tmp_path) -> None:
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    tiny = ["--layers", "1", "--hidden", "16", "--heads", "2", "--seq", "8", "--micro-batch", "1", "--vocab", "32"]
    proc = subprocess.run([sys.executable, "-m", "echo_et.cli.main", "trace", *tiny, "--steps", "3",
                           "-o", str(tmp_path / "job")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "USDT" not in proc.stderr and "profiler_start" not in proc.stderr, proc.stderr
    assert "traced rank 0" in proc.stderr  # the tracer's own progress still shows


def test_simulate_timeline_into_a_missing_folder_is_one_line(tmp_path) -> None:
    from test_sim import dp_job

    job = save_job(dp_job(2), tmp_path / "job")
    dest = tmp_path / "nope" / "step.json"
    res = runner.invoke(app, ["simulate", str(job), "--timeline", str(dest)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "--timeline" in lines[0]
    assert not (tmp_path / "nope").exists()


def test_validate_says_why_an_ex_situ_job_differs(tmp_path) -> None:
    out = runner.invoke(app, ["validate", str(FIXTURES / "jobs" / "gpt-tp2-pp2-dp2"), "--preset", "a100-ib"])
    assert out.exit_code == 0, out.output
    note = out.stdout.strip().splitlines()[-1]
    assert note.startswith("note: this Job was traced ex-situ on CPU under a recording process group")
    assert "no real communication" in note and "CPU times" in note
    from test_sim import dp_job

    job = save_job(dp_job(2), tmp_path / "job")  # not traced ex-situ: nothing to explain
    res = runner.invoke(app, ["validate", str(job), "--preset", "a100-ib", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["measured_caveat"] is None


def _readme_main_job() -> tuple[list[str], str]:
    """The README's main-job command (its arguments) and the line it says the job prints."""
    import shlex

    readme = (REPO / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("echo-et predict "))
    quoted = re.search(r"It prints `(predict: step time [\d.]+ ms \(slowest rank \d+\))`", readme)
    assert quoted, "the README says what the main job prints"
    return shlex.split(command)[1:], quoted.group(1)


@pytest.mark.slow
def test_readme_main_job_predicts_a_gpu_step_that_hta_analyses(tmp_path, monkeypatch) -> None:
    """The README's main job, exactly as written: a GPT-3 13B step on 64 A100s from its
    configuration prints the step time the README quotes and its breakdown, and writes a
    timeline on which HolisticTraceAnalysis's temporal breakdown, communication/computation
    overlap and kernel breakdown run, and a chart, into the folder it names."""
    pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")
    hta = pytest.importorskip("hta.trace_analysis", reason="needs HolisticTraceAnalysis (pip install 'echo-et[hta]')")
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")   # else HTA rounds each of 24,000 kernels to µs
    args, quoted = _readme_main_job()
    out = tmp_path / args[args.index("-o") + 1]
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert any(line.startswith(quoted + ";") for line in res.stdout.splitlines()), res.stdout
    assert "exposed comm" in res.stdout and "bubble" in res.stdout and "0-31" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 64 and (out / "step.png").is_file() and (out / "job" / "manifest.pb").is_file()
    ta = hta.TraceAnalysis(trace_dir=str(out / "timeline"))
    temporal = ta.get_temporal_breakdown(visualize=False)
    assert sorted(int(r) for r in temporal["rank"]) == [0, 32]
    for _, row in temporal.iterrows():
        v = summary["ranks"][str(int(row["rank"]))]
        # HTA's split of the step is the vocabulary's (docs/step-breakdown.md)
        assert float(row["compute_time(us)"]) * 1000 == pytest.approx(v["compute_ns"], abs=1)
        assert float(row["non_compute_time(us)"]) * 1000 == pytest.approx(v["exposed_comm_ns"] + v["bubble_ns"],
                                                                          abs=1)
        assert float(row["idle_time(us)"]) * 1000 == pytest.approx(v["host_idle_ns"], abs=1)
    overlap = ta.get_comm_comp_overlap(visualize=False)
    assert len(overlap) == 2 and overlap["comp_comm_overlap_pctg"].between(0, 100).all()
    by_type, _ = ta.get_gpu_kernel_breakdown(visualize=False)
    assert {"COMMUNICATION", "COMPUTATION"} <= set(by_type["kernel_type"])


def test_every_import_of_the_tests_is_declared() -> None:
    """A fresh `pip install -e '.[dev]'` (plus the optional extras) has every package a test
    imports: each third-party module the tests import belongs to a distribution that
    pyproject.toml names, in the dependencies or an extra."""
    import ast
    import importlib.metadata as md

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [d for ds in project["optional-dependencies"].values() for d in ds]
    declared = {re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in specs}
    local = {p.stem for p in (REPO / "tests").glob("*.py")} | {"echo_et"}
    modules: set[str] = set()
    for f in (REPO / "tests").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                modules.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    dists = md.packages_distributions()
    missing = []
    for m in sorted(modules - local - set(sys.stdlib_module_names)):
        names = {d.lower().replace("_", "-") for d in dists.get(m, [m])}
        if not names & declared:
            missing.append(f"{m} ({', '.join(sorted(names))})")
    assert not missing, f"imported by the tests, declared nowhere in pyproject.toml: {missing}"


def test_every_slow_mark_names_a_test_that_exists() -> None:
    """conftest.SLOW (the tests left out of `pytest -m "not slow"`) names files and tests
    that exist: a renamed test would otherwise silently join the fast subset."""
    from conftest import SLOW

    stale = []
    for entry in sorted(SLOW):
        file, _, name = entry.partition("::")
        path = REPO / "tests" / file
        if not path.is_file() or (name and f"def {name}(" not in path.read_text()):
            stale.append(entry)
    assert not stale, f"conftest.SLOW names what is not there: {stale}"
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in conf["markers"])
