"""``simulate`` (choose the mode) and ``validate`` (replay and predict vs measured)."""

from __future__ import annotations

from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.job import Job
from echo_et.sim.predict import Predictor
from echo_et.sim.result import SimResult
from echo_et.sim.simulator import SimOptions, Simulator

MODES = ("replay", "predict")


def simulate(job: Job, mode: str = "replay", *, options: SimOptions | None = None, comm_model: Any = None,
             slowdown_model: Any = None, node_network: Any = None) -> SimResult:
    """Simulate one step of ``job``. ``predict`` needs ``comm_model``; ``slowdown_model``
    (predict only) may be None to switch the overlap slowdown off; ``node_network`` (predict
    only, an :class:`echo_et.sim.nic_share.NodeNetwork`) shares each node's NICs among the
    transfers that leave it together."""
    if mode == "replay":
        return Simulator(job, options).run()
    if mode == "predict":
        return Predictor(job, options, comm_model=comm_model, slowdown_model=slowdown_model,
                         node_network=node_network).run()
    raise EchoError(f"unknown simulation mode {mode!r} (use {' or '.join(MODES)})")


def measured_step(job: Job, rank: int) -> tuple[int, str]:
    """The measured step time of ``rank`` and where it comes from: the binding's
    ``measured_step_ns`` when the converter found one, else the span of its graph."""
    b = job.binding(rank)
    if b.measured_step_ns > 0:
        return int(b.measured_step_ns), "binding"
    span = measured_span(job, rank)
    return span, "graph span" if span else "none"


def measured_span(job: Job, rank: int) -> int:
    """First measured start to last measured end of the rank's graph: what replay
    reproduces. It exceeds the ProfilerStep time when the device still works on the step
    after the host annotation ended (no synchronisation at the end of the step)."""
    g = job.graph(job.binding(rank).graph)
    if not g.nodes:
        return 0
    return int(max(n.start_ns + n.duration_ns for n in g.nodes) - min(n.start_ns for n in g.nodes))


def measured_caveat(job: Job) -> str | None:
    """One sentence on why this Job's measured step and its simulated one are not like for
    like, from its provenance; None when they are.

    A Job traced ex-situ measured each traced rank alone, under a recording process group:
    its "measured" step is that rank's compute (and host work) with communication that
    returned at once, no waiting for other ranks and no pipeline bubble. Replay and
    predict compose all ranks, with their collectives and waits, so they take longer than
    that by design; and compute timed on a CPU is CPU time, not what a GPU would take."""
    if job.manifest.provenance.source_format != "ex-situ":
        return None
    device = job.manifest.attrs.get("trace.device", "") or "cpu"
    on_cpu = device.startswith("cpu")
    where = "on CPU" if on_cpu else f"on {device}"
    steps = job.manifest.attrs.get("trace.measured_steps", "1")
    return (f"this Job was traced ex-situ {where} under a recording process group ({steps} measured "
            f"step{'s' if steps != '1' else ''}): a rank's measured step is its own compute with no real "
            "communication and no waiting for other ranks, while replay and predict compose every rank "
            "with its collectives and pipeline waits, so the errors compare different things"
            + ("; its compute times are CPU times" if on_cpu else ""))


def _err(sim: int, measured: int) -> float | None:
    if measured <= 0:
        return None
    return round(100.0 * (sim - measured) / measured, 3)


def validate(job: Job, *, comm_model: Any, slowdown_model: Any = None,
             options: SimOptions | None = None) -> dict[str, Any]:
    """Replay and predict ``job`` and compare each rank's step time with the measured one.
    Errors are signed percentages ((simulated - measured) / measured)."""
    options = options or SimOptions()
    replay = simulate(job, "replay", options=options)
    predict = simulate(job, "predict", options=options, comm_model=comm_model, slowdown_model=slowdown_model)
    ranks: dict[str, Any] = {}
    abs_r: list[float] = []
    abs_p: list[float] = []
    measured_max = 0
    for r in sorted(replay.ranks):
        m, source = measured_step(job, r)
        rs = replay.ranks[r].step_time_ns
        ps = predict.ranks[r].step_time_ns
        er, ep = _err(rs, m), _err(ps, m)
        if er is not None:
            abs_r.append(abs(er))
        if ep is not None:
            abs_p.append(abs(ep))
        measured_max = max(measured_max, m)
        ranks[str(r)] = {"measured_step_ns": m, "measured_source": source, "measured_span_ns": measured_span(job, r),
                         "replay_step_ns": rs, "predict_step_ns": ps, "replay_error_pct": er,
                         "predict_error_pct": ep}
    return {
        "measured_step_ns": measured_max,
        "replay_step_ns": replay.step_time_ns,
        "predict_step_ns": predict.step_time_ns,
        "replay_error_pct": _err(replay.step_time_ns, measured_max),
        "predict_error_pct": _err(predict.step_time_ns, measured_max),
        "replay_mean_abs_error_pct": round(sum(abs_r) / len(abs_r), 3) if abs_r else None,
        "predict_mean_abs_error_pct": round(sum(abs_p) / len(abs_p), 3) if abs_p else None,
        "replay_max_abs_error_pct": round(max(abs_r), 3) if abs_r else None,
        "predict_max_abs_error_pct": round(max(abs_p), 3) if abs_p else None,
        "ranks": ranks,
        "simulated_ranks": {"replay": replay.simulated_ranks, "predict": predict.simulated_ranks},
        "slowdown": predict.slowdown,
        "measured_caveat": measured_caveat(job),
    }
