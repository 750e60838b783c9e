"""What both sweeps (`sweep JOB`, `sweep --configs`) share on the command line: --resume,
--max-memory, the row log in the output folder, and how a sweep with failed rows ends."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from echo_et.experiments.row_log import LogHeader, RowLog

ResumeOpt = typer.Option(False, "--resume",
                         help="Skip the rows already done in OUTDIR (its rows.jsonl) and run only the rest; "
                              "refused when OUTDIR was written for another input or other options.")
MaxMemoryOpt = typer.Option(None, "--max-memory", metavar="SIZE",
                            help="Memory budget of each worker, e.g. 8GB or 8GiB (default: the machine's "
                                 "memory divided among the workers); a row that needs more is that row's error.")


def memory_budget(text: str | None) -> int | None:
    """Bytes of a --max-memory value (None: the default budget)."""
    from echo_et.cli.unit_opts import size_option

    return size_option(text, "max_memory", lo=1)


def open_log(output: Path, header: LogHeader, *, resume: bool, replaceable: Callable[[Path], bool],
             kind: str, noun: str) -> RowLog:
    """The row log in ``output`` (see echo_et.experiments.row_log); says on stderr how many
    rows a resumed sweep finds done."""
    from echo_et.experiments.row_log import open_row_log

    log = open_row_log(output, header, resume=resume, replaceable=replaceable, kind=kind)
    if resume:
        done = len(log.done)
        print(f"resuming: {done} of {header.rows} {noun} already done in {output}", file=sys.stderr,
              flush=True)
    elif log.replaced:
        print(f"note: starting over; {output} held {log.replaced} finished {noun} of an interrupted run "
              "of this sweep (--resume continues one)", file=sys.stderr, flush=True)
    return log


def finish(failed: int, total: int, output: Path, noun: str) -> None:
    """End a sweep: with failed rows, the last line counts them and the exit status is 1."""
    if failed:
        typer.echo(f"{failed} of {total} {noun} failed (see {output / 'results.json'})", err=True)
        raise typer.Exit(1)
