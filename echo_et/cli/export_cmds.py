"""export: hand a Job to other tools (Chakra ET, ASTRA-sim, SimAI, Perfetto, GraphML)."""

from __future__ import annotations

from pathlib import Path

import typer

from echo_et.cli.cluster_opts import (
    BW_HELP,
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
from echo_et.errors import EchoError

export_app = typer.Typer(help="Export a Job to another format.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")


@export_app.command("chakra")
@guarded
def export_chakra(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: str = typer.Option(..., "-o", "--output", help="Prefix: writes PREFIX.{rank}.et"),
    max_output: str | None = typer.Option(None, "--max-output", metavar="SIZE", help=MAX_OUTPUT_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """Plain Chakra ET, one file per rank (PREFIX.{rank}.et)."""
    from echo_et.converters import chakra
    from echo_et.ir import assert_valid

    limit = max_output_bytes(max_output)      # a bad size fails before the Job is read
    job = load_job_arg(job_path)
    assert_valid(job)
    check_output_budget(job, "chakra", output, limit)
    result = chakra.write(job, output)
    if as_json:
        emit_json(result)
    else:
        typer.echo(f"wrote {len(result['files'])} files with prefix {output} "
                   f"({result['nodes']} nodes, {result['bytes']} bytes)")
        if result["lossy"]:
            typer.echo("not representable in Chakra: "
                       + ", ".join(f"{k}={v}" for k, v in result["lossy"].items()))


@export_app.command("astra-sim")
@guarded
def export_astra_sim(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", metavar="DIR", help="Folder to write (replaced "
                                "if it is a previous export)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", metavar="N",
                                             help="GPUs per node (default: the Job's, else 8)."),
    intra_bw: str | None = typer.Option(None, "--intra-bw", metavar="RATE", help="Intra-node bandwidth, "
                                        "e.g. 400GB/s (default: the Job's, else 400GB/s per GPU; kept by a "
                                        "fit). " + BW_HELP),
    inter_bw: str | None = typer.Option(None, "--inter-bw", metavar="RATE", help="Inter-node bandwidth, "
                                        "e.g. 400Gb/s (default: the Job's, else 50GB/s per GPU; kept by a "
                                        "fit). " + BW_HELP),
    latency: float | None = typer.Option(None, "--latency", metavar="NS", help="Link latency in ns: 0 "
                                         "(an ideal link) or 1 to 1e9 (default 936.25; kept by a fit)."),
    topology: str | None = typer.Option(None, "--topology", metavar="NAME[,NAME]", help="Ring, "
                                        "FullyConnected or Switch, one for all dimensions or one per "
                                        "dimension separated by commas (default Switch)."),
    splits: int | None = typer.Option(None, "--splits", metavar="N", help="ASTRA-sim "
                                      "preferred-dataset-splits (default 4; a network fit may choose "
                                      "1 or 2 when that fits the collectives better)."),
    profile: Path | None = typer.Option(None, "--profile", metavar="FILE", help="Fit the network's "
                                        "bandwidth and latency to this CC model calibration profile."),
    preset: str | None = typer.Option(None, "--preset", metavar="NAME", help="Fit the network's "
                                      "bandwidth and latency to this CC model preset (e.g. a100-ib)."),
    gpu: str | None = gpu_opt("GPU to export for: the job's compute retimed for it, and the network fitted "
                              "to its collective preset (unless --profile/--preset)"),
    measured_network: bool = typer.Option(False, "--measured-network", help="Fit the network's "
                                          "bandwidth and latency to the job's own measured collectives."),
    align_start: bool = typer.Option(False, "--align-start", help="Start every rank at 0 instead "
                                     "of its measured start offset."),
    host_time: str = typer.Option("keep", "--host-time", metavar="keep|fold", help="keep: host "
                                  "threads' time as CPU compute nodes; fold: leave it out and keep "
                                  "only the order it imposes (ASTRA-sim master's statistics fail on "
                                  "CPU nodes; the lost time is reported)."),
    all_to_all: str = typer.Option("p2p", "--all-to-all", metavar="p2p|ring", help="p2p: every "
                                   "all-to-all as one send and one receive per peer (NCCL's grouped "
                                   "send/recv); ring: even ones as ASTRA-sim's ALL_TO_ALL collective "
                                   "(its ring moves (N-1)/2 of the bytes where NCCL moves (N-1)/N)."),
    no_expected: bool = typer.Option(False, "--no-expected", help="Skip echo-et's replay of the job "
                                     "and of the export (no expected step; faster on huge jobs)."),
    max_output: str | None = typer.Option(None, "--max-output", metavar="SIZE", help=MAX_OUTPUT_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """ASTRA-sim input folder: workload.{rank}.et per rank, network/system/memory/group
    configuration and run.sh; checked against the ASTRA-sim contract before it is kept, and
    replayed by echo-et (expected step)."""
    from echo_et.converters.astra_sim import ExportOptions
    from echo_et.converters.astra_sim.configs import DEFAULT_GPUS_PER_NODE
    from echo_et.experiments.astra_sim import export_with_report
    from echo_et.models.cluster import Cluster

    if profile is not None and preset is not None:
        raise EchoError("give --profile or --preset, not both")
    if measured_network and (profile is not None or preset is not None or gpu is not None):
        raise EchoError("give --measured-network or a CC model (--profile/--preset/--gpu), not both")
    cluster = cluster_from_options(gpu, gpus_per_node, intra_bw, inter_bw)
    limit = max_output_bytes(max_output)      # a bad size fails before the Job is read
    job = load_job_arg(job_path)
    check_output_budget(job, "astra-sim", output, limit)
    gpn = job.manifest.hardware.gpus_per_node or DEFAULT_GPUS_PER_NODE
    model = None
    if cluster.gpu:
        from echo_et.cli.compute_cmds import retime_for_gpu

        job, _ = retime_for_gpu(job, cluster.gpu, None)
    if profile is not None or preset is not None or cluster.gpu:
        from echo_et.cli.sim_cmds import comm_model_for

        model = comm_model_for(job, profile, preset, Cluster(gpu=cluster.gpu))
    opts = ExportOptions(gpus_per_node=gpus_per_node, intra_bw=cluster.intra_gbps(gpn),
                         inter_bw=cluster.inter_gbps(gpn),
                         latency=latency, topology=topology, splits=4 if splits is None else splits,
                         align_start=align_start,
                         host_time=host_time, all_to_all=all_to_all)
    result = export_with_report(job, output, opts, comm_model=model, measured_network=measured_network,
                                fit_splits=splits is None, expected=not no_expected)
    for lossy in result["time"]["ranks_losing_over_1pct"]:
        typer.echo(f"warning: rank {lossy['rank']}: {lossy['lost_pct']} % of its measured busy time "
                   f"({lossy['lost_ns']} of {lossy['busy_ns']} ns) has no counterpart in the export", err=True)
    if result.get("expected_error"):
        typer.echo(f"warning: no expected step: {result['expected_error']}", err=True)
    if as_json:
        emit_json(result)
        return
    typer.echo(f"wrote {result['ranks']} rank files to {output} "
               f"({result['groups']} communicator groups)")
    typer.echo("mapped: " + ", ".join(f"{k}={v}" for k, v in result["mapped"].items()))
    if result["merged"]:
        typer.echo("merged: " + ", ".join(f"{k}={v}" for k, v in result["merged"].items()))
    if result["dropped"]:
        typer.echo("dropped: " + ", ".join(f"{k}={v}" for k, v in result["dropped"].items()))
    net = result["network"]
    typer.echo("network: " + ", ".join(f"{t} x{n} {b:.4g} GB/s {x:.4g} ns" for t, n, b, x in zip(
        net["topology"], net["npus_count"], net["bandwidth_gbps"], net["latency_ns"], strict=True)))
    fit = result.get("network_fit")
    if fit:
        typer.echo(f"network fitted to {fit['source']} (preferred-dataset-splits "
                   f"{fit['preferred_dataset_splits']}): max |error| {fit['max_abs_error_pct']} %")
        typer.echo(f"  {'collective':<16} {'bytes':>12} {'ranks':>5} {'target us':>10} {'astra us':>10} {'err %':>7}")
        for row in fit["residuals"]:
            err = "-" if row["error_pct"] is None else f"{row['error_pct']:+.1f}"
            typer.echo(f"  {row['collective']:<16} {row['bytes']:>12} {row['group_size']:>5} "
                       f"{row['target_ns'] / 1e3:>10.2f} {row['astra_sim_ns'] / 1e3:>10.2f} {err:>7}")
    if result.get("expected_step_ns") is not None:
        typer.echo(f"expected step {result['expected_step_ns'] / 1e6:.3f} ms (echo-et replay of the export, "
                   f"{result['expected_comm']} communication); echo-et replay of the job "
                   f"{result['replay_step_ns'] / 1e6:.3f} ms")
    typer.echo(f"run: {result['command']}")


@export_app.command("chrome")
@guarded
def export_chrome(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", help="A folder of rank-R.json (HolisticTraceAnalysis, "
                                "echo-et convert) or one .json / .json.gz file (Perfetto)."),
    rank: list[int] = typer.Option([], "--rank", help="Only these ranks (repeatable)."),
    max_output: str | None = typer.Option(None, "--max-output", metavar="SIZE", help=MAX_OUTPUT_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """The measured timeline in Kineto's trace schema (what torch.profiler writes), for HTA and Perfetto."""
    from echo_et.converters import chrome
    from echo_et.ir import assert_valid

    check_output_path("--output", output)
    limit = max_output_bytes(max_output)      # a bad size fails before the Job is read
    job = load_job_arg(job_path)
    assert_valid(job)
    check_output_budget(job, "chrome", output, limit, ranks=rank or None)
    scratch = chrome.export_scratch(job, output, rank or None)   # None unless it cannot stream
    if scratch is not None:
        check_output_budget(job, "chrome", output, limit, ranks=rank or None, scratch=scratch)
    result = chrome.write(job, output, rank or None)
    if as_json:
        emit_json(result)
    else:
        typer.echo(f"wrote {output}: {result['events']} events, {result['ranks']} ranks, "
                   f"{result['tracks']} tracks, {result['files']} file(s)")


@export_app.command("graphml")
@guarded
def export_graphml(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", help="GraphML file to write."),
    rank: int | None = typer.Option(None, "--rank", help="The graph of this rank, with its "
                                    "groups and peers resolved (default: every distinct graph)."),
    max_output: str | None = typer.Option(None, "--max-output", metavar="SIZE", help=MAX_OUTPUT_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """Dependency graph(s) as GraphML, for graph tools."""
    from echo_et.converters import graphml
    from echo_et.ir import assert_valid

    limit = max_output_bytes(max_output)      # a bad size fails before the Job is read
    job = load_job_arg(job_path)
    assert_valid(job)
    if rank is None:
        check_output_budget(job, "graphml", output, limit, per_rank=False)
    else:
        check_output_budget(job, "graphml", output, limit, ranks=[rank])
    result = graphml.write(job, output, rank)
    if as_json:
        emit_json(result)
    else:
        typer.echo(f"wrote {output}: {result['nodes']} nodes, {result['edges']} edges")


@export_app.command("simai")
@guarded
def export_simai(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", metavar="FILE", help="Workload text file to write."),
    rank: int | None = typer.Option(None, "--rank", help="The rank whose step every SimAI rank runs "
                                    "(default: the slowest rank of the simulated step)."),
    mode: str = typer.Option("replay", "--mode", help="Times from replay (measured) or predict (models)."),
    profile: Path | None = typer.Option(None, "--profile", help="CC model calibration profile (predict)."),
    preset: str | None = typer.Option(None, "--preset", help="CC model preset name (predict)."),
    slowdown: Path | None = typer.Option(None, "--slowdown", help="Slowdown model JSON (predict; default: built in)."),
    no_slowdown: bool = typer.Option(False, "--no-slowdown", help="Do not slow compute that overlaps comm."),
    gpu: str | None = gpu_opt("Target GPU (predict; default: the job's)"),
    intra_bw: str | None = intra_bw_opt(),
    inter_bw: str | None = inter_bw_opt(),
    nic_bw: str | None = nic_bw_opt(),
    gpus_per_node: int | None = gpus_per_node_opt(),
    compute_profile: Path | None = typer.Option(
        None, "--compute-profile", metavar="PROFILE.json",
        help="Compute-model profile (from `calibrate compute`) to retime every compute node with (predict)."),
    as_json: bool = JsonOpt,
) -> None:
    """A SimAI / AICB text workload: one rank's simulated step as SimAI's layer rows."""
    from echo_et.cli.sim_cmds import check_mode_options, run_simulation
    from echo_et.converters import simai_writer
    from echo_et.ir import assert_valid
    from echo_et.ir.limits import check_node_fill
    from echo_et.sim import SimOptions

    check_output_path("--output", output, file_only=True)
    src = job_path.resolve()
    dest = output.resolve()
    if dest == src or src in dest.parents:
        raise EchoError(f"{output}: output would overwrite the input")
    cluster = check_mode_options(mode, profile=profile, preset=preset, slowdown=slowdown, gpu=gpu,
                                 gpus_per_node=gpus_per_node, intra_bw=intra_bw, inter_bw=inter_bw,
                                 nic_bw=nic_bw, compute_profile=compute_profile)
    job = load_job_arg(job_path)
    assert_valid(job)
    check_node_fill(job.world_size, gpus_per_node)
    if rank is not None and not 0 <= rank < job.world_size:
        raise EchoError(f"--rank {rank}: not a rank of the job (world size {job.world_size})")
    job, res, _ = run_simulation(job, mode, SimOptions(gpus_per_node=gpus_per_node), cluster, profile=profile,
                                 preset=preset, slowdown=slowdown, no_slowdown=no_slowdown,
                                 compute_profile=compute_profile)
    if res.step_time_ns == 0 and mode == "replay":
        raise EchoError(f"{job_path}: the job has no measured times (a meta-device trace): give "
                        "--mode predict (with --gpu NAME where the job names none)")
    chosen = res.slowest_rank if rank is None else rank
    workload = simai_writer.plan(res.timeline_events([chosen]), job, chosen)
    written = simai_writer.write(workload, output)
    report = workload.report()
    graph = job.binding(chosen).graph
    report.update(file=str(output), bytes=written, mode=mode, step_ns=res.step_time_ns,
                  ranks_on_other_graphs=sum(1 for b in job.manifest.bindings if b.graph != graph))
    if as_json:
        emit_json(report)
        return
    t = report["time"]
    typer.echo(f"wrote {output}: {report['lines']} lines, rank {chosen}'s step "
               f"({t['rank_step_ns'] / 1e6:.3f} ms; the job's {res.step_time_ns / 1e6:.3f} ms, {mode})")
    typer.echo("mapped: " + (", ".join(f"{k}={v}" for k, v in report["mapped"].items()) or "no collectives"))
    if report["dropped"]:
        typer.echo("not SimAI rows (counted): " + ", ".join(f"{k}={v}" for k, v in report["dropped"].items()))
    typer.echo(f"expected step in SimAI's order with these communication times: "
               f"{report['expected_step_ns'] / 1e6:.3f} ms")
    if report["regrouped"]:
        typer.echo(f"note: SimAI numbers ranks tp, then pipeline stage, then data-parallel index: its "
                   f"{', '.join(report['regrouped'])} groups hold other ranks than the job's, so they may "
                   "span other nodes")
    if report["ranks_on_other_graphs"]:
        typer.echo(f"note: {report['ranks_on_other_graphs']} ranks run another graph than rank {chosen}; "
                   f"SimAI runs rank {chosen}'s on every rank")
