"""What the ASTRA-sim check needs to know of one node message besides its id and data_deps:
its type, its collective or send/recv, and the problems found in it alone (the per-node
rules; those that need a whole file or job are :mod:`.check`'s). The facts are decoded once
per distinct message and cached, because a rank file repeats most node messages but for id
and data_deps (every micro-batch, every rank of a stage)."""

from __future__ import annotations

from dataclasses import dataclass

from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf.message import DecodeError

from echo_et.converters.chakra.attrs import STANDARD_FIELD

from .mapping import CHAKRA_TYPE_NAMES, SUPPORTED_COMM_TYPES
from .wire_scan import pack_varints, plain_fields, split_node, unpack_varints

ALLOWED_TYPES = {
    et.COMP_NODE: "COMP_NODE",
    et.COMM_COLL_NODE: "COMM_COLL_NODE",
    et.COMM_SEND_NODE: "COMM_SEND_NODE",
    et.COMM_RECV_NODE: "COMM_RECV_NODE",
}
# The legacy feeder reads exactly these members (chakra-astrasim.md section 1.10).
ATTR_TYPES = {
    **{k: STANDARD_FIELD[k] for k in ("is_cpu_op", "comm_type", "comm_size", "comm_src", "comm_dst",
                                      "comm_tag", "comm_priority", "pg_name", "num_ops", "tensor_size")},
    "involved_dim": "bool_list",
}
WORLD = "0"   # the group key of the implicit world: public, the cross-rank rules key by it too

CACHED_FACTS = 16_384     # node facts kept (a few hundred distinct ones in an export's files)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the checks need from one node message besides its id and data_deps, the same for
    every message that differs from it only there (rank files that share a graph, and the
    micro-batches of one graph, repeat most node messages that way). Public: the rank scan
    reads them to note a node's problems, collective and send/recv."""

    name: str
    type: int
    issues: tuple[tuple[str, str], ...]          # (rule, message) found in the node alone
    coll: tuple[int, int, str] | None = None     # comm_type, comm_size, group key
    p2p: tuple[bool, int | None, int | None, int | None, int] | None = None  # send?, src, dst, tag, size


def _int_attr(attrs: dict, name: str) -> int | None:
    v = attrs.get(name)
    if v is None or v[0] not in ("int64_val", "int32_val", "uint64_val", "uint32_val"):
        return None
    return int(v[1])


