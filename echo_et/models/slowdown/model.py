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
import math
import os
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_file
from echo_et.ir.schema import pb
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
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise EchoError(f"{where}: not an echo-et slowdown model (expected \"format\": \"{FORMAT}\")")
        try:
            model = cls(
                global_s=_finite(obj.get("global", DEFAULT_GLOBAL), "global"),
                classes={str(k): _finite(v, f"classes.{k}") for k, v in dict(obj.get("classes", {})).items()},
                kernels={str(k): _finite(v, f"kernels.{k}") for k, v in dict(obj.get("kernels", {})).items()},
                max_factor=_finite(obj.get("max_factor", 8.0), "max_factor"),
                source=str(obj.get("source", "")),
                fit=dict(obj.get("fit", {})),
            )
        except (TypeError, ValueError) as e:
            raise EchoError(f"{where}: {e}") from None
        if model.max_factor < 1.0:
            raise EchoError(f"{where}: max_factor must be >= 1 (got {model.max_factor})")
        return model

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SlowdownModel:
        try:
            with open(path, encoding="utf-8") as f:
                obj = json.load(f)
        except json.JSONDecodeError as e:
            raise EchoError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        except UnicodeDecodeError:
            raise EchoError(f"{path}: not a text file") from None
        return cls.from_json(obj, str(path))


def _finite(v: Any, what: str) -> float:
    x = float(v)
    if not math.isfinite(x):
        raise ValueError(f"{what} is not a finite number")
    return x


def default_model() -> SlowdownModel:
    return SlowdownModel()
