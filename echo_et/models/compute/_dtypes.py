"""Element sizes and the math class of a dtype, on top of :mod:`echo_et.ir.dtypes` (the one
home of dtype spellings)."""

from __future__ import annotations

from echo_et.ir.dtypes import canonical_dtype, dtype_size

_MATH = {"float64": "fp64", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
         "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}


def element_size(dtype: str, default: int = 4) -> int:
    """Bytes of one element; ``default`` for an unknown or empty spelling."""
    return dtype_size(dtype) or default


def is_known(dtype: str) -> bool:
    return canonical_dtype(dtype) is not None


def math_class(dtype: str) -> str:
    """"fp64", "fp32", "fp16", "bf16" or "fp8": which peak a matrix op of this dtype uses."""
    return _MATH.get(canonical_dtype(dtype) or "", "fp32")
