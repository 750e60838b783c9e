"""Measuring the slowdown model honestly: k-fold cross-validation grouped by kernel name.

The Echo dataset's source used one file as both training and test set; every metric here
comes from folds in which no kernel name appears on both sides, so it measures what the
model does on kernels it never saw.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from echo_et.models.slowdown.fit import Sample, fit
from echo_et.models.slowdown.model import SlowdownModel


def predict_ns(model: SlowdownModel, x: Sample) -> float:
    return x.isolated_ns * model.factor_for(x.name, x.kernel_class, x.overlap)


def grouped_folds(samples: list[Sample], k: int = 5) -> list[int]:
    """Fold of each sample, keeping every kernel name (``Sample.group``) in one fold; folds
    are balanced greedily by size (largest group first), deterministic."""
    sizes: dict[str, int] = defaultdict(int)
    for x in samples:
        sizes[x.group] += 1
    k = max(2, min(k, len(sizes)))
    load = [0] * k
    fold_of: dict[str, int] = {}
    for g, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        f = min(range(k), key=lambda i: (load[i], i))
        fold_of[g] = f
        load[f] += n
    return [fold_of[x.group] for x in samples]


def error_metrics(pred: np.ndarray, obs: np.ndarray, folds: np.ndarray | None = None) -> dict[str, float]:
    """Per-kernel relative error shares and MAPE, and the error of the summed time (overall
    and, with folds, the mean absolute per-fold value)."""
    rel = np.abs(pred - obs) / obs
    out = {
        "within_5pct": float(np.mean(rel <= 0.05)),
        "within_10pct": float(np.mean(rel <= 0.10)),
        "within_15pct": float(np.mean(rel <= 0.15)),
        "mape_pct": float(100 * np.mean(rel)),
        "sum_error_pct": float(100 * (pred.sum() - obs.sum()) / obs.sum()),
    }
    if folds is not None:
        vals = [abs(pred[folds == f].sum() - obs[folds == f].sum()) / obs[folds == f].sum()
                for f in np.unique(folds)]
        out["fold_sum_abs_error_pct"] = float(100 * np.mean(vals))
    return {k: round(v, 4) for k, v in out.items()}


def cross_validated_predictions(samples: list[Sample], folds: int = 5, *,
                                prior: SlowdownModel | None = None) -> dict[str, np.ndarray] | None:
    """Each sample's duration predicted by a model fitted without its kernel name (grouped
    k-fold): ``observed``, ``isolated``, ``model`` (fitted per class/kernel), ``constant``
    (one time-weighted ``s``), ``overlapped`` (mask) and ``fold``, one entry per sample.
    None when fewer than two kernel names overlapped."""
    groups = {x.group for x in samples if x.overlap > 0}
    if len(groups) < 2:
        return None
    fold = np.array(grouped_folds(samples, folds))
    obs = np.array([x.observed_ns for x in samples], dtype=float)
    iso = np.array([x.isolated_ns for x in samples], dtype=float)
    ov = np.array([x.overlap > 0 for x in samples])
    pred_m = np.zeros(len(samples))
    pred_c = np.zeros(len(samples))
    for f in sorted(set(fold.tolist())):
        train = [x for x, k in zip(samples, fold, strict=True) if k != f]
        test = np.flatnonzero(fold == f)
        if not any(x.overlap > 0 for x in train):
            pred_m[test] = pred_c[test] = [samples[i].isolated_ns for i in test]
            continue
        m = fit(train, prior=prior)
        c = SlowdownModel(global_s=fit(train, per_kernel=False).global_s, classes={}, kernels={}, max_factor=1e9)
        pred_m[test] = [predict_ns(m, samples[i]) for i in test]
        pred_c[test] = [predict_ns(c, samples[i]) for i in test]
    return {"observed": obs, "isolated": iso, "model": pred_m, "constant": pred_c, "overlapped": ov, "fold": fold}


def cross_validate(samples: list[Sample], folds: int = 5, *, prior: SlowdownModel | None = None) -> dict[str, Any]:
    """Grouped k-fold error of the fitted model and of a constant factor (one time-weighted
    ``s`` for every kernel), over overlapped kernels. Empty when fewer than two kernel
    names overlapped."""
    p = cross_validated_predictions(samples, folds, prior=prior)
    if p is None:
        return {}
    ov, fold, obs = p["overlapped"], p["fold"], p["observed"]
    return {
        "folds": int(len(set(fold.tolist()))),
        "grouped_by": "kernel name",
        "overlapped": int(ov.sum()),
        "model": error_metrics(p["model"][ov], obs[ov], fold[ov]),
        "constant": error_metrics(p["constant"][ov], obs[ov], fold[ov]),
    }
