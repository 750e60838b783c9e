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
``predicted_ms``, the breakdown of its slowest rank (``compute_ms``, ``exposed_comm_ms``,
``bubble_ms``, ``host_idle_ms``: docs/step-breakdown.md), and ``error_pct`` against
``measured_ms`` when given. A row that cannot run (tp not dividing heads, a global batch that does not divide)
carries its reason in ``error`` and the others go on.

Rows are independent: a plain map over local worker processes (default), Dask or Ray
(:mod:`echo_et.experiments.executors`). Each finished row is appended to the row log in the
output folder as it completes (:mod:`echo_et.experiments.row_log`), so a killed sweep is
resumed where it stopped; a worker that dies, or a row past its memory budget, is that
row's error.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from echo_et.errors import EchoError, OptionError
from echo_et.experiments.advice import prediction_advice
from echo_et.experiments.config_csv import REQUIRED, row_gpus
from echo_et.experiments.config_rows import ConfigSweepOptions, layout_family, schedule_said, workload_for
from echo_et.experiments.executors import EXECUTORS as EXECUTORS
from echo_et.experiments.executors import Failure, run_rows
from echo_et.experiments.row_log import LogHeader, RowLog, check_output_dir, json_sha256, path_sha256
from echo_et.ir import Job
from echo_et.ir.io import atomic_file
from echo_et.ir.limits import fills_nodes
from echo_et.models.cluster import Cluster
from echo_et.sim.result import STEP_PARTS

OUTPUT_FILES = ("results.json", "table.txt")
PLOT_FILE = "predicted_vs_measured.png"
TIMINGS_FILE = "timings.json"


def trace_row(row: dict[str, Any], opts: ConfigSweepOptions, *, jobs: int = 1) -> Job:
    """The row's Job, traced on the meta device, with the cluster in its manifest (``jobs``
    processes trace its distinct ranks: a sweep's rows already use the cores)."""
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads.gpt import build_gpt

    cfg, layout = workload_for(row, opts)
    name = (f"megatron-gpt-l{cfg.layers}-h{cfg.hidden}-tp{layout.tp}-pp{layout.pp}-dp{layout.dp}"
            + (f"-cp{layout.cp}" if layout.cp > 1 else "") + (f"-ep{layout.ep}" if layout.ep > 1 else "")
            + f"-mb{layout.microbatches}")
    # Megatron's optimizer has no lazily created state: the first step is the steady one
    # (tests/test_trace_meta.py), so no warm-up step is traced.
    # The checker proves the built-in workload's graphs in the tests; a sweep skips it.
    res = trace(build_gpt(cfg), layout,
                TraceOptions(device="meta", verify="stage", warmup_steps=0, name=name, check=False, jobs=jobs),
                workload_attrs={"workload": cfg.flavor, **cfg.to_json()})
    job = res.job
    job.manifest.layout.vpp = cfg.virtual_pipeline_size(layout.pp)
    job.manifest.hardware.gpu_name = opts.gpu()
    gpn = opts.gpus_per_node()
    # the nodes are recorded where the layout fills them (the checker's node-fill rule); else
    # unknown, the rates still converted with them
    cluster = Cluster(gpus_per_node=gpn).over(opts.cluster)
    if not fills_nodes(job.world_size, gpn):
        cluster = dataclasses.replace(cluster, gpus_per_node=None)
    cluster.write_hardware(job.manifest, gpn)
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


def predict_job(job: Job, opts: ConfigSweepOptions, *, critical_nodes: bool = False, repeats: bool = True):
    """(SimResult, retimed Job): ``job``'s compute timed for the cluster's GPU, its step
    simulated in predict mode (``repeats=False``: node by node, for a timeline)."""
    timed, _ = retime_job(job, opts)
    return simulate_timed(timed, opts, critical_nodes=critical_nodes, repeats=repeats), timed


def retime_job(job: Job, opts: ConfigSweepOptions):
    """(retimed Job, ``passes.RetimeReport``): ``job``'s compute timed for the cluster's GPU."""
    from echo_et.passes import retime_compute

    return retime_compute(job, models_for(opts)[0])


