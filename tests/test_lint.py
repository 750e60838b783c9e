"""The code base stays ruff-clean (the project's style gate runs with the tests)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    proc = subprocess.run(
        [ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
