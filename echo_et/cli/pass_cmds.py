"""layout, scale, inject, sweep: rewriting Jobs to other layouts and sizes."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import typer

from echo_et.cli.cluster_opts import cluster_from_options, gpu_opt, inter_bw_opt, intra_bw_opt, nic_bw_opt
from echo_et.cli.common import (
    ACCOUNT_EMBEDDING,
    ACCOUNT_LOSS,
    FIRST_STAGE_LAYERS,
    GPN_HELP,
    LAST_STAGE_LAYERS,
    MICROBATCH_GROUP,
    MODEL,
    RECOMPUTE_GRANULARITY,
    RECOMPUTE_METHOD,
    RECOMPUTE_MODULES_FLAG,
    RECOMPUTE_NUM_LAYERS,
    VIRTUAL_STAGES,
    VIRTUAL_STAGES_PER_RANK,
    AccountEmbeddingOpt,
    AccountLossOpt,
    ArchOpt,
    CpCommTypeOpt,
    DispatcherOpt,
    DistOptOpt,
    ExpertsOpt,
    FfnHiddenOpt,
    FirstStageLayersOpt,
    FlashAttnOpt,
    Fp32GradsOpt,
    GatherWithStepOpt,
    GradAccFusionOpt,
    GradSyncOpt,
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
    NoScatterGatherOpt,
    OverlapGradReduceOpt,
    OverlapP2pFlushOpt,
    OverlapP2pOpt,
    OverlapParamGatherOpt,
    PartitionActivationsOpt,
    PipelineEngineOpt,
    RecomputeGranularityOpt,
    RecomputeMethodOpt,
    RecomputeModulesOpt,
    RecomputeNumLayersOpt,
    SequenceParallelOpt,
    SharedExpertOpt,
    SyncTimersOpt,
    TopkOpt,
    VirtualStagesOpt,
    VirtualStagesPerRankOpt,
    emit_json,
    fail,
    guarded,
    load_job_arg,
    megatron_flag_given,
    megatron_settings,
    model_fields,
    recompute_detail_settings,
    recompute_setting,
)
from echo_et.cli.sweep_opts import MaxMemoryOpt, ResumeOpt, finish, memory_budget, open_log

LayoutOpt = typer.Option(None, "--layout",
                         help="Declare the input layout, e.g. dp=2,tp=2,pp=2[,order=tp-dp-pp].")


def register(app: typer.Typer) -> None:
    app.command("layout")(layout)
    app.command("scale")(scale)
    app.command("inject")(inject)
    app.command("sweep")(sweep)
    app.command("select")(select)


def _refuse_overwrite(output: Path, inputs: list[Path]) -> None:
    out = output.resolve()
    for p in inputs:
        if p.resolve() == out:
            fail(f"{output}: output would overwrite an input")


def _check_job_output(output: Path, inputs: list[Path]) -> None:
    """Before any work: the output is not an input, and a Job can be written there."""
    from echo_et.ir.io import check_job_output

    _refuse_overwrite(output, inputs)
    check_job_output(output)


def _save_checked(job, output: Path) -> None:
    from echo_et.ir import check_job, save_job

    issues = check_job(job)
    if issues:
        fail(f"the rewritten job fails check: {issues[0]}")
    save_job(job, output)


@guarded
def layout(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    declared: str | None = LayoutOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Show the parallel layout of a Job (dp, tp, pp, ep, rank order) and how it was decided."""
    from echo_et.passes import infer_layout

    d = infer_layout(load_job_arg(job_path), declared)
    if as_json:
        emit_json(d.to_json())
        return
    typer.echo(f"dp={d.dp} tp={d.tp} pp={d.pp} ep={d.ep} zero={d.zero} "
               f"order={'-'.join(d.mesh.order)} ({d.source})")
    for r in d.reasons:
        typer.echo(f"  {r}")


