"""From measurements to a calibration profile: nccl-tests runs and traced kernels become
:class:`~echo_et.models.comm.fit.Sample` s, the fit turns them into a :class:`Profile`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir.limits import check_node_fill
from echo_et.models.comm import lut, nccl_tests
from echo_et.models.comm.fit import FitResult, Sample, calibrate
from echo_et.models.comm.nccl_releases import VERSIONS
from echo_et.models.comm.params import DEFAULTS_FROM, SPECS
from echo_et.models.comm.profile import Profile, load_preset, preset_names
from echo_et.models.comm.topology import Placement, contiguous, from_nodes
from echo_et.models.gpu_variants import comm_preset


def run_placement(run: nccl_tests.Run, gpus_per_node: int) -> Placement:
    """Where a run's ranks were: its host names when the log lists every rank, otherwise
    ranks packed onto nodes of ``gpus_per_node``. Either way the nodes are equal, as the
    collective model assumes (the node-fill rule of every verb, ``check_node_fill``, with the
    run's ranks as the world): packed ranks must fill whole nodes of ``gpus_per_node`` or fit
    in one, and hosts named by the log must each hold as many ranks, at most
    ``gpus_per_node``."""
    n = run.ranks
    if run.hosts and len(run.hosts) == n:
        per_host: dict[str, int] = {}
        for h in run.hosts.values():
            per_host[h] = per_host.get(h, 0) + 1
        host, most = max(per_host.items(), key=lambda kv: kv[1])
        if most > gpus_per_node:
            raise OptionError("gpus_per_node", f"{run.source}: {most} ranks ran on {host}, more than "
                              f"{gpus_per_node} GPUs per node")
        fewest_host, fewest = min(per_host.items(), key=lambda kv: kv[1])
        if fewest != most:
            raise EchoError(f"{run.source}: its {n} ranks ran on hosts of unequal size ({most} on {host}, "
                            f"{fewest} on {fewest_host}); the collective model assumes equal nodes")
        return from_nodes([run.hosts[r] for r in range(n)])
    try:
        check_node_fill(n, gpus_per_node)
    except OptionError as e:
        raise OptionError(e.option, f"{run.source}: {e}") from None
    return contiguous(n, gpus_per_node)


def samples_from_runs(runs: Sequence[nccl_tests.Run], gpus_per_node: int
                      ) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Samples of every run, and one source record per run for the profile."""
    samples: list[Sample] = []
    sources: list[dict[str, Any]] = []
    for run in runs:
        pl = run_placement(run, gpus_per_node)
        label = run.source + (f"#{run.index + 1}" if run.index else "")
        ms, dropped, outliers = nccl_tests.measurements(run)
        # One thread launching g GPUs bounds an iteration by g launches; MPI runs launch one.
        host = run.gpus_per_thread
        samples += [Sample(run.collective, m.ir_bytes, pl, m.time_us, host, label) for m in ms]
        sources.append({
            "kind": "lut" if tuple(run.columns) == lut.COLUMNS else "nccl-tests", "file": run.source,
            "run": run.index + 1, "sha256": run.sha256,
            "collective": run.collective, "ranks": pl.ranks, "nodes": pl.nodes,
            "gpus_per_thread": run.gpus_per_thread, "samples": len(ms),
            "dropped_sizes": dropped, "dropped_warmup_times": outliers,
            **({"nccl_stated": run.nccl_version} if run.nccl_version else {}),
            **({"missing_sizes": list(run.missing_sizes)} if run.missing_sizes else {}),
        })
    return samples, sources


def default_preset(gpu_names: Iterable[str]) -> str:
    """The collective preset of the GPU the logs or traces name, matched exactly by variant
    (:mod:`echo_et.models.gpu_variants`, as ``--gpu`` is); ``a100-ib`` when none is named.

    A name that is no known variant is refused with the known names (``H100 PCIe`` is not an
    SXM5 node, as substring matching took it to be); a PCIe board, which no preset models, is
    refused saying so; GPUs of different node types in one calibration are refused."""
    names = sorted({n.strip() for n in gpu_names if n and n.strip()})
    if not names:
        return "a100-ib"
    presets = preset_names()
    chosen = {n: comm_preset(n, presets) for n in names}
    if len(set(chosen.values())) > 1:
        raise OptionError("preset", "the logs name GPUs of different node types ("
                          + ", ".join(f"{n!r} -> {p}" for n, p in chosen.items())
                          + "): calibrate each cluster apart, or name the preset to fit from")
    return chosen[names[0]]


def fit_profile(samples: Sequence[Sample], sources: Sequence[dict[str, Any]], base: Profile,
                gpus_per_node: int, name: str = "calibrated", nccl_version: str | None = None
                ) -> tuple[Profile, FitResult]:
    """Fit ``samples`` starting from preset ``base``; the profile records where it came from.

    ``nccl_version`` is the NCCL release whose choices the measurements ran (default: the
    preset's); ``"auto"`` fits once per modelled release and keeps the one whose fit explains
    the multi-node samples best (made on the fitted samples only, never on held-out ones)."""
    if any(s.placement.multi_node for s in samples):
        base = spec_network(base)
    system = base.nccl
    tried: dict[str, float] = {}
    if nccl_version == "auto":
        best: tuple[float, str, FitResult] | None = None
        for version in VERSIONS:
            r = calibrate(samples, base.params, system.with_version(version))
            tried[version] = _choice_error(r, samples)
            if best is None or tried[version] < best[0]:
                best = (tried[version], version, r)
        assert best is not None
        system, result = system.with_version(best[1]), best[2]
    else:
        if nccl_version is not None:
            system = system.with_version(nccl_version)
        result = calibrate(samples, base.params, system)
    fit = {
        "samples": result.samples,
        "mape_percent": result.mape_percent,
        "by_source": result.by_source,
        "free_parameters": result.free,
        "method": "MAP least squares in log space, soft-L1 loss (scale 0.05), log-normal "
                  "prior around the preset; single-node samples fit the intra-node "
                  "parameters, multi-node samples the network ones; each sample is timed for "
                  "the algorithm, protocol and channels NCCL " + system.version + " chooses",
    }
    if tried:
        fit["nccl_version_mape_percent"] = tried   # multi-node samples' fit error per release
    profile = Profile(
        name=name, calibrated=True, gpus_per_node=gpus_per_node, params=result.params,
        description=f"fitted from {len(sources)} source(s), starting from preset {base.name}",
        hardware=dict(base.hardware), gpu_match=base.gpu_match, base_preset=base.name,
        sources=tuple(sources), fit=fit, nccl=system,
    )
    return profile, result


def fit_runs(runs: Sequence[nccl_tests.Run], gpus_per_node: int, *, preset: str | None = None,
             name: str | None = None, nccl_version: str | None = None,
             progress: Callable[[str], None] | None = None) -> tuple[Profile, FitResult]:
    """What ``calibrate nccl-tests`` fits: the runs' samples, from ``preset`` (default: the one
    matching the GPUs the runs name), named ``<preset>-calibrated`` unless ``name`` says."""
    samples, sources = samples_from_runs(runs, gpus_per_node)
    base = load_preset(preset or default_preset(g for r in runs for g in r.gpu_names))
    if nccl_version is None:
        nccl_version = stated_release(runs)
    if progress:
        progress(f"fitting {len(samples)} measurements from {len(runs)} run(s), starting from "
                 f"preset {base.name} ...")
    return fit_profile(samples, sources, base, gpus_per_node, name or f"{base.name}-calibrated", nccl_version)


def spec_network(base: Profile) -> Profile:
    """``base`` with its network parameters at the spec-sheet values a measurement replaced
    (``fit.network.prior`` of a preset whose network was measured, see
    ``benchmarks/comm_preset_network.py``); ``base`` itself otherwise.

    A fit that has multi-node samples measures the network afresh from these values, so the
    preset's own measurement never leaks into a fit (or a held-out log) of other logs; a fit
    of one node's logs keeps the preset's measured network, which those logs cannot see."""
    net = base.fit.get("network")
    prior = net.get("prior") if isinstance(net, dict) else None
    if not isinstance(prior, dict) or not prior:
        return base
    params = dict(base.params)
    for name, value in prior.items():
        if name not in params or isinstance(value, bool) or not isinstance(value, int | float):
            raise EchoError(f"preset {base.name}: fit.network.prior names {name!r} with {value!r}, "
                            "not a parameter and a number")
        params[name] = float(value)
    for name, source in DEFAULTS_FROM.items():   # a default taken from a measured value
        if name not in prior and source in prior and base.params[name] == base.params[source]:
            params[name] = params[source]
    return replace(base, params=params)


def measured_network(runs: Sequence[nccl_tests.Run], gpus_per_node: int, base: Profile
                     ) -> tuple[dict[str, float], Profile]:
    """The network parameters ``runs`` measure, and the whole profile fitted to them (one
    node's logs set the intra-node parameters, the multi-node logs the network ones, from
    :func:`spec_network`): of it, the network stage's free parameters. What a preset's
    measured network is made of (``benchmarks/comm_preset_network.py``)."""
    samples, sources = samples_from_runs(runs, gpus_per_node)
    if not any(s.placement.multi_node for s in samples):
        raise EchoError("no run spans nodes, so none measures the network")
    profile, result = fit_profile(samples, sources, base, gpus_per_node, f"{base.name}-network",
                                  stated_release(runs))
    net = {sp.name for sp in SPECS if sp.stage == "net"}
    return {n: profile.params[n] for n in result.free if n in net}, profile


def modelled_release(stated: str) -> str:
    """The modelled NCCL release closest to ``stated`` from below (the newest whose tuning
    tables it inherits), else the oldest modelled one."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split(".") if x.isdigit())

    older = [v for v in VERSIONS if key(v) <= key(stated)]
    return max(older, key=key) if older else VERSIONS[0]


def stated_release(runs: Sequence[nccl_tests.Run]) -> str | None:
    """The modelled release for the NCCL the logs state (nccl-tests 2.13+: ``nccl-library=``
    in the header), None when none states one; logs stating different releases are an error."""
    stated = {r.nccl_version for r in runs if r.nccl_version}
    if len(stated) > 1:
        raise OptionError("nccl_version", f"the logs state different NCCL releases ({', '.join(sorted(stated))}); "
                          "fit each cluster's logs apart or name the release")
    return modelled_release(stated.pop()) if stated else None


def _choice_error(result: FitResult, samples: Sequence[Sample]) -> float:
    """What tells NCCL releases apart: the fit error on the multi-node samples (where the
    releases choose differently), or on all samples when none spans nodes."""
    multi = {s.source for s in samples if s.placement.multi_node}
    rows = [v for k, v in result.by_source.items() if k in multi] or list(result.by_source.values())
    n = sum(v["samples"] for v in rows)
    return sum(v["mape_percent"] * v["samples"] for v in rows) / n


def read_measurements(path: str | Path, collective: str | None = None) -> list[nccl_tests.Run]:
    """Runs from nccl-tests output or from a lookup table (``lut``), told apart by content."""
    if lut.is_lut(path):
        return lut.read_lut(path, collective=collective or "all_reduce")
    return nccl_tests.read_log(path, collective)
