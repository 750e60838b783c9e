"""Collective names: every spelling readers meet, and one normaliser for them.

Spellings, all mapped to the IR's ``CollectiveType`` (or ``"send"`` / ``"recv"``):

- c10d op and ``record_param_comms`` names: ``allreduce``, ``_allgather_base``,
  ``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor``, ``all_to_allv``,
  ``alltoall_base``, ``recvAnySource``, ``monitored_barrier``; with their prefixes
  (``c10d::allreduce_``, ``_c10d_functional::all_gather_into_tensor``) and the backend
  annotations (``nccl:all_reduce``, ``gloo:broadcast``, ``nccl:send 0->1``);
- NCCL kernel names: ``ncclDevKernel_AllGather_RING_LL``, ``ncclKernel_AllReduce_...``,
  ``void ncclKernel_SendRecv_...`` (the collective word after the library prefix);
- Chakra / ASTRA-sim names (``ALL_REDUCE``, ``REDUCE_SCATTER_BLOCK``, ``ALL_TO_ALL``), SimAI
  workload tokens (``ALLREDUCE``, ``REDUCESCATTER``), the IR's own names (``all_reduce``).

:func:`normalize_collective` and :func:`normalize_comm` read a whole name;
:func:`collective_word` reads one bare word strictly; :func:`find_collective` searches free
text (a file name, an arbitrary node name) for the most specific collective word in it.
"""

from __future__ import annotations

import re
from functools import lru_cache

from echo_et.ir.schema import pb

SEND, RECV = "send", "recv"
Comm = int | str  # a CollectiveType, or SEND / RECV for point-to-point

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = pb.COLL_ALL_REDUCE, pb.COLL_ALL_GATHER, pb.COLL_REDUCE_SCATTER
ALL_TO_ALL, BROADCAST, REDUCE = pb.COLL_ALL_TO_ALL, pb.COLL_BROADCAST, pb.COLL_REDUCE
GATHER, SCATTER, BARRIER = pb.COLL_GATHER, pb.COLL_SCATTER, pb.COLL_BARRIER

# Bare words (lower case, without '_'/'-' and the 'base'/'coalesced'/'single' decorations).
_WORDS: dict[str, Comm] = {
    "allreduce": ALL_REDUCE, "allgather": ALL_GATHER, "allgatherintotensor": ALL_GATHER,
    "allgatherv": ALL_GATHER, "reducescatter": REDUCE_SCATTER,
    "reducescattertensor": REDUCE_SCATTER, "reducescatterv": REDUCE_SCATTER,
    "reducescatterblock": REDUCE_SCATTER,
    "alltoall": ALL_TO_ALL, "alltoallv": ALL_TO_ALL, "alltoallsingle": ALL_TO_ALL,
    "broadcast": BROADCAST, "bcast": BROADCAST, "reduce": REDUCE, "gather": GATHER,
    "scatter": SCATTER, "barrier": BARRIER, "monitoredbarrier": BARRIER,
    "send": SEND, "recv": RECV, "recvanysource": RECV, "isend": SEND, "irecv": RECV,
}
_DECORATION = re.compile(r"base|coalesced|single(?=$)|[_-]")

# Prefixes of host ops that issue communication: backend annotations and c10d ops.
BACKEND_PREFIXES = ("nccl:", "gloo:", "rccl:", "mpi:", "ucc:", "xccl:", "fake:")
C10D_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")

# SimAI workload tokens (the format's exact, upper-case spelling).
SIMAI_NAMES: dict[str, int] = {
    "ALLREDUCE": ALL_REDUCE, "ALLGATHER": ALL_GATHER, "REDUCESCATTER": REDUCE_SCATTER,
    "ALLTOALL": ALL_TO_ALL, "BROADCAST": BROADCAST,
}

# Substrings of free text (lower case, no '_' or '-'), most specific first, the way Chakra's
# PyTorch converter matches NCCL kernel names. NCCL runs all-to-all as grouped send/recv,
# so "sendrecv" reads as all-to-all unless the caller says otherwise.
_PATTERNS: tuple[tuple[str, int | None], ...] = (
    ("allreduce", ALL_REDUCE), ("reducescatter", REDUCE_SCATTER), ("allgather", ALL_GATHER),
    ("alltoall", ALL_TO_ALL), ("sendrecv", None), ("broadcast", BROADCAST),
    ("barrier", BARRIER), ("reduce", REDUCE), ("gather", GATHER), ("scatter", SCATTER),
)

