"""Fit the compute model's end-to-end parameters to measured training iterations.

A measured iteration time is the length of the step's critical path, and that path depends on
the parameters: an iteration is bound by the GPU, or (small models, small micro-batches) by
the host issuing its kernels one by one. So every configuration is simulated once under two
*bounding* models made from the prior alone (:func:`bound_samples`):

- ``gpu``: the prior with a free host (every kernel issued at once): the GPU-bound path;
- ``host``: the prior with a host so slow (1 ms per operator) that the GPU never binds: the
  host-bound path (issue chain, and the syncs where the host waits for the device).

Each gives the operators on its critical path with their counts and the rest of the path
(communication, waits) in ns. A configuration's time under parameters ``p`` is then taken as
the longer of its two paths re-priced with ``p`` (:func:`path_ns`). :func:`fit_iterations`
alternates: fit ``p`` with ``echo_et.models.compute.fit_end_to_end`` on each configuration's
currently longer path, re-choose, until the choice settles; as that finds a local optimum it
starts from several choices (the longer path under the prior with a host issue time of 5 to
80 us) and keeps the fit with the smallest training error. Predictions are then made by the
full simulation with the fitted model (the two paths only steer the fit).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir.schema import pb

HOST_STARTS_NS = (5e3, 10e3, 20e3, 40e3, 80e3)
BOUND_HOST_NS = 1e6


@dataclass
class PathSample:
    """The operators on one simulated critical path: (node, times on the path), plus the
    rest of the path in ns."""

    calls: list[tuple[pb.Node, int]]
    rest_ns: float

    def to_wire(self) -> tuple[list[tuple[bytes, int]], float]:
        """A picklable form (protobuf messages do not pickle)."""
        return [(n.SerializeToString(), c) for n, c in self.calls], self.rest_ns

    @classmethod
    def from_wire(cls, wire: tuple[list[tuple[bytes, int]], float]) -> PathSample:
        return cls([(pb.Node.FromString(b), c) for b, c in wire[0]], wire[1])


def path_sample(res, timed) -> PathSample:
    """The critical path of a simulation made with ``SimOptions(critical_nodes=True)``:
    compute and launch nodes with their counts (one representative per distinct operator
    call), and the rest of the path."""
    reps: dict[tuple, list] = {}
    on_path_ns = 0
    for (gid, idx), count in res.critical_nodes.items():
        n = timed.graph(gid).nodes[idx]
        if n.kind not in (pb.KIND_COMPUTE, pb.KIND_LAUNCH):
            continue
        info = n.compute if n.kind == pb.KIND_COMPUTE else n.cpu
        key = (n.kind, info.op, info.shapes, info.dtypes, n.attrs.get("out_shapes", ""))
        on_path_ns += count * n.duration_ns
        if key in reps:
            reps[key][1] += count
        else:
            node = pb.Node()
            node.CopyFrom(n)
            del node.deps[:]
            reps[key] = [node, count]
    return PathSample([(n, c) for n, c in reps.values()], max(0.0, res.step_time_ns - on_path_ns))


def bounding_profiles(prior, folder: Path) -> tuple[Path, Path]:
    """The two bounding models of ``prior`` written as profiles in ``folder``:
    (free host, slow host)."""
    from echo_et.models.compute import ComputeModel

    out = []
    for name, h in (("bound-gpu.json", 0.0), ("bound-host.json", BOUND_HOST_NS)):
        p = folder / name
        ComputeModel(replace(prior.profile, params={**prior.profile.params, "host_launch_ns": h,
                                                     "host_collective_ns": h})).save(p)
        out.append(p)
    return out[0], out[1]


def path_ns(sample: PathSample, model) -> float:
    """A path's length under ``model``: its operators re-priced, the rest as simulated."""
    t = sample.rest_ns
    for node, count in sample.calls:
        t += count * (model.launch_ns(node.cpu.op) if node.kind == pb.KIND_LAUNCH else model.time_ns(node))
    return t


def predicted_ns(gpu: PathSample, host: PathSample, model) -> float:
    return max(path_ns(gpu, model), path_ns(host, model))


