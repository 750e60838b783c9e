"""Decoding a ``.et`` file into Chakra messages, refusing what is not the current schema.

Chakra's schema before Oct 2023 (proto2, ``Node.parent`` = 4, string ``inputs`` = 5, ...)
is wire-incompatible with the current one and protobuf parses it *without error* into
nonsense. Every decoded message is therefore checked for signs of the wrong schema:
fields the current schema does not define or carries with another wire type (protobuf
keeps those as unknown fields), node types outside the enum, and ``data_deps`` that name
no node and read as ASCII text (a string at field 5). Any of them is refused with one
line that names the file and the node.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from echo_et.errors import EchoError
from echo_et.ir.io import iter_delimited, open_maybe_gzip

OLD_SCHEMA_HINT = (
    "not the Chakra ET schema of Oct 2023 or later (a pre-Oct-2023 Chakra trace, whose wire "
    "format is incompatible, or not Chakra at all); regenerate it with a current chakra"
)
NODE_TYPES = frozenset(et.NodeType.values())


def _unknown(msg: Message) -> list[tuple[int, int]]:
    return [(f.field_number, f.wire_type) for f in unknown_fields.UnknownFieldSet(msg)]


def unknown_in_node(node: et.Node) -> list[tuple[int, int]]:
    """(field, wire type) pairs the current schema does not know, in the node or its parts."""
    found = _unknown(node)
    for a in node.attr:
        found += _unknown(a)
        kind = a.WhichOneof("value")
        if kind is not None and kind.endswith("_list"):
            found += _unknown(getattr(a, kind))
    for io in ("inputs", "outputs"):
        if node.HasField(io):
            found += _unknown(getattr(node, io))
    return found


def unknown_in_metadata(meta: et.GlobalMetadata) -> list[tuple[int, int]]:
    found = _unknown(meta)
    for a in meta.attr:
        found += _unknown(a)
    return found


def _describe(fields: list[tuple[int, int]]) -> str:
    f, w = fields[0]
    return f"field {f} with wire type {w}"


def looks_like_text(values) -> bool:
    """True when ids decoded from a packed field are all printable ASCII bytes: the sign of
    a string (pre-2023 ``inputs``) read as packed varints."""
    return len(values) >= 2 and all(9 <= v <= 126 for v in values)


def _peek_text(path: Path) -> str:
    with open_maybe_gzip(path) as f:
        head = f.read(64)
    return head.lstrip()[:1].decode("latin-1")


def iter_messages(path: str | os.PathLike[str]) -> Iterator[et.GlobalMetadata | et.Node]:
    """The GlobalMetadata, then each Node of one ``.et`` file (plain or gzip).

    Raises EchoError (naming the file, and the node where there is one) for anything that is
    not a well-formed Chakra ET of the current schema."""
    where = str(path)
    try:
        first_char = _peek_text(Path(path))
        if first_char in ("{", "["):
            raise EchoError(f"{where}: this is JSON, not a binary Chakra ET (.et files are "
                            "length-delimited protobuf)")
        with open_maybe_gzip(path) as f:
            it = iter_delimited(f)
            data = next(it, None)
            if data is None:
                raise EchoError(f"{where}: empty file (a Chakra ET starts with a GlobalMetadata)")
            meta = et.GlobalMetadata()
            try:
                meta.ParseFromString(data)
            except DecodeError as e:
                raise EchoError(f"{where}: first message is not a Chakra GlobalMetadata ({e}); "
                                f"{OLD_SCHEMA_HINT}") from None
            bad = unknown_in_metadata(meta)
            if bad:
                raise EchoError(f"{where}: first message is not a Chakra GlobalMetadata "
                                f"({_describe(bad)}); {OLD_SCHEMA_HINT}")
            yield meta
            for i, data in enumerate(it):
                node = et.Node()
                try:
                    node.ParseFromString(data)
                except DecodeError as e:
                    raise EchoError(f"{where}: node #{i} does not decode as a Chakra Node ({e}); "
                                    f"{OLD_SCHEMA_HINT}") from None
                bad = unknown_in_node(node)
                if bad:
                    raise EchoError(f"{where}: node #{i} (id {node.id}) has {_describe(bad)}, "
                                    f"which the Chakra schema does not define; {OLD_SCHEMA_HINT}")
                if node.type not in NODE_TYPES:
                    raise EchoError(f"{where}: node {node.id} ({node.name}): unknown Chakra node "
                                    f"type {node.type} (known: 0-{max(NODE_TYPES)})")
                yield node
    except EchoError as e:
        msg = str(e)
        raise EchoError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except (OSError, EOFError) as e:
        raise EchoError(f"{where}: cannot read ({e})") from None


def sniff_content(path: Path) -> bool:
    """True when the file starts like a current-schema Chakra ET: a clean GlobalMetadata
    followed by a clean Node (or nothing)."""
    try:
        it = iter_messages(path)
        next(it)
        next(it, None)
        return True
    except (EchoError, StopIteration):
        return False
