"""A configuration sweep's rows and what they share: the options every row takes
(:class:`ConfigSweepOptions`: the cluster, Megatron's training settings, the models) and what
one row runs under them (:func:`workload_for`: the GPT configuration and layout its columns
give, checked against Megatron's rules and the GPU's memory). A row's own optional columns
(its interleaving, micro-batch group, uneven stages, MLP width, key/value heads) override the
options; these helpers say which holds, so the sweep, the layout grid and the iteration fit
read a row alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from echo_et.errors import EchoError
from echo_et.experiments.config_csv import REQUIRED
from echo_et.models.cluster import Cluster

DEFAULT_GPU = "a100"
DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class ConfigSweepOptions:
    """What every row shares: the cluster, the training settings, the models."""

    cluster: Cluster = field(default_factory=lambda: Cluster(gpu=DEFAULT_GPU))
    recompute: bool = False
    # Megatron's --recompute-granularity: "full" (each layer, its --checkpoint-activations) or
    # "selective" (the core attention, what its --recompute-activations turns on); with
    # recompute only
    recompute_granularity: str = "full"
    # Megatron's --recompute-method and --recompute-num-layers (GPTConfig.recompute_method,
    # recompute_num_layers); a row's recompute_num_layers column overrides the latter
    recompute_method: str = "uniform"
    recompute_num_layers: int = 1
    # Megatron-Core's --recompute-modules, with selective recomputation (GPTConfig.recompute_modules)
    recompute_modules: str = "core_attn"
    dtype: str = "float16"
    vocab: int | None = None           # default: the workload's (GPT-2's 50257)
    grad_sync: str = "after-backward"  # Megatron-DeepSpeed's local DDP: bucketing off
    compute_profile: str | None = None  # a calibrated compute profile (JSON)
    comm_profile: str | None = None     # a calibrated collective-model profile (JSON)
    comm_preset: str | None = None      # a collective-model preset name
    slowdown: bool = True               # slow compute that overlaps communication
    # Megatron's --scatter-gather-tensors-in-pipeline (its default): 1/tp of each pipeline
    # send, all-gathered in the receiving stage's TP group
    scatter_gather_tensors_in_pipeline: bool = True
    # Megatron's --accumulate-allreduce-grads-in-fp32; None: its default (on with bfloat16)
    accumulate_allreduce_grads_in_fp32: bool | None = None
    # Megatron's --use-distributed-optimizer: ZeRO stage 1 (reduce-scatter, Adam on the shard,
    # all-gather of the 16-bit weights)
    use_distributed_optimizer: bool = False
    # Megatron's --num-layers-per-virtual-pipeline-stage (the interleaved 1F1B schedule; 0: the
    # plain one); a row's layers_per_virtual_stage column overrides it
    layers_per_virtual_stage: int = 0
    # Megatron-Core's --num-virtual-stages-per-pipeline-rank (the interleaved schedule by its
    # model chunks per stage; 0: not given); a row's virtual_stages_per_rank column overrides it
    virtual_stages_per_rank: int = 0
    # Megatron's overlap_p2p_comm with the interleaved schedule (GPTConfig.overlap_p2p_comm)
    overlap_p2p_comm: bool = False
    # Megatron's overlap_p2p_comm_warmup_flush (GPTConfig.overlap_p2p_comm_warmup_flush), with it
    overlap_p2p_comm_warmup_flush: bool = False
    # Megatron-Core's micro-batches per group of the interleaved schedule
    # (GPTConfig.microbatch_group_size; 0: pp); a row's microbatch_group_size column overrides it
    microbatch_group_size: int = 0
    # Megatron's timers before its 2022 rewrite: the host waits for the device at the edges of
    # every micro-batch's forward, backward and pipeline exchange (GPTConfig.sync_timers)
    sync_timers: bool = False
    # who runs the pipeline: Megatron-LM's 1F1B or DeepSpeed's engine (GPTConfig.pipeline_engine)
    pipeline_engine: str = "megatron"
    # DeepSpeed's partitioned activation checkpoints (Megatron-DeepSpeed's --partition-activations)
    partition_activations: bool = False
    # Megatron-LM's --sequence-parallel (GPTConfig.sequence_parallel)
    sequence_parallel: bool = False
    # Megatron-Core's --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers
    # (GPTConfig.first_stage_layers, last_stage_layers; 0: the even share); a row's
    # first_stage_layers and last_stage_layers columns override them
    first_stage_layers: int = 0
    last_stage_layers: int = 0
    # Megatron-Core's --account-for-embedding/loss-in-pipeline-split (GPTConfig's), every row
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # with the distributed optimizer: gradients reduce-scattered (Megatron's) or all-reduced
    # whole (DeepSpeed's "reduce_scatter": false and its bfloat16 optimizer; GPTConfig.grad_reduce_scatter)
    grad_reduce_scatter: bool = True
    # the layer: "gpt" or "llama" (GPTConfig.arch); the MLP width and key/value heads of every
    # row (0: 4 x hidden, one per head; a row's ffn_hidden and kv_heads columns override them);
    # Megatron's --use-flash-attn (GPTConfig.flash_attention)
    arch: str = "gpt"
    ffn_hidden: int = 0
    kv_heads: int = 0
    flash_attention: bool = False
    # Megatron-Core's --cp-comm-type, for the rows with a cp column (GPTConfig.cp_comm_type)
    cp_comm_type: str = "p2p"
    # Megatron-Core's mixture of experts (GPTConfig.num_experts, moe_topk, moe_ffn_hidden), every
    # row; a row's ep column is its expert parallelism
    num_experts: int = 0
    moe_topk: int = 2
    moe_ffn_hidden: int = 0
    moe_token_dispatcher: str = "allgather"
    moe_shared_ffn: int = 0
    moe_grouped_gemm: bool = False
    moe_layer_freq: str = "1"
    # Megatron-LM's --gradient-accumulation-fusion (GPTConfig.gradient_accumulation_fusion)
    gradient_accumulation_fusion: bool = False
    # Megatron-Core's --overlap-grad-reduce: the gradient sync overlapped with the backward, in
    # its buckets of max(40M, 1M x dp) parameters (gpt_config.megatron_core_bucket_mb)
    overlap_grad_reduce: bool = False
    # Megatron-Core's --overlap-param-gather (GPTConfig.overlap_param_gather)
    overlap_param_gather: bool = False
    # Megatron-LM's --align-grad-reduce and --align-param-gather, on unless --no-align-...
    # (GPTConfig.align_grad_reduce, align_param_gather; the gathers' only with an interleaved row)
    align_grad_reduce: bool = True
    align_param_gather: bool = True
    # Megatron-LM's --overlap-param-gather-with-optimizer-step, for the interleaved rows (Megatron
    # asserts an interleaved schedule; GPTConfig.overlap_param_gather_with_optimizer_step)
    overlap_param_gather_with_optimizer_step: bool = False
    # the named model whose shape fills the rows' missing columns (workloads.model_shapes;
    # "": none); recorded, so that a sweep resumed under another model is another sweep
    model: str = ""

    def gpu(self) -> str:
        return self.cluster.gpu or DEFAULT_GPU

    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node or DEFAULT_GPUS_PER_NODE

    def to_json(self) -> dict[str, Any]:
        from echo_et.workloads.gpt_config import omit_record_defaults

        out = omit_record_defaults({k: v for k, v in asdict(self).items()
                                    if k != "cluster" and not (k == "model" and not v)})
        out["cluster"] = self.cluster.to_json(self.gpus_per_node()) | {"gpu": self.gpu()}
        return out


def layout_family(row: dict[str, Any]) -> str:
    """"tp-heavy", "pp-heavy" or "dp-heavy": the parallelism with the largest degree (ties:
    "mixed"; all 1: "single")."""
    degrees = {k: int(row[k]) for k in ("tp", "pp", "dp")}
    top = max(degrees.values())
    if top == 1:
        return "single"
    leaders = [k for k, v in degrees.items() if v == top]
    return f"{leaders[0]}-heavy" if len(leaders) == 1 else "mixed"


def workload_for(row: dict[str, Any], opts: ConfigSweepOptions):
    """(GPTConfig, ParallelLayout) of a row; EchoError naming the numbers when it does not
    fit (tp not dividing heads, pp not dividing layers, a global batch that does not
    divide)."""
    from echo_et.experiments.memory_check import check_memory
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads.gpt_config import GPTConfig, megatron_core_bucket_mb, microbatches_for

    for k in REQUIRED:
        if int(row[k]) < 1:
            raise EchoError(f"{k} must be >= 1, got {row[k]}")
    extra = {"vocab": int(row["vocab"])} if row.get("vocab") else (
        {"vocab": opts.vocab} if opts.vocab else {})
    grad_sync = opts.grad_sync
    if opts.overlap_grad_reduce:
        grad_sync = "overlap"
        # Megatron-Core sizes its buckets by the data-parallel ranks with context parallelism
        extra["bucket_mb"] = megatron_core_bucket_mb(int(row["dp"]) * row_cp(row), opts.dtype)
    cfg = GPTConfig.megatron(layers=int(row["layers"]), hidden=int(row["hidden"]),
                             heads=int(row["heads"]), seq=int(row["seq"]),
                             micro_batch=int(row["micro_batch"]), recompute=recomputes(row, opts),
                             recompute_granularity=opts.recompute_granularity,
                             recompute_method=opts.recompute_method, recompute_modules=opts.recompute_modules,
                             recompute_num_layers=row_or(row, "recompute_num_layers", opts.recompute_num_layers),
                             dtype=opts.dtype, grad_sync=grad_sync,
                             scatter_gather_tensors_in_pipeline=opts.scatter_gather_tensors_in_pipeline,
                             accumulate_allreduce_grads_in_fp32=opts.accumulate_allreduce_grads_in_fp32,
                             **dict(zip(("layers_per_virtual_stage", "virtual_stages_per_rank"),
                                        interleaving(row, opts), strict=True)),
                             # as Megatron does, only with an interleaved schedule (off without one)
                             overlap_p2p_comm=opts.overlap_p2p_comm and any(interleaving(row, opts)),
                             overlap_p2p_comm_warmup_flush=opts.overlap_p2p_comm_warmup_flush
                             and any(interleaving(row, opts)),
                             microbatch_group_size=microbatch_group(row, opts),
                             sync_timers=opts.sync_timers, pipeline_engine=opts.pipeline_engine,
                             partition_activations=opts.partition_activations,
                             sequence_parallel=opts.sequence_parallel, grad_reduce_scatter=opts.grad_reduce_scatter,
                             account_for_embedding_in_pipeline_split=opts.account_for_embedding_in_pipeline_split,
                             account_for_loss_in_pipeline_split=opts.account_for_loss_in_pipeline_split,
                             **dict(zip(("first_stage_layers", "last_stage_layers"), edge_stage_layers(row, opts),
                                        strict=True)),
                             arch=opts.arch, flash_attention=opts.flash_attention, cp_comm_type=opts.cp_comm_type,
                             gradient_accumulation_fusion=opts.gradient_accumulation_fusion,
                             overlap_param_gather=opts.overlap_param_gather,
                             overlap_grad_reduce=opts.overlap_grad_reduce,
                             align_grad_reduce=opts.align_grad_reduce or not opts.overlap_grad_reduce,
                             # Megatron turns it off without an interleaved schedule (never aligned there)
                             align_param_gather=opts.align_param_gather or not (opts.overlap_param_gather
                                                                                and any(interleaving(row, opts))),
                             overlap_param_gather_with_optimizer_step=(opts.overlap_param_gather_with_optimizer_step
                                                                       and any(interleaving(row, opts))),
                             ffn_hidden=row_or(row, "ffn_hidden", opts.ffn_hidden),
                             num_experts=opts.num_experts, moe_topk=opts.moe_topk,
                             moe_ffn_hidden=opts.moe_ffn_hidden, moe_token_dispatcher=opts.moe_token_dispatcher,
                             moe_shared_ffn=opts.moe_shared_ffn, moe_grouped_gemm=opts.moe_grouped_gemm,
                             moe_layer_freq=opts.moe_layer_freq,
                             kv_heads=row_or(row, "kv_heads", opts.kv_heads), **extra)
    m = microbatches_for(int(row["global_batch"]), int(row["micro_batch"]), int(row["dp"]))
    layout = ParallelLayout(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), microbatches=m,
                            zero=1 if opts.use_distributed_optimizer else 0, cp=row_cp(row),
                            ep=row_ep(row))
    cfg.validate(layout)
    check_memory(cfg, layout, opts.gpu())
    return cfg, layout


def row_degree(row: dict[str, Any], column: str) -> int:
    """A row's optional parallel size (its ``column``, "cp" or "ep"; 1 without one)."""
    value = row.get(column)
    value = 1 if value is None else int(value)
    if value < 1:
        raise EchoError(f"{column} must be >= 1, got {value}")
    return value


