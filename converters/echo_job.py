"""An echo-et Job directory as input (so every verb accepts a Job or a raw trace)."""

from __future__ import annotations

from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir import Job, load_job
from echo_et.ir.io import is_job_dir


def sniff(path: Path) -> bool:
    return path.is_dir() and is_job_dir(path)


def read(paths: list[Path], options) -> Job:
    if len(paths) != 1:
        raise EchoError("give one echo-et job directory at a time")
    return load_job(paths[0])
