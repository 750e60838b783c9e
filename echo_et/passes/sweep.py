"""sweep: scale a Job to every point of a layout grid and simulate each point.

Each point is independent (load, scale, simulate, summarise), so the sweep is a plain map
over an existing executor, never a scheduler of our own:

- ``local`` (default): ``concurrent.futures.ProcessPoolExecutor``;
- ``dask``: a ``distributed.Client`` on ``--address`` (``tcp://host:8786``), or on a
  ``LocalCluster`` started for the sweep and closed after it;
- ``ray``: ``ray.init(address=...)`` (or a local Ray started for the sweep) and one remote
  task per point.

Workers read the Job from its path, so on a remote cluster the path must be visible to the
workers (a shared file system); nothing else travels but the point and the options.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError

EXECUTORS = ("local", "dask", "ray")


@dataclass(frozen=True)
class SweepSpec:
    dp: list[int]
    pp: list[int] = field(default_factory=list)
    microbatches: list[int] = field(default_factory=list)
    zero: int | None = None
    gpus_per_node: int | None = None
    layout: str | None = None
    mode: str = "predict"
    profile: str | None = None     # calibrated CC profile file (predict)
    preset: str | None = None      # CC preset name (predict); default: the job's GPU
    slowdown: bool = True          # overlap slowdown of compute (predict)
    a2a: str = "keep-rank"

    def points(self) -> list[dict[str, int | None]]:
        pps: list[int | None] = list(self.pp) or [None]
        mbs: list[int | None] = list(self.microbatches) or [None]
        return [{"dp": d, "pp": p, "microbatches": m}
                for p, m, d in itertools.product(pps, mbs, sorted(set(self.dp)))]


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]
    spec: SweepSpec
    executor: str

    def to_json(self) -> dict[str, Any]:
        return {"executor": self.executor, "spec": asdict(self.spec), "points": self.rows}

    def table(self) -> str:
        head = ("world", "dp", "tp", "pp", "mb", "step_ms", "exposed_comm_ms", "bubble_ms",
                "thr/gpu")
        lines = [" ".join(f"{h:>15}" if i >= 5 else f"{h:>6}" for i, h in enumerate(head))]
        for r in self.rows:
            if r.get("error"):
                lines.append(f"{'-':>6} {r['dp']:>6} {'-':>6} {r['pp'] or '-':>6} "
                             f"{r['microbatches'] or '-':>6} error: {r['error']}")
                continue
            lines.append(" ".join([
                f"{r['world_size']:>6}", f"{r['dp']:>6}", f"{r['tp']:>6}", f"{r['pp']:>6}",
                f"{r['microbatches']:>6}", f"{r['step_time_ns'] / 1e6:>15.3f}",
                f"{r['exposed_comm_ns'] / 1e6:>15.3f}", f"{r['bubble_ns'] / 1e6:>15.3f}",
                f"{r['throughput_per_gpu']:>15.3f}"]))
        unit = next((r["throughput_unit"] for r in self.rows if not r.get("error")), "")
        if unit:
            lines.append(f"thr/gpu: {unit}")
        return "\n".join(lines)


def comm_model_for(spec: SweepSpec, job):
    """The CC model a point is priced with: a calibrated profile, a preset, or the preset
    matching the job's GPU (``--gpus-per-node`` applied on top)."""
    from echo_et.models.comm import CommModel

    if spec.profile and spec.preset:
        raise EchoError("give --profile or --preset, not both")
    if spec.profile:
        model = CommModel.from_profile(spec.profile)
    elif spec.preset:
        model = CommModel.preset(spec.preset)
    else:
        model = CommModel.preset_for_gpu(job.manifest.hardware.gpu_name)
    return model.with_overrides(gpus_per_node=spec.gpus_per_node) if spec.gpus_per_node else model


def slowdown_model_for(spec: SweepSpec):
    if not spec.slowdown:
        return None
    from echo_et.models.slowdown import default_model

    return default_model()


def run_point(job_path: str, point: dict[str, int | None], spec: SweepSpec) -> dict[str, Any]:
    """Scale and simulate one point; errors come back as a row with ``error`` (a bad point
    never stops the sweep)."""
    row: dict[str, Any] = dict(point)
    try:
        from echo_et.cli.common import load_job_arg
        from echo_et.passes.scale import scale
        from echo_et.sim import SimOptions, simulate

        job = load_job_arg(Path(job_path))
        scaled, report = scale(job, dp=point["dp"], pp=point["pp"],
                               microbatches=point["microbatches"], zero=spec.zero,
                               gpus_per_node=spec.gpus_per_node, layout=spec.layout, a2a=spec.a2a)
        model = slow = None
        if spec.mode == "predict":
            model, slow = comm_model_for(spec, scaled), slowdown_model_for(spec)
        res = simulate(scaled, spec.mode, options=SimOptions(gpus_per_node=spec.gpus_per_node),
                       comm_model=model, slowdown_model=slow)
        lay = report.output_layout
        slow = res.ranks[res.slowest_rank]
        micro = max(1, int(lay.get("microbatches") or 1))
        step_s = res.step_time_ns / 1e9
        per_gpu = (lay["dp"] * micro / step_s / report.world_size) if step_s > 0 else 0.0
        mbs = _micro_batch_size(scaled)
        row.update({
            "world_size": report.world_size, "dp": lay["dp"], "tp": lay["tp"], "pp": lay["pp"],
            "microbatches": micro, "graphs": report.graphs,
            "step_time_ns": res.step_time_ns, "slowest_rank": res.slowest_rank,
            "exposed_comm_ns": slow.exposed_comm_ns, "comm_ns": slow.comm_ns,
            "compute_ns": slow.compute_ns, "bubble_ns": slow.idle_ns,
            "max_bubble_ns": max(r.idle_ns for r in res.ranks.values()),
            "throughput_per_gpu": round(per_gpu * (mbs or 1), 6),
            "throughput_unit": "samples/s per GPU" if mbs else "micro-batches/s per GPU",
            "simulated_ranks": res.simulated_ranks, "mode": res.mode,
        })
    except EchoError as e:
        row["error"] = str(e).splitlines()[0]
    return row


