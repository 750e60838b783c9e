"""Sizes, rates and latencies as people type them: the one parser of each for every verb.

A size is bytes: ``4096``, ``64MiB``, ``1GB``. ``kB``/``KB``, ``MB``, ``GB``, ``TB``, ``PB`` are SI
(powers of 1000), ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB`` IEC (powers of 1024); a bare
prefix (``500M``) is refused as ambiguous, and ``Gb`` (bits) is refused for a size.

A bandwidth always has a unit: ``150GB/s`` (bytes), ``800Gb/s`` or ``800Gbps`` (bits),
``25GiB/s``; per GPU, or ``/node`` (``per node``) for a node's total shared by its GPUs. A
bare number is refused: it was GB/s per GPU once, and a user meaning Gb/s per node got 64x
the rate without a word. A rate above any link that exists or below a bit per second is
refused naming the bound, as is a latency below a nanosecond or above a second.

Everything is exact: ``1.5KiB`` is 1536 bytes, a numeral of 400 digits is "too large", never
an ``OverflowError``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_BANDWIDTH_GBPS, MAX_BYTES

# A numeral longer than this is refused before it is read (it is either a typo or an attack).
MAX_NUMERAL_CHARS = 40
MIN_BANDWIDTH_GBPS = 1.25e-10   # one bit per second, in GB/s
MIN_LATENCY_NS = 1.0            # the IR's time resolution; light crosses 30 cm in it
MAX_LATENCY_NS = 1e9            # one second per hop is no network link

_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_IEC = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_SIZE = re.compile(rf"^(?P<num>{_NUMBER})\s*(?P<prefix>[kKmMgGtTpP][iI]?)?(?P<unit>B|b|bytes?|bits?)?$")

SIZE_EXAMPLES = "4096, 4KiB, 64MiB, 1GB (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024)"
RATE_EXAMPLES = ("150GB/s, 800Gb/s or 800Gbps (bits), 25GiB/s; per GPU, or /node for a node's "
                 "total (800Gb/s/node)")


def _number(text: str, numeral: str) -> Fraction:
    if len(numeral) > MAX_NUMERAL_CHARS:
        raise EchoError(f"{_shown(text)}: number too large ({len(numeral)} characters)")
    mant, _, exp = numeral.lower().partition("e")
    if exp and abs(int(exp)) > 400:
        raise EchoError(f"{_shown(text)}: exponent {exp} out of range")
    return Fraction(mant) * Fraction(10) ** int(exp or 0)


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def _scale(prefix: str) -> int:
    p = prefix.lower()
    return _IEC[p] if p in _IEC else _SI[p]


def _canon(prefix: str) -> str:
    """A prefix as written in these docs: ``k``, ``M``, ``Gi``..."""
    p = prefix.lower()
    return "k" if p == "k" else p[:1].upper() + p[1:]


# -- sizes ----------------------------------------------------------------------------------------
def parse_bytes(text: str, *, lo: int = 0, hi: int = MAX_BYTES) -> int:
    """Bytes in ``text`` (``4096``, ``64MiB``, ``1GB``), within ``[lo, hi]``."""
    s = str(text).strip()
    if s.startswith("-"):
        raise EchoError(f"{_shown(s)} is out of range ({format_bytes(lo)} .. {format_bytes(hi)})")
    m = _SIZE.match(s)
    if not m:
        raise EchoError(f"{_shown(s)} is not a size (e.g. {SIZE_EXAMPLES})")
    prefix, unit = m.group("prefix") or "", m.group("unit") or ""
    if unit == "b" or unit.startswith("bit"):
        raise EchoError(f"{_shown(s)} is in bits; a size is in bytes (e.g. {m.group('num')}{_canon(prefix)}B)")
    if prefix.lower().endswith("i") and not unit:
        raise EchoError(f"{_shown(s)}: unit missing (e.g. {m.group('num')}{_canon(prefix)}B)")
    if prefix and not unit:
        si, iec = _canon(prefix[0]), _canon(prefix[0] + "i")
        raise EchoError(f"{_shown(s)} is ambiguous: write {m.group('num')}{si}B (x{_SI[si.lower()]}) or "
                        f"{m.group('num')}{iec}B (x{_IEC[iec.lower()]})")
    value = _number(s, m.group("num")) * _scale(prefix)
    if value.denominator != 1:
        raise EchoError(f"{_shown(s)} is not a whole number of bytes")
    n = int(value)
    if not lo <= n <= hi:
        raise EchoError(f"{_shown(s)} is out of range ({format_bytes(lo)} .. {format_bytes(hi)})")
    return n


def parse_byte_list(text: str, *, lo: int = 0, hi: int = MAX_BYTES) -> list[int]:
    """A comma-separated list of sizes: ``4KiB,1MiB,64MiB``."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise EchoError(f"{_shown(text)}: no sizes given")
    return [parse_bytes(p, lo=lo, hi=hi) for p in parts]


