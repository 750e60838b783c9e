"""Which GPU kernels are communication, and of which library, from the kernel's full name.

A communication kernel taken for compute corrupts every prediction (it is timed as compute
and slowed by overlap), so the rules look at what a kernel *is*, not only at a list of
library prefixes:

* its name: the collective it performs (``allreduce``, ``reduce_scatter``, ...), or the
  expert-parallel exchange (``dispatch``/``combine``/``notify_*``) in an ``intranode`` or
  ``internode`` namespace, whatever the library around it is called;
* its parameters (Kineto keeps the demangled signature): handles to peers' memory or to a
  communicator (``RankData*``, ``RankSignals``, ``DeviceHandle<MemoryChannel>``,
  ``nvshmem_team_t``, ``ncclDevComm*``, ``buffer_ptrs``, ``barrier_signal_ptrs``, ...), which a
  compute kernel never takes;
* the library, for the per-library counts, from the namespace or a known prefix.

Families (each pinned by tests with names from the libraries' public sources):

  nccl / rccl       ``ncclDevKernel_*``, ``ncclKernel_*``, RCCL's ``ncclDevKernel_Generic``
  deep_ep           DeepEP and its forks: ``intranode::``/``internode::``/``internode_ll::``
                    ``dispatch``, ``combine``, ``notify_dispatch``, ``cached_notify_*``,
                    ``clean_low_latency_buffer`` in any outer namespace
  nvshmem           ``nvshmemi_*``/``nvshmemx_*`` kernels and kernels taking NVSHMEM teams
  mscclpp           MSCCL++ kernels (``allreduce7``, ``allreduceAllPairs``, ... on memory channels)
  custom all-reduce vLLM/SGLang ``cross_device_reduce_*``, TensorRT-LLM ``oneShotAllReduceKernel``,
                    ``twoShotAllReduceKernel``, ``allreduce_fusion_*``, PyTorch symmetric memory
                    ``one_shot_all_reduce``/``multimem_all_reduce``
  other             any other kernel whose name is a collective or which takes peer handles

What is not communication stays compute even when its name looks close: DeepEP's
``get_dispatch_layout`` (it counts tokens locally), ``reduce_kernel``, ``scatter_gather``
kernels of indexing, ``all_reduce`` of a single-GPU reduction library are told apart by the
rules above (namespace, parameters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from echo_et.ir.schema import pb


@dataclass(frozen=True)
class CommKernel:
    library: str             # nccl, rccl, deep_ep, nvshmem, mscclpp, vllm, sglang, tensorrt_llm, ...
    family: str              # collective, ep_dispatch, ep_combine, ep_notify, custom_all_reduce, p2p, other
    coll: int | None = None  # the CollectiveType the name states, when it states one


_NCCL = re.compile(r"^(?:void\s+)?(nccl|rccl)", re.IGNORECASE)
# RCCL launches one generic kernel whose signature carries channel masks (ROCm/roctracer#101).
_RCCL_GENERIC = re.compile(r"Generic.*channelMasks", re.IGNORECASE)

# Expert-parallel exchange in an intranode/internode namespace (DeepEP and its forks).
_EP = re.compile(
    r"(?:^|[\s:])(?:intranode|internode|internode_ll|low_latency|ll)::"
    r"(notify_dispatch|cached_notify_dispatch|notify_combine|cached_notify_combine|cached_notify|"
    r"dispatch|combine|clean_low_latency_buffer|barrier)\b")
_EP_NAMESPACES = frozenset({"intranode", "internode", "internode_ll", "low_latency", "ll"})
_EP_LAYOUT = re.compile(r"(?:^|::)get_dispatch_layout\b|layout::")
_DEEP_EP = re.compile(r"deep_?ep", re.IGNORECASE)

_NVSHMEM = re.compile(r"nvshmem", re.IGNORECASE)
_MSCCLPP = re.compile(r"msccl(?:pp)?\b|mscclpp::", re.IGNORECASE)

_CUSTOM_AR = re.compile(
    r"cross_device_reduce|one_?shot_?all_?reduce|two_?shot_?all_?reduce|all_?reduce_?fusion|"
    r"custom_?all_?reduce|multimem_all_reduce|lamport.*all_?reduce|all_?reduce.*lamport|"
    r"userbuffers", re.IGNORECASE)
_CUSTOM_AR_LIBS = (("vllm::", "vllm"), ("sglang::", "sglang"), ("tensorrt_llm::", "tensorrt_llm"),
                   ("symmetric_memory", "torch_symm_mem"), ("c10d::", "torch_symm_mem"),
                   ("userbuffers", "userbuffers"), ("transformer_engine", "transformer_engine"))

_OTHER_LIBS = re.compile(r"(?:^|[^a-z])(gloo|uccl|hccl|oneccl|cutlass_comm|symm_mem|mori)(?:[^a-z]|$)",
                         re.IGNORECASE)

# Parameters no compute kernel takes: peers' buffers, signals, channels, communicators.
_PEER_PARAMS = re.compile(
    r"RankData\s*\*|RankSignals|\bSignal\s*\*|MemoryChannel|PortChannel|SmChannel|ProxyChannel|"
    r"nvshmem_team_t|ncclDevComm|ncclWindow|ncclTeam|buffer_ptrs|barrier_signal_ptrs|peer_ptrs|"
    r"p2pStates|P2pState|IpcMemHandle|SymmetricMemory")

_COLL_WORDS = (
    (re.compile(r"all_?reduce|cross_device_reduce", re.IGNORECASE), pb.COLL_ALL_REDUCE),
    (re.compile(r"all_?gather", re.IGNORECASE), pb.COLL_ALL_GATHER),
    (re.compile(r"reduce_?scatter", re.IGNORECASE), pb.COLL_REDUCE_SCATTER),
    (re.compile(r"all_?to_?all", re.IGNORECASE), pb.COLL_ALL_TO_ALL),
)
_P2P_WORDS = re.compile(r"send_?recv|sendrecv", re.IGNORECASE)


def _head(name: str) -> str:
    """The kernel's qualified name without ``void`` and its parameter list."""
    head = name.split("(", 1)[0] if "(" in name else name
    return head[5:] if head.startswith("void ") else head


