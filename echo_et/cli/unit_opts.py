"""Options that carry a size (``--bytes``, ``--param-bytes``, ``--max-memory``,
``--memory-limit``): every one read by :func:`echo_et.ir.units.parse_bytes`, so ``1GB`` is
10**9 bytes and ``1GiB`` 2**30 in every verb."""

from __future__ import annotations

from echo_et.errors import EchoError, OptionError
from echo_et.ir.limits import MAX_BYTES


def size_option(text: str | None, option: str, *, lo: int = 0, hi: int = MAX_BYTES) -> int | None:
    """Bytes of a size option (None when not given); a bad value is an OptionError of
    ``option`` (the library's name: ``param_bytes``)."""
    if text is None:
        return None
    from echo_et.ir.units import parse_bytes

    try:
        return parse_bytes(text, lo=lo, hi=hi)
    except EchoError as e:
        raise OptionError(option, str(e)) from None


def size_list_option(text: str, option: str, *, lo: int = 0, hi: int = MAX_BYTES) -> list[int]:
    """Bytes of a comma-separated size option (``4KiB,1MiB``)."""
    from echo_et.ir.units import parse_byte_list

    try:
        return parse_byte_list(text, lo=lo, hi=hi)
    except EchoError as e:
        raise OptionError(option, str(e)) from None
