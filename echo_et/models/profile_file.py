"""How every model profile is written and read. Written: deterministic JSON (sorted keys,
numbers rounded to a fixed number of significant digits, no paths or timestamps), replaced
atomically; one home for the collective and the compute profiles alike, so the same fit gives
the same bytes. Read (:func:`read_model_json`, the compute and collective profiles and the
slowdown model alike): a regular file of bounded size, UTF-8 (a byte-order mark tolerated),
strict JSON (no NaN or Infinity, no key twice in one object; the field named), no number beyond a float64 or
int64, nested at most :data:`MAX_DEPTH` deep; anything else is one EchoError naming the
file, and the field where there is one, before any loader looks at a value."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError

SIGNIFICANT_DIGITS = 6
MAX_MODEL_FILE_BYTES = 64 << 20   # a fitted profile is a few kB; its sources list a few hundred files
MAX_DEPTH = 32                    # the deepest profile nests 5 levels (fit.errors.<collective>.<size>)
_INT_LIMIT = 1 << 63


class _Refused(Exception):
    """Raised from inside ``json.loads`` (its hooks) and turned into one EchoError."""


class _Constant:
    """``NaN``, ``Infinity`` or ``-Infinity`` where a JSON number goes: held until the walk
    that knows the field's name refuses it."""

    def __init__(self, name: str):
        self.name = name


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"key {_shown(k)} appears twice in one object (which one is meant?)")
        out[k] = v
    return out


def _shown(value: Any, limit: int = 40) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def field_name(path: tuple[Any, ...]) -> str:
    """``params.ring.bw`` or ``sources[3].sha256``: a field as messages name it."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "the top level"


def _check_values(doc: Any, where: str) -> None:
    """Refuse a number no float64 or int64 field holds, and nesting beyond MAX_DEPTH, naming the
    field (iteratively: the document may be a thousand levels deep)."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        path, v = stack.pop()
        if len(path) > MAX_DEPTH:
            name = field_name(path[:MAX_DEPTH])
            name = name if len(name) <= 40 else name[:37] + "..."
            raise EchoError(f"{where}: {name} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, dict):
            stack.extend(((*path, k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend(((*path, i), x) for i, x in reversed(list(enumerate(v))))
        elif isinstance(v, _Constant):
            raise EchoError(f"{where}: {field_name(path)} = {v.name}: not a JSON number (write a finite number)")
        elif isinstance(v, float) and not math.isfinite(v):
            raise EchoError(f"{where}: {field_name(path)} is beyond a float64 (write a finite number)")
        elif isinstance(v, int) and not isinstance(v, bool) and not -_INT_LIMIT <= v < _INT_LIMIT:
            raise EchoError(f"{where}: {field_name(path)} = {_shown(v)} is beyond a 64-bit integer")


def read_model_json(path: str | os.PathLike[str], where: str, what: str) -> Any:
    """The JSON document of the model file ``path`` (``what``: "compute profile", ...),
    checked as the module docstring says; errors start with ``where`` (the file as the
    message names it)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise EchoError(f"{where}: no such {what}") from None
    except OSError as e:
        raise EchoError(f"{where}: cannot read the {what} ({e.strerror or type(e).__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise EchoError(f"{where}: is a folder, not a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise EchoError(f"{where}: not a regular file (a pipe or a device), not a {what}")
    if st.st_size > MAX_MODEL_FILE_BYTES:
        raise EchoError(f"{where}: {st.st_size:,} bytes; a {what} is at most {MAX_MODEL_FILE_BYTES:,}")
    try:
        data = p.read_bytes()[:MAX_MODEL_FILE_BYTES + 1]
    except OSError as e:
        raise EchoError(f"{where}: cannot read the {what} ({e.strerror or type(e).__name__})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise EchoError(f"{where}: not a JSON {what} (not UTF-8 text: byte {e.start})") from None
    try:
        doc = json.loads(text, parse_constant=_Constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise EchoError(f"{where}: not a JSON {what} ({e.msg} at line {e.lineno} column {e.colno})") from None
    except _Refused as e:
        raise EchoError(f"{where}: not a JSON {what}: {e}") from None
    except RecursionError:
        raise EchoError(f"{where}: not a {what}: nested too deeply to read (thousands of levels)") from None
    except ValueError as e:   # an integer of more than 4,300 digits
        raise EchoError(f"{where}: not a JSON {what} ({str(e).split(';')[0]})") from None
    _check_values(doc, where)
    return doc


def rounded(obj: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """``obj`` with every float rounded to ``digits`` significant digits (tuples become lists)."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [rounded(v, digits) for v in obj]
    return obj


def dumps_profile(obj: dict[str, Any]) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_profile_json(obj: dict[str, Any], path: str | Path) -> None:
    from echo_et.ir.io import atomic_file

    data = dumps_profile(obj).encode("utf-8")
    with atomic_file(path) as f:
        f.write(data)


__all__ = ["MAX_DEPTH", "MAX_MODEL_FILE_BYTES", "SIGNIFICANT_DIGITS", "dumps_profile", "field_name",
           "read_model_json", "rounded", "write_profile_json"]
