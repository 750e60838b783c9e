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
    job_path: Path = typer.Argument(..., metavar="JOB"),
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
        typer.echo(f"wrote {len(result['files'])} files with prefix {output}")
