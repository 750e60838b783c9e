"""megatron-gpt traces the kernels Megatron launches and no others: two that autograd or a
copy would add and Megatron does not run stay out of the backward (a zero gradient for the
fused bias-dropout-add's mask, a copy of the softmax in the vocab-parallel cross-entropy's
backward), and leaving them out keeps the gradients what they were."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="tracing and real runs need torch (the trace extra)")

import torch.nn.functional as F  # noqa: E402

from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

# seq 32: Megatron's fused softmax path (at tp 1 and 2: micro-batch x heads per rank a multiple of 4)
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 2, "vocab": 96}


def _backward_ops(device: str, layout: ParallelLayout) -> Counter:
    job = trace(build_gpt(GPTConfig.megatron(**SMALL)), layout,
                TraceOptions(device=device, warmup_steps=0)).job
    return Counter(name for name, _, _, (ph, *_) in kernel_ops(job.graph_of(0)) if ph == "backward")


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_backward_has_no_zero_gradient_and_no_softmax_copy(device: str, tp: int) -> None:
    """Per layer, two fused bias-dropout-add backwards and no ``aten::zeros`` (autograd
    would make one for the mask, which has no gradient); the cross-entropy's backward
    scatters into the saved softmax with no ``aten::clone`` of it (no recomputation here:
    nothing else in the backward copies or zero-fills)."""
    ops = _backward_ops(device, ParallelLayout(tp=tp))
    assert ops["echo::bias_dropout_add_backward"] == 2 * SMALL["layers"]
    assert ops["echo::scaled_upper_triang_masked_softmax_backward"] == SMALL["layers"]
    assert ops["aten::scatter_add_"] == 1
    assert (ops["aten::zeros"], ops["aten::clone"]) == (0, 0)


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_bias_dropout_add_gradients(p: float) -> None:
    """The fused op's gradients are the unfused ones, bit for bit: the input's through the
    mask it kept, the bias's their sum over tokens, the residual's the incoming one."""
    from echo_et.workloads import fused

    gen = torch.Generator().manual_seed(5)
    x, residual = (torch.randn(6, 2, 8, generator=gen, requires_grad=True) for _ in range(2))
    bias = torch.randn(8, generator=gen, requires_grad=True)
    out, keep = fused.bias_dropout_add(x, bias, residual, p)
    assert not keep.requires_grad and keep.dtype == torch.bool
    g = torch.randn(out.shape, generator=gen)
    out.backward(g)
    want = g * keep / (1.0 - p) if p > 0 else g
    assert torch.equal(x.grad, want)
    assert torch.equal(bias.grad, want.sum(dim=(0, 1)))
    assert torch.equal(residual.grad, g)


class _NoGrad(torch.autograd.Function):
    """Identity whose backward gives no gradient (None) to its input."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def test_bias_dropout_add_takes_no_gradient() -> None:
    """With its gradients not materialised, the fused op's backward can be called with none
    for its output: it passes none on (a zero-filled one was what it got before)."""
    from echo_et.workloads import fused

    x, residual = (torch.randn(4, 3, requires_grad=True) for _ in range(2))
    bias = torch.randn(3, requires_grad=True)
    out, _ = fused.bias_dropout_add(x, bias, residual, 0.1)
    (_NoGrad.apply(out) + residual).sum().backward()
    assert x.grad is None and bias.grad is None
    assert torch.equal(residual.grad, torch.ones_like(residual))


def test_vocab_parallel_cross_entropy_gradient(world_of_one) -> None:
    """The loss and its gradient are the cross-entropy's (to rounding), the gradient
    computed in the saved softmax; called twice with fresh graphs, it gives the same."""
    from echo_et.workloads.tensor_parallel import vocab_parallel_cross_entropy

    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(16, 2, 96, generator=gen, requires_grad=True)
    target = torch.randint(0, 96, (16, 2), generator=gen)
    weight = torch.rand(16, 2, generator=gen)
    grads = []
    for _ in range(2):
        loss = vocab_parallel_cross_entropy(logits, target, world_of_one, 0, 96)
        (grad,) = torch.autograd.grad((loss * weight).sum(), logits)
        grads.append(grad)
    assert torch.equal(grads[0], grads[1])
    ref = logits.detach().clone().requires_grad_(True)
    ref_loss = F.cross_entropy(ref.view(-1, 96), target.view(-1), reduction="none").view(16, 2)
    (ref_grad,) = torch.autograd.grad((ref_loss * weight).sum(), ref)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grads[0], ref_grad)
