"""What every verb shares: error handling, ``--json`` output and job loading."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from typer.core import TyperGroup

from echo_et.errors import EchoError, OptionError
from echo_et.ir import limits
from echo_et.workloads.model_shapes import MODEL_SHAPES

if TYPE_CHECKING:
    from echo_et.converters.chrome import ScratchEstimate

F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON object on stdout.")
NO_SCATTER_GATHER = "--no-scatter-gather-tensors-in-pipeline"
NoScatterGatherOpt = typer.Option(
    False, NO_SCATTER_GATHER,
    help="Send every activation and gradient between pipeline stages whole from each TP rank, instead of "
         "Megatron's default 1/tp slice per TP rank all-gathered in the receiving stage's TP group "
         "(Megatron's flag of the same name; docs/predict.md).")
MICROBATCH_GROUP = "--microbatch-group-size-per-virtual-pipeline-stage"
MicrobatchGroupOpt = typer.Option(
    0, MICROBATCH_GROUP, metavar="G",
    help="Megatron-Core's micro-batch groups for the interleaved schedule: G micro-batches through each model "
         "chunk in turn, G from pp to the micro-batches, the last group whole or at least pp (so micro-batches "
         "need not be a multiple of pp); 0: pp, Megatron's default. Ignored without an interleaved schedule, as "
         "Megatron ignores it (docs/predict.md).")
VIRTUAL_STAGES = "--num-layers-per-virtual-pipeline-stage"
VirtualStagesOpt = typer.Option(
    0, VIRTUAL_STAGES, metavar="N",
    help="Megatron's interleaved 1F1B pipeline schedule (its flag): each stage holds layers / (pp x N) model "
         "chunks of N layers (needs pp > 2, or > 1 with --overlap-p2p-communication, at least 2 chunks per stage, "
         "micro-batches a multiple of pp or "
         f"{MICROBATCH_GROUP}); "
         "0: the plain 1F1B schedule (docs/predict.md).")
VIRTUAL_STAGES_PER_RANK = "--num-virtual-stages-per-pipeline-rank"
VirtualStagesPerRankOpt = typer.Option(
    0, VIRTUAL_STAGES_PER_RANK, metavar="V",
    help="Megatron-Core's interleaved 1F1B schedule given by its model chunks: each stage's layers in V chunks "
         "(V must divide every stage's layers, uneven first and last stages included; pp > 2, or > 1 with "
         "--overlap-p2p-communication, micro-batches a "
         f"multiple of pp or {MICROBATCH_GROUP}); the form Megatron-Core takes with "
         "--decoder-first/last-pipeline-num-layers. 0: not given.")
OVERLAP_P2P = "--overlap-p2p-communication"
OverlapP2pOpt = typer.Option(
    False, OVERLAP_P2P,
    help="Megatron's overlap_p2p_comm with the interleaved schedule (Megatron-LM's default there): each pipeline "
         "send and receive posted on its own, unbatched, right after the compute that makes it and waited for "
         "before the compute that needs it, with no device synchronisation; off without an interleaved schedule, "
         "as Megatron turns it off (docs/predict.md).")
OVERLAP_P2P_FLUSH = "--overlap-p2p-communication-warmup-flush"
OverlapP2pFlushOpt = typer.Option(
    False, OVERLAP_P2P_FLUSH,
    help=f"Megatron's overlap_p2p_comm_warmup_flush: {OVERLAP_P2P} (which it implies) in the interleaved "
         "schedule's warm-up and cool-down too, each stage but the leading one posting the next step's receive "
         "before this step's compute; needs an interleaved schedule, as Megatron does (docs/predict.md).")
FP32_GRADS = "--accumulate-allreduce-grads-in-fp32"
Fp32GradsOpt = typer.Option(
    None, f"{FP32_GRADS}/--no-accumulate-allreduce-grads-in-fp32",
    help="Accumulate gradients and all-reduce them over the data-parallel ranks in fp32 (Megatron's flag, "
         "which it forces on with bfloat16: the default with --dtype bfloat16), or in the model's 16-bit "
         "dtype (the default with float16; with bfloat16, Megatron-Core's --grad-reduce-in-bf16).")
DIST_OPT = "--use-distributed-optimizer"
DistOptOpt = typer.Option(
    False, DIST_OPT,
    help="Megatron's distributed optimizer (ZeRO stage 1): gradients reduce-scattered over the data-parallel "
         "ranks, Adam on each rank's shard, the 16-bit weights all-gathered (Megatron's flag; default: "
         "one all-reduce and Adam over the stage's whole model).")
SYNC_TIMERS = "--sync-timers"
SYNC_TIMERS_HELP = ("Megatron's timers as Megatron-LM had them until 2022: the host waits for the GPU "
                    "(torch.cuda.synchronize()) at the start and end of every micro-batch's forward and "
                    "backward and around each pipeline exchange (default: timers that do not synchronise, "
                    "today's; docs/tracer.md).")
SyncTimersOpt = typer.Option(False, SYNC_TIMERS, help=SYNC_TIMERS_HELP)
GRAD_SYNC = "--grad-sync"
GradSyncOpt = typer.Option(
    None, GRAD_SYNC, metavar="MODE",
    help="How the gradients are reduced over the data-parallel ranks: after-backward (Megatron's local DDP: "
         "one all-reduce of the gradient buffer after the backward; the default) or overlap (PyTorch DDP, "
         "Megatron's --DDP-impl torch: 25 MB buckets all-reduced during the last micro-batch's backward).")
OVERLAP_GRAD_REDUCE = "--overlap-grad-reduce"
OverlapGradReduceOpt = typer.Option(
    False, OVERLAP_GRAD_REDUCE,
    help="Megatron-Core's overlapped gradient sync (its flag): buckets of max(40M, 1M x dp) parameters, each "
         "all-reduced (reduce-scattered with --use-distributed-optimizer) as the last micro-batch's backward "
         "fills it; --grad-sync overlap with Megatron-Core's buckets instead of PyTorch DDP's 25 MB.")
OVERLAP_PARAM_GATHER = "--overlap-param-gather"
OverlapParamGatherOpt = typer.Option(
    False, OVERLAP_PARAM_GATHER,
    help="Megatron-Core's flag: the distributed optimizer's all-gathers of the updated weights run during the "
         "next step's forward, one bucket ahead of the layers that need them, instead of after the optimizer "
         "(needs --use-distributed-optimizer and --overlap-grad-reduce; trace: --zero 1).")
GATHER_WITH_STEP = "--overlap-param-gather-with-optimizer-step"
GatherWithStepOpt = typer.Option(
    False, GATHER_WITH_STEP,
    help="With --overlap-param-gather and the interleaved schedule, Megatron-LM's flag: the first model chunk's "
         "weights are updated first and their all-gathers issued right then, while the other chunks' are "
         "updated, instead of in the next step's forward; no chunk is cut into buckets (docs/predict.md).")
NO_ALIGN_GRAD_REDUCE = "--no-align-grad-reduce"
NoAlignGradReduceOpt = typer.Option(
    False, NO_ALIGN_GRAD_REDUCE,
    help="With --overlap-grad-reduce, Megatron-LM's flag: every stage issues each bucket's reduction as the "
         "backward of its model chunk's last micro-batch fills it, where by default the stages after the first "
         "issue theirs after the schedule and the interleaved schedule a chunk's whole at points aligned across "
         "the stages (docs/predict.md).")
NO_ALIGN_PARAM_GATHER = "--no-align-param-gather"
NoAlignParamGatherOpt = typer.Option(
    False, NO_ALIGN_PARAM_GATHER,
    help="With --overlap-param-gather and the interleaved schedule, Megatron-LM's flag: each model chunk's "
         "first weight gather is issued by its first forward, which waits for it, and each wait issues the "
         "chunk's next, where by default a chunk's are issued whole at points aligned across the stages; "
         "ignored without an interleaved schedule, whose gathers Megatron never aligns (docs/predict.md).")
PARTITION_ACTIVATIONS = "--partition-activations"
PARTITION_ACTIVATIONS_HELP = ("With full recomputation, keep each layer's checkpointed input split over the TP "
                              "ranks and all-gather it before the layer runs again in the backward (DeepSpeed's "
                              "activation checkpointing as Megatron-DeepSpeed's --partition-activations asks; "
                              "default: every TP rank keeps it whole).")
PartitionActivationsOpt = typer.Option(False, PARTITION_ACTIVATIONS, help=PARTITION_ACTIVATIONS_HELP)
SEQUENCE_PARALLEL = "--sequence-parallel"
SEQUENCE_PARALLEL_HELP = ("Megatron-LM's sequence parallelism (its flag): between the tensor-parallel regions each TP "
                          "rank holds 1/tp of the sequence, so layer norms and dropouts run on s / tp tokens and each "
                          "layer's two all-reduces become all-gathers and reduce-scatters of the same bytes (needs tp "
                          "to divide the sequence; a no-op at tp 1).")
SequenceParallelOpt = typer.Option(False, SEQUENCE_PARALLEL, help=SEQUENCE_PARALLEL_HELP)
CONTEXT_PARALLEL = "--context-parallel-size"
CONTEXT_PARALLEL_HELP = ("Megatron-Core's context parallelism (its flag): each sequence split over N more ranks "
                         "(tp x cp x dp x pp GPUs, ranks in its tp-cp-dp-pp order), attention exchanging keys and "
                         "values around them in a ring as Transformer Engine does; needs --flash-attn.")
ContextParallelOpt = typer.Option(1, CONTEXT_PARALLEL, metavar="N", help=CONTEXT_PARALLEL_HELP)
EXPERTS = "--num-experts"
ExpertsOpt = typer.Option(
    0, EXPERTS, metavar="E",
    help="Megatron-Core's mixture of experts (its flag): every layer's MLP is E experts, each token routed to "
         "--moe-router-topk of them through the alltoall token dispatcher (routing taken as balanced); 0: dense.")
TOPK = "--moe-router-topk"
TopkOpt = typer.Option(None, TOPK, metavar="K",
                       help="Experts per token (Megatron-Core's flag; default --model's, else 2).")
MOE_FFN = "--moe-ffn-hidden-size"
MoeFfnOpt = typer.Option(0, MOE_FFN, metavar="N",
                         help="Each expert's MLP width (Megatron-Core's flag; 0: the dense MLP's, --ffn-hidden-size).")
LAYER_FREQ = "--moe-layer-freq"
LayerFreqOpt = typer.Option(None, LAYER_FREQ, metavar="N|PATTERN",
                            help="Which layers are MoE layers (Megatron-Core's flag): every N-th from the first, or "
                                 "a pattern of 0s (dense) and 1s, one per layer, e.g. '([0]*3+[1]*29)' (default: all).")
GROUPED_GEMM = "--moe-grouped-gemm"
GroupedGemmOpt = typer.Option(False, GROUPED_GEMM,
                              help="The local experts' GEMMs as one grouped kernel each (Megatron-Core's flag; its "
                                   "experts have no biases: with --arch llama).")
SHARED_EXPERT = "--moe-shared-expert-intermediate-size"
SharedExpertOpt = typer.Option(0, SHARED_EXPERT, metavar="N",
                               help="A shared expert beside the routed ones (Megatron-Core's flag): every token also "
                                    "runs a dense MLP of width N (0: none).")
DISPATCHER = "--moe-token-dispatcher-type"
DispatcherOpt = typer.Option(
    None, DISPATCHER, metavar="TYPE",
    help="How tokens reach their experts (Megatron-Core's flag): allgather (its default: every token of the TP x "
         "EP ranks gathered) or alltoall (rows sent to their experts' ranks, what its recipes use with expert "
         "parallelism).")
EXPERT_PARALLEL = "--expert-model-parallel-size"
EXPERT_PARALLEL_HELP = ("Megatron-Core's expert parallelism (its flag): the experts split over N ranks cut out of "
                        "the data-parallel ones (N divides dp x cp and the experts; no more GPUs), which exchange "
                        "tokens by all-to-all.")
ExpertParallelOpt = typer.Option(1, EXPERT_PARALLEL, "--ep", metavar="N", help=EXPERT_PARALLEL_HELP)
CP_COMM_TYPE = "--cp-comm-type"
CP_COMM_TYPE_HELP = ("Megatron-Core's (its flag): how the context-parallel ranks exchange keys and values: p2p (its "
                     "default: a ring, under the attention), allgather (all of them gathered first), a2a (Ulysses: "
                     "all-to-alls from a share of the positions to a share of the heads and back).")
CpCommTypeOpt = typer.Option(None, CP_COMM_TYPE, metavar="TYPE", help=CP_COMM_TYPE_HELP)
PIPELINE_ENGINE = "--pipeline-engine"
PIPELINE_ENGINE_HELP = ("Who runs the pipeline: megatron (Megatron-LM's 1F1B schedule; the default) or deepspeed "
                        "(DeepSpeed's PipelineEngine, what Megatron-DeepSpeed runs with pipeline parallelism: its "
                        "TrainSchedule, one blocking send or receive per tensor, tensors partitioned over the TP "
                        "ranks, data loaded on the first and last stage only; docs/tracer.md).")
PipelineEngineOpt = typer.Option(None, PIPELINE_ENGINE, metavar="ENGINE", help=PIPELINE_ENGINE_HELP)
NO_REDUCE_SCATTER = "--no-reduce-scatter"
NoReduceScatterOpt = typer.Option(
    False, NO_REDUCE_SCATTER,
    help="With --use-distributed-optimizer, all-reduce the gradients whole and keep each rank's shard instead of "
         "reduce-scattering them (twice the bytes): DeepSpeed's ZeRO with \"reduce_scatter\": false, and its bfloat16 "
         "optimizer (BF16_Optimizer, what Megatron-DeepSpeed runs with --bf16 and pipeline parallelism: "
         "--dtype bfloat16 --use-distributed-optimizer --no-reduce-scatter).")
FIRST_STAGE_LAYERS = "--decoder-first-pipeline-num-layers"
FirstStageLayersOpt = typer.Option(
    0, FIRST_STAGE_LAYERS, metavar="N",
    help="Layers on the first pipeline stage, the other stages sharing the rest evenly (Megatron-Core's flag; "
         "DeepSpeed's --pp-partition-method 'type:transformer|embedding' is this and the last stage's at "
         "(layers + 2) / pp - 1 each); 0: layers / pp on every stage (docs/predict.md).")
LAST_STAGE_LAYERS = "--decoder-last-pipeline-num-layers"
LastStageLayersOpt = typer.Option(
    0, LAST_STAGE_LAYERS, metavar="N",
    help="Layers on the last pipeline stage, the other stages sharing the rest evenly (Megatron-Core's flag); "
         "0: the even share.")
ACCOUNT_EMBEDDING = "--account-for-embedding-in-pipeline-split"
AccountEmbeddingOpt = typer.Option(
    False, ACCOUNT_EMBEDDING,
    help="Megatron-Core's flag: the word embedding counts as a layer of the first stage when the layers are split "
         "over the stages, so it holds one layer less ((layers + 1) / pp a stage; pp must divide it); not with "
         f"{FIRST_STAGE_LAYERS} or the interleaved schedule (docs/predict.md).")
ACCOUNT_LOSS = "--account-for-loss-in-pipeline-split"
AccountLossOpt = typer.Option(
    False, ACCOUNT_LOSS,
    help="Megatron-Core's flag: the loss counts as a layer of the last stage when the layers are split, so it "
         "holds one layer less (with the embedding's too: (layers + 2) / pp a stage, Llama 3 405B's 7, 8 x 14, 7).")
ARCH = "--arch"
ArchOpt = typer.Option(
    None, ARCH, metavar="ARCH",
    help="The layer: gpt (LayerNorm, GeLU MLP, biases, learned positions, output layer tied to the embedding; the "
         "default) or llama (what Megatron-LM's --swiglu --normalization RMSNorm --disable-bias-linear "
         "--position-embedding-type rope --untie-embeddings-and-output-weights run, without dropout, as its Llama "
         "recipes set it; docs/predict.md).")
FFN_HIDDEN = "--ffn-hidden"
FfnHiddenOpt = typer.Option(
    0, FFN_HIDDEN, "--ffn-hidden-size", metavar="N",
    help="The MLP's inner width (Megatron's --ffn-hidden-size; 0: 4 x hidden). With --arch llama the first MLP "
         "projection is twice this (SwiGLU).")
KV_HEADS = "--kv-heads"
KvHeadsOpt = typer.Option(
    0, KV_HEADS, "--num-query-groups", metavar="N",
    help="Key/value heads, grouped-query attention (Megatron's --group-query-attention --num-query-groups; must "
         "divide --heads, and tp must divide it); 0: one per query head.")
FLASH_ATTN = "--flash-attn"
FlashAttnOpt = typer.Option(
    False, FLASH_ATTN, "--use-flash-attn",
    help="The core attention as one flash-attention kernel each way (Megatron's --use-flash-attn), instead of "
         "its batched GEMMs and softmax: no sequence x sequence tensor in memory.")
GRAD_ACC_FUSION = "--gradient-accumulation-fusion"
GradAccFusionOpt = typer.Option(
    False, GRAD_ACC_FUSION,
    help="Each weight gradient added into the fp32 main_grad by its GEMM, with no separate accumulation kernel "
         "(Megatron-LM's flag, on there where Apex is installed); needs gradients accumulated in fp32 (bfloat16's "
         "default).")
MODEL = "--model"
ModelOpt = typer.Option(
    None, MODEL, metavar="NAME",
    help="A published model's shape by name: " + ", ".join(MODEL_SHAPES) + " (layers, hidden, heads, key/value "
         "heads, MLP width, sequence, vocabulary and architecture, from its paper; docs/predict.md). Options given "
         "beside it override its values.")
RECOMPUTE_GRANULARITY = "--recompute-granularity"
RecomputeGranularityOpt = typer.Option(
    None, RECOMPUTE_GRANULARITY, metavar="LEVEL",
    help="What --recompute recomputes (and implies it): full (the default: each layer's forward runs again "
         "in its backward, as Megatron's --checkpoint-activations or --recompute-granularity full) or "
         "selective (only the core attention, from the scores to the context, as Megatron's "
         "--recompute-activations).")


RECOMPUTE_METHOD = "--recompute-method"
RecomputeMethodOpt = typer.Option(
    None, RECOMPUTE_METHOD, metavar="METHOD",
    help="With full recomputation, Megatron's recompute method: uniform (the default: each model chunk's layers "
         "checkpointed in groups of --recompute-num-layers) or block (only the first --recompute-num-layers "
         "layers of each model chunk recomputed, the others keeping all their activations) (docs/predict.md).")
RECOMPUTE_NUM_LAYERS = "--recompute-num-layers"
RecomputeNumLayersOpt = typer.Option(
    None, RECOMPUTE_NUM_LAYERS, metavar="N",
    help="With full recomputation, Megatron's --recompute-num-layers: the layers of a uniform group, or the "
         "layers of each model chunk the block method recomputes (default 1).")


RECOMPUTE_MODULES_FLAG = "--recompute-modules"
RecomputeModulesOpt = typer.Option(
    None, RECOMPUTE_MODULES_FLAG, metavar="MODULES",
    help="With selective recomputation, Megatron-Core's modules to recompute, comma-separated: core_attn (the "
         "default), mlp (the whole MLP), layernorm (the norms' outputs) (docs/predict.md).")


def model_fields(model: str | None, **given: Any) -> dict[str, Any]:
    """A named model's shape (GPTConfig field names) under the options given beside it: an
    option given (not None, not 0) wins over the model's value. Without a model, the options
    given."""
    from echo_et.workloads.model_shapes import model_shape

    try:
        out: dict[str, Any] = {} if model is None else model_shape(model).options()
    except EchoError as e:
        raise OptionError("model", str(e)) from None
    out.update({k: v for k, v in given.items() if v})
    return out


def recompute_setting(recompute: bool, granularity: str | None) -> tuple[bool, str]:
    """(recompute, granularity) from ``--recompute`` and ``--recompute-granularity``; a
    granularity given turns recomputation on, as Megatron's flag does."""
    from echo_et.workloads.gpt_config import RECOMPUTE_GRANULARITIES

    if granularity is None:
        return recompute, RECOMPUTE_GRANULARITIES[0]
    if granularity not in RECOMPUTE_GRANULARITIES:
        raise OptionError("recompute-granularity",
                          f"{granularity!r} is not one of {', '.join(RECOMPUTE_GRANULARITIES)}")
    return True, granularity


