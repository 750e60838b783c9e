"""Loading one host execution trace file into normalised ops, groups and communication calls."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from echo_et.converters.jsonstream import read_document, read_head
from echo_et.converters.pytorch_et import comms
from echo_et.converters.pytorch_et.comms import CommCall, PgDef
from echo_et.converters.pytorch_et.schema import PG_INIT_NAME, EtOp, NodeStruct, parse_node, parse_struct
from echo_et.errors import EchoError

NODES_KEY = "nodes"                  # the top-level array that holds the ops
KIND = "PyTorch host execution trace"  # what the file should be, in error messages
_SCHEMA_KEY = re.compile(r'"schema"\s*:')
_NODES_KEY = re.compile(r'"nodes"\s*:\s*\[')
_NODE_KEYS = re.compile(r'"(?:ctrl_deps|parent|rf_id)"\s*:')
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
# Rank in a file name: "rank3", "rank-3", "worker3", or a trailing "_3.json" / ".3.json"
# (but not the last part of a version number such as "chakra.0.0.4.json").
_RANK_PATTERNS = (
    re.compile(r"rank[-_.]?(\d+)", re.I),
    re.compile(r"worker[-_.]?(\d+)", re.I),
    re.compile(r"(?:[-_]|(?<![0-9])\.)(\d+)(?:\.pt\.trace)?\.json(?:\.gz)?$", re.I),
)


def rank_from_name(name: str) -> int | None:
    for pat in _RANK_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


@dataclass
class HostTrace:
    """One rank's host ET: ops sorted by id plus what they say about communication."""

    path: Path
    schema: str = ""
    pid: int | None = None
    ops: list[EtOp] = field(default_factory=list)
    pg_defs: list[PgDef] = field(default_factory=list)
    comms: dict[int, CommCall] = field(default_factory=dict)   # anchor op id -> call
    gpu_ops: int = 0
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # step -> (first id, last id)
    parent_after_child: int = 0

    @property
    def name_rank(self) -> int | None:
        return rank_from_name(self.path.name)

    def comm_rank(self) -> int | None:
        """This rank as its own collectives on the default group state it (None if they don't).

        ``record_param_comms`` records the caller's rank in the group (the root or the peer for
        rooted and point-to-point calls, which are skipped). A trace without group names
        (schema 1.0.1) counts when all its calls use one group.
        """
        default = {p.backend_id for p in self.pg_defs if p.name == "0" and p.backend_id is not None}
        refs = {c.pg_ref for c in self.comms.values()}
        single_unnamed = not self.pg_defs and len(refs) == 1 and None not in refs
        for c in self.comms.values():
            if c.rank_field is None or c.is_p2p or c.root is not None:
                continue
            if c.pg_name == "0" or (c.pg_ref is not None and c.pg_ref in default) \
                    or (c.pg_name is None and single_unnamed):
                return c.rank_field
        return None


def looks_like_host_et(path: Path) -> bool:
    """A JSON object with a top-level ``schema`` and a ``nodes`` array (gzipped or not)."""
    if not path.is_file():
        return False
    head = read_head(path, 1 << 16)
    if not head.lstrip().startswith("{"):
        return False
    nodes = _NODES_KEY.search(head)
    if nodes is None:
        return False
    return bool(_SCHEMA_KEY.search(head)) or bool(_NODE_KEYS.search(head, nodes.end()))


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files as given; a folder stands for the host traces in it (other files are ignored, so
    one folder can hold a run's Kineto and host traces side by side)."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise EchoError(f"{p}: no such file or directory")
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if not q.name.startswith(".")
                           and looks_like_host_et(q))
            if not found:
                raise EchoError(f"{p}: folder has no host execution trace")
            files.extend(found)
        else:
            files.append(p)
    if not files:
        raise EchoError("no host execution trace given")
    return files


# Errors that malformed field values (a list where an id belongs, ...) raise in the analysis.
MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError)


def load(path: Path) -> HostTrace:
    """Parse ``path`` (streaming) into a HostTrace; EchoError on anything malformed."""
    try:
        return _load(path)
    except MALFORMED as e:
        raise EchoError(f"{path}: malformed host execution trace ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:120] if str(e) else ''})") from None


