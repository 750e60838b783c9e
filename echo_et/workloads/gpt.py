"""A GPT-style decoder in plain PyTorch, split Megatron-style over tp x pp x dp.

One pipeline stage holds ``layers / pp`` transformer blocks; stage 0 adds the vocab-parallel
word embedding and a learned position embedding, the last stage the final LayerNorm, the
vocab-parallel output projection and the vocab-parallel cross-entropy. Inside a block the
QKV and first MLP projections are column-parallel and the attention output and second MLP
projections row-parallel (one all-reduce each in forward and in backward). A step runs the
1F1B schedule over ``microbatches`` micro-batches (with ``layers_per_virtual_stage`` N or
``virtual_stages_per_rank`` V, Megatron's interleaved one: each stage's layers in V model
chunks, chunk c of stage s being virtual stage c x pp + s; with N, V is layers / (pp x N) and
chunk c of stage s holds the N layers from (c x pp + s) x N), then the data-parallel gradient
synchronisation (all-reduce, or ZeRO-1 reduce-scatter + all-gather) and Adam.

``GPTConfig.megatron(...)`` (the ``megatron-gpt`` workload) is the same model as
Megatron-DeepSpeed trains it for GPT pretraining (:mod:`echo_et.workloads.megatron`): the
``[s, b, h]`` layer with Megatron's unfused core attention and dropout, the vocabulary
padded to a multiple of 128 x tp, the word embedding shared by the first and the last
pipeline stage as the output layer (its gradient all-reduced between them before the
optimizer, over the "embd" group), the data-parallel gradients reduced in one all-reduce
after the backward pass, activations and gradients sent between pipeline stages as 1/tp
slices all-gathered in the receiving stage's TP group (``scatter_gather_tensors_in_pipeline``,
Megatron's default), and fp32 master weights with a global gradient norm (all-reduced
over the model-parallel "mp" group) and fused Adam. ``recompute`` (either model) recomputes
activations in the backward, at ``recompute_granularity``: "full" (Megatron's
``--checkpoint-activations``, ``--recompute-granularity full``: each layer under one
checkpoint) or "selective" (``--recompute-activations``: only the core attention, from the
scores to the context, is checkpointed).

Every forward/backward/optimizer phase, micro-batch, pipeline stage and layer is marked
with the span names of :mod:`echo_et.trace.annotations`; each layer is a repeated unit
(:func:`echo_et.trace.units.repeat_unit`) that a meta-device trace records once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from echo_et.trace.context import RankContext
from echo_et.trace.layout import ParallelLayout
from echo_et.workloads.gpt_config import GPTConfig


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
        from echo_et.workloads.deepspeed_pipe import DeepSpeedLink
        from echo_et.workloads.pipeline import StageLink

        self.cfg = cfg
        self.ctx = ctx
        layout = ctx.layout
        ctx.make_groups()
        tp_group, dp_group, pp_group = ctx.group("tp"), ctx.group("dp"), ctx.group("pp")
        self.dp_group = dp_group
        # context parallelism: the ranks that split each sequence, and the data-parallel group
        # with them (they hold the same weights), whose gradients Megatron-Core reduces together
        self.cp_group = ctx.group("cp") if layout.cp > 1 else None
        grad_group = ctx.group("dp_cp") if layout.cp > 1 else dp_group
        # mixture of experts: the tokens' exchange groups, and the expert parameters' gradient
        # group (the ranks holding the same experts; the dense one without expert parallelism)
        moe_groups = (ctx.group("ep"), ctx.group("tp_ep")) if cfg.num_experts and layout.ep > 1 else None
        expert_group = ctx.group("edp") if moe_groups else grad_group
        self.device = torch.device(ctx.device)
        self.dtype = getattr(torch, cfg.dtype)
        self.stage = ctx.pp_rank
        self.megatron = cfg.attention == "megatron"
        self.deepspeed = cfg.pipeline_engine == "deepspeed"
        self.chunks = cfg.virtual_chunks(layout.pp)
        per_chunk = cfg.stage_layer_counts(layout.pp)[ctx.pp_rank] // self.chunks
        # Initialisation draws on the parameters' own device (a CPU generator cannot fill a
        # CUDA tensor); the data is drawn on CPU and copied, as a data loader would. On the
        # meta device there are no values to draw (gen None).
        gen = None if self.device.type == "meta" else torch.Generator(
            device=self.device).manual_seed(cfg.seed + 7919 * ctx.pp_rank + ctx.tp_rank)
        last_stage = self.stage == layout.pp - 1
        self.models = [_Stage(cfg, layout, self.stage, cfg.chunk_first_layer(layout.pp, self.stage, c),
                              per_chunk, tp_group, gen=gen, device=self.device, dtype=self.dtype,
                              first=self.stage == 0 and c == 0,
                              last=last_stage and c == self.chunks - 1,
                              chunk=c if self.chunks > 1 else None, cp_group=self.cp_group,
                              moe_groups=moe_groups)
                       for c in range(self.chunks)]
        # the chunk whose word embedding is shared: the first chunk of the first stage, the
        # last chunk of the last stage (chunk 0 of any other stage, which has none)
        self.model = self.models[-1 if last_stage else 0]
        # with sequence parallelism a stage sends its s / tp rows (and nothing is split again)
        sp = cfg.sequence_parallel and layout.tp > 1
        seq = cfg.seq // layout.cp       # a context-parallel rank's share of the sequence
        shape = ((seq // layout.tp if sp else seq, cfg.micro_batch, cfg.hidden) if self.megatron
                 else (cfg.micro_batch, seq, cfg.hidden))
        if self.deepspeed:      # partitioned whenever TP > 1, whatever Megatron's flag says
            self.link = DeepSpeedLink(pp_group, shape, self.dtype, self.device, split_group=tp_group)
        else:
            self.link = StageLink(pp_group, shape, self.dtype, self.device, sync_after=self.megatron,
                                  sync_before=cfg.sync_timers,
                                  split_group=tp_group if cfg.scatter_gather_tensors_in_pipeline and not sp
                                  else None)
        self.tp_group = tp_group
        # The shared word embedding lives on the first and the last stage; Megatron
        # all-reduces its gradient between them.
        self.embd_group = None
        if cfg.tie_embeddings and layout.pp > 1 and (self.link.first or self.link.last):
            self.embd_group = ctx.group("embd")
        if cfg.optimizer == "megatron":
            from echo_et.workloads.megatron import MixedPrecisionAdam

            # the gradient norm's group: the model-parallel ranks hold the whole model's
            # gradients between them; with the distributed optimizer (ZeRO 1) each holds a
            # data-parallel shard of them, so the norm sums over the world (Megatron's
            # DistributedOptimizer has no model-parallel group of its own)
            if layout.zero and layout.world_size > 1:
                mp_group = ctx.group("world")
            else:
                mp_group = ctx.group("mp") if layout.tp * layout.pp > 1 else None

            scaler = "" if cfg.dtype != "float16" else cfg.pipeline_engine

            def factory(ps):
                return MixedPrecisionAdam(ps, mp_group, loss_scaling=scaler)
        else:
            def factory(ps):
                return torch.optim.Adam(ps, lr=1e-4)
        cap = int(cfg.bucket_mb * 1024 * 1024)
        if cfg.overlap_grad_reduce:
            # Megatron-Core buckets the first stage's first model chunk only: elsewhere its
            # reduction is off the critical path, and each chunk is one bucket
            # (nowhere with the first chunk's gathers after its optimizer step)
            caps = [cap if self.stage == 0 and c == 0 and not cfg.overlap_param_gather_with_optimizer_step
                    else 1 << 62 for c in range(self.chunks)]
        from echo_et.workloads.moe import is_expert

        params = [p for m in self.models for p in m.ddp_parameters()]
        dense = [p for p in params if not is_expert(p)]
        experts = [p for p in params if is_expert(p)]
        buffers = [m.ddp_parameters() for m in self.models] if self.chunks > 1 else None
        bucket_bytes = (caps if self.chunks > 1 else caps[0]) if cfg.overlap_grad_reduce else cap
        common = {"zero": layout.zero, "optimizer_factory": factory, "overlap": cfg.grad_sync == "overlap",
                  "grad_dtype": getattr(torch, cfg.grad_buffer_dtype), "buffers": buffers,
                  "flatten": self.deepspeed, "reduce_scatter": cfg.grad_reduce_scatter,
                  # Megatron-LM aligns both across the stages with the interleaved schedule, and
                  # without it issues the later stages' reductions after the schedule
                  "align_gather": self.chunks > 1 and cfg.align_param_gather,
                  "align_reduce": cfg.overlap_grad_reduce and cfg.align_grad_reduce
                  and (self.chunks > 1 or self.stage > 0),
                  "gather_with_step": cfg.overlap_param_gather_with_optimizer_step}
        self.sync = GradientSync(
            dense, grad_group, bucket_bytes=bucket_bytes,
            gather_in_forward=self.models if cfg.overlap_param_gather else None,
            alone=self._shared_embedding() if cfg.overlap_grad_reduce and layout.zero else None, **common)
        if experts:
            from echo_et.workloads.data_parallel import ChainedSync

            expert_sync = GradientSync(experts, expert_group, bucket_bytes=bucket_bytes,
                                       average_over=layout.dp * layout.cp, **common)
            self.sync = ChainedSync([self.sync, expert_sync])
        data_gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 104729 * ctx.dp_rank)
        tokens = torch.randint(0, cfg.vocab, (layout.microbatches, cfg.micro_batch, cfg.seq + 1),
                               generator=data_gen)
        if self.megatron:
            # Megatron's get_batch cuts each micro-batch on the device (megatron.get_batch)
            self.text = tokens
        else:
            self.inputs = tokens[..., :-1].contiguous().to(self.device)
            self.labels = tokens[..., 1:].contiguous().to(self.device)
        # (micro-batch, chunk) whose forward was a recording
        self._replayed: set[tuple[int, int]] = set()

    def _key(self, key: tuple, chunk: int) -> tuple:
        """A repeated region's key: each model chunk is its own work (its layers, and the
        embedding or the loss on the model's first or last chunk)."""
        return key + (chunk,) if self.chunks > 1 else key

    def _is_last(self, chunk: int) -> bool:
        return self.link.last and chunk == self.chunks - 1

    def _forward(self, mb: int, inp, chunk: int = 0):
        from echo_et.trace.units import repeat_region

        # A micro-batch's forward (and backward) is the same work for every micro-batch: a
        # meta-device trace records the first and copies it (:mod:`echo_et.trace.units`).
        key = self._key(("gpt-forward", self._replay_ok(mb), inp is None)
                        + (("gathers",) if self._gathers(mb) else ()), chunk)
        out, replayed = repeat_region(key, lambda: self._run_forward(mb, inp, chunk), mb=mb)
        if replayed:
            self._replayed.add((mb, chunk))
        return out

    def _run_forward(self, mb: int, inp, chunk: int = 0):
        from echo_et.workloads.markers import span

        model = self.models[chunk]
        with span(phase="forward", mb=mb, stage=self.stage):
            self._timer_edge()           # forward-compute and batch-generator start
            batch = None
            if self.megatron and self._loads_data:
                from echo_et.workloads.megatron import get_batch

                batch = get_batch(self.text[mb], self.tp_group, self.device)
                if self.cp_group is not None:
                    from echo_et.workloads.megatron import batch_on_cp_rank

                    batch = batch_on_cp_rank(batch, self.cp_group)
                self._timer_edge()       # batch-generator stop
            if self.deepspeed and self.link.first:
                self._engine_copies(batch, mb)
            if inp is None:
                inp = self.inputs[mb] if batch is None else batch.tokens
            out = model(inp, replay=self._replay_ok(mb), position_ids=None if batch is None else batch.position_ids)
            if self._is_last(chunk):
                # the gpt flavour's labels are cut only here (a select the host runs)
                loss = (model.loss(out, self.labels[mb]) if batch is None
                        else model.loss(out, batch.labels, batch.loss_mask))
                out = loss / self.ctx.layout.microbatches
                if self.deepspeed:       # the engine sums the losses, divided at the end
                    self.total_loss.add_(loss.detach())
                elif batch is not None:
                    self._report_loss(out)
            self._timer_edge()           # forward-compute stop
            return out

    @property
    def _loads_data(self) -> bool:
        """Megatron runs get_batch on every stage; DeepSpeed's engine loads micro-batches on
        the first and the last stage only (``LoadMicroBatch``)."""
        return not self.deepspeed or self.link.first or self.link.last

    def _engine_copies(self, batch, mb: int) -> None:
        """DeepSpeed's engine copies the first stage's inputs twice: as it loads them
        (``clone().detach()``) and as the forward starts (``clone()``)."""
        loaded = ((self.inputs[mb],) if batch is None
                  else (batch.tokens, batch.position_ids, batch.attention_mask))
        for _ in range(2):
            loaded = tuple(t.clone() for t in loaded)

    def _aggregate_loss(self) -> None:
        """DeepSpeed's ``_aggregate_total_loss`` after the optimizer step: the last stage
        averages the step's loss over the data-parallel group and broadcasts it, with its
        data-parallel group's own, to the other stages of its pipeline."""
        import torch
        import torch.distributed as dist

        from echo_et.workloads.markers import comm_span

        layout = self.ctx.layout
        pp_group = self.ctx.group("pp")
        with torch.no_grad():
            if self.link.last:
                own = (self.total_loss / layout.microbatches).clone().detach()
                averaged = own.clone().detach()
                if layout.dp > 1:
                    with comm_span(self.dp_group):
                        dist.all_reduce(averaged, group=self.dp_group)
                    averaged /= layout.dp
                losses = torch.stack([own, averaged]).float()
            else:
                losses = torch.zeros(2).to(self.device, copy=True)
            if layout.pp > 1:
                with comm_span(pp_group):
                    dist.broadcast(losses, group_src=layout.pp - 1, group=pp_group)
            if not self.link.last:      # the engine's dp_group_loss and agg_train_loss
                self.losses = (losses[0].clone(), losses[1].clone())

    def _timer_edge(self) -> None:
        """A Megatron timer's start or stop: the host waits for the device (``sync_timers``)."""
        if self.cfg.sync_timers:     # megatron flavour only (GPTConfig.validate)
            from echo_et.workloads.markers import device_sync

            device_sync(self.device)

    def _report_loss(self, loss) -> None:
        """Megatron averages each micro-batch's loss over the data-parallel group for its
        log (``average_losses_across_data_parallel_group``): one small all-reduce."""
        import torch
        import torch.distributed as dist

        from echo_et.workloads.markers import comm_span

        with torch.no_grad():
            averaged = loss.clone().detach().view(1)
            with comm_span(self.dp_group):
                dist.all_reduce(averaged, group=self.dp_group)
            averaged.div_(self.ctx.layout.dp)

    def _replay_ok(self, mb: int) -> bool:
        """Layers may be recorded once unless an overlapped gradient sync watches their
        gradients (the last micro-batch's backward) or the first forward waits for their
        weights' all-gathers (the first micro-batch's, with the gather in the forward)."""
        return not ((self.sync.overlap and mb == self.ctx.layout.microbatches - 1) or self._gathers(mb))

    def _gathers(self, mb: int) -> bool:
        """Whether micro-batch ``mb``'s forward waits for the weights' all-gathers."""
        return self.cfg.overlap_param_gather and mb == 0

    def _backward(self, mb: int, inp, out, out_grad, chunk: int = 0):
        from echo_et.trace.units import repeat_region

        run = functools.partial(self._run_backward, mb, inp, out, out_grad, chunk)
        key = self._key(("gpt-backward", mb == self.ctx.layout.microbatches - 1 and self.sync.overlap,
                         inp is None), chunk)
        replay = (mb, chunk) in self._replayed
        self._replayed.discard((mb, chunk))
        return repeat_region(key, run, replay=replay, mb=mb)[0]

    def _run_backward(self, mb: int, inp, out, out_grad, chunk: int = 0):
        import torch

        from echo_et.workloads.markers import span

        with span(phase="backward", mb=mb, stage=self.stage):
            # each chunk's last backward: its buckets reduce as they fill (the interleaved
            # schedule's other micro-batches may still run other chunks' backward); aligned,
            # the schedule issues each chunk's whole after its backward (_reduce_chunk)
            if mb == self.ctx.layout.microbatches - 1 and not self.sync.align_reduce:
                self.sync.arm(chunk if self.chunks > 1 else None)
            self._timer_edge()           # backward-compute start
            if out_grad is None:
                torch.autograd.backward(out)
            else:
                torch.autograd.backward(out, grad_tensors=out_grad)
            self._timer_edge()           # backward-compute stop
            return None if inp is None else inp.grad

    def _before_step(self) -> None:
        """Between the data-parallel reduction and the optimizer, in Megatron's order: the
        sequence-parallel parameters' gradients, then the tied embedding's."""
        self._sync_sequence_parallel()
        self._sync_embedding()

    def _sync_sequence_parallel(self) -> None:
        """Megatron's ``allreduce_layernorm_grads``: the gradients of the parameters applied to
        s / tp rows on each TP rank, flattened into one buffer, all-reduced over the TP group
        and copied back."""
        from echo_et.workloads.data_parallel import all_reduce_flattened, grad_of
        from echo_et.workloads.tensor_parallel import is_sequence_parallel

        grads = [grad_of(p) for m in self.models for p in m.parameters() if is_sequence_parallel(p)]
        if grads:
            all_reduce_flattened(grads, self.tp_group)

    def _sync_embedding(self) -> None:
        import torch.distributed as dist

        from echo_et.workloads.data_parallel import grad_of
        from echo_et.workloads.markers import comm_span

        if self.embd_group is None:
            return
        with comm_span(self.embd_group):
            dist.all_reduce(grad_of(self.model.word_weight()), group=self.embd_group)

    def step(self) -> None:
        from echo_et.workloads.markers import span
        from echo_et.workloads.pipeline import interleaved_one_f_one_b, one_f_one_b

        if self.deepspeed:
            self._deepspeed_step()
            return
        if self.cfg.overlap_param_gather:
            with span(phase="forward", mb=0, stage=self.stage):
                self.sync.start_step()   # Megatron's zero_grad: the first bucket's all-gather
        if self.chunks > 1:
            interleaved_one_f_one_b(
                self.link, self.ctx.layout.microbatches, self.chunks,
                lambda mb, c, inp: self._forward(mb, inp, c),
                lambda mb, c, inp, out, grad: self._backward(mb, inp, out, grad, c),
                param_sync=self._gather_chunk if self.cfg.overlap_param_gather and self.sync.align_gather else None,
                grad_sync=self._reduce_chunk if self.sync.align_reduce else None,
                overlap_p2p=self.cfg.overlap_p2p_comm, group=self.cfg.microbatch_group_size,
                warmup_flush=self.cfg.overlap_p2p_comm_warmup_flush)
        else:
            one_f_one_b(self.link, self.ctx.layout.microbatches, self._forward, self._backward)
        with span(phase="optimizer", stage=self.stage):
            self.sync.finish_and_step(before_step=self._before_step)

    def _gather_chunk(self, chunk: int, mb: int) -> None:
        """The interleaved schedule's issue of one model chunk's weight all-gathers."""
        from echo_et.workloads.markers import span

        with span(phase="forward", mb=mb, stage=self.stage):
            self.sync.gather_chunk(chunk)

    def _shared_embedding(self) -> list:
        """The word embedding's copies on the first and the last stage (tied, pp > 1), which
        Megatron-Core's DDP gives a bucket of their own under the distributed optimizer."""
        if not (self.cfg.tie_embeddings and self.ctx.layout.pp > 1):
            return []
        return [m.word_weight() for m in self.models if m.first or m.last]

    def _reduce_chunk(self, chunk: int, mb: int) -> None:
        """The interleaved schedule's issue of one model chunk's gradient collectives."""
        from echo_et.workloads.markers import span

        with span(phase="backward", mb=mb, stage=self.stage):
            self.sync.reduce_chunk(chunk)

    def _deepspeed_step(self) -> None:
        """``PipelineEngine.train_batch``: the TrainSchedule's steps, then its closing
        instructions (the tied gradients reduced, then the data-parallel ones, then the
        optimizer), then the loss averaged and broadcast."""
        import torch

        from echo_et.workloads.deepspeed_pipe import train_batch
        from echo_et.workloads.markers import span

        if self.link.last:
            self.total_loss = torch.zeros((), dtype=torch.float32, device=self.device)
        train_batch(self.link, self.ctx.layout.microbatches, self._forward, self._backward)
        with span(phase="optimizer", stage=self.stage):
            self._sync_embedding()
            self.sync.finish_and_step()
            self._aggregate_loss()


