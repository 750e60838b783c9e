"""GPU data sheets: the hardware numbers the compute model starts from.

Every number here is a vendor data-sheet (or architecture white-paper) value, never fitted.
Peak FLOP rates are dense (no structured sparsity). ``clock_mhz`` is the boost clock the
data-sheet tensor peak implies (SMs x tensor FLOPs per clock x clock = tensor peak).

Which data sheet a GPU name uses is decided by :mod:`echo_et.models.gpu_variants` (exact
names, SXM/PCIe and memory variants apart).

Sources:
- V100: NVIDIA Tesla V100 GPU data sheet (SXM2) and the Volta architecture white paper
  (80 SMs, 1530 MHz boost; 15.7 TFLOPS FP32, 125 TFLOPS FP16 tensor, 900 GB/s HBM2; 16 or
  32 GB). V100 PCIe, same data sheet: 1380 MHz; 7 FP64, 14 FP32, 112 FP16 tensor TFLOPS.
  V100 has no BF16 or TF32 tensor cores: those dtypes run at the FP32 rate.
- A100: NVIDIA A100 Tensor Core GPU data sheet and architecture white paper
  (108 SMs, 1410 MHz; 19.5 FP32, 156 TF32, 312 FP16/BF16 tensor TFLOPS; 1,555 GB/s HBM2 on
  the 40 GB SXM4, 2,039 GB/s HBM2e on the 80 GB SXM4; 40 MB L2). The PCIe boards, same data
  sheet: the same peaks, 1,555 GB/s (40 GB) and 1,935 GB/s (80 GB).
- H100: NVIDIA H100 Tensor Core GPU data sheet (SXM5) and Hopper white paper (132 SMs;
  67 FP32, 494.7 TF32, 989.4 FP16/BF16, 1,978.9 FP8 tensor TFLOPS dense; 3,350 GB/s HBM3;
  50 MB L2). H100 PCIe, same data sheet: 114 SMs; 26 FP64, 51 FP32, 378 TF32, 756 FP16/BF16,
  1,513 FP8 tensor TFLOPS dense; 2,000 GB/s HBM2e (the tensor peak implies 1620 MHz).
- H800: NVIDIA H800 Tensor Core GPU data sheet (SXM5): the H100 SXM5 compute and HBM3
  (FP64 cut to 1 TFLOPS, NVLink cut to 400 GB/s, which is the comm model's concern).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.limits import checked_float
from echo_et.models.gpu_variants import datasheet_key


@dataclass(frozen=True)
class GpuSpec:
    key: str                      # preset name, e.g. "a100"
    name: str                     # product name
    sm_count: int
    clock_mhz: float
    hbm_gbps: float               # GB/s (1e9 bytes/s)
    memory_gb: float
    l2_mb: float
    peak_tflops: dict[str, float] = field(default_factory=dict)  # fp64, fp32, tf32, fp16, bf16, fp8
    tensor: tuple[str, ...] = ()  # math classes that run on tensor cores
    source: str = ""

    def peak_flops(self, math: str) -> float:
        """Peak FLOP/s for a math class, falling back to the nearest slower class the GPU has
        (BF16 on V100 runs at the FP32 rate, FP8 on A100 at the FP16 rate)."""
        order = {"fp8": ("fp8", "fp16", "fp32"), "fp16": ("fp16", "fp32"), "bf16": ("bf16", "fp32"),
                 "tf32": ("tf32", "fp32"), "fp32": ("fp32",), "fp64": ("fp64", "fp32")}[math]
        for m in order:
            v = self.peak_tflops.get(m)
            if v:
                return v * 1e12
        raise EchoError(f"GPU {self.key}: no peak FLOP rate for {math}")

    def uses_tensor_cores(self, math: str) -> bool:
        return math in self.tensor and bool(self.peak_tflops.get(math))

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.name, "sm_count": self.sm_count, "clock_mhz": self.clock_mhz,
                "hbm_gbps": self.hbm_gbps, "memory_gb": self.memory_gb, "l2_mb": self.l2_mb,
                "peak_tflops": dict(self.peak_tflops), "tensor": list(self.tensor), "source": self.source}

    @staticmethod
    def from_json(obj: dict, where: str) -> GpuSpec:
        """A data sheet from a profile's ``gpu`` block: every field of its type and within what a
        GPU has (one line naming the field otherwise)."""
        def text(key: str, required: bool = True) -> str:
            v = obj.get(key)
            if v is None and not required:
                return ""
            if not isinstance(v, str) or (required and not v.strip()):
                raise EchoError(f"{where}: gpu.{key} must be a non-empty string, got {_shown(v)}")
            return v

        def number(key: str, v: Any, lo: float, hi: float, lo_open: bool = False) -> float:
            return checked_float(v, f"gpu.{key}", lo=lo, hi=hi, lo_open=lo_open, where=where)

        peaks = obj.get("peak_tflops")
        if not isinstance(peaks, dict):
            raise EchoError(f"{where}: gpu.peak_tflops must be an object of TFLOP/s by math class, got {_shown(peaks)}")
        tensor = obj.get("tensor", [])
        if not isinstance(tensor, list) or not all(isinstance(t, str) for t in tensor):
            raise EchoError(f"{where}: gpu.tensor must be a list of math class names, got {_shown(tensor)}")
        sm = obj.get("sm_count")
        if isinstance(sm, bool) or not isinstance(sm, int) or not 1 <= sm <= MAX_SMS:
            raise EchoError(f"{where}: gpu.sm_count must be an integer in 1..{MAX_SMS}, got {_shown(sm)}")
        spec = GpuSpec(key=text("key"), name=text("name"), sm_count=sm,
                       clock_mhz=number("clock_mhz", obj.get("clock_mhz"), 0.0, 1e5, lo_open=True),
                       hbm_gbps=number("hbm_gbps", obj.get("hbm_gbps"), 0.0, 1e6, lo_open=True),
                       memory_gb=number("memory_gb", obj.get("memory_gb", 0), 0.0, 1e6),
                       l2_mb=number("l2_mb", obj.get("l2_mb", 0), 0.0, 1e6),
                       peak_tflops={str(k): number(f"peak_tflops.{k}", v, 0.0, 1e6) for k, v in peaks.items()},
                       tensor=tuple(tensor), source=text("source", required=False))
        if not spec.peak_tflops.get("fp32"):
            raise EchoError(f"{where}: 'gpu' needs peak_tflops.fp32 > 0")
        return spec


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


MAX_SMS = 100_000   # streaming multiprocessors of one GPU (an H100 has 132)


_A100 = dict(sm_count=108, clock_mhz=1410.0, l2_mb=40.0,
             peak_tflops={"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
             tensor=("tf32", "fp16", "bf16"))
_V100 = dict(sm_count=80, hbm_gbps=900.0, l2_mb=6.0, tensor=("fp16",))
_V100_SXM2 = dict(clock_mhz=1530.0, peak_tflops={"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
                  source="NVIDIA Tesla V100 data sheet (SXM2); Volta white paper", **_V100)
_V100_PCIE = dict(clock_mhz=1380.0, peak_tflops={"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
                  source="NVIDIA Tesla V100 data sheet (PCIe); Volta white paper", **_V100)
_H100 = dict(sm_count=132, clock_mhz=1830.0, l2_mb=50.0, hbm_gbps=3350.0, memory_gb=80.0,
             tensor=("tf32", "fp16", "bf16", "fp8"))

DATASHEETS: dict[str, GpuSpec] = {
    "v100": GpuSpec("v100", "Tesla V100-SXM2-32GB", memory_gb=32.0, **_V100_SXM2),  # type: ignore[arg-type]
    "v100-16gb": GpuSpec("v100-16gb", "Tesla V100-SXM2-16GB", memory_gb=16.0, **_V100_SXM2),  # type: ignore[arg-type]
    "v100-pcie": GpuSpec("v100-pcie", "Tesla V100-PCIE-16GB", memory_gb=16.0, **_V100_PCIE),  # type: ignore[arg-type]
    "v100-pcie-32gb": GpuSpec("v100-pcie-32gb", "Tesla V100-PCIE-32GB", memory_gb=32.0,
                              **_V100_PCIE),  # type: ignore[arg-type]
    "a100": GpuSpec("a100", "A100-SXM4-40GB", hbm_gbps=1555.0, memory_gb=40.0,
                    source="NVIDIA A100 Tensor Core GPU data sheet (SXM4 40GB); Ampere white paper",
                    **_A100),  # type: ignore[arg-type]
    "a100-80gb": GpuSpec("a100-80gb", "A100-SXM4-80GB", hbm_gbps=2039.0, memory_gb=80.0,
                         source="NVIDIA A100 Tensor Core GPU data sheet (SXM4 80GB); Ampere white paper",
                         **_A100),  # type: ignore[arg-type]
    "a100-pcie": GpuSpec("a100-pcie", "A100-PCIE-40GB", hbm_gbps=1555.0, memory_gb=40.0,
                         source="NVIDIA A100 Tensor Core GPU data sheet (PCIe 40GB); Ampere white paper",
                         **_A100),  # type: ignore[arg-type]
    "a100-pcie-80gb": GpuSpec("a100-pcie-80gb", "A100-PCIE-80GB", hbm_gbps=1935.0, memory_gb=80.0,
                              source="NVIDIA A100 Tensor Core GPU data sheet (PCIe 80GB); Ampere white paper",
                              **_A100),  # type: ignore[arg-type]
    "h100": GpuSpec("h100", "H100-SXM5-80GB",
                    peak_tflops={"fp64": 34.0, "fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4,
                                 "fp8": 1978.9},
                    source="NVIDIA H100 Tensor Core GPU data sheet (SXM5); Hopper white paper",
                    **_H100),  # type: ignore[arg-type]
    "h100-pcie": GpuSpec("h100-pcie", "H100-PCIe-80GB", sm_count=114, clock_mhz=1620.0, hbm_gbps=2000.0,
                         memory_gb=80.0, l2_mb=50.0,
                         peak_tflops={"fp64": 26.0, "fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0,
                                      "fp8": 1513.0},
                         tensor=("tf32", "fp16", "bf16", "fp8"),
                         source="NVIDIA H100 Tensor Core GPU data sheet (PCIe); Hopper white paper"),
    "h800": GpuSpec("h800", "H800-SXM5-80GB",
                    peak_tflops={"fp64": 1.0, "fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4,
                                 "fp8": 1978.9},
                    source="NVIDIA H800 Tensor Core GPU data sheet (SXM5)",
                    **_H100),  # type: ignore[arg-type]
}


def gpu_names() -> list[str]:
    """The GPU presets, by name."""
    return sorted(DATASHEETS)


def resolve_gpu(name: str) -> str:
    """The data sheet for ``name``: a preset name, or a product name as CUDA reports it
    (e.g. "NVIDIA A100-SXM4-80GB" -> "a100-80gb"), matched exactly by variant. Unknown, or a
    variant with no data sheet -> one-line EchoError."""
    g = (name or "").strip().lower()
    if g in DATASHEETS:
        return g
    return datasheet_key(name)


def datasheet(name: str) -> GpuSpec:
    return DATASHEETS[resolve_gpu(name)]