_NCCL_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)", re.IGNORECASE)
_KERNEL_WORD = re.compile(r"(allreduce|allgather|reducescatter|alltoall|broadcast|sendrecv|reduce|"
                          r"send|recv|gather|scatter)", re.IGNORECASE)


@lru_cache(maxsize=8192)
def collective_word(word: str) -> Comm | None:
    """One bare word, strictly: ``allreduce``, ``_allgather_base``, ``all_to_all``,
    ``reduce_scatter_tensor_coalesced`` -> a CollectiveType or SEND/RECV; None for words
    that are not communication (``wait``, ``init``, ``startCoalescing``)."""
    return _WORDS.get(_DECORATION.sub("", word.lower().strip().rstrip("_")))


@lru_cache(maxsize=65536)
def is_nccl_kernel(name: str) -> bool:
    """An NCCL (or RCCL) kernel name (``ncclDevKernel_...``, ``void ncclKernel_...``)."""
    return bool(_NCCL_KERNEL.match(name))


def kernel_collective(name: str) -> Comm | None:
    """The communication an NCCL kernel name spells: a CollectiveType, SEND / RECV, the word
    ``"sendrecv"`` (NCCL's grouped point-to-point kernel), or None."""
    body = name.split("(", 1)[0]
    body = body[5:] if body.startswith("void ") else body
    m = _KERNEL_WORD.search(body[4:])  # skip the nccl/rccl prefix
    if m is None:
        return None
    word = m.group(1).lower()
    return "sendrecv" if word == "sendrecv" else collective_word(word)


@lru_cache(maxsize=8192)
def normalize_comm(name: str) -> Comm | None:
    """Any whole name a reader meets -> a CollectiveType, SEND / RECV, or None.

    Backend and c10d prefixes are dropped (anything up to the last ``:``), and so is what
    follows the word (``nccl:send 0->1``); an NCCL kernel gives the word after its library
    prefix (``sendrecv`` there is point-to-point: None here, see :func:`find_collective`).
    Waits, work handles, group init/split/abort and coalescing markers are not
    communication. A name that is no exact spelling is read by its leading collective word
    (``allreduce_into`` -> all-reduce; ``send_object`` -> send)."""
    s = name.strip()
    if not s:
        return None
    if is_nccl_kernel(s) and not s.startswith(BACKEND_PREFIXES):
        c = kernel_collective(s)
        return None if c == "sendrecv" else c
    word = s.split(" ", 1)[0].rsplit(":", 1)[-1]
    w = word.lower().replace("_", "").replace("-", "")
    if not w or "wait" in w or w.startswith("work") or "coalescing" in w or w in ("init", "split", "abort"):
        return None
    exact = collective_word(word.replace("_into_tensor", "intotensor"))
    if exact is not None:
        return exact
    for key, value in (("alltoall", ALL_TO_ALL), ("allgather", ALL_GATHER),
                       ("reducescatter", REDUCE_SCATTER), ("allreduce", ALL_REDUCE),
                       ("broadcast", BROADCAST), ("barrier", BARRIER)):
        if key in w:
            return value
    if w.startswith(("send", "isend")):
        return SEND
    if w.startswith(("recv", "irecv")):
        return RECV
    for key, value in (("gather", GATHER), ("scatter", SCATTER), ("reduce", REDUCE)):
        if w.startswith(key):
            return value
    return None


def normalize_collective(name: str) -> int | None:
    """Any whole name a reader meets -> its CollectiveType; None for point-to-point and for
    names that are not communication."""
    c = normalize_comm(name)
    return c if isinstance(c, int) else None


@lru_cache(maxsize=8192)
def find_collective(text: str, *, sendrecv: int | None = ALL_TO_ALL) -> int | None:
    """The most specific collective word anywhere in ``text`` (a kernel name, a file name,
    a node name of another tool), None when there is none. ``sendrecv``: what the word
    "sendrecv" means (NCCL's all-to-all kernel by default; None where it is P2P)."""
    s = text.lower().replace("_", "").replace("-", "")
    for pattern, coll in _PATTERNS:
        if pattern in s:
            return sendrecv if pattern == "sendrecv" else coll
    return None
