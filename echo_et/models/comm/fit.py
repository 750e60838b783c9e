"""Fitting the cost model's parameters to measured collective times.

The fit is a maximum-a-posteriori least squares in log space: residuals are
``log(predicted / measured)`` under a soft-L1 loss (robust to the odd slow measurement:
beyond ~5 % a residual counts linearly, not quadratically), plus a weak log-normal prior
that holds every parameter near its preset value unless the data say otherwise. Parameters
the data cannot identify (an inter-node latency from single-node logs) therefore stay at
the preset instead of drifting.

It runs in two stages, because the two kinds of measurement identify different parameters:

1. single-node samples fit the ``intra`` parameters (NVLink, protocols, channels, setup);
2. multi-node samples fit the ``net`` parameters (network bandwidth and latencies, tree),
   with the intra-node ones fixed; this stage starts from several points (the preset and
   deterministic perturbations of it) and keeps the best, as the choice of algorithm and
   protocol makes its objective piecewise.

A stage without samples leaves its parameters at the preset. Every step is deterministic.

How a sample's time relates to the model: a kernel time measured by a profiler is the model's
kernel time. nccl-tests, when one thread drives g > 1 GPUs, launches g kernels per iteration
back to back, so an iteration takes at least g x ``host_launch_us``; the prediction of such a
sample is a smooth maximum of the two (see :func:`predict_samples`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from echo_et.errors import EchoError
from echo_et.models.comm import nccl
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.params import OPTIONAL, P2P_PATTERNS, SPECS
from echo_et.models.comm.topology import Placement
from echo_et.models.comm.tuning import uses_nvls_tree

SOFT_L1_SCALE = 0.05      # residual (log ratio) where the loss turns linear
PRIOR_WEIGHT = 0.1        # weight of a one-sigma move away from the preset
SMOOTH_MAX_POWER = 6.0    # how sharply host-bound and kernel-bound times blend
NET_STARTS = 3
MAX_ITERATIONS = 200


@dataclass(frozen=True)
class Sample:
    """One measured collective: what ran, where, how long (us)."""

    coll: str
    nbytes: int                 # IR bytes (per-rank input)
    placement: Placement
    time_us: float
    host_gpus: int = 0          # GPUs one host thread launched per iteration; 0: a kernel time
    source: str = ""


@dataclass
class FitResult:
    params: dict[str, float]
    free: list[str] = field(default_factory=list)        # parameters the data moved
    samples: int = 0
    mape_percent: float = 0.0
    by_source: dict[str, dict[str, float]] = field(default_factory=dict)


def predict_samples(P: Mapping[str, float], samples: Sequence[Sample], system: NcclSystem,
                    mode: str = "nccl") -> np.ndarray:
    """The model's prediction of each sample's measured time (us), for what ``system``'s NCCL
    runs (``mode="nccl"``) or the fastest enabled choice (``"fastest"``)."""
    return predict_groups(P, group_samples(samples), len(samples), system, mode)


@dataclass(frozen=True)
class SampleGroup:
    """The samples of one (collective, placement, host GPUs): one vectorised model call."""

    coll: str
    placement: Placement
    host_gpus: int
    index: np.ndarray        # positions in the sample list
    nbytes: np.ndarray


def group_samples(samples: Sequence[Sample]) -> list[SampleGroup]:
    """The samples by what one model call prices; a fit groups once and prices thousands of times."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[(s.coll, s.placement, s.host_gpus)].append(i)
    return [SampleGroup(coll, pl, g, np.array(idx), np.array([samples[i].nbytes for i in idx], dtype=float))
            for (coll, pl, g), idx in groups.items()]


def predict_groups(P: Mapping[str, float], groups: Sequence[SampleGroup], n: int, system: NcclSystem,
                   mode: str = "nccl") -> np.ndarray:
    """:func:`predict_samples` on samples already grouped (``n`` of them)."""
    out = np.empty(n)
    for grp in groups:
        t, _ = nccl.choose(P, grp.coll, grp.nbytes, grp.placement, system, mode)
        if grp.host_gpus > 0:
            h = P["host_launch_us"] * grp.host_gpus
            t = (t ** SMOOTH_MAX_POWER + h ** SMOOTH_MAX_POWER) ** (1.0 / SMOOTH_MAX_POWER)
        out[grp.index] = t
    return out


def calibrate(samples: Sequence[Sample], prior: Mapping[str, float], system: NcclSystem) -> FitResult:
    """Fit the parameters to ``samples``, starting from and regularised towards ``prior``;
    what runs for each sample is what ``system``'s NCCL chooses (fixed, not fitted)."""
    if not samples:
        raise EchoError("calibrate: no measurements to fit")
    for s in samples:
        if s.time_us <= 0 or not math.isfinite(s.time_us):
            raise EchoError(f"{s.source or 'sample'}: measured time must be positive, got {s.time_us}")
        if s.nbytes < 0:
            raise EchoError(f"{s.source or 'sample'}: bytes must be >= 0, got {s.nbytes}")
    P = {k: float(v) for k, v in prior.items()}
    free: list[str] = []
    single = [s for s in samples if not s.placement.multi_node]
    multi = [s for s in samples if s.placement.multi_node]
    if single:
        names = _stage_names("intra", single)
        P = _fit_stage(single, names, P, prior, system, starts=1)
        free += names
    if multi:
        names = _stage_names("net", multi, system)
        P = _fit_stage(multi, names, P, prior, system, starts=NET_STARTS)
        free += names
    return _report(P, samples, free, system)


