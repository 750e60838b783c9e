"""Kineto traces (what ``torch.profiler`` writes: ``*.json`` / ``*.json.gz``) -> a Job.

Format range: Chrome-trace JSON written by Kineto/PyTorch 1.8 through 2.x (``schemaVersion``
1), CUDA (CUPTI) and ROCm (roctracer) flavours, one file per rank or a folder of them.
``ts``/``dur`` are microseconds whatever ``displayTimeUnit`` says (see events.py).

What is kept: host ops with their nesting and record-function ids, runtime launches and
synchronisations, GPU kernels/memcpy/memset on their streams, launch and cross-stream
dependencies, NCCL (and gloo) communication as typed collective / send / recv nodes with
bytes and process groups, the chosen ``ProfilerStep`` window and its measured duration.
What is lost: other runtime calls (counted), flows, instant events, GPU-side annotations,
python stacks beyond their events, tensor values. ``Job.manifest.dropped`` lists every drop
and every guess by reason; docs/ingest-kineto.md explains each one.

With ``ReadOptions.host_et`` the Job is handed to the PyTorch execution-trace linker
(``echo_et.converters.pytorch_et.link``), which adds shapes, tensor ids and process groups
to the host ops.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Job

from .jsonstream import open_text_source
from .reader import rank_of_name, read_job

_HEAD_BYTES = 1 << 16


def sniff(path: Path) -> bool:
    """A ``.json``/``.json.gz`` file whose head looks like a Chrome trace (a
    ``traceEvents`` key, or events with ``ph``/``ts``)."""
    path = Path(path)
    if not path.is_file() or not path.name.endswith((".json", ".json.gz")):
        return False
    try:
        src = open_text_source(path)
        try:
            head = src.read(_HEAD_BYTES)
        finally:
            src.close()
    except (OSError, EOFError, zlib.error, EchoError):
        return True  # a broken .json(.gz): the reader explains what is wrong with it
    text = head.decode("utf-8", "replace")
    if '"traceEvents"' in text:
        return True
    if '"schemaVersion"' in text and '"deviceProperties"' in text:
        return True
    return text.lstrip().startswith("[") and '"ph"' in text and '"ts"' in text


def read(paths: list[Path], options) -> Job:
    """Kineto files (one per rank) -> Job; linked with host ETs when options.host_et."""
    job = read_job([Path(p) for p in paths], options)
    if getattr(options, "host_et", None):
        try:
            from echo_et.converters.pytorch_et import link
        except ImportError:
            raise OptionError("host_et", "linking host execution traces needs the PyTorch execution-trace linker "
                            "(echo_et.converters.pytorch_et.link), which this build lacks"
                            ) from None
        return link(job, list(options.host_et))
    return job


__all__ = ["rank_of_name", "read", "read_job", "sniff"]
