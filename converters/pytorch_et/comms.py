"""Communication calls and process groups as a host ET records them.

A collective shows up as up to three nested host ops: the c10d frontend op
(``c10d::allreduce_``), ``record_param_comms`` (sizes, dtype, group; NCCL, and gloo in some
versions) and the backend op (``nccl:all_reduce``, ``gloo:all_reduce``). What each carries
changed across PyTorch versions:

* ``record_param_comms`` values: ``[input tensors,] seq, pg, rank, coll_name, in_splits,
  out_splits[, world_size | global_rank_start, global_rank_stride, world_size]`` where ``pg``
  is a pointer (1.0.1), the backend id of ``## process_group:init ##`` (1.0.2) or
  ``(pg_name, pg_desc)`` (1.1.0+), and ``rank`` is this rank, the root (broadcast/reduce/...)
  or the peer (send/recv). From 1.1.0 the node also has attrs ``collective_name``, ``dtype``,
  ``in_msg_nelems``, ``out_msg_nelems``, ``pg_name``, ``pg_size``, ``global_rank_*``.
* c10d ops name their arguments in ``op_schema`` (``output_tensors``, ``input_tensors``,
  ``root_rank``, ``dstRank``...), which tells input from output buffers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from echo_et.converters.pytorch_et.schema import PG_INIT_NAME, EtOp, Tensor, collect_tensors
from echo_et.errors import EchoError
from echo_et.ir.collectives import BACKEND_PREFIXES, RECV, SEND, normalize_comm
from echo_et.ir.dtypes import c10_name, dtype_size
from echo_et.ir.schema import pb

_ROOTED = frozenset({pb.COLL_BROADCAST, pb.COLL_REDUCE, pb.COLL_GATHER, pb.COLL_SCATTER})



def classify(name: str) -> int | str | None:
    """CollectiveType for a collective name, SEND/RECV for point-to-point, None otherwise:
    record_param_comms names (``allreduce``, ``all_to_allv``, ``_allgather_base``), c10d op
    names (``c10d::reduce_scatter_tensor_coalesced_``) and backend ops (``nccl:all_reduce``),
    read by the IR's one normaliser (:func:`echo_et.ir.collectives.normalize_comm`)."""
    return normalize_comm(name)


def dtype_of_type(t: str) -> str:
    """c10 dtype name of an ET type (``Tensor(float)``, ``GenericList[Tensor(c10::Half)]``)."""
    m = re.search(r"Tensor\(([^)]*)\)", t)
    if not m:
        return ""
    return c10_name(m.group(1)) or m.group(1)


def tensor_bytes(tensors: tuple[Tensor, ...] | list[Tensor]) -> int:
    return min(sum(max(0, t[3]) * max(0, t[4]) for t in tensors), 1 << 62)


MAX_RANKS = 1 << 20       # more ranks than any job has: a larger number is a corrupt field
_MAX_ELEMS = 1 << 50


def _count(v: Any, limit: int) -> int | None:
    """``v`` if it is an integer in [0, limit), else None."""
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit:
        return v
    return None


@dataclass(slots=True)
class PgDef:
    """One entry of ``## process_group:init ##``."""

    name: str
    desc: str
    ranks: list[int]          # global ranks; empty means all ranks of a group of ``size``
    size: int
    backend_id: int | None = None

    def members(self) -> list[int]:
        return list(self.ranks) if self.ranks else list(range(self.size))


def parse_pg_init(op: EtOp, where: str) -> list[PgDef]:
    """The group definitions of a ``## process_group:init ##`` node ([] if unreadable)."""
    for v in op.in_values:
        if not isinstance(v, str):
            continue
        try:
            entries = json.loads(v)
        except json.JSONDecodeError:
            continue
        if isinstance(entries, dict):
            entries = [entries]
        if not isinstance(entries, list):
            continue
        out = []
        for e in entries:
            if not isinstance(e, dict) or "pg_name" not in e:
                continue
            raw_ranks = e.get("ranks") or []
            ranks = [r for r in raw_ranks if _count(r, MAX_RANKS) is not None] \
                if isinstance(raw_ranks, list) else []
            size = _count(e.get("group_size"), MAX_RANKS + 1) or len(ranks)
            if len(set(ranks)) != len(ranks) or (ranks and size != len(ranks)) or not size:
                raise EchoError(f"{where}: process group {e['pg_name']!r} in "
                                f"{PG_INIT_NAME} has inconsistent ranks/group_size")
            bid = e.get("backend_id")
            out.append(PgDef(str(e["pg_name"]), str(e.get("pg_desc") or ""), ranks, size,
                             bid if isinstance(bid, int) and not isinstance(bid, bool) else None))
        return out
    return []


