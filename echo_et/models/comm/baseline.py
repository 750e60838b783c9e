"""The plain alpha-beta baseline the white-box model is compared with:
``time = alpha + beta x log2(ranks) + bytes / bandwidth`` (3 parameters), fitted to the same
samples with the same loss (log space, soft-L1)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
    def fit(cls, samples: Sequence[Sample]) -> AlphaBeta:
        meas = np.log(np.array([s.time_us for s in samples]))

        def residuals(th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with np.errstate(all="ignore"):
                r = np.log(cls(*np.exp(th)).predict(samples)) - meas
            return r, np.zeros(0)

        theta, _ = robust_least_squares(residuals, np.log(np.array([10.0, 10.0, 50.0])))
        return cls(*(float(math.exp(t)) for t in theta))