def _load(path: Path) -> HostTrace:
    where = str(path)
    t = HostTrace(path=path)
    ops: list[EtOp] = []
    ids: set[int] = set()
    gpu_ops = 0

    def on_node(value: Any) -> None:
        nonlocal gpu_ops
        op = parse_struct(value, where) if type(value) is NodeStruct else parse_node(value, where)
        if op.id in ids:
            raise EchoError(f"{where}: node id {op.id} appears twice")
        ids.add(op.id)
        if op.gpu:
            gpu_ops += 1
        else:
            ops.append(op)

    fields = read_document(path, on_node, NODES_KEY, kind=KIND, element_type=NodeStruct)
    t.gpu_ops = gpu_ops
    seen_schema = "schema" in fields
    if seen_schema:
        t.schema = str(fields["schema"])
    if isinstance(fields.get("pid"), int):
        t.pid = fields["pid"]
    if not seen_schema:
        raise EchoError(f"{where}: no top-level 'schema'; not a PyTorch host execution trace")
    if not ops:
        raise EchoError(f"{where}: host execution trace has no nodes")
    ops.sort(key=attrgetter("id"))
    t.ops = ops
    for op in ops:
        if op.name == PG_INIT_NAME:
            t.pg_defs.extend(comms.parse_pg_init(op, where))
    _find_comms(t)
    _find_steps(t)
    return t


def _find_comms(t: HostTrace) -> None:
    """Pick one anchor per communication call: record_param_comms when present, else the c10d
    op, else (only in traces with neither) the backend op."""
    # The ops that can anchor a call, found by name once (a trace has a few hundred names).
    names = {op.name for op in t.ops}
    wanted = {n for n in names if n == "record_param_comms" or n.startswith("c10d::")
              or n.startswith(comms.BACKEND_PREFIXES)}
    cands = [op for op in t.ops if op.name in wanted] if wanted else []
    if not cands:
        return
    by_id = {op.id: op for op in t.ops}
    rpc_calls: dict[int, CommCall] = {}
    for op in cands:
        if op.name == "record_param_comms":
            c = comms.from_record_param_comms(op)
            if c is not None:
                rpc_calls[op.id] = c
    covered: set[int] = set()     # c10d ops whose call record_param_comms describes
    for oid in rpc_calls:
        p = by_id[oid].parent
        hops = 0
        while p in by_id and p != by_id[p].parent and hops < 64:
            if by_id[p].name.startswith("c10d::"):
                covered.add(p)
                break
            p = by_id[p].parent
            hops += 1
    # Each c10d op is a call of its own, even nested in another: with async ops the ET's
    # parent stack keeps e.g. c10d::send open, and the following c10d::recv_ lands inside it.
    c10d_calls: dict[int, CommCall] = {}
    for op in cands:
        if op.name.startswith("c10d::") and op.id not in covered:
            c = comms.from_c10d_op(op)
            if c is not None and not _has_anchor_ancestor(op, by_id, {}, rpc_calls):
                c10d_calls[op.id] = c
    t.comms = {**rpc_calls, **c10d_calls}
    if not t.comms:
        for op in cands:
            if op.name.startswith(comms.BACKEND_PREFIXES):
                c = comms.from_c10d_op(op)
                if c is not None and not _has_anchor_ancestor(op, by_id, t.comms, {}):
                    t.comms[op.id] = c
    t.comms = dict(sorted(t.comms.items()))
    defs = {p.backend_id: p for p in t.pg_defs if p.backend_id is not None}
    for c in t.comms.values():
        if c.pg_name is None and c.pg_ref is not None and c.pg_ref in defs:
            c.pg_name = defs[c.pg_ref].name


def _has_anchor_ancestor(op: EtOp, by_id, a: dict, b: dict) -> bool:
    p = op.parent
    hops = 0
    while p in by_id and hops < 64:
        if p in a or p in b:
            return True
        if by_id[p].parent == p:
            break
        p = by_id[p].parent
        hops += 1
    return False


def _find_steps(t: HostTrace) -> None:
    step_of: dict[int, int] = {}
    starts: dict[int, int] = {}
    last: dict[int, int] = {}
    step_names = {}
    for name in {op.name for op in t.ops}:
        m = _STEP.match(name)
        if m:
            step_names[name] = int(m.group(1))
    for op in t.ops:
        n = step_names.get(op.name)
        if n is not None:
            starts[n] = op.id
            step_of[op.id] = n
            last[n] = op.id
            continue
        s = step_of.get(op.parent)
        if s is not None:
            step_of[op.id] = s
            last[s] = max(last[s], op.id)
    order = sorted(starts, key=lambda n: starts[n])
    for i, n in enumerate(order):
        end = starts[order[i + 1]] - 1 if i + 1 < len(order) else last[n]
        t.steps[n] = (starts[n], end)
