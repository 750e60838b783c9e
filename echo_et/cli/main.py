"""Entry point: builds the typer app from the verb modules."""

from __future__ import annotations

import importlib
import signal
import sys

import typer

from echo_et import __version__
from echo_et.cli import coercion
from echo_et.cli.common import OneLineErrors
from echo_et.cli.helptext import EchoGroup, polish


class RootGroup(OneLineErrors, EchoGroup):
    """The root command: readable help (EchoGroup) and one-line usage errors (OneLineErrors)."""


def _new_app() -> typer.Typer:
    return typer.Typer(
        name="echo-et",
        help="Execution graphs of distributed training: ingest, trace, rewrite, simulate, export.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        cls=RootGroup,
    )


coercion.install()   # plain parameter values without pydantic (start-up speed)
app = _new_app()

# Each module defines register(app). Keep one line per module.
_VERB_MODULES = [
    "echo_et.cli.job_cmds",     # convert, check, inspect
    "echo_et.cli.export_cmds",  # export chakra|astra-sim|chrome|graphml
    "echo_et.cli.pass_cmds",
    "echo_et.cli.trace_cmds",   # trace (ex-situ)
    "echo_et.cli.comm_cmds",    # estimate, calibrate nccl-tests|trace|evaluate
    "echo_et.cli.sim_cmds",     # simulate, validate, calibrate slowdown
    "echo_et.cli.predict_cmds",  # predict (a model configuration to a GPU step)
    "echo_et.cli.compute_cmds",  # calibrate compute
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"echo-et {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """echo-et: execution graphs of distributed training jobs."""


app.callback()(_root)
for _name in _VERB_MODULES:
    importlib.import_module(_name).register(app)
polish(app)


def app_for(argv: list[str]) -> typer.Typer:
    """The app that runs ``argv``: when it names a plain command first, an app holding only
    that command (typer builds the click command of every registered command on each start,
    a twentieth of a second here); otherwise the whole app (groups, help, unknown verbs)."""
    if argv:
        infos = [c for c in app.registered_commands if c.name == argv[0]]
        if len(infos) == 1:
            one = _new_app()
            one.callback()(_root)
            one.registered_commands.append(infos[0])
            return one
    return app


def _terminate(signum: int, frame) -> None:
    # SIGTERM unwinds like Ctrl-C, so temporary outputs are removed on the way out.
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    app_for(sys.argv[1:])()


if __name__ == "__main__":
    main()
