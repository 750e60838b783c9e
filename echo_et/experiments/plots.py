"""Charts of experiment results, drawn with matplotlib (the optional ``plot`` extra).

matplotlib is imported when a chart is drawn, never at import time, so the base install
works without it; asking for a chart without it is one clear error. Charts are drawn on a
bare ``Figure`` with the Agg canvas (no pyplot global state, no display needed) and saved
without the software-version stamp, so the same results give the same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.io import atomic_file
from echo_et.sim.result import LABELS, STEP_PARTS

INSTALL_HINT = "pip install 'echo-et[plot]'"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width_in: float, height_in: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise EchoError(f"plots need matplotlib, which is not installed ({INSTALL_HINT})") from None
    fig = Figure(figsize=(width_in, height_in), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def sweep_series(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Step time (ms) against world size, one series per (tp, pp, micro-batches); failed
    points are left out."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("error"):
            continue
        label = f"tp={r['tp']} pp={r['pp']} mb={r['microbatches']}"
        series.setdefault(label, []).append((int(r["world_size"]), r["step_time_ns"] / 1e6))
    return {k: sorted(v) for k, v in series.items()}


def sweep_step_time_plot(rows: Iterable[Mapping[str, Any]], dest: str | os.PathLike[str]) -> Path:
    """A 720x480 PNG of step time against world size (log2 x axis), one line per layout."""
    series = sweep_series(rows)
    if not series:
        raise EchoError("no successful sweep point to plot")
    fig = _figure(7.2, 4.8)
    ax = fig.add_subplot()
    for label, pts in series.items():
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label)
    worlds = sorted({x for pts in series.values() for x, _ in pts})
    if len(worlds) > 1 and worlds[0] > 0:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
    ax.set_xticks(worlds, [str(w) for w in worlds])
    ax.set_xlabel("world size (GPUs)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("step time vs world size")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, dest)


def _save(fig, dest: str | os.PathLike[str]) -> Path:
    """PNG without the software stamp (PNG has no date), written atomically."""
    dest = Path(dest)
    with atomic_file(dest) as f:
        fig.savefig(f, format="png", metadata={"Software": None})
    return dest


# -- simulate: where each rank's step goes --------------------------------------------------------
MAX_BARS = 48


# The chart's stacked parts, named as the vocabulary's labels (docs/step-breakdown.md).
BREAKDOWN_PARTS = tuple(LABELS[k] for k in STEP_PARTS)


def breakdown_rows(result) -> list[dict[str, Any]]:
    """The bars of :func:`rank_breakdown_plot`, in ms: per rank (or, past ``MAX_BARS``
    ranks, per class of equivalent ranks, slowest first) its compute, exposed comm, bubble
    (waiting for peers, not hidden) and host idle (the device waiting for the host). The four
    add up to the step time."""
    if len(result.ranks) > MAX_BARS:
        classes = sorted(result.rank_classes(), key=lambda c: (-c[0].step_time_ns, c[1][0]))[:MAX_BARS]
        chosen = [[result.ranks[r] for r in members] for _, members in classes]
    else:
        chosen = [[r] for r in sorted(result.ranks.values(), key=lambda r: r.rank)]
    rows = []
    for members in chosen:
        r = members[0]
        label = f"{r.rank}" if len(members) == 1 else f"{r.rank} (+{len(members) - 1})"
        b = r.breakdown()
        rows.append({"label": label, "ranks": [m.rank for m in members], "step_ms": r.step_time_ns / 1e6,
                     **{LABELS[k]: b[k] / 1e6 for k in STEP_PARTS}})
    return rows


_COLOURS = {"compute": "#4C72B0", "exposed comm": "#DD8452", "bubble": "#C44E52", "host idle": "#BBBBBB",
            "measured": "#333333", "replay": "#4C72B0", "predict": "#DD8452"}


def rank_breakdown_plot(result, dest: str | os.PathLike[str], *, title: str = "") -> Path:
    """Stacked bars: each rank's simulated step split into compute, exposed comm, bubble and
    host idle (:func:`breakdown_rows`)."""
    rows = breakdown_rows(result)
    if not rows:
        raise EchoError("the result holds no rank to plot")
    width = min(16.0, max(6.4, 0.28 * len(rows) + 2.5))
    fig = _figure(width, 4.8)
    ax = fig.add_subplot()
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for part in BREAKDOWN_PARTS:
        vals = [row[part] for row in rows]
        ax.bar(xs, vals, bottom=bottom, color=_COLOURS[part], label=part, width=0.8)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(xs, [row["label"] for row in rows], rotation=90 if len(rows) > 16 else 0, fontsize="small")
    ax.set_xlabel("rank" if all(len(r["ranks"]) == 1 for r in rows) else "rank (+ the equivalent ranks it stands for)")
    ax.set_ylabel("time (ms)")
    ax.set_title(title or "simulated step per rank")
    ax.set_ylim(0, max(bottom) * 1.18 or 1.0)   # room for the legend above the bars
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", ncol=len(BREAKDOWN_PARTS))
    fig.tight_layout()
    return _save(fig, dest)


# -- validate: measured vs simulated -----------------------------------------------------------------
def validation_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per rank: measured, replayed and predicted step time in ms (None where unknown)."""
    def ms(v: Any) -> float | None:
        return None if v is None else v / 1e6

    return [{"rank": int(r), "measured": ms(row.get("measured_step_ns")), "replay": ms(row.get("replay_step_ns")),
             "predict": ms(row.get("predict_step_ns"))}
            for r, row in sorted(report.get("ranks", {}).items(), key=lambda kv: int(kv[0]))]


