"""The overlap-slowdown model: how much longer a compute kernel runs while communication
overlaps it.

For a kernel of isolated duration ``t`` of which a fraction ``r`` overlaps communication,
the predicted duration is ``t * (1 + s * r)`` (the form of Echo's public predictor), where
the slowdown ``s`` is looked up, most specific first: the kernel's own name (learned from a
Job or a dataset that contained it), its class (gemm, elementwise, norm, ...), a global
value. ``s`` is the *expected* extra time per unit of overlapped time, fitted time-weighted
(total extra time over total overlapped isolated time), because the simulator sums kernel
times and most kernels barely slow down while a few slow down a lot. Negative values
(measurement noise) are clipped to 0 and the factor is capped at ``max_factor``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_file
from echo_et.ir.limits import MAX_FACTOR, checked_float
from echo_et.ir.schema import pb
from echo_et.models.profile_file import read_model_json
from echo_et.models.slowdown.kernels import node_kernel_class, node_kernel_name, short_kernel_name

FORMAT = "echo-et-slowdown/1"

# Defaults per kernel class: fitted on the Echo A100 GPT-2 DDP backward kernels with
#   echo-et calibrate slowdown ../shared/data/slowdown/echo-a100-gpt2/merged_features.csv
# (whole file; its grouped cross-validation error is in docs/slowdown.md). A test refits
# them from the file and fails if they drift.
DEFAULT_GLOBAL = 0.1932
DEFAULT_CLASSES: dict[str, float] = {
    "attention": 0.0685,
    "elementwise": 0.2101,
    "embedding": 0.1757,
    "gemm": 0.0102,
    "memcpy": 0.1150,
    "norm": 3.3268,
    "other": 0.1444,
    "reduction": 0.2820,
}


@dataclass
class SlowdownModel:
    global_s: float = DEFAULT_GLOBAL
    classes: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    kernels: dict[str, float] = field(default_factory=dict)
    max_factor: float = 8.0
    source: str = "default (Echo A100 GPT-2 backward kernels)"
    fit: dict[str, Any] = field(default_factory=dict)

    def s_for(self, name: str, kernel_class: str) -> float:
        s = self.kernels.get(short_kernel_name(name)) if name else None
        if s is None:
            s = self.classes.get(kernel_class, self.global_s)
        return max(0.0, s)

    def factor_for(self, name: str, kernel_class: str, overlap_ratio: float) -> float:
        r = min(1.0, max(0.0, overlap_ratio))
        return min(self.max_factor, 1.0 + self.s_for(name, kernel_class) * r)

    def factor(self, node: pb.Node, duration_ns: int, overlap_ratio: float) -> float:
        """Multiplier on ``node``'s duration when ``overlap_ratio`` of it overlaps communication."""
        if overlap_ratio <= 0.0:
            return 1.0
        return self.factor_for(node_kernel_name(node), node_kernel_class(node), overlap_ratio)

    # -- files -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "global": round(self.global_s, 6),
            "classes": {k: round(v, 6) for k, v in sorted(self.classes.items())},
            "kernels": {k: round(v, 6) for k, v in sorted(self.kernels.items())},
            "max_factor": self.max_factor,
            "fit": self.fit,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        with atomic_file(path) as f:
            f.write((json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode())

    @classmethod
    def from_json(cls, obj: Any, where: str = "slowdown model") -> SlowdownModel:
        """A model from its JSON: ``format`` first, then every field of its type and range (a
        slowdown is a number in [-MAX_S, MAX_S], ``max_factor`` one in [1, MAX_FACTOR]), one
        line naming the field otherwise."""
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise EchoError(f"{where}: not an echo-et slowdown model (expected \"format\": \"{FORMAT}\")")
        tables = {}
        for key in ("classes", "kernels"):
            table = obj.get(key, {})
            if not isinstance(table, dict):
                raise EchoError(f"{where}: {key} must be an object of slowdowns by name, got {_shown(table)}")
            tables[key] = {k: _slowdown(v, f"{key}.{k}", where) for k, v in table.items()}
        source = obj.get("source", "")
        if not isinstance(source, str):
            raise EchoError(f"{where}: source must be a string, got {_shown(source)}")
        fit = obj.get("fit", {})
        if not isinstance(fit, dict):
            raise EchoError(f"{where}: fit must be an object, got {_shown(fit)}")
        return cls(global_s=_slowdown(obj.get("global", DEFAULT_GLOBAL), "global", where),
                   classes=tables["classes"], kernels=tables["kernels"],
                   max_factor=checked_float(obj.get("max_factor", 8.0), "max_factor", lo=1.0, hi=MAX_FACTOR,
                                            where=where),
                   source=source, fit=dict(fit))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SlowdownModel:
        return cls.from_json(read_model_json(path, str(path), "slowdown model"), str(path))


# A slowdown s makes an overlapped kernel t * (1 + s * r) long: the fitted ones are 0.01-3.3;
# beyond MAX_S a kernel is capped at max_factor anyway, so a larger s only hides a typo.
MAX_S = 1e6


def _slowdown(v: Any, what: str, where: str) -> float:
    return checked_float(v, what, lo=-MAX_S, hi=MAX_S, where=where)


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def default_model() -> SlowdownModel:
    return SlowdownModel()