def _stage_names(stage: str, samples: Sequence[Sample], system: NcclSystem | None = None) -> list[str]:
    """A stage's parameters; a collective's own rates only when the stage has samples of it,
    and only when it also has samples of another collective (one collective alone sets the
    shared rates; its own factor would be the same degree of freedom); a send/recv channel's
    rate only with samples of a collective NCCL runs as send/recv; the chain's chunk only with
    samples of broadcast or reduce; the NVLS-tree's network
    efficiency only where the release runs it (multi-node all-reduce on NVLink-SHARP nodes)."""
    colls = {s.coll for s in samples}
    out = []
    for sp in SPECS:
        if sp.stage != stage:
            continue
        if sp.name in ("nvls_tree_net_eff", "nvls_tree_hop_us"):
            if system is not None and uses_nvls_tree(system) and "all_reduce" in colls:
                out.append(sp.name)
            continue
        if sp.name == "chain_chunk_bytes":   # only broadcast and reduce run the chain
            if colls & {"broadcast", "reduce"}:
                out.append(sp.name)
            continue
        if sp.name == "p2p_chan_gbps":
            if colls & set(P2P_PATTERNS):
                out.append(sp.name)
            continue
        if sp.name in OPTIONAL and (sp.name.partition(".")[2] not in colls or len(colls) < 2):
            continue
        out.append(sp.name)
    return out


def _report(P: dict[str, float], samples: Sequence[Sample], free: list[str], system: NcclSystem) -> FitResult:
    pred = predict_samples(P, samples, system)
    meas = np.array([s.time_us for s in samples])
    err = np.abs(pred / meas - 1) * 100
    by: dict[str, list[float]] = defaultdict(list)
    for s, e in zip(samples, err, strict=True):
        by[s.source].append(float(e))
    return FitResult(
        params=P, free=sorted(free), samples=len(samples), mape_percent=float(err.mean()),
        by_source={k: {"samples": len(v), "mape_percent": float(np.mean(v))} for k, v in by.items()},
    )


def _fit_stage(samples: Sequence[Sample], names: list[str], start: dict[str, float],
               prior: Mapping[str, float], system: NcclSystem, starts: int) -> dict[str, float]:
    meas = np.log(np.array([s.time_us for s in samples]))
    centre = np.array([math.log(prior[n]) for n in names])
    sigma = np.array([next(sp.sigma for sp in SPECS if sp.name == n) for n in names])
    groups = group_samples(samples)

    def residuals(th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        P = dict(start)
        P.update({n: math.exp(t) for n, t in zip(names, th, strict=True)})
        with np.errstate(all="ignore"):
            r = np.log(predict_groups(P, groups, len(samples), system)) - meas
        return r, PRIOR_WEIGHT * (th - centre) / sigma

    rng = np.random.default_rng(0)
    best: tuple[float, np.ndarray] | None = None
    for i in range(starts):
        theta0 = np.array([math.log(start[n]) for n in names])
        if i:
            theta0 = theta0 + rng.normal(0.0, 0.7, size=theta0.shape)
        theta, cost = robust_least_squares(residuals, theta0)
        if best is None or cost < best[0]:
            best = (cost, theta)
    assert best is not None
    out = dict(start)
    out.update({n: float(math.exp(t)) for n, t in zip(names, best[1], strict=True)})
    return out


Residuals = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def robust_least_squares(residuals: Residuals, theta: np.ndarray) -> tuple[np.ndarray, float]:
    """Levenberg-Marquardt on ``residuals(theta) -> (data residuals, prior residuals)``:
    soft-L1 loss on the data residuals (by iteratively reweighting), squares on the prior
    ones. Returns the parameters and the final cost."""

    def cost(r: np.ndarray, pr: np.ndarray) -> float:
        if not np.all(np.isfinite(r)):
            return math.inf
        c = SOFT_L1_SCALE
        return float((2 * c * c * (np.sqrt(1 + (r / c) ** 2) - 1)).sum() + (pr ** 2).sum())

    r, pr = residuals(theta)
    f = cost(r, pr)
    if not math.isfinite(f):
        return theta, f
    lam = 1e-2
    for _ in range(MAX_ITERATIONS):
        w = (1 + (r / SOFT_L1_SCALE) ** 2) ** -0.25
        R = np.concatenate([r * w, pr])
        J = np.empty((R.size, theta.size))
        h = 1e-5
        for j in range(theta.size):
            t2 = theta.copy()
            t2[j] += h
            r2, pr2 = residuals(t2)
            J[:, j] = (np.concatenate([r2 * w, pr2]) - R) / h
        J[~np.isfinite(J)] = 0.0
        A, g = J.T @ J, J.T @ R
        improved = False
        step = np.zeros_like(theta)
        while lam < 1e8:
            step = -np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-9), g)
            r2, pr2 = residuals(theta + step)
            f2 = cost(r2, pr2)
            if f2 < f:
                theta, r, pr, f = theta + step, r2, pr2, f2
                lam = max(lam / 3, 1e-7)
                improved = True
                break
            lam *= 4
        if not improved or np.abs(step).max() < 1e-6:
            break
    return theta, f
