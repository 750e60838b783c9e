"""calibrate compute, and retiming a Job's compute for ``simulate --gpu``."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from echo_et.cli.cluster_opts import cluster_from_options, gpus_per_node_opt, inter_bw_opt, intra_bw_opt
from echo_et.cli.common import (
    JsonOpt,
    RecomputeGranularityOpt,
    check_output_path,
    emit_json,
    guarded,
    recompute_setting,
)
from echo_et.errors import EchoError, OptionError


def register(app: typer.Typer) -> None:
    from echo_et.cli.comm_cmds import calibrate_app

    calibrate_app.command("compute")(calibrate_compute_cmd)


# -- retiming for simulate --------------------------------------------------------------------------
def is_untimed(job) -> bool:
    """A Job whose compute nodes carry no measured time (meta-device traces)."""
    from echo_et.ir.schema import pb

    if job.manifest.attrs.get("trace.device") == "meta":
        return True
    for g in job.graphs():
        for n in g.nodes:
            if n.kind == pb.KIND_COMPUTE and n.attrs.get("timing") == "untimed":
                return True
    return False


def runs_on_gpu(job) -> bool:
    """Whether any rank ran work on a GPU stream (a CPU trace has none: nothing to retime)."""
    from echo_et.ir.schema import pb

    return any(s.kind == pb.STREAM_GPU_COMPUTE for gid in job.graph_ids() for s in job.graph(gid).header.streams)


def compute_model_for(gpu: str | None, profile: Path | None):
    """The compute model ``--gpu`` / ``--compute-profile`` ask for (None when neither)."""
    from echo_et.models.compute import ComputeModel

    if profile is not None:
        model = ComputeModel.load(profile)
        return model.for_gpu(gpu) if gpu else model
    if gpu:
        return ComputeModel.preset(gpu)
    return None


def retime_for_gpu(job, gpu: str | None, profile: Path | None) -> tuple[Any, dict[str, Any] | None]:
    """The Job ``simulate`` runs: retimed for ``gpu`` (a preset name or a GPU as CUDA names it)
    and/or with ``profile``; an untimed (meta-device) Job is retimed for its manifest's GPU
    when neither is given. Otherwise the Job as measured, and None."""
    from echo_et.models.compute import gpu_names
    from echo_et.passes import retime_compute

    model = compute_model_for(gpu, profile)
    if model is None and is_untimed(job):
        name = job.manifest.hardware.gpu_name
        if not name:
            raise EchoError(f"{job.source or 'the job'} has no compute times (traced on the meta device) and names "
                            f"no GPU: give --gpu NAME (presets: {', '.join(gpu_names())})")
        model = compute_model_for(name, None)
    if model is None:
        return job, None
    if not is_untimed(job) and not runs_on_gpu(job):
        where = job.source or "the job"
        asked = f"--gpu {gpu}" if gpu else "--compute-profile"
        raise EchoError(f"{where} ran its compute on the CPU (no GPU stream), so {asked} has no GPU kernels to "
                        "retime: trace the model on the meta device (echo-et trace --device meta --gpu NAME) or on "
                        "a GPU; to price only its communication, give --preset (e.g. a100-ib) instead")
    out, report = retime_compute(job, model)
    prof = model.profile
    # a data sheet with efficiencies fitted on another GPU is said to be that, not a calibration
    return out, {**report.to_json(), "calibrated": prof.calibrated, "efficiencies_from": prof.params_from or prof.name}


# -- calibrate compute ------------------------------------------------------------------------------
@guarded
def calibrate_compute_cmd(
    output: Path = typer.Option(..., "-o", "--output", metavar="PROFILE.json",
                                help="Compute profile to write (JSON)."),
    kernels: Path | None = typer.Option(None, "--kernels", metavar="CSV",
                                        help="Measured kernels: Echo's merged_features.csv (GPT-2 backward on A100)."),
    layers: list[Path] = typer.Option([], "--layers", metavar="PATH",
                                      help="SimAI/AICB Megatron workload(s) with per-layer A100 times (file or "
                                           "folder; repeatable)."),
    gpu: str = typer.Option("a100", "--gpu", metavar="NAME",
                            help="GPU the measurements were made on (its data sheet is kept fixed)."),
    name: str | None = typer.Option(None, "--name", metavar="NAME", help="Profile name (default: the GPU's)."),
    iterations: Path | None = typer.Option(
        None, "--iterations", metavar="CSV",
        help="Measured training iterations (a `sweep --configs` CSV with measured_ms, or vTrain's "
             "ground_truth_single.csv): fits the end-to-end parameters (host issue time per operator and per "
             "collective call, kernel overhead, tensor-core and attention efficiencies, the memory efficiencies "
             "of attention scores, softmax and optimizer) by tracing each row on the meta device and "
             "simulating it."),
    recompute: bool = typer.Option(False, "--recompute", help="The measured runs recomputed activations "
                                   "(--iterations), at --recompute-granularity."),
    recompute_granularity: str | None = RecomputeGranularityOpt,
    dtype: str = typer.Option("float16", "--dtype", help="Training dtype of the measured runs (--iterations)."),
    gpus_per_node: int | None = gpus_per_node_opt(),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    comm_profile: Path | None = typer.Option(
        None, "--comm-profile", metavar="PROFILE.json",
        help="Collective model of the measured cluster (`calibrate nccl-tests` on its all-reduce logs or "
             "tables); default: the GPU's preset (--iterations)."),
    workers: int = typer.Option(1, "--workers", help="Processes simulating the measured configurations."),
    cache: Path | None = typer.Option(None, "--cache", metavar="DIR",
                                      help="Keep each configuration's traced Job here between runs (--iterations)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fit the compute model's efficiencies to measured kernels and layer times, then
    (--iterations) its end-to-end parameters to measured training iterations."""
    from echo_et.models.compute import write_profile
    from echo_et.models.compute.calibration import calibrate_kernels_and_layers

    check_output_path("--output", output, file_only=True)
    cluster_from_options(gpu, None, None, None)   # an unknown --gpu: one line naming the flag, first
    used = [f for f, v in (("--recompute", recompute or None),
                           ("--recompute-granularity", recompute_granularity), ("--gpus-per-node", gpus_per_node),
                           ("--intra-bw", intra_bw), ("--inter-bw", inter_bw), ("--cache", cache),
                           ("--comm-profile", comm_profile))
            if v is not None]
    if iterations is None and used:
        raise EchoError(f"{', '.join(used)} only apply with --iterations")
    if workers < 1:
        raise EchoError(f"--workers must be >= 1, got {workers}")
    for flag, p in (("--iterations", iterations), ("--comm-profile", comm_profile)):
        if p is not None and not p.is_file():
            raise EchoError(f"{flag} {p}: {'not a regular file' if p.exists() else 'no such file'}")
    opts = None
    if iterations is not None:
        from echo_et.experiments.config_rows import ConfigSweepOptions
        from echo_et.workloads.gpt_config import DTYPES

        if dtype not in DTYPES:
            raise OptionError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
        cluster = cluster_from_options(gpu, gpus_per_node, intra_bw, inter_bw)
        recompute, granularity = recompute_setting(recompute, recompute_granularity)
        opts = ConfigSweepOptions(cluster=cluster, recompute=recompute, recompute_granularity=granularity,
                                  dtype=dtype, comm_profile=str(comm_profile) if comm_profile else None)
        if comm_profile is not None:
            from echo_et.experiments.config_sweep import models_for

            models_for(opts)    # a bad profile: one line now, not one per configuration
    if kernels is None and not layers and iterations is None:
        raise EchoError("give at least one input: --kernels CSV, --layers PATH and/or --iterations CSV")
    if kernels is not None or layers:
        cal = calibrate_kernels_and_layers(kernels, layers, gpu=gpu, name=name)
    else:   # iterations only: from the data sheet's default efficiencies
        from echo_et.models.compute.calibration import Calibration
        from echo_et.models.compute.profile import default_profile

        prior = default_profile(gpu)
        cal = Calibration(replace(prior, name=name or prior.gpu.key))
    profile, sources, excluded, per_source, fitted = (cal.profile, cal.sources, cal.excluded, cal.per_source,
                                                      cal.samples)
    if iterations is not None:
        from echo_et.experiments.iteration_fit import calibrate_on_iterations

        it = calibrate_on_iterations(profile, iterations, opts, workers=workers,
                                     cache=str(cache) if cache else None,
                                     progress=lambda m: typer.echo(m, err=True))
        profile, sources = it.profile, list(it.profile.sources)
        excluded = list(profile.fit.get("excluded", []))
        per_source = {**per_source, "iterations": {"n": it.rows, "mape_pct": it.info["path_mape_pct"],
                                                   "median_ape_pct": math.nan}}
    write_profile(profile, output)
    out = {"output": str(output), "name": profile.name, "gpu": profile.gpu.key, "params": profile.params,
           "fit": profile.fit, "sources": sources}
    if as_json:
        emit_json(out)
        return
    typer.echo(f"wrote {output} ({profile.name}, {fitted} samples from {len(sources)} files)")
    for src, s in per_source.items():
        if s.get("n"):
            median = "" if math.isnan(s["median_ape_pct"]) else f"  median {s['median_ape_pct']:6.1f}%"
            typer.echo(f"  {src:16s} n={s['n']:4d}  MAPE {s['mape_pct']:6.1f}%{median} (in sample)")
    from echo_et.models.compute.roofline import SUSTAINED_PARAM

    ceiling = next((st for st in profile.fit.get("stages", []) if st.get("free") == [SUSTAINED_PARAM]), None)
    if ceiling is not None:
        eff = profile.params[SUSTAINED_PARAM]
        typer.echo(f"  sustained tensor-core ceiling: {eff:.3f} of the peak "
                   f"({eff * profile.gpu.peak_flops('fp16') / 1e12:.0f} TFLOP/s fp16 on {profile.gpu.key}), "
                   f"from {ceiling['samples']} layer samples of >= {ceiling['min_gemm_flops']:.0e} FLOPs per GEMM")
    for e in excluded[:5]:
        typer.echo(f"  excluded: {e['sample']}: {e['reason']}")
    if len(excluded) > 5:
        typer.echo(f"  ... {len(excluded) - 5} more excluded (see the profile's fit.excluded)")
