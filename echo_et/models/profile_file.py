"""How every model profile is written: deterministic JSON (sorted keys, numbers rounded to
a fixed number of significant digits, no paths or timestamps), replaced atomically. One home
for the collective and the compute profiles alike, so the same fit gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SIGNIFICANT_DIGITS = 6


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


__all__ = ["SIGNIFICANT_DIGITS", "dumps_profile", "rounded", "write_profile_json"]