def recompute_detail_settings(recompute: bool, granularity: str, method: str | None,
                             num_layers: int | None, modules: str | None = None) -> dict[str, Any]:
    """The ``ConfigSweepOptions`` fields of what recomputation's flags detail ({} when none is
    given): ``--recompute-method`` and ``--recompute-num-layers``, full recomputation's, as in
    Megatron, which refuses them with selective recomputation (and without recomputation has
    nothing to recompute); ``--recompute-modules``, selective recomputation's."""
    from echo_et.workloads.gpt_config import OTHER_RECOMPUTE_MODULES, RECOMPUTE_METHODS, RECOMPUTE_MODULES

    out: dict[str, Any] = {}
    if modules is not None:
        from echo_et.workloads.gpt_config import recompute_module_names

        names = recompute_module_names(modules)
        if not names:
            raise OptionError("recompute_modules", f"{modules!r}: name at least one module")
        for m in names:
            if m not in RECOMPUTE_MODULES:
                why = (" (a mixture-of-experts or multi-latent attention module: echo-et's layers have none)"
                       if m in OTHER_RECOMPUTE_MODULES else "")
                raise OptionError("recompute_modules", f"{m!r} is not one of {', '.join(RECOMPUTE_MODULES)}{why}")
        if not (recompute and granularity == "selective"):
            raise OptionError("recompute_modules", "it says what selective recomputation recomputes: give "
                                                   "--recompute-granularity selective, as Megatron-Core reads it "
                                                   "there only")
        out["recompute_modules"] = ",".join(names)
    if method is None and num_layers is None:
        return out
    if method is not None and method not in RECOMPUTE_METHODS:
        raise OptionError("recompute_method", f"{method!r} is not one of {', '.join(RECOMPUTE_METHODS)}")
    if num_layers is not None and num_layers < 1:
        raise OptionError("recompute_num_layers", f"{num_layers}: give the layers, at least 1")
    if not (recompute and granularity == "full"):
        raise OptionError("recompute_method" if method is not None else "recompute_num_layers",
                          "it says how full recomputation runs: give --recompute (or --recompute-granularity full), "
                          "as Megatron asks for --recompute-granularity full")
    return {**out, "recompute_method": method or RECOMPUTE_METHODS[0], "recompute_num_layers": num_layers or 1}


