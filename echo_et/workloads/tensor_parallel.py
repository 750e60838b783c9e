"""Megatron-style tensor parallelism in plain PyTorch.

Column-parallel linears split the output features, row-parallel linears split the input
features and all-reduce their output; the pair needs one all-reduce in forward (row) and one
in backward (the gradient of the column's input), expressed by two autograd Functions. The
embedding and the loss are vocab-parallel: each rank holds a slice of the vocabulary.
With a group of size 1 no collective is issued.

Sequence parallelism (Megatron-LM's ``--sequence-parallel``, Korthikanti et al. 2022, arXiv
2205.05198): between the tensor-parallel regions the activations are split along the
sequence (dimension 0 of Megatron's ``[s, b, h]``), so the layer norms, dropouts and residual
adds run on s / tp tokens per rank. A column-parallel linear all-gathers its input along the
sequence first (and in its backward gathers it again, overlapped with the input-gradient
GEMM, then reduce-scatters that gradient, overlapped with the weight-gradient GEMM:
Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``); a row-parallel linear
reduce-scatters its output along the sequence instead of all-reducing it. The same bytes as
the two all-reduces, in four collectives a layer each way.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from echo_et.workloads.markers import comm_span

# torch 2.13 renamed the tensor forms; older releases only have the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _size(group) -> int:
    return dist.get_world_size(group)


def _gather_sequence(x: torch.Tensor, group, async_op: bool = False):
    """``x`` all-gathered along dimension 0 (the sequence): (tensor, work or None)."""
    out = torch.empty((x.shape[0] * _size(group), *x.shape[1:]), dtype=x.dtype, device=x.device)
    with comm_span(group):
        work = _all_gather(out, x.contiguous(), group=group, async_op=async_op)
    return out, work


def _scatter_sequence(x: torch.Tensor, group, async_op: bool = False):
    """``x`` reduce-scattered along dimension 0: this rank's summed s / tp rows, (tensor, work)."""
    out = torch.empty((x.shape[0] // _size(group), *x.shape[1:]), dtype=x.dtype, device=x.device)
    with comm_span(group):
        work = _reduce_scatter(out, x.contiguous(), group=group, async_op=async_op)
    return out, work


class _GatherFromSequence(torch.autograd.Function):
    """All-gather along the sequence in forward; reduce-scatter of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_sequence(x, group)[0]

    @staticmethod
    def backward(ctx, grad):
        return _scatter_sequence(grad, ctx.group)[0], None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Reduce-scatter along the sequence in forward; all-gather of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _scatter_sequence(x, group)[0]

    @staticmethod
    def backward(ctx, grad):
        return _gather_sequence(grad, ctx.group)[0], None


class _ScatterToSequence(torch.autograd.Function):
    """This rank's s / tp rows (a copy) in forward; all-gather of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = x.shape[0] // _size(group)
        return x.narrow(0, dist.get_rank(group) * n, n).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_sequence(grad, ctx.group)[0], None


def accumulate_weight_grad(x: torch.Tensor, grad: torch.Tensor, weight: nn.Parameter) -> torch.Tensor:
    """Megatron's gradient-accumulation fusion: ``grad^T x`` added into ``weight.main_grad``
    by one GEMM; returns the empty stand-in autograd gets for the weight, marked
    (``grad_added_to_main_grad``) so that the data-parallel hook adds nothing more."""
    from echo_et.workloads import fused

    fused.wgrad_gemm_accum_fp32(x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1]), weight.main_grad)
    weight.grad_added_to_main_grad = True
    return torch.empty_like(weight)


class _FusedWgradLinear(torch.autograd.Function):
    """``x @ W^T`` whose backward accumulates the weight gradient into the fp32 ``main_grad``
    (:func:`accumulate_weight_grad`; Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``
    with ``gradient_accumulation_fusion``)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return torch.matmul(x, weight.t())

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_input = grad.matmul(weight)
        return grad_input, accumulate_weight_grad(x, grad, weight)


def linear(x: torch.Tensor, weight: nn.Parameter, bias: torch.Tensor | None, fusion: bool) -> torch.Tensor:
    """``F.linear``, or with gradient-accumulation fusion Megatron's GEMM and bias add."""
    if not fusion:
        return F.linear(x, weight, bias)
    out = _FusedWgradLinear.apply(x, weight)
    return out if bias is None else out + bias


