"""Workloads the tracer can run without user code, and loading of a user's build function.

A :class:`Workload` is a small picklable description (so the in-situ runner can hand it to
child processes); ``build_fn()`` resolves it to a build function following the contract of
:mod:`echo_et.trace.context`.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from echo_et.errors import EchoError, OptionError
from echo_et.workloads.gpt import build_gpt
from echo_et.workloads.gpt_config import GPTConfig

__all__ = ["GPTConfig", "Workload", "build_gpt", "load_script"]


@dataclass(frozen=True)
class Workload:
    """``Workload(gpt=GPTConfig(...))`` or ``Workload(script="user.py:build_fn")``."""

    gpt: GPTConfig | None = None
    script: str | None = None

    def __post_init__(self) -> None:
        if (self.gpt is None) == (self.script is None):
            raise EchoError("workload: give exactly one of a GPT configuration or a script")

    @property
    def name(self) -> str:
        return "gpt" if self.gpt is not None else f"script:{self.script}"

    def build_fn(self) -> Callable:
        if self.gpt is not None:
            return build_gpt(self.gpt)
        assert self.script is not None
        return load_script(self.script)

    def validate(self, layout, device: str = "meta") -> None:
        if self.gpt is not None:
            self.gpt.validate(layout, device)


def load_script(spec: str) -> Callable:
    """The function named by ``path/to/user.py:function``."""
    path_s, sep, fn_name = spec.rpartition(":")
    if not sep or not path_s or not fn_name:
        raise OptionError("script", f"{spec!r}: expected path/to/file.py:function")
    path = Path(path_s)
    if not path.is_file():
        raise OptionError("script", f"{spec!r}: {path} does not exist")
    mod_name = f"echo_user_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(mod_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise OptionError("script", f"{spec!r}: cannot load {path} as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - user code: report, never a traceback
            del sys.modules[mod_name]
            raise OptionError("script", f"{spec!r}: importing {path} raised "
                            f"{type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise OptionError("script", f"{spec!r}: {path} has no function {fn_name!r}")
    return fn
