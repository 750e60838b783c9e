"""Megatron's attention softmax: its fused causal kernel where Megatron's conditions for it
hold, else its unfused fp32 path (five kernels each way), as Megatron-DeepSpeed's
``FusedScaleMaskSoftmax`` chooses. vTrain's 8-way tensor-parallel runs at micro-batch 1 (16
heads: 2 per rank, so b x np = 2) run the unfused path."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="the workload needs torch (the trace extra)")

from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402
from echo_et.workloads.fused import (  # noqa: E402
    causal_mask,
    scaled_upper_triang_masked_softmax,
    torch_softmax,
    upper_triang_softmax_fuses,
)

FP16 = torch.float16


@pytest.mark.parametrize(("seq", "attn_batches", "dtype", "fuses"), [
    (1024, 4, FP16, True), (1024, 4, torch.bfloat16, True), (2048, 32, FP16, True), (20, 4, FP16, True),
    (1024, 2, FP16, False),       # vTrain's TP8 at micro-batch 1: 1 x 16 / 8 heads
    (1024, 6, FP16, False), (16, 4, FP16, False), (18, 4, FP16, False), (4096, 4, FP16, False),
    (1024, 4, torch.float32, False),
])
def test_megatrons_conditions_for_the_fused_kernel(seq: int, attn_batches: int, dtype, fuses: bool) -> None:
    assert upper_triang_softmax_fuses(seq=seq, attn_batches=attn_batches, dtype=dtype) is fuses


def test_vtrain_tensor_parallel_8_runs_the_unfused_path_only_at_micro_batch_1() -> None:
    for mb, fuses in ((1, False), (2, True), (4, True), (8, True)):
        assert upper_triang_softmax_fuses(seq=1024, attn_batches=mb * 16 // 8, dtype=FP16) is fuses
        assert upper_triang_softmax_fuses(seq=1024, attn_batches=mb * 16 // 4, dtype=FP16)


@pytest.mark.parametrize("dtype", [torch.float32, FP16])
def test_both_paths_compute_the_same_probabilities(dtype) -> None:
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    want = scaled_upper_triang_masked_softmax(x, 0.125)
    got = torch_softmax(x.clone(), 0.125, causal_mask(8, 8, "cpu"))
    assert got.dtype == x.dtype and not got.isnan().any()
    torch.testing.assert_close(got.float(), want.float(), atol=2e-3 if dtype == FP16 else 1e-6, rtol=0)
    assert (got[..., 0, 1:] == 0).all()         # the first query sees only the first key


def _kernels(cfg: GPTConfig) -> Counter:
    job = trace(build_gpt(cfg), ParallelLayout(), TraceOptions(device="meta", replay=False, warmup_steps=0)).job
    return Counter((phase, name) for name, _, _, (phase, *_) in kernel_ops(job.graph_of(0)))


def test_the_unfused_path_is_five_kernels_each_way() -> None:
    """Per layer: forward 2 casts, the scaling, the in-place mask and the softmax instead of
    the fused kernel; backward 2 casts, the softmax's backward, the mask and the scaling's
    backward instead of the fused one; selective recomputation runs the forward five again."""
    shape = {"layers": 2, "hidden": 64, "heads": 4, "micro_batch": 4, "vocab": 96, "recompute": True,
             "recompute_granularity": "selective"}
    fused, unfused = _kernels(GPTConfig.megatron(**shape, seq=20)), _kernels(GPTConfig.megatron(**shape, seq=18))
    layers = shape["layers"]
    assert fused - unfused == Counter({("forward", "echo::scaled_upper_triang_masked_softmax"): layers,
                                       ("backward", "echo::scaled_upper_triang_masked_softmax"): layers,
                                       ("backward", "echo::scaled_upper_triang_masked_softmax_backward"): layers})
    assert unfused - fused == Counter({
        ("forward", "aten::_to_copy"): 2 * layers, ("forward", "aten::mul"): layers,
        ("forward", "aten::masked_fill_"): layers, ("forward", "aten::_softmax"): layers,
        ("backward", "aten::_to_copy"): 4 * layers, ("backward", "aten::mul"): 2 * layers,
        ("backward", "aten::masked_fill_"): layers, ("backward", "aten::_softmax"): layers,
        ("backward", "aten::_softmax_backward_data"): layers, ("backward", "aten::masked_fill"): layers})
