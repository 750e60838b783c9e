"""What ``--help`` shows: for every option a metavar that says what to type, and the presets.

typer prints an option's Python type (``<int>``, ``<list[str]>``, ``<bool>``) unless it has a
metavar. Rather than repeat one on each of the verbs' ~130 declarations, the metavars live
here, in one table by flag (with a few per-verb exceptions), applied to every command when
the app is built (:func:`polish`); an option missing from the table gets one from its type
(``N``, ``X``, ``PATH``, ``TEXT``). Flags (``--json``, ``--no-slowdown``, ``--help``) show none.
``tests/test_first_run.py`` checks that no option of any verb shows a Python type or lacks
help text.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

METAVARS: dict[str, str] = {
    "--output": "PATH", "--from": "FORMAT", "--rank": "RANK", "--step": "N", "--host-et": "PATH",
    "--world-size": "N", "--gpus-per-node": "G", "--layout": "LAYOUT", "--dp": "N", "--pp": "N",
    "--tp": "N", "--microbatches": "N", "--zero": "STAGE", "--a2a": "POLICY", "--bucket-mb": "MiB",
    "--first-bucket-mb": "MiB", "--param-bytes": "SIZE", "--mode": "MODE", "--profile": "PATH",
    "--preset": "NAME", "--executor": "NAME", "--workers": "N", "--address": "URL", "--ranks": "RANKS",
    "--workload": "NAME", "--script": "FILE.py:FN", "--layers": "N", "--hidden": "N", "--heads": "N",
    "--seq": "N", "--micro-batch": "N", "--vocab": "N", "--dtype": "DTYPE", "--device": "DEVICE",
    "--verify": "sample|all", "--warmup": "N", "--steps": "N", "--memory-limit": "SIZE", "--name": "NAME",
    "--bytes": "SIZE", "--slowdown": "PATH", "--timeline": "PATH", "--compute-scale": "FACTOR",
    "--intra-bw": "RATE", "--inter-bw": "RATE", "--straggler": "RANK:FACTOR", "--latency": "NS",
    "--topology": "TOPOLOGY", "--splits": "N", "--collective": "NAME", "--folds": "N",
    "--timeline-rank": "RANK", "--plot": "FILE.png",
}
# (verb, flag) -> metavar where a verb reads the flag differently.
VERB_METAVARS: dict[tuple[str, str], str] = {
    ("sweep", "--dp"): "N,N,...", ("sweep", "--pp"): "N,N,...", ("sweep", "--microbatches"): "N,N,...",
    ("sweep", "--profile"): "PATH", ("chakra", "--output"): "PREFIX", ("estimate", "--ranks"): "N",
}
_BY_TYPE = {int: "N", float: "X", str: "TEXT", Path: "PATH"}


def _preset_names() -> list[str]:
    folder = Path(__file__).resolve().parents[1] / "models" / "comm" / "presets"
    return sorted(p.stem for p in folder.glob("*.json"))


def _metavar(verb: str, param: Any) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    for flag in longs:
        if (verb, flag) in VERB_METAVARS:
            return VERB_METAVARS[(verb, flag)]
        if flag in METAVARS:
            return METAVARS[flag]
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return _BY_TYPE.get(annotation, "VALUE")


def _describe(verb: str, param: Any) -> None:
    if getattr(param, "param_type_name", "") == "argument":
        # The argument's name (JOB, INPUTS...) says what to give; typer would add its type.
        param.display_type_rich = lambda ctx: None
        return
    if getattr(param, "is_flag", False):
        param.metavar = ""
        return
    if param.metavar is None:
        param.metavar = _metavar(verb, param)
    if "--preset" in param.opts and param.help and "Presets:" not in param.help:
        param.help = f"{param.help.rstrip()} Presets: {', '.join(_preset_names())}."


class _QuietHelp:
    def get_help_option(self, ctx):  # type: ignore[no-untyped-def]
        opt = super().get_help_option(ctx)  # type: ignore[misc]
        if opt is not None:
            opt.metavar = ""
        return opt


class EchoCommand(_QuietHelp, TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            _describe(self.name or "", p)


class EchoGroup(_QuietHelp, TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            _describe(self.name or "", p)


def one_line_summary(text: str) -> str:
    """The first paragraph of a help text on one line: in rich markup mode typer keeps the
    docstring's line breaks in a group's command list, so a wrapped docstring showed there
    as ragged lines."""
    first = inspect.cleandoc(text).split("\n\n")[0]
    return " ".join(first.split())


def polish(app: typer.Typer) -> None:
    """Give every command and group of ``app`` (recursively) the classes above, and each
    command a one-line summary for its group's list."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = EchoCommand
        text = info.help or inspect.getdoc(info.callback) or ""
        if info.short_help is None and text:
            info.short_help = one_line_summary(text)
    for group in app.registered_groups:
        sub = group.typer_instance
        if sub is not None:
            if group.cls is None or not isinstance(group.cls, type):
                group.cls = EchoGroup
            polish(sub)
