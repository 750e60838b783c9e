"""Interval arithmetic on ns timelines (numpy): unions and how much of a span they cover."""

from __future__ import annotations

import numpy as np


def merge_intervals(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [lo, hi) as sorted disjoint intervals."""
    if lo.size == 0:
        return lo, hi
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    run_hi = np.maximum.accumulate(hi)
    new = np.ones(lo.size, dtype=bool)
    new[1:] = lo[1:] > run_hi[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], lo.size) - 1
    return lo[starts], run_hi[ends]


def covered_length(lo: np.ndarray, hi: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Length of each [s, e) covered by the sorted disjoint intervals [lo, hi)."""
    if lo.size == 0:
        return np.zeros(s.size, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(hi - lo)))

    def until(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(lo, x, side="right")  # intervals starting at or before x
        j = np.maximum(k - 1, 0)
        part = np.clip(x - lo[j], 0, hi[j] - lo[j])
        return np.where(k > 0, cum[j] + part, 0)

    return until(e) - until(s)
