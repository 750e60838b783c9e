"""simulate, validate, calibrate slowdown: compose a training step and check it against the trace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from echo_et.cli.cluster_opts import (
    cluster_from_options,
    gpu_opt,
    gpus_per_node_opt,
    inter_bw_opt,
    intra_bw_opt,
    nic_bw_opt,
)
from echo_et.cli.common import (
    MAX_OUTPUT_HELP,
    JsonOpt,
    check_output_budget,
    check_output_path,
    emit_json,
    guarded,
    load_job_arg,
    max_output_bytes,
)
from echo_et.errors import EchoError, OptionError
from echo_et.ir import limits
from echo_et.ir.limits import check_node_fill


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
    app.command("validate")(validate_cmd)
    try:
        from echo_et.cli.comm_cmds import calibrate_app
    except ImportError:  # the communication model's verbs are not in this build
        calibrate_app = None
    if calibrate_app is None:
        calibrate_app = typer.Typer(help="Fit model parameters from measurements.", no_args_is_help=True)
        app.add_typer(calibrate_app, name="calibrate")
    elif not _registered_elsewhere(app, calibrate_app):
        app.add_typer(calibrate_app, name="calibrate")
    calibrate_app.command("slowdown")(calibrate_slowdown_cmd)


def _registered_elsewhere(app: typer.Typer, sub: typer.Typer) -> bool:
    """Whether ``sub`` is (or will be, by its own module) added to ``app``."""
    if any(g.typer_instance is sub for g in app.registered_groups):
        return True
    main = sys.modules.get("echo_et.cli.main")
    return "echo_et.cli.comm_cmds" in getattr(main, "_VERB_MODULES", ())


# -- shared option handling -------------------------------------------------------------------------
def parse_stragglers(values: list[str], world_size: int) -> dict[int, float]:
    out: dict[int, float] = {}
    for v in values:
        rank_s, sep, factor_s = v.partition(":")
        try:
            rank, factor = int(rank_s), float(factor_s)
        except ValueError:
            raise EchoError(f"--straggler {v!r}: expected RANK:FACTOR, e.g. 3:1.5") from None
        if not sep or not 0 < factor <= limits.MAX_FACTOR:  # (NaN fails too)
            raise EchoError(f"--straggler {v!r}: expected RANK:FACTOR with 0 < FACTOR <= {limits.MAX_FACTOR:g}")
        if not 0 <= rank < world_size:
            raise EchoError(f"--straggler {v!r}: rank {rank} is not in the job (world size {world_size})")
        out[rank] = factor
    return out


def comm_model_for(job, profile: Path | None, preset: str | None, cluster=None):
    """The CC model predict mode uses: a calibrated profile, a named preset, or the preset
    matching the cluster's (else the job's) GPU; the cluster's GPUs per node and bandwidths
    (given, else the job's own) applied on top."""
    try:
        from echo_et.models.comm import CommModel
    except ImportError:
        raise EchoError("predict mode needs the communication model (echo_et.models.comm), "
                        "which is not in this build") from None
    from echo_et.models.cluster import Cluster

    if profile is not None and preset is not None:
        raise EchoError("give --profile or --preset, not both")
    given = cluster or Cluster()
    cluster = given.over(Cluster.from_job(job))
    if profile is not None:
        model = CommModel.from_profile(profile)
    elif preset is not None:
        model = CommModel.preset(preset)
    elif given.gpu:
        try:
            model = CommModel.preset_for_gpu(given.gpu)
        except EchoError as e:
            raise OptionError("gpu", str(e)) from None
    elif job.manifest.hardware.gpu_name:
        try:
            model = CommModel.preset_for_gpu(job.manifest.hardware.gpu_name)
        except EchoError as e:   # the Job's own GPU: say which options choose another model
            raise EchoError(f"{job.source or 'the job'}: {e}; or give --gpu NAME, --preset NAME or "
                            "--profile FILE") from None
    else:
        raise no_gpu_error(job)
    over = cluster.comm_overrides(model.gpus_per_node)
    return model.with_overrides(**over) if over else model


def no_gpu_error(job) -> EchoError:
    """What to give when the collective model would follow the Job's GPU and it names none."""
    from echo_et.cli.compute_cmds import is_untimed, runs_on_gpu
    from echo_et.models.cluster import known_gpus
    from echo_et.models.comm import CommModel

    presets = f"--preset NAME ({', '.join(CommModel.preset_names())}) or --profile FILE"
    if runs_on_gpu(job) or is_untimed(job):
        return EchoError(f"{job.source or 'the job'} names no GPU: give --gpu NAME ({', '.join(known_gpus()[:6])}, "
                         f"...) for its collective preset, or the collective model with {presets}")
    return EchoError(f"{job.source or 'the job'} names no GPU (its compute ran on the CPU): give the collective "
                     f"model with {presets}")


def slowdown_model_for(path: Path | None, off: bool):
    if off:
        if path is not None:
            raise EchoError("give --slowdown or --no-slowdown, not both")
        return None
    from echo_et.models.slowdown import SlowdownModel, default_model

    return SlowdownModel.load(path) if path is not None else default_model()


def write_sim_timeline(res, dest: Path, job, ranks: list[int] | None = None,
                       max_events: int | None = None) -> dict[str, Any]:
    """The simulated step in Kineto's trace schema, written by the ``export chrome`` writer.
    ``max_events``: only the step's longest prefix of at most that many boxes (all files
    together), described by the returned ``window`` (``events`` of the step's ``of`` boxes,
    those that start before ``until_ns``, None when that is all of them; ``from_ns``: the
    step's start); None: the whole step, and no ``window``."""
    from echo_et.converters.chrome import write_timeline
    from echo_et.sim.timeline import first_start, timeline_events, window_end

    if ranks:
        bad = sorted(set(ranks) - set(res.ranks))
        if bad:
            raise EchoError(f"--timeline-rank {bad[0]}: not a rank of the job (world size {job.world_size})")
    chosen = sorted(set(ranks)) if ranks else None
    meta = {"world_size": job.world_size, "simulated": res.mode}
    # the boxes are made and written one at a time, never held (a rank file as soon as its
    # rank's boxes end): the trace's time 0 is found first, from the simulated times
    if max_events is None:
        return write_timeline(timeline_events(res, chosen), dest, job=job, metadata=meta,
                              origin_ns=first_start(res, chosen))
    until, total = window_end(res, chosen, max_events)
    written = write_timeline(timeline_events(res, chosen, until_ns=until), dest, job=job, metadata=meta,
                             origin_ns=first_start(res, chosen, until_ns=until))
    start = min((st.origin_ns for st in res.timeline.states), default=0)
    written["window"] = {"events": written["events"], "of": total, "until_ns": until, "from_ns": start}
    return written


def sim_timeline_scratch(job, dest: Path, ranks: list[int] | None, max_events: int | None):
    """The scratch file :func:`write_sim_timeline` keeps at its largest (a folder: rank by
    rank), from each rank's node count (``max_events``: about each rank's share of them)."""
    from echo_et.converters.chrome import timeline_scratch
    from echo_et.ir.budget import nodes_by_rank

    counts = list(nodes_by_rank(job, ranks).values())
    total = sum(counts)
    if max_events is not None and total > max_events:
        counts = [n * max_events // total for n in counts]
    return timeline_scratch(dest, counts, by_rank=True)


def require_matplotlib() -> None:
    """A plot was asked for: say so before any work when matplotlib is missing."""
    from echo_et.experiments.plots import INSTALL_HINT, have_matplotlib

    if not have_matplotlib():
        raise EchoError(f"--plot needs matplotlib, which is not installed ({INSTALL_HINT})")


def _progress(msg: str) -> None:
    """Progress on stderr, only for a person watching (error output stays one line)."""
    if sys.stderr.isatty():
        print(msg, file=sys.stderr)


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


MAX_TABLE_ROWS = 32


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def echo_rank_table(res) -> None:
    """The step breakdown in the vocabulary's words (docs/step-breakdown.md), in ms: one row
    per class of equivalent ranks, with the ranks it stands for."""
    from echo_et.sim.result import LABELS, OVERLAPPING, STEP_PARTS

    cols = ("step_time_ns", *STEP_PARTS, *OVERLAPPING[:2])
    typer.echo(f"{'ranks':>12} " + " ".join(f"{LABELS[c]:>12}" for c in cols) + "   (ms)")
    classes = res.rank_classes()
    for rep, members in classes[:MAX_TABLE_ROWS]:
        b = rep.breakdown()
        label = rank_ranges(members)
        label = label if len(label) <= 12 else f"{members[0]} (+{len(members) - 1})"
        typer.echo(f"{label:>12} " + " ".join(f"{_ms(b[c]):>12}" for c in cols))
    if len(classes) > MAX_TABLE_ROWS:
        typer.echo(f"... {len(classes) - MAX_TABLE_ROWS} more rank classes (use --json)")
    typer.echo("step = compute + exposed comm + bubble + host idle; comm (all) and sync wait overlap them "
               "(docs/step-breakdown.md)")


def echo_result(res) -> None:
    """A simulated step for a person: the step time, the rank table, what no model priced,
    the critical path."""
    typer.echo(f"{res.mode}: step time {_ms(res.step_time_ns)} ms (slowest rank {res.slowest_rank}); "
               f"{res.simulated_ranks} of {len(res.ranks)} ranks simulated, {res.events} events")
    echo_rank_table(res)
    kept = res.diagnostics.get("comm_kept_at_measured_time") or {}
    if kept:
        typer.echo("kept at measured time (communication no model prices): "
                   + ", ".join(f"{k}={v}" for k, v in kept.items()))
    cp = res.critical_path
    typer.echo(f"critical path ({_ms(cp['length_ns'])} ms, rank {cp['rank']}): "
               + ", ".join(f"{k} {_ms(v)} ms" for k, v in cp["by_category"].items()))
    for t in cp["top"][:5]:
        typer.echo(f"  {100 * t['share']:5.1f}%  {t['category']:<10} {t['name'][:80]} (x{t['count']})")


def echo_compute_bounds(retime: dict[str, Any]) -> None:
    """The retimed compute time's split by what sets it (docs/compute-model.md), one line."""
    from echo_et.models.compute import roofline
    from echo_et.passes.compute_retime import NOT_MODELLED

    labels = {roofline.BOUND_CEILING: "sustained tensor-core ceiling",
              roofline.BOUND_COMPUTE: "tiled compute (GEMM tiles, attention)",
              roofline.BOUND_MEMORY: "memory bandwidth", roofline.BOUND_OVERHEAD: "per-kernel overhead",
              NOT_MODELLED: "kept or scaled from the trace"}
    ns = retime.get("compute_ns_by_bound") or {}
    total = sum(ns.values())
    if total <= 0:
        return
    parts = sorted(ns.items(), key=lambda kv: (-kv[1], kv[0]))
    typer.echo("compute time by what bounds it: "
               + ", ".join(f"{labels.get(k, k)} {100 * v / total:.1f} %" for k, v in parts if v > 0))


# -- simulate ---------------------------------------------------------------------------------------
def check_mode_options(mode: str, *, profile: Path | None, preset: str | None, slowdown: Path | None,
                       gpu: str | None, gpus_per_node: int | None, intra_bw: str | None,
                       inter_bw: str | None, nic_bw: str | None, compute_profile: Path | None):
    """The cluster the options state; an error when a model option is given in replay mode
    (replay keeps the measured times, so a model option would be silently ignored)."""
    if mode not in ("replay", "predict"):
        raise EchoError(f"--mode {mode!r}: use replay or predict")
    cluster = cluster_from_options(gpu, gpus_per_node, intra_bw, inter_bw, nic_bw)
    if mode == "replay":
        used = [f for f, v in (("--profile", profile), ("--preset", preset), ("--intra-bw", intra_bw),
                               ("--inter-bw", inter_bw), ("--nic-bw", nic_bw), ("--slowdown", slowdown), ("--gpu", gpu),
                               ("--compute-profile", compute_profile)) if v is not None]
        if used:
            raise EchoError(f"{', '.join(used)} only apply with --mode predict (replay keeps measured times)")
    elif preset is not None and profile is None:
        # Named wrong, said before the Job is loaded and retimed (seconds on a large Job).
        from echo_et.models.comm.profile import load_preset

        load_preset(preset)
    return cluster


def run_simulation(job, mode: str, options, cluster, *, profile: Path | None, preset: str | None,
                   slowdown: Path | None, no_slowdown: bool, compute_profile: Path | None):
    """(the Job simulated, its result, the compute retiming or None): ``simulate``'s run,
    shared by every command that needs a simulated step (``export simai``). In predict mode
    the Job is first retimed for the cluster's GPU, as ``simulate`` does."""
    from echo_et.sim import simulate

    comm = slow = retime = net = None
    if mode == "predict":
        from echo_et.cli.compute_cmds import retime_for_gpu
        from echo_et.models.cluster import Cluster
        from echo_et.sim.nic_share import NodeNetwork

        job, retime = retime_for_gpu(job, cluster.gpu, compute_profile)
        comm = comm_model_for(job, profile, preset, cluster)
        slow = slowdown_model_for(slowdown, no_slowdown)
        shape = cluster.over(Cluster.from_job(job)).node_network(comm.gpus_per_node)
        net = None if shape is None else NodeNetwork(*shape)
    res = simulate(job, mode, options=options, comm_model=comm, slowdown_model=slow, node_network=net)
    return job, res, retime


@guarded
def simulate_cmd(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace(s)."),
    mode: str = typer.Option("replay", "--mode", help="replay (measured times) or predict (models)."),
    profile: Path | None = typer.Option(None, "--profile", help="CC model calibration profile (predict)."),
    preset: str | None = typer.Option(None, "--preset", help="CC model preset name (predict)."),
    slowdown: Path | None = typer.Option(None, "--slowdown", help="Slowdown model JSON (predict; default: built in)."),
    no_slowdown: bool = typer.Option(False, "--no-slowdown", help="Do not slow compute that overlaps comm."),
    timeline: Path | None = typer.Option(None, "--timeline", help="Write the simulated step in Kineto's trace "
                                          "schema: a folder of rank-R.json (HolisticTraceAnalysis, echo-et "
                                          "convert) or one .json / .json.gz file (Perfetto)."),
    timeline_rank: list[int] = typer.Option([], "--timeline-rank", help="Only this rank in the timeline "
                                            "(repeatable; default: every rank)."),
    timeline_events: int | None = typer.Option(None, "--timeline-events", metavar="N",
                                               help="With --timeline: only the step's longest prefix of at "
                                               "most N boxes, all files together (default: the whole step)."),
    max_output: str | None = typer.Option(None, "--max-output", metavar="SIZE", help="With --timeline: "
                                          + MAX_OUTPUT_HELP[0].lower() + MAX_OUTPUT_HELP[1:]),
    plot: Path | None = typer.Option(None, "--plot", help="Draw each rank's step as compute / exposed "
                                     "comm / bubble / host idle into this PNG (matplotlib)."),
    no_symmetry: bool = typer.Option(False, "--no-symmetry", help="Simulate every rank, even equivalent ones."),
    compute_scale: float = typer.Option(1.0, "--compute-scale", help="Factor on compute time (0.5 = 2x faster)."),
    gpu: str | None = gpu_opt("Target GPU (predict; default: the job's)"),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    nic_bw: str | None = nic_bw_opt(),
    gpus_per_node: int | None = gpus_per_node_opt(),
    straggler: list[str] = typer.Option([], "--straggler", help="RANK:FACTOR, slows a rank's non-comm time."),
    align_start: bool = typer.Option(False, "--align-start", help="Start all ranks at 0, not measured offsets."),
    compute_profile: Path | None = typer.Option(
        None, "--compute-profile", metavar="PROFILE.json",
        help="Compute-model profile (from `calibrate compute`) to retime every compute node with (predict)."),
    as_json: bool = JsonOpt,
) -> None:
    """Simulate one training step: step time per rank, breakdown, critical path."""
    from echo_et.sim import SimOptions

    if mode not in ("replay", "predict"):
        raise EchoError(f"--mode {mode!r}: use replay or predict")
    if compute_scale <= 0:
        raise EchoError("--compute-scale must be > 0")
    cluster = check_mode_options(mode, profile=profile, preset=preset, slowdown=slowdown, gpu=gpu,
                                 gpus_per_node=gpus_per_node, intra_bw=intra_bw, inter_bw=inter_bw,
                                 nic_bw=nic_bw, compute_profile=compute_profile)
    check_output_path("--timeline", timeline)
    check_output_path("--plot", plot, file_only=True)
    if timeline_rank and timeline is None:
        raise EchoError("--timeline-rank needs --timeline")
    if timeline_events is not None and timeline is None:
        raise EchoError("--timeline-events needs --timeline")
    if plot is not None:
        require_matplotlib()
    limit = max_output_bytes(max_output)
    job = load_job_arg(job_path)
    check_node_fill(job.world_size, gpus_per_node)
    if timeline is not None:
        check_output_budget(job, "chrome", timeline, limit, ranks=timeline_rank or None,
                            name="the simulated timeline", max_nodes=timeline_events,
                            scratch=sim_timeline_scratch(job, timeline, timeline_rank or None, timeline_events))
    elif max_output is not None:
        raise EchoError("--max-output needs --timeline")
    # Repeat blocks are placed in closed form (predict, with symmetry) with or without a
    # timeline: echo_et.sim.timeline writes each copy's box at the time the placement gives it,
    # the same bytes as a node-by-node simulation (tests/test_sim_timeline_placed.py).
    options = SimOptions(compute_scale=compute_scale, stragglers=parse_stragglers(straggler, job.world_size),
                         symmetry=not no_symmetry, gpus_per_node=gpus_per_node, align_start=align_start)
    _progress(f"simulating {job.world_size} ranks ({mode})...")
    job, res, retime = run_simulation(job, mode, options, cluster, profile=profile, preset=preset,
                                      slowdown=slowdown, no_slowdown=no_slowdown,
                                      compute_profile=compute_profile)
    out = res.to_json()
    if retime is not None:
        out["compute_retime"] = retime
    if timeline is not None:
        out["timeline"] = write_sim_timeline(res, timeline, job, timeline_rank, timeline_events)
    if plot is not None:
        from echo_et.experiments.plots import rank_breakdown_plot

        out["plot"] = str(rank_breakdown_plot(res, plot, title=f"{job.manifest.name or job_path.name}: {mode}"))
    if as_json:
        emit_json(out)
        return
    if retime is not None:
        typer.echo(f"compute retimed for {retime['gpu']} (profile {retime['profile']}): {retime['nodes']} nodes, "
                   + ", ".join(f"{k} {v}" for k, v in retime["by_status"].items()))
        echo_compute_bounds(retime)
        if not retime["calibrated"]:
            typer.echo(f"note: no calibrated compute preset for {retime['gpu']}: its data sheet with the efficiencies "
                       f"of {retime['efficiencies_from']} (not measured on this GPU)")
    echo_result(res)
    if timeline is not None:
        t = out["timeline"]
        typer.echo(f"wrote {timeline} ({t['events']} events, {t['ranks']} ranks, {t['files']} file(s))")
        w = t.get("window")
        if w is not None and w["until_ns"] is not None:
            typer.echo(f"the timeline holds the step's first {(w['until_ns'] - w['from_ns']) / 1e6:.3f} ms: "
                       f"{w['events']} of its {w['of']} boxes (--timeline-events N)")
    if plot is not None:
        typer.echo(f"wrote {plot}")


# -- validate ---------------------------------------------------------------------------------------
@guarded
def validate_cmd(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace(s) with measured step times."),
    profile: Path | None = typer.Option(None, "--profile", help="CC model calibration profile."),
    preset: str | None = typer.Option(None, "--preset", help="CC model preset name."),
    slowdown: Path | None = typer.Option(None, "--slowdown", help="Slowdown model JSON (default: built in)."),
    no_slowdown: bool = typer.Option(False, "--no-slowdown", help="Do not slow compute that overlaps comm."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw measured, replayed and predicted step time "
                                     "per rank into this PNG (matplotlib)."),
    gpu: str | None = gpu_opt("GPU the prediction is for (default: the job's)"),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    gpus_per_node: int | None = gpus_per_node_opt(),
    as_json: bool = JsonOpt,
) -> None:
    """Replay and predict a Job and compare with each rank's measured step time."""
    from echo_et.sim import SimOptions, validate

    check_output_path("--plot", plot, file_only=True)
    if plot is not None:
        require_matplotlib()
    cluster = cluster_from_options(gpu, gpus_per_node, intra_bw, inter_bw)
    job = load_job_arg(job_path)
    check_node_fill(job.world_size, gpus_per_node)
    comm = comm_model_for(job, profile, preset, cluster)
    slow = slowdown_model_for(slowdown, no_slowdown)
    _progress(f"validating {job.world_size} ranks...")
    v = validate(job, comm_model=comm, slowdown_model=slow,
                 options=SimOptions(gpus_per_node=cluster.gpus_per_node))
    if plot is not None:
        from echo_et.experiments.plots import validation_plot

        v = {**v, "plot": str(validation_plot(v, plot, title=job.manifest.name or job_path.name))}
    if as_json:
        emit_json(v)
        return
    typer.echo(f"{'rank':>6} {'measured ms':>12} {'replay ms':>10} {'err %':>7} {'predict ms':>11} {'err %':>7}")
    for r, row in v["ranks"].items():
        typer.echo(f"{r:>6} {_ms(row['measured_step_ns']):>12} {_ms(row['replay_step_ns']):>10} "
                   f"{_pct(row['replay_error_pct']):>7} {_ms(row['predict_step_ns']):>11} "
                   f"{_pct(row['predict_error_pct']):>7}")
    typer.echo(f"{'all':>6} {_ms(v['measured_step_ns']):>12} {_ms(v['replay_step_ns']):>10} "
               f"{_pct(v['replay_error_pct']):>7} {_ms(v['predict_step_ns']):>11} {_pct(v['predict_error_pct']):>7}")
    typer.echo(f"mean |error|: replay {_pct(v['replay_mean_abs_error_pct'])} %, "
               f"predict {_pct(v['predict_mean_abs_error_pct'])} %")
    if v.get("measured_caveat"):
        typer.echo(f"note: {v['measured_caveat']}.")
    if plot is not None:
        typer.echo(f"wrote {plot}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


# -- calibrate slowdown -----------------------------------------------------------------------------
@guarded
def calibrate_slowdown_cmd(
    source: Path = typer.Argument(..., metavar="CSV|JOB",
                                  help="A kernel dataset (merged_features.csv) or a Job/trace with overlap."),
    output: Path = typer.Option(..., "-o", "--output", help="Slowdown model JSON to write."),
    folds: int = typer.Option(5, "--folds", help="Folds of the grouped-by-kernel-name cross-validation."),
    plot: Path | None = typer.Option(None, "--plot", help="Draw each overlapped kernel's cross-validated "
                                     "predicted vs measured duration into this PNG (matplotlib)."),
    as_json: bool = JsonOpt,
) -> None:
    """Fit the overlap-slowdown model from a kernel CSV or a Job; reports a grouped-by-kernel-name CV error."""
    from echo_et.models.slowdown import default_model, fit, read_csv_samples, samples_from_job
    from echo_et.models.slowdown.evaluate import cross_validate

    if not source.exists():
        raise EchoError(f"{source}: no such file or directory")
    if output.resolve() == source.resolve():
        raise EchoError(f"{output}: output would overwrite the input")
    check_output_path("--plot", plot, file_only=True)
    if plot is not None:
        require_matplotlib()
    if source.is_file() and source.suffix.lower() == ".csv":
        samples = read_csv_samples(source)
        prior = None
    else:
        job = load_job_arg(source)
        samples = samples_from_job(job)
        if not any(x.overlap > 0 for x in samples):
            raise EchoError(f"{source}: no kernel of the job ran both alone and overlapped with communication; "
                            "nothing to fit")
        prior = default_model()
    model = fit(samples, prior=prior, source=source.name)
    model.fit["cross_validation"] = cross_validate(samples, folds, prior=prior)
    preds = None
    if plot is not None:
        from echo_et.models.slowdown.evaluate import cross_validated_predictions

        preds = cross_validated_predictions(samples, folds, prior=prior)
        if preds is None:
            raise EchoError(f"{source}: fewer than two overlapped kernel names; nothing to cross-validate or plot")
    model.save(output)
    out = {"output": str(output), **model.to_json()}
    if plot is not None:
        from echo_et.experiments.plots import slowdown_prediction_plot

        n_folds = model.fit["cross_validation"].get("folds", folds)
        out["plot"] = str(slowdown_prediction_plot(
            preds, plot, title=f"{source.name}: predicted vs measured (grouped {n_folds}-fold CV)"))
    if as_json:
        emit_json(out)
        return
    cv = model.fit["cross_validation"]
    typer.echo(f"wrote {output}: {model.fit['overlapped']} overlapped of {model.fit['samples']} kernels, "
               f"{len(model.classes)} classes, {len(model.kernels)} kernel names")
    for k, s in sorted(model.classes.items()):
        typer.echo(f"  {k:<12} s = {s:.4f}")
    if cv:
        typer.echo(f"grouped {cv['folds']}-fold CV (summed overlapped time |error|, mean over folds): "
                   f"model {cv['model']['fold_sum_abs_error_pct']:.1f} %, constant factor "
                   f"{cv['constant']['fold_sum_abs_error_pct']:.1f} %")
    if plot is not None:
        typer.echo(f"wrote {plot}")
