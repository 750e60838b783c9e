"""Format converters, installed as ``echo_et.converters``.

Each converter module reads like a codec: ``read(paths, options) -> Job`` and/or
``write(job, dest, options)``, plus ``sniff(path) -> bool`` for format detection. Modules
are imported lazily so that one format's dependencies never load for another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from echo_et.errors import EchoError, OptionError

# Input formats in detection order (most specific sniffers first).
READERS: dict[str, str] = {
    "echo-et": "echo_et.converters.echo_job",
    "chakra": "echo_et.converters.chakra",
    "kineto": "echo_et.converters.kineto",
    "pytorch_et": "echo_et.converters.pytorch_et",
    "simai": "echo_et.converters.simai",
}


@dataclass
class ReadOptions:
    """Options every reader accepts; a reader ignores those that do not apply to it."""

    rank: int | None = None            # rank of a single input whose rank cannot be found
    step: int | None = None            # ProfilerStep#N to keep (default: last complete one)
    host_et: list[Path] = field(default_factory=list)  # host execution traces to link
    world_size: int | None = None      # for formats that do not state it (SimAI)
    gpus_per_node: int | None = None
    name: str = ""


def load_module(fmt: str) -> ModuleType:
    if fmt not in READERS:
        raise EchoError(f"unknown input format {fmt!r} (known: {', '.join(READERS)})")
    try:
        return importlib.import_module(READERS[fmt])
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("echo_et.converters"):
            raise EchoError(f"input format {fmt!r} is not available in this build") from None
        raise


def expand_inputs(paths: list[Path]) -> list[Path]:
    """Files as given; a folder stands for the files directly in it (sorted), except a Job
    directory, which stands for itself."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise EchoError(f"{p}: no such file or directory")
        if p.is_dir() and not (p / "manifest.pb").is_file():
            files = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
            if not files:
                raise EchoError(f"{p}: folder has no files")
            out.extend(files)
        else:
            out.append(p)
    return out


def detect(paths: list[Path]) -> str:
    """The input format of ``paths`` (all must agree)."""
    found: set[str] = set()
    for p in paths:
        fmt = None
        for name in READERS:
            try:
                mod = load_module(name)
            except EchoError:
                continue
            if mod.sniff(p):
                fmt = name
                break
        if fmt is None:
            raise OptionError("format", f"{p}: cannot tell the format (name it: {', '.join(READERS)})")
        found.add(fmt)
    if len(found) > 1:
        raise EchoError(f"inputs mix formats ({', '.join(sorted(found))}); convert them separately")
    return found.pop()


def read(paths: list[Path], fmt: str | None = None, options: ReadOptions | None = None):
    """Read ``paths`` into a Job, detecting the format unless ``fmt`` is given."""
    options = options or ReadOptions()
    files = expand_inputs(paths)
    fmt = fmt or detect(files)
    return load_module(fmt).read(files, options)
