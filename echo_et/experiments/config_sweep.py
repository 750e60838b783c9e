"""Predict many model configurations at once: each row of a CSV is traced on the meta device
and simulated for a target cluster (``echo-et sweep --configs CONFIGS.csv``).

A row names a GPT configuration and its layout with the trace options' names::

    layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp[,vocab][,measured_ms]

For each row: the Megatron-DeepSpeed GPT (``megatron-gpt``, :mod:`echo_et.workloads.gpt`) is
traced on the meta device with micro-batches = global batch / (micro-batch x dp) (one traced
rank per pipeline stage: the tensor- and data-parallel ranks of a stage are symmetric by
construction), its compute is timed by the compute model of the cluster's GPU
(:func:`echo_et.passes.retime_compute`), and the step is simulated in predict mode with the
collective model (the cluster's bandwidths on top of the GPU's preset). A row gets
``predicted_ms``, the breakdown of its slowest rank (compute, exposed communication, idle:
pipeline bubble and waiting for the host), and ``error_pct`` against ``measured_ms`` when
given. A row that cannot run (tp not dividing heads, a global batch that does not divide)
carries its reason in ``error`` and the others go on.

Rows are independent: a plain map over a local process pool (default), Dask or Ray.
"""

from __future__ import annotations

import csv
import gc
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Job
from echo_et.ir.io import atomic_dir
from echo_et.models.cluster import Cluster

REQUIRED = ("layers", "hidden", "heads", "seq", "micro_batch", "global_batch", "tp", "pp", "dp")
OPTIONAL = ("vocab", "measured_ms", "gpus")
# vTrain's column names (``ground_truth_single.csv``), read as ours: its measured CSVs load as
# they are, for ``sweep --configs`` and ``calibrate compute --iterations`` alike.
VTRAIN_COLUMNS = {"# layers": "layers", "hidden size": "hidden", "attention heads": "heads",
                  "sequence length": "seq", "micro batch": "micro_batch", "global batch": "global_batch",
                  "tensor parallelism": "tp", "pipeline parallelism": "pp", "data parallelism": "dp",
                  "iteration time (ms)": "measured_ms", "# GPUs": "gpus"}
EXECUTORS = ("local", "dask", "ray")
OUTPUT_FILES = ("results.json", "table.txt")
PLOT_FILE = "predicted_vs_measured.png"
DEFAULT_GPU = "a100"
DEFAULT_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class ConfigSweepOptions:
    """What every row shares: the cluster, the training settings, the models."""

    cluster: Cluster = field(default_factory=lambda: Cluster(gpu=DEFAULT_GPU))
    recompute: bool = False
    dtype: str = "float16"
    vocab: int | None = None           # default: the workload's (GPT-2's 50257)
    grad_sync: str = "after-backward"  # Megatron-DeepSpeed's local DDP: bucketing off
    compute_profile: str | None = None  # a calibrated compute profile (JSON)
    comm_profile: str | None = None     # a calibrated collective-model profile (JSON)
    comm_preset: str | None = None      # a collective-model preset name
    slowdown: bool = True               # slow compute that overlaps communication

    def gpu(self) -> str:
        return self.cluster.gpu or DEFAULT_GPU

    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node or DEFAULT_GPUS_PER_NODE

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "cluster"}
        out["cluster"] = self.cluster.to_json(self.gpus_per_node()) | {"gpu": self.gpu()}
        return out


