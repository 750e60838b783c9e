"""The parts of the built-in GPT that follow Megatron-LM / Megatron-DeepSpeed's GPT pretraining
(``GPTConfig.megatron()``), kernel for kernel where plain PyTorch allows:

- :func:`megatron_block_class`: a pre-LayerNorm transformer layer in Megatron's
  ``[sequence, batch, hidden]`` layout: column-parallel QKV; core attention as Megatron runs it
  without flash attention (a batched GEMM of Q and K^T, the fused scale + causal mask +
  softmax kernel where Megatron's conditions for it hold, else its unfused fp32 path:
  :func:`echo_et.workloads.fused.upper_triang_softmax_fuses`; attention dropout, ``bmm``
  with V, one copy back to ``[s, b, h]``);
  row-parallel output projection whose bias is added with the residual (fused
  ``bias_dropout_add``); MLP with the first bias fused into the GeLU (``bias_gelu``) and the
  second added with the residual (:mod:`echo_et.workloads.fused`);
- :class:`CheckpointFunction`: activation recomputation. Full (``--recompute-granularity
  full``, or the older ``--checkpoint-activations``): one layer per checkpoint, the forward
  runs without keeping activations and the backward runs the layer's forward again (its
  tensor-parallel all-reduces included) and then its backward. Selective (Megatron's
  ``--recompute-activations``, Korthikanti et al. 2022): only the core attention (the
  Q x K^T batched GEMM, the fused softmax, the attention dropout, the batched GEMM with V
  and the copy back to ``[s, b, h]``) is checkpointed, which keeps the s^2-sized tensors out
  of memory for the cost of recomputing the memory-bound part of the layer;
- :func:`get_batch`: what each micro-batch's forward begins with on every rank: the tokens
  broadcast from tensor-parallel rank 0, their sizes read back on the host (one device
  synchronisation per micro-batch), the inputs, labels, masks and position ids built on the
  GPU;
- :class:`MixedPrecisionAdam`: Megatron's optimizer step for 16-bit models with fp32 master
  weights: model gradients copied to fp32, their global L2 norm (all-reduced over the
  model-parallel group, then read on the host) for clipping, fused Adam on the fp32 master weights (what apex's
  ``FusedAdam`` does), and the updated weights copied back to the 16-bit model; in float16,
  first the loss scaler's unscale and inf/NaN check (one multi-tensor kernel, a flag
  all-reduced over the model-parallel group and read on the host), or with DeepSpeed's
  pipeline engine, DeepSpeed's (the overflow read from the norm, the unscale one pass over the
  gradients after it).

Kernels Megatron fuses with its JIT (``bias_gelu``, ``bias_dropout_add``) or with custom
CUDA code (``scaled_upper_triang_masked_softmax``) are single ``echo::`` operators here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from echo_et.workloads.markers import comm_span, stream_sync


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout as one kernel (``native_dropout``, what CUDA runs), or nothing when p = 0."""
    if p <= 0:
        return x
    return torch.native_dropout(x, p, True)[0]


def bias_dropout_add(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                     p: float) -> torch.Tensor:
    from echo_et.workloads import fused

    return fused.bias_dropout_add(x, bias, residual, p)[0]


#: Megatron's ``_MAX_DATA_DIM``: ``broadcast_data`` sends this many sizes per key.
MAX_DATA_DIM = 5


class Batch(NamedTuple):
    """One micro-batch as Megatron's ``get_batch`` returns it."""

    tokens: torch.Tensor          # [b, s] int64
    labels: torch.Tensor          # [b, s] int64
    loss_mask: torch.Tensor       # [b, s] float32
    attention_mask: torch.Tensor  # [1, 1, s, s] bool, True where a query may not look
    position_ids: torch.Tensor    # [b, s] int64 (a broadcast view)