def simulate_timed(timed: Job, opts: ConfigSweepOptions, *, critical_nodes: bool = False, repeats: bool = True):
    """The SimResult of a retimed Job's step in predict mode, on the cluster of ``opts``."""
    from echo_et.sim import SimOptions, simulate
    from echo_et.sim.nic_share import NodeNetwork

    _, comm, slow = models_for(opts)
    net = opts.cluster.node_network(opts.gpus_per_node())
    return simulate(timed, "predict",
                    options=SimOptions(gpus_per_node=opts.gpus_per_node(), check=False,
                                       critical_nodes=critical_nodes, repeats=repeats),
                    comm_model=comm, slowdown_model=slow,
                    node_network=None if net is None else NodeNetwork(*net))


def row_throughput(row: dict[str, Any], opts: ConfigSweepOptions, step_ns: int) -> dict[str, Any]:
    """The rates of a row's predicted step (:mod:`echo_et.experiments.throughput`: tokens/s,
    model and hardware FLOPs per GPU, MFU) on the cluster's GPU."""
    from echo_et.experiments.throughput import step_throughput

    cfg, layout = workload_for(row, opts)
    profile = models_for(opts)[0].profile
    return step_throughput(cfg, layout.dp * layout.microbatches * cfg.micro_batch, layout.tp, layout.world_size,
                           step_ns, profile.gpu, profile.fp32_matmul, layout.pp)


# The rates a sweep's result row carries (all of them are in predict's summary.json).
ROW_RATES = ("tokens_per_s", "model_tflops_per_gpu", "mfu_pct")


def summarize(row: dict[str, Any], res) -> dict[str, Any]:
    """The result row: the configuration, the prediction and its breakdown, the error (no
    wall-clock times: a row's result is the same on every run)."""
    out = dict(row)
    slow = res.ranks[res.slowest_rank]
    predicted = res.step_time_ns / 1e6
    out.update({
        "predicted_ms": round(predicted, 4),
        # the step's parts in the vocabulary's names (docs/step-breakdown.md), ms
        **{k.removesuffix("_ns") + "_ms": round(v / 1e6, 4) for k, v in slow.breakdown().items()
           if k in STEP_PARTS},
        "family": layout_family(row),
    })
    measured = row.get("measured_ms")
    out["error_pct"] = (round(100.0 * (predicted - measured) / measured, 4)
                        if measured else None)
    return out


_GC_FROZEN = False


def _call_row(fn: Callable[[Any], Any], task: Any) -> Any:
    """A worker's row function for :func:`map_rows` (``fn`` travels as the shared argument)."""
    return fn(task)


def map_rows(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int,
             done: Callable[[int, Any], None] | None = None,
             failed: Callable[[str], Any] = lambda message: {"error": message}) -> list[Any]:
    """``fn`` over ``tasks`` on ``workers`` processes (the sweeps' local executor: a worker is
    replaced every ``ROWS_PER_WORKER`` rows, and each has its share of the machine's memory),
    results in task order (``done(i, result)`` as each finishes). A task whose worker died or
    ran out of memory gives ``failed(message)`` and the others go on (the calibration loops
    and benchmarks that use this lose one row, not the run). ``fn`` must be importable by
    name."""
    out: list[Any] = [None] * len(tasks)
    if workers <= 1:
        for i, t in enumerate(tasks):
            out[i] = fn(t)
            if done:
                done(i, out[i])
        return out

    def report(i: int, result: Any) -> None:
        out[i] = failed(result.message) if isinstance(result, Failure) else result
        if done:
            done(i, out[i])

    run_rows("local", _call_row, fn, list(enumerate(tasks)), workers=workers, address=None, max_memory=None,
             report=report)
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
    return timed_predict_row(opts, row)[0]


