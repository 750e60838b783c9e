"""One model configuration predicted for a cluster and written as a folder a person opens
(``echo-et predict``): the configuration is traced on the meta device, timed by the compute
and collective models of the GPU (:mod:`echo_et.experiments.config_sweep`, one row), simulated
node by node, and written as ``summary.json`` (the step time and its breakdown per rank),
``timeline/`` (the simulated step in Kineto's schema, one file per class of equivalent ranks:
HolisticTraceAnalysis, Perfetto), ``step.png`` (the breakdown chart) and ``job/`` (the traced
Job, for ``simulate``, ``scale`` and ``sweep``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echo_et.experiments.config_sweep import ConfigSweepOptions, predict_job, trace_row
from echo_et.ir import Job, save_job
from echo_et.ir.io import atomic_dir

SUMMARY = "summary.json"
TIMELINE = "timeline"
CHART = "step.png"
JOB = "job"


@dataclass
class Prediction:
    """What ``predict`` found: the configuration, the simulated step, the traced Job (no
    compute times) and the Job timed for the GPU."""

    config: dict[str, Any]
    options: ConfigSweepOptions
    result: Any          # echo_et.sim.SimResult, simulated node by node
    job: Job
    timed: Job

    def timeline_ranks(self) -> list[int]:
        """One rank per class of equivalent ranks: the timeline of the others is the same."""
        return [members[0] for _, members in self.result.rank_classes()]

    def to_json(self) -> dict[str, Any]:
        """What summary.json holds: the same bytes for the same configuration and options."""
        return {**self.result.to_json(), "config": self.config, "prediction": self.options.to_json(),
                "rank_classes": [members for _, members in self.result.rank_classes()]}


def predict_config(config: dict[str, Any], opts: ConfigSweepOptions) -> Prediction:
    """``config`` (a configuration row: layers, hidden, heads, seq, micro_batch,
    global_batch, tp, pp, dp[, vocab]) traced and predicted; EchoError when it does not fit."""
    from echo_et.trace.parallel import usable_cpus

    job = trace_row(config, opts, jobs=usable_cpus())
    res, timed = predict_job(job, opts, repeats=False)
    return Prediction(dict(config), opts, res, job, timed)


def is_prediction_dir(path: Path) -> bool:
    """An earlier ``predict`` output folder (which a new one replaces)."""
    return (path / SUMMARY).is_file() and (path / JOB).is_dir()


def check_output(out: Path) -> None:
    """Refuse, before any work, an output that is a file or a folder of the user's."""
    from echo_et.errors import EchoError

    if out.exists() and not out.is_dir():
        raise EchoError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not is_prediction_dir(out):
        raise EchoError(f"{out}: exists and is not an echo-et predict folder; refusing to replace it")


def write_prediction(pred: Prediction, outdir: str | os.PathLike[str], *, plot: bool) -> dict[str, Any]:
    """The folder, written whole or not at all: summary.json, timeline/, step.png (with
    ``plot``), job/. A folder of the user's is never replaced. Returns what was written."""
    from echo_et.converters.chrome import write_timeline

    out = Path(outdir)
    written: dict[str, Any] = {}
    with atomic_dir(out, replaceable=is_prediction_dir, kind="an echo-et predict folder") as tmp:
        save_job(pred.job, tmp / JOB)
        meta = {"world_size": pred.timed.world_size, "simulated": pred.result.mode}
        written["timeline"] = write_timeline(pred.result.timeline_events(pred.timeline_ranks()), tmp / TIMELINE,
                                             job=pred.timed, metadata=meta)
        written["timeline"]["output"] = str(out / TIMELINE)
        if plot:
            from echo_et.experiments.plots import rank_breakdown_plot

            c = pred.config
            title = (f"GPT {c['layers']} layers, hidden {c['hidden']}, tp{c['tp']} pp{c['pp']} dp{c['dp']} "
                     f"on {pred.timed.world_size} x {pred.options.gpu()}: predicted step")
            rank_breakdown_plot(pred.result, tmp / CHART, title=title)
            written["plot"] = str(out / CHART)
        (tmp / SUMMARY).write_text(json.dumps(pred.to_json(), sort_keys=True, indent=1) + "\n")
    written["summary"] = str(out / SUMMARY)
    written["job"] = str(out / JOB)
    return written
