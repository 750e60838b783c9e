"""A GPT configuration: the model, its parallel schedule and optimizer options, the checks
that refuse a layout it cannot run (with the constraint named), and what a record of it keeps.
Torch-free: the CLI and the sweeps read and check configurations without importing torch;
:mod:`echo_et.workloads.gpt` builds the model from one."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.limits import MAX_GRAPH_NODES, format_size, total_memory
from echo_et.trace.layout import ParallelLayout

DTYPES = ("float32", "bfloat16", "float16")
ATTENTIONS = ("sdpa", "megatron")
GRAD_SYNCS = ("overlap", "after-backward")
RECOMPUTE_GRANULARITIES = ("full", "selective")   # the first is --recompute's
RECOMPUTE_METHODS = ("uniform", "block")          # Megatron's --recompute-method; the first its default
# Megatron-Core's --recompute-modules that a dense layer has (selective recomputation; the first is
# its default), and those of layers echo-et does not model (mixture of experts, multi-latent attention)
RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm")
OTHER_RECOMPUTE_MODULES = ("moe", "moe_act", "shared_experts", "mla_up_proj")
OPTIMIZERS = ("adam", "megatron")
PIPELINE_ENGINES = ("megatron", "deepspeed")   # the first is the default
ARCHS = ("gpt", "llama")   # the first is the default
# Megatron-Core's --cp-comm-type values echo-et runs (workloads.context_parallel); its "a2a+p2p"
# (hierarchical context parallelism) is not modelled
CP_COMM_TYPES = ("p2p", "allgather", "a2a")
# Megatron-Core's --moe-token-dispatcher-type values echo-et runs (workloads.moe); its default
# first; "flex" (DeepEP) and "alltoall_seq" are not modelled
MOE_DISPATCHERS = ("allgather", "alltoall")
MEGATRON_VOCAB = 50257     # GPT-2's BPE vocabulary, what Megatron's GPT examples train on


def moe_layer_pattern(freq: str, layers: int) -> tuple[bool, ...]:
    """Megatron-Core's ``--moe-layer-freq`` for ``layers`` layers: an integer N (every N-th
    layer from the first is a MoE layer), or its list expression of 0s and 1s, one per layer:
    terms ``[a, b, ...]`` or ``[a, ...]*n`` joined by ``+``, in optional parentheses. Parsed,
    never evaluated."""
    text = "".join(str(freq).split())
    if text.isdigit():
        n = int(text)
        if not 1 <= n <= layers:
            raise EchoError(f"MoE layer frequency {n} must be from 1 to the layers ({layers})")
        return tuple(i % n == 0 for i in range(layers))
    body = text[1:-1] if text.startswith("(") and text.endswith(")") else text
    out: list[bool] = []
    for term in body.split("+"):
        items, _, times = term.partition("*")
        if not (items.startswith("[") and items.endswith("]")) or (times and not times.isdigit()):
            raise EchoError(f"MoE layer pattern {str(freq)[:60]!r}: write an integer, or terms [0,1,...] or "
                            "[0]*3 joined by + (e.g. ([0]*3+[1]*29))")
        values = [v for v in items[1:-1].split(",") if v]
        if any(v not in ("0", "1") for v in values):
            raise EchoError(f"MoE layer pattern {str(freq)[:60]!r}: its entries are 0 (dense) or 1 (MoE)")
        more = len(values) * (int(times) if times else 1)
        if len(out) + more > layers:     # (before the list is made: a pattern may say [1]*10**12)
            raise EchoError(f"MoE layer pattern {str(freq)[:60]!r} gives more than the model's {layers} layers")
        out += [v == "1" for v in values] * (int(times) if times else 1)
    if len(out) != layers:
        raise EchoError(f"MoE layer pattern {str(freq)[:60]!r} gives {len(out)} layers; the model has {layers}")
    return tuple(out)


def recompute_module_names(modules: str) -> tuple[str, ...]:
    """``--recompute-modules``' names (commas or spaces between them), in Megatron's order
    (:data:`RECOMPUTE_MODULES`), each once; unknown names kept, after, for the check to name."""
    names = [m for m in modules.replace(",", " ").split() if m]
    known = tuple(m for m in RECOMPUTE_MODULES if m in names)
    return known + tuple(dict.fromkeys(m for m in names if m not in RECOMPUTE_MODULES))


# What tracing one rank of a GPT builds, as lower bounds (measured on this project's CPU,
# torch 2.13, `echo-et trace --device meta --hidden 64 --layers 2|4|512`): the estimate
# refuses only what surely cannot finish, before any work.
NODES_PER_LAYER = 200            # recorded nodes of a layer's forward and backward (280 measured)
NODES_PER_RING_STEP = 40         # what each further context-parallel rank adds to a layer (45 measured)
NODES_PER_LOCAL_EXPERT = 15     # what each local expert of a MoE layer adds to it (about 20 measured)
HOST_BYTES_PER_LAYER = 100_000   # a layer's modules and records in host memory (210 KB measured)
TOKEN_BYTES = 24                 # a token's int64 id, input and label, on the host whatever the device


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
    attention: str = "sdpa"          # sdpa | megatron ([s, b, h], baddbmm + softmax + bmm)
    dropout: float = 0.0             # attention and hidden dropout
    vocab_multiple: int = 1          # vocabulary padded to a multiple of this x tp
    tie_embeddings: bool = False     # the word embedding is the output layer too
    recompute: bool = False          # activation recomputation, at recompute_granularity
    # "full": each layer under one checkpoint, as Megatron's --checkpoint-activations (its
    # --recompute-granularity full --recompute-method uniform --recompute-num-layers 1);
    # "selective": the core attention (scores, softmax, dropout, context) recomputed, as
    # Megatron's --recompute-activations.
    recompute_granularity: str = "full"
    # With full recomputation, Megatron's --recompute-method and --recompute-num-layers N:
    # "uniform" checkpoints the layers of each model chunk in groups of N (each group's input
    # kept, its N layers recomputed at once in the backward: traced layer by layer, the same
    # kernels; the memory bound counts the groups); "block" checkpoints the first N layers of
    # each model chunk and keeps every activation of the others (no recomputation for them).
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # With selective recomputation, Megatron-Core's --recompute-modules (comma-separated):
    # "core_attn" (its default: the core attention, checkpointed), "mlp" (the whole MLP,
    # checkpointed: its two GEMMs, their collectives and the activation run again),
    # "layernorm" (the two layer norms' outputs dropped and recomputed before the GEMM that
    # reads them: traced as a checkpoint of the norm, the memory bound drops the outputs).
    recompute_modules: str = "core_attn"
    grad_sync: str = "overlap"       # overlap (bucketed, during backward) | after-backward
    optimizer: str = "adam"          # adam | megatron (fp32 master weights, grad norm, fused)
    # With tp > 1 and pp > 1, each TP rank sends 1/tp of every activation and gradient between
    # pipeline stages and the receiving stage all-gathers it in its TP group (Megatron's
    # --scatter-gather-tensors-in-pipeline, on by default there; :mod:`.pipeline`).
    scatter_gather_tensors_in_pipeline: bool = False
    # Gradients accumulated and data-parallel reduced in an fp32 buffer, whatever the model's
    # dtype (Megatron's --accumulate-allreduce-grads-in-fp32, which it forces on with bf16);
    # the megatron optimizer only.
    accumulate_allreduce_grads_in_fp32: bool = False
    # Megatron's --num-layers-per-virtual-pipeline-stage N: each stage holds layers / (pp x N)
    # model chunks of N layers and runs the interleaved 1F1B schedule (:mod:`.pipeline`);
    # 0: one chunk of layers / pp layers per stage, the plain 1F1B schedule.
    layers_per_virtual_stage: int = 0
    # Megatron-Core's --num-virtual-stages-per-pipeline-rank V: the interleaved schedule given
    # by its model chunks per stage, each stage's layers split into V chunks (the form
    # Megatron-Core requires with uneven first and last stages, each of whose layer counts V
    # must divide); 0: not given. One of this and layers_per_virtual_stage at most.
    virtual_stages_per_rank: int = 0
    # Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage G: the interleaved
    # schedule runs the micro-batches in groups of G through each model chunk in turn
    # (:func:`.pipeline_plan.schedule_table`), G from pp to the micro-batches, the last group
    # whole or at least pp; 0: pp, Megatron's default (micro-batches then a multiple of pp).
    microbatch_group_size: int = 0
    # Megatron's overlap_p2p_comm (Megatron-LM's default with the interleaved schedule,
    # --no-overlap-p2p-communication turning it off): the interleaved schedule's sends and
    # receives posted as separate asynchronous calls right after the compute that makes them
    # and waited for before the compute that needs them, with no batched call and no device
    # synchronisation (:func:`.pipeline_plan.overlapped_plan`); interleaved schedule only.
    overlap_p2p_comm: bool = False
    # Megatron's overlap_p2p_comm_warmup_flush (--overlap-p2p-communication-warmup-flush): the
    # warm-up's and the cool-down's transfers posted as the steady steps' are, each stage but the
    # leading one posting the next step's receive before this step's compute; needs
    # overlap_p2p_comm, so the interleaved schedule.
    overlap_p2p_comm_warmup_flush: bool = False
    # Megatron's timers as Megatron-LM had them until its 2022 rewrite (and Megatron-DeepSpeed
    # until it took that rewrite): every start and stop calls torch.cuda.synchronize(), and
    # each micro-batch's forward ("forward-compute", "batch-generator" around get_batch), its
    # backward ("backward-compute") and each pipeline exchange ("forward-recv", ...) is timed,
    # so the host waits for the device at each of their edges; the megatron flavour only.
    sync_timers: bool = False
    # Who runs the pipeline: "megatron" (Megatron-LM's 1F1B, :mod:`.pipeline`) or "deepspeed"
    # (DeepSpeed's PipelineEngine, Megatron-DeepSpeed's path with pipeline parallelism:
    # :mod:`.deepspeed_pipe`; only the first and the last stage load data, the tied embedding's
    # gradient is reduced before the data-parallel reduction, which flattens the gradients
    # into buckets of DeepSpeed's size, and the loss is averaged once at the end).
    pipeline_engine: str = "megatron"
    # DeepSpeed's activation checkpointing with partitioned checkpoints (Megatron-DeepSpeed's
    # --partition-activations), with full recomputation: each layer keeps 1/tp of its input
    # and all-gathers it over the TP group before running again in the backward.
    partition_activations: bool = False
    # Megatron-LM's --sequence-parallel (megatron flavour, with tied embeddings): between the
    # tensor-parallel regions each TP rank holds s / tp of the sequence (:mod:`.tensor_parallel`);
    # pipeline stages send those rows; the layer norms' and row-parallel biases' gradients are
    # all-reduced over the TP group after the backward. A no-op at tp = 1, as in Megatron.
    sequence_parallel: bool = False
    # Uneven pipeline stages: the first and the last stage hold this many layers (0: their even
    # share) and the stages between share the rest evenly, as Megatron-Core's
    # --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers place them.
    # DeepSpeed's --pp-partition-method 'type:transformer|embedding' (BLOOM's) is both at
    # (layers + 2) / pp - 1: each word embedding counted as a layer of its stage.
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # Megatron-Core's --account-for-embedding-in-pipeline-split and
    # --account-for-loss-in-pipeline-split: the word embedding (the loss) counted as a layer of
    # the first (last) stage when the layers are split, (layers + 1 [+ 1]) / pp a stage, so the
    # first (last) stage holds one layer less; not with the first and last counts above, and
    # not interleaved (Megatron-Core takes the layer from the stage's first chunk only).
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # With ZeRO stage 1 (the distributed optimizer): the gradients reduce-scattered into each
    # rank's shard (Megatron's, DeepSpeed's default), or all-reduced whole with each rank
    # keeping its shard (False: DeepSpeed's "reduce_scatter": false, and its bfloat16
    # optimizer, BF16_Optimizer, which all-reduces the fp32 gradients).
    grad_reduce_scatter: bool = True
    # The layer's architecture: "gpt" (LayerNorm, GeLU MLP, biases, learned positions) or
    # "llama" (Megatron-LM's --swiglu --normalization RMSNorm --disable-bias-linear
    # --position-embedding-type rope --untie-embeddings-and-output-weights: RMSNorm, SwiGLU
    # MLP, no linear biases, rotary positions, an output layer of its own); megatron flavour.
    arch: str = "gpt"
    # Megatron's --ffn-hidden-size: the MLP's inner width (0: ffn_mult x hidden); with SwiGLU
    # the first MLP projection is twice as wide.
    ffn_hidden: int = 0
    # Megatron's --group-query-attention --num-query-groups: key/value heads (0: one per
    # query head, multi-head attention); megatron flavour.
    kv_heads: int = 0
    # Megatron's --use-flash-attn: the core attention as one flash-attention kernel each way
    # (no s x s scores in memory) instead of its batched GEMMs and softmax; megatron flavour.
    flash_attention: bool = False
    # Megatron-Core's --cp-comm-type: how the context-parallel ranks (the layout's cp) exchange
    # keys and values: "p2p" (its default: TE's ring), "allgather", "a2a" (Ulysses)
    cp_comm_type: str = "p2p"
    # Megatron-LM's --gradient-accumulation-fusion (its default where Apex is installed): each
    # weight gradient added into the fp32 main_grad by its GEMM, with no separate accumulation
    # kernel; needs the gradients accumulated in fp32 (bf16's default), Megatron-LM's pipeline.
    gradient_accumulation_fusion: bool = False
    # Megatron-Core's --overlap-grad-reduce: grad_sync "overlap" in its DistributedDataParallel's
    # buckets (bucket_mb: megatron_core_bucket_mb of the layout's dp), bucketed on the first
    # pipeline stage's first model chunk only (one bucket per chunk elsewhere, as Megatron-Core
    # turns bucketing off there); with the interleaved schedule too.
    overlap_grad_reduce: bool = False
    # Megatron-Core's --overlap-param-gather: the distributed optimizer's all-gathers of the
    # updated weights run during the next step's forward, one bucket ahead of the layers that
    # need them, instead of after the optimizer; needs ZeRO 1 and the overlapped gradient sync.
    overlap_param_gather: bool = False
    # Megatron-LM's --align-grad-reduce (on unless --no-align-grad-reduce): with the overlapped
    # gradient sync, the pipeline stages other than the first issue their reductions after the
    # schedule, and with the interleaved schedule every stage issues a chunk's whole at points
    # aligned across the stages (pipeline_plan.grad_sync_chunk); off, each bucket is issued as
    # the backward of the chunk's last micro-batch fills it.
    align_grad_reduce: bool = True
    # Megatron-LM's --align-param-gather (on unless --no-align-param-gather; Megatron turns it
    # off without an interleaved schedule): with the weights' gathers in the forward and the
    # interleaved schedule, a chunk's gathers are issued whole at points aligned across the
    # stages (pipeline_plan.param_sync_chunk); off, each chunk's first gather is issued by its
    # first forward, which waits for it, and each wait issues the chunk's next.
    align_param_gather: bool = True
    # Megatron-LM's --overlap-param-gather-with-optimizer-step (interleaved schedule only, as
    # Megatron asserts): the first model chunk has its own optimizer, stepped first, and its
    # all-gathers are issued right after it, while the other chunks' shards are updated; no
    # chunk is cut into buckets (Megatron turns bucketing off with it).
    overlap_param_gather_with_optimizer_step: bool = False
    # Mixture of experts (Megatron-Core's --num-experts E, --moe-router-topk K,
    # --moe-ffn-hidden-size F): every layer's MLP is E experts of inner width F (0: ffn_size),
    # each token routed to K of them, through the "alltoall" token dispatcher over the layout's
    # expert-parallel groups (its ep; :mod:`.moe`); 0 experts: the dense MLP. Megatron flavour.
    num_experts: int = 0
    moe_topk: int = 2
    moe_ffn_hidden: int = 0
    # Megatron-Core's --moe-token-dispatcher-type: "allgather" (its default: every token of the
    # TP x EP ranks gathered, each rank running its experts' rows) or "alltoall" (the rows sent to
    # their experts' ranks by all-to-all, what its recipes use with expert parallelism)
    moe_token_dispatcher: str = "allgather"
    # Megatron-Core's --moe-shared-expert-intermediate-size S: beside the routed experts every
    # token runs a shared expert, a dense MLP of width S split over the TP ranks as the dense
    # MLP is (DeepSeek's and Qwen's MoE layers); 0: none
    moe_shared_ffn: int = 0
    # Megatron-Core's --moe-grouped-gemm: the local experts' GEMMs as one grouped kernel each
    # (GroupedMLP; its experts have no biases: the llama architecture here)
    moe_grouped_gemm: bool = False
    # Megatron-Core's --moe-layer-freq: which layers are MoE layers, the others dense: "N" (every
    # N-th layer, from the first), or a pattern of 0s and 1s, one per layer, as its list
    # expression writes it ("([0]*3+[1]*29)", "[1,0]*16"); "1": every layer
    moe_layer_freq: str = "1"

    @classmethod
    def megatron(cls, **kw) -> GPTConfig:
        """Megatron-DeepSpeed's GPT pretraining defaults (see the module docstring); keyword
        arguments override them. As Megatron does, a bfloat16 model accumulates and reduces
        its gradients in fp32 unless ``accumulate_allreduce_grads_in_fp32`` says otherwise
        (False there is Megatron-Core's ``--grad-reduce-in-bf16``)."""
        llama = kw.get("arch") == "llama"    # Megatron-LM's Llama recipes: no dropout, untied
        base = {"attention": "megatron", "dropout": 0.0 if llama else 0.1, "vocab_multiple": 128,
                "tie_embeddings": not llama, "grad_sync": "after-backward", "optimizer": "megatron",
                "dtype": "float16", "vocab": MEGATRON_VOCAB, "scatter_gather_tensors_in_pipeline": True}
        merged = {**base, **kw}
        if merged.get("accumulate_allreduce_grads_in_fp32") is None:
            merged["accumulate_allreduce_grads_in_fp32"] = merged["dtype"] == "bfloat16"
        return cls(**merged)

    @property
    def ffn_size(self) -> int:
        """The MLP's inner width: ``ffn_hidden``, or ``ffn_mult`` x hidden."""
        return self.ffn_hidden or self.ffn_mult * self.hidden

    def moe_layer_pattern(self) -> tuple[bool, ...]:
        """Whether each layer is a MoE layer (``moe_layer_freq``; all dense without experts).
        An EchoError says what is wrong with a pattern that is not one of the layers."""
        if not self.num_experts:
            return (False,) * self.layers
        return moe_layer_pattern(self.moe_layer_freq, self.layers)

    def moe_layer_count(self, first: int = 0, count: int | None = None) -> int:
        """The MoE layers among ``count`` layers from ``first`` (all of them by default)."""
        pattern = self.moe_layer_pattern()
        return sum(pattern[first:len(pattern) if count is None else first + count])

    @property
    def moe_ffn_size(self) -> int:
        """Each expert's inner width: ``moe_ffn_hidden``, or the dense MLP's."""
        return self.moe_ffn_hidden or self.ffn_size

    @property
    def query_groups(self) -> int:
        """Key/value heads: ``kv_heads``, or one per query head."""
        return self.kv_heads or self.heads

    @property
    def llama(self) -> bool:
        return self.arch == "llama"

    @property
    def recompute_level(self) -> str:
        """"none", or the granularity recomputation runs at ("full", "selective")."""
        return self.recompute_granularity if self.recompute else "none"

    @property
    def recomputes_layers(self) -> bool:
        """Whether each layer runs under one checkpoint (full recomputation)."""
        return self.recompute and self.recompute_granularity == "full"

    def recomputes_layer(self, index: int) -> bool:
        """Whether the ``index``-th layer of a model chunk (of a stage, without interleaving)
        runs under a checkpoint: every one under full recomputation by the uniform method, the
        first ``recompute_num_layers`` of the chunk by the block method."""
        return self.recomputes_layers and (self.recompute_method == "uniform" or index < self.recompute_num_layers)

    def layer_recompute_level(self, index: int) -> str:
        """What the ``index``-th layer of a model chunk recomputes: :attr:`recompute_level`,
        but "none" for a layer the block method leaves out."""
        if self.recomputes_layers and not self.recomputes_layer(index):
            return "none"
        return self.recompute_level

    def recomputed_layers(self, pp: int) -> int:
        """How many of the model's layers run their forward again in the backward (full
        recomputation), over ``pp`` stages of :meth:`virtual_chunks` chunks each."""
        if not self.recomputes_layers:
            return 0
        if self.recompute_method == "uniform":
            return self.layers
        chunks = self.virtual_chunks(pp)
        return sum(chunks * min(self.recompute_num_layers, n // chunks) for n in self.stage_layer_counts(pp))

    def selective_modules(self) -> tuple[str, ...]:
        """The modules selective recomputation recomputes (none without it)."""
        if not (self.recompute and self.recompute_granularity == "selective"):
            return ()
        return recompute_module_names(self.recompute_modules)

    @property
    def recomputes_core_attention(self) -> bool:
        """Whether the core attention is checkpointed (selective recomputation's default)."""
        return "core_attn" in self.selective_modules()

    @property
    def recomputes_mlp(self) -> bool:
        """Whether the MLP is checkpointed (selective recomputation, Megatron-Core's "mlp")."""
        return "mlp" in self.selective_modules()

    @property
    def recomputes_layernorm(self) -> bool:
        """Whether the layer norms' outputs are recomputed (Megatron-Core's "layernorm")."""
        return "layernorm" in self.selective_modules()

    @property
    def grad_buffer_dtype(self) -> str:
        """The dtype gradients are accumulated and data-parallel reduced in."""
        return "float32" if self.accumulate_allreduce_grads_in_fp32 else self.dtype

    @property
    def flavor(self) -> str:
        return "megatron-gpt" if self.attention == "megatron" else "gpt"

    @property
    def uneven_stages(self) -> bool:
        """Whether the first or the last stage is given its own layer count (or Megatron-Core
        counts the embedding or the loss as a layer of its stage)."""
        return bool(self.first_stage_layers or self.last_stage_layers or self.accounted_layers)

    @property
    def accounted_layers(self) -> int:
        """The embedding and the loss counted as layers when the layers are split over the
        stages (Megatron-Core's --account-for-embedding/loss-in-pipeline-split): 0, 1 or 2."""
        return int(self.account_for_embedding_in_pipeline_split) + int(self.account_for_loss_in_pipeline_split)

    def stage_layer_counts(self, pp: int) -> tuple[int, ...]:
        """Layers of each pipeline stage, first to last: layers / pp each, or the first and
        the last stage's own counts with the stages between sharing the rest evenly (the
        caller has validated that they do)."""
        if not self.uneven_stages or pp == 1:
            return (self.layers // pp,) * pp
        if self.accounted_layers:
            each = (self.layers + self.accounted_layers) // pp
            return ((each - self.account_for_embedding_in_pipeline_split,) + (each,) * (pp - 2)
                    + (each - self.account_for_loss_in_pipeline_split,))
        first, last = self.first_stage_layers, self.last_stage_layers
        between = pp - 2 if first and last else pp - 1
        rest = self.layers - first - last
        each = rest // between if between else 0
        return ((first or each),) + (each,) * (pp - 2) + ((last or each),)

    @property
    def interleaved(self) -> bool:
        """Whether the interleaved 1F1B schedule runs (given by either of Megatron's flags)."""
        return self.layers_per_virtual_stage > 0 or self.virtual_stages_per_rank > 0

    def interleaving_said(self) -> str:
        """The interleaved schedule as its flag gave it, for messages ("" when plain)."""
        if self.virtual_stages_per_rank > 0:
            return f"{self.virtual_stages_per_rank} virtual stages per pipeline rank"
        if self.layers_per_virtual_stage > 0:
            return f"{self.layers_per_virtual_stage} layers per virtual stage"
        return ""

    def stages_said(self, pp: int) -> str:
        """Each stage's layers, runs of equal stages folded: "8, 9 x 10, 8"."""
        from itertools import groupby

        runs = [(n, len(list(g))) for n, g in groupby(self.stage_layer_counts(pp))]
        return ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in runs)

    def schedule_said(self, pp: int) -> str:
        """The pipeline schedule in a few words: "1F1B", "interleaved x2" ("interleaved x2 in
        groups of 6" with micro-batch groups given), with ", stages 7, 8 x 14, 7" when the
        first or the last stage holds its own count."""
        said = f"interleaved x{self.virtual_chunks(pp)}" if self.interleaved else "1F1B"
        if self.interleaved and self.microbatch_group_size:
            said += f" in groups of {self.microbatch_group_size}"
        shown = self.uneven_stages and len(set(self.stage_layer_counts(pp))) > 1
        return said + (f", stages {self.stages_said(pp)}" if shown else "")

    def virtual_chunks(self, pp: int) -> int:
        """Model chunks per pipeline stage: 1, the virtual stages per rank given, or layers /
        (pp x layers per virtual stage)."""
        if self.virtual_stages_per_rank > 0:
            return self.virtual_stages_per_rank
        n = self.layers_per_virtual_stage
        return self.layers // (pp * n) if n > 0 else 1

    def virtual_pipeline_size(self, pp: int) -> int:
        """What a Job's ``layout.vpp`` records: the model chunks per stage of an interleaved
        schedule (Megatron's virtual pipeline size), 0 without one."""
        return self.virtual_chunks(pp) if self.interleaved else 0

    def chunk_first_layer(self, pp: int, stage: int, chunk: int) -> int:
        """The first layer of ``chunk`` on ``stage``. Chunk c of stage s is virtual stage
        c x pp + s and holds 1/V of its stage's layers (V chunks per stage), after those of the
        virtual stages before it: c whole passes over the stages (layers / V each) and chunk c
        of the stages before s (Megatron-Core's layer offset, uneven stages included)."""
        counts = self.stage_layer_counts(pp)
        chunks = self.virtual_chunks(pp)
        return chunk * (self.layers // chunks) + sum(counts[:stage]) // chunks

    def replace(self, **kw) -> GPTConfig:
        return dataclasses.replace(self, **kw)

    def validate(self, layout: ParallelLayout, device: str = "meta") -> None:
        where = f"layout {layout.describe()}"
        for name in ("layers", "hidden", "heads", "seq", "micro_batch", "vocab", "ffn_mult",
                     "vocab_multiple"):
            if int(getattr(self, name)) < 1:
                raise EchoError(f"{where}: gpt {name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise EchoError(f"{where}: heads ({self.heads}) must divide hidden ({self.hidden})")
        if self.heads % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide heads ({self.heads})")
        if self.hidden % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide hidden ({self.hidden})")
        self.check_architecture(layout)
        if self.uneven_stages:
            self.check_stage_layers(layout)
        elif self.layers % layout.pp:
            raise EchoError(f"{where}: pp ({layout.pp}) must divide layers ({self.layers})")
        if self.dtype not in DTYPES:
            raise EchoError(f"{where}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.bucket_mb <= 0:
            raise EchoError(f"{where}: bucket size must be > 0 MB, got {self.bucket_mb}")
        if self.attention not in ATTENTIONS:
            raise EchoError(f"{where}: attention {self.attention!r} is not one of "
                            f"{', '.join(ATTENTIONS)}")
        if self.recompute_granularity not in RECOMPUTE_GRANULARITIES:
            raise EchoError(f"{where}: recompute granularity {self.recompute_granularity!r} is not one of "
                            f"{', '.join(RECOMPUTE_GRANULARITIES)}")
        if self.grad_sync not in GRAD_SYNCS:
            raise EchoError(f"{where}: gradient sync {self.grad_sync!r} is not one of "
                            f"{', '.join(GRAD_SYNCS)}")
        if self.optimizer not in OPTIMIZERS:
            raise EchoError(f"{where}: optimizer {self.optimizer!r} is not one of "
                            f"{', '.join(OPTIMIZERS)}")
        if self.accumulate_allreduce_grads_in_fp32 and self.optimizer != "megatron":
            raise EchoError(f"{where}: gradients accumulated in fp32 need the megatron optimizer "
                            "(megatron-gpt), whose fp32 master weights read them")
        if not 0.0 <= self.dropout < 1.0:
            raise EchoError(f"{where}: dropout must be in [0, 1), got {self.dropout}")
        if self.sync_timers and self.attention != "megatron":
            raise EchoError(f"{where}: synchronising timers are Megatron's (megatron-gpt)")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise EchoError(f"{where}: recompute method {self.recompute_method!r} is not one of "
                            f"{', '.join(RECOMPUTE_METHODS)}")
        if self.recompute_num_layers < 1:
            raise EchoError(f"{where}: recompute layers must be >= 1, got {self.recompute_num_layers}")
        if (self.recompute_method, self.recompute_num_layers) != ("uniform", 1) and not self.recomputes_layers:
            raise EchoError(f"{where}: a recompute method and its layers ({self.recompute_method}, "
                            f"{self.recompute_num_layers}) are full recomputation's (Megatron refuses them "
                            "with selective recomputation, and has nothing to recompute without one)")
        self.check_recompute_modules(where)
        if self.partition_activations and not self.recomputes_layers:
            raise EchoError(f"{where}: partitioned activation checkpoints need full recomputation "
                            "(recomputation at granularity full)")
        if self.overlap_grad_reduce and not (self.grad_sync == "overlap" and self.optimizer == "megatron"):
            raise EchoError(f"{where}: Megatron-Core's overlapped gradient sync is megatron-gpt's, with the "
                            "gradient sync overlapped with the backward")
        if self.overlap_param_gather and not (layout.zero and self.grad_sync == "overlap"
                                              and self.optimizer == "megatron"):
            raise EchoError(f"{where}: the weights' all-gathers overlapped with the forward need Megatron's "
                            "distributed optimizer (ZeRO stage 1) and its gradient sync overlapped with the "
                            "backward (megatron-gpt)")
        if not self.align_grad_reduce and not self.overlap_grad_reduce:
            raise EchoError(f"{where}: reductions not aligned across the stages are Megatron-Core's overlapped "
                            "gradient sync's")
        if not self.align_param_gather and not (self.overlap_param_gather and self.interleaved):
            raise EchoError(f"{where}: weight gathers not aligned across the stages are those of Megatron-Core's "
                            "gathers in the forward with the interleaved schedule (without it they are never "
                            "aligned)")
        if self.overlap_param_gather_with_optimizer_step and not (self.overlap_param_gather and self.interleaved):
            raise EchoError(f"{where}: the first chunk's all-gathers after its optimizer step need Megatron-Core's "
                            "gathers in the forward and the interleaved schedule (Megatron asserts both)")
        if not self.grad_reduce_scatter and not layout.zero:
            raise EchoError(f"{where}: gradients all-reduced whole before a sharded optimizer step need ZeRO "
                            "stage 1 (the distributed optimizer); without it they are all-reduced anyway")
        self.check_pipeline_engine(layout)
        self.check_sequence_parallel(layout)
        self.check_context_parallel(layout)
        self.check_experts(layout)
        self.check_virtual_stages(layout)
        self.check_footprint(layout, device)

    def check_experts(self, layout: ParallelLayout) -> None:
        """Megatron-Core's rules for a mixture of experts, and this model's: experts split
        evenly over the expert-parallel ranks, k of them per token, sequence parallelism with
        tp > 1 (Megatron-Core asserts it), the dispatcher's rows spread evenly over the
        expert-parallel ranks (balanced routing, :mod:`.moe`)."""
        where = f"layout {layout.describe()}"
        e, k = self.num_experts, self.moe_topk
        if e < 0 or self.moe_ffn_hidden < 0 or self.moe_shared_ffn < 0:
            raise EchoError(f"{where}: experts and their MLP widths must be >= 0, got {e}, {self.moe_ffn_hidden} "
                            f"and {self.moe_shared_ffn}")
        if not e:
            if self.moe_layer_freq != "1":
                raise EchoError(f"{where}: a MoE layer frequency is a mixture of experts' (experts > 0)")
            if self.moe_grouped_gemm:
                raise EchoError(f"{where}: grouped GEMM is a mixture of experts' (experts > 0)")
            if layout.ep > 1:
                raise EchoError(f"{where}: expert parallelism (ep {layout.ep}) needs a mixture of experts "
                                "(experts > 0)")
            if self.moe_shared_ffn:
                raise EchoError(f"{where}: a shared expert is a mixture of experts' (experts > 0)")
            return
        self.moe_layer_pattern()      # a pattern that is not one of the layers: its own message
        if self.moe_grouped_gemm and not self.llama:
            raise EchoError(f"{where}: Megatron-Core's grouped GEMM experts have no linear biases "
                            "(the llama architecture here)")
        if self.moe_shared_ffn % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide the shared expert's width ({self.moe_shared_ffn})")
        if self.attention != "megatron":
            raise EchoError(f"{where}: a mixture of experts is Megatron-Core's (megatron-gpt)")
        if e % layout.ep:
            raise EchoError(f"{where}: ep ({layout.ep}) must divide the experts ({e})")
        if not 1 <= k <= e:
            raise EchoError(f"{where}: experts per token (top-k {k}) must be from 1 to the experts ({e})")
        if self.moe_token_dispatcher not in MOE_DISPATCHERS:
            raise EchoError(f"{where}: token dispatcher {self.moe_token_dispatcher!r} is not one of "
                            f"{', '.join(MOE_DISPATCHERS)} (flex, DeepEP's, is not modelled)")
        if layout.tp > 1 and not self.sequence_parallel:
            raise EchoError(f"{where}: a mixture of experts with tp ({layout.tp}) > 1 needs sequence parallelism "
                            "(Megatron-Core asserts it)")
        if self.pipeline_engine != "megatron" or self.partition_activations:
            raise EchoError(f"{where}: a mixture of experts is Megatron-Core's; DeepSpeed's pipeline engine and "
                            "partitioned activation checkpoints do not run with it here")
        if self.recomputes_mlp:
            raise EchoError(f"{where}: selective recomputation of the mlp module is the dense MLP's; Megatron-Core's "
                            "moe module (the experts' recomputation) is not modelled")
        if self.overlap_param_gather:
            raise EchoError(f"{where}: the weights' all-gathers overlapped with the forward are not modelled with a "
                            "mixture of experts")
        tokens = self.seq // layout.cp // (layout.tp if self.sequence_parallel else 1) * self.micro_batch
        if (tokens * k) % layout.ep:
            raise EchoError(f"{where}: a rank's {tokens} tokens x top-k {k} do not spread evenly over ep "
                            f"({layout.ep}) ranks (routing is modelled as balanced)")
        if self.moe_grouped_gemm and (tokens * k) % e:
            raise EchoError(f"{where}: with grouped GEMM a rank's {tokens} tokens x top-k {k} must spread evenly over "
                            f"the {e} experts (routing is modelled as balanced; each batched GEMM has equal parts)")

    def check_context_parallel(self, layout: ParallelLayout) -> None:
        """Megatron-Core's rules for context parallelism (cp > 1): its attention is Transformer
        Engine's (flash attention, megatron-gpt), its pipeline engine Megatron's, and the sequence
        cuts into 2 cp equal chunks (each again into tp pieces with sequence parallelism)."""
        cp = layout.cp
        where = f"layout {layout.describe()}"
        if self.cp_comm_type not in CP_COMM_TYPES:
            other = (" (a2a+p2p, hierarchical context parallelism, is not modelled)"
                     if self.cp_comm_type == "a2a+p2p" else "")
            raise EchoError(f"{where}: context-parallel communication {self.cp_comm_type!r} is not one of "
                            f"{', '.join(CP_COMM_TYPES)}{other}")
        if cp == 1:
            return
        if self.attention != "megatron" or not self.flash_attention:
            raise EchoError(f"{where}: context parallelism runs in Transformer Engine's fused attention: it needs "
                            "megatron-gpt with flash attention")
        if self.pipeline_engine != "megatron":
            raise EchoError(f"{where}: context parallelism is Megatron-Core's; DeepSpeed's pipeline engine has none")
        if self.partition_activations:
            raise EchoError(f"{where}: partitioned activation checkpoints are DeepSpeed's; context parallelism is "
                            "Megatron-Core's")
        if self.seq % (2 * cp):
            raise EchoError(f"{where}: the sequence ({self.seq}) must split into 2 x cp = {2 * cp} equal chunks "
                            "(Megatron-Core's load-balanced context parallelism)")
        if self.cp_comm_type == "a2a":
            for what, n in (("attention heads", self.heads // layout.tp),
                            ("key/value heads", self.query_groups // layout.tp)):
                if n % cp:
                    raise EchoError(f"{where}: all-to-all context parallelism gives each CP rank 1/cp of a TP "
                                    f"rank's {what}: cp ({cp}) must divide its {n}")
        if self.sequence_parallel and layout.tp > 1 and (self.seq // cp) % layout.tp:
            raise EchoError(f"{where}: with sequence parallelism tp ({layout.tp}) must divide each context-parallel "
                            f"rank's {self.seq // cp} positions")

    def check_architecture(self, layout: ParallelLayout) -> None:
        """Megatron's rules for the MLP width and grouped-query attention (query groups divide
        the heads, tp divides the query groups and the MLP width); the Llama layer, grouped
        queries and flash attention are the megatron flavour's."""
        where = f"layout {layout.describe()}"
        if self.arch not in ARCHS:
            raise EchoError(f"{where}: architecture {self.arch!r} is not one of {', '.join(ARCHS)}")
        for name in ("ffn_hidden", "kv_heads"):
            if getattr(self, name) < 0:
                raise EchoError(f"{where}: gpt {name} must be >= 0 (0: the default), got {getattr(self, name)}")
        if self.ffn_size % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide the MLP width ({self.ffn_size})")
        if self.heads % self.query_groups:
            raise EchoError(f"{where}: key/value heads ({self.query_groups}) must divide heads ({self.heads})")
        if self.query_groups % layout.tp:
            raise EchoError(f"{where}: tp ({layout.tp}) must divide the key/value heads ({self.query_groups})")
        if self.gradient_accumulation_fusion and not (self.optimizer == "megatron" and self.dtype != "float32"
                                                      and self.grad_buffer_dtype == "float32"):
            raise EchoError(f"{where}: gradient-accumulation fusion adds each weight gradient into an fp32 main_grad: "
                            "it needs a 16-bit model whose gradients are accumulated in fp32 (megatron-gpt in "
                            "bfloat16, or in float16 with its gradients all-reduced in fp32)")
        if self.gradient_accumulation_fusion and self.pipeline_engine != "megatron":
            raise EchoError(f"{where}: gradient-accumulation fusion is Megatron-LM's; DeepSpeed's pipeline engine "
                            "reduces the model's own gradients")
        if self.recompute_method == "block" and self.pipeline_engine != "megatron":
            raise EchoError(f"{where}: the block recompute method is Megatron-LM's; DeepSpeed's pipeline engine "
                            "checkpoints every interval of layers (the uniform method)")
        if self.attention != "megatron":
            for given, what in ((self.llama, "the llama architecture"),
                                (self.query_groups != self.heads, "grouped-query attention (kv heads)"),
                                (self.flash_attention, "flash attention (gpt's attention is flash already)")):
                if given:
                    raise EchoError(f"{where}: {what} is Megatron's (megatron-gpt)")

    def check_recompute_modules(self, where: str) -> None:
        """Megatron-Core's --recompute-modules: selective recomputation's (its only granularity
        that reads them), at least one, each one a dense layer has; megatron-gpt's."""
        names = recompute_module_names(self.recompute_modules)
        if names == RECOMPUTE_MODULES[:1]:
            return
        if not (self.recompute and self.recompute_granularity == "selective"):
            raise EchoError(f"{where}: recompute modules ({', '.join(names) or 'none'}) are selective "
                            "recomputation's (Megatron-Core reads them at granularity selective only)")
        if not names:
            raise EchoError(f"{where}: selective recomputation needs at least one module to recompute")
        for m in names:
            if m in OTHER_RECOMPUTE_MODULES:
                raise EchoError(f"{where}: recompute module {m!r} is for mixture-of-experts or multi-latent "
                                "attention layers, which echo-et's layers do not have")
            if m not in RECOMPUTE_MODULES:
                raise EchoError(f"{where}: recompute module {m!r} is not one of {', '.join(RECOMPUTE_MODULES)}")
        if self.attention != "megatron":
            raise EchoError(f"{where}: recompute modules other than the core attention are Megatron's "
                            "(megatron-gpt)")

    def check_stage_layers(self, layout: ParallelLayout) -> None:
        """Megatron-Core's rules for the first and the last stage's own layer counts: at
        least one layer each (DeepSpeed's engine cannot run a stage without a transformer
        block either), pp > 1, the stages between sharing the rest evenly with at least one
        layer each; and the plain schedule (interleaved chunks of an uneven stage are not
        modelled)."""
        where = f"layout {layout.describe()}"
        first, last, pp = self.first_stage_layers, self.last_stage_layers, layout.pp
        if self.accounted_layers:
            self.check_accounted_stages(layout)
            return
        for name, n in (("first", first), ("last", last)):
            if n < 0:
                raise EchoError(f"{where}: the {name} stage's layers must be >= 0 (0: the even share), got {n}")
        if pp == 1:
            raise EchoError(f"{where}: the first and the last stage's own layer counts need pp > 1")
        if self.layers_per_virtual_stage:
            raise EchoError(f"{where}: interleaved chunks of uneven first and last stages are given as virtual "
                            "stages per pipeline rank (Megatron-Core's rule), not as layers per virtual stage")
        between = pp - 2 if first and last else pp - 1
        rest = self.layers - first - last
        given = " and ".join(f"{n} on the {name} stage" for name, n in (("first", first), ("last", last)) if n)
        if between == 0:
            if rest:
                raise EchoError(f"{where}: {given} must add up to the layers ({self.layers}) with pp 2")
            return
        if rest < between or rest % between:
            raise EchoError(f"{where}: with {given}, the other {between} stage(s) must share the remaining "
                            f"{rest} of {self.layers} layers evenly, at least one each")

    def check_accounted_stages(self, layout: ParallelLayout) -> None:
        """Megatron-Core's rule when the embedding and/or the loss count as layers: pp divides
        the layers with them; here also a layer on every stage, neither the stages' own counts
        nor the interleaved schedule beside them."""
        where = f"layout {layout.describe()}"
        said = " and ".join(what for what, on in (("the embedding", self.account_for_embedding_in_pipeline_split),
                                                  ("the loss", self.account_for_loss_in_pipeline_split)) if on)
        if self.first_stage_layers or self.last_stage_layers:
            raise EchoError(f"{where}: give the first and the last stage's layers, or count {said} as a layer "
                            "of its stage, not both")
        if self.interleaved:
            raise EchoError(f"{where}: counting {said} as a layer takes it from the first (last) model chunk "
                            "only, which echo-et's even chunks of a stage cannot hold; give the first and the last "
                            "stage's own layer counts with the interleaved schedule")
        total = self.layers + self.accounted_layers
        if total % layout.pp:
            raise EchoError(f"{where}: with {said} counted as a layer, pp ({layout.pp}) must divide the "
                            f"layers plus {self.accounted_layers} ({total})")
        if min(self.stage_layer_counts(layout.pp)) < 1:
            raise EchoError(f"{where}: with {said} counted as a layer, {total} / pp ({layout.pp}) leaves a stage "
                            "without a layer")

    def check_virtual_stages(self, layout: ParallelLayout) -> None:
        """Megatron's rules for interleaved pipeline stages, given as layers per virtual stage
        (``--num-layers-per-virtual-pipeline-stage N``: layers a multiple of pp x N) or as
        model chunks per stage (Megatron-Core's ``--num-virtual-stages-per-pipeline-rank V``:
        V dividing each stage's layers, uneven first and last stages included): not both, pp
        > 2 (with two stages, the previous and the next stage are one rank and a combined
        exchange's two sends to it cannot be told apart; pp > 1 with the transfers overlapped,
        posted one by one, as Megatron allows), at least two chunks per stage, and
        micro-batches in groups of pp (or of Megatron-Core's
        ``--microbatch-group-size-per-virtual-pipeline-stage`` G, from pp to the micro-batches),
        the last group whole or at least pp; and here, gradients reduced after the backward pass or
        in Megatron-Core's buckets (PyTorch DDP's overlapped reduction would start on a chunk
        whose gradients are not final)."""
        n, v = self.layers_per_virtual_stage, self.virtual_stages_per_rank
        where = f"layout {layout.describe()}"
        g = self.microbatch_group_size
        for name, given in (("layers per virtual pipeline stage", n), ("virtual stages per pipeline rank", v),
                            ("micro-batches per virtual stage group", g)):
            if given < 0:
                raise EchoError(f"{where}: {name} must be >= 0, got {given}")
        if not self.interleaved:
            if self.overlap_p2p_comm_warmup_flush:
                raise EchoError(f"{where}: pipeline communication overlapped with the compute in the warm-up and "
                                "cool-down is the interleaved schedule's (Megatron refuses it without one)")
            if self.overlap_p2p_comm:
                raise EchoError(f"{where}: pipeline communication overlapped with the compute is the interleaved "
                                "schedule's (Megatron turns it off without one)")
            if g:
                raise EchoError(f"{where}: micro-batch groups per virtual stage ({g}) are the interleaved "
                                "schedule's")
            return
        if self.overlap_p2p_comm_warmup_flush and not self.overlap_p2p_comm:
            raise EchoError(f"{where}: the warm-up's and cool-down's pipeline transfers overlapped with the compute "
                            "need the steady steps' overlapped too (Megatron's overlap_p2p_comm; it refuses "
                            "overlap_p2p_comm_warmup_flush without it)")
        if n and v:
            raise EchoError(f"{where}: give the interleaved schedule as layers per virtual stage ({n}) or as "
                            f"virtual stages per pipeline rank ({v}), not both")
        what = f"interleaved pipeline stages ({self.interleaving_said()})"
        if layout.pp <= (1 if self.overlap_p2p_comm else 2):
            raise EchoError(f"{where}: {what} need pp > 2, or pp > 1 with the pipeline communication overlapped "
                            f"with the compute, got pp {layout.pp}")
        if n and (self.layers % (layout.pp * n) or self.layers // (layout.pp * n) < 2):
            raise EchoError(f"{where}: {what} need layers ({self.layers}) to be a multiple of pp x {n} "
                            f"({layout.pp * n}) with at least 2 chunks per stage (layers >= {2 * layout.pp * n})")
        if v == 1:
            raise EchoError(f"{where}: {what} need at least 2 chunks per stage")
        if v:
            counts = self.stage_layer_counts(layout.pp)
            for name, i in (("first", 0), ("last", layout.pp - 1), ("middle", 1)):
                if counts[i] % v:
                    raise EchoError(f"{where}: {what} need each stage's layers to split into {v} chunks; the "
                                    f"{name} stage's {counts[i]} layers do not")
        self.check_microbatch_groups(layout, where, what)
        if self.grad_sync == "overlap" and not self.overlap_grad_reduce:
            raise EchoError(f"{where}: {what} need the gradient sync after the backward pass "
                            "(after-backward) or Megatron-Core's overlapped one, not PyTorch DDP's")

    def check_microbatch_groups(self, layout: ParallelLayout, where: str, what: str) -> None:
        """Megatron-Core's rules for the interleaved schedule's micro-batch groups (its
        ``forward_backward_pipelining_with_interleaving`` raises on either)."""
        from echo_et.workloads.pipeline_plan import microbatch_group_problem

        m, pp, g = layout.microbatches, layout.pp, self.microbatch_group_size
        if not g and m % pp:
            raise EchoError(f"{where}: {what} need micro-batches ({m}) to be a multiple of pp ({pp}), or "
                            f"groups of micro-batches per virtual stage from pp to {m} that leave a last "
                            f"group of 0 or at least pp")
        problem = microbatch_group_problem(pp, m, g)
        if problem:
            raise EchoError(f"{where}: {what} need {problem}")

    def check_pipeline_engine(self, layout: ParallelLayout) -> None:
        """DeepSpeed's pipeline engine runs its own schedule (no interleaving), reduces the
        gradients after it (no overlap) and times nothing with Megatron's timers."""
        where = f"layout {layout.describe()}"
        if self.pipeline_engine not in PIPELINE_ENGINES:
            raise EchoError(f"{where}: pipeline engine {self.pipeline_engine!r} is not one of "
                            f"{', '.join(PIPELINE_ENGINES)}")
        if self.pipeline_engine != "deepspeed":
            return
        for clash, what in ((self.interleaved, "interleaved pipeline stages (Megatron-LM's)"),
                            (self.grad_sync == "overlap", "a gradient sync overlapped with the backward "
                                                          "(it reduces after the schedule)"),
                            (self.sync_timers, "Megatron's synchronising timers (it has its own)")):
            if clash:
                raise EchoError(f"{where}: DeepSpeed's pipeline engine does not run {what}")

    def check_sequence_parallel(self, layout: ParallelLayout) -> None:
        """Megatron's sequence parallelism: its layers (megatron flavour, the output layer
        tied to the embedding), a sequence the TP ranks split evenly; DeepSpeed's engine and
        partitioned checkpoints are another software's."""
        if not self.sequence_parallel:
            return
        where = f"layout {layout.describe()}"
        if self.attention != "megatron" or not (self.tie_embeddings or self.llama):
            raise EchoError(f"{where}: sequence parallelism is Megatron's (megatron-gpt, with its tied output layer, "
                            "or the llama architecture's own)")
        if self.seq % layout.tp:
            raise EchoError(f"{where}: sequence parallelism needs tp ({layout.tp}) to divide the sequence "
                            f"({self.seq})")
        if self.pipeline_engine != "megatron" or self.partition_activations:
            raise EchoError(f"{where}: sequence parallelism is Megatron-LM's; DeepSpeed's pipeline engine "
                            "and partitioned activation checkpoints do not run with it here")

    def check_footprint(self, layout: ParallelLayout, device: str = "meta") -> None:
        """Refuse, before tracing, what cannot finish: a traced rank's graph beyond
        ``MAX_GRAPH_NODES``, or host memory beyond this machine's (lower-bound estimates)."""
        where = f"layout {layout.describe()}"
        per_stage = max(self.stage_layer_counts(layout.pp))
        traced_mbs = 1 if device == "meta" else layout.microbatches  # meta records one, repeats it
        per_layer = (NODES_PER_LAYER + NODES_PER_RING_STEP * (layout.cp - 1)
                     + NODES_PER_LOCAL_EXPERT * (self.num_experts // layout.ep))
        nodes = per_layer * per_stage * traced_mbs * (2 if self.recomputes_layers else 1)
        if nodes > MAX_GRAPH_NODES:
            times = "".join(f" x {n:,} {what}" for n, what in ((traced_mbs, "micro-batches"),
                                                                (2 if self.recomputes_layers else 1, "(recompute)"))
                            if n > 1)
            raise EchoError(f"{where}: a traced rank would record at least {nodes:,} nodes ({per_stage:,} "
                            f"layers per stage x {per_layer} nodes{times}); the limit is "
                            f"{MAX_GRAPH_NODES:,} nodes per graph")
        tokens = layout.microbatches * self.micro_batch * (self.seq + 1)
        parts = {"layers": HOST_BYTES_PER_LAYER * per_stage, "tokens": TOKEN_BYTES * tokens}
        if device == "cpu":  # weights and gradients, and one kept activation per layer
            el = dtype_size(self.dtype) or 4
            parts["weights"] = 2 * el * self.parameters() // (layout.tp * layout.pp)
            parts["activations"] = el * self.micro_batch * self.seq * self.hidden * per_stage
        need, have = sum(parts.values()), total_memory()
        if need > have:
            shown = ", ".join(f"{k} {format_size(v)}" for k, v in parts.items() if v)
            raise EchoError(f"{where}: tracing needs at least {format_size(need)} of host memory ({shown}); "
                            f"this machine has {format_size(have)}")

    def padded_vocab(self, tp: int) -> int:
        """The vocabulary rounded up to a multiple of ``vocab_multiple`` x tp."""
        step = self.vocab_multiple * tp
        return int(math.ceil(self.vocab / step) * step)

    def step_flops(self, sequences: int, tp: int = 1, pp: int = 1) -> tuple[float, float]:
        """(model FLOPs, hardware FLOPs) of one training step over ``sequences`` sequences, as
        Narayanan et al. 2021 count them (their eq. 3, with this MLP's width): the matrix
        products only, 2 FLOPs per multiply-add, attention scores and context over the whole
        s x s (causal masking not subtracted), the output layer on the vocabulary padded for
        ``tp``; forward and backward are 3 forwards. Hardware FLOPs add what recomputation runs
        again: the forward of every recomputed layer (full; over ``pp`` stages with the block
        method) or the core attention's two batched products (selective). What MFU and the
        Megatron-LM paper's teraFLOP/s are computed from. With experts, a token's MLP is its
        k experts' and the router's GEMM (the active parameters')."""
        h, s, f = self.hidden, self.seq, self.ffn_size
        kv = h // self.heads * self.query_groups          # the width of K and of V
        mlp = (6 if self.llama else 4) * h * f            # SwiGLU's first projection is twice as wide
        moe_layers = self.moe_layer_count()
        if moe_layers:            # each token through k experts (and the shared one), and the router
            moe_mlp = ((self.moe_topk * self.moe_ffn_size + self.moe_shared_ffn) * (6 if self.llama else 4) * h
                       + 2 * h * self.num_experts)
            # the MoE layers' MLP on average over the layers (what the recomputed forwards run too)
            mlp = (moe_layers * moe_mlp + (self.layers - moe_layers) * mlp) / self.layers
        layer = 4 * h * h + 4 * h * kv + mlp + 4 * s * h  # per token: Q and projection, K and V, MLP; attention
        tokens = sequences * s
        model = 3 * tokens * (self.layers * layer + 2 * h * self.padded_vocab(tp))
        again = 0
        if self.recompute:
            again = (self.recomputed_layers(pp) * layer if self.recompute_granularity == "full"
                     else self.layers * (4 * s * h * self.recomputes_core_attention + mlp * self.recomputes_mlp))
        return float(model), float(model + tokens * again)

    def parameters(self) -> int:
        """Parameters of the whole (unsplit) model, for reports."""
        h, f = self.hidden, self.ffn_size
        kv = h // self.heads * self.query_groups
        v = self.padded_vocab(1)
        e, fe = self.num_experts, self.moe_ffn_size
        moe, dense = self.moe_layer_count(), self.layers - self.moe_layer_count()
        if self.llama:      # no biases, one weight per RMSNorm, no learned positions
            mlp = moe * (e * 3 * h * fe + e * h + 3 * h * self.moe_shared_ffn) + dense * 3 * h * f
            block = self.layers * (2 * h * h + 2 * h * kv + 2 * h) + mlp
            return block + v * h + h + (0 if self.tie_embeddings else h * v)
        shared = 2 * h * self.moe_shared_ffn + self.moe_shared_ffn + h if self.moe_shared_ffn else 0
        mlp = moe * (e * (2 * h * fe + fe + h) + e * h + shared) + dense * (2 * h * f + f + h)
        block = self.layers * (2 * h * h + 2 * h * kv + (h + 2 * kv) + h + 4 * h) + mlp
        head = 0 if self.tie_embeddings else h * v + v
        return block + v * h + self.seq * h + 2 * h + head

    def to_json(self) -> dict:
        return omit_record_defaults(asdict(self))


# Options added after the first records were written: at these values a record leaves them out,
# so the records (Jobs' provenance, sweep results and logs) of the plain Megatron run stay as
# they were.
RECORD_DEFAULTS: dict[str, Any] = {
    "layers_per_virtual_stage": 0, "virtual_stages_per_rank": 0, "microbatch_group_size": 0,
    "overlap_p2p_comm": False, "overlap_p2p_comm_warmup_flush": False, "sync_timers": False,
    "pipeline_engine": PIPELINE_ENGINES[0],
    "partition_activations": False, "sequence_parallel": False, "first_stage_layers": 0,
    "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
    "last_stage_layers": 0, "grad_reduce_scatter": True, "arch": ARCHS[0], "ffn_hidden": 0, "kv_heads": 0,
    "flash_attention": False, "gradient_accumulation_fusion": False, "overlap_grad_reduce": False,
    "overlap_param_gather": False, "align_grad_reduce": True, "align_param_gather": True,
    "overlap_param_gather_with_optimizer_step": False, "recompute_method": "uniform", "recompute_num_layers": 1,
    "recompute_modules": "core_attn", "cp_comm_type": "p2p", "num_experts": 0, "moe_topk": 2, "moe_ffn_hidden": 0,
    "moe_token_dispatcher": "allgather", "moe_shared_ffn": 0, "moe_grouped_gemm": False, "moe_layer_freq": "1",
}


def omit_record_defaults(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a GPT configuration's or a sweep's options, as a dict) without the options
    at their :data:`RECORD_DEFAULTS`, and without ``recompute_granularity`` when nothing is
    recomputed."""
    out = {k: v for k, v in record.items() if k not in RECORD_DEFAULTS or v != RECORD_DEFAULTS[k]}
    if not record.get("recompute"):
        out.pop("recompute_granularity", None)
    return out


def megatron_core_bucket_mb(dp: int, dtype: str) -> float:
    """Megatron-Core's gradient bucket under ``--overlap-grad-reduce``, in MiB of parameters
    of ``dtype``: max(40M, 1M x dp) parameters (its ``DistributedDataParallel``'s default
    ``bucket_size``), filled in reverse parameter order and closed once it holds that many."""
    return max(40_000_000, 1_000_000 * dp) * (dtype_size(dtype) or 4) / (1 << 20)


def microbatches_for(global_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per pipeline: global batch / (micro-batch x dp), which must divide."""
    if global_batch < 1:
        raise EchoError(f"global batch must be >= 1, got {global_batch}")
    per = micro_batch * dp
    if global_batch % per:
        raise EchoError(f"global batch ({global_batch}) is not a multiple of micro-batch x dp "
                        f"({micro_batch} x {dp} = {per})")
    return global_batch // per