def _coll_of(text: str) -> int | None:
    for pattern, coll in _COLL_WORDS:
        if pattern.search(text):
            return coll
    return None


def _outer_namespace(head: str) -> str:
    base = head.split("<", 1)[0]
    parts = [p for p in base.split("::") if p and not p.startswith("(")]
    return parts[0] if len(parts) > 1 else ""


@lru_cache(maxsize=65536)
def comm_kernel(name: str) -> CommKernel | None:
    """What communication kernel ``name`` is, or None for a compute kernel."""
    if _NCCL.match(name):
        lib = "rccl" if _head(name).lower().startswith("rccl") or _RCCL_GENERIC.search(name) else "nccl"
        return CommKernel(lib, "collective")
    head = _head(name)
    if _EP_LAYOUT.search(head):
        return None  # DeepEP's layout kernel counts tokens on the local GPU
    m = _EP.search(head)
    if m:
        word = m.group(1)
        family = ("ep_notify" if "notify" in word or word in ("clean_low_latency_buffer", "barrier")
                  else "ep_dispatch" if word == "dispatch" else "ep_combine")
        outer = _outer_namespace(head)
        if outer in _EP_NAMESPACES:
            outer = ""
        lib = "deep_ep" if _DEEP_EP.search(head) else (outer or "ep")
        return CommKernel(lib, family, pb.COLL_ALL_TO_ALL if family != "ep_notify" else None)
    if _DEEP_EP.search(head):
        return CommKernel("deep_ep", "other")
    if _MSCCLPP.search(name):
        return CommKernel("mscclpp", "collective", _coll_of(head))
    if _NVSHMEM.search(name):
        return CommKernel("nvshmem", "collective" if _coll_of(head) else "other", _coll_of(head))
    if _CUSTOM_AR.search(head):
        lib = next((lib for key, lib in _CUSTOM_AR_LIBS if key in name), "custom_allreduce")
        return CommKernel(lib, "custom_all_reduce", pb.COLL_ALL_REDUCE)
    other = _OTHER_LIBS.search(head)
    if other:
        return CommKernel(other.group(1).lower(), "other", _coll_of(head))
    coll = _coll_of(head)
    if coll is not None:
        return CommKernel(_outer_namespace(head) or "other", "collective", coll)
    if _P2P_WORDS.search(head):
        return CommKernel(_outer_namespace(head) or "other", "p2p")
    if "(" in name and _PEER_PARAMS.search(name.split("(", 1)[1]):
        return CommKernel(_outer_namespace(head) or "other", "other")
    return None


def is_comm_kernel(name: str) -> bool:
    return comm_kernel(name) is not None


def library(name: str) -> str | None:
    k = comm_kernel(name)
    return k.library if k is not None else None