def get_batch(text: torch.Tensor, group, device) -> Batch:
    """Megatron's ``get_batch`` (``pretrain_gpt.py``), run by every rank at the start of
    each micro-batch's forward, on every pipeline stage and for every model chunk.

    ``broadcast_data`` sends the micro-batch from tensor-parallel rank 0, whose data loader
    read it, to the other ranks of its group: first the sizes, copied to the GPU, broadcast
    and read back on the host (``.cpu()``, so the host waits for the device once per
    micro-batch), then the tokens. Every rank then cuts them into inputs and labels and
    builds the causal mask, the loss mask and the position ids on the GPU
    (``get_ltor_masks_and_position_ids``, without end-of-document resets: Megatron's
    defaults).

    ``text`` is the micro-batch on the host ([b, s+1] int64). Every rank copies it to the
    device where Megatron's tensor-parallel rank 0 alone does: the receiving ranks' broadcast
    completes only after rank 0's copy anyway, and with the copy on every rank the
    tensor-parallel ranks keep one graph (traced once per stage), with the values the
    broadcast would have given them (the recording process group moves no data).
    """
    b, s1 = text.shape
    seq = s1 - 1
    if group is not None and dist.get_world_size(group) == 1:
        group = None        # a group of one: NCCL moves nothing (no call is recorded)
    sizes = torch.tensor([b, s1] + [0] * (MAX_DATA_DIM - 2), dtype=torch.int64)
    sizes = sizes.to(device, copy=True)                      # torch.cuda.LongTensor(sizes)
    if group is not None:
        with comm_span(group):
            dist.broadcast(sizes, group_src=0, group=group)
    stream_sync(device)                                      # sizes_cuda.cpu()
    flat = text.reshape(-1).to(device, copy=True)
    if group is not None:
        with comm_span(group):
            dist.broadcast(flat, group_src=0, group=group)
    tokens_ = flat.view(b, s1)
    labels = tokens_[:, 1:].contiguous()
    tokens = tokens_[:, :-1].contiguous()
    attention_mask = torch.tril(torch.ones((1, seq, seq), device=device)).view(1, 1, seq, seq)
    loss_mask = torch.ones((b, seq), dtype=torch.float32, device=device)
    position_ids = torch.arange(seq, dtype=torch.int64, device=device).unsqueeze(0).expand_as(tokens)
    return Batch(tokens, labels, loss_mask, attention_mask < 0.5, position_ids)


