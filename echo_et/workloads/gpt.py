"""A GPT-style decoder in plain PyTorch, split Megatron-style over tp x pp x dp.

One pipeline stage holds ``layers / pp`` transformer blocks; stage 0 adds the vocab-parallel
word embedding and a learned position embedding, the last stage the final LayerNorm, the
vocab-parallel output projection and the vocab-parallel cross-entropy. Inside a block the
QKV and first MLP projections are column-parallel and the attention output and second MLP
projections row-parallel (one all-reduce each in forward and in backward). A step runs the
1F1B schedule over ``microbatches`` micro-batches, then the data-parallel gradient
synchronisation (all-reduce, or ZeRO-1 reduce-scatter + all-gather) and Adam.

Every forward/backward/optimizer phase, micro-batch, pipeline stage and layer is marked
with the span names of :mod:`echo_et.trace.annotations`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass

from echo_et.errors import EchoError
from echo_et.trace.context import RankContext
from echo_et.trace.layout import ParallelLayout

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    seq: int = 32
    micro_batch: int = 2
    vocab: int = 256
    ffn_mult: int = 4
    dtype: str = "float32"
    bucket_mb: float = 25.0
    seed: int = 1234

    def validate(self, layout: ParallelLayout) -> None:
        where = f"layout {layout.describe()}"
        for name in ("layers", "hidden", "heads", "seq", "micro_batch", "vocab", "ffn_mult"):
            if int(getattr(self, name)) < 1:
                raise EchoError(f"{where}: gpt {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise EchoError(f"{where}: heads ({self.heads}) must divide hidden ({self.hidden})")
        if self.heads % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide heads ({self.heads})")
        if self.hidden % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide hidden ({self.hidden})")
        if self.layers % layout.pp:
            raise EchoError(f"{where}: pp ({layout.pp}) must divide layers ({self.layers})")
        if self.dtype not in DTYPES:
            raise EchoError(f"{where}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.bucket_mb <= 0:
            raise EchoError(f"{where}: bucket size must be > 0 MB, got {self.bucket_mb}")

    def parameters(self) -> int:
        """Parameters of the whole (unsplit) model, for reports."""
        h, f = self.hidden, self.hidden * self.ffn_mult
        block = 3 * h * h + 3 * h + h * h + h + h * f + f + f * h + h + 4 * h
        return self.layers * block + self.vocab * h + self.seq * h + 2 * h + h * self.vocab + self.vocab

    def to_json(self) -> dict:
        return asdict(self)


def build_gpt(cfg: GPTConfig) -> Callable[[RankContext], Callable[[], None]]:
    """A build function (see :mod:`echo_et.trace.context`) for this GPT configuration."""

    def build(ctx: RankContext) -> Callable[[], None]:
        cfg.validate(ctx.layout)
        return _GPTRank(cfg, ctx).step

    return build


class _GPTRank:
    """Rank ``ctx.rank``'s stage of the model, its data, and its training step."""

    def __init__(self, cfg: GPTConfig, ctx: RankContext):
        import torch

        from echo_et.workloads.data_parallel import GradientSync
        from echo_et.workloads.pipeline import StageLink

        self.cfg = cfg
        self.ctx = ctx
        layout = ctx.layout
        ctx.make_groups()
        tp_group, dp_group, pp_group = ctx.group("tp"), ctx.group("dp"), ctx.group("pp")
        self.device = torch.device(ctx.device)
        self.dtype = getattr(torch, cfg.dtype)
        self.stage = ctx.pp_rank
        per_stage = cfg.layers // layout.pp
        self.first_layer = self.stage * per_stage
        # Initialisation draws on the parameters' own device (a CPU generator cannot fill a
        # CUDA tensor); the data is drawn on CPU and copied, as a data loader would.
        gen = torch.Generator(device=self.device).manual_seed(
            cfg.seed + 7919 * ctx.pp_rank + ctx.tp_rank)
        self.model = _Stage(cfg, layout, self.stage, self.first_layer, per_stage, tp_group,
                            gen=gen, device=self.device, dtype=self.dtype)
        self.link = StageLink(pp_group, (cfg.micro_batch, cfg.seq, cfg.hidden), self.dtype,
                              self.device)
        self.sync = GradientSync(
            list(self.model.parameters()), dp_group, zero=layout.zero,
            bucket_bytes=int(cfg.bucket_mb * 1024 * 1024),
            optimizer_factory=lambda ps: torch.optim.Adam(ps, lr=1e-4),
        )
        data_gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 104729 * ctx.dp_rank)
        tokens = torch.randint(0, cfg.vocab, (layout.microbatches, cfg.micro_batch, cfg.seq + 1),
                               generator=data_gen)
        self.inputs = tokens[..., :-1].contiguous().to(self.device)
        self.labels = tokens[..., 1:].contiguous().to(self.device)

    def _forward(self, mb: int, inp):
        from echo_et.workloads.markers import span

        with span(phase="forward", mb=mb, stage=self.stage):
            x = self.inputs[mb] if inp is None else inp
            out = self.model(x)
            if self.link.last:
                out = self.model.loss(out, self.labels[mb]) / self.ctx.layout.microbatches
            return out

    def _backward(self, mb: int, inp, out, out_grad):
        import torch

        from echo_et.workloads.markers import span

        with span(phase="backward", mb=mb, stage=self.stage):
            if mb == self.ctx.layout.microbatches - 1:
                self.sync.arm()
            if out_grad is None:
                torch.autograd.backward(out)
            else:
                torch.autograd.backward(out, grad_tensors=out_grad)
            return None if inp is None else inp.grad

    def step(self) -> None:
        from echo_et.workloads.markers import span
        from echo_et.workloads.pipeline import one_f_one_b

        one_f_one_b(self.link, self.ctx.layout.microbatches, self._forward, self._backward)
        with span(phase="optimizer", stage=self.stage):
            self.sync.finish_and_step()


