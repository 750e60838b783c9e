"""export: hand a Job to other tools (Chakra ET, ASTRA-sim, Perfetto, GraphML)."""

from __future__ import annotations

from pathlib import Path

import typer

from echo_et.cli.common import JsonOpt, emit_json, guarded, load_job_arg

export_app = typer.Typer(help="Export a Job to another format.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")


@export_app.command("chakra")
@guarded
def export_chakra(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: str = typer.Option(..., "-o", "--output", help="Prefix: writes PREFIX.{rank}.et"),
    as_json: bool = JsonOpt,
) -> None:
    """Plain Chakra ET, one file per rank (PREFIX.{rank}.et)."""
    from echo_et.converters import chakra
    from echo_et.ir import assert_valid

    job = load_job_arg(job_path)
    assert_valid(job)
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
    output: Path = typer.Option(..., "-o", "--output", help="Folder to write (replaced if it "
                                "is a previous export)."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node",
                                             help="GPUs per node (default: the Job's, else 8)."),
    intra_bw: float | None = typer.Option(None, "--intra-bw", help="Intra-node GB/s per GPU "
                                          "(default: the Job's, else 400)."),
    inter_bw: float | None = typer.Option(None, "--inter-bw", help="Inter-node GB/s per GPU "
                                          "(default: the Job's, else 50)."),
    latency: float | None = typer.Option(None, "--latency", help="Link latency in ns "
                                         "(default 936.25)."),
    topology: str | None = typer.Option(None, "--topology", help="Ring, FullyConnected or "
                                        "Switch, one for all dimensions or one per dimension "
                                        "separated by commas (default Switch)."),
    splits: int = typer.Option(4, "--splits", help="ASTRA-sim preferred-dataset-splits."),
    as_json: bool = JsonOpt,
) -> None:
    """ASTRA-sim input folder: workload.{rank}.et per rank, network/system/memory/group
    configuration and run.sh; checked against the ASTRA-sim contract before it is kept."""
    from echo_et.converters.astra_sim import ExportOptions, export

    job = load_job_arg(job_path)
    opts = ExportOptions(gpus_per_node=gpus_per_node, intra_bw=intra_bw, inter_bw=inter_bw,
                         latency=latency, topology=topology, splits=splits)
    result = export(job, output, opts)
    if as_json:
        emit_json(result)
        return
    typer.echo(f"wrote {result['ranks']} rank files to {output} "
               f"({result['groups']} communicator groups)")
    typer.echo("mapped: " + ", ".join(f"{k}={v}" for k, v in result["mapped"].items()))
    typer.echo(f"run: {result['command']}")


@export_app.command("chrome")
@guarded
def export_chrome(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", help="Chrome trace JSON file to write."),
    rank: list[int] = typer.Option([], "--rank", help="Only these ranks (repeatable)."),
    as_json: bool = JsonOpt,
) -> None:
    """The measured timeline as a Chrome/Perfetto trace: a process per rank, a track per stream."""
    from echo_et.converters import chrome

    result = chrome.write(load_job_arg(job_path), output, rank or None)
    if as_json:
        emit_json(result)
    else:
        typer.echo(f"wrote {output}: {result['events']} events, {result['ranks']} ranks, "
                   f"{result['tracks']} tracks")


@export_app.command("graphml")
@guarded
def export_graphml(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    output: Path = typer.Option(..., "-o", "--output", help="GraphML file to write."),
    rank: int | None = typer.Option(None, "--rank", help="The graph of this rank, with its "
                                    "groups and peers resolved (default: every distinct graph)."),
    as_json: bool = JsonOpt,
) -> None:
    """Dependency graph(s) as GraphML, for graph tools."""
    from echo_et.converters import graphml

    result = graphml.write(load_job_arg(job_path), output, rank)
    if as_json:
        emit_json(result)
    else:
        typer.echo(f"wrote {output}: {result['nodes']} nodes, {result['edges']} edges")
