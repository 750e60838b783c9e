"""Decoding a ``.et`` file into Chakra messages, refusing what is not the current schema.

Chakra's schema before Oct 2023 (proto2, ``Node.parent`` = 4, string ``inputs`` = 5, ...)
is wire-incompatible with the current one and protobuf parses it *without error* into
nonsense. Every decoded message is therefore checked for signs of the wrong schema:
fields the current schema does not define or carries with another wire type (protobuf
keeps those as unknown fields), node types outside the enum, and ``data_deps`` that name
no node and read as ASCII text (a string at field 5). Any of them is refused with one
line that names the file and the node.

:func:`scan_nodes` also says where each node's message is, so that the reader can decode it
again later (:class:`NodeFrames`) rather than keep every decoded message of a file.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from chakra.schema.protobuf import et_def_pb2 as et
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from echo_et.errors import EchoError
from echo_et.ir.io import MAX_MESSAGE, open_maybe_gzip, read_exact

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


def _has_unknown(node: et.Node) -> bool:
    """Whether the node or any of its parts holds fields the schema does not define: protobuf
    serialises those with the rest, so dropping them changes the size (one C-level walk
    instead of an UnknownFieldSet per message; the slow :func:`unknown_in_node` then words
    the error). The node keeps only known fields afterwards."""
    size = node.ByteSize()
    node.DiscardUnknownFields()
    return node.ByteSize() != size


_CHUNK = 1 << 20


def iter_frames(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` of each length-delimited message until EOF, ``offset`` being where
    the payload starts in the stream. Same framing and errors as
    :func:`echo_et.ir.io.iter_delimited`, but it reads a megabyte at a time instead of making
    a call per length byte, and says where each message is, for a second pass."""
    buf = b""
    pos = 0        # next byte of buf to decode
    base = 0       # stream offset of buf[0]
    eof = False
    while True:
        while len(buf) - pos < 10 and not eof:
            more = f.read(_CHUNK)
            if more:
                base += pos
                buf = buf[pos:] + more
                pos = 0
            else:
                eof = True
        if pos == len(buf):
            return
        size = buf[pos]
        if size < 0x80:
            pos += 1
        else:
            size = shift = 0
            for k in range(pos, pos + 10):
                if k == len(buf):
                    raise EchoError("truncated length prefix")
                b = buf[k]
                size |= (b & 0x7F) << shift
                if not b & 0x80:
                    pos = k + 1
                    break
                shift += 7
            else:
                raise EchoError("length prefix longer than 10 bytes (not a length-delimited "
                                "protobuf stream)")
            if size > MAX_MESSAGE:
                raise EchoError(f"message length {size} is implausible (not a length-delimited stream)")
        start = base + pos
        end = pos + size
        if end <= len(buf):
            data = buf[pos:end]
            pos = end
        else:
            rest = read_exact(f, end - len(buf))
            data = buf[pos:] + rest
            base += len(buf) + len(rest)
            buf, pos = b"", 0
            if len(data) != size:
                raise EchoError(f"truncated message: expected {size} bytes, found {len(data)}")
        yield start, data


