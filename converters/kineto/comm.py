"""What a communication event is: collective type, bytes, dtype, group, peer.

Sources, most trusted first (each fills only what the earlier ones left empty):
  1. the kernel's own args (recent Kineto copies ``record_param_comms`` metadata onto the
     NCCL kernel: ``Collective name``, ``In/Out msg nelems``, ``dtype``, ``Process Group
     Name/Ranks/Description``, ``Group size``);
  2. the enclosing ``record_param_comms`` host op's args (same keys);
  3. the enclosing ``nccl:*`` / ``gloo:*`` annotation (type from its name, the input tensor
     from its ``Input Dims``/``Input type``);
  4. the enclosing ``c10d::*`` / ``_c10d_functional::*`` op (type from its name, input and
     output tensors from its ``Input Dims``);
  5. the NCCL kernel name (``ncclKernel_AllReduce_RING_LL_Sum_float``,
     ``ncclDevKernel_AllGather_RING_LL``, ``ncclAllReduceRingLLKernel_sum_f32``): type,
     algorithm and dtype, but no size.
So a ``SendRecv`` kernel issued by an all-to-all op is an all-to-all, and a kernel whose
host op names a reduce-scatter is a reduce-scatter whatever kernel NCCL chose.

Bytes follow Chakra/ASTRA-sim: ``in_bytes`` is what one rank contributes (all-gather: its
shard; reduce-scatter: the full buffer), ``out_bytes`` what it receives.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Any

from echo_et.ir.collectives import (
    BACKEND_PREFIXES,
    C10D_PREFIXES,
    collective_word,
    is_nccl_kernel,
    kernel_collective,
    normalize_comm,
)
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.schema import pb

from .events import Ev

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = pb.COLL_ALL_REDUCE, pb.COLL_ALL_GATHER, pb.COLL_REDUCE_SCATTER
ALL_TO_ALL, BROADCAST, REDUCE = pb.COLL_ALL_TO_ALL, pb.COLL_BROADCAST, pb.COLL_REDUCE
GATHER, SCATTER, BARRIER = pb.COLL_GATHER, pb.COLL_SCATTER, pb.COLL_BARRIER
SEND, RECV = "send", "recv"



def elem_size(dtype: str | None) -> int | None:
    """Bytes per element of a dtype as Kineto and c10d print it (see :mod:`echo_et.ir.dtypes`)."""
    return dtype_size(dtype)


# -- host ops that issue communication -------------------------------------------------------
# c10d ops whose first input is the output tensor(s) and second the input tensor(s).
_OUTPUT_FIRST = frozenset({
    "alltoall_base", "allgather_base", "reduce_scatter_base", "allgather", "reduce_scatter",
    "alltoall", "gather", "scatter", "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor_coalesced", "allgather_coalesced",
})


def op_collective(name: str) -> int | str | None:
    """The collective a host op or annotation stands for, from its name alone: only backend
    annotations (``nccl:all_reduce``) and c10d ops issue communication."""
    if name.startswith(BACKEND_PREFIXES) or name.startswith(C10D_PREFIXES):
        return normalize_comm(name)
    return None


def is_comm_op(ev: Ev) -> bool:
    """A host op that issues communication (record_param_comms, nccl:/gloo: annotations,
    c10d ops); ``record_param_comms`` counts only when it names a real collective."""
    name = ev.name
    if name == "record_param_comms":
        cn = ev.arg("Collective name")
        return isinstance(cn, str) and collective_word(cn) is not None
    return op_collective(name) is not None


# -- NCCL and other communication kernels ----------------------------------------------------
_KERNEL_ALGO = re.compile(r"(?:^|_)(ring|tree|collnetdirect|collnetchain|collnet|nvlstree|"
                          r"nvls|pat)(?=_|$)", re.IGNORECASE)
_KERNEL_PROTO = re.compile(r"(?:^|_)(ll128|ll|simple)(?=_|$)", re.IGNORECASE)
_KERNEL_DTYPE = re.compile(
    r"_(float|double|half|bfloat16|int8_t|uint8_t|int32_t|uint32_t|int64_t|uint64_t|"
    r"f32|f64|f16|bf16|i8|u8|i32|u32|i64|u64|fp8_e4m3|fp8_e5m2|f8e4m3|f8e5m2)(?=_|$)",
    re.IGNORECASE)
_OLD_NCCL = re.compile(r"^nccl([A-Za-z]+?)(ring|tree|collnet)?(ll128|ll|simple)?kernel",
                       re.IGNORECASE)
# Kernels of other communication libraries (or hand-written collectives): communication
# of unknown cost model, never compute.
_OTHER_COMM = re.compile(
    r"(?:^|[^a-z])(gloo|mscclpp|msccl|nvshmem|cutlass_comm|deep_?ep|userbuffers|uccl|hccl|"
    r"oneccl|cross_device_reduce|multimem|symm_mem|one_shot_all_reduce|two_shot_all_reduce)"
    r"|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv",
    re.IGNORECASE)


@lru_cache(maxsize=65536)
def is_other_comm_kernel(name: str) -> bool:
    return not is_nccl_kernel(name) and bool(_OTHER_COMM.search(name.split("(", 1)[0]))


@dataclass
class KernelName:
    coll: int | str | None      # CollectiveType, "send"/"recv"/"sendrecv", or None
    algorithm: str = ""
    dtype: str = ""


def parse_nccl_kernel(name: str) -> KernelName:
    body = name.split("(", 1)[0]
    if body.startswith("void "):
        body = body[5:]
    coll = kernel_collective(body)
    algo = ""
    am = _KERNEL_ALGO.search(body)
    pm = _KERNEL_PROTO.search(body)
    if am is None:
        old = _OLD_NCCL.match(body)
        if old and old.group(2):
            algo = old.group(2).lower() + ("_" + old.group(3).lower() if old.group(3) else "")
    else:
        algo = am.group(1).lower() + ("_" + pm.group(1).lower() if pm else "")
    dm = _KERNEL_DTYPE.search(body)
    return KernelName(coll, algo, dm.group(1).lower() if dm else "")


# -- assembled information -------------------------------------------------------------------
@dataclass
class CommInfo:
    """Everything known about one communication, merged from its sources."""

    coll: int | str | None = None           # CollectiveType, "send", "recv", None
    in_bytes: int | None = None
    out_bytes: int | None = None
    in_elems: int | None = None             # element counts seen where the dtype was not
    out_elems: int | None = None
    dtype: str = ""
    pg_name: str = ""
    pg_desc: str = ""
    pg_ranks: list[int] | None = None
    group_size: int | None = None
    rank_start: int | None = None
    rank_stride: int | None = None
    peer: int | None = None                 # group rank of the P2P peer
    root: int | None = None
    algorithm: str = ""
    sources: list[str] = field(default_factory=list)
    kernel_coll: int | str | None = None     # what the kernel name alone says
    # All-to-all split sizes per peer in group-rank order, in the caller's units (rows of
    # dim 0 for all_to_all_single, elements for a tensor list); None when not recorded.
    in_splits: list[int] | None = None
    out_splits: list[int] | None = None
    splits_truncated: bool = False          # Kineto cut a long list short ("[1, 2, ...]")

    def note(self, source: str) -> None:
        if source not in self.sources:
            self.sources.append(source)


def _as_int(v: Any) -> int | None:
    if type(v) is int:
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _parse_rank_list(v: Any) -> list[int] | None:
    """``"[0, 1, 2]"`` -> [0, 1, 2]; truncated lists (``"[0, 1, ...]"``) -> None."""
    if isinstance(v, list):
        out = [_as_int(x) for x in v]
        return None if any(x is None for x in out) else out  # type: ignore[return-value]
    if not isinstance(v, str) or "..." in v:
        return None
    try:
        parsed = json.loads(v)
    except ValueError:
        return None
    return _parse_rank_list(parsed) if isinstance(parsed, list) else None


def merge_meta(info: CommInfo, args: dict[str, Any] | None, source: str) -> None:
    """Fill ``info`` from record_param_comms-style args (kernel or host op)."""
    if not args:
        return
    cn = args.get("Collective name")
    used = False
    if isinstance(cn, str):
        c = collective_word(cn)
        if c is not None and info.coll is None:
            info.coll = c
            used = True
    dtype = args.get("dtype")
    es = elem_size(dtype) if isinstance(dtype, str) else None
    if isinstance(dtype, str) and dtype and not info.dtype:
        info.dtype = dtype
    nin, nout = _as_int(args.get("In msg nelems")), _as_int(args.get("Out msg nelems"))
    if es is not None and nin is not None and info.in_bytes is None:
        info.in_bytes = nin * es
        info.out_bytes = (nout if nout is not None else nin) * es
        used = True
    name = args.get("Process Group Name")
    if isinstance(name, str) and name and not info.pg_name:
        info.pg_name = name
        used = True
    desc = args.get("Process Group Description")
    if isinstance(desc, str) and desc and not info.pg_desc:
        info.pg_desc = desc
    if info.pg_ranks is None:
        info.pg_ranks = _parse_rank_list(args.get("Process Group Ranks"))
    gs = _as_int(args.get("Group size"))
    if gs and info.group_size is None:
        info.group_size = gs
    if info.rank_start is None:
        info.rank_start = _as_int(args.get("Global rank start"))
        info.rank_stride = _as_int(args.get("Global rank stride"))
    if info.peer is None:
        for key in ("Dst Rank", "Src Rank"):
            p = _as_int(args.get(key))
            if p is not None and p >= 0:
                info.peer = p
                break
    _merge_splits(info, args.get("In split size"), args.get("Out split size"))
    if used:
        info.note(source)


def _merge_splits(info: CommInfo, ins: Any, outs: Any) -> None:
    """Record per-peer split sizes (lists like ``"[1, 3]"``); empty lists mean even splits."""
    for value, attr in ((ins, "in_splits"), (outs, "out_splits")):
        if getattr(info, attr) is not None or value is None:
            continue
        if isinstance(value, str) and "..." in value:
            info.splits_truncated = True
            continue
        parsed = _parse_rank_list(value)
        if parsed and all(x >= 0 for x in parsed):
            setattr(info, attr, parsed)


def _nelems(dims: Any, typ: Any) -> int | None:
    """Elements of one recorded input: a shape, or a list of shapes (TensorList)."""
    if not isinstance(dims, list):
        return None
    if typ == "TensorList" or (dims and all(isinstance(d, list) for d in dims)):
        if not dims:
            return None  # an unrecorded TensorList
        parts = [_nelems(d, "Tensor") for d in dims]
        return None if any(p is None for p in parts) else sum(parts)  # type: ignore[arg-type]
    if not all(isinstance(d, int) for d in dims):
        return None
    if not typ or typ in ("Scalar", "ScalarList", "GenericList", ""):
        return None
    return prod(dims) if dims else 1


def _first_dtype(typ: Any) -> str:
    return typ if isinstance(typ, str) and typ not in ("TensorList", "Scalar", "") else ""


def merge_annotation(info: CommInfo, ev: Ev) -> None:
    """A ``nccl:*``/``gloo:*`` annotation: type from the name, the input from its dims."""
    c = op_collective(ev.name)
    if c is None:
        return
    if info.coll is None:
        info.coll = c
    dims, types = ev.arg("Input Dims"), ev.arg("Input type")
    if info.in_bytes is None and isinstance(dims, list) and dims and isinstance(types, list):
        n = _nelems(dims[0], types[0] if types else "")
        dt = types[0] if types else ""
        if isinstance(dt, list):
            dt = dt[0] if dt else ""
        es = elem_size(_first_dtype(dt))
        if n is not None and es is not None:
            info.in_bytes = n * es
            info.dtype = info.dtype or dt
    if info.peer is None and c in (SEND, RECV):
        m = re.search(r"(\d+)\s*(->|<-)\s*(\d+)", ev.name)
        if m:
            info.peer = int(m.group(3))
    info.note("annotation")


def merge_c10d(info: CommInfo, ev: Ev) -> None:
    """A ``c10d::*`` op: type from the name; input/output tensors from its dims."""
    c = op_collective(ev.name)
    if c is None:
        return
    if info.coll is None:
        info.coll = c
    word = ev.name.split("::", 1)[1].strip("_")
    dims, types = ev.arg("Input Dims"), ev.arg("Input type")
    if isinstance(dims, list) and isinstance(types, list) and dims:
        def size(i: int) -> tuple[int | None, str]:
            if i >= len(dims):
                return None, ""
            typ = types[i] if i < len(types) else ""
            n = _nelems(dims[i], typ)
            dt = _first_dtype(typ)
            return n, dt

        if word in _OUTPUT_FIRST:
            (n_out, dt_out), (n_in, dt_in) = size(0), size(1)
        else:
            (n_in, dt_in), (n_out, dt_out) = size(0), (None, "")
        dt = dt_in or dt_out or info.dtype
        es = elem_size(dt)
        if es is not None:
            if info.in_bytes is None and n_in is not None:
                info.in_bytes = n_in * es
                info.dtype = info.dtype or dt
            if info.out_bytes is None and n_out is not None:
                info.out_bytes = n_out * es
        else:  # a TensorList records shapes but no dtype
            if info.in_elems is None:
                info.in_elems = n_in
            if info.out_elems is None:
                info.out_elems = n_out
    concrete = ev.arg("Concrete Inputs")
    if info.peer is None and c in (SEND, RECV) and isinstance(concrete, list) \
            and len(concrete) > 2:
        info.peer = _as_int(concrete[2])
    if c == ALL_TO_ALL:
        _c10d_splits(info, word, concrete, dims, types)
    info.note("c10d_op")


# c10d all-to-all ops whose split sizes are concrete inputs: op word -> (output splits,
# input splits) argument positions. ``alltoall_base_(output, input, pg, output_split_sizes,
# input_split_sizes, ...)``; ``all_to_all_single(input, output_split_sizes,
# input_split_sizes, group_name)``.
_SPLIT_ARGS = {"alltoall_base": (3, 4), "all_to_all_single": (1, 2)}


def _c10d_splits(info: CommInfo, word: str, concrete: Any, dims: Any, types: Any) -> None:
    pos = _SPLIT_ARGS.get(word)
    if pos is not None:
        if isinstance(concrete, list) and len(concrete) > max(pos):
            _merge_splits(info, concrete[pos[1]], concrete[pos[0]])
        return
    if word == "alltoall" and isinstance(dims, list) and len(dims) > 1:
        # alltoall_(output_tensors, input_tensors, ...): one tensor per peer.
        def per_peer(shapes: Any) -> list[int] | None:
            if not isinstance(shapes, list) or not shapes \
                    or not all(isinstance(x, list) for x in shapes):
                return None
            sizes = [_nelems(x, "Tensor") for x in shapes]
            return None if any(x is None for x in sizes) else sizes  # type: ignore[return-value]

        if info.in_splits is None:
            info.in_splits = per_peer(dims[1])
        if info.out_splits is None:
            info.out_splits = per_peer(dims[0])


def merge_kernel_name(info: CommInfo, name: str) -> None:
    k = parse_nccl_kernel(name)
    info.kernel_coll = k.coll
    if info.coll is None and k.coll is not None:
        info.coll = k.coll
        info.note("kernel_name")
    if not info.algorithm:
        info.algorithm = k.algorithm
    if not info.dtype and k.dtype:
        info.dtype = k.dtype


def finish_sizes(info: CommInfo, group_size: int) -> str:
    """Fill missing bytes from element counts, the type and the group size. Returns "" when
    the sizes come from the trace, else what was guessed: "collective_dtype_guessed" (shapes
    known, dtype not: 4-byte elements assumed) or "collective_size_unknown" (0 bytes)."""
    status = ""
    if info.in_bytes is None and info.in_elems is not None:
        es = elem_size(info.dtype)
        if es is None:
            es = 4
            status = "collective_dtype_guessed"
        info.in_bytes = info.in_elems * es
        if info.out_bytes is None and info.out_elems is not None:
            info.out_bytes = info.out_elems * es
    if info.in_bytes is None:
        info.in_bytes = 0
        info.out_bytes = 0
        return "collective_size_unknown"
    if info.out_bytes is None:
        n = info.in_bytes
        gs = max(group_size, 1)
        if info.coll == ALL_GATHER or info.coll == GATHER:
            info.out_bytes = n * gs
        elif info.coll == REDUCE_SCATTER or info.coll == SCATTER:
            info.out_bytes = n // gs
        else:
            info.out_bytes = n
    return status


def split_bytes(splits: list[int] | None, total_bytes: int | None, group_size: int) -> tuple[list[int] | None, str]:
    """Per-peer bytes of an all-to-all from its split sizes: the buffer of ``total_bytes``
    cut in proportion to the splits (rows of dim 0 all have the same size). Returns
    (bytes per peer, "") or (None, why not): "" when there are no splits,
    ``all_to_all_splits_inconsistent`` when they do not fit the group or the buffer."""
    if splits is None:
        return None, ""
    total = sum(splits)
    if len(splits) != group_size or total_bytes is None:
        return None, "all_to_all_splits_inconsistent"
    if total == 0:
        return ([0] * group_size, "") if total_bytes == 0 else (None, "all_to_all_splits_inconsistent")
    if total_bytes % total:
        return None, "all_to_all_splits_inconsistent"
    unit = total_bytes // total
    return [x * unit for x in splits], ""
