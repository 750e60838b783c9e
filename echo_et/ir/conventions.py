"""Node-naming conventions one part writes and another reads.

The ex-situ tracer (``echo_et.trace``) writes them and passes read them back; both depend on
the IR, so the convention lives here, below both, rather than in either.
"""

from __future__ import annotations

# Name prefix of the host operator put where a communication call was issued
# ("issue:send", "issue:all_reduce"); the communication node itself hangs off it.
ISSUE_PREFIX = "issue:"

# Node attrs with the launch configuration of a communication's NCCL kernel, as a trace
# recorded it: thread blocks (NCCL's channels for that call) and threads per block (which
# the protocol fixes). The Kineto converter writes them; echo_et.models.comm.launch reads
# them to check the emulated NCCL choice against the trace.
LAUNCH_BLOCKS_ATTR = "launch_blocks"
LAUNCH_THREADS_ATTR = "launch_threads"

# Manifest attr with the NCCL release a trace states (Kineto's distributedInfo.nccl_version,
# e.g. "2.17.1"); models.comm.launch prefers it among equally good emulations.
NCCL_VERSION_ATTR = "kineto.nccl_version"
