"""Conventions one part writes and another reads: node names, node and manifest attrs.

The ex-situ tracer (``echo_et.trace``) writes them and passes read them back; both depend on
the IR, so the convention lives here, below both, rather than in either.
"""

from __future__ import annotations

import json
from typing import Any

# Name prefix of the host operator put where a communication call was issued
# ("issue:send", "issue:all_reduce"); the communication node itself hangs off it.
ISSUE_PREFIX = "issue:"
# Name prefix of the host wait put where a communication's completion was waited for
# ("wait:recv"): a wait on that one call, not on the whole device.
WAIT_PREFIX = "wait:"

# Node attrs with the launch configuration of a communication's NCCL kernel, as a trace
# recorded it: thread blocks (NCCL's channels for that call) and threads per block (which
# the protocol fixes). The Kineto converter writes them; echo_et.models.comm.launch reads
# them to check the emulated NCCL choice against the trace.
LAUNCH_BLOCKS_ATTR = "launch_blocks"
LAUNCH_THREADS_ATTR = "launch_threads"

# Manifest attr with the NCCL release a trace states (Kineto's distributedInfo.nccl_version,
# e.g. "2.17.1"); models.comm.launch prefers it among equally good emulations.
NCCL_VERSION_ATTR = "kineto.nccl_version"

# Descriptions the tracer gives the groups it derives from the layout that are not one of its
# axes: Megatron's embedding group (the first and the last pipeline stage of one tp and dp
# coordinate, which share the word embedding) and its model-parallel group (every tp and pp
# rank of one data-parallel replica). Re-staging a pipeline reads them to re-derive those
# groups at the new depth.
EMBEDDING_GROUP = "embd"
MODEL_PARALLEL_GROUP = "mp"


# Megatron-core names the process groups it makes (``torch.distributed.new_group``'s
# ``group_desc``, which Kineto's distributedInfo records as ``pg_desc``): the axis of the
# layout each one is.
MEGATRON_AXIS_DESCS: dict[str, str] = {
    "TENSOR_MODEL_PARALLEL_GROUP": "tp",
    "DATA_PARALLEL_GROUP": "dp",
    "DATA_PARALLEL_GROUP_GLOO": "dp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp",
    "CONTEXT_PARALLEL_GROUP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep",
}
# Groups inside one data-parallel replica that are none of its axes: the tracer's derived
# groups and Megatron-core's by their names. More replicas copy them; they never span dp.
PER_REPLICA_DESCS = frozenset({EMBEDDING_GROUP, MODEL_PARALLEL_GROUP, "EMBEDDING_GROUP",
                               "POSITION_EMBEDDING_GROUP", "MODEL_PARALLEL_GROUP"})


def derived_group_coords(role: str, at: dict[str, int], tp: int, pp: int) -> list[dict[str, int]]:
    """The (tp, dp, pp) coordinates of the members of Megatron's derived group ``role`` seen
    from the rank at ``at``, in group-rank order: the embedding group's are the first and
    the last stage at its tp and dp coordinates (one stage when pp = 1; a middle stage is not
    a member of the group it sees); the model-parallel group's are every tp and pp rank of
    its replica, stage by stage. Both the tracer (``trace.layout``) and re-staging
    (``passes.pipeline``) number them with their own rank order. A context-parallel
    coordinate in ``at`` ("cp") is kept: each context-parallel rank has groups of its own."""
    keep = {"cp": at["cp"]} if "cp" in at else {}
    if role == EMBEDDING_GROUP:
        return [{"tp": at["tp"], "dp": at["dp"], "pp": s, **keep} for s in ((0,) if pp == 1 else (0, pp - 1))]
    if role == MODEL_PARALLEL_GROUP:
        return [{"tp": t, "dp": at["dp"], "pp": s, **keep} for s in range(pp) for t in range(tp)]
    raise ValueError(f"not a derived group role: {role!r}")

# Node attr: a factor on the work the node stands for. A pass that carries one piece of work
# to a place where it does more or less of it writes it (the re-staged optimizer of a stage
# with more or fewer parameters than the one it was traced on); whoever prices the node from
# its operator and shapes multiplies the price by it (``passes.compute_retime``), as the
# pass already did to the measured duration.
WORK_SCALE_ATTR = "work_scale"

# Manifest attr with the settings of the workload the tracer ran (a JSON object: the GPT
# configuration's fields and "workload", e.g. "megatron-gpt"); passes and sweeps read it.
WORKLOAD_ATTR = "trace.workload"


def traced_workload(manifest: Any) -> dict[str, Any]:
    """What a Job's manifest records of its workload (``WORKLOAD_ATTR``), or {} when it
    records nothing readable."""
    try:
        work = json.loads(manifest.attrs.get(WORKLOAD_ATTR, "") or "{}")
    except ValueError:
        return {}
    return work if isinstance(work, dict) else {}
