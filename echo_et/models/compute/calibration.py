"""Calibrating a compute profile from measured kernels and layer times (the first two stages
of ``echo-et calibrate compute``; the third, on measured iterations, needs the simulator and
lives in :mod:`echo_et.experiments.iteration_fit`).

One function so that the CLI and the accuracy benchmark start from the same profile: the
benchmark's prior must be exactly what these stages give, never fitted on the iterations it
tests."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError
from echo_et.models.compute import data, fit
from echo_et.models.compute.profile import ComputeProfile, default_profile


@dataclass
class Calibration:
    """A fitted profile and what went into it."""

    profile: ComputeProfile
    sources: list[dict[str, Any]] = field(default_factory=list)
    excluded: list[dict[str, str]] = field(default_factory=list)
    per_source: dict[str, Any] = field(default_factory=dict)   # in-sample errors per kind of data
    samples: int = 0


def calibrate_kernels_and_layers(kernels: Path | None, layers: list[Path], *, gpu: str = "a100",
                                 name: str | None = None) -> Calibration:
    """Fit the efficiencies of ``gpu``'s data sheet to Echo's measured kernels (``kernels``:
    ``merged_features.csv``) and SimAI/AICB per-layer times (``layers``: files or folders)."""
    if kernels is None and not layers:
        raise EchoError("nothing to fit: no kernels file and no layer files")
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
    profile = replace(fitted_profile, name=name or prior.gpu.key, calibrated=True,
                      description=f"{prior.gpu.name} data sheet; efficiencies fitted by `echo-et calibrate compute` "
                                  f"on {', '.join(s['file'] for s in sources)}",
                      sources=tuple(sources),
                      fit={"stages": stages, "in_sample": per_source, "excluded": excluded})
    return Calibration(profile, sources, excluded, per_source, len(fitted))


__all__ = ["Calibration", "calibrate_kernels_and_layers"]
