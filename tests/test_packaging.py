"""What a user's `pip install echo-et` gets: the wheel holds every module of the package and of
`converters/` (installed as `echo_et.converters`), and the model presets, which are folders of
JSON that only the package data brings along (a wheel without them installs and then fails at
the first prediction)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_holds_the_modules_the_converters_and_the_presets(tmp_path) -> None:
    # built from a copy: setuptools writes build/ and the egg-info into the tree it builds
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("echo_et", "converters"):
        shutil.copytree(REPO / folder, src / folder, ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    # built as a user's pip builds it, in an isolated environment: setuptools need not be here
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           str(src), "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # setuptools warns, then (in its later releases) drops, data folders not listed as packages
    assert "BuildBackendWarning" not in proc.stderr, proc.stderr
    (wheel,) = tmp_path.glob("echo_et-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"echo_et/{p.relative_to(REPO / 'echo_et').as_posix()}"
                for p in (REPO / "echo_et").rglob("*") if p.suffix in (".py", ".json") and "__pycache__" not in p.parts}
    expected |= {f"echo_et/converters/{p.relative_to(REPO / 'converters').as_posix()}"
                 for p in (REPO / "converters").rglob("*.py") if "__pycache__" not in p.parts}
    assert {n for n in expected if "/presets/" in n}, "the presets are found"
    assert expected - names == set()
    assert "echo_et/py.typed" in names
