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


# The tests left out of the fast subset (`python -m pytest -m "not slow"`, README): whole
# files, or single tests as "file.py::name", that take seconds each (a model traced, HTA, a
# sweep, a real trace's whole pipeline). CI runs everything.
SLOW = {
    "test_astra_sim_binary.py",
    "test_astra_sim_real.py",
    "test_kineto_real.py",
    "test_passes_real.py",
    "test_sim_real.py",
    "test_hta_timeline.py",
    "test_sweep_resume.py",
    "test_config_sweep.py",
    "test_trace_cli.py",
    "test_trace_gpt.py",
    "test_trace_insitu.py",
    "test_trace_layout.py",
    "test_trace_meta.py",
    "test_trace_steps.py",
    "test_trace_user.py",
    "test_determinism.py",
    "test_fuzz_promise.py",
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        file = item.path.name
        name = item.originalname if hasattr(item, "originalname") else item.name
        if file in SLOW or f"{file}::{name}" in SLOW:
            item.add_marker(pytest.mark.slow)
