"""The generated protobuf module and the names users see for its enums.

``pb`` is the single source of truth (``proto/echo_et.proto``); everything else in the IR
layer is a thin convenience over its messages.
"""

from __future__ import annotations

from echo_et._proto import echo_et_pb2 as pb

SCHEMA_VERSION = "echo-et/1"

COLLECTIVE_NAMES: dict[int, str] = {
    pb.COLL_UNKNOWN: "unknown",
    pb.COLL_ALL_REDUCE: "all_reduce",
    pb.COLL_ALL_GATHER: "all_gather",
    pb.COLL_REDUCE_SCATTER: "reduce_scatter",
    pb.COLL_ALL_TO_ALL: "all_to_all",
    pb.COLL_BROADCAST: "broadcast",
    pb.COLL_REDUCE: "reduce",
    pb.COLL_GATHER: "gather",
    pb.COLL_SCATTER: "scatter",
    pb.COLL_BARRIER: "barrier",
}
COLLECTIVE_BY_NAME: dict[str, int] = {v: k for k, v in COLLECTIVE_NAMES.items()}

# Collectives whose members must all pass the same number of bytes. All-to-all (uneven
# splits), gather/scatter (root differs) and barrier are exempt.
EQUAL_SIZE_COLLECTIVES = frozenset(
    {pb.COLL_ALL_REDUCE, pb.COLL_ALL_GATHER, pb.COLL_REDUCE_SCATTER, pb.COLL_BROADCAST}
)

NODE_KIND_NAMES: dict[int, str] = {
    pb.KIND_UNKNOWN: "unknown",
    pb.KIND_COMPUTE: "compute",
    pb.KIND_COLLECTIVE: "collective",
    pb.KIND_SEND: "send",
    pb.KIND_RECV: "recv",
    pb.KIND_CPU_OP: "cpu_op",
    pb.KIND_LAUNCH: "launch",
    pb.KIND_MEMCPY: "memcpy",
    pb.KIND_MEMSET: "memset",
    pb.KIND_SYNC: "sync",
    pb.KIND_COMM_UNKNOWN: "comm_unknown",
}
NODE_KIND_BY_NAME: dict[str, int] = {v: k for k, v in NODE_KIND_NAMES.items()}

STREAM_KIND_NAMES: dict[int, str] = {
    pb.STREAM_UNKNOWN: "unknown",
    pb.STREAM_CPU_THREAD: "cpu_thread",
    pb.STREAM_GPU_COMPUTE: "gpu_compute",
    pb.STREAM_GPU_COMM: "gpu_comm",
    pb.STREAM_GPU_COPY: "gpu_copy",
}

KERNEL_CLASS_NAMES: dict[int, str] = {
    pb.KC_OTHER: "other",
    pb.KC_GEMM: "gemm",
    pb.KC_ATTENTION: "attention",
    pb.KC_ELEMENTWISE: "elementwise",
    pb.KC_REDUCTION: "reduction",
    pb.KC_NORM: "norm",
    pb.KC_OPTIMIZER: "optimizer",
    pb.KC_MEMCPY: "memcpy",
    pb.KC_CONV: "conv",
    pb.KC_EMBEDDING: "embedding",
}
KERNEL_CLASS_BY_NAME: dict[str, int] = {v: k for k, v in KERNEL_CLASS_NAMES.items()}

ROLE_NAMES: dict[int, str] = {
    pb.ROLE_UNKNOWN: "unknown",
    pb.ROLE_WORLD: "world",
    pb.ROLE_DP: "dp",
    pb.ROLE_TP: "tp",
    pb.ROLE_PP: "pp",
    pb.ROLE_EP: "ep",
    pb.ROLE_CP: "cp",
    pb.ROLE_CUSTOM: "custom",
}
ROLE_BY_NAME: dict[str, int] = {v: k for k, v in ROLE_NAMES.items()}

# Node kinds that run on a GPU stream and so count as device work in summaries.
DEVICE_KINDS = frozenset(
    {
        pb.KIND_COMPUTE,
        pb.KIND_COLLECTIVE,
        pb.KIND_SEND,
        pb.KIND_RECV,
        pb.KIND_MEMCPY,
        pb.KIND_MEMSET,
        pb.KIND_COMM_UNKNOWN,
    }
)
COMM_KINDS = frozenset({pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV, pb.KIND_COMM_UNKNOWN})


def collective_name(value: int) -> str:
    return COLLECTIVE_NAMES.get(value, f"collective_{value}")


def node_kind_name(value: int) -> str:
    return NODE_KIND_NAMES.get(value, f"kind_{value}")
