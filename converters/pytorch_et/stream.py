"""Streaming reader for one large JSON object whose ``nodes`` array holds most of the data.

PyTorch host execution traces are a single JSON object (``{"schema": ..., "nodes": [...]}``)
that can reach gigabytes. ``json.load`` would hold the text and every node dict at once; this
reader decodes one array element at a time with ``JSONDecoder.raw_decode`` over a sliding
buffer, so memory stays at one node plus whatever the caller keeps. Gzip is detected by its
magic bytes; a ``.gz`` name on a file that is not gzip is refused.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER_CHARS = re.compile(r"[0-9.eE+\-]*")
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"

# What iter_object yields: ("field", key, value) for top-level keys other than the array,
# ("item", key, element) for each element of the streamed array.
Event = tuple[str, str, Any]


def open_text(path: str | os.PathLike[str]) -> io.TextIOBase:
    """The file as UTF-8 text, un-gzipped when it starts with the gzip magic."""
    p = Path(path)
    f = open(p, "rb")  # noqa: SIM115 - ownership passes to the wrapper
    magic = f.read(2)
    f.seek(0)
    if magic == _GZIP_MAGIC:
        raw: io.BufferedIOBase = gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[assignment]
    else:
        if p.name.endswith(".gz"):
            f.close()
            raise EchoError(f"{p}: named .gz but is not gzip-compressed")
        raw = f
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict")


def read_head(path: str | os.PathLike[str], size: int = 1 << 16) -> str:
    """Up to ``size`` characters from the start of the (possibly gzipped) file; '' if unreadable."""
    try:
        with open_text(path) as f:
            return f.read(size)
    except (EchoError, OSError, EOFError, UnicodeDecodeError, zlib.error):
        return ""


class _Scanner:
    def __init__(self, f: io.TextIOBase, where: str):
        self.f = f
        self.where = where
        self.buf = ""
        self.pos = 0
        self.offset = 0          # characters consumed before buf[0]
        self.eof = False
        self.decoder = json.JSONDecoder()

    def fill(self) -> bool:
        """Read more text (at least as much as is buffered, so retries stay linear)."""
        if self.eof:
            return False
        want = max(_CHUNK, len(self.buf) - self.pos)
        chunk = self.f.read(want)
        if not chunk:
            self.eof = True
            return False
        if self.pos:
            self.offset += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += chunk
        return True

    def skip_ws(self) -> str:
        """The next non-space character ('' at EOF), not consumed."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, chars: str, what: str) -> str:
        c = self.skip_ws()
        if not c or c not in chars:
            found = repr(c) if c else "end of file"
            raise self.error(f"expected {what}, found {found}")
        self.pos += 1
        return c

    def value(self) -> Any:
        self.skip_ws()
        while True:
            try:
                v, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if self.fill():
                    continue
                raise self.error(f"invalid JSON ({e.msg})", at=e.pos) from None
            # A number the buffer cuts short ("12." of "12.5") may go on in the next chunk.
            if not self.eof and type(v) in (int, float) and self._number_tail(end) \
                    and self.fill():
                continue
            self.pos = end
            return v

    def _number_tail(self, end: int) -> bool:
        """Whether only number characters follow ``end`` up to the end of the buffer."""
        m = _NUMBER_CHARS.match(self.buf, end)
        return m is not None and m.end() == len(self.buf)

    def error(self, msg: str, at: int | None = None) -> EchoError:
        where = self.offset + (self.pos if at is None else at)
        return EchoError(f"{self.where}: {msg} at character {where}")


def iter_object(path: str | os.PathLike[str], array_key: str = "nodes") -> Iterator[Event]:
    """Stream the top-level object of ``path``, decoding ``array_key`` one element at a time.

    Raises EchoError naming the file for unreadable, truncated or malformed input.
    """
    where = str(path)
    try:
        with open_text(path) as f:
            s = _Scanner(f, where)
            if s.skip_ws() == "":
                raise EchoError(f"{where}: file is empty")
            s.expect("{", "a JSON object")
            if s.skip_ws() == "}":
                s.pos += 1
            else:
                while True:
                    key = s.value()
                    if not isinstance(key, str):
                        raise s.error("expected an object key")
                    s.expect(":", "':'")
                    if key == array_key and s.skip_ws() == "[":
                        s.pos += 1
                        if s.skip_ws() == "]":
                            s.pos += 1
                        else:
                            while True:
                                yield ("item", key, s.value())
                                if s.expect(",]", "',' or ']'") == "]":
                                    break
                    else:
                        yield ("field", key, s.value())
                    if s.expect(",}", "',' or '}'") == "}":
                        break
            if s.skip_ws() != "":
                raise s.error("extra data after the JSON object")
    except EchoError:
        raise
    except UnicodeDecodeError as e:
        raise EchoError(f"{where}: not UTF-8 text ({e.reason})") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise EchoError(f"{where}: corrupt gzip data ({e})") from None
    except EOFError:
        raise EchoError(f"{where}: truncated gzip data") from None
    except OSError as e:
        raise EchoError(f"{where}: cannot read ({e.strerror or e})") from None
