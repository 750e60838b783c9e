"""Shared test fixtures: the real inputs under ../shared/data, skipped when absent."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
FIXTURES = REPO / "fixtures"


def shared_path(rel: str) -> Path:
    """A file under ../shared/data; skips the test with a clear reason when it is absent."""
    p = SHARED_DATA / rel
    if not p.exists():
        pytest.skip(f"needs ../shared/data/{rel} (real inputs, present in CI; absent in a fresh clone)")
    return p


def unpack(archive: Path, dest: Path) -> Path:
    """Unpack a .tar.gz/.tgz from shared data into ``dest`` (a tmp dir); returns ``dest``."""
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip("needs ../shared/data (real inputs, present in CI; absent in a fresh clone)")
    return SHARED_DATA