def format_bytes(n: int) -> str:
    """``n`` bytes in the largest IEC unit that divides it (``64MiB``), else ``n`` and ``B``."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


# -- bandwidths -----------------------------------------------------------------------------------
_RATE = re.compile(
    rf"^(?P<num>{_NUMBER})\s*(?P<prefix>[kKmMgGtTpP][iI]?)?"
    r"(?P<unit>B/s|b/s|Bps|bps|bits?/s|bytes?/s)?"
    r"\s*(?:(?:/|\s+per\s+)(?P<per>[A-Za-z]+))?$")
_PER = ("gpu", "node")


class Bandwidth:
    """A bandwidth as given: ``gbps`` in GB/s (10**9 bytes per second) and whether it is the
    rate of one GPU or of a whole node (shared by its GPUs)."""

    __slots__ = ("gbps", "per", "text")

    def __init__(self, gbps: float, per: str = "gpu", text: str = ""):
        if per not in _PER:
            raise EchoError(f"bandwidth per {per!r}: expected gpu or node")
        self.gbps = check_gbps(gbps, text or f"{gbps!r} GB/s")
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


def check_gbps(gbps: float, what: str) -> float:
    """``gbps`` (GB/s) as a float between a bit per second and the fastest link there is."""
    if isinstance(gbps, bool) or not isinstance(gbps, int | float) or math.isnan(gbps):
        raise EchoError(f"{what}: a bandwidth must be a number of GB/s")
    if not gbps >= MIN_BANDWIDTH_GBPS:
        raise EchoError(f"{what} is below 1 bit/s ({MIN_BANDWIDTH_GBPS:g} GB/s), the slowest rate accepted")
    if not gbps <= MAX_BANDWIDTH_GBPS:
        raise EchoError(f"{what} is above {MAX_BANDWIDTH_GBPS:g} GB/s (1 PB/s), faster than any link "
                        "that exists")
    return float(gbps)


def parse_bandwidth(text: str) -> Bandwidth:
    """A bandwidth in ``text``: ``150GB/s``, ``800Gb/s/node``, ``100 Gbps``, ``25GiB/s/gpu``.
    ``B`` is bytes and ``b`` bits (case matters for that letter only); without ``/node`` a
    rate is per GPU. A bare number is refused with the units accepted."""
    s = str(text).strip()
    m = _RATE.match(s)
    if not m:
        raise EchoError(f"{_shown(s)} is not a bandwidth (e.g. {RATE_EXAMPLES})")
    prefix, unit = m.group("prefix") or "", m.group("unit")
    per = (m.group("per") or "gpu").lower()
    if per not in _PER:
        raise EchoError(f"{_shown(s)}: a bandwidth is per gpu or per node, not per {per!r} "
                        f"(e.g. {RATE_EXAMPLES})")
    if unit is None:
        missing = f"unit missing after {prefix!r}" if prefix else "a bare number has no unit"
        raise EchoError(f"{_shown(s)}: {missing}; give one, e.g. {RATE_EXAMPLES}")
    bits = unit[0] == "b" and not unit.startswith("byte")      # b/s, bps, bit/s
    value = _number(s, m.group("num")) * _scale(prefix) / (8 if bits else 1)
    if value > Fraction(MAX_BANDWIDTH_GBPS) * 10**9 or value < 1 / Fraction(8):  # exact, before rounding
        check_gbps(math.inf if value > 1 else 0.0, _shown(s))
    return Bandwidth(max(MIN_BANDWIDTH_GBPS, float(value / 10**9)), per, s)


# -- latencies ------------------------------------------------------------------------------------
def check_latency_ns(value: float, what: str = "latency") -> float:
    """A link latency in ns: 0 (an ideal link, on purpose) or between a nanosecond and a
    second; anything else (5e-324, 1e30, NaN) is a mistake, refused naming the bound."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise EchoError(f"{what} = {value!r}: expected a number of ns")
    if value == 0:
        return 0.0
    if value < 0:
        raise EchoError(f"{what} = {value!r} ns: must not be negative")
    if value < MIN_LATENCY_NS:
        raise EchoError(f"{what} = {value!r} ns is below {MIN_LATENCY_NS:g} ns, the shortest link latency "
                        "accepted (0 for an ideal link)")
    if value > MAX_LATENCY_NS:
        raise EchoError(f"{what} = {value!r} ns is above {MAX_LATENCY_NS:g} ns (1 s), longer than any "
                        "link's latency")
    return float(value)
