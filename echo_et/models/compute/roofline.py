"""The time of one kernel on one GPU: a roofline with efficiency curves.

    time = overhead + max(compute time, memory time)

- memory time = bytes / (HBM bandwidth x mem_eff[class]); a memory-bound kernel that moves
  at most half the L2's size works from L2 (its input was just written by the kernel before
  it) and uses ``mem_eff.l2``, a multiple of HBM bandwidth that may exceed 1;
- GEMM compute time = FLOPs / (peak[dtype] x gemm_eff x utilisation), where the utilisation
  is the best, over the tile shapes cuBLAS/CUTLASS pick from (and split-K for short-and-wide
  GEMMs), of the useful fraction of the issued tile work (tile padding and wave quantisation:
  tiles are dealt to the SMs in waves, a partial last wave leaves SMs idle) times the
  K-efficiency K / (K + k_half) of the main loop (prologue/epilogue of each tile);
- sustained tensor-core ceiling: a tensor-core GEMM never runs faster than FLOPs / (peak x
  ``sustained_eff.tensor``). The data-sheet peak assumes the boost clock; under a large GEMM
  an A100 SXM reaches its power limit and lowers its clock, so the throughput it sustains is
  capped below the peak whatever the tiling (a power roofline: at the power cap the achieved
  FLOP/s is bounded by the power budget over the energy per FLOP). GEMMs whose tiling keeps
  them below the cap (small, wave-quantised, short-K) are not affected;
- fused attention compute time = FLOPs / (peak x attn_eff x wave utilisation of its
  (batch x heads x query blocks) tiles). FP32 attention on a GPU with TF32 tensor cores runs
  as three TF32 products (PyTorch's memory-efficient kernel on sm80+): peak = TF32 peak / 3,
  with its own efficiency ``attn_eff.fp32``;
- overhead: a fixed per-kernel time (launch and ramp), so an operator that launches several
  kernels pays it several times;
- ``host_launch_ns``: not part of a kernel's time; the host time to issue one operator
  (PyTorch eager dispatch + launch), given to the launch nodes of an untimed graph so that a
  host-bound iteration is host-bound in the simulation too.

Which numbers are which: the GPU's SM count, peaks and bandwidth come from its data sheet
(:mod:`~echo_et.models.compute.gpus`); ``gemm_eff``, ``sustained_eff``, ``attn_eff``, ``mem_eff``,
``k_half`` and the overhead are fitted (:mod:`~echo_et.models.compute.fit`); the tile shapes, their relative
efficiencies, the split-K choices and the attention block size below are model constants
(chosen from how the libraries work, not fitted).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from echo_et.models.compute import kernels as K
from echo_et.models.compute.gpus import GpuSpec

# (tile M, tile N, efficiency of the tile shape relative to the largest)
TENSOR_TILES = ((256, 128, 1.0), (128, 256, 1.0), (128, 128, 0.95), (128, 64, 0.85), (64, 128, 0.85),
                (64, 64, 0.7))
SIMT_TILES = ((128, 128, 1.0), (128, 64, 0.95), (64, 128, 0.95), (128, 32, 0.85), (64, 64, 0.85), (64, 32, 0.75))
SPLIT_K = (1, 2, 3, 4, 6, 8, 12, 16)
MIN_K_PER_SPLIT = 256
SPLIT_K_COST = 0.05          # relative cost per extra split (reduction of partial results)
ATTN_BLOCK_M = 128           # query rows per attention tile
L2_RESIDENT_FRACTION = 0.5   # a memory-bound kernel moving at most this share of L2 works from L2

# The sustained tensor-core ceiling's parameter (a fraction of the data-sheet peak).
SUSTAINED_PARAM = "sustained_eff.tensor"
# What sets a kernel's time: the sustained tensor-core ceiling, the tiled compute side (GEMM
# tiles, attention, SIMT), the memory side, and the fixed per-kernel overhead (every kernel
# pays it on top of its binding side).
BOUND_CEILING, BOUND_COMPUTE, BOUND_MEMORY, BOUND_OVERHEAD = "ceiling", "compute", "memory", "overhead"
BOUNDS = (BOUND_CEILING, BOUND_COMPUTE, BOUND_MEMORY, BOUND_OVERHEAD)
# Fitted parameters: name -> default (an uncalibrated guess used as the fit's prior).
PARAM_DEFAULTS: dict[str, float] = {
    "kernel_overhead_ns": 2500.0,
    "host_launch_ns": 10000.0,
    "host_collective_ns": 10000.0,
    "gemm_eff.tensor": 0.70,
    "gemm_eff.simt": 0.70,
    SUSTAINED_PARAM: 1.0,
    "gemm_k_half": 64.0,
    "attn_eff.fwd": 0.50,
    "attn_eff.bwd": 0.40,
    "attn_eff.fp32": 0.40,
    **{f"mem_eff.{c}": 0.75 for c in K.MEM_CLASSES},
    "mem_eff.l2": 1.5,
}
EFF_PARAMS = tuple(n for n in PARAM_DEFAULTS if "_eff." in n)
# Efficiencies are fractions of the data-sheet peak, except the L2-resident one (a multiple
# of HBM bandwidth: the L2 is faster than HBM).
EFF_MAX = {"mem_eff.l2": 4.0}


@lru_cache(maxsize=100_000)
def gemm_utilisation(m: int, n: int, k: int, batch: int, sms: int, tensor: bool, k_half: float) -> float:
    """Useful fraction of the best tiling (padding, waves, split-K) times the K-efficiency."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 1.0
    best = 0.0
    for tm, tn, te in TENSOR_TILES if tensor else SIMT_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        for s in SPLIT_K:
            if s > 1 and (k / s < MIN_K_PER_SPLIT or tiles * s > 2 * sms):
                break
            ks = math.ceil(k / s)
            waves = math.ceil(tiles * s / sms)
            useful = m * n * batch * k
            issued = waves * sms * tm * tn * ks
            u = useful / issued * te * ks / (ks + k_half) / (1.0 + SPLIT_K_COST * (s - 1))
            best = max(best, u)
    return best


