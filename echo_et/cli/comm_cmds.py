"""estimate, calibrate nccl-tests|trace|evaluate: the collective-communication model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from echo_et.cli.common import JsonOpt, emit_json, guarded, load_job_arg
from echo_et.errors import EchoError
from echo_et.ir import limits

calibrate_app = typer.Typer(
    help="Fit model parameters from measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(calibrate_app, name="calibrate")
    app.command("estimate")(estimate_cmd)


_GPN_HELP = "GPUs per node (node of rank r = r // G)."


def _model(profile: Path | None, preset: str | None):
    from echo_et.models.comm import CommModel

    if profile is not None and preset is not None:
        raise EchoError("give --profile or --preset, not both")
    if profile is not None:
        return CommModel.from_profile(profile)
    return CommModel.preset(preset or "a100-ib")


def _read_logs(logs: list[Path], collective: str | None):
    from echo_et.models.comm import nccl_tests

    if not logs:
        raise EchoError("no nccl-tests logs given")
    return [run for log in logs for run in nccl_tests.read_log(log, collective)]


# -- estimate ---------------------------------------------------------------------------------------
@guarded
def estimate_cmd(
    collective: str = typer.Argument(..., help="all_reduce, all_gather, reduce_scatter, all_to_all, "
                                     "broadcast, reduce, gather, scatter, barrier, send, recv."),
    sizes: str = typer.Option(..., "--bytes", help="Per-rank input bytes, comma-separated; units "
                              "allowed (4KiB, 64MiB, 1GB)."),
    ranks: int = typer.Option(..., "--ranks", help="Group size: ranks 0..N-1 (send/recv: 0 -> N-1)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help=_GPN_HELP + " Default: the model's."),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile (JSON)."),
    preset: str | None = typer.Option(None, "--preset", help="Uncalibrated preset (default a100-ib)."),
    as_json: bool = JsonOpt,
) -> None:
    """Predict one collective's kernel time per message size, and NCCL's algorithm/protocol."""
    from echo_et.models.comm import COLLECTIVES
    from echo_et.models.comm.topology import contiguous
    from echo_et.models.comm.units import parse_byte_list

    if collective not in COLLECTIVES:
        raise EchoError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
    if ranks < 1:
        raise EchoError(f"--ranks must be >= 1, got {ranks}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    byte_list = [limits.checked_int(b, "--bytes", hi=limits.MAX_BYTES) for b in parse_byte_list(sizes)]
    model = _model(profile, preset)
    gpn = gpus_per_node or model.gpus_per_node
    if collective in ("send", "recv"):
        if ranks < 2:
            raise EchoError(f"{collective} needs --ranks >= 2 (it runs from rank 0 to rank N-1)")
        group = [0, ranks - 1]
    else:
        group = list(range(ranks))
    pl = contiguous(ranks, gpn)
    rows = []
    for b in byte_list:
        e = model.estimate(collective, b, group, gpus_per_node=gpn)
        rows.append({"bytes": b, "time_us": e.time_ns / 1000.0, "time_ns": e.time_ns,
                     "algorithm": e.algorithm, "protocol": e.protocol})
    out = {"collective": collective, "ranks": ranks, "gpus_per_node": gpn, "nodes": pl.nodes,
           "model": model.name, "calibrated": model.calibrated, "estimates": rows}
    if as_json:
        emit_json(out)
        return
    typer.echo(f"{collective} on {ranks} rank(s), {pl.nodes} node(s) of {gpn} GPUs; model "
               f"{model.name} ({'calibrated' if model.calibrated else 'uncalibrated preset'})")
    typer.echo(f"{'bytes':>14} {'time_us':>12}  algorithm/protocol")
    for r in rows:
        typer.echo(f"{r['bytes']:>14} {r['time_us']:>12.2f}  {r['algorithm']}/{r['protocol']}")


# -- calibrate nccl-tests ---------------------------------------------------------------------------
@calibrate_app.command("nccl-tests")
@guarded
def calibrate_nccl_tests_cmd(
    logs: list[Path] = typer.Argument(..., help="nccl-tests output files (plain or MPI-prefixed)."),
    gpus_per_node: int = typer.Option(..., "--gpus-per-node", help=_GPN_HELP),
    output: Path = typer.Option(..., "-o", "--output", help="Profile to write (JSON)."),
    collective: str | None = typer.Option(None, "--collective", help="Collective the logs measure "
                                          "(default: from the file name or the table)."),
    preset: str | None = typer.Option(None, "--preset", help="Preset to start from (default: the "
                                      "one matching the GPU the logs name)."),
    name: str | None = typer.Option(None, "--name", help="Name stored in the profile "
                                    "(default: <preset>-calibrated)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fit a calibration profile from nccl-tests logs."""
    from echo_et.models.comm.calibrate import default_preset, fit_profile, samples_from_runs
    from echo_et.models.comm.profile import load_preset, write_profile

    if gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    _refuse_overwrite(output, logs)
    runs = _read_logs(logs, collective)
    samples, sources = samples_from_runs(runs, gpus_per_node)
    base = load_preset(preset or default_preset(g for r in runs for g in r.gpu_names))
    typer.echo(f"fitting {len(samples)} measurements from {len(runs)} run(s), starting from "
               f"preset {base.name} ...", err=True)
    prof, result = fit_profile(samples, sources, base, gpus_per_node, name or f"{base.name}-calibrated")
    write_profile(prof, output)
    _report_fit(output, base.name, result, as_json)


