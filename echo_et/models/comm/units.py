"""Byte sizes as users type them: ``64MiB``, ``1GB``, ``4KiB``, ``512``, ``16M``."""

from __future__ import annotations

import re

from echo_et.errors import EchoError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    # bare K/M/G/T are binary, as in nccl-tests' -b/-e options
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes in ``text``; decimal units (KB, MB, GB) are powers of 1000, binary ones (KiB,
    MiB, GiB and bare K, M, G) powers of 1024. Units are case-insensitive and mean bytes."""
    s = text.strip()
    if s.startswith("-"):
        raise EchoError(f"bytes must be >= 0, got {text!r}")
    m = _SIZE.match(s)
    if not m or m.group(2).lower() not in _UNITS:
        raise EchoError(f"{text!r} is not a byte size (e.g. 4096, 4KiB, 64MiB, 1GB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value != int(value):
        raise EchoError(f"{text!r} is not a whole number of bytes")
    return int(value)


def parse_byte_list(text: str) -> list[int]:
    """A comma-separated list of sizes: ``4KiB,1MiB,64MiB``."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise EchoError(f"{text!r}: no sizes given")
    return [parse_bytes(p) for p in parts]


def format_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"
