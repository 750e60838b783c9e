"""The ex-situ tracer: one device plays every distinct rank of a dp x tp x pp job.

``trace(build_fn, layout, options)`` runs each distinct rank's real sub-model for one
measured step under ``torch.profiler`` while a recording process group
(:mod:`echo_et.trace.recording`) pretends to be the rest of the world, and returns a Job for
the whole world (:mod:`echo_et.trace.tracer`). The build function contract is in
:mod:`echo_et.trace.context`; built-in workloads are in :mod:`echo_et.workloads`.

Importing this package does not import torch; tracing does.
"""

from echo_et.trace.context import RankContext
from echo_et.trace.identity import structure_hash
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.session import TraceOutOfMemory
from echo_et.trace.tracer import TraceOptions, TraceResult, trace

__all__ = ["ParallelLayout", "RankContext", "TraceOptions", "TraceOutOfMemory", "TraceResult",
           "structure_hash", "trace"]
