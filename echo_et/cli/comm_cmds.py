"""estimate, calibrate nccl-tests|trace|evaluate: the collective-communication model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from echo_et.cli.common import JsonOpt, emit_json, guarded, load_job_arg
from echo_et.errors import EchoError, OptionError
from echo_et.ir.limits import check_node_fill

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
    """Every run of every log. A truncated table (sizes the header asks for that are not in
    it) is used with a warning naming the missing sizes (:func:`_warn_truncated`), printed once
    the command's first checks have passed, so that a refused command prints its error line
    alone."""
    from echo_et.models.comm.calibrate import read_measurements

    if not logs:
        raise EchoError("no nccl-tests logs given")
    return [run for log in logs for run in read_measurements(log, collective)]


def _check_runs_fill(runs, gpus_per_node: int) -> None:
    """Before any work or output: every run's ranks on nodes of ``gpus_per_node`` as the fit
    and the evaluation will place them (``run_placement``: the node-fill rule of every verb
    with the run's ranks as the world, or the hosts the log names, equal in size)."""
    from echo_et.models.comm.calibrate import run_placement

    for run in runs:
        run_placement(run, gpus_per_node)


def _warn_truncated(runs) -> None:
    for run in runs:
        if run.missing_sizes:
            sizes = ", ".join(str(s) for s in run.missing_sizes)
            typer.echo(f"warning: {run.source}:{run.rows[-1].line}: the table ends at {run.rows[-1].size} B; "
                       f"sizes {sizes} asked for in its header are missing (a truncated log?); "
                       "fitted without them", err=True)


_VERSION_HELP = "NCCL release whose choices to emulate: 2.7.5, 2.17.1, 2.20.3 or 2.28.3 (default: the model's)."
_CHOICE_HELP = ("nccl: time what NCCL's tuner runs; fastest: the algorithm/protocol this model rates "
                "fastest among those NCCL enables (what a tuned NCCL_ALGO/NCCL_PROTO would run); "
                "both: report both and their ratio.")


_FIT_VERSION_HELP = ("NCCL release whose choices the measurements ran: 2.7.5, 2.17.1, 2.20.3, 2.28.3, or auto (fit "
                     "each, keep the one that explains the multi-node measurements best). Default: the preset's.")


def _with_version(model, version: str | None):
    return model if version is None else model.with_nccl_version(version)


_MAX_CHANNELS_HELP = ("Cap on a communicator's channels, as NCCL_MAX_NCHANNELS (or ncclConfig_t.maxCTAs) "
                      "sets it, 1-32 (default: NCCL's, 32). It changes channel counts, not the choice; the "
                      "time model has no per-channel throughput limit, so a cap's bandwidth loss is not priced.")


def _with_max_channels(model, max_channels: int | None):
    if max_channels is None:
        return model
    from echo_et.models.comm.nccl_graphs import MAX_CHANNELS

    if not 1 <= max_channels <= MAX_CHANNELS:
        raise EchoError(f"--max-channels must be from 1 to {MAX_CHANNELS}, got {max_channels}")
    return model.with_max_channels(max_channels)


# -- estimate ---------------------------------------------------------------------------------------
@guarded
def estimate_cmd(
    collective: str = typer.Argument(..., metavar="COLLECTIVE",
                                     help="all_reduce, all_gather, reduce_scatter, all_to_all, "
                                     "broadcast, reduce, gather, scatter, barrier, send, recv."),
    sizes: str = typer.Option(..., "--bytes", metavar="B[,B...]", help="Per-rank input bytes, comma-separated; "
                              "units allowed (4KiB, 64MiB, 1GB)."),
    ranks: int = typer.Option(..., "--ranks", metavar="N", help="Group size: ranks 0..N-1 (send/recv: 0 -> N-1)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", metavar="G",
                                             help=_GPN_HELP + " Default: the model's."),
    world: int | None = typer.Option(None, "--world", metavar="W",
                                     help="World size of the job; the group must fit in it (default: N)."),
    profile: Path | None = typer.Option(None, "--profile", metavar="PROFILE", help="Calibration profile (JSON)."),
    preset: str | None = typer.Option(None, "--preset", metavar="NAME", help="Uncalibrated preset (default a100-ib)."),
    choice: str = typer.Option("nccl", "--choice", metavar="nccl|fastest|both", help=_CHOICE_HELP),
    nccl_version: str | None = typer.Option(None, "--nccl-version", metavar="VERSION", help=_VERSION_HELP),
    max_channels: int | None = typer.Option(None, "--max-channels", metavar="N", help=_MAX_CHANNELS_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """Predict one collective's kernel time per message size, with the algorithm, protocol and
    channels NCCL chooses."""
    from echo_et.cli.unit_opts import size_list_option
    from echo_et.models.comm import COLLECTIVES
    from echo_et.models.comm.topology import contiguous

    if collective not in COLLECTIVES:
        raise EchoError(f"unknown collective {collective!r} (known: {', '.join(COLLECTIVES)})")
    if ranks < 1:
        raise EchoError(f"--ranks must be >= 1, got {ranks}")
    if world is not None and world < 1:
        raise EchoError(f"--world must be >= 1, got {world}")
    if world is not None and ranks > world:
        raise EchoError(f"the group (--ranks {ranks}) is larger than the world (--world {world})")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    if choice not in ("nccl", "fastest", "both"):
        raise EchoError(f"--choice must be nccl, fastest or both, got {choice!r}")
    byte_list = size_list_option(sizes, "bytes", lo=1)
    model = _with_max_channels(_with_version(_model(profile, preset), nccl_version), max_channels)
    gpn = gpus_per_node or model.gpus_per_node
    check_node_fill(world or ranks, gpus_per_node)
    if collective in ("send", "recv"):
        if ranks < 2:
            raise EchoError(f"{collective} needs --ranks >= 2 (it runs from rank 0 to rank N-1)")
        group = [0, ranks - 1]
    else:
        group = list(range(ranks))
    pl = contiguous(ranks, gpn)
    rows = []
    for b in byte_list:
        row: dict[str, Any] = {"bytes": b}
        for mode in (("nccl", "fastest") if choice == "both" else (choice,)):
            e = model.estimate(collective, b, group, gpus_per_node=gpn, choice=mode)
            entry = {"time_us": e.time_ns / 1000.0, "time_ns": e.time_ns, "algorithm": e.algorithm,
                     "protocol": e.protocol, "channels": e.channels}
            if mode == choice or (choice == "both" and mode == "nccl"):
                row.update(entry)
            else:
                row["fastest"] = entry
        if choice == "both":
            row["nccl_over_fastest"] = row["time_ns"] / max(1, row["fastest"]["time_ns"])
        rows.append(row)
    out = {"collective": collective, "ranks": ranks, "gpus_per_node": gpn, "nodes": pl.nodes,
           "model": model.name, "calibrated": model.calibrated, "nccl_version": model.nccl_version,
           "max_channels": model.nccl.max_channels, "choice": choice, "estimates": rows}
    if as_json:
        emit_json(out)
        return
    typer.echo(f"{collective} on {ranks} rank(s), {pl.nodes} node(s) of {gpn} GPUs; model "
               f"{model.name} ({'calibrated' if model.calibrated else 'uncalibrated preset'}), "
               f"choices of NCCL {model.nccl_version}" + ("" if choice == "nccl" else f" ({choice})"))
    head = f"{'bytes':>14} {'time_us':>12}  algorithm/protocol/channels"
    typer.echo(head + ("   fastest: time_us  algorithm/protocol/channels" if choice == "both" else ""))
    for r in rows:
        line = f"{r['bytes']:>14} {r['time_us']:>12.2f}  {r['algorithm']}/{r['protocol']}/{r['channels']}"
        if choice == "both":
            f = r["fastest"]
            line = f"{line:<58} {f['time_us']:>12.2f}  {f['algorithm']}/{f['protocol']}/{f['channels']}"
        typer.echo(line)


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
    nccl_version: str | None = typer.Option(None, "--nccl-version", metavar="auto|VERSION",
                                            help=_FIT_VERSION_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """Fit a calibration profile from nccl-tests logs (or all-reduce lookup tables)."""
    from echo_et.models.comm.calibrate import fit_runs
    from echo_et.models.comm.profile import write_profile

    if gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    _check_version(nccl_version, auto=True)
    _refuse_overwrite(output, logs)
    runs = _read_logs(logs, collective)
    _check_runs_fill(runs, gpus_per_node)

    def progress(message: str) -> None:   # called once the runs and the preset are known good
        _warn_truncated(runs)
        typer.echo(message, err=True)

    prof, result = fit_runs(runs, gpus_per_node, preset=preset, name=name, nccl_version=nccl_version,
                            progress=progress)
    write_profile(prof, output)
    _report_fit(output, prof.base_preset, result, as_json, prof.nccl.version)


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
    nccl_version: str | None = typer.Option(None, "--nccl-version", metavar="auto|launches|VERSION",
                                            help=_FIT_VERSION_HELP + " launches: the release and channel cap "
                                            "whose choices match the traced kernel launches (calibrate choices)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fit a calibration profile from the collective kernels of traced jobs.

    Per collective, size and group the shortest kernel is used: the member that arrived last
    waited least."""
    from echo_et.models.comm import launch
    from echo_et.models.comm.calibrate import default_preset, fit_profile
    from echo_et.models.comm.profile import load_preset, write_profile
    from echo_et.models.comm.trace import job_records, trace_samples

    if gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    from_launches = nccl_version == "launches"
    _check_version(nccl_version, auto=True, extra=("launches",))
    _refuse_overwrite(output, jobs)
    samples = []
    sources: list[dict[str, Any]] = []
    gpus = []
    launches: list[launch.Launch] = []
    stated: list[str] = []
    for path in jobs:             # one job in memory at a time; nothing is written before the last
        job = load_job_arg(path)
        _check_job_fill(path, job, gpus_per_node)
        gpus.append(job.manifest.hardware.gpu_name)
        got = trace_samples(job_records(job), gpus_per_node, path.name)
        samples += got
        sources.append({"kind": "trace", "file": path.name, "samples": len(got),
                        "ranks": job.world_size})
        if from_launches:
            launches += launch.job_launches(job)[0]
            stated.append(launch.stated_version(job))
    if not samples:
        raise EchoError("no collective kernels with sizes, groups of >= 2 ranks and durations in "
                        f"{', '.join(p.name for p in jobs)}")
    base = load_preset(preset or default_preset(gpus))
    chosen: dict[str, Any] | None = None
    if from_launches:
        if not launches:
            raise EchoError("--nccl-version launches: no traced NCCL collective with a launch configuration "
                            f"(grid/block) and a size in {', '.join(p.name for p in jobs)}")
        system, agree = launch.closest_system(launches, base.nccl, gpus_per_node,
                                              prefer=(*stated, base.nccl.version))
        base = dataclasses.replace(base, nccl=system)
        chosen = {"nccl_version": system.version, "max_channels": system.max_channels, **agree}
        nccl_version = None
    prof, result = fit_profile(samples, sources, base, gpus_per_node, name or f"{base.name}-calibrated",
                               nccl_version)
    if chosen is not None:
        prof = dataclasses.replace(prof, fit={**prof.fit, "nccl_from_launches": chosen})
    write_profile(prof, output)
    _report_fit(output, base.name, result, as_json, prof.nccl.version,
                None if chosen is None else {"nccl_from_launches": chosen})
    if chosen is not None and not as_json:
        typer.echo(f"  NCCL {chosen['nccl_version']}, max channels {chosen['max_channels']}: "
                   f"{chosen['match']}/{chosen['calls']} traced launches match")


# -- calibrate choices -------------------------------------------------------------------------------
@calibrate_app.command("choices")
@guarded
def calibrate_choices_cmd(
    jobs: list[Path] = typer.Argument(..., metavar="JOB...", help="Job directories or traces with NCCL kernels."),
    profile: Path | None = typer.Option(None, "--profile", metavar="PROFILE", help="Take the node from this profile."),
    preset: str | None = typer.Option(None, "--preset", metavar="NAME",
                                      help="Take the node from this preset (default: the one matching the job's GPU)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", metavar="G",
                                             help=_GPN_HELP + " Default: the model's."),
    nccl_version: str = typer.Option("all", "--nccl-version", metavar="all|VERSION",
                                     help="NCCL release(s) to emulate: all modelled ones (default) or one."),
    max_channels: int | None = typer.Option(None, "--max-channels", metavar="N", help=_MAX_CHANNELS_HELP),
    output: Path | None = typer.Option(None, "-o", "--output", metavar="PROFILE",
                                       help="Write the model (the preset or profile the node came from) with the "
                                       "NCCL release and channel cap that match the most traced calls."),
    as_json: bool = JsonOpt,
) -> None:
    """Check the emulated NCCL choice against the kernels a trace recorded.

    An NCCL kernel's launch is NCCL's choice for that call: one thread block per channel, and
    a block size the protocol fixes. Each traced collective is compared, per NCCL release,
    with the channels and threads the emulation gives it; the release (and channel cap) that
    matches most calls is the one to estimate with."""
    from echo_et.models.comm import CommModel, launch
    from echo_et.models.comm.nccl_releases import VERSIONS

    if nccl_version != "all":
        _check_version(nccl_version, auto=False)
    versions = list(VERSIONS) if nccl_version == "all" else [nccl_version]
    if gpus_per_node is not None and gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    if output is not None:
        _refuse_overwrite(output, jobs + ([profile] if profile else []))
        if len(jobs) != 1:
            raise EchoError("--output takes one job (the profile states one cluster's NCCL)")
    reports = []
    for path in jobs:             # one job in memory at a time; nothing is written before the last
        job = load_job_arg(path)
        _check_job_fill(path, job, gpus_per_node)
        launches, skipped = launch.job_launches(job)
        if not launches:
            why = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())) or "no collectives"
            raise EchoError(f"{path.name}: no traced NCCL collective with a launch configuration "
                            f"(grid/block) to check ({why})")
        gpu = job.manifest.hardware.gpu_name
        model = _model(profile, preset) if (profile or preset) else CommModel.preset_for_gpu(gpu)
        model = _with_max_channels(model, max_channels)
        gpn = gpus_per_node or model.gpus_per_node
        per_version = {v: launch.check(launches, model.nccl.with_version(v), gpn) for v in versions}
        rows = []
        for i, lc in enumerate(launches):
            first = per_version[versions[0]][i]
            rows.append({
                "collective": lc.collective, "bytes": lc.ir_bytes, "ranks": len(lc.ranks),
                "nodes": first.placement.nodes, "calls": lc.calls,
                "traced": {"blocks": lc.blocks, "threads": lc.threads},
                "emulated": {v: {"algorithm": c[i].emulated.algorithm, "protocol": c[i].emulated.protocol,
                                 "channels": c[i].emulated.channels, "threads": c[i].emulated.threads,
                                 "match": c[i].match} for v, c in per_version.items()}})
        agree = {v: launch.agreement(c) for v, c in per_version.items()}
        stated = launch.stated_version(job)
        prefer = (stated, model.nccl_version)
        best = launch.closest_version(agree, prefer)
        report = {"job": path.name, "gpu": gpu, "nccl_stated": stated or None,
                  "model": model.name, "gpus_per_node": gpn,
                  "max_channels": model.nccl.max_channels, "skipped": dict(sorted(skipped.items())),
                  "launches": rows, "agreement": agree, "best_version": best}
        if output is not None:
            from echo_et.models.comm.profile import write_profile

            system, fit = launch.closest_system(launches, model.nccl, gpn, versions, prefer)
            write_profile(dataclasses.replace(model.profile, nccl=system), output)
            report["output"] = {"file": str(output), "nccl_version": system.version,
                                "max_channels": system.max_channels, "agreement": fit}
        reports.append(report)
    if as_json:
        emit_json({"jobs": reports})
        return
    for rep in reports:
        skipped_text = ", ".join(f"{k} {v}" for k, v in rep["skipped"].items()) or "none"
        typer.echo(f"{rep['job']}: {len(rep['launches'])} distinct launch(es) of "
                   f"{rep['agreement'][versions[0]]['calls']} traced call(s); node {rep['model']} "
                   f"(GPU {rep['gpu'] or 'unknown'}), {rep['gpus_per_node']} GPUs per node, max channels "
                   f"{rep['max_channels']}; not compared: {skipped_text}"
                   + (f"; the trace states NCCL {rep['nccl_stated']}" if rep["nccl_stated"] else ""))
        head = f"  {'collective':<15}{'bytes':>12}{'ranks':>6}{'nodes':>6}{'calls':>6}  {'traced':>9}"
        typer.echo((head + "".join(f"  {'NCCL ' + v:<28}" for v in versions)).rstrip())
        for r in rep["launches"]:
            traced = f"{r['traced']['blocks']}x{r['traced']['threads']}"
            line = (f"  {r['collective']:<15}{r['bytes']:>12}{r['ranks']:>6}{r['nodes']:>6}{r['calls']:>6}"
                    f"  {traced:>9}")
            for v in versions:
                e = r["emulated"][v]
                cell = f"{e['algorithm']}/{e['protocol']} {e['channels']}x{e['threads']} " + \
                    ("ok" if e["match"] else "differs")
                line += f"  {cell:<28}"
            typer.echo(line.rstrip())
        typer.echo("  calls whose blocks and threads match: " + ", ".join(
            f"NCCL {v} {a['match']}/{a['calls']} (threads {a['threads_match']}, blocks {a['channels_match']})"
            for v, a in rep["agreement"].items()) + f"; closest: {rep['best_version']}")
        if "output" in rep:
            o = rep["output"]
            typer.echo(f"wrote {o['file']}: NCCL {o['nccl_version']}, max channels {o['max_channels']} "
                       f"({o['agreement']['match']}/{o['agreement']['calls']} calls match)")


def _check_job_fill(path: Path, job, gpus_per_node: int | None) -> None:
    """The node-fill rule of every verb (``check_node_fill``) for one of the jobs: its world
    size against ``--gpus-per-node``, the refusal naming the job."""
    try:
        check_node_fill(job.world_size, gpus_per_node)
    except OptionError as e:
        raise OptionError(e.option, f"{path.name}: {e}") from None


def _refuse_overwrite(output: Path, inputs: list[Path]) -> None:
    """Before any work: the output is not an input, and it can be written."""
    from echo_et.ir.io import check_writable_file

    if output.resolve() in {p.resolve() for p in inputs}:
        raise EchoError(f"{output}: output would overwrite an input")
    check_writable_file(output)


def _check_version(version: str | None, auto: bool, extra: tuple[str, ...] = ()) -> None:
    from echo_et.models.comm.nccl_releases import VERSIONS

    allowed = VERSIONS + (("auto",) if auto else ()) + extra
    if version is not None and version not in allowed:
        raise EchoError(f"--nccl-version must be one of {', '.join(allowed)}, got {version!r}")


def _report_fit(output: Path, base: str, result, as_json: bool, version: str,
                extra: dict[str, Any] | None = None) -> None:
    if as_json:
        emit_json({"output": str(output), "base_preset": base, "samples": result.samples,
                   "mape_percent": result.mape_percent, "by_source": result.by_source,
                   "free_parameters": result.free, "nccl_version": version, **(extra or {})})
        return
    typer.echo(f"wrote {output}: {result.samples} measurements, fit error (MAPE) "
               f"{result.mape_percent:.1f}% (preset {base}, choices of NCCL {version})")
    for src, r in result.by_source.items():
        typer.echo(f"  {src:<32} {r['samples']:>4} sizes  MAPE {r['mape_percent']:5.1f}%")


# -- calibrate evaluate ------------------------------------------------------------------------------
@calibrate_app.command("evaluate")
@guarded
def calibrate_evaluate_cmd(
    logs: list[Path] = typer.Argument(..., metavar="LOG...", help="nccl-tests output files (or lookup tables)."),
    profile: Path | None = typer.Option(None, "--profile", metavar="PROFILE",
                                        help="Evaluate this calibration profile (no fitting)."),
    preset: str | None = typer.Option(None, "--preset", metavar="NAME", help="Evaluate a preset instead."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", metavar="G",
                                             help=_GPN_HELP + " Default: the model's (8 for fits)."),
    collective: str | None = typer.Option(None, "--collective", metavar="NAME",
                                          help="Collective the logs measure."),
    nccl_version: str | None = typer.Option(None, "--nccl-version", metavar="auto|VERSION",
                                            help="With --profile/--preset: emulate this release instead of the "
                                            "model's. Without: the release the fits assume (default auto, "
                                            "chosen on each fit's own logs)."),
    choice: str = typer.Option("nccl", "--choice", metavar="nccl|fastest",
                               help="With --profile/--preset: time NCCL's choice or the fastest."),
    hold_out: str = typer.Option("auto", "--hold-out", metavar="auto|multi-node|all",
                                 help="Without --profile: which logs to leave out in turn (each one is fitted "
                                 "without it and predicted); auto: every log when the logs hold several "
                                 "collectives, else the multi-node ones."),
    plot: Path | None = typer.Option(None, "--plot", metavar="DIR",
                                     help="Write PNG plots (needs matplotlib): measured vs predicted time per "
                                     "log, and NCCL's choice regions."),
    as_json: bool = JsonOpt,
) -> None:
    """How well the model predicts measured nccl-tests times.

    With --profile or --preset: that model's error per log. Without: calibrate from the logs
    and report in-sample errors (fit on every log) and leave-one-log-out errors (fit without a
    log, predict it), next to the alpha-beta baseline fitted the same way per collective and
    tier (one GPU, one node, several nodes). Errors: MAPE over sizes >= 1 MiB and the median absolute error over
    4 KiB - 1 MiB."""
    from echo_et.models.comm.evaluate import cross_validate, evaluate_runs

    if choice not in ("nccl", "fastest"):
        raise EchoError(f"--choice must be nccl or fastest, got {choice!r}")
    if hold_out not in ("auto", "multi-node", "all"):
        raise EchoError(f"--hold-out must be auto, multi-node or all, got {hold_out!r}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise EchoError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    runs = _read_logs(logs, collective)
    if profile is not None or preset is not None:
        _check_version(nccl_version, auto=False)
        model = _with_version(_model(profile, preset), nccl_version)
        gpn = gpus_per_node or model.gpus_per_node
        _check_runs_fill(runs, gpn)
        reports = evaluate_runs(model.profile.params, runs, gpn, model.nccl, choice)
        _warn_truncated(runs)
        if plot is not None:
            from echo_et.models.comm.plots import write_plots

            write_plots(plot, {"evaluated": [(run, model.profile) for run in runs]}, gpn)
        if as_json:
            emit_json({"model": model.name, "calibrated": model.calibrated, "gpus_per_node": gpn,
                       "nccl_version": model.nccl_version, "choice": choice, "logs": reports})
            return
        typer.echo(f"model {model.name} ({'calibrated' if model.calibrated else 'uncalibrated preset'}), "
                   f"choices of NCCL {model.nccl_version}")
        typer.echo(f"{'log':<28} {'ranks':>5} {'sizes':>5} {'MAPE all':>9} {'MAPE >=1MiB':>12} "
                   f"{'median 4KiB-1MiB':>17}")
        for r in reports:
            typer.echo(f"{r['log']:<28} {r['ranks']:>5} {r['sizes']:>5} {_pct(r['mape_percent']):>9} "
                       f"{_pct(r['mape_ge_1mib_percent']):>12} {_pct(r['median_4kib_1mib_percent']):>17}")
        return

    from echo_et.models.comm.calibrate import default_preset, stated_release
    from echo_et.models.comm.profile import load_preset

    _check_version(nccl_version, auto=True)
    gpn = gpus_per_node or 8
    _check_runs_fill(runs, gpn)
    base = load_preset(default_preset(g for r in runs for g in r.gpu_names))
    if nccl_version is None:
        nccl_version = stated_release(runs)
    if hold_out == "auto":
        hold_out = "all" if len({r.collective for r in runs}) > 1 else "multi-node"
    _warn_truncated(runs)
    typer.echo(f"fitting {len(runs)} run(s) and leaving each {'multi-node ' if hold_out == 'multi-node' else ''}"
               "one out in turn ...", err=True)
    held = None if hold_out == "multi-node" else list(range(len(runs)))
    cv = cross_validate(runs, gpn, base, nccl_version or "auto", held)
    if plot is not None:
        from echo_et.models.comm.plots import cross_validation_sets, write_plots

        write_plots(plot, cross_validation_sets(runs, cv), gpn)
    cv.pop("profiles")
    if as_json:
        emit_json({"gpus_per_node": gpn, "base_preset": base.name, **cv})
        return
    colls = {r.source + (f"#{r.index + 1}" if r.index else ""): r.collective for r in runs}
    typer.echo(f"{'experiment':<14} {'log':<24} {'collective':<15} {'ranks':>5} {'NCCL':>6} {'model >=1MiB':>13} "
               f"{'model 4K-1M':>12} {'baseline >=1MiB':>16} {'baseline 4K-1M':>15}")
    for kind, label in (("in_sample", "in-sample"), ("leave_one_out", "leave-one-out")):
        for r in cv[kind]:
            m, b = r["model"], r["baseline"]
            typer.echo(f"{label:<14} {r['log']:<24} {colls.get(r['log'], ''):<15} {r['ranks']:>5} {r['nccl']:>6} "
                       f"{_pct(m['mape_ge_1mib_percent']):>13} {_pct(m['median_4kib_1mib_percent']):>12} "
                       f"{_pct(b['mape_ge_1mib_percent']):>16} {_pct(b['median_4kib_1mib_percent']):>15}")
    typer.echo(">=1MiB: MAPE over sizes >= 1 MiB; 4K-1M: median absolute error over 4 KiB - 1 MiB; "
               "baseline: latency (+ log2(N)) + bytes/bandwidth per collective and tier (one GPU, one node, nodes)")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"