# -- the configurations ---------------------------------------------------------------------------
def read_configs(path: str | os.PathLike[str], *, option: str = "configs") -> list[dict[str, Any]]:
    """The rows of a configuration CSV (a byte-order mark and surrounding spaces are
    tolerated; vTrain's column names are read as ours); a missing or unknown column, a value
    that is not a number, or a ``gpus`` that is not tp x pp x dp, is one OptionError (of
    ``--option``) naming it."""
    p = Path(path)
    try:
        text = p.read_text("utf-8-sig")
    except UnicodeDecodeError:
        raise OptionError(option, f"{p.name}: not a UTF-8 CSV file") from None
    reader = csv.reader(line for line in text.splitlines() if line.strip())
    header = next(reader, None)
    if not header:
        raise OptionError(option, f"{p.name}: empty, expected a header row "
                                     f"{','.join(REQUIRED)}")
    names = [VTRAIN_COLUMNS.get(h.strip(), h.strip()) for h in header]
    for n in names:
        if n not in REQUIRED + OPTIONAL:
            raise OptionError(option, f"{p.name}: unknown column {n!r} (columns: "
                                         f"{', '.join(REQUIRED)}; optional: {', '.join(OPTIONAL)})")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OptionError(option, f"{p.name}: column {dup[0]!r} appears twice")
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise OptionError(option, f"{p.name}: missing column {missing[0]!r} (columns: "
                                     f"{', '.join(REQUIRED)})")
    rows: list[dict[str, Any]] = []
    for i, values in enumerate(reader, start=2):
        if len(values) != len(names):
            raise OptionError(option, f"{p.name}, line {i}: {len(values)} values for "
                                         f"{len(names)} columns")
        row: dict[str, Any] = {}
        for n, v in zip(names, values, strict=True):
            row[n] = _value(p.name, i, n, v.strip(), option)
        if row.get("gpus") is not None and row["gpus"] != row["tp"] * row["pp"] * row["dp"]:
            raise OptionError(option, f"{p.name}, line {i}: gpus {row['gpus']} is not tp x pp x dp "
                                      f"({row['tp']} x {row['pp']} x {row['dp']})")
        rows.append(row)
    if not rows:
        raise OptionError(option, f"{p.name}: no configuration rows")
    return rows


def _value(where: str, line: int, column: str, text: str, option: str = "configs") -> int | float | None:
    if column in OPTIONAL and text == "":
        return None
    if column == "measured_ms":
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v <= 0:
            raise OptionError(option, f"{where}, line {line}: measured_ms {text!r} is not a "
                                         "positive number of milliseconds")
        return v
    try:
        f = float(text)
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or f != int(f):
        raise OptionError(option, f"{where}, line {line}: {column} {text!r} is not an integer")
    return int(f)


def layout_family(row: dict[str, Any]) -> str:
    """"tp-heavy", "pp-heavy" or "dp-heavy": the parallelism with the largest degree (ties:
    "mixed"; all 1: "single")."""
    degrees = {k: int(row[k]) for k in ("tp", "pp", "dp")}
    top = max(degrees.values())
    if top == 1:
        return "single"
    leaders = [k for k, v in degrees.items() if v == top]
    return f"{leaders[0]}-heavy" if len(leaders) == 1 else "mixed"


def workload_for(row: dict[str, Any], opts: ConfigSweepOptions):
    """(GPTConfig, ParallelLayout) of a row; EchoError naming the numbers when it does not
    fit (tp not dividing heads, pp not dividing layers, a global batch that does not
    divide)."""
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads.gpt import GPTConfig, microbatches_for

    for k in REQUIRED:
        if int(row[k]) < 1:
            raise EchoError(f"{k} must be >= 1, got {row[k]}")
    extra = {"vocab": int(row["vocab"])} if row.get("vocab") else (
        {"vocab": opts.vocab} if opts.vocab else {})
    cfg = GPTConfig.megatron(layers=int(row["layers"]), hidden=int(row["hidden"]),
                             heads=int(row["heads"]), seq=int(row["seq"]),
                             micro_batch=int(row["micro_batch"]), recompute=opts.recompute,
                             dtype=opts.dtype, grad_sync=opts.grad_sync, **extra)
    m = microbatches_for(int(row["global_batch"]), int(row["micro_batch"]), int(row["dp"]))
    layout = ParallelLayout(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), microbatches=m)
    cfg.validate(layout)
    return cfg, layout