def megatron_settings(*, no_scatter_gather: bool, virtual_layers: int, fp32_grads: bool | None,
                      virtual_chunks: int = 0, overlap_p2p: bool = False, overlap_p2p_flush: bool = False,
                      microbatch_group: int = 0,
                      distributed_optimizer: bool, sync_timers: bool, grad_sync: str | None,
                      pipeline_engine: str | None = None, partition_activations: bool = False,
                      sequence_parallel: bool = False, first_stage_layers: int = 0,
                      account_embedding: bool = False, account_loss: bool = False,
                      last_stage_layers: int = 0, no_reduce_scatter: bool = False, arch: str | None = None,
                      ffn_hidden: int = 0, kv_heads: int = 0, flash_attention: bool = False,
                      gradient_accumulation_fusion: bool = False,
                      overlap_grad_reduce: bool = False, overlap_param_gather: bool = False,
                      no_align_grad_reduce: bool = False, no_align_param_gather: bool = False,
                      gather_with_step: bool = False, cp_comm_type: str | None = None,
                      num_experts: int = 0, moe_topk: int | None = None, moe_ffn_hidden: int = 0,
                      moe_dispatcher: str | None = None, moe_shared_ffn: int = 0,
                      moe_grouped_gemm: bool = False, moe_layer_freq: str | None = None) -> dict[str, Any]:
    """The training settings Megatron's flags give (``ConfigSweepOptions`` fields), the same
    on ``predict`` and ``sweep --configs``; ``grad_sync`` and ``pipeline_engine`` only when
    given (None: the options' defaults, Megatron's local DDP and its 1F1B); the layer's
    architecture, MLP width, key/value heads and flash attention likewise."""
    from echo_et.workloads.gpt_config import ARCHS, CP_COMM_TYPES, GRAD_SYNCS, MOE_DISPATCHERS, PIPELINE_ENGINES

    if arch is not None and arch not in ARCHS:
        raise OptionError("arch", f"{arch!r} is not one of {', '.join(ARCHS)}")
    for name, n in (("ffn_hidden", ffn_hidden), ("kv_heads", kv_heads)):
        if n < 0:
            raise OptionError(name, f"{n}: give a positive number, or 0 for the default")

    if cp_comm_type is not None and cp_comm_type not in CP_COMM_TYPES:
        other = " (a2a+p2p, hierarchical context parallelism, is not modelled)" if cp_comm_type == "a2a+p2p" else ""
        raise OptionError("cp_comm_type", f"{cp_comm_type!r} is not one of {', '.join(CP_COMM_TYPES)}{other}")
    if moe_dispatcher is not None and moe_dispatcher not in MOE_DISPATCHERS:
        raise OptionError("moe_token_dispatcher_type", f"{moe_dispatcher!r} is not one of {', '.join(MOE_DISPATCHERS)} "
                                                       "(flex, DeepEP's, and alltoall_seq are not modelled)")
    if grad_sync is not None and grad_sync not in GRAD_SYNCS:
        raise OptionError("grad_sync", f"{grad_sync!r} is not one of {', '.join(GRAD_SYNCS)}")
    if overlap_grad_reduce and grad_sync is not None:
        raise OptionError("grad_sync", f"{OVERLAP_GRAD_REDUCE} is the overlapped sync in Megatron-Core's "
                                       "buckets; give it or --grad-sync, not both")
    if pipeline_engine is not None and pipeline_engine not in PIPELINE_ENGINES:
        raise OptionError("pipeline_engine", f"{pipeline_engine!r} is not one of {', '.join(PIPELINE_ENGINES)}")
    if overlap_param_gather and not (distributed_optimizer and overlap_grad_reduce):
        raise OptionError("overlap_param_gather", f"the weights' all-gathers belong to {DIST_OPT} and overlap "
                                                  f"with the forward as Megatron-Core runs them with "
                                                  f"{OVERLAP_GRAD_REDUCE}; give both")
    if microbatch_group < 0:
        raise OptionError("microbatch_group", f"{microbatch_group}: give the micro-batches per group, or 0 for pp")
    for flag, given, needs, option in ((NO_ALIGN_GRAD_REDUCE, no_align_grad_reduce, overlap_grad_reduce,
                                        OVERLAP_GRAD_REDUCE),
                                       (NO_ALIGN_PARAM_GATHER, no_align_param_gather, overlap_param_gather,
                                        OVERLAP_PARAM_GATHER),
                                       (GATHER_WITH_STEP, gather_with_step, overlap_param_gather,
                                        OVERLAP_PARAM_GATHER)):
        if given and not needs:
            raise OptionError(flag.lstrip("-").replace("-", "_"), f"it changes when {option}'s collectives are "
                                                                  f"issued; give {option} too")
    if no_reduce_scatter and not distributed_optimizer:
        raise OptionError("no_reduce_scatter", f"{NO_REDUCE_SCATTER} changes how {DIST_OPT} reduces the gradients; "
                                               f"give {DIST_OPT} too")
    if pipeline_engine == "deepspeed" and no_scatter_gather:
        raise OptionError("pipeline_engine", f"DeepSpeed's engine partitions every pipeline tensor over the TP "
                                             f"ranks; {NO_SCATTER_GATHER} is Megatron-LM's")
    return {"scatter_gather_tensors_in_pipeline": not no_scatter_gather,
            "layers_per_virtual_stage": virtual_layers,
            "virtual_stages_per_rank": virtual_chunks,
            "overlap_p2p_comm": overlap_p2p or overlap_p2p_flush,    # Megatron's default, which the flag needs
            "overlap_p2p_comm_warmup_flush": overlap_p2p_flush,
            "microbatch_group_size": microbatch_group,
            "accumulate_allreduce_grads_in_fp32": fp32_grads,
            "use_distributed_optimizer": distributed_optimizer,
            "sync_timers": sync_timers,
            "partition_activations": partition_activations,
            "sequence_parallel": sequence_parallel,
            "first_stage_layers": first_stage_layers,
            "account_for_embedding_in_pipeline_split": account_embedding,
            "account_for_loss_in_pipeline_split": account_loss,
            "last_stage_layers": last_stage_layers,
            "grad_reduce_scatter": not no_reduce_scatter,
            "arch": arch or ARCHS[0], "ffn_hidden": ffn_hidden, "kv_heads": kv_heads,
            "flash_attention": flash_attention, "gradient_accumulation_fusion": gradient_accumulation_fusion,
            "overlap_grad_reduce": overlap_grad_reduce, "overlap_param_gather": overlap_param_gather,
            "align_grad_reduce": not no_align_grad_reduce, "align_param_gather": not no_align_param_gather,
            "overlap_param_gather_with_optimizer_step": gather_with_step,
            "cp_comm_type": cp_comm_type or CP_COMM_TYPES[0],
            "num_experts": num_experts, "moe_topk": 2 if moe_topk is None else moe_topk,
            "moe_ffn_hidden": moe_ffn_hidden, "moe_token_dispatcher": moe_dispatcher or MOE_DISPATCHERS[0],
            "moe_shared_ffn": moe_shared_ffn, "moe_grouped_gemm": moe_grouped_gemm,
            "moe_layer_freq": "1" if moe_layer_freq is None else moe_layer_freq.strip(),
            **({"grad_sync": grad_sync} if grad_sync is not None else {}),
            **({"pipeline_engine": pipeline_engine} if pipeline_engine is not None else {})}