def timed_predict_row(opts: ConfigSweepOptions, row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """(result row, seconds spent tracing and simulating it): the row function a worker runs
    (the times go to the row log and timings.json, never into the results)."""
    quiet_gc()
    t0 = time.perf_counter()
    try:
        job = trace_row(row, opts)
        t1 = time.perf_counter()
        res, _ = predict_job(job, opts)
        seconds = {"trace_s": round(t1 - t0, 3), "simulate_s": round(time.perf_counter() - t1, 3)}
        rates = row_throughput(row, opts, res.step_time_ns)
        advice = prediction_advice(int(row["hidden"]), int(row["heads"]), opts.dtype, int(row["tp"]),
                                   opts.num_experts)
        return {**summarize(row, res), **{k: rates[k] for k in ROW_RATES},
                **({"advice": list(advice)} if advice else {})}, seconds
    except EchoError as e:
        return failed_row(row, str(e).splitlines()[0]), {}


def advice_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The table's lines for the rows whose configuration costs what the models do not price
    (:mod:`echo_et.experiments.advice`): each piece of advice once, with its rows."""
    said: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        for a in r.get("advice", ()):
            said.setdefault(a, []).append(i)
    return [f"row{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}: {a}" for a, at in said.items()]


def failed_row(row: dict[str, Any], error: str) -> dict[str, Any]:
    """The result of a row that could not run: the configuration and why."""
    return {**row, "predicted_ms": None, "error_pct": None, "family": layout_family(row),
            "error": error}


# -- the sweep -----------------------------------------------------------------------------------
@dataclass
class ConfigSweepResult:
    rows: list[dict[str, Any]]
    options: ConfigSweepOptions
    executor: str
    wall_s: float = 0.0
    seconds: dict[int, dict[str, float]] = field(default_factory=dict)   # per row, when known
    # a generated layout grid's candidates: how many ran, and the refused by constraint
    layouts: dict[str, Any] | None = None

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if r.get("error"))

    @property
    def mape_pct(self) -> float | None:
        errs = [abs(r["error_pct"]) for r in self.rows if r.get("error_pct") is not None]
        return round(sum(errs) / len(errs), 4) if errs else None

    def to_json(self) -> dict[str, Any]:
        """What results.json holds: the same bytes for the same input, however the rows ran."""
        out: dict[str, Any] = {"rows": self.rows, "options": self.options.to_json(),
                               "executor": self.executor, "failed": self.failed}
        if any(r.get("measured_ms") for r in self.rows):
            out["mape_pct"] = self.mape_pct
        if self.layouts is not None:
            out["layouts"] = self.layouts
        return out

    def timings(self) -> dict[str, Any]:
        """What timings.json holds: each row's trace and simulation seconds (null for a row
        that did not run), and this run's wall time."""
        return {"rows": [self.seconds.get(i) for i in range(len(self.rows))],
                "wall_s": round(self.wall_s, 3)}

    def table(self) -> str:
        head = ("#", "layers", "hidden", "heads", "seq", "mb", "gb", "tp", "pp", "dp",
                "measured_ms", "predicted_ms", "error_%", "compute_ms", "exp_comm_ms", "bubble_ms",
                "host_idle_ms", "MFU_%")
        # a row's schedule, and its context-parallel size where it has one (its GPUs are tp x pp x dp x cp),
        # and its expert-parallel size (cut from its dp x cp)
        schedules = [" ".join(x for x in (schedule_said(r, self.options),
                                          f"cp{r['cp']}" if (r.get("cp") or 1) > 1 else "",
                                          f"ep{r['ep']}" if (r.get("ep") or 1) > 1 else "") if x)
                     for r in self.rows]
        shown = any(sched not in ("", "1F1B") for sched in schedules)   # a column only where a row differs
        lines = [" ".join(f"{h:>12}" if i >= 10 else f"{h:>6}" for i, h in enumerate(head))
                 + (" schedule" if shown else "")]
        for i, r in enumerate(self.rows):
            cols = [str(i), *(str(r[k]) for k in REQUIRED)]
            left = " ".join(f"{c:>6}" for c in cols)
            meas = f"{r['measured_ms']:.3f}" if r.get("measured_ms") else "-"
            if r.get("error"):
                lines.append(f"{left} {meas:>12} error: {r['error']}")
                continue
            err = f"{r['error_pct']:+.2f}" if r.get("error_pct") is not None else "-"
            lines.append(f"{left} {meas:>12} {r['predicted_ms']:>12.3f} {err:>12} "
                         f"{r['compute_ms']:>12.3f} {r['exposed_comm_ms']:>12.3f} {r['bubble_ms']:>12.3f} "
                         f"{r['host_idle_ms']:>12.3f} {_mfu(r):>12}" + (f" {schedules[i]}" if shown else ""))
        lines.extend(advice_lines(self.rows))
        if self.mape_pct is not None:
            lines.append(f"MAPE {self.mape_pct:.2f} % over "
                         f"{sum(1 for r in self.rows if r.get('error_pct') is not None)} rows")
        lines.extend(self.fastest_lines())
        lines.append("the slowest rank's step = compute + exposed comm + bubble (waiting for peers: pipeline "
                     "bubble, sync wait) + host idle (waiting for the host); docs/step-breakdown.md")
        return "\n".join(lines)


    def fastest_lines(self) -> list[str]:
        """The table's lines on choosing a layout (:func:`layout_choices`): each model's
        fastest predicted layout, the others on its shortlist and, where the rows are
        measured, how the choice fared."""
        out = []
        choices = layout_choices(self.rows)
        for c in choices:
            r = self.rows[c.pick]
            line = (f"fastest of {c.layouts} layouts for {r['layers']} layers, hidden {r['hidden']}, "
                    f"{r['heads']} heads, seq {r['seq']}, global batch {r['global_batch']} on {c.gpus} GPUs: row "
                    f"{c.pick} (tp {r['tp']}, pp {r['pp']}, dp {r['dp']}"
                    + (f", cp {r['cp']}" if (r.get("cp") or 1) > 1 else "")
                    + (f", ep {r['ep']}" if (r.get("ep") or 1) > 1 else "") + f", micro-batch {r['micro_batch']}"
                    f"{'' if (sched := schedule_said(r, self.options)) in ('', '1F1B') else ', ' + sched}), "
                    f"{r['predicted_ms']:.3f} ms, MFU {_mfu(r)} %")
            if len(c.shortlist) > 1:
                others = ", ".join(str(i) for i in c.shortlist[1:])
                line += f"; within {100 * SHORTLIST_BAND:g} % of it: row{'s' if len(c.shortlist) > 2 else ''} {others}"
            if c.measured_best is not None:
                line += ("; measured fastest too" if c.measured_best == c.pick else
                         f"; measured fastest: row {c.measured_best}, the pick measured {100 * c.regret:+.1f} % slower")
            out.append(line)
        summary = choice_summary(choices)
        if summary:
            out.append(f"layout choice against the measurements: the predicted fastest is the measured fastest for "
                       f"{summary['same']} of {summary['models']} models and within 5 % of it for "
                       f"{summary['within_5_pct']}; mean regret {summary['mean_regret_pct']:.2f} %, "
                       f"max {summary['max_regret_pct']:.2f} %; the measured fastest is on the shortlist (predicted "
                       f"within {100 * SHORTLIST_BAND:g} % of the fastest) for {summary['best_in_shortlist']} of "
                       f"{summary['models']}, which holds {summary['shortlist_share_pct']:.1f} % of the layouts")
        return out


