"""main() runs a plain command through an app holding only it (faster start); it must
behave exactly as the whole app does."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app, app_for

COMMANDS = [c.name for c in app.registered_commands if c.name]
runner = CliRunner()


def test_every_plain_command_gets_an_app_of_its_own():
    assert {"convert", "check", "inspect", "simulate"} <= set(COMMANDS)
    for name in COMMANDS:
        one = app_for([name, "--help"])
        assert one is not app
        assert [c.name for c in one.registered_commands] == [name]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_and_usage_errors_are_those_of_the_whole_app(name):
    for argv in ([name, "--help"], [name, "--no-such-option"]):
        whole, one = runner.invoke(app, argv), runner.invoke(app_for(argv), argv)
        assert (one.exit_code, one.output) == (whole.exit_code, whole.output)


def test_groups_options_and_unknown_verbs_use_the_whole_app():
    for argv in ([], ["--version"], ["export", "chakra"], ["calibrate"], ["no-such-verb"]):
        assert app_for(argv) is app


def test_convert_runs_through_its_own_app(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "fixtures/traces/cpu_single/rank0.et.json.gz")
    argv = ["convert", src, "--from", "pytorch_et", "-o", str(tmp_path / "a")]
    one = runner.invoke(app_for(argv), argv)
    whole = runner.invoke(app, ["convert", src, "--from", "pytorch_et", "-o", str(tmp_path / "b")])
    assert one.exit_code == whole.exit_code == 0
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files
    for rel in files:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