def megatron_flag_given(settings: dict[str, Any]) -> str | None:
    """The first of Megatron's flags ``settings`` departs from the default with, or None."""
    given = ((NO_SCATTER_GATHER, not settings["scatter_gather_tensors_in_pipeline"]),
             (VIRTUAL_STAGES, bool(settings["layers_per_virtual_stage"])),
             (VIRTUAL_STAGES_PER_RANK, bool(settings["virtual_stages_per_rank"])),
             (OVERLAP_P2P, settings["overlap_p2p_comm"] and not settings["overlap_p2p_comm_warmup_flush"]),
             (OVERLAP_P2P_FLUSH, settings["overlap_p2p_comm_warmup_flush"]),
             (MICROBATCH_GROUP, bool(settings["microbatch_group_size"])),
             (FP32_GRADS, settings["accumulate_allreduce_grads_in_fp32"] is not None),
             (DIST_OPT, settings["use_distributed_optimizer"]),
             (SYNC_TIMERS, settings["sync_timers"]),
             (GRAD_SYNC, "grad_sync" in settings),
             (PIPELINE_ENGINE, "pipeline_engine" in settings),
             (PARTITION_ACTIVATIONS, settings["partition_activations"]),
             (SEQUENCE_PARALLEL, settings["sequence_parallel"]),
             (FIRST_STAGE_LAYERS, bool(settings["first_stage_layers"])),
             (ACCOUNT_EMBEDDING, settings["account_for_embedding_in_pipeline_split"]),
             (ACCOUNT_LOSS, settings["account_for_loss_in_pipeline_split"]),
             (LAST_STAGE_LAYERS, bool(settings["last_stage_layers"])),
             (NO_REDUCE_SCATTER, not settings["grad_reduce_scatter"]),
             (ARCH, settings["arch"] != "gpt"),
             (FFN_HIDDEN, bool(settings["ffn_hidden"])),
             (KV_HEADS, bool(settings["kv_heads"])),
             (FLASH_ATTN, settings["flash_attention"]),
             (GRAD_ACC_FUSION, settings["gradient_accumulation_fusion"]),
             (OVERLAP_GRAD_REDUCE, settings["overlap_grad_reduce"]),
             (OVERLAP_PARAM_GATHER, settings["overlap_param_gather"]),
             (NO_ALIGN_GRAD_REDUCE, not settings["align_grad_reduce"]),
             (NO_ALIGN_PARAM_GATHER, not settings["align_param_gather"]),
             (GATHER_WITH_STEP, settings["overlap_param_gather_with_optimizer_step"]),
             (CP_COMM_TYPE, settings["cp_comm_type"] != "p2p"),
             (EXPERTS, bool(settings.get("num_experts"))),
             (MOE_FFN, bool(settings.get("moe_ffn_hidden"))),
             (DISPATCHER, settings.get("moe_token_dispatcher", "allgather") != "allgather"),
             (SHARED_EXPERT, bool(settings.get("moe_shared_ffn"))),
             (GROUPED_GEMM, bool(settings.get("moe_grouped_gemm"))),
             (LAYER_FREQ, settings.get("moe_layer_freq", "1") != "1"))
    return next((flag for flag, on in given if on), None)