# A planner's shortlist: the layouts predicted within this fraction of the predicted fastest.
# The cross-validated single-node error is about this size (median |error| 5.5 %, docs/
# accuracy.md), so layouts closer than it are not told apart by the prediction and are the
# ones worth measuring on the target before choosing.
SHORTLIST_BAND = 0.05


class LayoutChoice(NamedTuple):
    """One model's layouts (same layers, hidden, heads, sequence, vocabulary, global batch
    and number of GPUs): the row predicted fastest; the shortlist, every row predicted within
    :data:`SHORTLIST_BAND` of it (the pick first, then by predicted time); and when every row
    is measured the row measured fastest and the regret (the pick's measured time over the
    best's, minus 1)."""

    pick: int
    layouts: int
    gpus: int
    measured_best: int | None
    regret: float | None
    shortlist: tuple[int, ...] = ()


def layout_choices(rows: Sequence[dict[str, Any]], predicted: str = "predicted_ms") -> list[LayoutChoice]:
    """What a planner choosing a layout from these rows would pick, per model with more than
    one layout that ran (ties go to the first row)."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if r.get(predicted) is None:
            continue
        key = (r["layers"], r["hidden"], r["heads"], r["seq"], r.get("vocab") or 0, r["global_batch"],
               row_gpus(r))
        groups.setdefault(key, []).append(i)
    out = []
    for key, members in groups.items():
        if len(members) < 2:
            continue
        ranked = sorted(members, key=lambda i: (rows[i][predicted], i))
        pick = ranked[0]
        shortlist = tuple(i for i in ranked if rows[i][predicted] <= rows[pick][predicted] * (1 + SHORTLIST_BAND))
        best = regret = None
        if all(rows[i].get("measured_ms") for i in members):
            best = min(members, key=lambda i: (rows[i]["measured_ms"], i))
            regret = rows[pick]["measured_ms"] / rows[best]["measured_ms"] - 1
        out.append(LayoutChoice(pick, len(members), key[-1], best, regret, shortlist))
    return out


def choice_summary(choices: Sequence[LayoutChoice]) -> dict[str, Any] | None:
    """How the measured choices fared (None when no model's rows are all measured)."""
    measured = [c for c in choices if c.regret is not None]
    if not measured:
        return None
    regrets = [c.regret for c in measured]
    return {"models": len(measured), "same": sum(1 for c in measured if c.pick == c.measured_best),
            "within_5_pct": sum(1 for x in regrets if x < 0.05), "within_10_pct": sum(1 for x in regrets if x < 0.10),
            "mean_regret_pct": round(100 * sum(regrets) / len(regrets), 2),
            "max_regret_pct": round(100 * max(regrets), 2),
            "best_in_shortlist": sum(1 for c in measured if c.measured_best in c.shortlist),
            "shortlist_share_pct": round(100 * sum(len(c.shortlist) / c.layouts for c in measured) / len(measured), 1)}


def _mfu(row: dict[str, Any]) -> str:
    """The table's MFU cell (a row logged before rows carried it has none)."""
    return f"{row['mfu_pct']:.1f}" if row.get("mfu_pct") is not None else "-"


# Imported once in the process the local workers are forked from: a fresh worker's first row
# then costs what every other row costs (torch's first trace imports torch._dynamo: 1.5 s).
PRELOAD = ("echo_et.experiments.config_sweep", "echo_et.trace.tracer", "echo_et.workloads.gpt",
           "echo_et.passes", "echo_et.sim", "echo_et.models.comm", "echo_et.models.compute",
           "echo_et.models.slowdown", "torch._dynamo")


def check_config_sweep(opts: ConfigSweepOptions, *, executor: str = "local", workers: int | None = None,
                       address: str | None = None, max_memory: int | None = None) -> None:
    """What every row shares, checked once before any row runs: the executor and its
    settings, the models (a bad profile fails here, not in every row)."""
    from echo_et.experiments.executors import check_executor

    check_executor(executor, workers, address, max_memory)
    models_for(opts)


def log_header(configs: str | os.PathLike[str] | None, opts: ConfigSweepOptions, rows: int, *,
               rows_given: Sequence[dict[str, Any]] = ()) -> LogHeader:
    """What a row log of this sweep is written for: the CSV's bytes (without a CSV, the rows
    themselves: a generated layout grid), the options, the bytes
    of the profiles the options name and the parameters of the models the rows are priced
    with (a recalibrated profile, or a shipped preset refitted by another echo-et release, is
    another sweep: resuming would mix rows of two models)."""
    from echo_et.models.comm.profile import to_json as comm_json
    from echo_et.models.compute.profile import to_json as compute_json

    profiles = {name: path_sha256(path) for name, path in
                (("compute_profile", opts.compute_profile), ("comm_profile", opts.comm_profile))
                if path and Path(path).is_file()}
    compute, comm, _ = models_for(opts)
    models = {"compute": compute_json(compute.profile), "comm": comm_json(comm.profile)}
    return LogHeader(kind="config-sweep", rows=rows,
                     input_sha256=path_sha256(configs) if configs is not None else json_sha256(list(rows_given)),
                     options_sha256=json_sha256({"options": opts.to_json(), "profiles": profiles,
                                                 "models": models}),
                     input_name="configuration CSV" if configs is not None else "layout grid")


def run_config_sweep(rows: Sequence[dict[str, Any]], opts: ConfigSweepOptions, *,
                     executor: str = "local", workers: int | None = None,
                     address: str | None = None,
                     progress: Callable[[int, int, dict], None] | None = None,
                     max_memory: int | None = None, log: RowLog | None = None) -> ConfigSweepResult:
    """Every row predicted (in row order in the result) on ``executor``, each worker within
    ``max_memory`` bytes. With ``log``, the rows it holds are not run again and each new row
    is appended to it as it finishes. A worker that dies, or a row past its memory budget, is
    that row's error; the sweep fails only when no row could run."""
    from echo_et.experiments.executors import Failure, run_rows

    check_config_sweep(opts, executor=executor, workers=workers, address=address, max_memory=max_memory)
    t0 = time.perf_counter()
    done: dict[int, dict[str, Any]] = dict(log.done) if log else {}
    seconds: dict[int, dict[str, float]] = dict(log.seconds) if log else {}

    def report(i: int, out: Any) -> None:
        failure = isinstance(out, Failure)
        row, secs = (failed_row(rows[i], out.message), {}) if failure else out
        if log is not None:
            log.append(i, row, retry=failure, seconds=secs)
        done[i] = row
        if secs:
            seconds[i] = secs
        if progress is not None:
            progress(len(done), len(rows), row)

    todo = [(i, row) for i, row in enumerate(rows) if i not in done]
    run_rows(executor, timed_predict_row, opts, todo, workers=workers, address=address,
             max_memory=max_memory, report=report, preload=PRELOAD)
    out = [done[i] for i in range(len(rows))]
    if out and all(r.get("error") for r in out):
        raise EchoError(f"no configuration could run; first: {out[0]['error']}")
    return ConfigSweepResult(out, opts, executor, wall_s=time.perf_counter() - t0, seconds=seconds)


# -- outputs -------------------------------------------------------------------------------------
def is_config_sweep_dir(path: Path) -> bool:
    """An earlier configuration sweep's output folder (whose outputs a new one replaces)."""
    return all((path / f).is_file() for f in OUTPUT_FILES)


def write_outputs(result: ConfigSweepResult, outdir: str | os.PathLike[str], *,
                  plot: bool = True) -> list[str]:
    """results.json (deterministic), table.txt, timings.json and (with ``plot``, when a row
    has a measurement) the predicted-vs-measured chart, each written atomically into
    ``outdir``. A folder of the user's is refused; in an earlier sweep's folder only the
    files a sweep writes are replaced (a chart this run does not draw is removed)."""
    out = Path(outdir)
    check_output_dir(out, is_config_sweep_dir, "an echo-et configuration sweep folder")
    out.mkdir(parents=True, exist_ok=True)
    files = list(OUTPUT_FILES)
    _write_text(out / "table.txt", result.table() + "\n")
    _write_text(out / TIMINGS_FILE, json.dumps(result.timings(), sort_keys=True, indent=1) + "\n")
    pts = [r for r in result.rows if r.get("error_pct") is not None]
    if plot and pts:
        from echo_et.experiments.plots import predicted_vs_measured_plot

        predicted_vs_measured_plot(pts, out / PLOT_FILE)
        files.append(PLOT_FILE)
    else:
        (out / PLOT_FILE).unlink(missing_ok=True)
    _write_text(out / "results.json", json.dumps(result.to_json(), sort_keys=True, indent=1) + "\n")
    return [*files, TIMINGS_FILE]


def _write_text(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text.encode())