def _gpu_attention(q, k, v):
    """Causal attention as a GPU's dispatcher runs it (a meta tensor would take the math
    fallback): flash attention for 16-bit inputs, memory-efficient attention for float32."""
    import torch

    if q.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0,
                                                                  True)[0]


def _causal_sdpa(q, k, v):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@functools.cache
def _stage_class():
    """The nn.Module classes, defined on first use so that importing this module needs no
    torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from echo_et.trace.units import repeat_unit
    from echo_et.workloads.markers import backward_begins_here, backward_ends_here, span
    from echo_et.workloads.megatron import (
        RMSNorm,
        checkpoint,
        dropout,
        megatron_block_class,
        partitioned_checkpoint,
    )
    from echo_et.workloads.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        copy_to_region,
        gather_from_sequence,
        mark_sequence_parallel,
        scatter_to_sequence,
        vocab_parallel_cross_entropy,
        vocab_range,
    )

    class Block(nn.Module):
        def __init__(self, cfg: GPTConfig, tp: int, group, **kw):
            super().__init__()
            h = cfg.hidden
            self.local_heads = cfg.heads // tp
            self.head_dim = h // cfg.heads
            self.recompute_core = cfg.recomputes_core_attention
            self.ln1 = nn.LayerNorm(h, device=kw["device"], dtype=kw["dtype"])
            self.qkv = ColumnParallelLinear(h, 3 * h, group, **kw)
            self.proj = RowParallelLinear(h, h, group, **kw)
            self.ln2 = nn.LayerNorm(h, device=kw["device"], dtype=kw["dtype"])
            self.fc1 = ColumnParallelLinear(h, cfg.ffn_size, group, **kw)
            self.fc2 = RowParallelLinear(cfg.ffn_size, h, group, **kw)

        def attention(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            qkv = self.qkv(x).view(b, s, 3, self.local_heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            core = _gpu_attention if x.device.type == "meta" else _causal_sdpa
            ctx = checkpoint(core, q, k, v) if self.recompute_core else core(q, k, v)
            return self.proj(ctx.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Stage(nn.Module):
        def __init__(self, cfg: GPTConfig, layout: ParallelLayout, stage: int, first_layer: int,
                     count: int, group, *, gen, device, dtype, first: bool | None = None,
                     last: bool | None = None, chunk: int | None = None, cp_group=None, moe_groups=None):
            """``first`` / ``last``: whether this holds the model's first / last layers (the
            first / last stage's by default; a model chunk's with interleaved stages).
            ``chunk``: this model chunk's index on its stage, with interleaved stages (each
            chunk records its own layer: a layer is recorded until its backward, which
            another chunk's backward can come before). ``cp_group``: the context-parallel
            group (None without one): each rank holds its chunks of the sequence.
            ``moe_groups``: the "ep" and "tp_ep" groups of a model with experts and expert
            parallelism (:mod:`echo_et.workloads.moe`)."""
            super().__init__()
            kw = {"gen": gen, "device": device, "dtype": dtype}
            self.cfg = cfg
            self.group = group
            self.cp_group = cp_group
            self.megatron = cfg.attention == "megatron"
            self.sequence_parallel = cfg.sequence_parallel and layout.tp > 1
            self.first = stage == 0 if first is None else first
            self.last = stage == layout.pp - 1 if last is None else last
            self.first_layer = first_layer
            # a layer recorded once stands for the others of its key: those of its chunk that run
            # under a checkpoint, or not (the block recompute method), at the same granularity
            # (and a dense layer of a mixture of experts is not its MoE layers' work)
            pattern = cfg.moe_layer_pattern()
            self.unit_keys = [("gpt-layer", cfg.layer_recompute_level(i)) + (() if chunk is None else (chunk,))
                              + (("dense",) if cfg.num_experts and not pattern[first_layer + i] else ())
                              for i in range(count)]
            self.vocab = cfg.padded_vocab(layout.tp)
            if self.first:
                self.embed = VocabParallelEmbedding(self.vocab, cfg.hidden, group, **kw)
            if self.first and not cfg.llama:    # the llama architecture's positions are rotary
                self.pos = nn.Parameter(torch.empty(cfg.seq, cfg.hidden, device=device,
                                                    dtype=dtype))
                if gen is not None:
                    with torch.no_grad():
                        self.pos.normal_(0.0, 0.02, generator=gen)
            if self.megatron:
                self.blocks = nn.ModuleList(megatron_block_class()(cfg, layout.tp, group, cp_group=cp_group,
                                                                   moe_groups=moe_groups, moe=pattern[first_layer + i],
                                                                   **kw)
                                            for i in range(count))
            else:
                self.blocks = nn.ModuleList(Block(cfg, layout.tp, group, **kw) for _ in range(count))
            if self.last:
                self.ln_f = (RMSNorm(cfg.hidden, device, dtype) if cfg.llama
                             else nn.LayerNorm(cfg.hidden, device=device, dtype=dtype))
                if self.sequence_parallel:
                    mark_sequence_parallel(*self.ln_f.parameters())
                if not cfg.tie_embeddings:      # Megatron's own output layer has no bias
                    self.head = ColumnParallelLinear(cfg.hidden, self.vocab, group, bias=not self.megatron,
                                                     fusion=cfg.gradient_accumulation_fusion, **kw)
                elif not self.first:
                    # The last stage's copy of the word embedding (Megatron keeps one there
                    # and all-reduces its gradient with the first stage's).
                    local = self.vocab // torch.distributed.get_world_size(group)
                    self.head_weight = nn.Parameter(torch.empty(local, cfg.hidden,
                                                                device=device, dtype=dtype))

        def ddp_parameters(self) -> list[nn.Parameter]:
            """The parameters in Megatron's module order, which its DDP fills buckets in
            reverse: the word embedding, the positions, the layers, the final norm, the output
            layer (the last stage's copy of the word embedding last). ``parameters()`` lists a
            module's own parameters (the positions, that copy) before its submodules'."""
            front = [self.embed.weight] if self.first else []
            front += [self.pos] if hasattr(self, "pos") else []
            back = [self.head_weight] if hasattr(self, "head_weight") else []
            placed = {id(p) for p in front + back}
            return front + [p for p in self.parameters() if id(p) not in placed] + back

        def word_weight(self) -> torch.Tensor:
            """The word embedding as the output layer sees it (tied embeddings)."""
            return self.embed.weight if self.first else self.head_weight

        def output_weight(self) -> torch.Tensor:
            """The output layer's weight: the word embedding's, or its own (untied)."""
            return self.word_weight() if self.cfg.tie_embeddings else self.head.weight

        def _layer(self, block, x: torch.Tensor, layer: int) -> torch.Tensor:
            with span(layer=layer):
                x = backward_ends_here(x, layer=layer)
                if not self.cfg.recomputes_layer(layer - self.first_layer):
                    x = block(x)
                elif self.cfg.partition_activations:
                    x = partitioned_checkpoint(block, self.group, x)
                else:
                    x = checkpoint(block, x)
                return backward_begins_here(x, layer=layer)

        def forward(self, x: torch.Tensor, replay: bool = True,
                    position_ids: torch.Tensor | None = None) -> torch.Tensor:
            """``position_ids``: Megatron's, from its get_batch (megatron flavour)."""
            if self.first:
                if self.megatron:
                    x = self.embed(x)
                    if not self.cfg.llama:
                        x = x + F.embedding(position_ids, self.pos)
                    x = x.transpose(0, 1).contiguous()
                    if self.sequence_parallel:      # each TP rank keeps its s / tp rows
                        x = scatter_to_sequence(x, self.group)
                    x = dropout(x, self.cfg.dropout)
                else:
                    x = self.embed(x) + self.pos
            for i, block in enumerate(self.blocks):
                layer = self.first_layer + i
                if replay:
                    x = repeat_unit(self.unit_keys[i], functools.partial(
                        self._layer, block, layer=layer), x, layer=layer)
                else:
                    x = self._layer(block, x, layer)
            if self.last:
                x = self.ln_f(x)
                if self.sequence_parallel:          # the logits need the whole sequence
                    x = gather_from_sequence(x, self.group)
                if self.megatron:
                    x = x.transpose(0, 1).contiguous()
                if self.sequence_parallel:          # the gather's backward sums the gradients
                    x = F.linear(x, self.output_weight())
                elif self.cfg.tie_embeddings:
                    x = F.linear(copy_to_region(x, self.group), self.word_weight())
                else:
                    x = self.head(x)
            return x

        def loss(self, logits: torch.Tensor, labels: torch.Tensor,
                 loss_mask: torch.Tensor | None = None) -> torch.Tensor:
            """``loss_mask``: Megatron's, from its get_batch (megatron flavour)."""
            start, end = vocab_range(self.vocab, self.group)
            if self.megatron:
                losses = vocab_parallel_cross_entropy(logits.float(), labels, self.group, start,
                                                      end)
                loss_mask = loss_mask.view(-1)
                if self.cp_group is not None:
                    return self._cp_loss(torch.sum(losses.view(-1) * loss_mask), loss_mask.sum())
                return torch.sum(losses.view(-1) * loss_mask) / loss_mask.sum()
            return vocab_parallel_cross_entropy(logits, labels, self.group, start, end).mean()

        def _cp_loss(self, total: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
            """Megatron-Core's loss with context parallelism: the masked sum and the token
            count all-reduced over the context-parallel group (one two-element all-reduce),
            the rank's sum over the whole count, times cp (the gradient reduction averages over
            the dp x cp ranks). The rank's share carries the gradient: the all-reduced sum is
            not differentiated (torch's collectives have no autograd), so this rank's value is
            its share of the loss, where Megatron's reads the whole."""
            from echo_et.workloads.markers import comm_span

            stats = torch.cat([total.detach().view(1), tokens.view(1)])
            with comm_span(self.cp_group):
                torch.distributed.all_reduce(stats, group=self.cp_group)
            return total / stats[1] * torch.distributed.get_world_size(self.cp_group)

    return Stage


def _Stage(*args, **kwargs):  # noqa: N802 - a class factory used like a class
    return _stage_class()(*args, **kwargs)