GPN_HELP = "GPUs per node of the target cluster (a world size must fill whole nodes, or fit in one)."


# Typer bundles its own click; its base error class is reached through a public subclass.
_CLICK_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class OneLineErrors(TyperGroup):
    """The root command group: a usage error (an option that does not parse, a missing
    argument) is one line on stderr and exit 2, like every other bad input."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _CLICK_ERROR as e:
            message = " ".join(e.format_message().split())
            if message:  # a group called bare has printed its help and has nothing to add
                typer.echo(f"error: {message}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, exit ``code``: how every verb reports bad input."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def guarded(fn: F) -> F:
    """Check every numeric option against its bounds (:data:`OPTION_BOUNDS`), then turn
    EchoError (and unreadable-input errors) into a one-line message and exit 2."""
    flags = _flags_of(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            check_options(kwargs, flags)
            return fn(*args, **kwargs)
        except EchoError as e:
            fail(error_line(e, set(flags.values())))
        except BrokenPipeError:
            quiet_broken_pipe()
        except OSError as e:
            reason = e.strerror or str(e) or type(e).__name__
            fail(f"{e.filename}: {reason}" if e.filename is not None else reason)
        except MemoryError:
            fail("out of memory (the input asks for more than this machine has)")
        except RecursionError:  # before RuntimeError, its base: a JSON file nested thousands deep
            fail("an input is nested too deeply to read (thousands of levels)")
        except RuntimeError as e:
            if not str(e).startswith("Symlink loop"):  # pathlib's resolve() meeting a link cycle
                raise
            fail(f"{e} (a symbolic link that leads back to itself)")
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


def quiet_broken_pipe() -> None:
    """The reader of stdout went away (``echo-et ... | head``): stop without a word, as a
    command killed by SIGPIPE does (exit 141), and keep Python's exit-time flush of the dead
    pipe from printing a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a descriptor (captured in tests)
        pass
    raise typer.Exit(141)


