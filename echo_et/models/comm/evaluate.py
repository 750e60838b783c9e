"""Prediction error against measured nccl-tests runs: per run and per size band, in sample
and leave-one-log-out, side by side with the alpha-beta baseline fitted per collective and
tier (one GPU, one node, several nodes) and the single alpha-beta line across all."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from echo_et.errors import EchoError
from echo_et.models.comm import nccl
from echo_et.models.comm.baseline import AlphaBeta, TieredBaseline
from echo_et.models.comm.calibrate import fit_profile, samples_from_runs, spec_network
from echo_et.models.comm.fit import Sample, predict_samples
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.nccl_tests import Run
from echo_et.models.comm.profile import Profile

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


def fit_and_baseline(samples: Sequence[Sample], base: Profile, gpus_per_node: int, nccl_version: str | None
                     ) -> tuple[Profile, tuple[TieredBaseline, AlphaBeta]]:
    """The white-box profile and the baselines (per tier and collective; one line), all
    fitted to ``samples``."""
    prof, _ = fit_profile(samples, [], base, gpus_per_node, f"{base.name}-calibrated", nccl_version)
    return prof, (TieredBaseline.fit(samples), AlphaBeta.fit(samples))


def _compare(prof: Profile, baselines: tuple[TieredBaseline, AlphaBeta], samples: Sequence[Sample]
             ) -> dict[str, Any]:
    ours = evaluate_samples(samples, lambda s: predict_samples(prof.params, s, prof.nccl))
    return {"model": ours, "baseline": evaluate_samples(samples, baselines[0].predict),
            "baseline_one_line": evaluate_samples(samples, baselines[1].predict)}


def cross_validate(runs: Sequence[Run], gpus_per_node: int, base: Profile, nccl_version: str | None = "auto",
                   held_out: Sequence[int] | None = None) -> dict[str, Any]:
    """In-sample errors (fit on every run, predict each) and leave-one-log-out errors (fit on
    all runs but one, predict that one) of the white-box model and the baselines.

    ``held_out``: indices of the runs to leave out in turn (default: every multi-node run, or
    every run when none spans nodes). The NCCL release (``"auto"``) is chosen on each fit's
    own training runs, never on the held-out one."""
    if not runs:
        raise EchoError("no nccl-tests runs to evaluate")
    per_run = [samples_from_runs([r], gpus_per_node)[0] for r in runs]
    for run, s in zip(runs, per_run, strict=True):
        if not s:
            raise EchoError(f"{run.source}: no usable measurements")
    labels = [r.source + (f"#{r.index + 1}" if r.index else "") for r in runs]
    # A preset whose network was measured on logs like these would carry a held-out log into
    # the fits of the others: every fit starts from the spec-sheet network.
    base = spec_network(base)
    if held_out is None:
        multi = [i for i, s in enumerate(per_run) if s[0].placement.multi_node]
        held_out = multi or list(range(len(runs)))
    all_samples = [x for s in per_run for x in s]
    prof, baseline = fit_and_baseline(all_samples, base, gpus_per_node, nccl_version)
    out: dict[str, Any] = {"nccl_version": nccl_version or base.nccl.version, "in_sample": [], "leave_one_out": [],
                           "profiles": {"in_sample": prof}}
    for label, s in zip(labels, per_run, strict=True):
        out["in_sample"].append({"log": label, "collective": s[0].coll, "ranks": s[0].placement.ranks,
                                 "nodes": s[0].placement.nodes,
                                 "fitted_on": labels, "nccl": prof.nccl.version, **_compare(prof, baseline, s)})
    if len(runs) < 2:
        return out
    for i in held_out:
        train = [x for j, s in enumerate(per_run) if j != i for x in s]
        p, b = fit_and_baseline(train, base, gpus_per_node, nccl_version)
        out["profiles"][labels[i]] = p
        s = per_run[i]
        out["leave_one_out"].append({"log": labels[i], "collective": s[0].coll, "ranks": s[0].placement.ranks,
                                     "nodes": s[0].placement.nodes,
                                     "fitted_on": [lab for j, lab in enumerate(labels) if j != i],
                                     "nccl": p.nccl.version, **_compare(p, b, s)})
    return out
