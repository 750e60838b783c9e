"""Megatron-style tensor parallelism in plain PyTorch.

Column-parallel linears split the output features, row-parallel linears split the input
features and all-reduce their output; the pair needs one all-reduce in forward (row) and one
in backward (the gradient of the column's input), expressed by two autograd Functions. The
embedding and the loss are vocab-parallel: each rank holds a slice of the vocabulary.
With a group of size 1 no collective is issued.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from echo_et.workloads.markers import comm_span


def _size(group) -> int:
    return dist.get_world_size(group)


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


def _init(weight: torch.Tensor, gen: torch.Generator | None) -> None:
    if gen is None:          # the meta device: nothing to draw
        return
    with torch.no_grad():
        weight.normal_(0.0, 0.02, generator=gen)


class ColumnParallelLinear(nn.Module):
    """``skip_bias_add``: return ``(x @ W^T, bias)`` and let the caller fuse the bias into
    what follows, as Megatron-LM's layers do."""

    def __init__(self, in_features: int, out_features: int, group, *, gen, device, dtype,
                 skip_bias_add: bool = False):
        super().__init__()
        self.group = group
        self.skip_bias_add = skip_bias_add
        local = out_features // _size(group)
        self.weight = nn.Parameter(torch.empty(local, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(local, device=device, dtype=dtype))
        _init(self.weight, gen)

    def forward(self, x: torch.Tensor):
        x = copy_to_region(x, self.group)
        if self.skip_bias_add:
            return F.linear(x, self.weight), self.bias
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, group, *, gen, device, dtype,
                 skip_bias_add: bool = False):
        super().__init__()
        self.group = group
        self.skip_bias_add = skip_bias_add
        local = in_features // _size(group)
        self.weight = nn.Parameter(torch.empty(out_features, local, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype))
        _init(self.weight, gen)

    def forward(self, x: torch.Tensor):
        out = reduce_from_region(F.linear(x, self.weight), self.group)
        if self.skip_bias_add:
            return out, self.bias
        return out + self.bias


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
        _init(self.weight, gen)

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
