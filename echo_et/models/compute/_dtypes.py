"""Bytes per element of the dtype spellings traces use, and the math class of each dtype.

Private stand-in: the project's single home for dtype sizes is being created as
``echo_et.ir.dtypes`` (issue 15); switch :func:`element_size` to it when it lands
(``echo_et.passes.dtypes`` holds the same table, but models may not import passes).
"""

from __future__ import annotations

_SIZES = {
    "double": 8, "float64": 8, "torch.float64": 8,
    "float": 4, "float32": 4, "torch.float32": 4,
    "c10::half": 2, "half": 2, "float16": 2, "torch.float16": 2,
    "c10::bfloat16": 2, "bfloat16": 2, "torch.bfloat16": 2,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2fnuz": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "long int": 8, "long": 8, "int64": 8, "torch.int64": 8,
    "int": 4, "int32": 4, "torch.int32": 4, "unsigned int": 4,
    "short int": 2, "short": 2, "int16": 2,
    "signed char": 1, "unsigned char": 1, "int8": 1, "uint8": 1, "bool": 1, "torch.bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}


def element_size(dtype: str, default: int = 4) -> int:
    """Bytes of one element; ``default`` for an unknown or empty spelling."""
    return _SIZES.get(dtype.strip().lower(), default)


def is_known(dtype: str) -> bool:
    return dtype.strip().lower() in _SIZES


def math_class(dtype: str) -> str:
    """"fp64", "fp32", "fp16", "bf16" or "fp8": which peak a matrix op of this dtype uses."""
    d = dtype.strip().lower()
    if "bfloat16" in d:
        return "bf16"
    if "float8" in d:
        return "fp8"
    if d in ("double", "float64", "torch.float64"):
        return "fp64"
    if d in ("c10::half", "half", "float16", "torch.float16"):
        return "fp16"
    return "fp32"
