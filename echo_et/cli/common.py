"""What every verb shares: error handling, ``--json`` output and job loading."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from echo_et.errors import EchoError, OptionError

F = TypeVar("F", bound=Callable[..., Any])

JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON object on stdout.")
GPN_HELP = "GPUs per node of the target cluster (a world size must fill whole nodes)."


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, exit ``code``: how every verb reports bad input."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def guarded(fn: F) -> F:
    """Turn EchoError (and unreadable-input errors) into a one-line message and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EchoError as e:
            fail(error_line(e))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
            fail(f"{e.filename}: {e.strerror}")
        except KeyboardInterrupt:
            fail("interrupted", 130)

    return wrapper  # type: ignore[return-value]


# Library option names whose flag is not simply "--" + the name with dashes.
FLAG_OF_OPTION = {"format": "--from"}


def flag_of(option: str) -> str:
    """The command-line flag for a library option name (``gpus_per_node`` -> ``--gpus-per-node``)."""
    return FLAG_OF_OPTION.get(option, "--" + option.replace("_", "-"))


def error_line(e: EchoError) -> str:
    """The one line a verb prints for ``e``; an option error is prefixed with its flag, the
    library's errors speak of values and the CLI says which option held the value."""
    line = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{flag_of(e.option)}: {line}" if isinstance(e, OptionError) else line


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def load_job_arg(path: Path, fmt: str | None = None):
    """A Job from a Job directory or any readable trace (converted on the fly)."""
    from echo_et.converters import ReadOptions, read

    return read([path], fmt, ReadOptions())
