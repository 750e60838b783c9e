"""A timeline (measured or simulated) in Kineto's own trace schema: the JSON that
``torch.profiler`` writes, which HolisticTraceAnalysis (HTA), Perfetto, chrome://tracing and
TensorBoard read, and which ``echo-et convert`` reads back.

Two forms, chosen by the destination's name:

- a folder (any name not ending in ``.json`` / ``.json.gz``): one file per rank,
  ``rank-<R>.json``, each with ``distributedInfo.rank``: the layout HTA's
  ``TraceAnalysis(trace_dir=...)`` and ``echo-et convert`` read;
- one file (``*.json``, ``*.json.gz``): every rank in one trace, for Perfetto.

What each rank's events look like (the schema of Kineto 2.x, PyTorch 2.x):

- host threads: process ``pid`` = 1000000 + rank (a stand-in for the OS pid), one ``tid``
  per host stream (its traced thread id when the source had one); operators are
  ``cpu_op``, launches and syncs ``cuda_runtime`` with a ``correlation`` id; a
  ``ProfilerStep#N`` ``user_annotation`` spans the rank's step on its first host thread
  (on a thread of its own when the rank has none);
- GPU streams: ``pid`` = the device index (per-rank files; in one job file 2000000 +
  100 x rank + device, so ranks do not share a process), ``tid`` = the CUDA stream number,
  and ``args.device`` / ``args.stream`` / ``args.correlation`` as Kineto writes them;
  kernels are ``kernel``, copies ``gpu_memcpy`` / ``gpu_memset``; an ``ac2g`` flow links
  each launch to its kernels;
- communication on a GPU stream is an NCCL kernel (``ncclDevKernel_*`` when the node's own
  name is not one) with the metadata ``record_param_comms`` gives it: ``Collective name``,
  ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``, ``Process Group Name``,
  ``Process Group Description``, ``Process Group Ranks``, ``In split size`` / ``Out split
  size``, and ``Src Rank`` / ``Dst Rank`` (group ranks) for send/recv; communication on a
  host thread (gloo, ex-situ traces) is a ``gloo:<op>`` ``user_annotation`` with the same
  args;
- a collective's box spans its wait for the last member and its transfer, as the profiler
  records the kernel; ``args.wait_ns`` says how much of it was waiting;
- top level: ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (backend, rank,
  world size, ``pg_config`` with the groups the rank is in), ``displayTimeUnit`` ("ms"),
  ``baseTimeNanoseconds`` (the job-clock instant of ``ts`` 0), ``traceEvents``, and
  ``otherData`` (echo-et's provenance);
- ``ts``/``dur`` in microseconds with three decimals, so nanoseconds survive; keys sorted,
  so reruns are byte-identical. echo-et's own labels (``id``, ``kind``, ``bytes``,
  ``group``, ``seq``, ...) stay in ``args`` beside Kineto's.

The package's modules, each with one task:

- ``boxes``: one rank's events as Kineto boxes (lanes, names, args, flows, ``ProfilerStep``);
- ``document``: a trace's top-level keys, the whole trace held (:func:`kineto_traces`,
  :func:`chrome_trace`), and its text written in pieces;
- ``spool``, ``timeline_rows``, ``timeline``: :func:`write_timeline`, which streams any
  timeline (the simulated one: ``simulate --timeline``, ``predict``) through a scratch file,
  and its reference :func:`write_timeline_whole`;
- ``job_events``, ``job_export``: :func:`write`, the measured timeline of a Job streamed
  from its stored nodes and repeat blocks (``export chrome``), and :func:`job_timeline`.
"""

from __future__ import annotations

from echo_et.ir.timeline import TimelineEvent

from .boxes import HOST_PID_BASE
from .document import chrome_trace, is_single_file, kineto_traces
from .job_export import export_scratch, job_timeline, write
from .spool import RECORD_MIN_BYTES, ScratchEstimate, scratch_dir
from .timeline import timeline_scratch, write_timeline, write_timeline_whole

# What callers and tests use (the rest is each module's own).
__all__ = ["HOST_PID_BASE", "RECORD_MIN_BYTES", "ScratchEstimate", "TimelineEvent", "chrome_trace", "export_scratch",
           "is_single_file", "job_timeline", "kineto_traces", "scratch_dir", "timeline_scratch", "write",
           "write_timeline", "write_timeline_whole"]