@functools.cache
def _stage_class():
    """The nn.Module classes, defined on first use so that importing this module needs no
    torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from echo_et.workloads.markers import backward_begins_here, backward_ends_here, span
    from echo_et.workloads.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        padded_vocab,
        vocab_parallel_cross_entropy,
        vocab_range,
    )

    class Block(nn.Module):
        def __init__(self, cfg: GPTConfig, tp: int, group, **kw):
            super().__init__()
            h = cfg.hidden
            self.local_heads = cfg.heads // tp
            self.head_dim = h // cfg.heads
            self.ln1 = nn.LayerNorm(h, device=kw["device"], dtype=kw["dtype"])
            self.qkv = ColumnParallelLinear(h, 3 * h, group, **kw)
            self.proj = RowParallelLinear(h, h, group, **kw)
            self.ln2 = nn.LayerNorm(h, device=kw["device"], dtype=kw["dtype"])
            self.fc1 = ColumnParallelLinear(h, cfg.ffn_mult * h, group, **kw)
            self.fc2 = RowParallelLinear(cfg.ffn_mult * h, h, group, **kw)

        def attention(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            qkv = self.qkv(x).view(b, s, 3, self.local_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(ctx.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Stage(nn.Module):
        def __init__(self, cfg: GPTConfig, layout: ParallelLayout, stage: int, first_layer: int,
                     count: int, group, *, gen, device, dtype):
            super().__init__()
            kw = {"gen": gen, "device": device, "dtype": dtype}
            self.cfg = cfg
            self.group = group
            self.first = stage == 0
            self.last = stage == layout.pp - 1
            self.first_layer = first_layer
            self.vocab = padded_vocab(cfg.vocab, layout.tp)
            if self.first:
                self.embed = VocabParallelEmbedding(self.vocab, cfg.hidden, group, **kw)
                self.pos = nn.Parameter(torch.empty(cfg.seq, cfg.hidden, device=device,
                                                    dtype=dtype))
                with torch.no_grad():
                    self.pos.normal_(0.0, 0.02, generator=gen)
            self.blocks = nn.ModuleList(Block(cfg, layout.tp, group, **kw) for _ in range(count))
            if self.last:
                self.ln_f = nn.LayerNorm(cfg.hidden, device=device, dtype=dtype)
                self.head = ColumnParallelLinear(cfg.hidden, self.vocab, group, **kw)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.first:
                x = self.embed(x) + self.pos
            for i, block in enumerate(self.blocks):
                layer = self.first_layer + i
                with span(layer=layer):
                    x = backward_ends_here(x, layer=layer)
                    x = block(x)
                    x = backward_begins_here(x, layer=layer)
            if self.last:
                x = self.head(self.ln_f(x))
            return x

        def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            start, end = vocab_range(self.vocab, self.group)
            return vocab_parallel_cross_entropy(logits, labels, self.group, start, end).mean()

    return Stage


def _Stage(*args, **kwargs):  # noqa: N802 - a class factory used like a class
    return _stage_class()(*args, **kwargs)