@calibrate_app.command("trace")
@guarded
def calibrate_trace_cmd(
    jobs: list[Path] = typer.Argument(..., help="Job directories or traces with collective kernels."),
    gpus_per_node: int = typer.Option(..., "--gpus-per-node", help=_GPN_HELP),
    output: Path = typer.Option(..., "-o", "--output", help="Profile to write (JSON)."),
    preset: str | None = typer.Option(None, "--preset", help="Preset to start from (default: the "
                                      "one matching the jobs' GPU)."),
    name: str | None = typer.Option(None, "--name", help="Name stored in the profile "
                                    "(default: <preset>-calibrated)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fit a calibration profile from the collective kernels of traced jobs.

    Per collective, size and group the shortest kernel is used: the member that arrived last
    waited least."""
    from echo_et.models.comm.calibrate import default_preset, fit_profile
    from echo_et.models.comm.profile import load_preset, write_profile
    from echo_et.models.comm.trace import job_records, trace_samples

    if gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    _refuse_overwrite(output, jobs)
    samples = []
    sources: list[dict[str, Any]] = []
    gpus = []
    for path in jobs:
        job = load_job_arg(path)
        gpus.append(job.manifest.hardware.gpu_name)
        got = trace_samples(job_records(job), gpus_per_node, path.name)
        samples += got
        sources.append({"kind": "trace", "file": path.name, "samples": len(got),
                        "ranks": job.world_size})
    if not samples:
        raise EchoError("no collective kernels with sizes, groups of >= 2 ranks and durations in "
                        f"{', '.join(p.name for p in jobs)}")
    base = load_preset(preset or default_preset(gpus))
    prof, result = fit_profile(samples, sources, base, gpus_per_node, name or f"{base.name}-calibrated")
    write_profile(prof, output)
    _report_fit(output, base.name, result, as_json)


def _refuse_overwrite(output: Path, inputs: list[Path]) -> None:
    if output.resolve() in {p.resolve() for p in inputs}:
        raise EchoError(f"{output}: output would overwrite an input")


def _report_fit(output: Path, base: str, result, as_json: bool) -> None:
    if as_json:
        emit_json({"output": str(output), "base_preset": base, "samples": result.samples,
                   "mape_percent": result.mape_percent, "by_source": result.by_source,
                   "free_parameters": result.free})
        return
    typer.echo(f"wrote {output}: {result.samples} measurements, fit error (MAPE) "
               f"{result.mape_percent:.1f}% (preset {base})")
    for src, r in result.by_source.items():
        typer.echo(f"  {src:<32} {r['samples']:>4} sizes  MAPE {r['mape_percent']:5.1f}%")


# -- calibrate evaluate ------------------------------------------------------------------------------
@calibrate_app.command("evaluate")
@guarded
def calibrate_evaluate_cmd(
    logs: list[Path] = typer.Argument(..., help="nccl-tests output files to compare against."),
    profile: Path | None = typer.Option(None, "--profile", help="Calibration profile (JSON)."),
    preset: str | None = typer.Option(None, "--preset", help="Evaluate a preset instead."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help=_GPN_HELP + " Default: the model's."),
    collective: str | None = typer.Option(None, "--collective", help="Collective the logs measure."),
    as_json: bool = JsonOpt,
) -> None:
    """Compare a profile's predictions with measured nccl-tests times, per log.

    Reports the mean absolute percentage error over all sizes and over sizes >= 1 MiB, and
    the median error over 4 KiB - 1 MiB."""
    from echo_et.models.comm.evaluate import evaluate_runs

    if profile is None and preset is None:
        raise EchoError("give --profile (or --preset)")
    model = _model(profile, preset)
    gpn = gpus_per_node or model.gpus_per_node
    if gpn < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpn}")
    reports = evaluate_runs(model.profile.params, _read_logs(logs, collective), gpn)
    if as_json:
        emit_json({"model": model.name, "calibrated": model.calibrated, "gpus_per_node": gpn,
                   "logs": reports})
        return
    typer.echo(f"model {model.name} ({'calibrated' if model.calibrated else 'uncalibrated preset'})")
    typer.echo(f"{'log':<28} {'ranks':>5} {'sizes':>5} {'MAPE all':>9} {'MAPE >=1MiB':>12} "
               f"{'median 4KiB-1MiB':>17}")
    for r in reports:
        typer.echo(f"{r['log']:<28} {r['ranks']:>5} {r['sizes']:>5} {_pct(r['mape_percent']):>9} "
                   f"{_pct(r['mape_ge_1mib_percent']):>12} {_pct(r['median_4kib_1mib_percent']):>17}")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"
