"""What one GPU kernel does, in the units the roofline prices: FLOPs, bytes, GEMM dimensions.

An operator becomes a list of :class:`Kernel` (see :mod:`echo_et.models.compute.ops`); each is
priced on its own and pays the per-kernel overhead once, so an operator that launches several
kernels costs more than one that fuses them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kernel kinds.
GEMM = "gemm"          # dense matrix multiply: (batch x) M x N x K
ATTN_FWD = "attn_fwd"  # fused attention forward (flash / memory-efficient / cuDNN)
ATTN_BWD = "attn_bwd"  # fused attention backward
MEM = "mem"            # memory-bound kernel of a class (elementwise, reduction, norm, ...)

# Memory-bound classes; each has its own fitted fraction of HBM bandwidth.
MEM_CLASSES = ("elementwise", "reduction", "norm", "norm_param_grad", "softmax", "copy", "fill", "index",
               "embedding_bwd", "optimizer", "gemm_io", "attention_io", "other")


@dataclass(frozen=True)
class Kernel:
    kind: str
    cls: str               # memory class (for MEM); "gemm_io" / "attention_io" for the IO side of the others
    flops: float = 0.0
    bytes: float = 0.0
    math: str = "fp32"     # peak class: fp64, fp32, tf32, fp16, bf16, fp8
    m: int = 0             # GEMM: M, N, K, batch. Attention: m = query length, n = key length,
    n: int = 0             # k = head dim, batch = batch x heads.
    k: int = 0
    batch: int = 1


def mem(cls: str, nbytes: float, flops: float = 0.0) -> Kernel:
    return Kernel(MEM, cls, flops=float(flops), bytes=float(max(0.0, nbytes)))


def gemm(m: int, n: int, k: int, batch: int, math: str, nbytes: float, extra_flops: float = 0.0) -> Kernel:
    return Kernel(GEMM, "gemm_io", flops=2.0 * m * n * k * batch + extra_flops, bytes=float(nbytes), math=math,
                  m=m, n=n, k=k, batch=batch)