@dataclass(slots=True)
class CommCall:
    """One collective or point-to-point call, as far as the host trace tells."""

    op_id: int                       # ET id of the node it came from
    kind: int | str                  # CollectiveType value, SEND or RECV
    name: str                        # name as recorded (collective_name / op name)
    in_bytes: int = 0
    out_bytes: int = 0
    dtype: str = ""
    pg_name: str | None = None       # c10d pg name when the trace says
    pg_ref: int | None = None        # pg pointer / backend id of older schemas
    pg_desc: str = ""
    pg_size: int | None = None
    pg_ranks: list[int] | None = None
    rank_field: int | None = None    # this rank / root / peer, by collective kind
    root: int | None = None
    peer: int | None = None
    tag: int = 0
    device: int = -1
    attrs: dict[str, str] = field(default_factory=dict)

    @property
    def is_p2p(self) -> bool:
        return self.kind in (SEND, RECV)


def _device_index(tensors: tuple[Tensor, ...]) -> int:
    for t in tensors:
        m = re.match(r"(?:cuda|hip|xpu|hpu):(\d+)", t[5])
        if m:
            return int(m.group(1))
    return -1


def _first_dtype(types: str) -> str:
    if not types:
        return ""
    try:
        lst = json.loads(types)
    except json.JSONDecodeError:
        return ""
    for t in lst if isinstance(lst, list) else []:
        if isinstance(t, str):
            d = dtype_of_type(t)
            if d:
                return d
    return ""