def validation_plot(report: Mapping[str, Any], dest: str | os.PathLike[str], *, title: str = "") -> Path:
    """Grouped bars per rank: measured, replayed and predicted step time (``validate``)."""
    rows = validation_rows(report)[:MAX_BARS]
    if not rows:
        raise EchoError("the validation holds no rank to plot")
    width = min(16.0, max(6.4, 0.45 * len(rows) + 2.5))
    fig = _figure(width, 4.8)
    ax = fig.add_subplot()
    series = ("measured", "replay", "predict")
    w = 0.8 / len(series)
    for k, name in enumerate(series):
        xs = [i - 0.4 + w * (k + 0.5) for i in range(len(rows))]
        vals = [row[name] if row[name] is not None else 0.0 for row in rows]
        ax.bar(xs, vals, width=w, color=_COLOURS[name], label=name)
    ax.set_xticks(range(len(rows)), [str(r["rank"]) for r in rows], fontsize="small")
    ax.set_xlabel("rank")
    ax.set_ylabel("step time (ms)")
    err = report.get("predict_error_pct")
    suffix = f" (predict {err:+.1f} % overall)" if isinstance(err, int | float) else ""
    ax.set_title((title or "measured vs simulated step") + suffix)
    top = max((row[k] or 0.0) for row in rows for k in series)
    ax.set_ylim(0, top * 1.18 or 1.0)   # room for the legend above the bars
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper center", ncol=len(series))
    fig.tight_layout()
    return _save(fig, dest)


# -- the slowdown model: predicted vs measured kernel durations -----------------------------------
def slowdown_prediction_plot(predictions: Mapping[str, Any], dest: str | os.PathLike[str], *,
                             title: str = "") -> Path:
    """Scatter of every overlapped kernel's measured duration against the duration predicted
    by a model that never saw its kernel name (grouped cross-validation: ``predictions``
    from ``echo_et.models.slowdown.evaluate.cross_validated_predictions``), log-log, with
    no slowdown (isolated duration) for reference and the line where prediction = measure."""
    import numpy as np

    ov = np.asarray(predictions["overlapped"], dtype=bool)
    obs = np.asarray(predictions["observed"], dtype=float)[ov] / 1e3
    if obs.size == 0:
        raise EchoError("no overlapped kernel to plot")
    fig = _figure(6.4, 6.0)
    ax = fig.add_subplot()
    for key, label, colour, marker in (("isolated", "no slowdown (isolated)", "#BBBBBB", "x"),
                                       ("constant", "constant s", "#55A868", "^"),
                                       ("model", "echo-et (per class)", "#4C72B0", "o")):
        pred = np.asarray(predictions[key], dtype=float)[ov] / 1e3
        ax.scatter(obs, pred, s=10, c=colour, marker=marker, label=label, alpha=0.7, linewidths=0.5)
    lo = max(1e-3, float(min(obs.min(), np.asarray(predictions["model"], dtype=float)[ov].min() / 1e3)) * 0.8)
    hi = float(obs.max()) * 1.25
    ax.plot([lo, hi], [lo, hi], color="#333333", linewidth=0.8, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured overlapped duration (µs)")
    ax.set_ylabel("predicted duration (µs)")
    ax.set_title(title or "overlap slowdown: predicted vs measured (grouped CV)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    return _save(fig, dest)


def predicted_vs_measured_plot(rows: Iterable[Mapping[str, Any]], dest: str | os.PathLike[str], *,
                               title: str = "predicted vs measured iteration time") -> Path:
    """A 640x640 PNG: predicted against measured time (ms, log axes), one colour per layout
    family (``family``), with the y = x line and +-10 % bands."""
    pts = [(float(r["measured_ms"]), float(r["predicted_ms"]), str(r.get("family", "")))
           for r in rows if r.get("measured_ms") and r.get("predicted_ms") is not None]
    if not pts:
        raise EchoError("no row with both a measurement and a prediction to plot")
    fig = _figure(6.4, 6.4)
    ax = fig.add_subplot()
    for fam in sorted({f for _, _, f in pts}):
        sel = [(m, p) for m, p, f in pts if f == fam]
        ax.scatter([m for m, _ in sel], [p for _, p in sel], s=10, alpha=0.6, label=fam or None)
    lo = min(min(m, p) for m, p, _ in pts) * 0.8
    hi = max(max(m, p) for m, p, _ in pts) * 1.25
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    for f in (0.9, 1.1):
        ax.plot([lo, hi], [lo * f, hi * f], color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3, which="both")
    if any(f for _, _, f in pts):
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, dest)


def error_histogram_plot(errors: Mapping[str, Iterable[float]], dest: str | os.PathLike[str], *,
                         title: str = "prediction error") -> Path:
    """A 720x420 PNG: histograms of signed errors (%), one per series."""
    series = {k: [float(x) for x in v] for k, v in errors.items()}
    if not any(series.values()):
        raise EchoError("no error to plot")
    fig = _figure(7.2, 4.2)
    ax = fig.add_subplot()
    lo = min(min(v) for v in series.values() if v)
    hi = max(max(v) for v in series.values() if v)
    span = max(abs(lo), abs(hi), 1.0)
    bins = [(-span + 2 * span * i / 40) for i in range(41)]
    for label, vals in series.items():
        if vals:
            ax.hist(vals, bins=bins, alpha=0.5, label=label)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_xlabel("error (%) = (predicted - measured) / measured")
    ax.set_ylabel("configurations")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, dest)
