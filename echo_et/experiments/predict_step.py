"""One model configuration predicted for a cluster and written as a folder a person opens
(``echo-et predict``): the configuration is traced on the meta device, timed by the compute
and collective models of the GPU (:mod:`echo_et.experiments.config_sweep`, one row), simulated
with its repeat blocks placed in closed form (the same step, breakdown and timeline as node by
node, in a fraction of the time and memory), and written as ``summary.json`` (the step time
and its breakdown per rank), ``timeline/`` (the simulated step in Kineto's schema, one file per
class of equivalent ranks: HolisticTraceAnalysis, Perfetto; by default the longest prefix of
the step within :data:`TIMELINE_EVENTS` boxes in all, which Perfetto opens at once),
``step.png`` (the breakdown chart) and ``job/`` (the traced Job, for ``simulate``, ``scale``
and ``sweep``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo_et.experiments.advice import prediction_advice
from echo_et.experiments.config_rows import ConfigSweepOptions
from echo_et.experiments.config_sweep import retime_job, row_throughput, simulate_timed, trace_row
from echo_et.ir import Job, save_job
from echo_et.ir.io import GRAPH_DIR, GRAPH_SUFFIX, MANIFEST_NAME, atomic_dir, written_by

SUMMARY = "summary.json"
TIMELINE = "timeline"
CHART = "step.png"
JOB = "job"
# Boxes written in timeline/ by default (all files together): the longest prefix of the step
# that holds no more. A large job's whole step is millions of boxes (GPT-175B on 512 GPUs:
# 5.6 million), minutes to write and more than Perfetto opens; this many take seconds, hold
# the pipeline's warm-up and steady state, and keep the README's job whole.
TIMELINE_EVENTS = 100_000


@dataclass
class Prediction:
    """What ``predict`` found: the configuration, the simulated step, the traced Job (no
    compute times) and the Job timed for the GPU."""

    config: dict[str, Any]
    options: ConfigSweepOptions
    result: Any          # echo_et.sim.SimResult (repeat blocks placed in closed form)
    job: Job
    timed: Job
    retime: Any          # echo_et.passes.RetimeReport: the compute time and what bounds it
    throughput: dict[str, Any]   # the step's rates (echo_et.experiments.throughput)
    advice: tuple[str, ...] = ()  # what the prediction does not price (experiments.advice)

    def timeline_ranks(self) -> list[int]:
        """One rank per class of equivalent ranks: the timeline of the others is the same."""
        return [members[0] for _, members in self.result.rank_classes()]

    def to_json(self) -> dict[str, Any]:
        """What summary.json holds: the same bytes for the same configuration and options."""
        return {**self.result.to_json(), "config": self.config, "prediction": self.options.to_json(),
                "rank_classes": [members for _, members in self.result.rank_classes()],
                "compute_retime": self.retime.to_json(), "throughput": self.throughput,
                "advice": list(self.advice)}


def predict_config(config: dict[str, Any], opts: ConfigSweepOptions) -> Prediction:
    """``config`` (a configuration row: layers, hidden, heads, seq, micro_batch,
    global_batch, tp, pp, dp[, vocab]) traced and predicted; EchoError when it does not fit."""
    from echo_et.trace.parallel import usable_cpus

    job = trace_row(config, opts, jobs=usable_cpus())
    timed, retime = retime_job(job, opts)
    res = simulate_timed(timed, opts, repeats=True)
    return Prediction(dict(config), opts, res, job, timed, retime, row_throughput(config, opts, res.step_time_ns),
                      prediction_advice(int(config["hidden"]), int(config["heads"]), opts.dtype,
                                        int(config["tp"]), opts.num_experts))


# What a predict folder holds: nothing else (a user's notes.txt beside them makes the folder
# the user's, never replaced: replacing it would delete that file).
_PREDICTION_FILES = written_by(CHART, f"{TIMELINE}/rank-*.json", f"{JOB}/{MANIFEST_NAME}",
                               f"{JOB}/{GRAPH_DIR}/*{GRAPH_SUFFIX}", required=SUMMARY)


def is_prediction_dir(path: Path) -> bool:
    """An earlier ``predict`` output folder (which a new one replaces): its files and no other."""
    return (path / JOB).is_dir() and _PREDICTION_FILES(path)


def check_output(out: Path) -> None:
    """Refuse, before any work, an output that is a file or a folder of the user's."""
    from echo_et.errors import EchoError
    from echo_et.ir.io import holds_more_than_leftovers

    if out.exists() and not out.is_dir():
        raise EchoError(f"{out}: exists and is not a directory")
    if out.is_dir() and holds_more_than_leftovers(out) and not is_prediction_dir(out):
        raise EchoError(f"{out}: exists and is not an echo-et predict folder; refusing to replace it")


