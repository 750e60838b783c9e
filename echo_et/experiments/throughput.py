"""A predicted step as the rates people compare training runs by: tokens per second, model
FLOPs per GPU per second and MFU (model FLOPs utilisation: those FLOPs over the GPU's
data-sheet peak for the run's dtype, as Chowdhery et al. 2022 define it), and the same with the
FLOPs recomputation adds (hardware FLOPs, what the Megatron-LM paper's teraFLOP/s count when
its runs recompute)."""

from __future__ import annotations

from typing import Any

from echo_et.errors import EchoError
from echo_et.models.compute import math_class


def step_throughput(cfg: Any, sequences: int, tp: int, gpus: int, step_ns: int, gpu: Any,
                    fp32_matmul: str = "fp32", pp: int = 1) -> dict[str, Any]:
    """The rates of a step of ``step_ns`` on ``gpus`` GPUs of ``gpu`` (a
    ``models.compute.GpuSpec``) that trains ``cfg`` (a ``workloads.gpt_config.GPTConfig``) on
    ``sequences`` sequences; rounded so that the same step gives the same bytes."""
    if step_ns <= 0 or gpus < 1 or sequences < 1:
        raise EchoError(f"no rates for a step of {step_ns} ns on {gpus} GPUs over {sequences} sequences")
    model, hardware = cfg.step_flops(sequences, tp, pp)
    math = math_class(cfg.dtype)     # float32 runs as TF32 where the profile says so
    if math == "fp32" and fp32_matmul == "tf32":
        math = "tf32"
    peak = gpu.peak_flops(math)
    seconds = step_ns / 1e9
    per_gpu = seconds * gpus
    return {
        "tokens_per_s": _digits(sequences * cfg.seq / seconds),
        "model_tflops_per_gpu": _digits(model / per_gpu / 1e12),
        "mfu_pct": _digits(100 * model / per_gpu / peak),
        "hardware_tflops_per_gpu": _digits(hardware / per_gpu / 1e12),
        "hfu_pct": _digits(100 * hardware / per_gpu / peak),
        "peak_tflops": _digits(peak / 1e12),
        "math": math,
        "model_flops": model,
        "hardware_flops": hardware,
    }


def _digits(x: float) -> float:
    """``x`` to 7 significant digits (a tiny model's MFU is 0.0003 %, a large one's 45 %)."""
    return float(f"{x:.7g}")
