"""The CLI's plain parameter coercion (echo_et.cli.coercion) gives typer's values and errors,
and keeps pydantic out of a plain command's process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from echo_et.cli import coercion
from echo_et.cli.main import app

REPO = Path(__file__).resolve().parents[1]
typer_coercion = pytest.importorskip("typer._coercion", reason="typer before 0.2x: no runtime coercion to replace")
from typer.models import ArgumentInfo, OptionInfo  # noqa: E402

INTS = ["0", "-0", "+5", "007", " 5", "5 ", "12", "-12", "9" * 18, "-" + "9" * 18, "9" * 19, "9" * 30,
        "1_000", "5.0", "1e3", "abc", "", "0x10", "٣", "\udcff1", 3, -7, True, 2.0, 2.5, b"5"]
FLOATS = ["0", "1", "-1", "1.5", "-0.25", "0.1", "3.141592653589793", "123456789012345.123456789012345",
          ".5", "5.", "1e3", "inf", "nan", " 1.5", "1,5", "", "x", 1.5, 3, True, float("inf")]
STRS = ["x", "", " a b ", "é", "a\udcffb", 5, b"ab", True]
BOOLS = [True, False, "true", "no", "1", 0, ""]


def _paths(tmp: Path) -> list[Any]:
    (tmp / "f.txt").write_text("x")
    (tmp / "d").mkdir()
    return [str(tmp / "f.txt"), str(tmp / "d"), str(tmp / "missing"), "", ".", "a\x00b", "a\udcffb",
            tmp / "f.txt", tmp / "missing", b"abc", 5]


def _outcome(param: Any, value: Any) -> tuple:
    try:
        got = param._coerce_value(value, param=None, ctx=None)
    except Exception as e:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(e).__name__, str(e))
    return ("value", type(got).__name__, repr(got))


def _both(annotation: Any, info: Any) -> tuple[Any, Any]:
    coercion.install()
    desc = typer_coercion.resolve_type_descriptor(annotation, info)
    mine = typer.core.build_runtime_param(desc)
    return mine, typer_coercion.build_runtime_param(desc)


@pytest.mark.parametrize("annotation, values", [
    (int, INTS), (float, FLOATS), (str, STRS), (bool, BOOLS),
    (list[int], [["1", "2"], ("3",), ["1", "x"], "4", [], [1, "+2"]]),
    (list[str], [["a", ""], ("b",), "c", [1]]),
])
def test_plain_coercion_is_typers(annotation: Any, values: list[Any]) -> None:
    for info in (OptionInfo(), ArgumentInfo()):
        mine, theirs = _both(annotation, info)
        assert isinstance(mine, coercion.PlainParam)
        for v in values:
            assert _outcome(mine, v) == _outcome(theirs, v), (annotation, v)


def test_plain_path_coercion_is_typers(tmp_path: Path) -> None:
    values = _paths(tmp_path)
    for annotation, vals in ((Path, values), (list[Path], [values[:3], tuple(values[7:9]), values[3:7], values[0]])):
        mine, theirs = _both(annotation, OptionInfo())
        assert isinstance(mine, coercion.PlainParam)
        for v in vals:
            assert _outcome(mine, v) == _outcome(theirs, v), (annotation, v)


def test_other_parameters_keep_typers_coercion() -> None:
    """Bounds, path checks or a parser make typer's own coercion the only one."""
    for annotation, info in ((int, OptionInfo(min=0)), (float, OptionInfo(max=1.0, clamp=True)),
                             (Path, OptionInfo(exists=True)), (Path, OptionInfo(dir_okay=False)),
                             (Path, OptionInfo(resolve_path=True)), (str, OptionInfo(parser=str.upper)),
                             (dict, OptionInfo())):
        mine, _ = _both(annotation, info)
        assert not isinstance(mine, coercion.PlainParam), (annotation, info)
    mine, _ = _both(int, OptionInfo(min=0))
    with pytest.raises(Exception, match="greater than or equal to 0"):
        mine._coerce_value("-1", param=None, ctx=None)


def test_convert_parameters_are_all_plain() -> None:
    """Every parameter of ``convert`` (the command the ingest benchmarks time) is plain."""
    cmd = typer.main.get_command(app).commands["convert"]  # type: ignore[attr-defined]
    for p in cmd.params:
        d = p.type_descriptor
        assert coercion.plain_converter(d.annotation, d.parameter_info) is not None, p.name


def test_convert_process_does_not_import_pydantic(tmp_path: Path) -> None:
    code = ("import sys\n"
            "from echo_et.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))\n")
    trace = REPO / "fixtures" / "traces" / "cpu_single" / "rank0.et.json.gz"
    out = subprocess.run([sys.executable, "-c", code, "convert", str(trace), "--rank", "0",
                          "--from", "pytorch_et", "-o", str(tmp_path / "job")],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
    assert (tmp_path / "job").is_dir()


def test_bad_value_gets_typers_message(tmp_path: Path) -> None:
    """A value the plain path leaves to typer: the one-line error typer's coercion words."""
    trace = REPO / "fixtures" / "traces" / "cpu_single" / "rank0.et.json.gz"
    out = subprocess.run([sys.executable, "-m", "echo_et.cli.main", "convert", str(trace),
                          "--rank", "1e3", "-o", str(tmp_path / "job")],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: Invalid value for '--rank': Input should be a valid "
                                  "integer, unable to parse string as an integer")
