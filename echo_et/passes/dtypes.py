"""Bytes per element of the dtype spellings found in traces (Kineto, host ET, the tracer)."""

from __future__ import annotations

DTYPE_BYTES = {
    "float": 4, "float32": 4, "torch.float32": 4, "double": 8, "float64": 8, "c10::Half": 2,
    "half": 2, "float16": 2, "torch.float16": 2, "c10::BFloat16": 2, "bfloat16": 2,
    "torch.bfloat16": 2, "long int": 8, "int64": 8, "long": 8, "int": 4, "int32": 4,
    "short int": 2, "int16": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "int8": 1,
    "uint8": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}