def trace_row(row: dict[str, Any], opts: ConfigSweepOptions) -> Job:
    """The row's Job, traced on the meta device, with the cluster in its manifest."""
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads.gpt import build_gpt

    cfg, layout = workload_for(row, opts)
    name = (f"megatron-gpt-l{cfg.layers}-h{cfg.hidden}-tp{layout.tp}-pp{layout.pp}-dp{layout.dp}"
            f"-mb{layout.microbatches}")
    # Megatron's optimizer has no lazily created state: the first step is the steady one
    # (tests/test_trace_meta.py), so no warm-up step is traced.
    # The checker proves the built-in workload's graphs in the tests; a sweep skips it.
    res = trace(build_gpt(cfg), layout,
                TraceOptions(device="meta", verify="stage", warmup_steps=0, name=name, check=False),
                workload_attrs={"workload": cfg.flavor, **cfg.to_json()})
    job = res.job
    job.manifest.hardware.gpu_name = opts.gpu()
    Cluster(gpus_per_node=opts.gpus_per_node()).over(opts.cluster).write_hardware(job.manifest)
    return job


# -- the models ----------------------------------------------------------------------------------
_MODELS: dict[Any, tuple] = {}


def models_for(opts: ConfigSweepOptions) -> tuple[Any, Any, Any]:
    """(compute model, collective model, slowdown model or None), made once per process."""
    key = (opts.gpu(), opts.compute_profile, opts.comm_profile, opts.comm_preset, opts.slowdown,
           opts.cluster)
    got = _MODELS.get(key)
    if got is None:
        from echo_et.models.comm import CommModel
        from echo_et.models.compute import ComputeModel

        if opts.compute_profile:
            compute = ComputeModel.load(opts.compute_profile).for_gpu(opts.gpu())
        else:
            compute = ComputeModel.preset(opts.gpu())
        if opts.comm_profile and opts.comm_preset:
            raise OptionError("comm_profile", "give a collective profile or a preset, not both")
        if opts.comm_profile:
            comm = CommModel.from_profile(opts.comm_profile)
        elif opts.comm_preset:
            comm = CommModel.preset(opts.comm_preset)
        else:
            comm = CommModel.preset_for_gpu(opts.gpu())
        over = opts.cluster.comm_overrides(comm.gpus_per_node)
        comm = comm.with_overrides(**over) if over else comm
        slow = None
        if opts.slowdown:
            from echo_et.models.slowdown import default_model

            slow = default_model()
        got = (compute, comm, slow)
        _MODELS[key] = got
    return got


def predict_job(job: Job, opts: ConfigSweepOptions, *, critical_nodes: bool = False):
    """(SimResult, retimed Job): ``job``'s compute timed for the cluster's GPU, its step
    simulated in predict mode."""
    from echo_et.passes import retime_compute
    from echo_et.sim import SimOptions, simulate

    compute, comm, slow = models_for(opts)
    timed, _ = retime_compute(job, compute)
    res = simulate(timed, "predict",
                   options=SimOptions(gpus_per_node=opts.gpus_per_node(), check=False,
                                      critical_nodes=critical_nodes),
                   comm_model=comm, slowdown_model=slow)
    return res, timed


def summarize(row: dict[str, Any], res, *, trace_s: float, simulate_s: float) -> dict[str, Any]:
    """The result row: the configuration, the prediction and its breakdown, the error."""
    out = dict(row)
    slow = res.ranks[res.slowest_rank]
    predicted = res.step_time_ns / 1e6
    out.update({
        "predicted_ms": round(predicted, 4),
        "compute_ms": round(slow.compute_ns / 1e6, 4),
        "exposed_comm_ms": round(slow.exposed_comm_ns / 1e6, 4),
        "idle_ms": round(slow.idle_ns / 1e6, 4),
        "family": layout_family(row),
        "trace_s": round(trace_s, 3),
        "simulate_s": round(simulate_s, 3),
    })
    measured = row.get("measured_ms")
    out["error_pct"] = (round(100.0 * (predicted - measured) / measured, 4)
                        if measured else None)
    return out


