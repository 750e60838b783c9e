"""calibrate compute, and retiming a Job's compute for ``simulate --gpu``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from echo_et.cli.common import JsonOpt, emit_json, guarded
from echo_et.errors import EchoError


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
    out, report = retime_compute(job, model)
    return out, report.to_json()


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
    as_json: bool = JsonOpt,
) -> None:
    """Fit the compute model's efficiencies to measured kernels and layer times."""
    from echo_et.models.compute import data, fit, write_profile
    from echo_et.models.compute.profile import default_profile

    if kernels is None and not layers:
        raise EchoError("give at least one input: --kernels CSV and/or --layers PATH")
    if output.exists() and output.is_dir():
        raise EchoError(f"{output}: is a directory")
    prior = default_profile(gpu)
    samples: list[fit.Sample] = []
    sources: list[dict[str, Any]] = []
    excluded: list[dict[str, str]] = []
    if kernels is not None:
        ks, ex = data.read_kernel_samples(kernels)
        samples += ks
        excluded += [{"sample": e.label, "reason": e.reason} for e in ex]
        sources.append({"file": kernels.name, "kind": "kernels", "sha256": data.sha256(kernels),
                        "samples": len(ks), "excluded": len(ex)})
    files = [f for p in layers for f in data.aicb_files(p)]
    if layers and not files:
        raise EchoError(f"{', '.join(str(p) for p in layers)}: no SimAI/AICB *_A100.txt Megatron workload")
    for f in sorted(set(files), key=lambda p: p.name):
        lt = data.read_aicb_layers(f)
        if lt is None:
            continue
        ls, ex = data.layer_samples(lt, prior.gpu.peak_flops("bf16"))
        samples += ls
        excluded += [{"sample": e.label, "reason": e.reason} for e in ex]
        sources.append({"file": f.name, "kind": "layers", "sha256": data.sha256(f),
                        "samples": sum(1 for s in ls if s.source == "layers"), "excluded": len(ex)})
    fitted = [s for s in samples if s.source in ("kernels", "layers")]
    fitted_profile, stages = fit.calibrate(fitted, prior)
    per_source: dict[str, Any] = {}
    for src in sorted({s.source for s in samples}):
        sel = [s for s in samples if s.source == src]
        per_source[src] = fit.summary(fit.errors(sel, fitted_profile))
    key = prior.gpu.key
    profile = replace(fitted_profile, name=name or key, calibrated=True,
                      description=f"{prior.gpu.name} data sheet; efficiencies fitted by `echo-et calibrate compute` "
                                  f"on {', '.join(s['file'] for s in sources)}",
                      sources=tuple(sources),
                      fit={"stages": stages, "in_sample": per_source, "excluded": excluded})
    write_profile(profile, output)
    out = {"output": str(output), "name": profile.name, "gpu": key, "params": profile.params,
           "fit": profile.fit, "sources": sources}
    if as_json:
        emit_json(out)
        return
    typer.echo(f"wrote {output} ({profile.name}, {len(fitted)} samples from {len(sources)} files)")
    for src, s in per_source.items():
        if s.get("n"):
            typer.echo(f"  {src:16s} n={s['n']:4d}  MAPE {s['mape_pct']:6.1f}%  median {s['median_ape_pct']:6.1f}% "
                       "(in sample)")
    for e in excluded[:5]:
        typer.echo(f"  excluded: {e['sample']}: {e['reason']}")
    if len(excluded) > 5:
        typer.echo(f"  ... {len(excluded) - 5} more excluded (see the profile's fit.excluded)")
