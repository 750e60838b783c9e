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


# -- bandwidths ---------------------------------------------------------------------------------
# Rates as people state them: "150GB/s" (bytes), "800Gb/s" or "800Gbps" (bits), "/node" or
# "/gpu" after the unit. Prefixes are decimal (G = 1e9), binary with "i" (GiB/s = 2**30 B/s).
_RATE_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_RATE = re.compile(
    r"^\s*(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)\s*"
    r"(?:(?P<prefix>[kKMGT]i?)?(?P<unit>B/s|b/s|bps|Bps|bit/s|byte/s))?"
    r"\s*(?:(?:/|\s+per\s+)(?P<per>gpu|node))?\s*$", re.IGNORECASE)
_PER = ("gpu", "node")


class Bandwidth:
    """A bandwidth as given: ``gbps`` in GB/s (10**9 bytes per second) and whether it is the
    rate of one GPU or of a whole node (shared by its GPUs)."""

    __slots__ = ("gbps", "per", "text")

    def __init__(self, gbps: float, per: str = "gpu", text: str = ""):
        if per not in _PER:
            raise EchoError(f"bandwidth per {per!r}: expected gpu or node")
        self.gbps = float(gbps)
        self.per = per
        self.text = text or f"{gbps:g}GB/s/{per}"

    def per_gpu(self, gpus_per_node: int | None) -> float:
        """GB/s per GPU; a per-node rate is split evenly over ``gpus_per_node`` GPUs."""
        if self.per == "gpu":
            return self.gbps
        if not gpus_per_node or gpus_per_node < 1:
            raise EchoError(f"bandwidth {self.text!r} is per node: the GPUs per node must be known "
                            "to share it")
        return self.gbps / gpus_per_node

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bandwidth) and (self.gbps, self.per) == (other.gbps, other.per)

    def __hash__(self) -> int:
        return hash((self.gbps, self.per))

    def __repr__(self) -> str:
        return f"Bandwidth({self.gbps:g} GB/s per {self.per})"


def parse_bandwidth(text: str) -> Bandwidth:
    """A bandwidth in ``text``: ``150GB/s``, ``800Gb/s/node``, ``100 Gbps``, ``25GiB/s/gpu``,
    ``150`` (a bare number is GB/s per GPU). ``B`` is bytes and ``b`` bits (case matters for
    that letter only); without ``/node`` a rate is per GPU."""
    s = str(text).strip()
    m = _RATE.match(s)
    if not m:
        raise EchoError(f"{text!r} is not a bandwidth (e.g. 150GB/s, 800Gb/s/node, 100Gbps, "
                        "or a bare number of GB/s per GPU)")
    value = float(m.group("num"))
    unit, prefix = m.group("unit"), m.group("prefix") or ""
    if unit is None:
        if prefix:
            raise EchoError(f"{text!r}: unit missing after {prefix!r} (e.g. {prefix}B/s)")
        gbps = value
    else:
        p = prefix[0].upper() + prefix[1:].lower() if prefix else ""
        if p == "K":
            p = "k"
        scale = _RATE_PREFIX[p]
        bits = unit[0] == "b" and unit.lower() != "byte/s"     # b/s, bps, bit/s
        gbps = value * scale / (8.0 if bits else 1.0) / 1e9
    if not gbps > 0 or gbps == float("inf"):
        raise EchoError(f"{text!r}: a bandwidth must be > 0")
    per = (m.group("per") or "gpu").lower()
    return Bandwidth(gbps, per, s)


def format_bandwidth(gbps: float) -> str:
    """GB/s per GPU as text (``150GB/s``)."""
    return f"{gbps:.6g}GB/s"
