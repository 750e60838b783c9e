"""predict: a model configuration to a predicted GPU step in one command (trace on the meta
device, time for the GPU, simulate, write the timeline and the chart)."""

from __future__ import annotations

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
    MAX_OUTPUT_HELP,
    AccountEmbeddingOpt,
    AccountLossOpt,
    ArchOpt,
    ContextParallelOpt,
    CpCommTypeOpt,
    DispatcherOpt,
    DistOptOpt,
    ExpertParallelOpt,
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
    check_output_budget,
    emit_json,
    fail,
    guarded,
    max_output_bytes,
    megatron_settings,
    model_fields,
    recompute_detail_settings,
    recompute_setting,
)
from echo_et.errors import OptionError


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_cmd)
    app.command("models")(models_cmd)


@guarded
def models_cmd(as_json: bool = JsonOpt) -> None:
    """The published models --model names (predict, trace, sweep): each one's shape, parameter
    count and source."""
    from echo_et.workloads.gpt_config import GPTConfig
    from echo_et.workloads.model_shapes import MODEL_SHAPES

    rows = []
    for name, shape in MODEL_SHAPES.items():
        cfg = GPTConfig.megatron(**shape.options())
        rows.append({"name": name, "arch": shape.arch, "layers": shape.layers, "hidden": shape.hidden,
                     "heads": shape.heads, "kv_heads": cfg.query_groups, "ffn_hidden": cfg.ffn_size,
                     "seq": shape.seq, "vocab": shape.vocab, "experts": cfg.num_experts,
                     "topk": cfg.moe_topk if cfg.num_experts else 0, "parameters": cfg.parameters(),
                     "source": shape.source})
    if as_json:
        emit_json({"models": rows})
        return
    columns = ("name", "arch", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq", "vocab")
    typer.echo(f"{'name':<14}" + "".join(f"{c:>11}" for c in columns[1:]) + f"{'experts':>11}{'params (B)':>12}")
    for r in rows:
        experts = f"{r['experts']} top-{r['topk']}" if r["experts"] else "-"
        typer.echo(f"{r['name']:<14}" + "".join(f"{r[c]:>11}" for c in columns[1:]) + f"{experts:>11}"
                   + f"{r['parameters'] / 1e9:>12.1f}")
    typer.echo("sources:")
    for source in dict.fromkeys(r["source"] for r in rows):
        typer.echo(f"  {source}")


@guarded
def predict_cmd(
    output: Path = typer.Option(..., "-o", "--output", metavar="DIR",
                                help="Folder to write: summary.json, timeline/ (HolisticTraceAnalysis, "
                                     "Perfetto), step.png, job/."),
    model: str | None = ModelOpt,
    layers: int | None = typer.Option(None, "--layers", help="Transformer layers (or --model's)."),
    hidden: int | None = typer.Option(None, "--hidden", help="Hidden size (or --model's)."),
    heads: int | None = typer.Option(None, "--heads", help="Attention heads (or --model's)."),
    seq: int | None = typer.Option(None, "--seq", help="Sequence length (default --model's, else 2048)."),
    micro_batch: int = typer.Option(1, "--micro-batch", help="Sequences per micro-batch."),
    global_batch: int = typer.Option(..., "--global-batch", metavar="N",
                                     help="Sequences per step: micro-batches = N / (micro-batch x dp)."),
    vocab: int | None = typer.Option(None, "--vocab", metavar="N",
                                     help="Vocabulary (default --model's, else GPT-2's 50257; padded to a "
                                          "multiple of 128 x tp)."),
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
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel size."),
    cp: int = ContextParallelOpt,
    cp_comm_type: str | None = CpCommTypeOpt,
    num_experts: int = ExpertsOpt,
    moe_topk: int | None = TopkOpt,
    moe_ffn_hidden: int = MoeFfnOpt,
    moe_dispatcher: str | None = DispatcherOpt,
    moe_shared_ffn: int = SharedExpertOpt,
    moe_grouped_gemm: bool = GroupedGemmOpt,
    moe_layer_freq: str | None = LayerFreqOpt,
    ep: int = ExpertParallelOpt,
    recompute: bool = typer.Option(False, "--recompute",
                                   help="Recompute activations in the backward, at --recompute-granularity "
                                        "(default full: each layer)."),
    recompute_granularity: str | None = RecomputeGranularityOpt,
    recompute_method: str | None = RecomputeMethodOpt,
    recompute_num_layers: int | None = RecomputeNumLayersOpt,
    recompute_modules: str | None = RecomputeModulesOpt,
    dtype: str = typer.Option("float16", "--dtype", metavar="DTYPE", help="float16, bfloat16 or float32."),
    gpu: str | None = gpu_opt("GPU to predict for (default a100)"),
    gpus_per_node: int | None = gpus_per_node_opt(),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    compute_profile: Path | None = typer.Option(None, "--compute-profile", metavar="PROFILE.json",
                                                help="Compute-model profile (default: the GPU's preset)."),
    profile: Path | None = typer.Option(None, "--profile", metavar="PROFILE.json",
                                        help="Collective-model profile (default: the GPU's preset)."),
    no_slowdown: bool = typer.Option(False, "--no-slowdown", help="Do not slow compute that overlaps comm."),
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
    timeline_events: int | None = typer.Option(None, "--timeline-events", metavar="N",
                                               help="Boxes in timeline/ at most, all files together: the step's "
                                                    "longest prefix that holds no more (default 100000; the "
                                                    "whole step when it fits)."),
    timeline_all: bool = typer.Option(False, "--timeline-all",
                                      help="Write the whole step in timeline/ (millions of boxes for a large "
                                           "job: minutes and gigabytes)."),
    max_output: str | None = typer.Option(None, "--max-output", metavar="SIZE",
                                          help="timeline/: " + MAX_OUTPUT_HELP[0].lower() + MAX_OUTPUT_HELP[1:]),
    as_json: bool = JsonOpt,
) -> None:
    """Predict one training step of a Megatron GPT (or Llama) on a GPU cluster from its configuration:
    traced on the meta device, timed by the compute and collective models, simulated; writes
    the step's breakdown, its Kineto timeline and a chart into one folder."""
    from echo_et.errors import EchoError
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import models_for
    from echo_et.experiments.plots import INSTALL_HINT, have_matplotlib
    from echo_et.experiments.predict_step import TIMELINE_EVENTS, check_output, predict_config, write_prediction
    from echo_et.ir.limits import check_node_fill
    from echo_et.workloads.gpt_config import DTYPES, GPTConfig, moe_layer_pattern

    shape = model_fields(model, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, arch=arch,
                         ffn_hidden=ffn_hidden, kv_heads=kv_heads, num_experts=num_experts, moe_topk=moe_topk,
                         moe_ffn_hidden=moe_ffn_hidden, moe_shared_ffn=moe_shared_ffn)
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if k not in shape]
    if missing:
        fail(f"give --model NAME, or {', '.join(missing)} (the model's shape)")
    layers, hidden, heads = shape["layers"], shape["hidden"], shape["heads"]
    seq, vocab, arch = shape.get("seq", 2048), shape.get("vocab"), shape.get("arch")
    ffn_hidden, kv_heads = shape.get("ffn_hidden", 0), shape.get("kv_heads", 0)
    num_experts, moe_topk = shape.get("num_experts", 0), shape.get("moe_topk")
    moe_ffn_hidden, moe_shared_ffn = shape.get("moe_ffn_hidden", 0), shape.get("moe_shared_ffn", 0)
    if timeline_all and timeline_events is not None:
        raise OptionError("timeline_all", "give --timeline-events N or --timeline-all, not both")
    if dtype not in DTYPES:
        raise OptionError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
    for p in (compute_profile, profile):
        if p is not None and not p.is_file():
            raise EchoError(f"{p}: {'not a regular file' if p.exists() else 'no such file'}")
    check_output(output)
    limit = max_output_bytes(max_output)     # a bad size fails before the trace
    cluster = cluster_from_options(gpu or "a100", gpus_per_node, intra_bw, inter_bw)
    check_node_fill(dp * tp * pp * cp, gpus_per_node)
    recompute, granularity = recompute_setting(recompute, recompute_granularity)
    opts = ConfigSweepOptions(cluster=cluster, recompute=recompute, recompute_granularity=granularity, dtype=dtype,
                              **recompute_detail_settings(recompute, granularity, recompute_method,
                                                         recompute_num_layers, recompute_modules),
                              compute_profile=str(compute_profile) if compute_profile else None,
                              comm_profile=str(profile) if profile else None, slowdown=not no_slowdown,
                              model=model.strip().lower() if model else "",
                              **megatron_settings(no_scatter_gather=no_scatter_gather,
                                                  virtual_layers=virtual_layers, virtual_chunks=virtual_chunks,
                                                  overlap_p2p=overlap_p2p, overlap_p2p_flush=overlap_p2p_flush,
                                                  microbatch_group=microbatch_group,
                                                  fp32_grads=fp32_grads,
                                                  distributed_optimizer=distributed_optimizer,
                                                  sync_timers=sync_timers, grad_sync=grad_sync,
                                                  pipeline_engine=pipeline_engine,
                                                  partition_activations=partition_activations,
                                                  sequence_parallel=sequence_parallel,
                                                  first_stage_layers=first_stage_layers,
                                                  account_embedding=account_embedding, account_loss=account_loss,
                                                  last_stage_layers=last_stage_layers,
                                                  no_reduce_scatter=no_reduce_scatter, arch=arch,
                                                  ffn_hidden=ffn_hidden, kv_heads=kv_heads,
                                                  flash_attention=flash_attention,
                                                  gradient_accumulation_fusion=gradient_accumulation_fusion,
                                                  overlap_grad_reduce=overlap_grad_reduce,
                                                  overlap_param_gather=overlap_param_gather,
                                                  no_align_grad_reduce=no_align_grad_reduce,
                                                  no_align_param_gather=no_align_param_gather,
                                                  gather_with_step=gather_with_step, cp_comm_type=cp_comm_type,
                                                  num_experts=num_experts, moe_topk=moe_topk,
                                                  moe_ffn_hidden=moe_ffn_hidden, moe_dispatcher=moe_dispatcher,
                                                  moe_shared_ffn=moe_shared_ffn, moe_grouped_gemm=moe_grouped_gemm,
                                                  moe_layer_freq=moe_layer_freq))
    if gather_with_step and not (virtual_layers or virtual_chunks):
        raise OptionError("overlap_param_gather_with_optimizer_step",
                          "it is the interleaved schedule's (Megatron asserts one): give "
                          "--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank")
    if overlap_p2p_flush and not (virtual_layers or virtual_chunks):
        raise OptionError("overlap_p2p_communication_warmup_flush",
                          "it needs --overlap-p2p-communication, which Megatron turns off without the interleaved "
                          "schedule, and then refuses it: give --num-layers-per-virtual-pipeline-stage or "
                          "--num-virtual-stages-per-pipeline-rank")
    models_for(opts)   # a bad profile or GPU fails here, before the trace
    config = {"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "micro_batch": micro_batch,
              "global_batch": global_batch, "tp": tp, "pp": pp, "dp": dp}
    if cp > 1:
        config["cp"] = cp
    if ep > 1:
        config["ep"] = ep
    if vocab is not None:
        config["vocab"] = vocab
    pred = predict_config(config, opts)
    plot = have_matplotlib()
    bound = None if timeline_all else (timeline_events or TIMELINE_EVENTS)
    _check_timeline_budget(pred, output, limit, bound)
    written = write_prediction(pred, output, plot=plot, timeline_events=bound)
    if as_json:
        emit_json({"output": str(output), "written": written, **pred.to_json()})
        return
    from echo_et.cli.sim_cmds import echo_compute_bounds, echo_result

    res = pred.result
    stages_of = GPTConfig(layers=layers, first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                          account_for_embedding_in_pipeline_split=account_embedding,
                          account_for_loss_in_pipeline_split=account_loss)
    stages = stages_of.stages_said(pp)
    widths = "".join(f", {what} {n}" for what, n in (("MLP", ffn_hidden), ("key/value heads", kv_heads)) if n)
    typer.echo(f"{model.strip().lower() + ': ' if model else ''}"
               f"{'Llama' if opts.arch == 'llama' else 'GPT'} {layers} layers, hidden {hidden}, {heads} heads{widths}, "
               f"seq {seq}{', flash attention' if flash_attention else ''}, global batch {global_batch} "
               f"(micro-batch {micro_batch}), tp {tp} x pp {pp} x dp {dp}" + cp_said(cp, opts.cp_comm_type)
               + experts_said(opts.num_experts, opts.moe_topk, opts.moe_ffn_hidden, ep, opts.moe_token_dispatcher,
                              opts.moe_shared_ffn, opts.moe_grouped_gemm,
                              (sum(moe_layer_pattern(opts.moe_layer_freq, layers)), layers))
               + "".join(f" (interleaved: {n} {what})" for n, what in ((virtual_layers, "layers per virtual stage"),
                                                                       (virtual_chunks, "model chunks per stage"))
                         if n)
               + (f" (micro-batch groups of {microbatch_group})"
                  if microbatch_group and (virtual_layers or virtual_chunks) else "")
               + (f" (layers per stage: {stages})" if stages_of.uneven_stages and pp > 1 else "")
               + recomputation_said(opts)
               + f" = {len(res.ranks)} {opts.gpu()} GPUs, {opts.gpus_per_node()} per node")
    for line in pred.advice:
        typer.echo(f"advice: {line}")
    echo_result(res)
    echo_compute_bounds(pred.retime.to_json())
    echo_throughput(pred.throughput, opts.gpu())
    t = written["timeline"]
    typer.echo(f"wrote {output}: summary.json, {TIMELINE_NOTE.format(n=t['files'])}, job/"
               + (", step.png" if plot else f" (no step.png: {INSTALL_HINT})"))
    w = t["window"]
    if w["until_ns"] is not None:
        typer.echo(f"timeline/ holds the step's first {(w['until_ns'] - w['from_ns']) / 1e6:.3f} ms: "
                   f"{w['events']} of its {w['of']} boxes (--timeline-events N for more, --timeline-all for all)")