class _SequenceParallelLinear(torch.autograd.Function):
    """Megatron's column-parallel GEMM on a sequence-split input (see the module docstring):
    the gathered input is not kept; the backward gathers it again."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, fusion=False):
        ctx.group = group
        ctx.fusion = fusion
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        total, _ = _gather_sequence(x, group)
        out = torch.matmul(total, weight.t())
        return out if bias is None else out + bias

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        total, gathering = _gather_sequence(x, ctx.group, async_op=True)
        grad_input = grad.matmul(weight)
        with comm_span(ctx.group):
            gathering.wait()
        grad2d = grad.reshape(-1, grad.shape[-1])
        sub_grad_input, scattering = _scatter_sequence(grad_input, ctx.group, async_op=True)
        if ctx.fusion:
            grad_weight = accumulate_weight_grad(total, grad2d, weight)
        else:
            grad_weight = grad2d.t().matmul(total.reshape(-1, total.shape[-1]))
        grad_bias = grad2d.sum(dim=0) if ctx.has_bias else None
        with comm_span(ctx.group):
            scattering.wait()
        return sub_grad_input, grad_weight, grad_bias, None, None


def mark_sequence_parallel(*params: nn.Parameter) -> None:
    """Parameters applied to s / tp rows on every TP rank: each rank's gradient covers its
    rows only, so their gradients are all-reduced over the TP group after the backward
    (Megatron's ``sequence_parallel`` attribute, ``allreduce_layernorm_grads``)."""
    for p in params:
        p.sequence_parallel = True


def is_sequence_parallel(p: nn.Parameter) -> bool:
    return getattr(p, "sequence_parallel", False)


def gather_from_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return _GatherFromSequence.apply(x, group) if _size(group) > 1 else x


def reduce_scatter_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceScatterToSequence.apply(x, group) if _size(group) > 1 else x


def scatter_to_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return _ScatterToSequence.apply(x, group) if _size(group) > 1 else x


class _CopyToRegion(torch.autograd.Function):
    """Identity in forward; all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        if _size(ctx.group) > 1:
            grad = grad.contiguous()
            with comm_span(ctx.group):
                dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromRegion(torch.autograd.Function):
    """All-reduce in forward; identity in backward."""

    @staticmethod
    def forward(ctx, x, group):
        if _size(group) > 1:
            x = x.contiguous()
            with comm_span(group):
                dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_region(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyToRegion.apply(x, group) if _size(group) > 1 else x


def reduce_from_region(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromRegion.apply(x, group) if _size(group) > 1 else x


def init_weight(weight: torch.Tensor, gen: torch.Generator | None) -> None:
    if gen is None:          # the meta device: nothing to draw
        return
    with torch.no_grad():
        weight.normal_(0.0, 0.02, generator=gen)


class ColumnParallelLinear(nn.Module):
    """``skip_bias_add``: return ``(x @ W^T, bias)`` and let the caller fuse the bias into
    what follows, as Megatron-LM's layers do. ``sequence_parallel``: the input is split along
    the sequence and gathered here (see the module docstring). ``bias`` False: no bias
    (Megatron's --disable-bias-linear; ``skip_bias_add`` then returns None for it).
    ``fusion``: Megatron's gradient-accumulation fusion (:func:`accumulate_weight_grad`)."""

    def __init__(self, in_features: int, out_features: int, group, *, gen, device, dtype,
                 skip_bias_add: bool = False, sequence_parallel: bool = False, bias: bool = True,
                 fusion: bool = False):
        super().__init__()
        self.group = group
        self.fusion = fusion
        self.skip_bias_add = skip_bias_add
        self.sequence_parallel = sequence_parallel and _size(group) > 1
        local = out_features // _size(group)
        self.weight = nn.Parameter(torch.empty(local, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(local, device=device, dtype=dtype)) if bias else None
        init_weight(self.weight, gen)

    def forward(self, x: torch.Tensor):
        if self.sequence_parallel:
            bias = None if self.skip_bias_add else self.bias
            out = _SequenceParallelLinear.apply(x, self.weight, bias, self.group, self.fusion)
            return (out, self.bias) if self.skip_bias_add else out
        x = copy_to_region(x, self.group)
        if self.skip_bias_add:
            return linear(x, self.weight, None, self.fusion), self.bias
        return linear(x, self.weight, self.bias, self.fusion)


class RowParallelLinear(nn.Module):
    """``sequence_parallel``: the output is reduce-scattered along the sequence instead of
    all-reduced, and the bias (added to s / tp rows on every rank) is marked for the
    tensor-parallel all-reduce of its gradient. ``fusion``: as :class:`ColumnParallelLinear`'s."""

    def __init__(self, in_features: int, out_features: int, group, *, gen, device, dtype,
                 skip_bias_add: bool = False, sequence_parallel: bool = False, bias: bool = True,
                 fusion: bool = False):
        super().__init__()
        self.group = group
        self.fusion = fusion
        self.skip_bias_add = skip_bias_add
        self.sequence_parallel = sequence_parallel and _size(group) > 1
        local = in_features // _size(group)
        self.weight = nn.Parameter(torch.empty(out_features, local, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        init_weight(self.weight, gen)
        if self.sequence_parallel and bias:
            mark_sequence_parallel(self.bias)

    def forward(self, x: torch.Tensor):
        out = linear(x, self.weight, None, self.fusion)
        out = (reduce_scatter_to_sequence(out, self.group) if self.sequence_parallel
               else reduce_from_region(out, self.group))
        if self.skip_bias_add:
            return out, self.bias
        return out if self.bias is None else out + self.bias


def vocab_range(vocab: int, group) -> tuple[int, int]:
    per = vocab // _size(group)
    start = dist.get_rank(group) * per
    return start, start + per


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, group, *, gen, device, dtype):
        super().__init__()
        self.group = group
        self.start, self.end = vocab_range(vocab, group)
        self.weight = nn.Parameter(torch.empty(self.end - self.start, hidden, device=device,
                                               dtype=dtype))
        init_weight(self.weight, gen)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if _size(self.group) == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_region(out, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss over logits split by vocabulary: three all-reduces in forward (max,
    target logit, sum of exponentials), none in backward."""

    @staticmethod
    def forward(ctx, logits, target, group, start, end):
        tp = _size(group)
        logits = logits.float()
        lmax = logits.max(dim=-1)[0]
        if tp > 1:
            with comm_span(group):
                dist.all_reduce(lmax, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - lmax.unsqueeze(-1)
        outside = (target < start) | (target >= end)
        local_t = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        if tp > 1:
            with comm_span(group):
                dist.all_reduce(picked, group=group)
        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        if tp > 1:
            with comm_span(group):
                dist.all_reduce(sum_exp, group=group)
        loss = sum_exp.log() - picked
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_t, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local_t, outside = ctx.saved_tensors
        # the gradient is written into the saved softmax, its last use, as Megatron's
        # backward does: no copy of the (tokens x vocabulary) tensor
        grad = softmax
        hit = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local_t.unsqueeze(-1), -hit)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits, target, group, start: int, end: int) -> torch.Tensor:
    return _VocabParallelCrossEntropy.apply(logits, target, group, start, end)


def padded_vocab(vocab: int, tp: int, multiple: int = 1) -> int:
    """The vocabulary rounded up to a multiple of ``multiple`` x tp, so that every
    tensor-parallel rank holds an equal slice (Megatron-LM pads to 128 x tp:
    ``--make-vocab-size-divisible-by 128``)."""
    step = multiple * tp
    return int(math.ceil(vocab / step) * step)