def row_ep(row: dict[str, Any]) -> int:
    """A row's expert-parallel size (its ep column; 1 without one)."""
    return row_degree(row, "ep")


def row_cp(row: dict[str, Any]) -> int:
    """A row's context-parallel size (its cp column; 1 without one)."""
    return row_degree(row, "cp")


def row_or(row: dict[str, Any], column: str, default: int) -> int:
    """A row's own value of an optional column, else the sweep's."""
    v = row.get(column)
    return int(v) if v is not None else default


def recomputes(row: dict[str, Any], opts: ConfigSweepOptions) -> bool:
    """Whether a row recomputes activations (at the sweep's granularity): its own recompute
    column, 0 or 1, else the sweep's --recompute."""
    v = row_or(row, "recompute", int(opts.recompute))
    if v not in (0, 1):
        raise EchoError(f"recompute must be 0 or 1, got {v}")
    return bool(v)


def interleaving(row: dict[str, Any], opts: ConfigSweepOptions) -> tuple[int, int]:
    """(layers per virtual stage, virtual stages per pipeline rank) of a row (0: not given):
    its own columns when it gives them, else the sweep's options."""
    return (row_or(row, "layers_per_virtual_stage", opts.layers_per_virtual_stage),
            row_or(row, "virtual_stages_per_rank", opts.virtual_stages_per_rank))


