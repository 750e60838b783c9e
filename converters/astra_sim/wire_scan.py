"""Chakra ET rank files read as a stream of frames and protobuf fields, without decoding
every message into a Node: it is what lets the ASTRA-sim check hold a rank file of a million
nodes as a few arrays (docs/speed.md, "The ASTRA-sim contract check, streamed"). No rules
here: what is wrong with a node or a file is :mod:`.node_facts`' and :mod:`.check`'s to say."""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
from chakra.schema.protobuf import et_def_pb2 as et

from echo_et.errors import EchoError

READ_BYTES = 1 << 20      # how much of a rank file is read at a time
UNPACK_BYTES = 1 << 16    # how many bytes of packed data_deps are decoded at a time (the rules' slice too)
_U64 = 1 << 64


def _varint(data: bytes, i: int, n: int) -> tuple[int, int]:
    """The varint at ``data[i:]`` and where it ends; (-1, -1) when it runs past ``n`` or 10 bytes."""
    v = shift = 0
    while i < n and shift < 70:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return (v, i) if v < _U64 else (-1, -1)
        shift += 7
    return -1, -1


_HIGH_BIT = bytes.maketrans(bytes(range(256)), bytes(b >> 7 for b in range(256)))


def _packed_ok(seg: bytes) -> bool:
    """True when ``seg`` is whole varints of at most 9 bytes each (values below 2**63)."""
    return not seg or (seg[-1] < 0x80 and (len(seg) < 9 or b"\x01" * 9 not in seg.translate(_HIGH_BIT)))


def split_node(data: bytes) -> tuple[int, bytes, bytes] | None:
    """A node message written field by field in number order (as protobuf writes it): its id,
    its packed data_deps (the varints as written) and the rest of the message (the cache key).
    None for any other layout. Public: the rank scan calls it inline, ahead of the facts
    cache, on every message."""
    try:
        # The common case: an id of up to 3 bytes, a name and a type under 128, deps under 128 bytes.
        if data[0] == 0x08:
            b = data[1]
            if b < 0x80:
                nid, i = b, 2
            elif data[2] < 0x80:
                nid, i = (b & 0x7F) | data[2] << 7, 3
            elif data[3] < 0x80:
                nid, i = (b & 0x7F) | (data[2] & 0x7F) << 7 | data[3] << 14, 4
            else:
                return _split_any(data)
            j = i
            if data[i] == 0x12 and data[i + 1] < 0x80:
                i += 2 + data[i + 1]
            if data[i] == 0x18 and data[i + 1] < 0x80:
                i += 2
            tag = data[i]
            if tag == 0x2A:
                size = data[i + 1]
                end = i + 2 + size
                if size < 0x80 and end <= len(data):
                    seg = data[i + 2:end]
                    if _packed_ok(seg):
                        return nid, seg, data[j:i] + data[end:]
            elif tag >= 0x30:             # a field after data_deps: there are none
                return nid, b"", data[j:]
    except IndexError:
        pass
    return _split_any(data)


def _split_any(data: bytes) -> tuple[int, bytes, bytes] | None:
    """:func:`split_node` field by field."""
    n = len(data)
    if n < 2 or data[0] != 0x08:
        return None
    nid, i = _varint(data, 1, n)
    if i < 0:
        return None
    j = i
    while i < n:
        tag = data[i]
        if tag == 0x2A:                   # data_deps, packed
            size, k = _varint(data, i + 1, n)
            if k < 0 or k + size > n:
                return None
            seg = data[k:k + size]
            return (nid, seg, data[j:i] + data[k + size:]) if _packed_ok(seg) else None
        if tag == 0x12 or tag == 0x22:    # name, packed ctrl_deps
            size, k = _varint(data, i + 1, n)
            if k < 0 or k + size > n:
                return None
            i = k + size
        elif tag == 0x18:                 # type
            _, i = _varint(data, i + 1, n)
            if i < 0:
                return None
        elif tag >= 0x30:                 # a field after data_deps: there are none
            break
        else:
            return None
    return nid, b"", data[j:]


def unpack_varints(seg: bytes) -> list[int]:
    """The values of packed varints. Public: the facts cache checks a split against the
    decoded node with it."""
    out, v, shift = [], 0, 0
    for b in seg:
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            out.append(v)
            v = shift = 0
    return out