@guarded
def scale(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", help="Job directory to write."),
    dp: int | None = typer.Option(None, "--dp", help="New data-parallel degree."),
    pp: int | None = typer.Option(None, "--pp", help="New pipeline depth (needs layer/stage annotations)."),
    tp: int | None = typer.Option(None, "--tp", help="Refused unless unchanged: re-trace instead."),
    microbatches: int | None = typer.Option(None, "--microbatches", help="Micro-batches per step (1F1B)."),
    zero: int | None = typer.Option(None, "--zero", help="ZeRO stage of the job (0 or 1); detected when omitted."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help=GPN_HELP),
    declared: str | None = LayoutOpt,
    a2a: str = typer.Option("keep-rank", "--a2a",
                            help="All-to-all on growing groups: keep-rank (per-rank bytes) or keep-peer."),
    as_json: bool = JsonOpt,
) -> None:
    """Scale a Job to another data-parallel degree (and pipeline depth): new groups, shared graphs."""
    from echo_et.passes import scale as scale_pass

    _check_job_output(output, [job_path])
    if dp is None and pp is None and microbatches is None:
        fail("scale: give at least one of --dp, --pp, --microbatches")
    t0 = time.perf_counter()
    job = load_job_arg(job_path)
    out, report = scale_pass(job, dp=dp, pp=pp, tp=tp, microbatches=microbatches, zero=zero,
                             gpus_per_node=gpus_per_node, layout=declared, a2a=a2a)
    _save_checked(out, output)
    manifest_bytes = (output / "manifest.pb").stat().st_size
    if as_json:
        emit_json({"output": str(output), "manifest_bytes": manifest_bytes,
                   "wall_s": round(time.perf_counter() - t0, 3), **report.to_json()})
    else:
        lay = report.output_layout
        typer.echo(f"wrote {output}: {report.world_size} ranks (dp={lay['dp']} tp={lay['tp']} "
                   f"pp={lay['pp']}), {report.graphs} graphs, {report.groups} groups, "
                   f"manifest {manifest_bytes} bytes")