# Library option names whose flag is not simply "--" + the name with dashes.
FLAG_OF_OPTION = {"format": "--from"}


def flag_of(option: str) -> str:
    """The command-line flag for a library option name (``gpus_per_node`` -> ``--gpus-per-node``)."""
    return FLAG_OF_OPTION.get(option, "--" + option.replace("_", "-"))


def error_line(e: EchoError, flags: set[str] | None = None) -> str:
    """The one line a verb prints for ``e``; an option error is prefixed with its flag, the
    library's errors speak of values and the CLI says which option held the value. A flag
    the verb does not have (``flags``: the verb's) is not named: ``simulate`` has no
    ``--from`` to give."""
    line = str(e).splitlines()[0] if str(e) else type(e).__name__
    if not isinstance(e, OptionError) or (flags is not None and flag_of(e.option) not in flags):
        return line
    return f"{flag_of(e.option)}: {line}"


# Bounds of numeric options, by flag: (low, high) for integers; (low, high, low excluded) for
# floats. An option not listed is still refused when it is not finite or beyond int64.
OPTION_BOUNDS: dict[str, tuple] = {
    "--ranks": (1, limits.MAX_WORLD_SIZE),
    "--world-size": (1, limits.MAX_WORLD_SIZE),
    "--rank": (0, limits.MAX_WORLD_SIZE - 1),
    "--gpus-per-node": (1, limits.MAX_GPUS_PER_NODE),
    "--dp": (1, limits.MAX_WORLD_SIZE),
    "--tp": (1, limits.MAX_WORLD_SIZE),
    "--pp": (1, limits.MAX_PIPELINE_STAGES),
    CONTEXT_PARALLEL: (1, limits.MAX_WORLD_SIZE),
    EXPERT_PARALLEL: (1, limits.MAX_WORLD_SIZE),
    EXPERTS: (0, 1 << 16),
    TOPK: (1, 1 << 16),
    MOE_FFN: (0, 1 << 24),
    SHARED_EXPERT: (0, 1 << 24),
    "--microbatches": (1, limits.MAX_MICROBATCHES),
    "--splits": (1, 1 << 16),
    "--workers": (1, 4096),
    "--folds": (2, 1000),
    "--step": (0, limits.MAX_NS),
    "--timeline-events": (1, limits.INT64_MAX),
    "--compute-scale": (0.0, limits.MAX_FACTOR, True),
    "--bucket-mb": (0.0, 1e9, True),
    "--first-bucket-mb": (0.0, 1e9, True),
}