def _facts(n: et.Node, splits: int | None, roofline: bool = False) -> Facts:
    """Facts of one decoded node message."""
    issues: list[tuple[str, str]] = []
    if n.ctrl_deps:
        issues.append(("ctrl-deps-empty", f"ctrl_deps {list(n.ctrl_deps)[:5]} (put ordering in data_deps)"))
    base = {"name": n.name, "type": n.type}
    if n.type not in ALLOWED_TYPES:
        name = et.NodeType.Name(n.type) if n.type in et.NodeType.values() else str(n.type)
        issues.append(("node-type", f"node type {name} is not one ASTRA-sim runs (use COMP, "
                       "COMM_COLL, COMM_SEND or COMM_RECV)"))
        return Facts(**base, issues=tuple(issues))
    attrs: dict[str, tuple[str, object]] = {}
    for a in n.attr:
        kind = a.WhichOneof("value") or ""
        if a.name in attrs and a.name in ATTR_TYPES:
            issues.append(("attr-type", f"attribute {a.name} appears more than once"))
        attrs[a.name] = (kind, getattr(a, kind) if kind else None)
        want = ATTR_TYPES.get(a.name)
        if want is not None and kind != want:
            issues.append(("attr-type", f"attribute {a.name} is {kind or 'unset'}, ASTRA-sim reads {want}"))
    cpu = attrs.get("is_cpu_op")
    on_cpu = cpu is not None and cpu[0] == "bool_val" and bool(cpu[1])
    if cpu is None:
        issues.append(("is-cpu-op", "is_cpu_op is missing (older readers default it to true)"))
    elif on_cpu and n.type != et.COMP_NODE:
        issues.append(("is-cpu-op", "is_cpu_op is true on a communication node (ASTRA-sim throws "
                       "\"Comm node should not be on CPU\")"))
    if n.type == et.COMP_NODE:
        if roofline and not on_cpu and not (_int_attr(attrs, "num_ops") and _int_attr(attrs, "tensor_size")):
            issues.append(("comp-duration", "GPU COMP node without num_ops and tensor_size while "
                           "roofline-enabled is on (ASTRA-sim throws)"))
        return Facts(**base, issues=tuple(issues))
    size = _int_attr(attrs, "comm_size")
    if n.type == et.COMM_COLL_NODE:
        ctype = _int_attr(attrs, "comm_type")
        if ctype is None:
            issues.append(("coll-type", "comm_type is missing"))
            return Facts(**base, issues=tuple(issues))
        if ctype not in SUPPORTED_COMM_TYPES:
            issues.append(("coll-type", f"comm_type {ctype} is not one of "
                           f"{', '.join(CHAKRA_TYPE_NAMES[t] for t in sorted(SUPPORTED_COMM_TYPES))}"))
        if size is None:
            issues.append(("comm-size", "comm_size is missing"))
        elif size <= 0 or (splits and size < splits):
            issues.append(("comm-size", f"comm_size {size} is below preferred-dataset-splits {splits} "
                           "(ASTRA-sim divides it into zero-size chunks)"))
        key = WORLD
        pg = attrs.get("pg_name")
        if pg is not None and pg[0] == "string_val":
            key = str(pg[1]) or WORLD
            if not key.isdigit():
                issues.append(("pg-name", f"pg_name {key!r} is not a decimal integer"))
                return Facts(**base, issues=tuple(issues))
            key = str(int(key))
        return Facts(**base, issues=tuple(issues),
                     coll=(ctype, size if size is not None else -1, key))
    is_send = n.type == et.COMM_SEND_NODE
    src, dst, tag = (_int_attr(attrs, k) for k in ("comm_src", "comm_dst", "comm_tag"))
    other = dst if is_send else src
    if other is None:
        issues.append(("p2p-attrs", f"{'comm_dst' if is_send else 'comm_src'} is missing"))
    elif tag is None:
        issues.append(("p2p-attrs", "comm_tag is missing"))
    elif size is None or size <= 0:
        issues.append(("comm-size", f"comm_size {size} on a {'send' if is_send else 'recv'}"))
    else:
        return Facts(**base, issues=tuple(issues), p2p=(is_send, src, dst, tag, size))
    return Facts(**base, issues=tuple(issues))


# A cache key whose messages are decoded one by one. Public: the rank scan looks keys up in
# the cache itself (its hot loop) and must tell this mark from facts.
SLOW = object()


class FactsCache:
    """Facts by node message with its id and data_deps cut out (:func:`split_node`). Public:
    one cache serves every rank file of an export, which the check reads in turn."""

    def __init__(self, splits: int | None, roofline: bool = False):
        self.splits = splits
        self.roofline = roofline
        self.limit = CACHED_FACTS
        self.by_key: dict[bytes, Facts | object] = {}

    def get(self, data: bytes) -> tuple[int, bytes, Facts] | str:
        """(id, data_deps as packed varints, facts) of one node message, or a decode error."""
        sp = split_node(data)
        if sp is not None:
            nid, seg, key = sp
            f = self.by_key.get(key)
            if f is None:
                f = self.learn(data, nid, seg, key)
            if f is not SLOW:
                return nid, seg, f  # type: ignore[return-value]
        n = et.Node()
        try:
            n.ParseFromString(data)
        except DecodeError as e:
            return f"does not decode as a Node ({e})"
        return n.id, pack_varints(n.data_deps), _facts(n, self.splits, self.roofline)

    def learn(self, data: bytes, nid: int, seg: bytes, key: bytes) -> Facts | object:
        n = et.Node()
        try:
            n.ParseFromString(data)
        except DecodeError:
            f: Facts | object = SLOW
        else:
            ok = n.id == nid and list(n.data_deps) == unpack_varints(seg) and plain_fields(key)
            f = _facts(n, self.splits, self.roofline) if ok else SLOW
        if len(self.by_key) >= self.limit:
            self.by_key.clear()
        self.by_key[key] = f
        return f
