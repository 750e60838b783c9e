"""Format converters, installed as ``echo_et.converters``.

Each converter module reads like a codec: ``read(paths, options) -> Job`` and/or
``write(job, dest, options)``, plus ``sniff(path) -> bool`` for format detection. Modules
are imported lazily so that one format's dependencies never load for another.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
from collections.abc import Iterator
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
        elif p.is_dir() or p.is_file():
            out.append(p)
        else:
            raise EchoError(f"{p}: not a regular file (a FIFO, device or socket)")
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
    with fewer_collections():
        return load_module(fmt).read(files, options)


@contextlib.contextmanager
def fewer_collections(young: int = 100_000) -> Iterator[None]:
    """No cyclic garbage collection while a reader builds hundreds of thousands of small
    objects (events, ops, their args): a collection walks every container made since the
    last one, so even rare ones cost a reader a tenth of its time, and most of those objects
    are dropped by reference counting as soon as the graph is built (then no collection ever
    sees them). Readers make no reference cycles on their paths, so memory is unchanged;
    the collector's state and thresholds come back afterwards. ``young`` is the gen-0
    threshold used if the collector is re-enabled inside (a nested caller)."""
    old = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.set_threshold(max(old[0], young), *old[1:])
    gc.disable()
    try:
        yield
    finally:
        gc.set_threshold(*old)
        if was_enabled:
            gc.enable()
