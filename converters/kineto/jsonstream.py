"""Kineto's use of the shared streaming JSON reader (:mod:`echo_et.converters.jsonstream`).

A Kineto file is one JSON object whose ``traceEvents`` array holds hundreds of thousands of
small objects; each is decoded on its own and handed to a callback, so only the caller's
compact copy of what it keeps stays alive. Chrome's plain-array format is accepted too.

Floating point literals are kept as their text (``parse_float=str``) so that microsecond
timestamps such as ``4458676522690.655`` convert to integer nanoseconds exactly; a double
cannot hold them to the nanosecond.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from echo_et.converters.jsonstream import open_source as open_text_source
from echo_et.converters.jsonstream import read_document as _read_document

__all__ = ["open_text_source", "read_document"]


def read_document(path: Path, on_event: Callable[[Any], None], element_type: Any = None) -> dict[str, Any]:
    """Call ``on_event`` for each object in ``traceEvents`` in file order and return the other
    top-level keys, with ``traceEvents`` mapped to the number of entries when present. With
    ``element_type`` (a msgspec struct), events come as instances of it where they fit
    (see :func:`echo_et.converters.jsonstream.iter_document`), else as dicts."""
    return _read_document(path, on_event, "traceEvents", objects_only=True, parse_float=str,
                          accept_array=True, kind="Kineto trace", element_type=element_type)
