"""Megatron-LM's fused kernels as single operators (namespace ``echo``), so that a trace
records one kernel where Megatron launches one.

Megatron fuses, on a GPU:

- ``scaled_upper_triang_masked_softmax``: scale, causal mask and softmax of the attention
  scores in one CUDA kernel (its ``FusedScaleMaskSoftmax``), and one kernel for its backward;
- ``bias_gelu``: the first MLP bias and the GeLU (tanh approximation), TorchScript-fused,
  forward and backward;
- ``bias_dropout_add``: bias, dropout and the residual add after the attention and MLP
  outputs, TorchScript-fused (its backward: one kernel for the gradient through the dropout;
  the bias gradient is a reduction).

Here each is a ``torch.library`` custom operator whose implementation runs the unfused
PyTorch operators (so CPU runs compute the same values) and whose fake (meta) kernel only
makes the output: a meta-device trace and a CPU trace both see ``echo::<name>`` once. A
compute model prices them as memory-bound kernels (each reads its inputs and writes its
outputs once).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_GELU_C = math.sqrt(2.0 / math.pi)


def causal_mask(rows: int, cols: int, device) -> Tensor:
    """True above the diagonal: the keys a query may not see."""
    return torch.ones(rows, cols, dtype=torch.bool, device=device).triu(1)


def _causal(x: Tensor) -> Tensor:
    return causal_mask(x.shape[-2], x.shape[-1], x.device)


# -- scale + causal mask + softmax ----------------------------------------------------------------
def upper_triang_softmax_fuses(*, seq: int, attn_batches: int, dtype: torch.dtype) -> bool:
    """Whether Megatron runs its fused causal softmax kernel on ``[b, np, s, s]`` scores
    (``attn_batches`` = b x np): 16-bit scores, 16 < s <= 2048, s and b x np multiples of 4
    (``FusedScaleMaskSoftmax.forward`` in Megatron-DeepSpeed; later Megatron-LM releases
    raised the length limit). Otherwise it runs :func:`torch_softmax`."""
    return dtype in (torch.float16, torch.bfloat16) and 16 < seq <= 2048 and seq % 4 == 0 and attn_batches % 4 == 0


def torch_softmax(x: Tensor, scale: float, mask: Tensor) -> Tensor:
    """Megatron's unfused path: 16-bit scores cast to fp32 (its query-key layer scaling
    makes the softmax fp32), scaled, masked in place, softmax, cast back: five kernels
    forward and five backward where the fused kernel is one each."""
    half = x.dtype in (torch.float16, torch.bfloat16)
    y = (x.float() if half else x) * scale
    probs = torch.softmax(y.masked_fill_(mask, -10000.0), dim=-1)
    return probs.to(x.dtype) if half else probs


@torch.library.custom_op("echo::scaled_upper_triang_masked_softmax", mutates_args=())
def scaled_upper_triang_masked_softmax(x: Tensor, scale: float) -> Tensor:
    return torch.softmax((x * scale).masked_fill(_causal(x), -10000.0), dim=-1)


@scaled_upper_triang_masked_softmax.register_fake
def _(x: Tensor, scale: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("echo::scaled_upper_triang_masked_softmax_backward", mutates_args=())
def scaled_upper_triang_masked_softmax_backward(grad: Tensor, probs: Tensor, scale: float) -> Tensor:
    return torch._softmax_backward_data(grad, probs, -1, probs.dtype) * scale


@scaled_upper_triang_masked_softmax_backward.register_fake
def _(grad: Tensor, probs: Tensor, scale: float) -> Tensor:
    return torch.empty_like(grad)


def _softmax_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _softmax_grad(ctx, grad):
    (probs,) = ctx.saved_tensors
    return scaled_upper_triang_masked_softmax_backward(grad, probs, ctx.scale), None


scaled_upper_triang_masked_softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)


# -- bias + GeLU --------------------------------------------------------------------------------------
@torch.library.custom_op("echo::bias_gelu", mutates_args=())
def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    y = x + bias
    return y * 0.5 * (1.0 + torch.tanh(_GELU_C * y * (1.0 + 0.044715 * y * y)))


@bias_gelu.register_fake
def _(x: Tensor, bias: Tensor) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("echo::bias_gelu_backward", mutates_args=())
def bias_gelu_backward(grad: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    y = x + bias
    t = torch.tanh(_GELU_C * y * (1.0 + 0.044715 * y * y))
    d = 0.5 * y * ((1 - t * t) * (_GELU_C + 0.1070322243 * y * y)) + 0.5 * (1 + t)
    return grad * d


@bias_gelu_backward.register_fake
def _(grad: Tensor, x: Tensor, bias: Tensor) -> Tensor:
    return torch.empty_like(grad)


def _gelu_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])


def _gelu_grad(ctx, grad):
    x, bias = ctx.saved_tensors
    gx = bias_gelu_backward(grad, x, bias)
    return gx, gx.sum(dim=tuple(range(gx.dim() - 1)))


bias_gelu.register_autograd(_gelu_grad, setup_context=_gelu_setup)


# -- bias + dropout + residual add --------------------------------------------------------------------
@torch.library.custom_op("echo::bias_dropout_add", mutates_args=())
def bias_dropout_add(x: Tensor, bias: Tensor, residual: Tensor, p: float) -> tuple[Tensor, Tensor]:
    y = x + bias
    if p > 0:
        keep = torch.rand_like(y, dtype=torch.float32) >= p
        y = y * keep / (1.0 - p)
    else:
        keep = torch.ones_like(y, dtype=torch.bool)
    return residual + y, keep


@bias_dropout_add.register_fake
def _(x: Tensor, bias: Tensor, residual: Tensor, p: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)


@torch.library.custom_op("echo::bias_dropout_add_backward", mutates_args=())
def bias_dropout_add_backward(grad: Tensor, keep: Tensor, p: float) -> Tensor:
    return grad * keep / (1.0 - p) if p > 0 else grad.clone()


@bias_dropout_add_backward.register_fake
def _(grad: Tensor, keep: Tensor, p: float) -> Tensor:
    return torch.empty_like(grad)


def _bda_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output[1])
    ctx.p = inputs[3]
    ctx.mark_non_differentiable(output[1])
    # ``keep`` has no gradient; left materialised, autograd would allocate a zero tensor for
    # it (one ``aten::zeros`` per backward) that Megatron's fused kernel never launches
    ctx.set_materialize_grads(False)


def _bda_grad(ctx, grad: Tensor | None, _keep_grad: Tensor | None):
    if grad is None:         # nothing flowed back into the output (grads are not materialised)
        return None, None, None, None
    (keep,) = ctx.saved_tensors
    gx = bias_dropout_add_backward(grad, keep, ctx.p)
    return gx, gx.sum(dim=tuple(range(gx.dim() - 1))), grad, None


bias_dropout_add.register_autograd(_bda_grad, setup_context=_bda_setup)


# -- RMSNorm (the llama architecture) ------------------------------------------------------------
# Megatron runs Transformer Engine's or Apex's fused RMSNorm: one kernel forward, one (plus the
# weight gradient's reduction) backward.
def _wide(x: Tensor) -> Tensor:
    """``x`` in fp32 at least (what the fused kernels compute in)."""
    return x if x.dtype == torch.float64 else x.float()


@torch.library.custom_op("echo::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = _wide(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * _wide(weight)).to(x.dtype)


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("echo::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    xf, gf, wf = _wide(x), _wide(grad), _wide(weight)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xhat = xf * rstd
    gw = gf * wf
    gx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    dw = (gf * xhat).reshape(-1, x.shape[-1]).sum(0)
    return gx.to(x.dtype), dw.to(weight.dtype)


@rms_norm_backward.register_fake
def _(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.eps = inputs[2]


def _rms_grad(ctx, grad):
    x, weight = ctx.saved_tensors
    gx, gw = rms_norm_backward(grad, x, weight, ctx.eps)
    return gx, gw, None


rms_norm.register_autograd(_rms_grad, setup_context=_rms_setup)


# -- SwiGLU (the llama architecture's MLP) --------------------------------------------------------
# Megatron's bias_swiglu_impl without a bias: silu of the first half of the projection times
# the second half, TorchScript-fused, one kernel each way.
def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    a, b = torch.chunk(x, 2, dim=-1)
    return a, b


@torch.library.custom_op("echo::swiglu", mutates_args=())
def swiglu(x: Tensor) -> Tensor:
    a, b = _halves(x)
    return torch.nn.functional.silu(a) * b


@swiglu.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("echo::swiglu_backward", mutates_args=())
def swiglu_backward(grad: Tensor, x: Tensor) -> Tensor:
    a, b = _halves(x)
    sig = torch.sigmoid(a)
    silu = a * sig
    da = grad * b * sig * (1 + a * (1 - sig))
    return torch.cat((da, grad * silu), dim=-1)


@swiglu_backward.register_fake
def _(grad: Tensor, x: Tensor) -> Tensor:
    return torch.empty_like(x)


def _swiglu_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _swiglu_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return swiglu_backward(grad, x)


swiglu.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


# -- rotary position embedding (the llama architecture) ------------------------------------------
# Megatron-LM's fused RoPE (its --apply-rope-fusion, the default): one kernel per query or key
# tensor each way; ``freqs`` is [s, 1, 1, d] in fp32, made once per sequence length.
def rotary_freqs(seq: int, head_dim: int, device, base: float = 10000.0) -> Tensor:
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]


def _rotate(t: Tensor, freqs: Tensor, sign: float) -> Tensor:
    tf = _wide(t)
    a, b = torch.chunk(tf, 2, dim=-1)
    rotated = torch.cat((-b, a), dim=-1)
    return (tf * freqs.cos() + sign * rotated * freqs.sin()).to(t.dtype)


@torch.library.custom_op("echo::rotary_pos_emb", mutates_args=())
def rotary_pos_emb(t: Tensor, freqs: Tensor) -> Tensor:
    return _rotate(t, freqs, 1.0)


@rotary_pos_emb.register_fake
def _(t: Tensor, freqs: Tensor) -> Tensor:
    return torch.empty_like(t)


@torch.library.custom_op("echo::rotary_pos_emb_backward", mutates_args=())
def rotary_pos_emb_backward(grad: Tensor, freqs: Tensor) -> Tensor:
    return _rotate(grad, freqs, -1.0)     # the transpose of a rotation is the opposite one


@rotary_pos_emb_backward.register_fake
def _(grad: Tensor, freqs: Tensor) -> Tensor:
    return torch.empty_like(grad)


def _rope_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])


def _rope_grad(ctx, grad):
    (freqs,) = ctx.saved_tensors
    return rotary_pos_emb_backward(grad, freqs), None


rotary_pos_emb.register_autograd(_rope_grad, setup_context=_rope_setup)


# -- gradient-accumulation fusion (Megatron-LM's --gradient-accumulation-fusion) -----------------
# Apex's fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32: the weight gradient of a linear
# computed by one GEMM that adds it into the weight's fp32 ``main_grad`` (C = C + grad^T x), so
# no 16-bit gradient is written and no separate accumulation kernel runs.
@torch.library.custom_op("echo::wgrad_gemm_accum_fp32", mutates_args=("main_grad",))
def wgrad_gemm_accum_fp32(x: Tensor, grad: Tensor, main_grad: Tensor) -> None:
    main_grad.add_(_wide(grad).t() @ _wide(x))


@wgrad_gemm_accum_fp32.register_fake
def _(x: Tensor, grad: Tensor, main_grad: Tensor) -> None:
    return None
