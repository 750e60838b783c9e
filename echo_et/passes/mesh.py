"""The rank mesh of a DP x TP x PP job: which global rank holds which (tp, dp, pp) coordinate.

Megatron-LM (and DeepSpeed's pipe-data-model topology) number ranks with tensor parallelism
fastest, then data parallelism, then pipeline parallelism:

    rank = tp_index + tp * (dp_index + dp * pp_index)

That is the default order here ("tp-dp-pp"). Other orders (e.g. "tp-pp-dp") are supported
so that a Job traced with a different convention can be read as it is; the layout inference
detects the order from the process groups when they allow it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from echo_et.errors import EchoError

AXES = ("tp", "dp", "pp")
DEFAULT_ORDER = ("tp", "dp", "pp")  # fastest-varying first (Megatron-LM)


def parse_order(text: str) -> tuple[str, ...]:
    """'tp-dp-pp' -> ('tp', 'dp', 'pp'); every axis exactly once."""
    parts = tuple(p.strip().lower() for p in text.replace(",", "-").split("-") if p.strip())
    if sorted(parts) != sorted(AXES):
        raise EchoError(f"rank order {text!r}: name each of tp, dp, pp once (e.g. tp-dp-pp)")
    return parts


@dataclass(frozen=True)
class Mesh:
    """Axis sizes and the order in which ranks enumerate them (fastest first)."""

    tp: int
    dp: int
    pp: int
    order: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self) -> None:
        for a in AXES:
            if getattr(self, a) < 1:
                raise EchoError(f"layout: {a} must be >= 1, got {getattr(self, a)}")
        if sorted(self.order) != sorted(AXES):
            raise EchoError(f"layout: rank order {'-'.join(self.order)} must name tp, dp, pp once")

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    @functools.cached_property
    def _steps(self) -> tuple[tuple[str, int, int], ...]:
        """(axis, size, stride) in rank order."""
        out = []
        stride = 1
        for a in self.order:
            out.append((a, self.size(a), stride))
            stride *= self.size(a)
        return tuple(out)

    def coords(self, rank: int) -> dict[str, int]:
        return {a: rank // stride % n for a, n, stride in self._steps}

    def rank(self, coords: dict[str, int]) -> int:
        return sum(coords[a] * stride for a, _, stride in self._steps)

    def with_sizes(self, **sizes: int) -> Mesh:
        vals = {a: self.size(a) for a in AXES} | sizes
        return Mesh(vals["tp"], vals["dp"], vals["pp"], self.order)

    def group_ranks(self, rank: int, axes: Iterable[str]) -> list[int]:
        """Ranks that share ``rank``'s coordinates on every axis not in ``axes`` (ascending)."""
        free = [a for a in self.order if a in set(axes)]
        base = self.coords(rank)
        out = []
        for vals in itertools.product(*(range(self.size(a)) for a in free)):
            c = dict(base)
            c.update(zip(free, vals, strict=True))
            out.append(self.rank(c))
        return sorted(out)

    def groups(self, axes: Iterable[str]) -> Iterator[list[int]]:
        """Every group that varies ``axes`` (each rank in exactly one), by first rank."""
        axes = set(axes)
        seen: set[int] = set()
        for r in range(self.world):
            if r in seen:
                continue
            g = self.group_ranks(r, axes)
            seen.update(g)
            yield g

    def describe(self) -> str:
        return f"dp={self.dp},tp={self.tp},pp={self.pp} (rank order {'-'.join(self.order)}, fastest first)"