_GC_FROZEN = False


ROWS_PER_WORKER = 64   # a worker process is replaced after about this many rows


def map_rows(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int,
             done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``fn`` over ``tasks`` on ``workers`` processes, results in task order (``done(i,
    result)`` as each finishes). The pool is made afresh for every ``ROWS_PER_WORKER x
    workers`` tasks: a long-lived worker's heap only grows (one had reached 12 GB after some
    700 rows and was killed), and ``max_tasks_per_child`` can hang the pool on Python 3.11."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    out: list[Any] = [None] * len(tasks)
    if workers <= 1:
        for i, t in enumerate(tasks):
            out[i] = fn(t)
            if done:
                done(i, out[i])
        return out
    step = ROWS_PER_WORKER * workers
    for lo in range(0, len(tasks), step):
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futs = {pool.submit(fn, tasks[i]): i for i in range(lo, min(lo + step, len(tasks)))}
            for fut in as_completed(futs):
                i = futs[fut]
                out[i] = fut.result()
                if done:
                    done(i, out[i])
    return out


def quiet_gc() -> None:
    """Freeze what the process holds so far (imports, models) and collect less often: a row
    makes hundreds of thousands of short-lived objects, and the collector walking torch's
    heap each time costs about a fifth of a row."""
    global _GC_FROZEN
    if not _GC_FROZEN:
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        _GC_FROZEN = True


def predict_row(row: dict[str, Any], opts: ConfigSweepOptions) -> dict[str, Any]:
    """One row traced and predicted; an EchoError becomes the row's ``error``."""
    quiet_gc()
    t0 = time.perf_counter()
    try:
        job = trace_row(row, opts)
        t1 = time.perf_counter()
        res, _ = predict_job(job, opts)
        return summarize(row, res, trace_s=t1 - t0, simulate_s=time.perf_counter() - t1)
    except EchoError as e:
        return {**row, "predicted_ms": None, "error_pct": None, "family": layout_family(row),
                "error": str(e).splitlines()[0]}


# -- the sweep -----------------------------------------------------------------------------------
@dataclass
class ConfigSweepResult:
    rows: list[dict[str, Any]]
    options: ConfigSweepOptions
    executor: str
    wall_s: float = 0.0

    @property
    def mape_pct(self) -> float | None:
        errs = [abs(r["error_pct"]) for r in self.rows if r.get("error_pct") is not None]
        return round(sum(errs) / len(errs), 4) if errs else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "options": self.options.to_json(),
                               "executor": self.executor,
                               "failed": sum(1 for r in self.rows if r.get("error"))}
        if any(r.get("measured_ms") for r in self.rows):
            out["mape_pct"] = self.mape_pct
        return out

    def table(self) -> str:
        head = ("#", "layers", "hidden", "heads", "seq", "mb", "gb", "tp", "pp", "dp",
                "measured_ms", "predicted_ms", "error_%", "compute_ms", "exp_comm_ms", "idle_ms")
        lines = [" ".join(f"{h:>12}" if i >= 10 else f"{h:>6}" for i, h in enumerate(head))]
        for i, r in enumerate(self.rows):
            cols = [str(i), *(str(r[k]) for k in REQUIRED)]
            left = " ".join(f"{c:>6}" for c in cols)
            meas = f"{r['measured_ms']:.3f}" if r.get("measured_ms") else "-"
            if r.get("error"):
                lines.append(f"{left} {meas:>12} error: {r['error']}")
                continue
            err = f"{r['error_pct']:+.2f}" if r.get("error_pct") is not None else "-"
            lines.append(f"{left} {meas:>12} {r['predicted_ms']:>12.3f} {err:>12} "
                         f"{r['compute_ms']:>12.3f} {r['exposed_comm_ms']:>12.3f} {r['idle_ms']:>12.3f}")
        if self.mape_pct is not None:
            lines.append(f"MAPE {self.mape_pct:.2f} % over "
                         f"{sum(1 for r in self.rows if r.get('error_pct') is not None)} rows")
        lines.append("idle = pipeline bubble and time the GPU waits for the host to issue work")
        return "\n".join(lines)


