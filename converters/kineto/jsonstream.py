"""Incremental reading of one Kineto (Chrome trace) JSON document.

A Kineto file is one JSON object whose ``traceEvents`` array holds hundreds of thousands
of small objects. ``json.load`` would build all of them at once (and a gzip copy of the
text beside them); here the text is read in chunks and each event is decoded on its own
with the C decoder (``raw_decode``) and handed to a callback, so only the caller's compact
copy of what it keeps stays alive. Everything outside ``traceEvents`` is small and is
returned as a dict.

Floating point literals are kept as their text (``parse_float=str``) so that microsecond
timestamps such as ``4458676522690.655`` convert to integer nanoseconds exactly; a double
cannot hold them to the nanosecond.
"""

from __future__ import annotations

import codecs
import gzip
import json
import json.scanner
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError

_CHUNK = 1 << 20
# A decode error this far before the end of the buffered text cannot be a value cut by the
# chunk boundary: it is a real syntax error.
_MAX_VALUE_CHARS = 8 << 20
_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder(parse_float=str)
_SCAN = json.scanner.make_scanner(_DECODER)
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")


class _Text:
    """A window over the decompressed text, refilled on demand."""

    def __init__(self, raw, where: str):
        self._raw = raw
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self.where = where
        self.buf = ""
        self.pos = 0
        self.dropped = 0  # characters discarded before buf (for error offsets)
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            data = self._raw.read(_CHUNK)
        except (OSError, EOFError, zlib.error) as e:
            raise EchoError(f"{self.where}: cannot read ({_gzip_reason(e)})") from None
        try:
            text = self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise EchoError(f"{self.where}: not UTF-8 text ({e.reason} at byte "
                            f"{e.start}); not a Kineto JSON trace") from None
        if not data:
            self.eof = True
        if self.pos:
            self.dropped += self.pos
            self.buf = self.buf[self.pos:] + text
            self.pos = 0
        else:
            self.buf += text
        return bool(data)

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the text)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, ch: str, context: str) -> None:
        got = self.peek()
        if got != ch:
            self.fail(f"expected {ch!r} {context}, found {got!r}" if got
                      else f"text ends where {ch!r} was expected {context} (truncated file?)")
        self.pos += 1

    def value(self) -> Any:
        """Decode the next JSON value, reading more text until it is complete."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.eof or len(self.buf) - e.pos > _MAX_VALUE_CHARS:
                    if self.eof and (e.msg.startswith("Unterminated")
                                     or e.pos >= len(self.buf.rstrip()) - 1):
                        self.fail("text ends inside a value (truncated file?)", e.pos)
                    self.fail(e.msg, e.pos)
                self.fill()
                continue
            if end >= len(self.buf) and not self.eof:
                # A number or literal may continue in the next chunk.
                if self.fill():
                    continue
            self.pos = end
            return obj

    def fail(self, message: str, pos: int | None = None) -> None:
        at = self.dropped + (self.pos if pos is None else pos)
        raise EchoError(f"{self.where}: invalid JSON at character {at}: {message}")


def _gzip_reason(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    if isinstance(e, EOFError):
        return "compressed stream ends early: truncated gzip file"
    return msg


def open_text_source(path: Path):
    """A binary reader of the file's content, un-gzipped when it starts with 1f 8b.

    A name ending in ``.gz`` whose content is not gzip is refused (a renamed or broken
    download), rather than parsed as whatever it happens to be.
    """
    f = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")
    if path.name.endswith(".gz"):
        f.close()
        raise EchoError(f"{path}: named .gz but is not gzip data")
    return f


def read_document(path: Path, on_event: Callable[[dict], None]) -> dict[str, Any]:
    """Stream ``path``: call ``on_event`` for each entry of ``traceEvents`` in file order and
    return the other top-level keys. A top-level array (Chrome's JSON array format) is read
    as the event list itself."""
    where = str(path)
    src = open_text_source(path)
    try:
        t = _Text(src, where)
        first = t.peek()
        meta: dict[str, Any] = {}
        if first == "[":
            meta["traceEvents"] = _read_events(t, on_event)
        elif first == "{":
            t.pos += 1
            _read_object(t, meta, on_event)
        elif first == "":
            raise EchoError(f"{where}: empty file")
        else:
            raise EchoError(f"{where}: not JSON (starts with {first!r}); not a Kineto trace")
        if t.peek() != "":
            t.fail("extra data after the JSON document")
        return meta
    except gzip.BadGzipFile as e:
        raise EchoError(f"{where}: broken gzip data ({e})") from None
    finally:
        src.close()


def _read_object(t: _Text, meta: dict[str, Any], on_event: Callable[[dict], None]) -> None:
    if t.peek() == "}":
        t.pos += 1
        return
    while True:
        if t.peek() != '"':
            t.fail("expected a key string in the top-level object")
        key = t.value()
        t.expect(":", f"after key {key!r}")
        if key == "traceEvents" and t.peek() == "[":
            meta[key] = _read_events(t, on_event)
        else:
            meta[key] = t.value()
        c = t.peek()
        if c == ",":
            t.pos += 1
            continue
        if c == "}":
            t.pos += 1
            return
        if not c:
            t.fail("text ends inside the top-level object (truncated file?)")
        t.fail(f"expected ',' or '}}' after the value of {key!r}, found {c!r}")


def _read_events(t: _Text, on_event: Callable[[dict], None]) -> int:
    """Consume the ``[...]`` of events; returns how many there were."""
    t.expect("[", "to open traceEvents")
    n = 0
    if t.peek() == "]":
        t.pos += 1
        return 0
    scan = _SCAN
    sep = _SEP.match
    while True:
        # Fast path: a whole event and its separator inside the buffer.
        buf, pos = t.buf, t.pos
        try:
            ev, end = scan(buf, pos)
            if end >= len(buf):
                raise StopIteration
        except (StopIteration, json.JSONDecodeError):
            ev = t.value()
            buf, end = t.buf, t.pos
        t.pos = end
        n += 1
        if isinstance(ev, dict):
            on_event(ev)
        m = sep(buf, end)
        if m is not None:
            nxt = m.end()
            if nxt < len(buf) and buf[nxt] != "]":
                t.pos = nxt
                continue
        c = t.peek()
        if c == ",":
            t.pos += 1
            if t.peek() == "]":  # tolerate a trailing comma
                t.pos += 1
                return n
            continue
        if c == "]":
            t.pos += 1
            return n
        if not c:
            t.fail("text ends inside traceEvents (truncated file?)")
        t.fail(f"expected ',' or ']' between trace events, found {c!r}")
