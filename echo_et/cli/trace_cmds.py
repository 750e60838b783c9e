"""trace: build a Job ex-situ, one device playing each distinct rank of a dp x tp x pp job."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from echo_et.cli.cluster_opts import (
    cluster_from_options,
    gpu_opt,
    gpus_per_node_opt,
    inter_bw_opt,
    intra_bw_opt,
)
from echo_et.cli.common import (
    ACCOUNT_EMBEDDING,
    ACCOUNT_LOSS,
    ARCH,
    CONTEXT_PARALLEL,
    CP_COMM_TYPE,
    CP_COMM_TYPE_HELP,
    DISPATCHER,
    EXPERT_PARALLEL,
    EXPERTS,
    FFN_HIDDEN,
    FIRST_STAGE_LAYERS,
    FLASH_ATTN,
    GATHER_WITH_STEP,
    GRAD_ACC_FUSION,
    GROUPED_GEMM,
    KV_HEADS,
    LAST_STAGE_LAYERS,
    LAYER_FREQ,
    MICROBATCH_GROUP,
    MODEL,
    MOE_FFN,
    NO_ALIGN_GRAD_REDUCE,
    NO_ALIGN_PARAM_GATHER,
    NO_REDUCE_SCATTER,
    OVERLAP_GRAD_REDUCE,
    OVERLAP_P2P,
    OVERLAP_P2P_FLUSH,
    OVERLAP_PARAM_GATHER,
    PARTITION_ACTIVATIONS_HELP,
    PIPELINE_ENGINE_HELP,
    RECOMPUTE_METHOD,
    RECOMPUTE_MODULES_FLAG,
    RECOMPUTE_NUM_LAYERS,
    SEQUENCE_PARALLEL_HELP,
    SHARED_EXPERT,
    SYNC_TIMERS_HELP,
    TOPK,
    VIRTUAL_STAGES_PER_RANK,
    AccountEmbeddingOpt,
    AccountLossOpt,
    ArchOpt,
    ContextParallelOpt,
    DispatcherOpt,
    ExpertParallelOpt,
    ExpertsOpt,
    FfnHiddenOpt,
    FirstStageLayersOpt,
    FlashAttnOpt,
    GatherWithStepOpt,
    GradAccFusionOpt,
    GroupedGemmOpt,
    JsonOpt,
    KvHeadsOpt,
    LastStageLayersOpt,
    LayerFreqOpt,
    MicrobatchGroupOpt,
    ModelOpt,
    MoeFfnOpt,
    NoAlignGradReduceOpt,
    NoAlignParamGatherOpt,
    NoReduceScatterOpt,
    OverlapGradReduceOpt,
    OverlapP2pFlushOpt,
    OverlapP2pOpt,
    OverlapParamGatherOpt,
    RecomputeGranularityOpt,
    RecomputeMethodOpt,
    RecomputeModulesOpt,
    RecomputeNumLayersOpt,
    SharedExpertOpt,
    TopkOpt,
    VirtualStagesPerRankOpt,
    emit_json,
    guarded,
    model_fields,
    recompute_detail_settings,
    recompute_setting,
)

BUCKET_MB = 25.0   # PyTorch DDP's bucket_cap_mb


def register(app: typer.Typer) -> None:
    app.command("trace")(trace)


@guarded
def trace(
    output: Path = typer.Option(..., "-o", "--output", help="Job directory to write."),
    workload: str = typer.Option("gpt", "--workload", metavar="NAME",
                                 help="Built-in workload: gpt, or megatron-gpt (Megatron-DeepSpeed's GPT "
                                      "pretraining: padded vocabulary, tied embeddings, fused kernels, one DP "
                                      "all-reduce after the backward, fp32 master weights)."),
    script: str | None = typer.Option(None, "--script",
                                      help="User workload: path/to/file.py:build_fn (see docs/tracer.md)."),
    model: str | None = ModelOpt,
    layers: int | None = typer.Option(None, "--layers", help="GPT: transformer layers (default --model's, else 2)."),
    hidden: int | None = typer.Option(None, "--hidden", help="GPT: hidden size (default --model's, else 64)."),
    heads: int | None = typer.Option(None, "--heads", help="GPT: attention heads (default --model's, else 4)."),
    seq: int | None = typer.Option(None, "--seq", help="GPT: sequence length (default --model's, else 32)."),
    micro_batch: int = typer.Option(2, "--micro-batch", help="GPT: sequences per micro-batch."),
    vocab: int | None = typer.Option(None, "--vocab", metavar="N",
                                     help="GPT: vocabulary size (default --model's, else 256; megatron-gpt: "
                                          "50257, padded to a multiple of 128 x tp)."),
    dtype: str | None = typer.Option(None, "--dtype", metavar="DTYPE",
                                     help="GPT: float32, bfloat16 or float16 (default float32; megatron-gpt: "
                                          "float16)."),
    recompute: bool = typer.Option(False, "--recompute",
                                   help="GPT: recompute activations in the backward, at --recompute-granularity "
                                        "(default full: each layer)."),
    recompute_granularity: str | None = RecomputeGranularityOpt,
    recompute_method: str | None = RecomputeMethodOpt,
    recompute_num_layers: int | None = RecomputeNumLayersOpt,
    recompute_modules: str | None = RecomputeModulesOpt,
    grad_sync: str | None = typer.Option(None, "--grad-sync", metavar="MODE",
                                         help="GPT: overlap (bucketed all-reduces during the backward; gpt's "
                                              "default) or after-backward (one all-reduce; megatron-gpt's)."),
    scatter_gather: bool | None = typer.Option(
        None, "--scatter-gather-tensors-in-pipeline/--no-scatter-gather-tensors-in-pipeline",
        help="GPT: with tp > 1 and pp > 1, each TP rank sends 1/tp of every activation and gradient to the "
             "next stage, which all-gathers it in its TP group (Megatron's optimization; megatron-gpt's "
             "default), or every TP rank sends it whole (gpt's default)."),
    fp32_grads: bool | None = typer.Option(
        None, "--accumulate-allreduce-grads-in-fp32/--no-accumulate-allreduce-grads-in-fp32",
        help="megatron-gpt: accumulate gradients and all-reduce them over the data-parallel ranks in fp32 "
             "(Megatron's flag, forced on with bfloat16: the default there), or in the model's dtype."),
    virtual_layers: int = typer.Option(
        0, "--num-layers-per-virtual-pipeline-stage", metavar="N",
        help="GPT: interleaved 1F1B pipeline schedule (Megatron's flag): each stage holds layers / (pp x N) "
             "model chunks of N layers (needs pp > 2, or > 1 with --overlap-p2p-communication, at least 2 chunks, "
             "micro-batches a multiple of pp or "
             f"{MICROBATCH_GROUP}); "
             "0: the plain 1F1B schedule."),
    virtual_chunks: int = VirtualStagesPerRankOpt,
    overlap_p2p: bool = OverlapP2pOpt,
    overlap_p2p_flush: bool = OverlapP2pFlushOpt,
    microbatch_group: int = MicrobatchGroupOpt,
    sync_timers: bool = typer.Option(False, "--sync-timers", help="megatron-gpt: " + SYNC_TIMERS_HELP),
    partition_activations: bool = typer.Option(False, "--partition-activations",
                                               help="GPT: " + PARTITION_ACTIVATIONS_HELP),
    sequence_parallel: bool = typer.Option(False, "--sequence-parallel",
                                           help="megatron-gpt: " + SEQUENCE_PARALLEL_HELP),
    first_stage_layers: int = FirstStageLayersOpt,
    account_embedding: bool = AccountEmbeddingOpt,
    account_loss: bool = AccountLossOpt,
    last_stage_layers: int = LastStageLayersOpt,
    no_reduce_scatter: bool = NoReduceScatterOpt,
    arch: str | None = ArchOpt,
    ffn_hidden: int = FfnHiddenOpt,
    kv_heads: int = KvHeadsOpt,
    flash_attention: bool = FlashAttnOpt,
    gradient_accumulation_fusion: bool = GradAccFusionOpt,
    overlap_grad_reduce: bool = OverlapGradReduceOpt,
    overlap_param_gather: bool = OverlapParamGatherOpt,
    no_align_grad_reduce: bool = NoAlignGradReduceOpt,
    no_align_param_gather: bool = NoAlignParamGatherOpt,
    gather_with_step: bool = GatherWithStepOpt,
    pipeline_engine: str | None = typer.Option(None, "--pipeline-engine", metavar="ENGINE",
                                               help="GPT: " + PIPELINE_ENGINE_HELP),
    global_batch: int | None = typer.Option(None, "--global-batch", metavar="N",
                                            help="Sequences per step: micro-batches = N / (micro-batch x dp)."),
    bucket_mb: float = typer.Option(BUCKET_MB, "--bucket-mb", help="GPT: gradient bucket size (MiB)."),
    microbatches: int | None = typer.Option(None, "--microbatches", metavar="N",
                                            help="Micro-batches per step (default 1, or from --global-batch)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel size."),
    cp: int = ContextParallelOpt,
    cp_comm_type: str | None = typer.Option(None, CP_COMM_TYPE, metavar="TYPE",
                                            help="megatron-gpt: " + CP_COMM_TYPE_HELP),
    ep: int = ExpertParallelOpt,
    num_experts: int = ExpertsOpt,
    moe_topk: int | None = TopkOpt,
    moe_ffn_hidden: int = MoeFfnOpt,
    moe_dispatcher: str | None = DispatcherOpt,
    moe_shared_ffn: int = SharedExpertOpt,
    moe_grouped_gemm: bool = GroupedGemmOpt,
    moe_layer_freq: str | None = LayerFreqOpt,
    zero: int = typer.Option(0, "--zero", help="ZeRO stage (0 or 1; megatron-gpt: 1 is Megatron's "
                                              "--use-distributed-optimizer)."),
    world_size: int | None = typer.Option(None, "--world-size",
                                          help="Expected world size (must equal dp*tp*pp, times "
                                               "--context-parallel-size)."),
    device: str = typer.Option("cpu", "--device", metavar="DEVICE",
                               help="cpu, cuda[:N], or meta (no memory, no time: shapes only; a compute "
                                    "model times it, see docs/tracer.md)."),
    verify: str = typer.Option("sample", "--verify", metavar="MODE",
                               help="sample: trace the ends of each candidate class; all: every rank; stage: "
                                    "the first rank of each pipeline stage (symmetric workloads)."),
    gpu: str | None = gpu_opt("GPU the Job is for (recorded in its manifest; default: the traced device's)"),
    gpus_per_node: int | None = gpus_per_node_opt(),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    warmup: int = typer.Option(1, "--warmup", help="Warm-up steps before the measured one."),
    steps: int = typer.Option(1, "--steps", help="Measured steps per traced rank; each "
                              "operator keeps its shortest time (less noise on a busy machine)."),
    memory_limit: str | None = typer.Option(None, "--memory-limit",
                                            help="Report out-of-memory above this size per rank (e.g. 40GB, "
                                            "80GiB, or a number of bytes)."),
    name: str = typer.Option("", "--name", help="Job name (default: from the workload)."),
    jobs: int = typer.Option(0, "--jobs", metavar="N",
                             help="Meta device: processes that trace the distinct ranks (0: one per CPU; the "
                                  "Job is the same for any N)."),
    as_json: bool = JsonOpt,
) -> None:
    """Trace a training step ex-situ: each distinct rank runs for real on one device while a
    recording process group plays the rest of the world; writes a Job for every rank."""
    from echo_et.cli.unit_opts import size_option
    from echo_et.errors import EchoError
    from echo_et.ir import save_job
    from echo_et.ir.io import check_job_output
    from echo_et.ir.limits import check_node_fill
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.parallel import usable_cpus
    from echo_et.trace.tracer import TraceOptions
    from echo_et.trace.tracer import trace as run_trace
    from echo_et.workloads import GPTConfig, Workload
    from echo_et.workloads.gpt_config import megatron_core_bucket_mb, microbatches_for

    if jobs < 0:
        raise EchoError(f"--jobs {jobs}: give a number of processes, or 0 for one per CPU")
    cluster = cluster_from_options(gpu, gpus_per_node, intra_bw, inter_bw)
    memory_limit_bytes = size_option(memory_limit, "memory_limit", lo=1)
    if global_batch is not None:
        m = microbatches_for(global_batch, micro_batch, dp)
        if microbatches is not None and microbatches != m:
            raise EchoError(f"--microbatches {microbatches} disagrees with --global-batch {global_batch} "
                            f"(= {m} micro-batches of {micro_batch} on {dp} data-parallel ranks)")
        microbatches = m
    microbatches = microbatches or 1
    layout = ParallelLayout(dp=dp, tp=tp, pp=pp, microbatches=microbatches, zero=zero, cp=cp, ep=ep)
    if world_size is not None:
        layout.check_world_size(world_size)
    check_node_fill(layout.world_size, gpus_per_node)
    _check_step_runs(layout, verify, warmup, steps, device)
    check_job_output(output)  # before minutes of tracing, not after
    if script is not None:
        for flag, given in (("--num-layers-per-virtual-pipeline-stage", bool(virtual_layers)),
                            (VIRTUAL_STAGES_PER_RANK, bool(virtual_chunks)), (OVERLAP_P2P, overlap_p2p),
                            (OVERLAP_P2P_FLUSH, overlap_p2p_flush),
                            (MICROBATCH_GROUP, bool(microbatch_group)),
                            ("--sync-timers", sync_timers), ("--pipeline-engine", pipeline_engine is not None),
                            ("--partition-activations", partition_activations),
                            ("--sequence-parallel", sequence_parallel),
                            (FIRST_STAGE_LAYERS, bool(first_stage_layers)),
                            (ACCOUNT_EMBEDDING, account_embedding), (ACCOUNT_LOSS, account_loss),
                            (LAST_STAGE_LAYERS, bool(last_stage_layers)),
                            (NO_REDUCE_SCATTER, no_reduce_scatter),
                            (ARCH, arch is not None), (FFN_HIDDEN, bool(ffn_hidden)), (KV_HEADS, bool(kv_heads)),
                            (FLASH_ATTN, flash_attention), (GRAD_ACC_FUSION, gradient_accumulation_fusion),
                            (MODEL, model is not None), (OVERLAP_GRAD_REDUCE, overlap_grad_reduce),
                            (OVERLAP_PARAM_GATHER, overlap_param_gather),
                            (NO_ALIGN_GRAD_REDUCE, no_align_grad_reduce),
                            (NO_ALIGN_PARAM_GATHER, no_align_param_gather),
                            (GATHER_WITH_STEP, gather_with_step), (CP_COMM_TYPE, cp_comm_type is not None),
                            (EXPERTS, bool(num_experts)), (TOPK, moe_topk is not None), (MOE_FFN, bool(moe_ffn_hidden)),
                            (DISPATCHER, moe_dispatcher is not None), (SHARED_EXPERT, bool(moe_shared_ffn)),
                            (GROUPED_GEMM, moe_grouped_gemm), (LAYER_FREQ, moe_layer_freq is not None),
                            ("--recompute", recompute), ("--recompute-granularity", recompute_granularity is not None),
                            (RECOMPUTE_METHOD, recompute_method is not None),
                            (RECOMPUTE_NUM_LAYERS, recompute_num_layers is not None),
                            (RECOMPUTE_MODULES_FLAG, recompute_modules is not None)):
            if given:
                raise EchoError(f"{flag} applies to the built-in workloads (gpt, megatron-gpt), not to --script")
        wl = Workload(script=script)
        attrs = {"script": Path(script.rpartition(":")[0]).name + ":" + script.rpartition(":")[2]}
    else:
        if workload not in ("gpt", "megatron-gpt"):
            raise EchoError(f"--workload {workload!r}: the built-in workloads are gpt and megatron-gpt "
                            "(or give --script file.py:build_fn)")
        shape = model_fields(model, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, arch=arch,
                             ffn_hidden=ffn_hidden, kv_heads=kv_heads, num_experts=num_experts, moe_topk=moe_topk,
                             moe_ffn_hidden=moe_ffn_hidden, moe_shared_ffn=moe_shared_ffn)
        layers, hidden, heads = shape.get("layers", 2), shape.get("hidden", 64), shape.get("heads", 4)
        seq, vocab, arch = shape.get("seq", 32), shape.get("vocab"), shape.get("arch")
        ffn_hidden, kv_heads = shape.get("ffn_hidden", 0), shape.get("kv_heads", 0)
        num_experts, moe_topk = shape.get("num_experts", 0), shape.get("moe_topk")
        moe_ffn_hidden, moe_shared_ffn = shape.get("moe_ffn_hidden", 0), shape.get("moe_shared_ffn", 0)
        kw = {k: v for k, v in (("vocab", vocab), ("dtype", dtype), ("grad_sync", grad_sync),
                                ("scatter_gather_tensors_in_pipeline", scatter_gather),
                                ("accumulate_allreduce_grads_in_fp32", fp32_grads),
                                ("layers_per_virtual_stage", virtual_layers or None),
                                ("virtual_stages_per_rank", virtual_chunks or None),
                                # Megatron turns it off without an interleaved schedule
                                ("overlap_p2p_comm", ((overlap_p2p or overlap_p2p_flush)
                                                      and bool(virtual_layers or virtual_chunks)) or None),
                                # which Megatron refuses without one (GPTConfig.validate says so)
                                ("overlap_p2p_comm_warmup_flush", overlap_p2p_flush or None),
                                # and ignores the micro-batch groups without one
                                ("microbatch_group_size",
                                 microbatch_group if (virtual_layers or virtual_chunks) and microbatch_group else None),
                                ("sync_timers", sync_timers or None),
                                ("pipeline_engine", pipeline_engine),
                                ("partition_activations", partition_activations or None),
                                ("sequence_parallel", sequence_parallel or None),
                                ("first_stage_layers", first_stage_layers or None),
                                ("account_for_embedding_in_pipeline_split", account_embedding or None),
                                ("account_for_loss_in_pipeline_split", account_loss or None),
                                ("last_stage_layers", last_stage_layers or None),
                                ("grad_reduce_scatter", False if no_reduce_scatter else None),
                                ("arch", arch), ("ffn_hidden", ffn_hidden or None), ("kv_heads", kv_heads or None),
                                ("flash_attention", flash_attention or None),
                                ("gradient_accumulation_fusion", gradient_accumulation_fusion or None),
                                ("overlap_param_gather", overlap_param_gather or None),
                                ("align_grad_reduce", False if no_align_grad_reduce else None),
                                # Megatron never aligns the gathers without an interleaved schedule
                                ("align_param_gather", False if no_align_param_gather
                                 and (virtual_layers or virtual_chunks or not overlap_param_gather) else None),
                                ("overlap_param_gather_with_optimizer_step", gather_with_step or None),
                                ("cp_comm_type", cp_comm_type),
                                ("num_experts", num_experts or None),
                                ("moe_topk", (moe_topk or 2) if num_experts else None),
                                ("moe_ffn_hidden", moe_ffn_hidden or None),
                                ("moe_token_dispatcher", moe_dispatcher if num_experts else None),
                                ("moe_shared_ffn", moe_shared_ffn or None),
                                ("moe_grouped_gemm", moe_grouped_gemm or None),
                                ("moe_layer_freq", None if moe_layer_freq is None else moe_layer_freq.strip()))
              if v is not None}
        if overlap_grad_reduce:
            if workload != "megatron-gpt" or grad_sync is not None or bucket_mb != BUCKET_MB:
                raise EchoError(f"{OVERLAP_GRAD_REDUCE} is Megatron-Core's overlapped sync in its own buckets: "
                                "megatron-gpt, without --grad-sync or --bucket-mb")
            kw["grad_sync"], kw["overlap_grad_reduce"] = "overlap", True
            kw["bucket_mb"] = megatron_core_bucket_mb(dp * cp, dtype or GPTConfig.megatron().dtype)
        if pipeline_engine == "deepspeed" and grad_sync is None:
            kw["grad_sync"] = "after-backward"    # the engine reduces after its schedule
        if pipeline_engine == "deepspeed" and scatter_gather is not None:
            raise EchoError("--pipeline-engine deepspeed partitions every pipeline tensor over the TP ranks; "
                            "--[no-]scatter-gather-tensors-in-pipeline is Megatron-LM's")
        make = GPTConfig.megatron if workload == "megatron-gpt" else GPTConfig
        recompute, granularity = recompute_setting(recompute, recompute_granularity)
        kw.update(recompute_detail_settings(recompute, granularity, recompute_method, recompute_num_layers,
                                           recompute_modules))
        cfg = make(layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=micro_batch,
                   bucket_mb=kw.pop("bucket_mb", bucket_mb), recompute=recompute,
                   recompute_granularity=granularity, **kw)
        wl = Workload(gpt=cfg)
        attrs = {"workload": workload, **cfg.to_json()}
    wl.validate(layout, device)
    if script is None and workload == "megatron-gpt" and cluster.gpu:
        from echo_et.experiments.memory_check import check_memory

        check_memory(cfg, layout, cluster.gpu)    # the GPU the Job is for must hold the layout
    build_fn = wl.build_fn()

    def progress(msg: str) -> None:
        typer.echo(msg, err=True)

    parts = ["--script", attrs["script"]] if script is not None else [
        "--workload", workload, "--layers", layers, "--hidden", hidden, "--heads", heads,
        "--seq", seq, "--micro-batch", micro_batch, "--vocab", cfg.vocab, "--dtype", cfg.dtype,
        *([OVERLAP_GRAD_REDUCE] if cfg.overlap_grad_reduce else ["--bucket-mb", bucket_mb, "--grad-sync",
                                                                  cfg.grad_sync])] + (
            ["--recompute", "--recompute-granularity", cfg.recompute_granularity] if cfg.recompute else []) + (
            [RECOMPUTE_METHOD, cfg.recompute_method, RECOMPUTE_NUM_LAYERS, cfg.recompute_num_layers]
            if (cfg.recompute_method, cfg.recompute_num_layers) != ("uniform", 1) else []) + (
            [RECOMPUTE_MODULES_FLAG, cfg.recompute_modules] if cfg.recompute_modules != "core_attn" else [])
    if script is None and cfg.scatter_gather_tensors_in_pipeline != (workload == "megatron-gpt"):
        parts.append("--scatter-gather-tensors-in-pipeline" if cfg.scatter_gather_tensors_in_pipeline
                     else "--no-scatter-gather-tensors-in-pipeline")
    if script is None and cfg.accumulate_allreduce_grads_in_fp32 != (workload == "megatron-gpt"
                                                                     and cfg.dtype == "bfloat16"):
        parts.append("--accumulate-allreduce-grads-in-fp32" if cfg.accumulate_allreduce_grads_in_fp32
                     else "--no-accumulate-allreduce-grads-in-fp32")
    if script is None and cfg.layers_per_virtual_stage:
        parts += ["--num-layers-per-virtual-pipeline-stage", cfg.layers_per_virtual_stage]
    if script is None and cfg.virtual_stages_per_rank:
        parts += [VIRTUAL_STAGES_PER_RANK, cfg.virtual_stages_per_rank]
    if script is None and cfg.overlap_p2p_comm_warmup_flush:
        parts.append(OVERLAP_P2P_FLUSH)
    elif script is None and cfg.overlap_p2p_comm:
        parts.append(OVERLAP_P2P)
    if script is None and cfg.microbatch_group_size:
        parts += [MICROBATCH_GROUP, cfg.microbatch_group_size]
    if script is None and cfg.sync_timers:
        parts.append("--sync-timers")
    if script is None and cfg.pipeline_engine != "megatron":
        parts += ["--pipeline-engine", cfg.pipeline_engine]
    if script is None and cfg.partition_activations:
        parts.append("--partition-activations")
    if script is None and cfg.sequence_parallel:
        parts.append("--sequence-parallel")
    if script is None and cfg.first_stage_layers:
        parts += [FIRST_STAGE_LAYERS, cfg.first_stage_layers]
    if script is None and cfg.account_for_embedding_in_pipeline_split:
        parts.append(ACCOUNT_EMBEDDING)
    if script is None and cfg.account_for_loss_in_pipeline_split:
        parts.append(ACCOUNT_LOSS)
    if script is None and cfg.last_stage_layers:
        parts += [LAST_STAGE_LAYERS, cfg.last_stage_layers]
    if script is None and not cfg.grad_reduce_scatter:
        parts.append(NO_REDUCE_SCATTER)
    if script is None and cfg.arch != "gpt":
        parts += [ARCH, cfg.arch]
    if script is None and cfg.ffn_hidden:
        parts += [FFN_HIDDEN, cfg.ffn_hidden]
    if script is None and cfg.kv_heads:
        parts += [KV_HEADS, cfg.kv_heads]
    if script is None and cfg.flash_attention:
        parts.append(FLASH_ATTN)
    if script is None and cfg.gradient_accumulation_fusion:
        parts.append(GRAD_ACC_FUSION)
    if script is None and cfg.overlap_param_gather:
        parts.append(OVERLAP_PARAM_GATHER)
    if script is None and not cfg.align_grad_reduce:
        parts.append(NO_ALIGN_GRAD_REDUCE)
    if script is None and not cfg.align_param_gather:
        parts.append(NO_ALIGN_PARAM_GATHER)
    if script is None and cfg.overlap_param_gather_with_optimizer_step:
        parts.append(GATHER_WITH_STEP)
    if script is None and cfg.cp_comm_type != "p2p":
        parts += [CP_COMM_TYPE, cfg.cp_comm_type]
    if script is None and cfg.num_experts:
        parts += [EXPERTS, cfg.num_experts, TOPK, cfg.moe_topk]
    if script is None and cfg.moe_ffn_hidden:
        parts += [MOE_FFN, cfg.moe_ffn_hidden]
    if script is None and cfg.num_experts and cfg.moe_token_dispatcher != "allgather":
        parts += [DISPATCHER, cfg.moe_token_dispatcher]
    if script is None and cfg.moe_shared_ffn:
        parts += [SHARED_EXPERT, cfg.moe_shared_ffn]
    if script is None and cfg.moe_grouped_gemm:
        parts.append(GROUPED_GEMM)
    if script is None and cfg.moe_layer_freq != "1":
        parts += [LAYER_FREQ, cfg.moe_layer_freq]
    parts += ["--microbatches", microbatches, "--tp", tp, "--pp", pp, "--dp", dp]
    if cp > 1:
        parts += [CONTEXT_PARALLEL, cp]
    if ep > 1:
        parts += [EXPERT_PARALLEL, ep]
    parts += ["--zero", zero,
              "--device", device, "--verify", verify, "--warmup", warmup, "--steps", steps]
    if memory_limit is not None:
        parts += ["--memory-limit", memory_limit]
    for flag, v in (("--gpu", cluster.gpu), ("--gpus-per-node", gpus_per_node), ("--intra-bw", intra_bw),
                    ("--inter-bw", inter_bw)):
        if v is not None:
            parts += [flag, v]
    command = shlex.join(["echo-et", "trace", *map(str, parts), "-o", output.name])
    # A user's script is checked as it is traced; the built-in workloads' Jobs are proven by
    # the test suite (tests/test_trace_*.py check them), and every reader checks again.
    opts = TraceOptions(device=device, verify=verify, memory_limit_bytes=memory_limit_bytes,
                        warmup_steps=warmup, measured_steps=steps,
                        name=name or _default_name(wl, layout), command=command,
                        progress=progress, check=script is not None,
                        jobs=jobs or usable_cpus())
    result = run_trace(build_fn, layout, opts, workload_attrs=attrs)
    if wl.gpt is not None:
        result.job.manifest.layout.vpp = wl.gpt.virtual_pipeline_size(layout.pp)
    cluster.write_hardware(result.job.manifest)
    save_job(result.job, output)
    summary = {"output": str(output), "layout": layout.describe(), **result.summary()}
    if as_json:
        emit_json(summary)
    else:
        typer.echo(f"wrote {output}: {summary['world_size']} ranks, {summary['graphs']} distinct "
                   f"graphs from {summary['traced_ranks']} traced ranks in {summary['wall_s']:.1f} s")


def _check_step_runs(layout, verify: str, warmup: int, steps: int, device: str) -> None:
    """Refuse, before anything runs, a trace that must run the model more often than
    MAX_TRACED_STEP_RUNS: the ranks --verify traces at least (every rank with all; the first
    of each stage with stage; both ends of each stage with sample, more only when they
    disagree) x the steps each runs. A user's script is not estimated otherwise (its size is
    unknown before it runs; the recording is bounded as it runs, see docs/formats.md)."""
    from echo_et.errors import EchoError
    from echo_et.ir.limits import MAX_TRACE_STEPS, MAX_TRACED_STEP_RUNS

    if warmup > MAX_TRACE_STEPS or steps > MAX_TRACE_STEPS:
        return  # the tracer's own bound names the option
    per_stage = layout.world_size // layout.pp
    ranks = {"all": layout.world_size, "stage": layout.pp}.get(verify, layout.pp * min(2, per_stage))
    runs = ranks * (warmup + (1 if device == "meta" else steps))
    if runs > MAX_TRACED_STEP_RUNS:
        raise EchoError(f"--verify {verify}: tracing runs the model at least {runs:,} times ({ranks:,} ranks x "
                        f"{runs // ranks} steps); the limit is {MAX_TRACED_STEP_RUNS:,} (use --verify sample, or "
                        "fewer --warmup/--steps)")


def _default_name(wl, layout) -> str:
    base = wl.gpt.flavor if wl.gpt is not None else Path(str(wl.script).rpartition(":")[0]).stem
    z = f"-zero{layout.zero}" if layout.zero else ""
    return f"{base}-dp{layout.dp}-tp{layout.tp}-pp{layout.pp}-mb{layout.microbatches}{z}"