def _flags_of(fn: Callable[..., Any]) -> dict[str, str]:
    """Python parameter name -> its long flag, for the typer options of ``fn``."""
    out = {}
    for name, p in inspect.signature(fn).parameters.items():
        decls = getattr(p.default, "param_decls", None) or ()
        longs = [d for d in decls if isinstance(d, str) and d.startswith("--")]
        if longs:
            out[name] = longs[0]
    return out


def check_options(values: dict[str, Any], flags: dict[str, str]) -> None:
    """One EchoError naming the flag for the first numeric option out of its bounds."""
    for name, value in values.items():
        flag = flags.get(name)
        if flag is None or value is None or isinstance(value, bool):
            continue
        items = value if isinstance(value, list | tuple) else [value]
        bounds = OPTION_BOUNDS.get(flag)
        for v in items:
            if isinstance(v, bool):
                continue
            if isinstance(v, float):
                lo, hi, lo_open = bounds if bounds and len(bounds) == 3 else (-math.inf, math.inf, False)
                limits.checked_float(v, flag, lo=lo, hi=hi, lo_open=lo_open)
            elif isinstance(v, int):
                lo, hi = bounds[:2] if bounds and len(bounds) == 2 else (-limits.INT64_MAX, limits.INT64_MAX)
                limits.checked_int(v, flag, lo=lo, hi=hi)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_job_arg(path: Path, fmt: str | None = None):
    """A Job from a Job directory or any readable trace (converted on the fly)."""
    from echo_et.converters import ReadOptions, read

    return read([path], fmt, ReadOptions())