def cp_said(cp: int, comm_type: str) -> str:
    """The header's words for context parallelism: " x cp 4", " x cp 4 (allgather)"; "" without."""
    if cp == 1:
        return ""
    return f" x cp {cp}" + (f" ({comm_type})" if comm_type != "p2p" else "")


def experts_said(experts: int, topk: int, ffn: int, ep: int, dispatcher: str = "allgather", shared: int = 0,
                 grouped: bool = False, moe_layers: tuple[int, int] = (0, 0)) -> str:
    """The header's words for a mixture of experts: ", 64 experts (top-2, MLP 1408, shared 2816,
    alltoall, grouped GEMM) in 29 of 32 layers over ep 8"; "" without. ``moe_layers``: (MoE
    layers, layers), said when not every layer is one."""
    if not experts:
        return ""
    some = f" in {moe_layers[0]} of {moe_layers[1]} layers" if moe_layers[0] != moe_layers[1] else ""
    return (f", {experts} experts (top-{topk}" + (f", MLP {ffn}" if ffn else "")
            + (f", shared {shared}" if shared else "") + f", {dispatcher}" + (", grouped GEMM" if grouped else "") + ")"
            + some + (f" over ep {ep}" if ep > 1 else ""))


def recomputation_said(opts) -> str:
    """The header's words for what the backward recomputes ("" without recomputation): " (full
    recomputation)", " (full recomputation, block method, 4 layers)", " (selective
    recomputation: core_attn, mlp)"."""
    from echo_et.workloads.gpt_config import recompute_module_names

    if not opts.recompute:
        return ""
    if opts.recompute_granularity == "selective":
        modules = recompute_module_names(opts.recompute_modules)
        return " (selective recomputation" + ("" if modules == ("core_attn",) else f": {', '.join(modules)}") + ")"
    n = opts.recompute_num_layers
    if (opts.recompute_method, n) == ("uniform", 1):
        return " (full recomputation)"
    return f" (full recomputation, {opts.recompute_method} method, {n} layer{'s' if n > 1 else ''})"


