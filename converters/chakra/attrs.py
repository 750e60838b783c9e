"""Chakra ``AttributeProto`` values: reading them whatever integer type a writer chose, and
keeping the ones echo-et has no field for as text that the writer can turn back into the
same attribute.

Chakra attributes are a ``oneof`` of 30 typed members; writers disagree on which member an
attribute uses (``comm_size`` is int64 in ASTRA-sim's files and uint64 in others). The
reader accepts every integer member and records each use of a non-standard one.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

from chakra.schema.protobuf import et_def_pb2 as et

from echo_et.errors import EchoError

# The member each attribute has in the legacy ASTRA-sim feeder, which reads only that one
# (chakra-astrasim.md section 1.10): what the writer uses and what the reader calls standard.
STANDARD_FIELD: dict[str, str] = {
    "is_cpu_op": "bool_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "comm_priority": "int32_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "pg_name": "string_val",
    "stream": "int64_val",
    "rf_id": "int64_val",
    "chakra_id": "uint64_val",
}

INT_FIELDS = frozenset(
    {
        "int32_val", "int64_val", "uint32_val", "uint64_val", "sint32_val", "sint64_val",
        "fixed32_val", "fixed64_val", "sfixed32_val", "sfixed64_val", "bool_val",
    }
)
_FLOAT_FIELDS = frozenset({"double_val", "float_val"})
_LIST_FIELDS = frozenset(
    f.name for f in et.AttributeProto.DESCRIPTOR.fields if f.name.endswith("_list")
)
_SCALAR_FIELDS = frozenset(
    f.name for f in et.AttributeProto.DESCRIPTOR.fields if f.name.endswith("_val")
)

# Node.attrs key under which an attribute echo-et does not interpret is kept.
KEPT_PREFIX = "chakra_attr."

# What json.dumps(value, sort_keys=True) does, without building an encoder per call.
_JSON = json.JSONEncoder(sort_keys=True)


class AttrReader:
    """Typed access to one node's attributes; counts non-standard integer members."""

    __slots__ = ("by_name", "_where", "variants")

    def __init__(self, attrs, where: Callable[[], str], variants: dict[str, int]):
        self.by_name: dict[str, et.AttributeProto] = {}
        for a in reversed(attrs):
            # A repeated name keeps its first value, as the C++ feeders do.
            self.by_name[a.name] = a
        self._where = where  # called only to word an error
        self.variants = variants

    @property
    def where(self) -> str:
        return self._where()

    def has(self, name: str) -> bool:
        return name in self.by_name

    def _note(self, name: str, field: str) -> None:
        std = STANDARD_FIELD.get(name)
        if std is not None and field != std:
            reason = f"chakra: attribute {name} stored as {field} (standard {std}), read as integer"
            self.variants[reason] = self.variants.get(reason, 0) + 1

    def int(self, name: str, default: int | None = None) -> int | None:
        a = self.by_name.get(name)
        if a is None:
            return default
        field = a.WhichOneof("value")
        if field in INT_FIELDS:
            self._note(name, field)
            return int(getattr(a, field))
        if field in _FLOAT_FIELDS:
            v = getattr(a, field)
            if math.isfinite(v) and v == int(v):
                self._note(name, field)
                return int(v)
        raise EchoError(f"{self.where}: attribute {name} holds {field or 'no value'}, "
                        "expected an integer")

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.int(name)
        return default if v is None else bool(v)

    def str(self, name: str, default: str = "") -> str:
        a = self.by_name.get(name)
        if a is None:
            return default
        field = a.WhichOneof("value")
        if field == "string_val":
            return a.string_val
        if field in INT_FIELDS:
            self._note(name, field)
            return str(int(getattr(a, field)))
        raise EchoError(f"{self.where}: attribute {name} holds {field or 'no value'}, "
                        "expected a string")


def attr_to_text(a: et.AttributeProto) -> str | None:
    """``FIELD:JSON`` for one attribute (bytes as base64), or None when it has no value."""
    field = a.WhichOneof("value")
    if field is None:
        return None
    v = getattr(a, field)
    if field in _LIST_FIELDS:
        value: Any = list(v.values)
        if field == "bytes_list":
            value = [base64.b64encode(b).decode("ascii") for b in value]
    elif field == "bytes_val":
        value = base64.b64encode(v).decode("ascii")
    else:
        value = v
    return f"{field}:{_JSON.encode(value)}"


def text_to_attr(name: str, text: str) -> et.AttributeProto | None:
    """The inverse of :func:`attr_to_text`; None when ``text`` is not in that form."""
    field, sep, payload = text.partition(":")
    if not sep or (field not in _LIST_FIELDS and field not in _SCALAR_FIELDS):
        return None
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    a = et.AttributeProto(name=name)
    try:
        if field in _LIST_FIELDS:
            if field == "bytes_list":
                value = [base64.b64decode(b) for b in value]
            getattr(a, field).values.extend(value)
        elif field == "bytes_val":
            a.bytes_val = base64.b64decode(value)
        else:
            setattr(a, field, value)
    except (TypeError, ValueError):
        return None
    return a


def str_attr(name: str, value: str) -> et.AttributeProto:
    return et.AttributeProto(name=name, string_val=value)