def timeline_window(pred: Prediction, max_events: int | None) -> dict[str, Any]:
    """What timeline/ holds: ``events`` boxes of the ``of`` in the step (the class
    representatives'), those that start before ``until_ns`` (job clock, ns; None: the whole
    step), which starts at ``from_ns``. ``max_events`` None: every box."""
    from echo_et.errors import OptionError
    from echo_et.sim.timeline import window_end

    if max_events is not None and max_events < 1:
        raise OptionError("timeline_events", f"must be >= 1, got {max_events}")
    until, total = window_end(pred.result, pred.timeline_ranks(), max_events)
    start = min((st.origin_ns for st in pred.result.timeline.states), default=0)
    return {"from_ns": start, "until_ns": until, "events": total if until is None else None, "of": total}


def write_prediction(pred: Prediction, outdir: str | os.PathLike[str], *, plot: bool,
                     timeline_events: int | None = TIMELINE_EVENTS) -> dict[str, Any]:
    """The folder, written whole or not at all: summary.json, timeline/, step.png (with
    ``plot``), job/. ``timeline_events``: at most this many boxes in timeline/, the step's
    longest prefix that holds no more (None: the whole step). A folder of the user's is
    never replaced. Returns what was written (``timeline.window``: what timeline/ holds,
    also in summary.json)."""
    from echo_et.converters.chrome import write_timeline
    from echo_et.sim.timeline import first_start
    from echo_et.sim.timeline import timeline_events as sim_events

    out = Path(outdir)
    written: dict[str, Any] = {}
    window = timeline_window(pred, timeline_events)
    with atomic_dir(out, replaceable=is_prediction_dir, kind="an echo-et predict folder") as tmp:
        save_job(pred.job, tmp / JOB)
        meta: dict[str, Any] = {"world_size": pred.timed.world_size, "simulated": pred.result.mode}
        if window["until_ns"] is not None:
            meta["until_ns"] = window["until_ns"]
        ranks, until = pred.timeline_ranks(), window["until_ns"]
        written["timeline"] = write_timeline(sim_events(pred.result, ranks, until_ns=until), tmp / TIMELINE,
                                             job=pred.timed, metadata=meta,
                                             origin_ns=first_start(pred.result, ranks, until_ns=until))
        written["timeline"]["output"] = str(out / TIMELINE)
        window["events"] = written["timeline"]["events"]
        written["timeline"]["window"] = window
        if plot:
            from echo_et.experiments.plots import rank_breakdown_plot

            c = pred.config
            title = (f"GPT {c['layers']} layers, hidden {c['hidden']}, tp{c['tp']} pp{c['pp']} dp{c['dp']} "
                     f"on {pred.timed.world_size} x {pred.options.gpu()}: predicted step")
            rank_breakdown_plot(pred.result, tmp / CHART, title=title)
            written["plot"] = str(out / CHART)
        (tmp / SUMMARY).write_text(json.dumps({**pred.to_json(), "timeline": window}, sort_keys=True, indent=1)
                                   + "\n")
    written["summary"] = str(out / SUMMARY)
    written["job"] = str(out / JOB)
    return written
