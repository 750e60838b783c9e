"""convert, check, inspect: getting traces in and looking at Jobs."""

from __future__ import annotations

from pathlib import Path

import typer

from echo_et.cli.common import GPN_HELP, JsonOpt, emit_json, fail, guarded, load_job_arg


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
    app.command("check")(check)
    app.command("inspect")(inspect)


@guarded
def convert(
    inputs: list[Path] = typer.Argument(..., help="Trace files or folders (one per rank or a set)."),
    output: Path = typer.Option(..., "-o", "--output", help="Job directory to write."),
    from_: str | None = typer.Option(None, "--from", help="Force the input format."),
    rank: int | None = typer.Option(None, "--rank", help="Rank of a single input whose rank is unknown."),
    step: int | None = typer.Option(None, "--step", help="ProfilerStep#N to keep (default: last complete)."),
    host_et: list[Path] = typer.Option([], "--host-et", help="Host execution trace(s) to link (file or folder)."),
    world_size: int | None = typer.Option(None, "--world-size", help="World size, for formats that lack it."),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help=GPN_HELP),
    as_json: bool = JsonOpt,
) -> None:
    """Convert traces (Kineto, PyTorch ET, Chakra ET, SimAI) into an echo-et Job directory."""
    from echo_et.converters import ReadOptions, read
    from echo_et.ir import check_job, save_job
    from echo_et.ir.io import check_job_output
    from echo_et.ir.limits import check_node_fill
    from echo_et.ir.summary import summarize

    resolved = [p.resolve() for p in inputs]
    if output.resolve() in resolved:
        fail(f"{output}: output would overwrite an input")
    check_job_output(output)
    opts = ReadOptions(rank=rank, step=step, host_et=list(host_et), world_size=world_size,
                       gpus_per_node=gpus_per_node)
    job = read(list(inputs), from_, opts)
    check_node_fill(job.world_size, gpus_per_node)
    issues = check_job(job)
    if issues:
        fail(f"converted job fails check: {issues[0]}")
    save_job(job, output)
    s = summarize(job)
    if as_json:
        emit_json({"output": str(output), **s})
    else:
        typer.echo(f"wrote {output}: {s['world_size']} ranks, {s['graphs']} graphs, "
                   f"{sum(s['nodes'].values())} nodes")
        if s["dropped"]:
            typer.echo("dropped/guessed: " + ", ".join(f"{k}={v}" for k, v in s["dropped"].items()))


@guarded
def check(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    astra_sim: bool = typer.Option(False, "--astra-sim", help="Check an ASTRA-sim export folder instead."),
    as_json: bool = JsonOpt,
) -> None:
    """Prove a Job's invariants (ids, deps, acyclic, streams, groups, collective sequences, P2P)."""
    if astra_sim:
        from echo_et.converters.astra_sim import check_export

        errors = [str(e) for e in check_export(job_path)]
    else:
        from echo_et.ir import check_job

        errors = [str(i) for i in check_job(load_job_arg(job_path))]
    if as_json:
        emit_json({"ok": not errors, "errors": errors})
    elif errors:
        for e in errors:
            typer.echo(e, err=True)
    else:
        typer.echo("ok")
    if errors:
        raise typer.Exit(1)


@guarded
def inspect(
    job_path: Path = typer.Argument(..., metavar="JOB", help="Job directory or trace."),
    as_json: bool = JsonOpt,
) -> None:
    """Summarise a Job: ranks, graphs, node kinds, collectives, bytes, what conversion dropped."""
    from echo_et.ir.summary import summarize

    s = summarize(load_job_arg(job_path))
    if as_json:
        emit_json(s)
        return
    typer.echo(f"job {s['name'] or job_path}: world size {s['world_size']}, {s['graphs']} distinct graphs"
               f" ({s['source_format'] or 'unknown source'})")
    typer.echo("nodes: " + (", ".join(f"{k}={v}" for k, v in s["nodes"].items()) or "none"))
    typer.echo("collectives: " + (", ".join(f"{k}={v}" for k, v in s["collectives"].items()) or "none"))
    typer.echo(f"communication: {s['comm_bytes']} bytes issued over all ranks")
    if s["comm_libraries"]:
        typer.echo("communication kernels no model prices (by library): "
                   + ", ".join(f"{k}={v}" for k, v in s["comm_libraries"].items()))
    typer.echo(f"process groups: {s['group_count']}")
    compact = [g for g in s["per_graph"] if g.get("repeat_blocks")]
    if compact:
        stored = sum(g["stored_nodes"] for g in compact)
        total = sum(g["nodes"] for g in compact)
        blocks = sum(len(g["repeat_blocks"]) for g in compact)
        typer.echo(f"repeated work: {blocks} repeat blocks in {len(compact)} graphs store "
                   f"{stored} of the {total} nodes they mean")
    if s["dropped"]:
        typer.echo("dropped/guessed: " + ", ".join(f"{k}={v}" for k, v in s["dropped"].items()))
