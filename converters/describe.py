"""What a file that no reader recognises holds, in a few words: so that "cannot tell the
format" says what was found (``text starting with 'garbage'``, ``a JSON object with keys
command, layers``, ``gzip data that does not decompress``), and which of a folder's files are
metadata beside the traces (a ``run.json``), not traces."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

_HEAD = 1 << 16
_SMALL_JSON = 1 << 20            # metadata files are small; a trace this size would be huge
_TRACE_KEYS = ("traceEvents", "deviceProperties", "nodes", "schema", "schemaVersion")


def _head(path: Path) -> tuple[bytes, str]:
    """The first bytes of ``path`` (decompressed when gzip) and what wraps them."""
    with open(path, "rb") as f:
        raw = f.read(_HEAD)
    if raw[:2] != b"\x1f\x8b":
        return raw, ""
    try:
        with gzip.open(path, "rb") as g:
            return g.read(_HEAD), "gzip of "
    except (OSError, EOFError, zlib.error):
        return b"", "gzip data that does not decompress"


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= 30 else text[:27] + "...")


def describe(path: Path) -> str:
    """A few words on what ``path`` holds (never raises for a readable file)."""
    try:
        head, wrap = _head(path)
    except OSError as e:
        return f"a file that cannot be read ({e.strerror or e})"
    if wrap and not head:
        return wrap if wrap.startswith("gzip data") else wrap + "an empty file"
    if not head:
        return "an empty file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:   # a character cut at the end of the head is still text
        text = head[:e.start].decode("utf-8") if e.start >= len(head) - 3 else ""
    if not text or any(c < " " and c not in "\t\n\r" for c in text[:256]):
        return f"{wrap}binary data starting with {head[:8].hex(' ')}"
    stripped = text.lstrip()
    if stripped[:1] in "{[":
        obj = _small_json(path, wrap)
        if isinstance(obj, dict):
            keys = sorted(str(k) for k in obj)
            shown = ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")
            return f"{wrap}a JSON object with keys {shown or '(none)'}, none a trace's"
        if isinstance(obj, list):
            return f"{wrap}a JSON array of {len(obj)} items, not trace events"
        return f"{wrap}text starting like JSON ({_shown(stripped)}) that does not parse"
    return f"{wrap}text starting with {_shown(stripped)}"


def _small_json(path: Path, wrap: str) -> object:
    """The JSON value of a small file, else None."""
    try:
        if path.stat().st_size > _SMALL_JSON:
            return None
        data = gzip.decompress(path.read_bytes()) if wrap else path.read_bytes()
        if len(data) > _SMALL_JSON:
            return None
        return json.loads(data)
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):
        return None


def is_metadata(path: Path) -> bool:
    """A small plain JSON object with none of the keys a trace starts with: what a tool writes
    beside its traces (``run.json``), skipped when a folder is read."""
    if not path.name.endswith(".json"):
        return False
    obj = _small_json(path, "")
    return isinstance(obj, dict) and not any(k in obj for k in _TRACE_KEYS)
