"""Format converters, installed as ``echo_et.converters``.

Each converter module reads like a codec: ``read(paths, options) -> Job`` and/or
``write(job, dest, options)``, plus ``sniff(path) -> bool`` for format detection. Modules
are imported lazily so that one format's dependencies never load for another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from echo_et.converters.describe import describe, is_metadata
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
    directory, which stands for itself. A folder's metadata files (a small JSON object that
    is no trace, such as the ``run.json`` a profiling script writes beside its traces) are
    not inputs."""
    out: list[Path] = []
    for p in paths:
        if not p.exists():
            raise EchoError(f"{p}: no such file or directory")
        if p.is_dir() and not (p / "manifest.pb").is_file():
            files = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
            traces = [q for q in files if not is_metadata(q)]
            if not traces:
                meta = f" (only metadata: {', '.join(q.name for q in files[:3])})" if files else ""
                raise EchoError(f"{p}: folder has no traces{meta}")
            out.extend(traces)
        elif p.is_dir() or p.is_file():
            out.append(p)
        else:
            raise EchoError(f"{p}: not a regular file (a FIFO, device or socket)")
    return out


def format_of(path: Path) -> str:
    """The input format of one file; none -> an OptionError of ``format`` saying what the
    file holds."""
    for name in READERS:
        try:
            mod = load_module(name)
        except EchoError:
            continue
        if mod.sniff(path):
            return name
    raise OptionError("format", f"{path}: cannot tell the format: found {describe(path)} "
                                f"(formats read: {', '.join(READERS)})")


def detect(paths: list[Path]) -> tuple[str, list[Path], list[Path]]:
    """The input format of ``paths``, the inputs of that format, and the host execution
    traces among them when the others are Kineto traces (the pair a profiling run leaves in
    one folder: they are linked); any other mix of formats is refused."""
    by_fmt: dict[str, list[Path]] = {}
    for p in paths:
        by_fmt.setdefault(format_of(p), []).append(p)
    if set(by_fmt) == {"kineto", "pytorch_et"}:
        return "kineto", by_fmt["kineto"], by_fmt["pytorch_et"]
    if len(by_fmt) > 1:
        raise EchoError(f"inputs mix formats ({', '.join(sorted(by_fmt))}); convert them separately")
    fmt, files = by_fmt.popitem()
    return fmt, files, []


def read(paths: list[Path], fmt: str | None = None, options: ReadOptions | None = None):
    """Read ``paths`` into a Job, detecting the format unless ``fmt`` is given (Kineto
    traces given with their host execution traces are linked to them)."""
    options = options or ReadOptions()
    files = expand_inputs(paths)
    if fmt is None:
        fmt, files, host_ets = detect(files)
        if host_ets:
            if options.host_et:
                raise OptionError("host_et", f"host execution traces given twice: {host_ets[0].name} among the "
                                             "inputs and others to link")
            options = dataclasses.replace(options, host_et=host_ets)
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