def microbatch_group(row: dict[str, Any], opts: ConfigSweepOptions) -> int:
    """A row's micro-batches per group of the interleaved schedule: its own column, else the
    sweep's option; 0 (ignored, as Megatron ignores it) when the row runs plain 1F1B."""
    return row_or(row, "microbatch_group_size", opts.microbatch_group_size) if any(interleaving(row, opts)) else 0


def schedule_said(row: dict[str, Any], opts: ConfigSweepOptions) -> str:
    """A row's pipeline schedule in a few words (``GPTConfig.schedule_said``): "1F1B",
    "interleaved x2, stages 6, 8 x 15"; "" for a row whose degrees are not numbers >= 1."""
    from echo_et.workloads.gpt_config import GPTConfig

    try:
        layers, pp = int(row["layers"]), int(row["pp"])
        vls, vpr = interleaving(row, opts)
        first, last = edge_stage_layers(row, opts)
        group = microbatch_group(row, opts)
    except (KeyError, TypeError, ValueError):
        return ""
    if layers < 1 or pp < 1 or min(vls, vpr, first, last, group) < 0:
        return ""
    return GPTConfig(layers=layers, layers_per_virtual_stage=vls, virtual_stages_per_rank=vpr,
                     microbatch_group_size=group, first_stage_layers=first, last_stage_layers=last,
                     account_for_embedding_in_pipeline_split=opts.account_for_embedding_in_pipeline_split,
                     account_for_loss_in_pipeline_split=opts.account_for_loss_in_pipeline_split).schedule_said(pp)


def edge_stage_layers(row: dict[str, Any], opts: ConfigSweepOptions) -> tuple[int, int]:
    """(first, last) stage's own layer counts of a row (0: the even share): its own columns
    when it gives them, else the sweep's options."""
    got = [row.get(f"{k}_stage_layers") for k in ("first", "last")]
    first = int(got[0]) if got[0] is not None else opts.first_stage_layers
    last = int(got[1]) if got[1] is not None else opts.last_stage_layers
    return first, last
