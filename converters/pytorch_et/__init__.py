"""PyTorch host execution traces (``ExecutionTraceObserver`` JSON), alone or linked to Kineto.

Format: one JSON object ``{"schema", "pid", "time", "start_ts", "nodes": [...], "finish_ts"}``,
plain or gzipped. Schemas ``1.0.1`` (flat nodes with ``parent``) through ``1.0.2``-``1.1.1``
``-chakra.0.0.4`` and newer (``ctrl_deps``, nested ``inputs``, ``attrs`` list) are read; the
node shape is detected per node. Linked "ET+" files from ``chakra_trace_link`` read as well
(their ``ts``/``inclusive_dur`` give timing; their appended GPU ops are dropped and counted).

What a host trace alone gives: every host op as a KIND_CPU_OP node on its thread (nesting as
DEP_CONTROL, cross-thread tensor hand-offs as DEP_DATA, input shapes/types, tensor ids), one
collective or send/recv node per communication call (``record_param_comms``, else the
``c10d::*`` op, else the backend ``nccl:*``/``gloo:*`` op) with bytes, dtype and group, and the
process groups of ``## process_group:init ##``. What is lost: durations (a plain host ET has no
timing; every op is 0 ns and counted as ``host_et_untimed_ops``), GPU kernels, and the group of
calls in traces that do not name it (counted as ``host_et_group_guessed``).

``link(job, paths)`` adds a host trace's shapes, tensor ids and group definitions to a Job read
from Kineto traces of the same run (see :mod:`.link`).
"""

from __future__ import annotations

from pathlib import Path

from echo_et.converters.pytorch_et.job import assign_ranks, build_job
from echo_et.converters.pytorch_et.link import link
from echo_et.converters.pytorch_et.trace import (
    HostTrace,
    expand_paths,
    load,
    looks_like_host_et,
    rank_from_name,
)
from echo_et.errors import OptionError
from echo_et.ir import Job

__all__ = ["HostTrace", "link", "load", "rank_from_name", "read", "sniff"]


def sniff(path: Path) -> bool:
    """A JSON object with a top-level ``schema`` and a ``nodes`` array (gzipped or not)."""
    return looks_like_host_et(Path(path))


def read(paths: list[Path], options) -> Job:
    """One Job from host traces, one file per rank (a folder stands for the host traces in it)."""
    if getattr(options, "host_et", None):
        raise OptionError("host_et", "host traces link to Kineto traces; these inputs are host traces "
                                     "already (convert them without linking)")
    files = expand_paths(paths)
    traces = [load(p) for p in files]
    ranks = assign_ranks(traces, getattr(options, "rank", None))
    return build_job(ranks, world_hint=getattr(options, "world_size", None),
                     step=getattr(options, "step", None),
                     name=getattr(options, "name", "") or _job_name(files))


def _job_name(files: list[Path]) -> str:
    stem = files[0].name
    for suffix in (".gz", ".json"):
        stem = stem.removesuffix(suffix)
    return stem