def fit_iterations(samples: Sequence[tuple[PathSample, PathSample, float]], prior, *,
                   starts: Sequence[float] = HOST_STARTS_NS, max_rounds: int = 8,
                   fit: Callable[..., Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """``prior``'s end-to-end parameters fitted to ``samples`` = (gpu path, host path,
    measured ns) per configuration (see the module docstring). Returns the model and what
    the fit did (start, rounds, host-bound configurations, training error)."""
    from echo_et.models.compute import ComputeModel, fit_end_to_end

    fit = fit or fit_end_to_end
    if not samples:
        raise EchoError("no measured iterations to fit")

    def longer(model) -> list[bool]:
        return [path_ns(g, model) >= path_ns(h, model) for g, h, _ in samples]

    def error(model) -> float:
        return statistics.fmean(abs(math.log(predicted_ns(g, h, model) / m)) for g, h, m in samples)

    best: tuple | None = None
    for start_ns in starts:
        start = ComputeModel(replace(prior.profile, params={**prior.profile.params, "host_launch_ns": start_ns,
                                                            "host_collective_ns": start_ns}))
        choice = longer(start)
        rounds = 0
        model = prior
        for _ in range(max_rounds):
            rounds += 1
            model = fit([((g if c else h).calls, (g if c else h).rest_ns, m)
                         for (g, h, m), c in zip(samples, choice, strict=True)], prior)
            new = longer(model)
            if new == choice:
                break
            choice = new
        e = error(model)
        if best is None or e < best[0]:
            best = (e, model, choice, rounds, start_ns)
    assert best is not None
    e, model, choice, rounds, start_ns = best
    return model, {"start_host_launch_ns": start_ns, "rounds": rounds,
                   "host_bound": sum(1 for c in choice if not c), "configurations": len(samples),
                   "train_mean_abs_log_error": round(e, 5)}


# -- simulating the configurations -----------------------------------------------------------------
def _row_job(row: dict[str, Any], opts, cache: str | None):
    """The row's traced Job, kept in ``cache`` (a folder) between runs when given."""
    from echo_et.experiments.config_rows import edge_stage_layers, interleaving, microbatch_group, recomputes, row_or
    from echo_et.experiments.config_sweep import trace_row
    from echo_et.ir import load_job, save_job

    if not cache:
        return trace_row(row, opts)
    key = "-".join(str(row[k]) for k in ("layers", "hidden", "heads", "seq", "micro_batch",
                                          "global_batch", "tp", "pp", "dp"))
    key += f"-v{row.get('vocab') or opts.vocab or 0}-{opts.dtype}-{int(recomputes(row, opts))}"
    if recomputes(row, opts):                                    # what the backward runs again
        key += f"-{opts.recompute_granularity}"
    if opts.recompute_modules != "core_attn":                    # what selective recomputation runs again
        key += f"-{opts.recompute_modules.replace(',', '+')}"
    if (opts.recompute_method, opts.recompute_num_layers) != ("uniform", 1) or row.get("recompute_num_layers"):
        key += f"-{opts.recompute_method}{row_or(row, 'recompute_num_layers', opts.recompute_num_layers)}"
    for differs, mark in ((opts.grad_sync != "after-backward", f"-{opts.grad_sync}"),
                          (opts.sync_timers, "-synctimers"),
                          (opts.pipeline_engine != "megatron", f"-{opts.pipeline_engine}"),
                          (opts.partition_activations, "-partact"),
                          (opts.sequence_parallel, "-seqpar"), (opts.overlap_p2p_comm, "-p2pov"),
                          (opts.overlap_p2p_comm_warmup_flush, "-p2pflush"),
                          (not opts.align_grad_reduce, "-noalignrs"), (not opts.align_param_gather, "-noalignag"),
                          (opts.overlap_param_gather_with_optimizer_step, "-agstep")):
        if differs:                                              # the step's calls differ
            key += mark
    key += f"-sg{int(opts.scatter_gather_tensors_in_pipeline)}"  # the pipeline sends differ
    if opts.accumulate_allreduce_grads_in_fp32 is not None:      # the gradient buffer's dtype
        key += f"-g32{int(opts.accumulate_allreduce_grads_in_fp32)}"
    if opts.use_distributed_optimizer:
        key += "-zero1" if opts.grad_reduce_scatter else "-zero1ar"
    vls, vpr = interleaving(row, opts)
    if vls:                                                      # the interleaved schedule
        key += f"-vls{vls}"
    if group := microbatch_group(row, opts):                     # its micro-batch groups
        key += f"-mg{group}"
    if vpr:
        key += f"-vpr{vpr}"
    first, last = edge_stage_layers(row, opts)
    if first or last:                                            # uneven stages
        key += f"-stages{first}.{last}"
    d = Path(cache) / key
    if (d / "manifest.pb").is_file():
        return load_job(d)
    job = trace_row(row, opts)
    save_job(job, d)
    return job


def simulate_row(task: tuple) -> dict[str, Any]:
    """One configuration simulated with one compute profile (a worker's task):
    ``(row, ConfigSweepOptions, profile path, want the critical path, cache folder)`` ->
    ``{"predicted_ms": ..., "path": wire form}`` or ``{"error": ...}``."""
    row, opts, profile, want_path, cache = task
    return simulate_row_profiles((row, opts, (profile,), want_path, cache))[0]


def simulate_row_profiles(task: tuple) -> list[dict[str, Any]]:
    """:func:`simulate_row` under several compute profiles, ``(row, options, profile paths,
    want the critical path, cache folder)``: the row is traced once (the traced Job does not
    depend on the compute profile; each profile retimes it), one result per profile."""
    from echo_et.experiments.config_sweep import predict_job, quiet_gc

    quiet_gc()
    row, opts, profiles, want_path, cache = task
    out: list[dict[str, Any]] = []
    try:
        job = _row_job(row, opts, cache)
        for profile in profiles:
            res, timed = predict_job(job, replace(opts, compute_profile=str(profile)), critical_nodes=want_path)
            got: dict[str, Any] = {"predicted_ms": res.step_time_ns / 1e6}
            if want_path:
                got["path"] = path_sample(res, timed).to_wire()
            out.append(got)
    except EchoError as e:
        return [{"error": str(e).splitlines()[0]}] * len(profiles)
    return out


def bound_samples(rows: Sequence[dict[str, Any]], opts, prior, folder: Path, *,
                  workers: int = 1, cache: str | None = None,
                  run: Callable[[list[tuple]], list[list[dict]]] | None = None
                  ) -> list[tuple[PathSample, PathSample] | None]:
    """Each row's (gpu-bound, host-bound) critical path under ``prior``'s bounding models
    (None for a row that cannot run). ``run`` maps tasks (:func:`simulate_row_profiles`'s)
    to results (default: a local process pool of ``workers``)."""
    gpu_p, host_p = bounding_profiles(prior, folder)
    tasks = [(r, opts, (gpu_p, host_p), True, cache) for r in rows]
    got = (run or _pool_map(workers))(tasks)
    out: list[tuple[PathSample, PathSample] | None] = []
    for g, h in got:
        if "path" in g and "path" in h:
            out.append((PathSample.from_wire(g["path"]), PathSample.from_wire(h["path"])))
        else:
            out.append(None)
    return out


def _pool_map(workers: int) -> Callable[[list[tuple]], list[list[dict]]]:
    from echo_et.experiments.config_sweep import map_rows

    def run(tasks: list[tuple]) -> list[list[dict]]:
        return map_rows(simulate_row_profiles, tasks, workers)

    return run


# -- the iterations stage of `calibrate compute` ---------------------------------------------------
@dataclass
class IterationCalibration:
    """A profile whose end-to-end parameters were fitted to measured iterations, with the
    rows used and the rows that could not run."""

    profile: Any                  # ComputeProfile
    info: dict[str, Any]
    rows: int
    excluded: list[dict[str, str]]


def read_iterations(path: Path, opts) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The measured configurations of ``path`` (a ``sweep --configs`` CSV with
    ``measured_ms``, or vTrain's ``ground_truth_single.csv``) that can run, and those that
    cannot (with the reason)."""
    from echo_et.experiments.config_csv import read_configs
    from echo_et.experiments.config_rows import workload_for

    rows = read_configs(path, option="iterations")
    if any(r.get("measured_ms") is None for r in rows):
        line = 2 + next(i for i, r in enumerate(rows) if r.get("measured_ms") is None)
        raise OptionError("iterations", f"{path.name}, line {line}: no measured_ms (every row needs its "
                                        "measured iteration time)")
    excluded: list[dict[str, str]] = []
    ok: list[dict[str, Any]] = []
    for i, r in enumerate(rows, start=2):
        try:
            workload_for(r, opts)
            ok.append(r)
        except EchoError as e:
            excluded.append({"sample": f"{path.name}, line {i}", "reason": str(e).splitlines()[0]})
    if not ok:
        raise OptionError("iterations", f"{path.name}: no row can run ({excluded[0]['reason']})")
    return ok, excluded


def _settings(opts) -> dict[str, Any]:
    """The simulation settings a fit used, as stored in the profile: a collective profile by
    its file name and content hash (not a path on the machine that fitted)."""
    from echo_et.models.compute.data import sha256

    out = opts.to_json()
    if opts.comm_profile:
        out["comm_profile"] = {"file": Path(opts.comm_profile).name, "sha256": sha256(Path(opts.comm_profile))}
    return out


def fit_profile_on_iterations(profile, path: Path, rows: Sequence[dict[str, Any]],
                              bounds: Sequence[tuple[PathSample, PathSample] | None], opts,
                              excluded: Sequence[dict[str, str]] = ()) -> IterationCalibration:
    """``profile`` with its end-to-end parameters fitted to ``rows`` (read from ``path``)
    through their bounding paths (:func:`bound_samples` under ``profile``). One function for
    ``calibrate compute --iterations`` and the accuracy benchmark's ``--fit-all``, so both
    write the same profile from the same simulations."""
    from echo_et.models.compute import ComputeModel
    from echo_et.models.compute.data import sha256
    from echo_et.models.compute.fit import END_TO_END_PARAMS

    excluded = list(excluded)
    samples = []
    for i, (r, b) in enumerate(zip(rows, bounds, strict=True)):
        if b is None:
            excluded.append({"sample": f"{path.name}, row {i + 1}", "reason": "the configuration did not simulate"})
            continue
        samples.append((*b, float(r["measured_ms"]) * 1e6))
    model, info = fit_iterations(samples, ComputeModel(profile))
    errs = [100.0 * (predicted_ns(g, h, model) - m) / m for g, h, m in samples]
    info = {**info, "path_mape_pct": round(statistics.fmean(abs(e) for e in errs), 2),
            "settings": _settings(opts),
            "before": {p: profile.params[p] for p in END_TO_END_PARAMS if p in profile.params}}
    source = {"file": path.name, "kind": "iterations", "sha256": sha256(path), "samples": len(samples),
              "excluded": len(excluded)}
    fitted = replace(model.profile, name=profile.name, calibrated=True,
                     description=profile.description + f"; end-to-end parameters fitted on {path.name} "
                                                       "(measured iterations)",
                     sources=(*profile.sources, source),
                     fit={**profile.fit, "iterations": info,
                          "excluded": [*profile.fit.get("excluded", []), *excluded]})
    return IterationCalibration(fitted, info, len(samples), excluded)


def calibrate_on_iterations(profile, path: Path, opts, *, workers: int = 1, cache: str | None = None,
                            progress: Callable[[str], None] | None = None) -> IterationCalibration:
    """``profile`` (the kernels/layers stages) with its end-to-end parameters fitted to the
    measured iterations in ``path``, each configuration traced on the meta device and
    simulated with ``opts`` (:func:`fit_iterations`). The profile records the file (sha256),
    the settings and the parameters before this stage."""
    import tempfile

    from echo_et.models.compute import ComputeModel

    rows, excluded = read_iterations(path, opts)
    if progress:
        progress(f"simulating {len(rows)} measured configurations twice (GPU- and host-bound paths)...")
    with tempfile.TemporaryDirectory(prefix="echo-et-iterations-") as tmp:
        bounds = bound_samples(rows, opts, ComputeModel(profile), Path(tmp), workers=workers, cache=cache)
    return fit_profile_on_iterations(profile, path, rows, bounds, opts, excluded)
