"""Prediction error against measured nccl-tests runs, per run and per size band."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from echo_et.errors import EchoError
from echo_et.models.comm import nccl
from echo_et.models.comm.calibrate import samples_from_runs
from echo_et.models.comm.fit import Sample, predict_samples
from echo_et.models.comm.nccl_tests import Run
from echo_et.models.comm.tuning import NcclSystem

KIB, MIB = 1 << 10, 1 << 20
BANDS = (("lt_64kib", 0, 64 * KIB), ("64kib_1mib", 64 * KIB, MIB), ("ge_1mib", MIB, None))


def errors_percent(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return (pred / meas - 1.0) * 100.0


def summary(sizes: np.ndarray, err: np.ndarray) -> dict[str, Any]:
    """MAPE over all sizes and per band, and the median absolute error over 4 KiB - 1 MiB."""
    a = np.abs(err)

    def mean(mask: np.ndarray) -> float | None:
        return float(a[mask].mean()) if mask.any() else None

    mid = (sizes >= 4 * KIB) & (sizes < MIB)
    out: dict[str, Any] = {
        "sizes": int(sizes.size),
        "mape_percent": mean(np.ones_like(sizes, dtype=bool)),
        "mape_ge_1mib_percent": mean(sizes >= MIB),
        "median_4kib_1mib_percent": float(np.median(a[mid])) if mid.any() else None,
    }
    for name, lo, hi in BANDS:
        out[f"mape_{name}_percent"] = mean((sizes >= lo) & (sizes < hi) if hi else sizes >= lo)
    return out


def evaluate_samples(samples: Sequence[Sample], predict: Callable[[Sequence[Sample]], np.ndarray]
                     ) -> dict[str, Any]:
    meas = np.array([s.time_us for s in samples])
    sizes = np.array([s.nbytes for s in samples], dtype=float)
    return summary(sizes, errors_percent(predict(samples), meas))


def evaluate_runs(params: Mapping[str, float], runs: Sequence[Run], gpus_per_node: int,
                  system: NcclSystem, mode: str = "nccl") -> list[dict[str, Any]]:
    """Per run: the error summary and every size (measured, predicted, error, choice)."""
    out = []
    for run in runs:
        samples, sources = samples_from_runs([run], gpus_per_node)
        if not samples:
            raise EchoError(f"{run.source}: no usable measurements")
        pred = predict_samples(params, samples, system, mode)
        meas = np.array([s.time_us for s in samples])
        err = errors_percent(pred, meas)
        sizes = np.array([s.nbytes for s in samples], dtype=float)
        _, picks = nccl.choose(params, run.collective, sizes, samples[0].placement, system, mode)
        src = sources[0]
        report = {"log": run.source, "run": run.index + 1, "collective": run.collective,
                  "ranks": src["ranks"], "nodes": src["nodes"], **summary(sizes, err)}
        report["rows"] = [
            {"bytes": s.nbytes, "measured_us": s.time_us, "predicted_us": float(p),
             "error_percent": float(e), "algorithm": c.algorithm, "protocol": c.protocol,
             "channels": c.channels}
            for s, p, e, c in zip(samples, pred, err, picks, strict=True)
        ]
        out.append(report)
    return out
