"""Incremental reading of one large JSON document: the elements of one big array, one at a time.

Profiler traces are a single JSON object whose one array (Kineto's ``traceEvents``, a host
execution trace's ``nodes``) holds hundreds of thousands of small objects and can reach
gigabytes. ``json.load`` would hold the text and every element at once; here the text is read
in chunks and each element is decoded on its own by the C scanner over a sliding buffer, so
memory stays at one element plus whatever the caller keeps. Everything outside the array is
small and is decoded whole. Gzip is recognised by its magic bytes; a ``.gz`` name on other
content is refused. Every problem is one EchoError naming the file.
"""

from __future__ import annotations

import codecs
import gzip
import json
import json.scanner
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from echo_et.errors import EchoError

try:  # a faster decoder for whole batches of elements (see _batch); optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the stdlib path still works
    _orjson = None  # type: ignore[assignment]
try:  # typed batches: only the fields a reader declares are decoded (see element_type)
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; the generic path still works
    _msgspec = None  # type: ignore[assignment]

_CHUNK = 1 << 20
# A decode error this far before the end of the buffered text cannot be a value cut by the
# chunk boundary: it is a real syntax error (and the rest of the file need not be read).
_MAX_VALUE_CHARS = 8 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_WS = re.compile(r"[ \t\n\r]*")
_SEP = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
# What may follow a number the buffer cut short ("12." of "12.5", "1e" of "1e-3").
_NUMBER_TAIL = re.compile(r"[0-9.eE+\-]*")

# What iter_document yields: ("field", key, value) for each top-level key other than the
# streamed array, ("item", key, element) for each element of the array, in file order.
Event = tuple[str, str, Any]


def open_source(path: str | os.PathLike[str]) -> IO[bytes]:
    """A binary reader of the file's content, un-gzipped when it starts with 1f 8b.

    A name ending in ``.gz`` whose content is not gzip is refused (a renamed or broken
    download), rather than parsed as whatever it happens to be. The caller closes it.
    """
    p = Path(path)
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as e:
        raise EchoError(f"{p}: cannot read ({e.strerror or e})") from None
    magic = f.read(2)
    f.seek(0)
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if p.name.endswith(".gz"):
        f.close()
        raise EchoError(f"{p}: named .gz but is not gzip data")
    return f


def read_head(path: str | os.PathLike[str], size: int = 1 << 16) -> str:
    """Up to ``size`` bytes from the start of the (possibly gzipped) file as text, for sniffing;
    '' when the file cannot be read."""
    try:
        src = open_source(path)
        try:
            return src.read(size).decode("utf-8", "replace")
        finally:
            src.close()
    except (EchoError, OSError, EOFError, zlib.error):
        return ""


