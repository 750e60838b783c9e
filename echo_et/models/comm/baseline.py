"""The alpha-beta baselines the white-box model is compared with, fitted to the same samples
with the same loss (log space, soft-L1):

- :class:`AlphaBeta`: one line ``alpha + beta x log2(ranks) + bytes / bandwidth`` (3
  parameters) across every sample;
- :class:`TieredBaseline`: such a line per collective and tier (one GPU, one node, several
  nodes), so that NVLink and the network, a local copy and a multi-node tree each get their
  own latency and bandwidth; ``beta`` only where a tier's samples span several group sizes.
  A held-out sample whose collective or tier the fitted samples lack falls back to the
  tier's line over every collective, then to the single line."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from echo_et.models.comm.fit import Sample, robust_least_squares


@dataclass(frozen=True)
class AlphaBeta:
    alpha_us: float
    beta_us: float          # per doubling of the group
    bandwidth_gbps: float

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        n = np.array([s.placement.ranks for s in samples], dtype=float)
        S = np.array([s.nbytes for s in samples], dtype=float)
        return self.alpha_us + self.beta_us * np.log2(n) + S / self.bandwidth_gbps * 1e-3

    @classmethod
    def fit(cls, samples: Sequence[Sample], with_beta: bool = True) -> AlphaBeta:
        meas = np.log(np.array([s.time_us for s in samples]))

        def make(th: np.ndarray) -> AlphaBeta:
            e = np.exp(th)
            return cls(e[0], e[1], e[2]) if with_beta else cls(e[0], 0.0, e[1])

        def residuals(th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with np.errstate(all="ignore"):
                r = np.log(make(th).predict(samples)) - meas
            return r, np.zeros(0)

        start = np.log(np.array([10.0, 10.0, 50.0] if with_beta else [10.0, 50.0]))
        theta, _ = robust_least_squares(residuals, start)
        return make(np.array([float(t) for t in theta]))


def tier(sample: Sample) -> str:
    """``one_gpu``, ``one_node`` or ``nodes``."""
    if sample.placement.ranks == 1:
        return "one_gpu"
    return "nodes" if sample.placement.multi_node else "one_node"


@dataclass(frozen=True)
class TieredBaseline:
    lines: dict[tuple[str, str], AlphaBeta] = field(default_factory=dict)   # (collective, tier)
    tiers: dict[str, AlphaBeta] = field(default_factory=dict)
    overall: AlphaBeta | None = None

    def line(self, sample: Sample) -> AlphaBeta:
        t = tier(sample)
        got = self.lines.get((sample.coll, t)) or self.tiers.get(t) or self.overall
        assert got is not None
        return got

    def predict(self, samples: Sequence[Sample]) -> np.ndarray:
        return np.array([float(self.line(s).predict([s])[0]) for s in samples])

    @classmethod
    def fit(cls, samples: Sequence[Sample]) -> TieredBaseline:
        by_line: dict[tuple[str, str], list[Sample]] = defaultdict(list)
        by_tier: dict[str, list[Sample]] = defaultdict(list)
        for s in samples:
            by_line[(s.coll, tier(s))].append(s)
            by_tier[tier(s)].append(s)

        def one(group: list[Sample]) -> AlphaBeta:
            return AlphaBeta.fit(group, with_beta=len({s.placement.ranks for s in group}) > 1)

        return cls({k: one(v) for k, v in sorted(by_line.items())},
                   {k: one(v) for k, v in sorted(by_tier.items())}, AlphaBeta.fit(samples))