def run_config_sweep(rows: Sequence[dict[str, Any]], opts: ConfigSweepOptions, *,
                     executor: str = "local", workers: int | None = None,
                     address: str | None = None,
                     progress: Callable[[int, int, dict], None] | None = None) -> ConfigSweepResult:
    """Every row predicted (in row order in the result) on ``executor``."""
    if executor not in EXECUTORS:
        raise OptionError("executor", f"unknown executor {executor!r}: expected one of "
                                      f"{', '.join(EXECUTORS)}")
    if address and executor == "local":
        raise OptionError("address", "a scheduler address needs the dask or ray executor")
    if workers is not None and workers < 1:
        raise OptionError("workers", f"workers must be >= 1, got {workers}")
    models_for(opts)   # bad model settings fail once, here, not in every row
    t0 = time.perf_counter()
    done: dict[int, dict[str, Any]] = {}

    def report(i: int, row: dict[str, Any]) -> None:
        done[i] = row
        if progress is not None:
            progress(len(done), len(rows), row)

    run = {"local": _run_local, "dask": _run_dask, "ray": _run_ray}[executor]
    run(list(enumerate(rows)), opts, workers, address, report)
    out = [done[i] for i in range(len(rows))]
    if out and all(r.get("error") for r in out):
        raise EchoError(f"no configuration could run; first: {out[0]['error']}")
    return ConfigSweepResult(out, opts, executor, wall_s=time.perf_counter() - t0)


def _run_local(todo, opts, workers, address, report) -> None:
    n = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    rows = [row for _, row in todo]
    map_rows(_predict_task, [(row, opts) for row in rows], n, lambda k, res: report(todo[k][0], res))


def _predict_task(task: tuple[dict[str, Any], ConfigSweepOptions]) -> dict[str, Any]:
    return predict_row(*task)


def _run_dask(todo, opts, workers, address, report) -> None:
    from echo_et.experiments.executors import dask_client

    with dask_client(workers, address) as (client, as_completed):
        futs = [client.submit(predict_row, row, opts, pure=False) for _, row in todo]
        index = {f.key: i for f, (i, _) in zip(futs, todo, strict=True)}
        for fut in as_completed(futs):
            report(index[fut.key], fut.result())


def _run_ray(todo, opts, workers, address, report) -> None:
    from echo_et.experiments.executors import ray_session

    with ray_session(workers, address) as ray:
        task = ray.remote(predict_row)
        refs = [task.remote(row, opts) for _, row in todo]
        index = {r: i for r, (i, _) in zip(refs, todo, strict=True)}
        pending = list(refs)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                report(index[ref], ray.get(ref))


# -- outputs -------------------------------------------------------------------------------------
def is_config_sweep_dir(path: Path) -> bool:
    """An earlier configuration sweep's output folder (which a new one may replace)."""
    return all((path / f).is_file() for f in OUTPUT_FILES)


def write_outputs(result: ConfigSweepResult, outdir: str | os.PathLike[str], *,
                  plot: bool = True) -> list[str]:
    """results.json, table.txt and (with ``plot``, when a row has a measurement) the
    predicted-vs-measured chart, published atomically."""
    files = list(OUTPUT_FILES)
    with atomic_dir(outdir, replaceable=is_config_sweep_dir,
                    kind="an echo-et configuration sweep folder") as tmp:
        (tmp / "results.json").write_text(json.dumps(result.to_json(), sort_keys=True, indent=1)
                                          + "\n")
        (tmp / "table.txt").write_text(result.table() + "\n")
        pts = [r for r in result.rows if r.get("error_pct") is not None]
        if plot and pts:
            from echo_et.experiments.plots import predicted_vs_measured_plot

            predicted_vs_measured_plot(pts, tmp / PLOT_FILE)
            files.append(PLOT_FILE)
    return files