MAX_OUTPUT_HELP = ("Refuse, before writing, an output estimated above this size (default 64GB; never above "
                   "the free space of the output's file system, less what a scratch file takes there).")


def free_space(path: Path | str) -> tuple[int, int] | None:
    """(device, free bytes) of the file system that ``path`` is on, or would be made on (its
    nearest existing folder above); None when the system does not say."""
    import shutil

    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return os.stat(where).st_dev, shutil.disk_usage(where).free
    except OSError:
        return None


def max_output_bytes(text: str | None) -> int:
    """The ``--max-output`` limit in bytes, the default when not given: read once, before any
    work, so a bad size fails first."""
    from echo_et.cli.unit_opts import size_option
    from echo_et.ir.budget import DEFAULT_MAX_OUTPUT_BYTES

    limit = size_option(text, "max_output", lo=1, hi=1 << 62)
    return DEFAULT_MAX_OUTPUT_BYTES if limit is None else limit


def check_output_budget(job, fmt: str, dest: Path | str, limit: int, *, ranks=None,
                        per_rank: bool = True, name: str = "", max_nodes: int | None = None,
                        scratch: ScratchEstimate | None = None) -> None:
    """Refuse, before a byte is written, an export whose estimated size (nodes x ranks x a
    lower bound per node, from the Job's graphs and repeat blocks) passes ``limit`` bytes
    (``--max-output``, :func:`max_output_bytes`) or the free space where it goes: one line
    with the estimate and the limit.
    ``max_nodes``: the writer keeps at most about that many nodes (``--timeline-events``).
    ``scratch``: the scratch file the writer keeps beside what it has written (the timeline
    writer's, :func:`echo_et.converters.chrome.timeline_scratch`): counted with the output
    where it lands on the output's file system, against its own file system's free space
    otherwise (not against ``--max-output``, which bounds what is written)."""
    from echo_et.ir.budget import estimate_output
    from echo_et.ir.limits import format_size

    est = estimate_output(job, fmt, ranks, per_rank=per_rank, max_nodes=max_nodes)
    name = name or f"export {fmt}"
    # bounded, the nodes kept are at most about max_nodes: the size is an estimate, not a floor
    bound = "about" if est.of is not None else "at least"
    size = f"{bound} {format_size(est.bytes)}"
    if est.bytes > limit:
        raise EchoError(f"{dest}: {name} would write {size} ({est.describe()}); the "
                        f"limit is {format_size(limit)} (--max-output SIZE raises it)")
    # the output lands in its folder (a file or folder is written beside it, then renamed)
    out_fs = free_space(Path(dest).absolute().parent)
    if out_fs is not None and est.bytes > out_fs[1]:
        raise EchoError(f"{dest}: {name} would write {size} ({est.describe()}); "
                        f"its file system has {format_size(out_fs[1])} free")
    if scratch is None or not scratch.bytes:
        return
    kept = f"a scratch file of {bound} {format_size(scratch.bytes)} ({scratch.describe()}) in {scratch.where}"
    scratch_fs = free_space(scratch.where)
    if out_fs is not None and scratch_fs is not None and scratch_fs[0] == out_fs[0]:
        if est.bytes + scratch.bytes > out_fs[1]:
            raise EchoError(f"{dest}: {name} would write {size} ({est.describe()}) and keep {kept} while it "
                            f"writes; their file system has {format_size(out_fs[1])} free")
    elif scratch_fs is not None and scratch.bytes > scratch_fs[1]:
        raise EchoError(f"{scratch.where}: {name} would keep {kept} while it writes; "
                        f"its file system has {format_size(scratch_fs[1])} free")


def check_output_path(flag: str, dest: Path | None, *, file_only: bool = False) -> None:
    """Refuse, before any work, an output whose folder is missing or that is a folder where
    a file is meant."""
    if dest is None:
        return
    is_file = file_only or dest.name.lower().endswith((".json", ".json.gz", ".png"))
    if is_file and dest.exists() and dest.is_dir():
        raise EchoError(f"{dest}: is a directory")
    if not dest.parent.is_dir():
        raise EchoError(f"{flag} {dest}: folder {dest.parent} does not exist (create it first)")