def echo_throughput(rates: dict, gpu: str) -> None:
    """The step's rates in one line (docs/predict.md: what MFU counts); the hardware FLOPs
    when recomputation adds to the model's."""
    line = (f"throughput: {rates['tokens_per_s']:,.0f} tokens/s; {rates['model_tflops_per_gpu']:.1f} TFLOP/s per GPU "
            f"of model FLOPs (MFU {rates['mfu_pct']:.1f} % of the {gpu}'s {rates['peak_tflops']:g} TFLOP/s "
            f"{rates['math']} peak)")
    if rates["hardware_flops"] > rates["model_flops"]:
        line += (f", {rates['hardware_tflops_per_gpu']:.1f} with the recomputed FLOPs "
                 f"(HFU {rates['hfu_pct']:.1f} %)")
    typer.echo(line)


def _check_timeline_budget(pred, output: Path, limit: int, bound: int | None) -> None:
    """Refuse, before a byte is written, a timeline/ estimated past ``--max-output`` or the
    free space (with the writer's scratch file), as ``simulate --timeline`` does (``limit``:
    ``--max-output`` in bytes)."""
    from echo_et.cli.sim_cmds import sim_timeline_scratch
    from echo_et.experiments.predict_step import TIMELINE

    ranks = pred.timeline_ranks()
    check_output_budget(pred.timed, "chrome", output, limit, ranks=ranks, name="the predicted timeline",
                        max_nodes=bound, scratch=sim_timeline_scratch(pred.timed, output / TIMELINE, ranks, bound))


TIMELINE_NOTE = "timeline/ (one rank-R.json per class of equivalent ranks, {n} files: HolisticTraceAnalysis, Perfetto)"
