"""Element types: their sizes, their canonical names, and every spelling readers meet.

One table for the whole package. Spellings seen in the wild:

- PyTorch: ``torch.bfloat16`` (Python), ``c10::BFloat16`` / ``c10::Half`` (C++ type names in
  Kineto ``Input type`` and host-ET ``Tensor(c10::Half)``), ``BFloat16`` / ``Float`` /
  ``Long`` (c10 ScalarType names, what ``record_param_comms`` calls ``dtype``), C types
  (``float``, ``long int``, ``unsigned char``, ``c10::complex<float>``);
- Kineto NCCL kernel names (``..._bf16_...``, ``_f32_``, ``_int8_t_``) and ``dtype`` args;
- nccl-tests ``type`` column: ``float``, ``half``, ``bfloat16``, ``int8``, ``uint8``,
  ``int32``, ``int64``, ``double``, ``f8e4m3`` ...;
- short forms (``fp16``, ``bf16``, ``f32``, ``i64``) and float8 variants.

A spelling is matched case-insensitively, without ``torch.`` / ``c10::`` prefixes, without
``_``, ``-`` and spaces, and with a ``Tensor(...)`` wrapper removed.
"""

from __future__ import annotations

from functools import lru_cache

# canonical name (torch's, without "torch.") -> bytes per element
SIZES: dict[str, int] = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "complex32": 4, "complex64": 8, "complex128": 16,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "qint8": 1, "quint8": 1, "qint32": 4,
}

# normalised spelling (see _key) -> canonical name
_SPELLINGS: dict[str, str] = {
    **{k.replace("_", ""): k for k in SIZES},
    # floats
    "float": "float32", "f32": "float32", "fp32": "float32",
    "double": "float64", "f64": "float64", "fp64": "float64",
    "half": "float16", "f16": "float16", "fp16": "float16",
    "bf16": "bfloat16",
    # integers (C, c10 ScalarType and short names)
    "long": "int64", "longint": "int64", "longlong": "int64", "int64t": "int64", "i64": "int64",
    "int": "int32", "int32t": "int32", "i32": "int32",
    "short": "int16", "shortint": "int16", "int16t": "int16", "i16": "int16",
    "char": "int8", "signedchar": "int8", "int8t": "int8", "i8": "int8",
    "uint64t": "uint64", "u64": "uint64", "unsignedlong": "uint64",
    "uint32t": "uint32", "u32": "uint32", "unsignedint": "uint32",
    "uint16t": "uint16", "u16": "uint16",
    "byte": "uint8", "unsignedchar": "uint8", "uint8t": "uint8", "u8": "uint8",
    # complex
    "complexhalf": "complex32", "complex<half>": "complex32",
    "complexfloat": "complex64", "complex<float>": "complex64", "cfloat": "complex64",
    "complexdouble": "complex128", "complex<double>": "complex128", "cdouble": "complex128",
    # float8 (nccl-tests and NCCL kernel names shorten them)
    "fp8e4m3": "float8_e4m3fn", "f8e4m3": "float8_e4m3fn", "float8e4m3": "float8_e4m3fn",
    "fp8e5m2": "float8_e5m2", "f8e5m2": "float8_e5m2",
}


# canonical name -> c10 ScalarType name (what record_param_comms and the host ET call it)
C10_NAMES: dict[str, str] = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
    "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64", "bool": "Bool",
    "complex32": "ComplexHalf", "complex64": "ComplexFloat", "complex128": "ComplexDouble",
    "float8_e4m3fn": "Float8_e4m3fn", "float8_e5m2": "Float8_e5m2",
    "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz",
    "qint8": "QInt8", "quint8": "QUInt8", "qint32": "QInt32",
}


def _key(spelling: str) -> str:
    s = spelling.strip()
    if s.startswith("Tensor(") and s.endswith(")"):
        s = s[len("Tensor("):-1]
    s = s.lower()
    if s.startswith("torch."):
        s = s[len("torch."):]
    return s.replace("c10::", "").replace("_", "").replace("-", "").replace(" ", "")


@lru_cache(maxsize=4096)
def canonical_dtype(spelling: str | None) -> str | None:
    """The canonical (torch) name of any known spelling, None when unknown or empty."""
    if not spelling:
        return None
    return _SPELLINGS.get(_key(spelling))


def dtype_size(spelling: str | None) -> int | None:
    """Bytes per element of any known spelling, None when unknown or empty."""
    name = canonical_dtype(spelling)
    return SIZES[name] if name is not None else None


def c10_name(spelling: str | None) -> str | None:
    """The c10 ScalarType name (``Float``, ``BFloat16``, ``Long``) of any known spelling."""
    name = canonical_dtype(spelling)
    return C10_NAMES[name] if name is not None else None