@guarded
def inject(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace of one model copy: a single "
                                    "rank, or the TP/PP ranks of a job traced with one data-parallel replica."),
    output: Path = typer.Option(..., "-o", "--output", help="Job directory to write."),
    dp: int = typer.Option(..., "--dp", help="Data-parallel degree of the new Job."),
    bucket_mb: float | None = typer.Option(
        None, "--bucket-mb", help="DDP bucket cap in MiB (default 25, first bucket 1 MiB, as DDP)."),
    first_bucket_mb: float | None = typer.Option(
        None, "--first-bucket-mb", help="Cap of the first bucket in MiB (default: as DDP)."),
    zero: int = typer.Option(0, "--zero", help="0: all-reduce buckets; 1: reduce-scatter + all-gather."),
    param_bytes: str | None = typer.Option(
        None, "--param-bytes", help="Total parameter bytes (e.g. 500MB or 1.5GiB) when the trace has no "
        "gradient shapes."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help=GPN_HELP),
    declared: str | None = LayoutOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Add data parallelism to a trace of one model copy (one GPU, or the TP/PP ranks of one
    replica): DDP gradient buckets on a comm stream, on every rank of every replica."""
    from echo_et.cli.unit_opts import size_option
    from echo_et.passes.inject import inject_dp

    _check_job_output(output, [job_path])
    job = load_job_arg(job_path)
    out, report = inject_dp(job, dp=dp, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb,
                            zero=zero, param_bytes=size_option(param_bytes, "param_bytes", lo=1),
                            gpus_per_node=gpus_per_node, layout=declared)
    _save_checked(out, output)
    if as_json:
        emit_json({"output": str(output), **report.to_json()})
    else:
        typer.echo(f"wrote {output}: {out.world_size} ranks, {report.buckets} buckets over "
                   f"{report.param_bytes} parameter bytes ({report.param_source})")


def _int_list(text: str | None, what: str) -> list[int]:
    if text is None or not text.strip():
        return []
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{what} {text!r}: expected comma-separated integers, e.g. 8,64,512")
    if any(v < 1 for v in vals):
        fail(f"{what} {text!r}: values must be >= 1")
    return vals


@guarded
def sweep(
    job_path: Path | None = typer.Argument(None, metavar="[JOB]",
                                           help="Job directory (or trace) to scale (not with --configs)."),
    output: Path = typer.Option(..., "-o", "--output", metavar="DIR",
                                help="Folder for results.json, table.txt, the plot and rows.jsonl (each row as "
                                     "it finishes)."),
    configs: Path | None = typer.Option(None, "--configs", metavar="CONFIGS.csv",
                                        help="Model configurations to trace on the meta device and predict, one per "
                                             "row: layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp"
                                             "[,vocab][,measured_ms] (docs/predict.md); with --model, "
                                             "layers, hidden, heads, seq and vocab are the model's where a "
                                             "row leaves them out."),
    model: str | None = ModelOpt,
    gpus: int | None = typer.Option(None, "--gpus", metavar="N",
                                    help="With --model and --global-batch (no --configs): sweep every layout of the "
                                         "model on N GPUs that Megatron runs and the GPU holds (tp a power of two "
                                         "up to a node, pp up to the layers with uneven ends where it does not "
                                         "divide them, each --micro-batch size)."),
    global_batch: int | None = typer.Option(None, "--global-batch", metavar="N",
                                            help="--gpus: sequences per step of every layout."),
    micro_batch: str | None = typer.Option(None, "--micro-batch", metavar="N,N,...",
                                           help="--gpus: the micro-batch sizes to try (default 1,2)."),
    virtual_stages: str | None = typer.Option(None, "--virtual-stages", metavar="N,N,...",
                                              help="--gpus: also try Megatron's interleaved schedule with these "
                                                   "model chunks per pipeline stage (its "
                                                   "--virtual-pipeline-model-parallel-size), e.g. 2,4."),
    context_parallel: str | None = typer.Option(None, "--context-parallel", metavar="N,N,...",
                                                help="--gpus: also try Megatron-Core's context parallelism with "
                                                     "these sizes (its --context-parallel-size), e.g. 2,4; needs "
                                                     "--flash-attn (--cp-comm-type for the exchange)."),
    expert_parallel: str | None = typer.Option(None, "--expert-parallel", metavar="N,N,...",
                                               help="--gpus: also try Megatron-Core's expert parallelism with these "
                                                    "sizes (its --expert-model-parallel-size), e.g. 2,4,8: a model "
                                                    "with experts."),
    dp: str | None = typer.Option(None, "--dp", metavar="N,N,...",
                                  help="Data-parallel degrees, e.g. 8,64,512 (JOB sweeps)."),
    pp: str | None = typer.Option(None, "--pp", help="Pipeline depths, e.g. 2,4 (default: the job's)."),
    microbatches: str | None = typer.Option(None, "--microbatches", help="Micro-batch counts, e.g. 4,8."),
    zero: int | None = typer.Option(None, "--zero", help="ZeRO stage of the scaled jobs: 0 or 1 (default: the job's)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help=GPN_HELP),
    declared: str | None = LayoutOpt,
    mode: str = typer.Option("predict", "--mode", help="Simulation mode: predict (CC model) or replay."),
    profile: str | None = typer.Option(None, "--profile", help="CC model calibration profile (predict)."),
    preset: str | None = typer.Option(None, "--preset", help="CC model preset (predict; default: the job's GPU)."),
    no_slowdown: bool = typer.Option(False, "--no-slowdown", help="Do not slow compute that overlaps comm."),
    a2a: str = typer.Option("keep-rank", "--a2a", help="All-to-all on growing groups: keep-rank or keep-peer."),
    executor: str = typer.Option("local", "--executor", help="local (worker processes), dask or ray."),
    workers: int | None = typer.Option(None, "--workers", help="Worker processes (local / local cluster)."),
    resume: bool = ResumeOpt,
    max_memory: str | None = MaxMemoryOpt,
    address: str | None = typer.Option(None, "--address",
                                       help="Scheduler address (dask tcp://host:8786, ray ray://host:10001)."),
    plot: bool | None = typer.Option(None, "--plot/--no-plot",
                                     help="Draw step_time.png (default: when matplotlib is installed)."),
    gpu: str | None = gpu_opt("Target GPU (--configs: default a100; JOB: the job's compute retimed for it, "
                              "and its collective preset)"),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    nic_bw: str | None = nic_bw_opt(),
    recompute: bool = typer.Option(False, "--recompute",
                                   help="--configs: recompute activations in the backward, at "
                                        "--recompute-granularity (default full: each layer)."),
    recompute_granularity: str | None = RecomputeGranularityOpt,
    recompute_method: str | None = RecomputeMethodOpt,
    recompute_num_layers: int | None = RecomputeNumLayersOpt,
    recompute_modules: str | None = RecomputeModulesOpt,
    compute_profile: Path | None = typer.Option(None, "--compute-profile", metavar="PROFILE.json",
                                                help="Calibrated compute profile (--configs: default the GPU's "
                                                     "preset; JOB: the job's compute retimed with it)."),
    dtype: str = typer.Option("float16", "--dtype", metavar="DTYPE",
                              help="--configs: model dtype: float16, bfloat16 or float32."),
    no_scatter_gather: bool = NoScatterGatherOpt,
    virtual_layers: int = VirtualStagesOpt,
    virtual_chunks: int = VirtualStagesPerRankOpt,
    overlap_p2p: bool = OverlapP2pOpt,
    overlap_p2p_flush: bool = OverlapP2pFlushOpt,
    microbatch_group: int = MicrobatchGroupOpt,
    fp32_grads: bool | None = Fp32GradsOpt,
    distributed_optimizer: bool = DistOptOpt,
    sync_timers: bool = SyncTimersOpt,
    grad_sync: str | None = GradSyncOpt,
    pipeline_engine: str | None = PipelineEngineOpt,
    partition_activations: bool = PartitionActivationsOpt,
    sequence_parallel: bool = SequenceParallelOpt,
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
    cp_comm_type: str | None = CpCommTypeOpt,
    num_experts: int = ExpertsOpt,
    moe_topk: int | None = TopkOpt,
    moe_ffn_hidden: int = MoeFfnOpt,
    moe_dispatcher: str | None = DispatcherOpt,
    moe_shared_ffn: int = SharedExpertOpt,
    moe_grouped_gemm: bool = GroupedGemmOpt,
    moe_layer_freq: str | None = LayerFreqOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Simulate every combination of a grid of layouts (scale + simulate), or, with --configs,
    trace and predict every model configuration of a CSV, or, with --model and --gpus, every
    layout of one model on that many GPUs; table, JSON and PNG."""
    shape = model_fields(model, arch=arch, ffn_hidden=ffn_hidden, kv_heads=kv_heads, num_experts=num_experts,
                         moe_topk=moe_topk, moe_ffn_hidden=moe_ffn_hidden, moe_shared_ffn=moe_shared_ffn)
    megatron = megatron_settings(no_scatter_gather=no_scatter_gather, virtual_layers=virtual_layers,
                                 virtual_chunks=virtual_chunks, overlap_p2p=overlap_p2p,
                                 overlap_p2p_flush=overlap_p2p_flush,
                                 microbatch_group=microbatch_group, fp32_grads=fp32_grads,
                                 distributed_optimizer=distributed_optimizer,
                                 sync_timers=sync_timers, grad_sync=grad_sync, pipeline_engine=pipeline_engine,
                                 partition_activations=partition_activations,
                                 sequence_parallel=sequence_parallel,
                                 first_stage_layers=first_stage_layers,
                                 account_embedding=account_embedding, account_loss=account_loss,
                                 last_stage_layers=last_stage_layers, no_reduce_scatter=no_reduce_scatter,
                                 arch=shape.get("arch"), ffn_hidden=shape.get("ffn_hidden", 0),
                                 kv_heads=shape.get("kv_heads", 0), flash_attention=flash_attention,
                                 gradient_accumulation_fusion=gradient_accumulation_fusion,
                                 overlap_grad_reduce=overlap_grad_reduce,
                                 overlap_param_gather=overlap_param_gather,
                                 no_align_grad_reduce=no_align_grad_reduce,
                                 no_align_param_gather=no_align_param_gather,
                                 gather_with_step=gather_with_step, cp_comm_type=cp_comm_type,
                                 num_experts=shape.get("num_experts", 0), moe_topk=shape.get("moe_topk"),
                                 moe_ffn_hidden=shape.get("moe_ffn_hidden", 0), moe_dispatcher=moe_dispatcher,
                                 moe_shared_ffn=shape.get("moe_shared_ffn", 0), moe_grouped_gemm=moe_grouped_gemm,
                                 moe_layer_freq=moe_layer_freq)
    if configs is not None or gpus is not None:
        from echo_et.cli.config_sweep_cmds import config_sweep

        what = "--configs" if configs is not None else "--gpus"
        used = [f for f, v in (("JOB", job_path), ("--dp", dp), ("--pp", pp), ("--microbatches", microbatches),
                               ("--zero", zero), ("--layout", declared), ("--preset", preset)) if v is not None]
        if used or mode != "predict":
            fail(f"{', '.join(used) or '--mode'} cannot be combined with {what}")
        if configs is not None and (gpus, global_batch, micro_batch, virtual_stages, context_parallel,
                                    expert_parallel) != (None,) * 6:
            fail("--gpus, --global-batch, --micro-batch, --virtual-stages, --context-parallel and --expert-parallel "
                 "sweep a model's layouts; the rows of --configs say their own")
        if gpus is not None and (model is None or global_batch is None):
            fail("--gpus sweeps a model's layouts: give --model NAME and --global-batch N")
        if gpus is not None:
            for flag, given in ((VIRTUAL_STAGES, virtual_layers), (VIRTUAL_STAGES_PER_RANK, virtual_chunks),
                                (FIRST_STAGE_LAYERS, first_stage_layers), (LAST_STAGE_LAYERS, last_stage_layers),
                                (MICROBATCH_GROUP, microbatch_group), (ACCOUNT_EMBEDDING, account_embedding),
                                (ACCOUNT_LOSS, account_loss)):
                if given:
                    fail(f"{flag}: --gpus gives each layout its own stages and schedule (uneven ends where the "
                         "depth does not divide the layers; --virtual-stages N,N to try the interleaved schedule)")
        layouts = None if gpus is None else (gpus, global_batch, _int_list(micro_batch, "--micro-batch"),
                                             _int_list(virtual_stages, "--virtual-stages"),
                                             _int_list(context_parallel, "--context-parallel"),
                                             _int_list(expert_parallel, "--expert-parallel"))
        on, granularity = recompute_setting(recompute, recompute_granularity)
        megatron = {**megatron, **recompute_detail_settings(on, granularity, recompute_method, recompute_num_layers,
                                                           recompute_modules)}
        config_sweep(configs, output, gpu=gpu, gpus_per_node=gpus_per_node, intra_bw=intra_bw,
                     inter_bw=inter_bw, nic_bw=nic_bw, recompute=on, recompute_granularity=granularity,
                     compute_profile=compute_profile,
                     comm_profile=profile, dtype=dtype, slowdown=not no_slowdown, executor=executor,
                     workers=workers, address=address, plot=plot, as_json=as_json, resume=resume,
                     max_memory=memory_budget(max_memory), megatron=megatron, model=model,
                     shape=shape if model else None, layouts=layouts)
        return
    if job_path is None:
        fail("give a JOB to scale, --configs CONFIGS.csv, or --model NAME --gpus N --global-batch N")
    for flag, given in (("--global-batch", global_batch), ("--micro-batch", micro_batch),
                        ("--virtual-stages", virtual_stages), ("--context-parallel", context_parallel),
                        ("--expert-parallel", expert_parallel)):
        if given is not None:
            fail(f"{flag} only applies with --gpus")
    if dp is None:
        fail("--dp: give at least one data-parallel degree")
    if nic_bw is not None:
        fail("--nic-bw only applies with --configs")
    for flag, given in (("--recompute", recompute or None), (RECOMPUTE_GRANULARITY, recompute_granularity),
                        (RECOMPUTE_METHOD, recompute_method), (RECOMPUTE_NUM_LAYERS, recompute_num_layers),
                        (RECOMPUTE_MODULES_FLAG, recompute_modules)):
        if given is not None:
            fail(f"{flag} only applies with --configs")
    if (flag := MODEL if model else megatron_flag_given(megatron)) is not None:
        fail(f"{flag} only applies with --configs")
    if mode != "predict" and (gpu is not None or compute_profile is not None):
        fail(f"{'--gpu' if gpu is not None else '--compute-profile'} only applies with --mode predict "
             "(replay keeps measured times)")
    from echo_et.experiments.plots import INSTALL_HINT, have_matplotlib
    from echo_et.experiments.sweep import (
        SweepSpec,
        check_sweep,
        is_sweep_dir,
        log_header,
        run_sweep,
        write_outputs,
    )

    _refuse_overwrite(output, [job_path])
    budget = memory_budget(max_memory)
    cluster = cluster_from_options(gpu, gpus_per_node, intra_bw, inter_bw)
    spec = SweepSpec(
        dp=_int_list(dp, "--dp"), pp=_int_list(pp, "--pp"),
        microbatches=_int_list(microbatches, "--microbatches"), zero=zero,
        gpus_per_node=gpus_per_node, layout=declared, mode=mode, profile=profile, preset=preset,
        slowdown=not no_slowdown, a2a=a2a, gpu=cluster.gpu,
        compute_profile=str(compute_profile) if compute_profile is not None else None,
    )
    job = load_job_arg(job_path)
    if cluster.gpu or compute_profile is not None:
        from echo_et.cli.compute_cmds import retime_for_gpu

        # the compute retimed once here; the collective preset follows the retimed job's GPU
        job, _ = retime_for_gpu(job, cluster.gpu, compute_profile)
    if mode == "predict" and profile is None and preset is None and not job.manifest.hardware.gpu_name:
        from echo_et.cli.sim_cmds import no_gpu_error

        raise no_gpu_error(job)
    if intra_bw is not None or inter_bw is not None:
        from echo_et.models.cluster import Cluster

        cl = cluster_from_options(None, gpus_per_node, intra_bw, inter_bw).over(Cluster.from_job(job))
        gpn = cl.gpus_per_node or 8
        spec = replace(spec, intra_bw_gbps=cl.intra_gbps(gpn), inter_bw_gbps=cl.inter_gbps(gpn))
    if not spec.dp:
        fail("--dp: give at least one data-parallel degree")
    if plot and not have_matplotlib():
        fail(f"--plot needs matplotlib ({INSTALL_HINT})")
    if plot is None and not have_matplotlib():
        typer.echo(f"note: matplotlib is not installed, step_time.png is skipped ({INSTALL_HINT})", err=True)
    draw = have_matplotlib() if plot is None else plot

    def progress(done: int, total: int, row: dict) -> None:
        label = f"dp={row['dp']} pp={row['pp']} mb={row['microbatches']}"
        state = row.get("error") or f"{row['step_time_ns'] / 1e6:.3f} ms"
        print(f"[{done}/{total}] {label}: {state}", file=sys.stderr, flush=True)

    check_sweep(job, spec, executor=executor, address=address, workers=workers, max_memory=budget)
    with open_log(output, log_header(job_path, spec, job), resume=resume, replaceable=is_sweep_dir,
                  kind="an echo-et sweep folder", noun="points") as log:
        result = run_sweep(job, spec, executor=executor, workers=workers, address=address,
                           progress=progress, max_memory=budget, log=log)
    files = write_outputs(result, output, plot=draw)
    if as_json:
        emit_json({"output": str(output), "files": files, **result.to_json()})
    else:
        typer.echo(result.table())
        typer.echo(f"wrote {', '.join(files)} in {output}")
    finish(sum(1 for r in result.rows if r.get("error")), len(result.rows), output, "points")


@guarded
def select(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", help="Job directory to write."),
    ranks: str = typer.Option(..., "--ranks", help="Ranks to keep, e.g. 0-3,8 (renumbered in this order)."),
    as_json: bool = JsonOpt,
) -> None:
    """Keep a subset of ranks whose process groups lie inside it."""
    from echo_et.passes.select import parse_ranks, select_ranks

    _check_job_output(output, [job_path])
    out = select_ranks(load_job_arg(job_path), parse_ranks(ranks))
    _save_checked(out, output)
    if as_json:
        emit_json({"output": str(output), "world_size": out.world_size,
                   "graphs": len(out.graph_ids()), "groups": len(out.manifest.groups)})
    else:
        typer.echo(f"wrote {output}: {out.world_size} ranks, {len(out.graph_ids())} graphs")