def scan_nodes(path: str | os.PathLike[str]) -> Iterator[et.GlobalMetadata | tuple[int, int, et.Node]]:
    """The GlobalMetadata, then ``(offset, size, node)`` for each Node of one ``.et`` file
    (plain or gzip), where ``offset`` and ``size`` locate the node's message in the
    (decompressed) stream, so that a second pass can fetch it again (:class:`NodeFrames`)
    instead of keeping every message.

    Raises EchoError (naming the file, and the node where there is one) for anything that is
    not a well-formed Chakra ET of the current schema."""
    where = str(path)
    try:
        first_char = _peek_text(Path(path))
        if first_char in ("{", "["):
            raise EchoError(f"{where}: this is JSON, not a binary Chakra ET (.et files are "
                            "length-delimited protobuf)")
        with open_maybe_gzip(path) as f:
            it = iter_frames(f)
            first = next(it, None)
            if first is None:
                raise EchoError(f"{where}: empty file (a Chakra ET starts with a GlobalMetadata)")
            meta = et.GlobalMetadata()
            try:
                meta.ParseFromString(first[1])
            except DecodeError as e:
                raise EchoError(f"{where}: first message is not a Chakra GlobalMetadata ({e}); "
                                f"{OLD_SCHEMA_HINT}") from None
            bad = unknown_in_metadata(meta)
            if bad:
                raise EchoError(f"{where}: first message is not a Chakra GlobalMetadata "
                                f"({_describe(bad)}); {OLD_SCHEMA_HINT}")
            yield meta
            for i, (offset, data) in enumerate(it):
                node = et.Node()
                try:
                    node.ParseFromString(data)
                except DecodeError as e:
                    raise EchoError(f"{where}: node #{i} does not decode as a Chakra Node ({e}); "
                                    f"{OLD_SCHEMA_HINT}") from None
                if _has_unknown(node):
                    original = et.Node()
                    original.ParseFromString(data)
                    bad = unknown_in_node(original)
                    if bad:
                        raise EchoError(f"{where}: node #{i} (id {node.id}) has {_describe(bad)}, "
                                        f"which the Chakra schema does not define; {OLD_SCHEMA_HINT}")
                if node.type not in NODE_TYPES:
                    raise EchoError(f"{where}: node {node.id} ({node.name}): unknown Chakra node "
                                    f"type {node.type} (known: 0-{max(NODE_TYPES)})")
                yield offset, len(data), node
    except EchoError as e:
        msg = str(e)
        raise EchoError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except (OSError, EOFError, zlib.error) as e:
        raise EchoError(f"{where}: cannot read ({e})") from None


def iter_messages(path: str | os.PathLike[str]) -> Iterator[et.GlobalMetadata | et.Node]:
    """The GlobalMetadata, then each Node of one ``.et`` file (plain or gzip); errors as
    :func:`scan_nodes`."""
    it = scan_nodes(path)
    yield next(it)  # type: ignore[misc]
    for _, _, node in it:  # type: ignore[misc]
        yield node


class NodeFrames:
    """Second pass over a file :func:`scan_nodes` has read: node ``i`` by the offset and size
    recorded for it, in any order. A plain file is read by seeking. A gzip stream cannot seek
    back cheaply, so it is read forward once and the messages met before they are asked for
    are kept (raw bytes) until then; asking again for one already handed out restarts the
    stream. Use as a context manager."""

    def __init__(self, path: str | os.PathLike[str], offsets: Sequence[int], sizes: Sequence[int]):
        self.path = path
        self.offsets = offsets
        self.sizes = sizes
        self._f: BinaryIO | None = None
        self._frames: Iterator[tuple[int, bytes]] | None = None   # gzip: the stream read forward
        self._next = 0                       # gzip: index of the next node in the stream
        self._ahead: dict[int, bytes] = {}   # gzip: messages read before they were asked for

    def __enter__(self) -> NodeFrames:
        self._open()
        return self

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _open(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        try:
            self._f = f = open_maybe_gzip(self.path)
            self._frames = None
            self._next = 0
            self._ahead.clear()
            if isinstance(f, gzip.GzipFile):
                self._frames = iter_frames(f)
                next(self._frames, None)   # the GlobalMetadata
        except (EchoError, OSError, EOFError) as e:
            raise EchoError(f"{self.path}: cannot read it again ({e})") from None

    def raw(self, i: int) -> bytes:
        if self._frames is None:
            f = self._f
            assert f is not None
            f.seek(self.offsets[i])
            return f.read(self.sizes[i])
        data = self._ahead.pop(i, None)
        if data is not None:
            return data
        if i < self._next:
            self._open()
        for k in range(self._next, len(self.offsets)):
            _, data = next(self._frames)
            self._next = k + 1
            if k == i:
                return data
            self._ahead[k] = data
        raise EchoError(f"node #{i} is not in the file")

    def node(self, i: int, node_id: int) -> et.Node:
        """Node ``i`` again; EchoError when the file no longer holds what the first pass read."""
        try:
            node = et.Node()
            node.ParseFromString(self.raw(i))
        except (EchoError, DecodeError, OSError, EOFError, StopIteration) as e:
            raise EchoError(f"{self.path}: changed while being read (node #{i}: {e})") from None
        if node.id != node_id:
            raise EchoError(f"{self.path}: changed while being read (node #{i} has id {node.id}, "
                            f"was {node_id})")
        return node


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