class _Text:
    """A window over the decompressed text, refilled on demand."""

    def __init__(self, raw: IO[bytes], where: str, kind: str, parse_float: Callable[[str], Any] | None):
        self._raw = raw
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self.where = where
        self.kind = kind
        self.decoder = json.JSONDecoder(parse_float=parse_float)
        self.scan = json.scanner.make_scanner(self.decoder)
        self.buf = ""
        self.pos = 0
        self.dropped = 0      # characters discarded before buf (for error offsets)
        self.bytes_read = 0   # bytes decoded before the current chunk (for UTF-8 error offsets)
        self.eof = False

    def fill(self) -> bool:
        """Read more text: at least as much as is still buffered, so that retrying a long value
        after each refill stays linear in its length."""
        if self.eof:
            return False
        try:
            data = self._raw.read(max(_CHUNK, len(self.buf) - self.pos))
        except EOFError:
            raise EchoError(f"{self.where}: truncated gzip data (compressed stream ends early)") from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise EchoError(f"{self.where}: corrupt gzip data ({e})") from None
        except OSError as e:
            raise EchoError(f"{self.where}: cannot read ({e.strerror or e})") from None
        try:
            text = self._utf8.decode(data, final=not data)
        except UnicodeDecodeError as e:
            raise EchoError(f"{self.where}: not UTF-8 text ({e.reason} at byte "
                            f"{self.bytes_read + e.start}); not a {self.kind}") from None
        self.bytes_read += len(data)
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
        """The next non-blank character ('' at the end of the text), not consumed."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
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
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.eof or len(self.buf) - e.pos > _MAX_VALUE_CHARS:
                    if self.eof and (e.msg.startswith("Unterminated")
                                     or e.pos >= len(self.buf.rstrip()) - 1):
                        self.fail("text ends inside a value (truncated file?)", e.pos)
                    self.fail(e.msg, e.pos)
                self.fill()
                continue
            if not self.eof and _NUMBER_TAIL.fullmatch(self.buf, end) and self.fill():
                continue  # a value at the end of the buffer (a number) may go on in the next chunk
            self.pos = end
            return obj

    def fail(self, message: str, pos: int | None = None) -> None:
        at = self.dropped + (self.pos if pos is None else pos)
        raise EchoError(f"{self.where}: invalid JSON at character {at}: {message}")


def iter_document(path: str | os.PathLike[str], array_key: str, *,
                  parse_float: Callable[[str], Any] | None = None, accept_array: bool = False,
                  kind: str = "JSON document", lengths: dict[str, Any] | None = None,
                  element_type: Any = None) -> Iterator[Event]:
    """Stream the top-level object of ``path``, decoding ``array_key`` one element at a time.

    ``parse_float`` is passed to the JSON decoder (``str`` keeps the literal text, for exact
    decimal arithmetic). With ``accept_array`` a top-level array is read as the array itself
    (Chrome's JSON array format). ``kind`` names what the file should be, in error messages.
    ``lengths``, when given, receives ``array_key`` -> element count once the array is read
    (an empty array yields no event, so this is how to tell it from a missing one).

    ``element_type`` (a ``msgspec.Struct`` class) makes elements come, where they can, as
    instances of it: msgspec decodes only the fields it declares and skips the rest, several
    times faster than building every dict. An element that does not fit the type (a field
    of another type, a missing required field) comes as the plain decoded value instead, so
    the caller takes both: the type is a fast path, never a filter.
    """
    return _events(path, _Options(array_key, parse_float, accept_array, kind, lengths, None, False,
                                  _typed_decoder(element_type, parse_float)))


def _typed_decoder(element_type: Any, parse_float: Callable[[str], Any] | None) -> Any:
    """msgspec's decoder of a list of ``element_type``; a float in a field of type Any goes
    to ``parse_float`` as its literal text, as with the stdlib decoder."""
    if element_type is None or _msgspec is None:
        return None
    return _msgspec.json.Decoder(list[element_type], float_hook=parse_float)


def read_document(path: str | os.PathLike[str], on_item: Callable[[Any], None], array_key: str, *,
                  parse_float: Callable[[str], Any] | None = None, accept_array: bool = False,
                  kind: str = "JSON document", objects_only: bool = False,
                  element_type: Any = None) -> dict[str, Any]:
    """Call ``on_item`` for each element of ``array_key`` in file order (only the JSON objects
    with ``objects_only``) and return the other top-level keys, plus ``array_key`` mapped to
    the number of elements when the array was there. The other options are those of
    :func:`iter_document`; this is the faster way when every element goes to one function."""
    fields: dict[str, Any] = {}
    opts = _Options(array_key, parse_float, accept_array, kind, fields, on_item, objects_only,
                    _typed_decoder(element_type, parse_float))
    for _, key, value in _events(path, opts):
        fields[key] = value
    return fields


@dataclass(frozen=True)
class _Options:
    array_key: str
    parse_float: Callable[[str], Any] | None
    accept_array: bool
    kind: str
    lengths: dict[str, Any] | None
    on_item: Callable[[Any], None] | None  # elements go here instead of being yielded
    objects_only: bool                     # with on_item: pass only the JSON objects
    typed: Any = None                      # msgspec decoder of a list of element_type


def _events(path: str | os.PathLike[str], o: _Options) -> Iterator[Event]:
    where = str(path)
    src = open_source(path)
    try:
        t = _Text(src, where, o.kind, o.parse_float)
        first = t.peek()
        if first == "{":
            t.pos += 1
            yield from _object(t, o)
        elif first == "[" and o.accept_array:
            yield from _array(t, o)
        elif first == "":
            raise EchoError(f"{where}: empty file")
        elif first == "[":
            raise EchoError(f"{where}: expected a JSON object, found an array; not a {o.kind}")
        else:
            raise EchoError(f"{where}: not JSON (starts with {first!r}); not a {o.kind}")
        if t.peek() != "":
            t.fail("extra data after the JSON document")
    except RecursionError:  # the decoders recurse once per nesting level
        raise EchoError(f"{where}: JSON nested too deeply to read (thousands of levels); not a {o.kind}") from None
    finally:
        src.close()


def _object(t: _Text, o: _Options) -> Iterator[Event]:
    if t.peek() == "}":
        t.pos += 1
        return
    while True:
        if t.peek() != '"':
            t.fail("expected a key string in the top-level object")
        key = t.value()
        t.expect(":", f"after key {key!r}")
        if key == o.array_key and t.peek() == "[":
            yield from _array(t, o)
        else:
            yield ("field", key, t.value())
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


# A line holding only the end of one element and the separator, then a line opening the next:
# where pretty-printed profiler JSON (Kineto, host ETs) puts its element boundaries.
_LINE_BOUNDARY = re.compile(r"\n[ \t]*\}[ \t]*,[ \t]*\r?\n[ \t]*(?=\{)")
_BATCH_CHARS = 1 << 20
_BATCH_TRIES = 3


def _batch(t: _Text, o: _Options) -> tuple[list, bool] | None:
    """Several whole elements at once, decoded by orjson (several times faster than the
    stdlib scanner), or None when no batch can be cut here.

    A batch ends at the last element boundary the text seems to have (a line-pretty
    boundary, see ``_LINE_BOUNDARY``); ``"[" + batch + "]"`` decoding as a JSON array proves
    the cut is a real boundary (a JSON parser is deterministic: the same prefix of the array
    leaves it in the same state, and only the state "between elements" accepts "]"). The flag
    says whether the typed decoder made them (then every one is an object). A cut
    that does not decode (a guess inside an element, or text orjson refuses: NaN, integers
    beyond 64 bits) is never used: the caller decodes element by element instead."""
    if len(t.buf) - t.pos < _BATCH_CHARS and not t.eof:
        t.fill()
    buf, pos = t.buf, t.pos
    # orjson cannot keep floats as text (parse_float): then only a typed decoder batches.
    generic = o.parse_float is None and _orjson is not None
    if not (generic or o.typed is not None) or len(buf) - pos < 4096:
        return None
    ends = [m for m in _LINE_BOUNDARY.finditer(buf, max(pos, len(buf) - (64 << 10)))]
    if not ends:
        ends = [m for m in _LINE_BOUNDARY.finditer(buf, pos)][-_BATCH_TRIES:]
    for m in reversed(ends[-_BATCH_TRIES:]):
        end = buf.rindex("}", m.start(), m.end()) + 1
        text = "[" + buf[pos:end] + "]"
        if o.typed is not None:
            try:
                items = o.typed.decode(text)
                t.pos = m.end()
                return items, True
            except _msgspec.DecodeError:  # a bad cut, or elements that do not fit the type
                pass
        if not generic:
            continue
        try:
            items = _orjson.loads(text)
        except _orjson.JSONDecodeError:
            continue
        t.pos = m.end()
        return items, False
    return None


def _array(t: _Text, o: _Options) -> Iterator[Event]:
    """Consume the ``[...]`` of the streamed array (a trailing comma is tolerated)."""
    key, on_item, objects_only = o.array_key, o.on_item, o.objects_only
    t.expect("[", f"to open {key}")
    n = 0
    if t.peek() == "]":
        t.pos += 1
    else:
        scan = t.scan
        sep = _SEP.match
        slow_until = 0   # after a batch that would not cut, decode one by one up to here
        while True:
            if t.pos + t.dropped >= slow_until:
                got = _batch(t, o)
                if got is None:
                    slow_until = t.dropped + len(t.buf)
                else:
                    items, typed = got
                    n += len(items)
                    if on_item is None:
                        for item in items:
                            yield ("item", key, item)
                    elif objects_only and not typed:
                        for item in items:
                            if type(item) is dict:
                                on_item(item)
                    else:
                        for item in items:
                            on_item(item)
                    continue
            # Fast path: a whole element and its separator inside the buffer (a separator after
            # it also proves that a number was not cut short by the end of the buffer).
            buf = t.buf
            try:
                item, end = scan(buf, t.pos)
                m = sep(buf, end)
            except (StopIteration, json.JSONDecodeError):
                m = None
            fast = m is not None and m.end() < len(buf) and buf[m.end()] != "]"
            if fast:
                t.pos = m.end()  # type: ignore[union-attr]
            else:
                item = t.value()
            n += 1
            if on_item is None:
                yield ("item", key, item)
            elif not objects_only or type(item) is dict:
                on_item(item)
            if fast:
                continue
            c = t.peek()
            if c == ",":
                t.pos += 1
                if t.peek() == "]":
                    t.pos += 1
                    break
                continue
            if c == "]":
                t.pos += 1
                break
            if not c:
                t.fail(f"text ends inside {key} (truncated file?)")
            t.fail(f"expected ',' or ']' between {key} elements, found {c!r}")
    if o.lengths is not None:
        o.lengths[key] = n