def attention_utilisation(sq: int, batch_heads: int, sms: int) -> float:
    blocks = batch_heads * max(1, math.ceil(sq / ATTN_BLOCK_M))
    return blocks / (math.ceil(blocks / sms) * sms)


def compute_peak(kernel: K.Kernel, gpu: GpuSpec, fp32_matmul: str) -> tuple[float, bool]:
    """(peak FLOP/s, runs on tensor cores) for a GEMM or attention kernel."""
    mc = kernel.math
    if kernel.kind in (K.ATTN_FWD, K.ATTN_BWD) and mc == "fp32":
        if gpu.uses_tensor_cores("tf32"):
            return gpu.peak_flops("tf32") / 3.0, True
        return gpu.peak_flops("fp32"), False
    if mc == "fp32" and fp32_matmul == "tf32" and gpu.uses_tensor_cores("tf32"):
        mc = "tf32"
    return gpu.peak_flops(mc), gpu.uses_tensor_cores(mc)


class Parts(NamedTuple):
    """The sides of one kernel's roofline before efficiencies (ns at efficiency 1)."""

    cp: str          # compute parameter ("" for a memory-bound kernel)
    cns: float
    mp: str          # memory parameter
    mns: float
    sp: str = ""     # sustained-throughput ceiling parameter (tensor-core GEMMs)
    sns: float = 0.0

    def side_ns(self, param: str) -> float:
        """ns at efficiency 1 of the side priced by ``param``."""
        if param == self.mp:
            return self.mns
        if param == self.cp:
            return self.cns
        if param == self.sp:
            return self.sns
        raise KeyError(param)

    def time_ns(self, params: dict[str, float]) -> float:
        """``max(c / eff[cp], m / eff[mp], s / eff[sp])``, without the overhead."""
        t = self.mns / params[self.mp]
        if self.cp:
            t = max(t, self.cns / params[self.cp])
        if self.sp:
            t = max(t, self.sns / params[self.sp])
        return t

    def bound(self, params: dict[str, float]) -> str:
        """Which side sets :meth:`time_ns` (ties go to the memory side, then the tiled one)."""
        t = self.mns / params[self.mp]
        side = BOUND_MEMORY
        if self.cp and self.cns / params[self.cp] > t:
            t, side = self.cns / params[self.cp], BOUND_COMPUTE
        if self.sp and self.sns / params[self.sp] > t:
            side = BOUND_CEILING
        return side


def parts(kernel: K.Kernel, gpu: GpuSpec, params: dict[str, float], fp32_matmul: str = "fp32") -> Parts:
    """The sides of the roofline before efficiencies: the compute side (parameter, ns at
    efficiency 1), the memory side, and for tensor-core GEMMs the sustained-throughput
    ceiling (``sustained_eff.tensor``, ns of the FLOPs at the data-sheet peak, no tiling).
    The time is ``overhead + max(c / eff[c], m / eff[m], s / eff[s])``; the fit uses this
    linear form."""
    mem_ns = kernel.bytes / (gpu.hbm_gbps * 1e9) * 1e9
    mem_param = f"mem_eff.{kernel.cls}"
    if kernel.kind == K.MEM and kernel.bytes <= gpu.l2_mb * 1e6 * L2_RESIDENT_FRACTION:
        mem_param = "mem_eff.l2"
    if kernel.kind == K.GEMM:
        peak, tensor = compute_peak(kernel, gpu, fp32_matmul)
        u = gemm_utilisation(kernel.m, kernel.n, kernel.k, kernel.batch, gpu.sm_count, tensor,
                             params["gemm_k_half"])
        if tensor:
            return Parts("gemm_eff.tensor", kernel.flops / (peak * u) * 1e9, mem_param, mem_ns,
                         SUSTAINED_PARAM, kernel.flops / peak * 1e9)
        return Parts("gemm_eff.simt", kernel.flops / (peak * u) * 1e9, mem_param, mem_ns)
    if kernel.kind in (K.ATTN_FWD, K.ATTN_BWD):
        peak, _ = compute_peak(kernel, gpu, fp32_matmul)
        u = attention_utilisation(kernel.m, kernel.batch, gpu.sm_count)
        if kernel.math == "fp32":
            name = "attn_eff.fp32"
        else:
            name = "attn_eff.fwd" if kernel.kind == K.ATTN_FWD else "attn_eff.bwd"
        return Parts(name, kernel.flops / (peak * u) * 1e9, mem_param, mem_ns)
    return Parts("", 0.0, mem_param, mem_ns)


def kernel_time_ns(kernel: K.Kernel, gpu: GpuSpec, params: dict[str, float], fp32_matmul: str = "fp32") -> float:
    return params["kernel_overhead_ns"] + parts(kernel, gpu, params, fp32_matmul).time_ns(params)


def kernel_bound_ns(kernel: K.Kernel, gpu: GpuSpec, params: dict[str, float], fp32_matmul: str = "fp32"
                    ) -> tuple[str, float, float]:
    """(the binding side of :data:`BOUNDS`, its ns, the per-kernel overhead's ns): the two
    add up to :func:`kernel_time_ns`."""
    p = parts(kernel, gpu, params, fp32_matmul)
    return p.bound(params), p.time_ns(params), params["kernel_overhead_ns"]
