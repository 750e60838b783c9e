"""Fitting the compute model's efficiencies to measured times.

A :class:`Sample` is a measured time and the kernels that filled it (each with a count),
plus a fixed part the compute model does not price (``offset_ns``, e.g. the exposed
communication and bubbles of a simulated iteration). With the GPU's data sheet fixed, the
model's time for a sample is

    offset + sum(count x (overhead + max(c / gemm_or_attn_eff, m / mem_eff[class])))

which, once each kernel's side of the max is known, is linear in the overhead and in the
inverse efficiencies. The fit alternates: decide each kernel's side with the current
parameters, then solve a weighted linear least-squares problem on *relative* errors
((model - measured) / measured), bounded (every efficiency in [0.02, 1] - the L2 one up to 4 -, overhead in
[0, 50 us]), until the sides stop changing. ``gemm_k_half`` is chosen on a small grid.
Priors keep unconstrained parameters sane: each efficiency is pulled (with the weight of a
thousandth of a typical sample) toward the profile it starts from, and each memory class (not the
L2-resident one; a tenth of a sample) toward a shared memory efficiency, so a class with no samples takes what the
other classes show.
Each source (kernels, layers, iterations) weighs the same in total, whatever its size.
Deterministic: same samples, same result.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.attention import is_causal
from echo_et.ir.schema import pb
from echo_et.models.compute import ops
from echo_et.models.compute.kernels import MEM_CLASSES, Kernel
from echo_et.models.compute.profile import ComputeProfile
from echo_et.models.compute.roofline import EFF_MAX, EFF_PARAMS, PARAM_DEFAULTS, SUSTAINED_PARAM, Parts, parts

PARAM_NAMES = tuple(PARAM_DEFAULTS)
# What each source may set (None: everything). Kernels measured one by one identify every
# efficiency; a handful of per-layer times only the tensor-core GEMM efficiency (GEMMs are
# most of a layer; freeing attention too lets a few inconsistent layer times drive it to
# nonsense); iterations what an iteration is most sensitive to, and the memory classes of
# unfused attention and of the optimizer step (the s x s score traffic of the batched GEMMs,
# the softmax, the fused Adam pass), which no measured kernel identifies (the shared A100
# kernels come from a flash-attention model) and which are a large part of a GPU-bound
# Megatron iteration.
LAYER_PARAMS = ("gemm_eff.tensor",)
END_TO_END_PARAMS = ("kernel_overhead_ns", "host_launch_ns", "host_collective_ns", "gemm_eff.tensor",
                     "attn_eff.fwd", "attn_eff.bwd",
                     "mem_eff.gemm_io", "mem_eff.softmax", "mem_eff.optimizer")
STAGES: tuple[tuple[str, tuple[str, ...] | None], ...] = (("kernels", None), ("layers", LAYER_PARAMS),
                                                          ("iterations", END_TO_END_PARAMS))

# The sustained tensor-core ceiling (``sustained_eff.tensor``) is identified by the layer
# samples whose tensor-core GEMMs are large: on average at least this many FLOPs per GEMM
# (0.32 ms each at the A100's data-sheet peak, long against the power controller's reaction:
# the GEMMs of GPT-175B and Llama-65B at TP8; GPT-13B's are a third of that). It is fitted
# with ``gemm_eff.tensor`` at its bound (1): the ceiling is what the largest GEMMs reach when
# the tiling model alone would run them near the data-sheet peak, as the iterations stage
# finds for the GEMMs of the measured Megatron runs. The end-to-end stage keeps it.
SUSTAINED_MIN_GEMM_FLOPS = 1e11
SUSTAINED_STARTS = (0.5,)  # a ceiling that binds nowhere has no gradient: also start from one that binds

K_HALF_GRID = (0.0, 32.0, 64.0, 128.0, 256.0)
PRIOR_SAMPLES = 0.001     # pull of each parameter toward the profile a fit starts from
SHRINK_SAMPLES = 0.1      # pull of each memory class toward the shared memory efficiency
EFF_BOUNDS = (0.02, 1.0)
OVERHEAD_BOUNDS = (0.0, 50_000.0)
HOST_LAUNCH_BOUNDS = (0.0, 200_000.0)
# fitted as times, not inverse efficiencies
_TIMES = frozenset({"kernel_overhead_ns", "host_launch_ns", "host_collective_ns"})
MAX_ROUNDS = 30
_MEM_GLOBAL = "mem_eff.*"   # shared memory efficiency the classes shrink toward (not stored)


@dataclass(frozen=True)
class Sample:
    items: tuple[tuple[Kernel, float], ...]   # (kernel, how many times it ran)
    measured_ns: float
    offset_ns: float = 0.0
    group: str = ""          # what a grouped split keeps together
    source: str = ""         # "kernels", "layers", "iterations", ...
    label: str = ""
    launches: float = 0.0    # host launches in the measured time (each costs host_launch_ns)
    comm_launches: float = 0.0   # of which communication calls (each costs host_collective_ns instead)


def sample_from_ops(calls: Iterable[tuple[Any, float]], measured_ns: float, offset_ns: float = 0.0,
                    group: str = "", source: str = "", label: str = "") -> Sample:
    """A sample from operator calls: (pb.ComputeInfo | pb.Node | layers.OpCall, count)."""
    items: list[tuple[Kernel, float]] = []
    launches = comm = 0.0
    for c, count in calls:
        if isinstance(c, pb.Node) and c.kind == pb.KIND_LAUNCH:
            if ops.is_comm_op(c.cpu.op):
                comm += float(count)
            else:
                launches += float(count)
            continue
        for k in op_kernels(c):
            items.append((k, float(count)))
    return Sample(tuple(items), float(measured_ns), float(offset_ns), group, source, label, launches, comm)


def op_kernels(c: Any) -> tuple[Kernel, ...]:
    attrs: dict[str, str] = {}
    if isinstance(c, pb.Node):
        attrs = dict(c.attrs)
        info = c.compute if c.HasField("compute") else c.cpu
        op, shapes, dtypes = (info.op or c.name), info.shapes, info.dtypes
    elif isinstance(c, pb.ComputeInfo):
        op, shapes, dtypes = c.op, c.shapes, c.dtypes
    else:
        op, shapes, dtypes, attrs = c.op, c.shapes, c.dtypes, dict(c.attrs)
    return ops.op_cost(op, shapes, dtypes, attrs.get("out_shapes", ""), is_causal(attrs)).kernels


# -- prediction ---------------------------------------------------------------------------------
def predict(sample: Sample, profile: ComputeProfile) -> float:
    p, gpu = profile.params, profile.gpu
    t = sample.offset_ns + sample.launches * p["host_launch_ns"] + sample.comm_launches * p["host_collective_ns"]
    for k, n in sample.items:
        t += n * (p["kernel_overhead_ns"] + parts(k, gpu, p, profile.fp32_matmul).time_ns(p))
    return t


# -- fitting ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitResult:
    profile: ComputeProfile
    rounds: int
    k_half: float
    objective: float


def fit(samples: Sequence[Sample], prior: ComputeProfile, *, fixed: Iterable[str] = (),
        source_weights: dict[str, float] | None = None) -> FitResult:
    """Fit ``prior``'s efficiencies and overhead to ``samples``; ``fixed`` names parameters to
    keep (e.g. ``("gemm_k_half",)``). Returns the profile with the fitted parameters."""
    samples = [s for s in samples if s.measured_ns > 0 and (s.items or s.launches)]
    if not samples:
        raise EchoError("no samples to fit the compute model on")
    fixed = set(fixed)
    grid = (prior.params["gemm_k_half"],) if "gemm_k_half" in fixed else K_HALF_GRID
    ceilings: tuple[float, ...] = (prior.params[SUSTAINED_PARAM],)
    if SUSTAINED_PARAM not in fixed and any(parts(k, prior.gpu, prior.params, prior.fp32_matmul).sp
                                            for s in samples for k, _ in s.items):
        ceilings += tuple(c for c in SUSTAINED_STARTS if c < ceilings[0])
    best: FitResult | None = None
    for kh in grid:
        for ceiling in ceilings:
            start = replace(prior, params={**prior.params, "gemm_k_half": kh, SUSTAINED_PARAM: ceiling})
            res = _fit_fixed_k(samples, start, prior, fixed, source_weights or {})
            if best is None or res.objective < best.objective - 1e-12:
                best = res
    assert best is not None
    return best


def _weights(samples: Sequence[Sample], source_weights: dict[str, float]) -> np.ndarray:
    per_source: dict[str, int] = defaultdict(int)
    for s in samples:
        per_source[s.source] += 1
    return np.array([source_weights.get(s.source, 1.0) / per_source[s.source] for s in samples])


def _fit_fixed_k(samples: Sequence[Sample], start: ComputeProfile, prior: ComputeProfile, fixed: set[str],
                 source_weights: dict[str, float]) -> FitResult:
    names = ["kernel_overhead_ns", "host_launch_ns", "host_collective_ns", *EFF_PARAMS, _MEM_GLOBAL]
    idx = {n: i for i, n in enumerate(names)}
    w = _weights(samples, source_weights)
    lam = PRIOR_SAMPLES * float(np.median(w))
    lam_shrink = SHRINK_SAMPLES * float(np.median(w))
    # Parts do not depend on the efficiencies: compute them once.
    gpu = start.gpu
    pre = [[(n, parts(k, gpu, start.params, start.fp32_matmul)) for k, n in s.items] for s in samples]
    mem_prior = float(np.mean([1.0 / prior.params[f"mem_eff.{c}"] for c in MEM_CLASSES]))
    shrunk = {f"mem_eff.{c}" for c in MEM_CLASSES}
    x0 = {n: (start.params[n] if n in _TIMES else 1.0 / start.params[n]) for n in names[:-1]}
    x0[_MEM_GLOBAL] = mem_prior
    xp = dict(x0)
    for n in names[:-1]:
        if n in fixed or n in _TIMES:
            continue
        xp[n] = 1.0 / prior.params[n]
    x = dict(x0)
    sides: list[list[str]] | None = None
    rounds = 0
    tried: list[tuple[float, int, dict[str, float]]] = []
    while rounds < MAX_ROUNDS:
        rounds += 1
        new_sides = [[_side(pt, x) for _, pt in items] for items in pre]
        if new_sides == sides:
            break
        if sides is not None:
            tried.append((_objective(samples, pre, x, w), rounds, x))
        sides = new_sides
        a = np.zeros((len(samples), len(names)))
        rhs = np.zeros(len(samples))
        for i, (s, items) in enumerate(zip(samples, pre, strict=True)):
            for (n, pt), side in zip(items, sides[i], strict=True):
                a[i, idx["kernel_overhead_ns"]] += n
                a[i, idx[side]] += n * pt.side_ns(side)
            a[i, idx["host_launch_ns"]] += s.launches
            a[i, idx["host_collective_ns"]] += s.comm_launches
            rhs[i] = s.measured_ns - s.offset_ns
            scale = math.sqrt(w[i]) / s.measured_ns
            a[i] *= scale
            rhs[i] *= scale
        prior_rows, prior_rhs = [], []
        for n in names:
            if n == _MEM_GLOBAL:
                prior_rows.append(_unit(len(names), idx[n], math.sqrt(lam) * 0.1 / mem_prior))
                prior_rhs.append(math.sqrt(lam) * 0.1)
            elif n in shrunk:
                r = _unit(len(names), idx[n], math.sqrt(lam_shrink) / mem_prior)
                r[idx[_MEM_GLOBAL]] = -math.sqrt(lam_shrink) / mem_prior
                prior_rows.append(r)
                prior_rhs.append(0.0)
            else:
                # the pull is relative to the parameter's scale: a time fitted to 0 (its
                # bound) must not pin the next fit that starts from it
                ref = max(xp[n], PARAM_DEFAULTS[n] if n in _TIMES else 1.0)
                prior_rows.append(_unit(len(names), idx[n], math.sqrt(lam) / ref))
                prior_rhs.append(math.sqrt(lam) * xp[n] / ref)
        big_a = np.vstack([a, np.array(prior_rows)])
        big_b = np.concatenate([rhs, np.array(prior_rhs)])
        x = _bounded_lstsq(big_a, big_b, names, {n: x0[n] for n in fixed if n in idx})
    else:
        # the sides never settled (a kernel whose sides swap as the parameters move, e.g. a
        # GEMM between its tile efficiency and a fixed sustained ceiling): keep the round
        # whose parameters price the samples best
        tried.append((_objective(samples, pre, x, w), rounds, x))
        x = min(tried, key=lambda t: (t[0], t[1]))[2]
    params = dict(start.params)
    for n in names[:-1]:
        if n in fixed:
            continue
        params[n] = x[n] if n in _TIMES else 1.0 / x[n]
    prof = replace(start, params=params)
    pred = np.array([predict(s, prof) for s in samples])
    meas = np.array([s.measured_ns for s in samples])
    objective = float(np.sum(w * ((pred - meas) / meas) ** 2))
    return FitResult(prof, rounds, start.params["gemm_k_half"], objective)


def _objective(samples: Sequence[Sample], pre: list, x: dict[str, float], w: np.ndarray) -> float:
    """The fit's weighted squared relative error with inverse efficiencies ``x`` (every
    kernel on its slowest side)."""
    total = 0.0
    for s, items, wi in zip(samples, pre, w, strict=True):
        t = s.offset_ns + s.launches * x["host_launch_ns"] + s.comm_launches * x["host_collective_ns"]
        for n, pt in items:
            side = _side(pt, x)
            t += n * (x["kernel_overhead_ns"] + pt.side_ns(side) * x[side])
        total += wi * ((t - s.measured_ns) / s.measured_ns) ** 2
    return total


def _side(pt: Parts, x: dict[str, float]) -> str:
    """The parameter of the binding side of a kernel's roofline under inverse efficiencies
    ``x``: compute wins a tie against memory, the sustained ceiling binds only when strictly
    slower than both."""
    best, t = pt.mp, pt.mns * x[pt.mp]
    if pt.cp and pt.cns * x[pt.cp] >= t:
        best, t = pt.cp, pt.cns * x[pt.cp]
    if pt.sp and pt.sns * x[pt.sp] > t:
        best = pt.sp
    return best


def _unit(n: int, i: int, v: float) -> np.ndarray:
    r = np.zeros(n)
    r[i] = v
    return r


def _bounds(name: str) -> tuple[float, float]:
    if name == "kernel_overhead_ns":
        return OVERHEAD_BOUNDS
    if name in ("host_launch_ns", "host_collective_ns"):
        return HOST_LAUNCH_BOUNDS
    return 1.0 / EFF_MAX.get(name, EFF_BOUNDS[1]), 1.0 / EFF_BOUNDS[0]


def _bounded_lstsq(a: np.ndarray, b: np.ndarray, names: list[str], pinned: dict[str, float]) -> dict[str, float]:
    """Least squares with box bounds by an active set: variables that leave their box are
    pinned at the bound and the rest re-solved, until all are inside."""
    pinned = dict(pinned)
    for _ in range(len(names) + 1):
        free = [i for i, n in enumerate(names) if n not in pinned]
        b_eff = b - sum((a[:, i] * pinned[n] for i, n in enumerate(names) if n in pinned), np.zeros(len(b)))
        sol, *_ = np.linalg.lstsq(a[:, free], b_eff, rcond=None)
        out = dict(pinned)
        moved = False
        for j, i in enumerate(free):
            lo, hi = _bounds(names[i])
            v = float(sol[j])
            if v < lo or v > hi:
                pinned[names[i]] = min(max(v, lo), hi)
                moved = True
            out[names[i]] = v
        if not moved:
            return out
    return {n: min(max(out[n], _bounds(n)[0]), _bounds(n)[1]) for n in names}


def calibrate(samples: Sequence[Sample], prior: ComputeProfile) -> tuple[ComputeProfile, list[dict[str, Any]]]:
    """Fit in stages, one per source (``STAGES``): each stage starts from (and is pulled
    toward) the previous stage's profile and frees only the parameters its source can
    identify. Sources not in ``STAGES`` (e.g. ``layers-excluded``) are not fitted."""
    current = prior
    done: list[dict[str, Any]] = []
    for source, free in STAGES:
        sel = [s for s in samples if s.source == source]
        if not sel:
            continue
        fixed = () if free is None else tuple(n for n in PARAM_NAMES if n not in free)
        res = fit(sel, current, fixed=fixed)
        current = res.profile
        done.append({"source": source, "samples": len(sel), "free": list(free or PARAM_NAMES),
                     "rounds": res.rounds, "k_half": res.k_half})
        if source == "layers":
            ceiling = fit_sustained(sel, current)
            if ceiling is not None:
                current = ceiling.profile
                done.append({"source": source, "samples": ceiling.samples, "free": [SUSTAINED_PARAM],
                             "pinned": {"gemm_eff.tensor": EFF_BOUNDS[1]},
                             "min_gemm_flops": SUSTAINED_MIN_GEMM_FLOPS, "rounds": ceiling.rounds,
                             "k_half": ceiling.k_half})
    if not done:
        raise EchoError("no samples to fit the compute model on")
    return current, done


def mean_tensor_gemm_flops(sample: Sample, profile: ComputeProfile) -> float:
    """FLOPs per tensor-core GEMM kernel of a sample (0 without one)."""
    flops = count = 0.0
    for k, n in sample.items:
        if parts(k, profile.gpu, profile.params, profile.fp32_matmul).sp:
            flops += n * k.flops
            count += n
    return flops / count if count else 0.0


@dataclass(frozen=True)
class CeilingFit:
    profile: ComputeProfile
    samples: int
    rounds: int
    k_half: float


def fit_sustained(samples: Sequence[Sample], profile: ComputeProfile) -> CeilingFit | None:
    """``profile`` with ``sustained_eff.tensor`` fitted to the samples whose tensor-core GEMMs
    average at least ``SUSTAINED_MIN_GEMM_FLOPS``, with ``gemm_eff.tensor`` held at its bound
    during this fit (see ``SUSTAINED_MIN_GEMM_FLOPS``); every other parameter as given. None
    when no sample has GEMMs that large."""
    sel = [s for s in samples if mean_tensor_gemm_flops(s, profile) >= SUSTAINED_MIN_GEMM_FLOPS]
    if not sel:
        return None
    pinned = replace(profile, params={**profile.params, "gemm_eff.tensor": EFF_BOUNDS[1]})
    res = fit(sel, pinned, fixed=tuple(n for n in PARAM_NAMES if n != SUSTAINED_PARAM))
    out = replace(profile, params={**profile.params, SUSTAINED_PARAM: res.profile.params[SUSTAINED_PARAM]})
    return CeilingFit(out, len(sel), res.rounds, res.k_half)


# -- evaluation ---------------------------------------------------------------------------------
def errors(samples: Sequence[Sample], profile: ComputeProfile) -> list[float]:
    """Signed relative error of each sample, in percent."""
    return [100.0 * (predict(s, profile) - s.measured_ns) / s.measured_ns for s in samples]


def summary(errs: Sequence[float]) -> dict[str, float]:
    if not errs:
        return {"n": 0}
    a = np.abs(np.array(errs))
    return {"n": len(errs), "mape_pct": float(a.mean()), "median_ape_pct": float(np.median(a)),
            "p90_ape_pct": float(np.percentile(a, 90)), "bias_pct": float(np.mean(errs))}


def leave_group_out(samples: Sequence[Sample], prior: ComputeProfile, *, key=lambda s: s.group,
                    only_source: str | None = None) -> list[tuple[Sample, float]]:
    """Held-out relative error (percent) of every sample of ``only_source`` (all when None):
    each group is predicted by :func:`calibrate` on all samples outside that group."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        if only_source is None or s.source == only_source:
            groups[key(s)].append(i)
    out: list[tuple[Sample, float]] = []
    for g in sorted(groups):
        held = set(groups[g])
        train = [s for i, s in enumerate(samples) if i not in held]
        prof = calibrate(train, prior)[0]
        for i in groups[g]:
            s = samples[i]
            out.append((s, 100.0 * (predict(s, prof) - s.measured_ns) / s.measured_ns))
    return out
