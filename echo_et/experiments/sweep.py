"""sweep: scale a Job to every point of a layout grid and simulate each point.

Each point is independent (load, scale, simulate, summarise), so the sweep is a plain map
over an existing executor, never a scheduler of our own (:mod:`echo_et.experiments.executors`):

- ``local`` (default): worker processes of our own, each within a memory budget;
- ``dask``: a ``distributed.Client`` at a scheduler address (``tcp://host:8786``), or on a
  ``LocalCluster`` started for the sweep and closed after it;
- ``ray``: ``ray.init(address=...)`` (or a local Ray started for the sweep) and one remote
  task per point.

The caller loads the Job once (the CLI reads a Job directory or converts a trace) and the
sweep ships it to the workers once (each local worker's start, ``Client.scatter``,
``ray.put``), so a remote cluster needs no shared file system. Options that every point
shares are checked once, before anything fans out (:func:`check_sweep`). Each finished point
is appended to the row log as it completes (:mod:`echo_et.experiments.row_log`); a worker
that dies is that point's error.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.experiments.executors import EXECUTORS as EXECUTORS
from echo_et.experiments.row_log import LogHeader, RowLog, check_output_dir, json_sha256, path_sha256
from echo_et.ir import Job
from echo_et.ir.conventions import traced_workload
from echo_et.ir.io import atomic_file
from echo_et.ir.limits import MAX_MICROBATCHES, MAX_PIPELINE_STAGES, MAX_SWEEP_ROWS, MAX_WORLD_SIZE

MODES = ("predict", "replay")
OUTPUT_FILES = ("results.json", "table.txt")
PLOT_FILE = "step_time.png"


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
    intra_bw_gbps: float | None = None   # what-if bandwidths, GB/s per GPU (predict)
    inter_bw_gbps: float | None = None
    gpu: str | None = None               # the GPU the caller retimed the job for (recorded: a resumed
    compute_profile: str | None = None   # sweep is one for the same GPU and compute profile)

    def points(self) -> list[dict[str, int | None]]:
        """Every layout of the grid, counted (and each value bounded) before one is made."""
        for option, values, hi in (("dp", self.dp, MAX_WORLD_SIZE), ("pp", self.pp, MAX_PIPELINE_STAGES),
                                   ("microbatches", self.microbatches, MAX_MICROBATCHES)):
            for v in values:
                if not 1 <= v <= hi:
                    raise OptionError(option, f"{v} is out of range (1..{hi:,})")
        dps = sorted(set(self.dp))
        pps: list[int | None] = list(self.pp) or [None]
        mbs: list[int | None] = list(self.microbatches) or [None]
        count = len(dps) * len(pps) * len(mbs)
        if count > MAX_SWEEP_ROWS:
            raise OptionError("dp", f"{len(dps):,} dp x {len(pps):,} pp x {len(mbs):,} micro-batch values make "
                                    f"{count:,} layouts; the limit is {MAX_SWEEP_ROWS:,} per sweep")
        return [{"dp": d, "pp": p, "microbatches": m} for p, m, d in itertools.product(pps, mbs, dps)]


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
        raise OptionError("preset", "give a calibrated profile or a preset, not both")
    if spec.profile:
        model = CommModel.from_profile(spec.profile)
    elif spec.preset:
        model = CommModel.preset(spec.preset)
    else:
        model = CommModel.preset_for_gpu(job.manifest.hardware.gpu_name)
    over = {k: v for k, v in (("gpus_per_node", spec.gpus_per_node),
                              ("intra_bw_gbps", spec.intra_bw_gbps),
                              ("inter_bw_gbps", spec.inter_bw_gbps)) if v}
    return model.with_overrides(**over) if over else model


def slowdown_model_for(spec: SweepSpec):
    if not spec.slowdown:
        return None
    from echo_et.models.slowdown import default_model

    return default_model()


def run_point(job: Job, point: dict[str, int | None], spec: SweepSpec) -> dict[str, Any]:
    """Scale and simulate one point; errors come back as a row with ``error`` (a bad point
    never stops the sweep)."""
    row: dict[str, Any] = dict(point)
    try:
        from echo_et.passes.scale import scale
        from echo_et.sim import SimOptions, simulate

        scaled, report = scale(job, dp=point["dp"], pp=point["pp"],
                               microbatches=point["microbatches"], zero=spec.zero,
                               gpus_per_node=spec.gpus_per_node, layout=spec.layout, a2a=spec.a2a)
        check_fits(scaled)
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
            # the slowest rank's step in the vocabulary's names (docs/step-breakdown.md)
            "compute_ns": slow.compute_ns, "bubble_ns": slow.bubble_ns, "host_idle_ns": slow.host_idle_ns,
            "max_bubble_ns": max(r.bubble_ns for r in res.ranks.values()),
            "throughput_per_gpu": round(per_gpu * (mbs or 1), 6),
            "throughput_unit": "samples/s per GPU" if mbs else "micro-batches/s per GPU",
            "simulated_ranks": res.simulated_ranks, "mode": res.mode,
        })
    except EchoError as e:
        row["error"] = error_text(e)
    return row


def error_text(e: EchoError) -> str:
    """One line; an option error names the option (the library's name for it)."""
    line = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{e.option}: {line}" if isinstance(e, OptionError) else line


def _micro_batch_size(job) -> int:
    """Sequences per micro-batch when the Job says (the tracer's ``trace.workload`` attrs)."""
    v = traced_workload(job.manifest).get("micro_batch")
    return int(v) if isinstance(v, int) and v > 0 else 0


def check_fits(job) -> None:
    """EchoError when a traced megatron-gpt Job's layout cannot hold its model in its GPU's
    memory (the footprint's lower bound, as ``predict`` and the configuration sweep check):
    a layout the software cannot run is that row's error, not a prediction. Jobs that do not
    describe a Megatron GPT, or name no GPU with a data sheet, are not checked."""
    from dataclasses import fields

    from echo_et.experiments.memory_check import check_memory
    from echo_et.models.compute.gpus import resolve_gpu
    from echo_et.trace.layout import ParallelLayout
    from echo_et.workloads.gpt_config import GPTConfig

    work = traced_workload(job.manifest)
    if work.get("workload") != "megatron-gpt":
        return
    try:
        gpu = resolve_gpu(job.manifest.hardware.gpu_name)
        cfg = GPTConfig(**{f.name: work[f.name] for f in fields(GPTConfig) if f.name in work})
        lay = job.manifest.layout
        layout = ParallelLayout(dp=lay.dp, tp=lay.tp, pp=lay.pp, microbatches=max(1, lay.microbatches),
                                zero=lay.zero_stage)
    except (EchoError, TypeError, ValueError):
        return
    check_memory(cfg, layout, gpu)


def check_sweep(job: Job, spec: SweepSpec, *, executor: str = "local", address: str | None = None,
                workers: int | None = None, max_memory: int | None = None) -> list[str | None]:
    """Check once, before fanning out, what every point shares: the executor and its
    settings, the mode, the layout, the scaling options and the models; an error here is
    raised, not repeated per point. Returns, per point of ``spec.points()``, the error it is
    certain to hit (the world size it would have does not fill whole nodes) or None."""
    from echo_et.experiments.executors import check_executor
    from echo_et.passes.derive import check_gpus_per_node
    from echo_et.passes.layout import infer_layout
    from echo_et.passes.scale import A2A_POLICIES

    check_executor(executor, workers, address, max_memory)
    if spec.mode not in MODES:
        raise OptionError("mode", f"unknown mode {spec.mode!r}: expected predict or replay")
    if not spec.dp:
        raise OptionError("dp", "give at least one data-parallel degree")
    bad = [v for v in [*spec.dp, *spec.pp, *spec.microbatches] if v < 1]
    if bad:
        raise OptionError("dp" if bad[0] in spec.dp else "pp" if bad[0] in spec.pp else "microbatches",
                          f"degrees must be >= 1, got {bad[0]}")
    if spec.zero is not None and spec.zero not in (0, 1):
        raise OptionError("zero", f"only ZeRO stages 0 and 1 are supported, got {spec.zero}")
    if spec.a2a not in A2A_POLICIES:
        raise OptionError("a2a", f"unknown all-to-all policy {spec.a2a!r}: expected one of {', '.join(A2A_POLICIES)}")
    if spec.gpus_per_node is not None and spec.gpus_per_node < 1:
        raise OptionError("gpus_per_node", f"GPUs per node must be >= 1, got {spec.gpus_per_node}")
    decision = infer_layout(job, spec.layout)
    if spec.mode == "predict":
        comm_model_for(spec, job)   # an unknown preset or unreadable profile fails here, once
        slowdown_model_for(spec)
    problems: list[str | None] = []
    for p in spec.points():
        world = p["dp"] * decision.tp * (p["pp"] or decision.pp)
        try:
            check_gpus_per_node(world, spec.gpus_per_node, job.manifest.hardware.gpus_per_node)
            problems.append(None)
        except EchoError as e:
            problems.append(error_text(e))
    if problems and all(problems):
        raise OptionError("gpus_per_node", f"no sweep point fills whole nodes; first: {problems[0]}")
    return problems


def log_header(source: str | os.PathLike[str], spec: SweepSpec, job: Job) -> LogHeader:
    """What a row log of this sweep is written for: the Job's (or trace's) bytes, the spec,
    the bytes of the profile it names and, when it predicts, the parameters of the collective
    model its points are priced with (a preset refitted by another echo-et release is another
    sweep)."""
    from echo_et.models.comm.profile import to_json as comm_json

    profile = path_sha256(spec.profile) if spec.profile and Path(spec.profile).is_file() else None
    comm = comm_json(comm_model_for(spec, job).profile) if spec.mode == "predict" else None
    return LogHeader(kind="sweep", rows=len(spec.points()), input_sha256=path_sha256(source),
                     options_sha256=json_sha256({"spec": asdict(spec), "profile": profile, "comm": comm}),
                     input_name="job")


# Imported once in the process the local workers are forked from.
PRELOAD = ("echo_et.experiments.sweep", "echo_et.passes.scale", "echo_et.sim", "echo_et.models.comm",
           "echo_et.models.slowdown")


def run_sweep(job: Job, spec: SweepSpec, *, executor: str = "local",
              workers: int | None = None, address: str | None = None,
              progress: Callable[[int, int, dict], None] | None = None,
              max_memory: int | None = None, log: RowLog | None = None) -> SweepResult:
    """Every point of ``spec`` scaled from ``job`` and simulated on ``executor``, each
    worker within ``max_memory`` bytes. With ``log``, the points it holds are not run again
    and each new point is appended to it as it finishes. A worker that dies, or a point past
    its memory budget, is that point's error; the sweep fails only when every point fails."""
    from echo_et.experiments.executors import Failure, run_rows

    problems = check_sweep(job, spec, executor=executor, address=address, workers=workers,
                           max_memory=max_memory)
    points = spec.points()
    done: dict[int, dict[str, Any]] = dict(log.done) if log else {}
    for i, p in enumerate(points):
        if problems[i] is not None:
            done[i] = {**p, "error": problems[i]}

    def report(i: int, out: Any) -> None:
        failure = isinstance(out, Failure)
        row = {**points[i], "error": out.message} if failure else out
        if log is not None:
            log.append(i, row, retry=failure)
        done[i] = row
        if progress:
            progress(len(done), len(points), row)

    todo = [(i, (p, spec)) for i, p in enumerate(points) if i not in done]
    run_rows(executor, _point_task, job, todo, workers=workers, address=address, max_memory=max_memory,
             report=report, preload=PRELOAD)
    rows = [done[i] for i in range(len(points))]
    if rows and all(r.get("error") for r in rows):
        raise EchoError(f"every sweep point failed; first: {rows[0]['error']}")
    return SweepResult(rows, spec, executor)


def _point_task(job: Job, task: tuple[dict[str, int | None], SweepSpec]) -> dict[str, Any]:
    """The row function a worker runs: one point of the grid."""
    return run_point(job, *task)


def is_sweep_dir(path: Path) -> bool:
    """An earlier sweep's output folder (whose outputs a new sweep replaces)."""
    return (path / OUTPUT_FILES[0]).is_file() and (path / OUTPUT_FILES[1]).is_file()


def write_outputs(result: SweepResult, outdir: str | os.PathLike[str], *, plot: bool = True) -> list[str]:
    """results.json (deterministic), table.txt and (with ``plot``, when a point succeeded)
    step_time.png, each written atomically into ``outdir``. A folder of the user's is
    refused; in an earlier sweep's folder only the files a sweep writes are replaced (a
    chart this run does not draw is removed), never a file of the user's."""
    out = Path(outdir)
    check_output_dir(out, is_sweep_dir, "an echo-et sweep folder")
    out.mkdir(parents=True, exist_ok=True)
    files = list(OUTPUT_FILES)
    _write_text(out / "table.txt", result.table() + "\n")
    if plot and any(not r.get("error") for r in result.rows):
        from echo_et.experiments.plots import sweep_step_time_plot

        sweep_step_time_plot(result.rows, out / PLOT_FILE)
        files.append(PLOT_FILE)
    else:
        (out / PLOT_FILE).unlink(missing_ok=True)
    _write_text(out / "results.json", json.dumps(result.to_json(), sort_keys=True, indent=1) + "\n")
    return files


def _write_text(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text.encode())