@functools.cache
def batch_on_cp_rank(batch: Batch, group) -> Batch:
    """Megatron-Core's ``get_batch_on_this_cp_rank``: every tensor of the micro-batch cut to
    this context-parallel rank's two chunks of the sequence (the mask along its query axis)."""
    from echo_et.workloads.context_parallel import split_sequence

    cp, rank = dist.get_world_size(group), dist.get_rank(group)

    def cut(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return split_sequence(t, dim, cp, rank)

    return Batch(cut(batch.tokens), cut(batch.labels), cut(batch.loss_mask), cut(batch.attention_mask, 2),
                 cut(batch.position_ids))


def megatron_block_class():
    from echo_et.workloads import fused
    from echo_et.workloads.tensor_parallel import ColumnParallelLinear, RowParallelLinear, mark_sequence_parallel

    class MegatronBlock(nn.Module):
        """One transformer layer on ``[s, b, h]`` input (see the module docstring); with
        ``cfg.arch`` "llama", Megatron-LM's Llama layer (:class:`LlamaParts`)."""

        def __init__(self, cfg, tp: int, group, *, gen, device, dtype, cp_group=None, moe_groups=None,
                     moe: bool = True):
            """``cp_group``: the context-parallel group, whose ranks hold the sequence in
            chunks (:mod:`echo_et.workloads.context_parallel`); None without one.
            ``moe_groups``: with experts (``cfg.num_experts``), the rank's "ep" and "tp_ep"
            groups (None where there is no expert parallelism): the MLP is a mixture of
            experts (:mod:`echo_et.workloads.moe`), unless ``moe`` is False (a dense layer of a
            model whose MoE layer frequency leaves it dense)."""
            super().__init__()
            self.cp_group = cp_group
            h = cfg.hidden
            kw = {"gen": gen, "device": device, "dtype": dtype}
            self.np = cfg.heads // tp
            self.hn = h // cfg.heads
            self.ng = cfg.query_groups // tp          # key/value heads on this rank
            self.p = cfg.dropout
            self.norm = 1.0 / math.sqrt(self.hn)
            self.recompute_core = cfg.recomputes_core_attention
            self.recompute_mlp = cfg.recomputes_mlp
            self.recompute_norm = cfg.recomputes_layernorm
            self.flash = cfg.flash_attention
            self.cp_comm_type = cfg.cp_comm_type
            self.llama = LlamaParts(cfg, device, cp_group) if cfg.llama else None
            self.fused_softmax = fused.upper_triang_softmax_fuses(seq=cfg.seq, attn_batches=cfg.micro_batch * self.np,
                                                                  dtype=dtype)
            # the unfused path's mask, made once here as Megatron's data loader makes it
            self.mask = None if self.fused_softmax or self.flash else fused.causal_mask(cfg.seq, cfg.seq, device)
            sp = {"sequence_parallel": cfg.sequence_parallel, "bias": not cfg.llama,
                  "fusion": cfg.gradient_accumulation_fusion}
            qkv = (cfg.heads + 2 * cfg.query_groups) * self.hn
            ffn = cfg.ffn_size * (2 if cfg.llama else 1)     # SwiGLU's two halves
            self.ln1 = self._norm(cfg, device, dtype)
            self.qkv = ColumnParallelLinear(h, qkv, group, **kw, **sp)
            self.proj = RowParallelLinear(h, h, group, skip_bias_add=True, **kw, **sp)
            self.ln2 = self._norm(cfg, device, dtype)
            self.moe = None
            if cfg.num_experts and moe:
                from echo_et.workloads.moe import MoEMLP

                ep_group, tp_ep_group = moe_groups or (None, None)
                cp = dist.get_world_size(cp_group) if cp_group is not None else 1
                seq = cfg.seq // cp // (tp if cfg.sequence_parallel else 1)
                self.moe = MoEMLP(cfg, group if tp > 1 else None, ep_group, tp_ep_group,
                                  tokens=seq * cfg.micro_batch, **kw)
                if cfg.moe_shared_ffn:      # Megatron-Core's SharedExpertMLP: a dense MLP beside the experts
                    width = cfg.moe_shared_ffn * (2 if cfg.llama else 1)
                    self.shared_fc1 = ColumnParallelLinear(h, width, group, skip_bias_add=True, **kw, **sp)
                    self.shared_fc2 = RowParallelLinear(cfg.moe_shared_ffn, h, group, **kw, **sp)
            else:
                self.fc1 = ColumnParallelLinear(h, ffn, group, skip_bias_add=True, **kw, **sp)
                self.fc2 = RowParallelLinear(cfg.ffn_size, h, group, skip_bias_add=True, **kw, **sp)
            if self.qkv.sequence_parallel:      # the layer norms run on s / tp rows
                mark_sequence_parallel(*self.ln1.parameters(), *self.ln2.parameters())

        @staticmethod
        def _norm(cfg, device, dtype) -> nn.Module:
            return RMSNorm(cfg.hidden, device, dtype) if cfg.llama else nn.LayerNorm(cfg.hidden, device=device,
                                                                                     dtype=dtype)

        def attention(self, x: torch.Tensor):
            np_, hn = self.np, self.hn
            mixed = self.qkv(x)
            s, b = mixed.shape[:2]              # the whole sequence, sequence-parallel or not
            if self.ng == np_ and self.llama is None and not self.flash:
                mixed = mixed.view(s, b, np_, 3 * hn)
                q, k, v = mixed.split(hn, dim=-1)
                q = q.view(s, b * np_, hn).transpose(0, 1)
                k = k.view(s, b * np_, hn).transpose(0, 1)
                v = v.view(s, b * np_, hn).transpose(0, 1)
                # Megatron: baddbmm with beta = 0 (a plain batched GEMM), then its fused
                # scale + causal mask + softmax kernel.
                ctx = (checkpoint(self.core_attention, q, k, v) if self.recompute_core
                       else self.core_attention(q, k, v))
                return self.proj(ctx)
            if self.ng == np_:
                q, k, v = mixed.view(s, b, np_, 3 * hn).split(hn, dim=-1)
            else:   # Megatron's grouped layout: per group, its queries, then its key and value
                mixed = mixed.view(s, b, self.ng, (np_ // self.ng + 2) * hn)
                q, k, v = mixed.split([np_ // self.ng * hn, hn, hn], dim=-1)
                q = q.reshape(s, b, np_, hn)
            if self.llama is not None:
                q, k = self.llama.rotate(q), self.llama.rotate(k)
            core = self.flash_attention if self.flash else self.grouped_core_attention
            ctx = checkpoint(core, q, k, v) if self.recompute_core else core(q, k, v)
            return self.proj(ctx)

        def flash_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            """Megatron's ``FlashSelfAttention`` (``--use-flash-attn``) on ``[s, b, heads, d]``:
            the inputs made ``[b, s, heads, d]`` contiguous, one causal flash-attention kernel
            (grouped key and value heads as they are), the context back to ``[s, b, h]``."""
            s, b, np_, hn = q.shape
            q, k, v = (t.transpose(0, 1).contiguous().transpose(1, 2) for t in (q, k, v))
            if self.cp_group is not None:
                from echo_et.workloads.context_parallel import context_parallel_attention

                out = context_parallel_attention(q, k, v, self.cp_group, self.p, self.norm, self.cp_comm_type)
            elif q.device.type == "meta":
                out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, self.p, True)[0]
            else:
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, dropout_p=self.p, is_causal=True, enable_gqa=k.shape[1] != np_)
            return out.permute(2, 0, 1, 3).contiguous().view(s, b, np_ * hn)

        def grouped_core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            """:meth:`core_attention` on ``[s, b, heads, d]``, each key/value head repeated for
            its group's queries first (Megatron's ``repeat_interleave``)."""
            s, b, np_, hn = q.shape
            if k.shape[2] != np_:
                k = k.repeat_interleave(np_ // k.shape[2], dim=2)
                v = v.repeat_interleave(np_ // v.shape[2], dim=2)
            q, k, v = (t.reshape(s, b * np_, hn).transpose(0, 1) for t in (q, k, v))
            return self.core_attention(q, k, v)

        def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            bnp, s, hn = q.shape
            b, np_ = bnp // self.np, self.np
            scores = torch.bmm(q, k.transpose(1, 2)).view(b, np_, s, s)
            probs = (fused.scaled_upper_triang_masked_softmax(scores, self.norm) if self.fused_softmax
                     else fused.torch_softmax(scores, self.norm, self.mask))
            probs = dropout(probs, self.p)
            ctx = torch.bmm(probs.view(b * np_, s, s), v)
            return ctx.view(b, np_, s, hn).permute(2, 0, 1, 3).contiguous().view(s, b, np_ * hn)

        def normed(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
            """A layer norm's output; recomputed in the backward with Megatron-Core's
            "layernorm" recompute module (its output-discarding checkpoint: the norm runs again
            before the GEMM that reads it)."""
            return checkpoint(norm, x) if self.recompute_norm else norm(x)

        def mlp(self, x: torch.Tensor) -> torch.Tensor:
            """The MLP up to the second GEMM's output, its bias left to the caller (the GPT
            layer's GeLU, the llama layer's SwiGLU); checkpointed with the "mlp" module."""
            if self.moe is not None:
                out = self.moe(x)
                if hasattr(self, "shared_fc1"):
                    h, b = self.shared_fc1(x)
                    out = out + self.shared_fc2(fused.swiglu(h) if self.llama is not None else fused.bias_gelu(h, b))
                return out

            def run(y: torch.Tensor) -> torch.Tensor:
                h, b = self.fc1(y)
                return self.fc2(fused.swiglu(h) if self.llama is not None else fused.bias_gelu(h, b))[0]

            return checkpoint(run, x) if self.recompute_mlp else run(x)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.llama is not None:
                return self.llama.forward(self, x)
            out, bias = self.attention(self.normed(self.ln1, x))
            x = bias_dropout_add(out, bias, x, self.p)
            out = self.mlp(self.normed(self.ln2, x))
            if self.moe is not None:        # the experts added their own biases
                return x + dropout(out, self.p)
            return bias_dropout_add(out, self.fc2.bias, x, self.p)

    return MegatronBlock


class RMSNorm(nn.Module):
    """Megatron's fused RMSNorm (the llama architecture): one weight, no bias."""

    def __init__(self, hidden: int, device, dtype, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from echo_et.workloads import fused

        return fused.rms_norm(x, self.weight, self.eps)


class LlamaParts:
    """What Megatron-LM's Llama layer runs where the GPT layer runs its own: the rotary
    position embedding of the queries and keys (its fused kernel; the frequencies made once,
    as Megatron caches them per sequence length), and the layer's order of operations with
    RMSNorm, no linear biases (the residual adds are plain, with Megatron's dropout where
    one is asked for) and the SwiGLU MLP."""

    def __init__(self, cfg, device, cp_group=None):
        from echo_et.workloads import fused

        self.freqs = fused.rotary_freqs(cfg.seq, cfg.hidden // cfg.heads, device)
        if cp_group is not None:      # the positions of this context-parallel rank's chunks
            from echo_et.workloads.context_parallel import split_sequence

            self.freqs = split_sequence(self.freqs, 0, dist.get_world_size(cp_group), dist.get_rank(cp_group))

    def rotate(self, t: torch.Tensor) -> torch.Tensor:
        from echo_et.workloads import fused

        return fused.rotary_pos_emb(t, self.freqs)

    @staticmethod
    def forward(block, x: torch.Tensor) -> torch.Tensor:

        out, _ = block.attention(block.normed(block.ln1, x))
        x = x + dropout(out, block.p)
        return x + dropout(block.mlp(block.normed(block.ln2, x)), block.p)


class CheckpointFunction(torch.autograd.Function):
    """Megatron's reentrant activation checkpoint: ``forward`` runs ``fn`` without keeping its
    activations; ``backward`` runs ``fn`` again with them and back-propagates through it."""

    @staticmethod
    def forward(ctx, fn, *xs):
        ctx.fn = fn
        ctx.save_for_backward(*xs)
        with torch.no_grad():
            return fn(*xs)

    @staticmethod
    def backward(ctx, grad):
        xs = [x.detach().requires_grad_(True) for x in ctx.saved_tensors]
        with torch.enable_grad():
            out = ctx.fn(*xs)
        torch.autograd.backward(out, grad)
        return (None, *(x.grad for x in xs))


def checkpoint(fn, *xs: torch.Tensor) -> torch.Tensor:
    return CheckpointFunction.apply(fn, *xs)


class PartitionedCheckpointFunction(torch.autograd.Function):
    """DeepSpeed's activation checkpoint with ``partition_activations`` (Megatron-DeepSpeed's
    ``--partition-activations``): the forward keeps only this tensor-parallel rank's 1/TP
    piece of the layer's input (``narrow().clone()``; the TP ranks hold the same input), and
    the backward gathers the pieces over the TP group before it runs the layer again."""

    @staticmethod
    def forward(ctx, fn, group, x):
        from echo_et.workloads.deepspeed_pipe import own_piece

        ctx.fn, ctx.group, ctx.shape = fn, group, x.shape
        parts, part = ((dist.get_world_size(group), dist.get_rank(group)) if group is not None else (1, 0))
        ctx.save_for_backward(own_piece(x, parts, part))
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, grad):
        from echo_et.workloads.deepspeed_pipe import gather_pieces

        (piece,) = ctx.saved_tensors
        whole = piece if ctx.group is None else gather_pieces(piece, ctx.group)
        x = whole.view(ctx.shape).detach().requires_grad_(True)
        with torch.enable_grad():
            out = ctx.fn(x)
        torch.autograd.backward(out, grad)
        return None, None, x.grad


def partitioned_checkpoint(fn, group, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` under DeepSpeed's partitioned checkpoint; ``group`` the TP group (None or a
    group of one: the whole input is kept, as DeepSpeed's clone of it)."""
    if group is not None and dist.get_world_size(group) == 1:
        group = None
    return PartitionedCheckpointFunction.apply(fn, group, x)


# Who scales the float16 loss: nobody (bfloat16, float32), Megatron's DynamicGradScaler, or
# DeepSpeed's FP16_Optimizer (Megatron-DeepSpeed with DeepSpeed's pipeline engine).
LOSS_SCALERS = ("", "megatron", "deepspeed")


class MixedPrecisionAdam:
    """Adam with Megatron's float16 optimizer around it (see the module docstring). With a
    float32 model there are no master copies: Adam runs on the model's weights."""

    def __init__(self, params: list[nn.Parameter], mp_group, *, lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.1, loss_scaling: str = ""):
        if loss_scaling not in LOSS_SCALERS:
            raise ValueError(f"loss_scaling {loss_scaling!r} is not one of {LOSS_SCALERS}")
        self.params = [p for p in params if p.requires_grad]
        self.mp_group = mp_group
        self.loss_scaling = loss_scaling
        self.hp = {"lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps,
                   "weight_decay": weight_decay}
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        with torch.no_grad():
            self.main = ([p.detach().float() for p in self.params] if self.mixed
                         else [p.detach() for p in self.params])
            self.exp_avg = [torch.zeros_like(m) for m in self.main]
            self.exp_avg_sq = [torch.zeros_like(m) for m in self.main]
            self.steps = [torch.zeros((), dtype=torch.float32, device=m.device) for m in self.main]
            if loss_scaling == "megatron":     # the scaler's overflow flag and 1 / scale
                device = self.main[0].device if self.main else None
                self.found_inf = torch.zeros(1, dtype=torch.float32, device=device)
                self.inv_scale = torch.ones(1, dtype=torch.float32, device=device)

    def _unscale_and_check(self, grads: list[torch.Tensor]) -> None:
        """Megatron's float16 path (its DynamicGradScaler; bfloat16 has none): the main
        gradients divided by the loss scale and checked for inf/NaN in one multi-tensor
        kernel, the flag agreed on over the model-parallel group (MAX) and read on the host,
        before the gradient norm."""
        self.found_inf.fill_(0.0)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, self.inv_scale)
        if self.mp_group is not None and dist.get_world_size(self.mp_group) > 1:
            with comm_span(self.mp_group):
                dist.all_reduce(self.found_inf, op=dist.ReduceOp.MAX, group=self.mp_group)
        stream_sync(self.found_inf.device)     # found_inf.item()

    @torch.no_grad()
    def step(self, first: int = 0, between: Callable[[], None] | None = None) -> None:
        """One step. With ``between``, the update runs in two parts, as Megatron-Core's
        ChainedOptimizer runs two optimizers after one gradient norm: the first ``first``
        parameters, then ``between()``, then the rest (``--overlap-param-gather-with-optimizer-step``
        issues the first model chunk's all-gathers there)."""
        from echo_et.workloads.data_parallel import grad_of

        grads = [grad_of(p) for p in self.params]
        if self.mixed:     # a no-op for gradients accumulated in fp32 (main_grad)
            grads = [g.float() for g in grads]
        if self.loss_scaling == "megatron" and grads:
            self._unscale_and_check(grads)
        # Gradient clipping needs the global norm: local squares, summed over the model.
        norms = torch._foreach_norm(grads, 2.0)
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0) ** 2.0
        if self.mp_group is not None and dist.get_world_size(self.mp_group) > 1:
            with comm_span(self.mp_group):
                dist.all_reduce(total, group=self.mp_group)
        total = total ** 0.5
        stream_sync(total.device)     # Megatron reads the norm on the host (.item())
        if self.loss_scaling == "deepspeed" and grads:
            # DeepSpeed's FP16_Optimizer finds an overflow in the norm it has just read, and
            # unscales (with the clipping) in one pass over the gradients: no flag of its own
            torch._foreach_mul_(grads, 1.0)
        torch._foreach_add_(self.steps, 1)
        parts = [slice(0, first), slice(first, None)] if between is not None else [slice(None)]
        for i, part in enumerate(parts):
            if i:
                between()
            if not self.main[part]:
                continue
            torch._fused_adam_(self.main[part], grads[part], self.exp_avg[part], self.exp_avg_sq[part], [],
                               self.steps[part], amsgrad=False, maximize=False, **self.hp)
            if self.mixed:
                torch._foreach_copy_([p.data for p in self.params[part]], self.main[part])
