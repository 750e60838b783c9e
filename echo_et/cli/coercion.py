"""Coercion of the CLI's plain parameter values without pydantic (start-up speed).

typer 0.29 coerces every parameter value through a pydantic ``TypeAdapter`` it builds on the
parameter's first use. Importing pydantic and building the adapters of one command costs
about 0.14 s of CPU on every start (a tenth of ``echo-et convert`` on a 47 MiB host trace,
``benchmarks/ingest_host_et.py``). The CLI's parameters are all plain (``str``, ``int``,
``float``, ``bool``, ``Path`` and lists of them, without any constraint for typer to check:
numeric bounds are checked by ``common.guarded``), and almost every value is one the adapter
would return unchanged or convert the obvious way: an argv string of decimal digits to an
``int``, a path string to a ``Path`` after typer's own check that an existing path is
readable. Those values are converted here. Anything else (a value the adapter would refuse
or reshape, a parameter with typer options this module does not know) goes to typer's own
coercion, built the first time it is needed: the same values and the same error messages,
with pydantic imported only then. ``tests/test_cli_coercion.py`` compares both on each kind.

On a typer that does not coerce through pydantic (before 0.2x), :func:`install` does nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

import typer.core

try:  # typer >= 0.2x: runtime coercion objects (older typers coerce through click types)
    from typer._coercion import RuntimeParam
except ImportError:  # pragma: no cover - an older typer: nothing to replace
    RuntimeParam = None  # type: ignore[assignment,misc]

_MISS: Any = object()   # "not a plain case": typer's own coercion decides
# Decimal integers and decimals whose value int() / float() give exactly as pydantic does
# (no sign '+', no leading zeros, no blanks or '_', no exponent: those go to pydantic).
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?")
# typer's parameter options, at the values under which the plain conversions below are
# exactly typer's: no parser, no bounds, and for paths no checks beyond "readable if it exists".
_PLAIN_INFO = {"parser": None, "min": None, "max": None, "clamp": False, "exists": False,
               "file_okay": True, "dir_okay": True, "readable": True, "writable": False,
               "resolve_path": False, "allow_dash": False, "path_type": None}


def _as_str(v: Any) -> Any:
    return v if type(v) is str else _MISS


def _as_bool(v: Any) -> Any:
    return v if type(v) is bool else _MISS


def _as_int(v: Any) -> Any:
    if type(v) is int:
        return v
    if type(v) is str and _INT.fullmatch(v):
        return int(v)
    return _MISS


def _as_float(v: Any) -> Any:
    if type(v) is float:
        return v
    if type(v) is str and _FLOAT.fullmatch(v):
        return float(v)
    return _MISS


def _as_path(v: Any) -> Any:
    if type(v) is str and "\x00" not in v:
        p = Path(v)
    elif isinstance(v, Path):
        p = v
    else:
        return _MISS
    try:
        os.stat(p)
    except OSError:   # typer takes a path that does not exist as it is
        return p
    except ValueError:
        return _MISS
    return p if os.access(p, os.R_OK) else _MISS   # unreadable: typer's error message


_LEAVES: dict[Any, Callable[[Any], Any]] = {
    str: _as_str, bool: _as_bool, int: _as_int, float: _as_float, Path: _as_path,
}


def plain_converter(annotation: Any, parameter_info: Any) -> Callable[[Any], Any] | None:
    """The plain conversion of a parameter (returns ``_MISS`` for values it leaves to typer),
    or None when the parameter is not plain."""
    for name, default in _PLAIN_INFO.items():
        if getattr(parameter_info, name, _MISS) != default:
            return None
    leaf = _LEAVES.get(annotation)
    if leaf is not None:
        return leaf
    args = get_args(annotation)
    if get_origin(annotation) is list and len(args) == 1 and args[0] in _LEAVES:
        item = _LEAVES[args[0]]

        def as_list(v: Any) -> Any:
            if type(v) is not list and type(v) is not tuple:
                return _MISS
            out = [item(x) for x in v]
            return _MISS if any(x is _MISS for x in out) else out

        return as_list
    return None


if RuntimeParam is not None:
    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """typer's runtime coercion of one plain parameter: the plain conversion, else
        typer's own (built on first need)."""

        convert: Callable[[Any], Any]
        typer_param: Callable[[], Any]
        built: list = field(default_factory=list)   # typer's own, once built

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            got = self.convert(value)
            if got is not _MISS:
                return got
            if not self.built:
                self.built.append(self.typer_param())
            return self.built[0]._coerce_value(value, param=param, ctx=ctx)


def install() -> bool:
    """Route the plain parameters of every typer command built from now on through
    :class:`PlainParam`; True when this typer coerces that way (idempotent)."""
    original = getattr(typer.core, "build_runtime_param", None)
    if RuntimeParam is None or original is None:
        return False
    if getattr(original, "echo_et_plain", False):
        return True

    def build_runtime_param(descriptor: Any) -> Any:
        convert = None
        if getattr(descriptor, "file_annotation", None) is None:
            convert = plain_converter(descriptor.annotation, descriptor.parameter_info)
        if convert is None:
            return original(descriptor)
        return PlainParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                          convert=convert, typer_param=lambda: original(descriptor))

    build_runtime_param.echo_et_plain = True  # type: ignore[attr-defined]
    typer.core.build_runtime_param = build_runtime_param
    return True