def _attr_str(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def from_record_param_comms(op: EtOp) -> CommCall | None:
    """The call a ``record_param_comms`` node describes; None for waits and bookkeeping."""
    vals = op.in_values
    try:
        types = json.loads(op.in_types) if op.in_types else []
    except json.JSONDecodeError:
        types = []
    cname_idx = next((i for i, t in enumerate(types) if t == "String" and i < len(vals)
                      and isinstance(vals[i], str)), None)
    name = op.attrs.get("collective_name")
    if not isinstance(name, str) or not name:
        name = vals[cname_idx] if cname_idx is not None else ""
    kind = classify(name)
    if kind is None:
        return None
    call = CommCall(op_id=op.id, kind=kind, name=name)
    for k, v in op.attrs.items():
        call.attrs[k] = _attr_str(v)
    call.attrs.setdefault("collective_name", name)
    if cname_idx is not None:
        i = cname_idx
        if i >= 1 and _count(vals[i - 1], MAX_RANKS) is not None:
            call.rank_field = vals[i - 1]
        pg = vals[i - 2] if i >= 2 else None
        if isinstance(pg, list) and pg and isinstance(pg[0], str):
            call.pg_name = pg[0]
            if len(pg) > 1 and isinstance(pg[1], str):
                call.pg_desc = pg[1]
        elif isinstance(pg, int) and not isinstance(pg, bool):
            call.pg_ref = pg
        tail = vals[i + 1:]
        splits = [x for x in tail[:2] if isinstance(x, list)]
        if len(splits) == 2:
            call.attrs.setdefault("in_split_size", json.dumps(splits[0]))
            call.attrs.setdefault("out_split_size", json.dumps(splits[1]))
        nums = [x for x in tail[2:] if isinstance(x, int) and not isinstance(x, bool)]
        if len(nums) == 3:
            call.attrs.setdefault("global_rank_start", str(nums[0]))
            call.attrs.setdefault("global_rank_stride", str(nums[1]))
            call.pg_size = _count(nums[2], MAX_RANKS + 1) or None
        elif len(nums) == 1:
            call.pg_size = _count(nums[0], MAX_RANKS + 1) or None
        elif splits and splits[0] and len(splits[0]) <= MAX_RANKS:
            call.pg_size = len(splits[0])      # all_to_allv splits have one entry per member
    a = op.attrs
    if isinstance(a.get("pg_name"), str) and a["pg_name"]:
        call.pg_name = a["pg_name"]
    if isinstance(a.get("pg_desc"), str) and a["pg_desc"]:
        call.pg_desc = a["pg_desc"]
    if _count(a.get("pg_size"), MAX_RANKS + 1):
        call.pg_size = a["pg_size"]
    if call.pg_size and "global_rank_start" in call.attrs and "global_rank_stride" in call.attrs:
        try:
            start = int(call.attrs["global_rank_start"])
            stride = int(call.attrs["global_rank_stride"])
        except ValueError:
            start, stride = -1, 0
        if start >= 0 and stride > 0 and start + stride * (call.pg_size - 1) < MAX_RANKS:
            call.pg_ranks = [start + k * stride for k in range(call.pg_size)]
    dtype = a.get("dtype") if isinstance(a.get("dtype"), str) else ""
    call.dtype = dtype or _first_dtype(op.in_types)
    size = dtype_size(call.dtype) or 0
    n_in = _count(a.get("in_msg_nelems"), _MAX_ELEMS)
    n_out = _count(a.get("out_msg_nelems"), _MAX_ELEMS)
    if size and n_in is not None and n_out is not None:
        call.in_bytes = n_in * size
        call.out_bytes = n_out * size
    else:
        call.in_bytes = tensor_bytes(op.in_tensors)
        call.out_bytes = tensor_bytes(op.out_tensors) if op.out_tensors else call.in_bytes
    call.device = _device_index(op.in_tensors or op.out_tensors)
    _set_role_fields(call)
    return call


def _set_role_fields(call: CommCall) -> None:
    if call.rank_field is None:
        return
    if call.kind in _ROOTED:
        call.root = call.rank_field
    elif call.is_p2p:
        call.peer = call.rank_field


_SCHEMA_ARGS = re.compile(r"^[^(]*\((.*)\)\s*(?:->.*)?$", re.S)


def _schema_arg_names(op_schema: str) -> list[str]:
    """Argument names of an operator schema string, in order."""
    m = _SCHEMA_ARGS.match(op_schema)
    if not m:
        return []
    args, depth, cur = [], 0, []
    for ch in m.group(1):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        args.append("".join(cur))
    names = []
    for a in args:
        a = a.split("=", 1)[0].strip()
        names.append(a.rsplit(" ", 1)[-1] if a and a != "*" else "")
    return names


# c10d ops whose first argument is the output (when op_schema is missing).
_OUTPUT_FIRST = ("allgather", "reducescatter", "alltoall", "gather", "scatter")
# Position of root / peer / tag arguments when op_schema is missing.
_ROOT_ARG = {pb.COLL_BROADCAST: 2, pb.COLL_REDUCE: 3, pb.COLL_GATHER: 3, pb.COLL_SCATTER: 3}


def from_c10d_op(op: EtOp) -> CommCall | None:
    """The call a ``c10d::*`` (or backend ``nccl:*``/``gloo:*``) op stands for."""
    kind = classify(op.name)
    if kind is None:
        return None
    call = CommCall(op_id=op.id, kind=kind, name=op.name)
    vals = op.in_values
    try:
        types = json.loads(op.in_types) if op.in_types else []
    except json.JSONDecodeError:
        types = []
    names = _schema_arg_names(op.op_schema) if op.op_schema else []
    ins: list[Tensor] = []
    outs: list[Tensor] = []
    if op.name.startswith(BACKEND_PREFIXES) or not names:
        base = op.name.rsplit(":", 1)[-1].lower().replace("_", "")
        output_first = op.name.startswith("c10d::") and base.startswith(_OUTPUT_FIRST)
        per_arg = [_arg_tensors(v, t) for v, t in zip(vals, types, strict=False)]
        tensor_args = [ts for ts in per_arg if ts]
        if output_first and len(tensor_args) >= 2:
            outs, ins = tensor_args[0], tensor_args[1]
        elif tensor_args:
            ins = tensor_args[0]
        root_idx = _ROOT_ARG.get(kind) if isinstance(kind, int) else (2 if call.is_p2p else None)
        if op.name.startswith("c10d::") and root_idx is not None and root_idx < len(vals):
            _set_rank_arg(call, vals[root_idx])
    else:
        for i, arg in enumerate(names):
            if i >= len(vals):
                break
            t = types[i] if i < len(types) else ""
            ts = _arg_tensors(vals[i], t)
            low = arg.lower()
            if ts:
                (outs if low.startswith("output") else ins).extend(ts)
            elif low in ("root_rank", "rootrank", "root", "dstrank", "srcrank", "dst", "src",
                         "dst_rank", "src_rank"):
                _set_rank_arg(call, vals[i])
            elif low == "tag" and _count(vals[i], 1 << 62) is not None:
                call.tag = vals[i]
    call.in_bytes = tensor_bytes(ins)
    call.out_bytes = tensor_bytes(outs) if outs else call.in_bytes
    if kind == pb.COLL_BARRIER:
        call.in_bytes = call.out_bytes = 0
    dts = [dtype_of_type(t) for t in types if isinstance(t, str) and "Tensor" in t]
    call.dtype = next((d for d in dts if d), "")
    call.device = _device_index(tuple(ins or outs))
    call.attrs["collective_name"] = op.name
    return call


def _set_rank_arg(call: CommCall, v: Any) -> None:
    if _count(v, MAX_RANKS) is not None:
        call.rank_field = v
        _set_role_fields(call)


def _arg_tensors(v: Any, t: Any) -> list[Tensor]:
    if not isinstance(t, str) or "Tensor" not in t:
        return []
    out: list[Tensor] = []
    collect_tensors(v, out)
    return out


def is_comm_candidate(op: EtOp) -> str:
    """'rpc', 'c10d', 'backend' or '' for what kind of communication node ``op`` is."""
    if op.name == "record_param_comms":
        return "rpc"
    if op.name.startswith("c10d::"):
        return "c10d"
    if op.name.startswith(BACKEND_PREFIXES):
        return "backend"
    return ""


__all__ = [
    "BACKEND_PREFIXES", "PG_INIT_NAME", "RECV", "SEND", "CommCall", "PgDef",
    "classify", "dtype_of_type", "from_c10d_op", "from_record_param_comms", "is_comm_candidate",
    "parse_pg_init", "tensor_bytes",
]
