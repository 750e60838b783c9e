"""One host-ET node, normalised across schema versions.

Two shapes exist in the wild:

* ``1.0.1`` (flat): ``parent``, ``rf_id``, ``tid`` ... as top-level keys and
  ``inputs``/``input_shapes``/``input_types`` (same for outputs) as parallel lists;
* ``1.0.2-chakra.0.0.4`` and later (``1.0.3``, ``1.0.4``, ``1.1.0``, ``1.1.1``, ...):
  ``ctrl_deps`` (the parent id), ``inputs``/``outputs`` as ``{values, shapes, types[, strides]}``
  and an ``attrs`` list of ``{name, type, value}``.

The shape is detected per node, so a file whose ``schema`` string is new but whose nodes are
old (or the reverse) still reads. Only what the IR and linking need is kept.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from echo_et.errors import EchoError
from echo_et.ir.attention import causal_text, is_attention

try:  # shapes text is made several times faster by orjson; json gives the same text
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]

# A tensor in a host ET is [tensor_id, storage_id, offset, numel, elem_bytes, device]
# (older traces omit the device).
Tensor = tuple[int, int, int, int, int, str]

PROCESS_ROOT_PREFIX = "[pytorch|profiler|execution_"
PG_INIT_NAME = "## process_group:init ##"


class EtOp(msgspec.Struct, gc=False):
    """One host op. A struct the garbage collector does not track (it holds no cycles):
    a trace makes hundreds of thousands of them, and tracked objects make every collection
    walk them all again."""

    id: int
    name: str
    parent: int
    tid: int
    rf_id: int | None
    seq_id: int
    op_schema: str
    in_shapes: str            # JSON text of the input shapes, "" when there are none
    in_types: str             # JSON text of the input types
    in_tensors: tuple[Tensor, ...]
    out_tensors: tuple[Tensor, ...]
    start_ns: int = 0         # only linked ("ET+") traces carry timing
    duration_ns: int = 0
    timed: bool = False
    # Raw argument values, kept only for the few nodes that need them (comms, pg init,
    # attention).
    in_values: list[Any] = msgspec.field(default_factory=list)
    out_values: list[Any] = msgspec.field(default_factory=list)
    attrs: dict[str, Any] = msgspec.field(default_factory=dict)
    gpu: bool = False         # a GPU op appended by chakra_trace_link

    @property
    def is_root(self) -> bool:
        """The ``[pytorch|profiler|execution_trace|process|thread]`` pseudo nodes."""
        return self.name.startswith(PROCESS_ROOT_PREFIX)


def causal_of(op: EtOp) -> str:
    """"1" or "0" when ``op`` is an attention call whose arguments say whether it was causal,
    else "" (``echo_et.ir.attention``)."""
    return causal_text(op.name, op.in_values, op.op_schema) if is_attention(op.name) else ""


def _keeps_values(name: str) -> bool:
    return (
        is_attention(name)   # whether it was causal (causal_of)
        or name == PG_INIT_NAME
        or name == "record_param_comms"
        or name.startswith(("c10d::", "nccl:", "gloo:", "fake:", "mpi:", "ucc:", "xccl:"))
    )


def _tensors(value: Any, types: Any) -> tuple[Tensor, ...]:
    if type(value) is not list or type(types) is not list:
        return ()
    out: list[Tensor] = []
    for v, t in zip(value, types, strict=False):
        if type(t) is str and "Tensor" in t:
            if t.startswith("Tensor(") and type(v) is list and len(v) == 6:
                a, b, c, d, e, f = v   # the common case, checked inline (this runs per input)
                if (type(f) is str and type(a) is int and type(b) is int and type(c) is int
                        and type(d) is int and type(e) is int and -_MAX < a < _MAX and -_MAX < b < _MAX
                        and -_MAX < c < _MAX and 0 <= d < _MAX and 0 <= e < _MAX):
                    out.append((a, b, c, d, e, f))
                    continue
            collect_tensors(v, out)
    return tuple(out) if out else ()


def collect_tensors(v: Any, out: list[Tensor]) -> None:
    """Append every [id, storage, offset, numel, elem_bytes(, device)] list found in ``v``."""
    if type(v) is not list:
        return
    n = len(v)
    if (n == 6 and type(v[5]) is str or n == 5) and _tensor_ints(v):
        out.append((v[0], v[1], v[2], v[3], v[4], v[5] if n == 6 else ""))
        return
    for x in v:
        collect_tensors(x, out)


_MAX = 1 << 62


def _tensor_ints(v: list) -> bool:
    """The first five fields are ids, offset, numel, element size: plausible integers."""
    return all(type(x) is int and -_MAX < x < _MAX for x in v[:5]) and 0 <= v[3] and 0 <= v[4]


_TYPES_TEXT: dict[tuple, str] = {}


def _types_text(types: Any) -> str:
    """JSON text of a types list; ops repeat the same few lists, so the text is cached."""
    if not types:
        return ""
    try:
        key = tuple(types)
        text = _TYPES_TEXT.get(key)
    except TypeError:
        return _dumps(types)
    if text is None:
        text = _dumps(types)
        if len(_TYPES_TEXT) < 50_000:
            _TYPES_TEXT[key] = text
    return text


def _int(v: Any, default: int = 0) -> int:
    """An id-like integer (int64 range) from what real traces put there, else ``default``."""
    if type(v) is int:
        return v if -_MAX < v < _MAX else default
    if isinstance(v, list) and v:  # Chakra-style ctrl_deps lists
        v = v[0]
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return default
    try:
        x = int(v)
    except (ValueError, OverflowError):
        return default
    return x if -_MAX < x < _MAX else default


def _dumps(v: Any) -> str:
    if not v:
        return ""
    return json.dumps(v, separators=(", ", ": "))


_SHAPE_CHARS = b"0123456789[],-"
# One copy of each name and shapes text: ops repeat a few hundred of them (memory).
_NAMES: dict[str, str] = {}
_SHAPES: dict[str, str] = {}


def _shared(text: str) -> str:
    if len(_SHAPES) >= 200_000:
        return text
    return _SHAPES.setdefault(text, text)


def _shapes_text(v: Any) -> str:
    """``_dumps`` of a shapes list, by orjson when the list holds only integers (then its
    compact text with ", " separators is exactly json.dumps's, several times faster)."""
    if not v:
        return ""
    if _orjson is not None:
        try:
            raw = _orjson.dumps(v)
        except (TypeError, ValueError):
            raw = b"?"
        if not raw.translate(None, _SHAPE_CHARS):
            return raw.replace(b",", b", ").decode()
    return json.dumps(v, separators=(", ", ": "))


def _us_to_ns(v: Any) -> int:
    try:
        ns = float(v) * 1000
    except (TypeError, ValueError):
        return 0
    return round(ns) if 0 <= ns < _MAX else 0


def parse_node(d: Any, where: str) -> EtOp:
    """Normalise one node dict of any supported schema."""
    if not isinstance(d, dict):
        raise EchoError(f"{where}: a node is a {type(d).__name__}, not an object")
    if "id" not in d or "name" not in d:
        raise EchoError(f"{where}: node without id/name ({_dumps(d)[:80]})")
    name = d["name"]
    name = (_NAMES.setdefault(name, name) if len(_NAMES) < 200_000 else name) if type(name) is str else str(name)
    attrs_list = d.get("attrs")
    if type(attrs_list) is list:                         # 1.0.2 and later
        try:
            attrs = {a["name"]: a["value"] for a in attrs_list}   # the common case
        except (KeyError, TypeError):
            attrs = {a["name"]: a.get("value") for a in attrs_list
                     if isinstance(a, dict) and isinstance(a.get("name"), str)}
        parent = d.get("ctrl_deps", d.get("parent", 0))
        ins = d.get("inputs") or {}
        outs = d.get("outputs") or {}
        if not isinstance(ins, dict) or not isinstance(outs, dict):
            raise EchoError(f"{where}: node {d['id']} has inputs/outputs of an unknown shape")
        in_values, in_shapes = ins.get("values", []), ins.get("shapes", [])
        in_types = ins.get("types", [])
        out_values, out_types = outs.get("values", []), outs.get("types", [])
    elif "parent" in d or "input_shapes" in d:           # 1.0.1
        attrs = d
        parent = d.get("parent", 0)
        in_values, in_shapes = d.get("inputs", []), d.get("input_shapes", [])
        in_types = d.get("input_types", [])
        out_values, out_types = d.get("outputs", []), d.get("output_types", [])
    else:
        raise EchoError(f"{where}: node {d['id']} has neither 'attrs' (schema >= 1.0.2) "
                        "nor 'parent' (schema 1.0.1); unknown host ET schema")
    if type(in_values) is not list:
        in_values = []
    if type(in_shapes) is not list:
        in_shapes = []
    if type(in_types) is not list:
        in_types = []
    if type(out_values) is not list:
        out_values = []
    if type(out_types) is not list:
        out_types = []
    oid = _int(d["id"], -1)
    if oid < 0:
        raise EchoError(f"{where}: node id {str(d['id'])[:40]} is not a non-negative integer")
    rf = attrs.get("rf_id")
    keep = _keeps_values(name)
    op = EtOp(
        id=oid,
        name=name,
        parent=_int(parent),
        tid=_int(attrs.get("tid", 0)),
        rf_id=None if rf is None else _int(rf, 0),
        seq_id=_int(attrs.get("seq_id", -1), -1),
        op_schema=str(attrs.get("op_schema") or "") if keep else "",   # only comms and attention read it
        in_shapes=_shared(_shapes_text(in_shapes)),
        in_types=_types_text(in_types),
        in_tensors=_tensors(in_values, in_types),
        out_tensors=_tensors(out_values, out_types),
    )
    if "ts" in d or "inclusive_dur" in d or "dur" in d:  # a linked "ET+" trace (microseconds)
        op.start_ns = _us_to_ns(d.get("ts", 0))
        op.duration_ns = _us_to_ns(d.get("inclusive_dur", d.get("dur", 0)))
        op.timed = True
    if "cat" in d:  # GPU op appended by chakra_trace_link
        op.gpu = True
    if keep:
        op.in_values = in_values
        op.out_values = out_values
        op.attrs = {k: v for k, v in attrs.items() if k in _COMM_ATTRS}
    return op


_COMM_ATTRS = frozenset({
    "collective_name", "dtype", "in_msg_nelems", "out_msg_nelems", "in_split_size",
    "out_split_size", "global_rank_start", "global_rank_stride", "pg_name", "pg_desc", "pg_size",
})


# -- typed fast path ------------------------------------------------------------------------
# The nodes of schema 1.0.2 and later, as msgspec decodes them straight from the text: only
# the fields parse_node reads are declared (strides, output shapes, attr types are skipped
# unread), shapes and types come as their raw JSON text (ops repeat a few hundred of them:
# each is decoded once, see _raw_shapes/_raw_types) and the structs are not tracked by the
# garbage collector. A node that does not fit (1.0.1's flat shape, a field of another type)
# is decoded as a dict by the stream reader and goes through parse_node: the result is the
# same EtOp either way (tests/test_pytorch_et.py compares the two on every real trace).
_UNSET: Any = msgspec.UNSET


class ArgsStruct(msgspec.Struct, gc=False):
    values: Any = _UNSET
    shapes: msgspec.Raw = _UNSET
    types: msgspec.Raw = _UNSET


class AttrStruct(msgspec.Struct, gc=False):
    name: str
    value: Any = None


class NodeStruct(msgspec.Struct, gc=False):
    id: Any
    name: Any
    attrs: list[AttrStruct]
    ctrl_deps: Any = _UNSET
    parent: Any = _UNSET
    inputs: ArgsStruct | None = None
    outputs: ArgsStruct | None = None
    ts: Any = _UNSET
    inclusive_dur: Any = _UNSET
    dur: Any = _UNSET
    cat: Any = _UNSET


_NAME_INFO: dict[str, tuple[str, bool]] = {}   # name -> (its shared copy, _keeps_values)
_RAW_SHAPES: dict[bytes, str] = {}
# raw JSON of a types list -> (the list, its text, where its tensors are: (index, "Tensor(...)"))
_RAW_TYPES: dict[bytes, tuple[list, str, tuple[tuple[int, bool], ...]]] = {}
_RAW_CACHE_MAX = 100_000


def _raw_shapes(key: bytes) -> str:
    """parse_node's shapes text from the raw JSON of a ``shapes`` field (cached)."""
    text = _RAW_SHAPES.get(key)
    if text is None:
        v = json.loads(key)
        text = _shared(_shapes_text(v if type(v) is list else []))
        if len(_RAW_SHAPES) < _RAW_CACHE_MAX:
            _RAW_SHAPES[key] = text
    return text


_NO_TYPES: tuple[list, str, tuple] = ([], "", ())


def _raw_types(key: bytes) -> tuple[list, str, tuple[tuple[int, bool], ...]]:
    """The decoded list (never changed by the caller), parse_node's text of a ``types``
    field and the positions of its tensors (what _tensors looks at), from its raw JSON
    (cached)."""
    got = _RAW_TYPES.get(key)
    if got is None:
        v = json.loads(key)
        if type(v) is not list:
            v = []
        slots = tuple((i, t.startswith("Tensor(")) for i, t in enumerate(v)
                      if type(t) is str and "Tensor" in t)
        got = (v, _types_text(v), slots)
        if len(_RAW_TYPES) < _RAW_CACHE_MAX:
            _RAW_TYPES[key] = got
    return got


def _tensors_at(value: list, slots: tuple[tuple[int, bool], ...]) -> tuple[Tensor, ...]:
    """_tensors(value, types) for the tensor positions of ``types``."""
    out: list[Tensor] = []
    n = len(value)
    for i, simple in slots:
        if i >= n:
            break
        v = value[i]
        if simple and type(v) is list and len(v) == 6:
            a, b, c, d, e, f = v
            if (type(f) is str and type(a) is type(b) is type(c) is type(d) is type(e) is int
                    and -_MAX < a < _MAX and -_MAX < b < _MAX and -_MAX < c < _MAX
                    and 0 <= d < _MAX and 0 <= e < _MAX):
                out.append((a, b, c, d, e, f))
                continue
        collect_tensors(v, out)
    return tuple(out) if out else ()


def parse_struct(d: Any, where: str) -> EtOp:
    """parse_node for a NodeStruct: the same EtOp from the typed decode."""
    name = d.name
    info = _NAME_INFO.get(name) if type(name) is str else None
    if info is None:
        name = (_NAMES.setdefault(name, name) if len(_NAMES) < 200_000 else name) if type(name) is str else str(name)
        info = (name, _keeps_values(name))
        if len(_NAME_INFO) < 200_000:
            _NAME_INFO[name] = info
    name, keep = info
    if keep:   # communication and group-init ops keep their attrs
        attrs = {a.name: a.value for a in d.attrs}   # later entries win, as in parse_node
        tid, rf, seq = attrs.get("tid", 0), attrs.get("rf_id"), attrs.get("seq_id", -1)
    else:      # the three attrs every op needs, without a dict (later entries win alike)
        tid, rf, seq = 0, None, -1
        for a in d.attrs:
            an = a.name
            if an == "tid":
                tid = a.value
            elif an == "rf_id":
                rf = a.value
            elif an == "seq_id":
                seq = a.value
    parent = d.ctrl_deps
    if parent is _UNSET:
        parent = d.parent
        if parent is _UNSET:
            parent = 0
    ins, outs = d.inputs, d.outputs
    if ins is None:
        in_values, in_shapes, in_types_text, in_slots = [], "", "", ()
    else:
        in_values = ins.values
        if type(in_values) is not list:
            in_values = []
        raw = ins.shapes
        if raw is _UNSET:
            in_shapes = ""
        else:
            in_shapes = _RAW_SHAPES.get(key := bytes(raw)) or _raw_shapes(key)
        raw = ins.types
        _, in_types_text, in_slots = _NO_TYPES if raw is _UNSET else (
            _RAW_TYPES.get(key := bytes(raw)) or _raw_types(key))
    if outs is None:
        out_values, out_slots = [], ()
    else:
        out_values = outs.values
        if type(out_values) is not list:
            out_values = []
        raw = outs.types
        out_slots = () if raw is _UNSET else (_RAW_TYPES.get(key := bytes(raw)) or _raw_types(key))[2]
    # _int inline for the common value (an int in range), the call otherwise
    oid = d.id
    if type(oid) is not int or not 0 <= oid < _MAX:
        oid = _int(oid, -1)
        if oid < 0:
            raise EchoError(f"{where}: node id {str(d.id)[:40]} is not a non-negative integer")
    if type(parent) is not int or not -_MAX < parent < _MAX:
        parent = _int(parent)
    if type(tid) is not int or not -_MAX < tid < _MAX:
        tid = _int(tid)
    if rf is not None and (type(rf) is not int or not -_MAX < rf < _MAX):
        rf = _int(rf, 0)
    if type(seq) is not int or not -_MAX < seq < _MAX:
        seq = _int(seq, -1)
    op = EtOp(
        oid, name, parent, tid, rf, seq,
        str(attrs.get("op_schema") or "") if keep else "",
        in_shapes, in_types_text,
        _tensors_at(in_values, in_slots) if in_slots else (),
        _tensors_at(out_values, out_slots) if out_slots else (),
    )
    if d.ts is not _UNSET or d.inclusive_dur is not _UNSET or d.dur is not _UNSET:
        op.start_ns = _us_to_ns(0 if d.ts is _UNSET else d.ts)
        dur = d.inclusive_dur
        if dur is _UNSET:
            dur = 0 if d.dur is _UNSET else d.dur
        op.duration_ns = _us_to_ns(dur)
        op.timed = True
    if d.cat is not _UNSET:
        op.gpu = True
    if keep:
        op.in_values = in_values
        op.out_values = out_values
        op.attrs = {k: v for k, v in attrs.items() if k in _COMM_ATTRS}
    return op