def _micro_batch_size(job) -> int:
    """Sequences per micro-batch when the Job says (the tracer's ``trace.workload`` attrs)."""
    try:
        work = json.loads(job.manifest.attrs.get("trace.workload", "") or "{}")
    except ValueError:
        work = {}
    v = work.get("micro_batch") if isinstance(work, dict) else None
    return int(v) if isinstance(v, int) and v > 0 else 0


def run_sweep(job_path: str | os.PathLike[str], spec: SweepSpec, *, executor: str = "local",
              workers: int | None = None, address: str | None = None,
              progress: Callable[[int, int, dict], None] | None = None) -> SweepResult:
    if executor not in EXECUTORS:
        raise EchoError(f"--executor {executor!r}: expected one of {', '.join(EXECUTORS)}")
    if spec.mode not in ("predict", "replay"):
        raise EchoError(f"--mode {spec.mode!r}: expected predict or replay")
    if address and executor == "local":
        raise EchoError("--address needs --executor dask or ray")
    path = str(Path(job_path))
    if not Path(path).exists():
        raise EchoError(f"{path}: no such file or directory")
    points = spec.points()
    run = {"local": _run_local, "dask": _run_dask, "ray": _run_ray}[executor]
    rows = run(path, points, spec, workers, address, progress)
    if rows and all(r.get("error") for r in rows):
        raise EchoError(f"every sweep point failed; first: {rows[0]['error']}")
    return SweepResult(rows, spec, executor)


def _tag(i: int, row: dict[str, Any]) -> dict[str, Any]:
    row["_index"] = i
    return row


def _finish(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows.sort(key=lambda r: r["_index"])
    for r in rows:
        r.pop("_index", None)
    return rows


def _run_local(path, points, spec, workers, address, progress) -> list[dict[str, Any]]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    n = max(1, min(workers or os.cpu_count() or 1, len(points)))
    rows = []
    with ProcessPoolExecutor(max_workers=n) as pool:
        futs = {pool.submit(run_point, path, p, spec): i for i, p in enumerate(points)}
        for fut in as_completed(futs):
            rows.append(_tag(futs[fut], fut.result()))
            if progress:
                progress(len(rows), len(points), rows[-1])
    return _finish(rows)


def _run_dask(path, points, spec, workers, address, progress) -> list[dict[str, Any]]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise EchoError("--executor dask needs dask.distributed (pip install 'dask[distributed]')") from None
    cluster = None
    if address:
        client = Client(address)
    else:
        cluster = LocalCluster(n_workers=max(1, workers or 1), threads_per_worker=1,
                               processes=bool(workers and workers > 1), dashboard_address=None)
        client = Client(cluster)
    rows = []
    try:
        futs = [client.submit(run_point, path, p, spec, pure=False) for p in points]
        index = {f.key: i for i, f in enumerate(futs)}
        for fut in as_completed(futs):
            rows.append(_tag(index[fut.key], fut.result()))
            if progress:
                progress(len(rows), len(points), rows[-1])
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return _finish(rows)


def _run_ray(path, points, spec, workers, address, progress) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise EchoError("--executor ray needs ray (pip install ray)") from None
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers or 1), log_to_driver=False, include_dashboard=False)
    rows = []
    try:
        task = ray.remote(run_point)
        refs = [task.remote(path, p, spec) for p in points]
        index = {r: i for i, r in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                rows.append(_tag(index[ref], ray.get(ref)))
                if progress:
                    progress(len(rows), len(points), rows[-1])
    finally:
        if started:
            ray.shutdown()
    return _finish(rows)


def write_outputs(result: SweepResult, outdir: str | os.PathLike[str]) -> list[str]:
    """results.json, table.txt and step_time.png (when a point succeeded), written to a
    temporary folder and renamed into place."""
    import shutil
    import tempfile

    from echo_et.ir.io import publish_mode
    from echo_et.passes.plot import line_plot

    dest = Path(outdir)
    if dest.exists() and not dest.is_dir():
        raise EchoError(f"{dest}: exists and is not a directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    publish_mode(tmp)
    files = ["results.json", "table.txt"]
    try:
        (tmp / "results.json").write_text(json.dumps(result.to_json(), sort_keys=True, indent=1) + "\n")
        (tmp / "table.txt").write_text(result.table() + "\n")
        series: dict[str, list[tuple[float, float]]] = {}
        for r in result.rows:
            if r.get("error"):
                continue
            label = f"tp={r['tp']} pp={r['pp']} mb={r['microbatches']}"
            series.setdefault(label, []).append((r["world_size"], r["step_time_ns"] / 1e6))
        if series:
            png = line_plot(series, title="step time vs world size", xlabel="world size (gpus)",
                            ylabel="step time (ms)")
            (tmp / "step_time.png").write_bytes(png)
            files.append("step_time.png")
        if dest.exists():
            for f in files:
                os.replace(tmp / f, dest / f)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files