def pack_varints(values) -> bytes:
    """Values as packed varints, the form the rank scan keeps data_deps in. Public: the facts
    cache packs the deps of a node it had to decode whole."""
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def unpack_all(raw: bytes | bytearray, ends: array) -> tuple[np.ndarray, np.ndarray]:
    """The varints of ``raw`` (uint64) and, for byte offsets ``ends`` (where each node's end),
    how many of them end before each (node k's deps are ``values[ptr[k]:ptr[k + 1]]``). Decoded
    a slice at a time, so the temporaries do not grow with the file. Public: the rank scan
    turns a file's data_deps into arrays with it once the file is read."""
    b = np.frombuffer(raw, dtype=np.uint8)
    node_end = np.frombuffer(ends, dtype=np.int64)
    values = np.empty(int(np.count_nonzero(b < 0x80)), dtype=np.uint64)
    ptr = np.zeros(len(node_end) + 1, dtype=np.int64)
    n, start, at, node = len(b), 0, 0, 0
    while start < n:
        stop = min(start + UNPACK_BYTES, n)
        while stop < n and b[stop - 1] >= 0x80:   # whole varints only
            stop += 1
        chunk = b[start:stop]
        last = np.flatnonzero(chunk < 0x80)
        first = np.zeros(len(last), dtype=np.int64)
        first[1:] = last[:-1] + 1
        size = last - first + 1
        v = (chunk[first] & 0x7F).astype(np.uint64)
        for k in range(1, int(size.max())):
            m = np.flatnonzero(size > k)
            v[m] |= (chunk[first[m] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        values[at:at + len(v)] = v
        hi = int(np.searchsorted(node_end, stop, side="right"))   # nodes ending in this slice
        ptr[node + 1:hi + 1] = at + np.searchsorted(last, node_end[node:hi] - start)
        at += len(v)
        node, start = hi, stop
    return values, ptr


def plain_fields(data: bytes) -> bool:
    """True when ``data`` is a sequence of well-formed top-level fields, none of them the id
    (1) or data_deps (5). Public: the facts cache trusts a cut-out message as a key only
    then."""
    i, n = 0, len(data)
    while i < n:
        tag, i = _varint(data, i, n)
        if i < 0 or tag >> 3 in (0, 1, 5):
            return False
        wire = tag & 7
        if wire == 0:
            _, i = _varint(data, i, n)
        elif wire == 1:
            i += 8
        elif wire == 2:
            size, i = _varint(data, i, n)
            i = -1 if i < 0 else i + size
        elif wire == 5:
            i += 4
        else:
            return False
        if i < 0 or i > n:
            return False
    return True


def frames(f: BinaryIO) -> Iterator[bytes]:
    """The varint-length-prefixed messages of a file, read a megabyte at a time. Public: the
    rank scan reads every rank file through it."""
    buf = f.read(READ_BYTES)
    i = 0
    eof = len(buf) < READ_BYTES
    while True:
        while len(buf) - i < 10 and not eof:
            more = f.read(READ_BYTES)
            eof = len(more) < READ_BYTES
            buf = buf[i:] + more
            i = 0
        n = len(buf)
        if i >= n:
            return
        size = buf[i]
        i += 1
        if size >= 0x80:
            size &= 0x7F
            shift = 7
            while True:
                if i >= n:
                    raise EchoError("truncated length prefix")
                b = buf[i]
                i += 1
                size |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise EchoError("length prefix longer than 10 bytes (not a length-delimited stream)")
        if i + size <= n:
            yield buf[i:i + size]
            i += size
            continue
        parts = [buf[i:]]
        have = n - i
        while have < size and not eof:
            more = f.read(max(READ_BYTES, size - have))
            eof = not more
            parts.append(more)
            have += len(more)
        rest = b"".join(parts)
        if have < size:
            raise EchoError(f"truncated message: expected {size} bytes, found {have}")
        yield rest[:size]
        buf, i = rest, size


def message_number(k: int, skipped: list[int]) -> int:
    """The message number of node ``k`` (the k-th message that decoded as a node). Public:
    the rules keep nodes by index and find their names by message number."""
    m = k + 1
    for s in skipped:
        if s > m:
            break
        m += 1
    return m


def node_names(path: Path, want: set[int]) -> dict[int, tuple[int, str]]:
    """(id, name) of the node messages numbered ``want`` (#0 being the metadata), read again.
    Public: the rules keep no names and read back those of the nodes they report."""
    out: dict[int, tuple[int, str]] = {}
    if not want:
        return out
    with path.open("rb") as f:
        for i, data in enumerate(frames(f)):
            if i in want:
                n = et.Node()
                n.ParseFromString(data)
                out[i] = (n.id, n.name)
                if len(out) == len(want):
                    break
    return out
