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
    dest = Path(dest)
    fig.savefig(dest, format="png", metadata={"Software": None})
    return dest


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
    dest = Path(dest)
    fig.savefig(dest, format="png", metadata={"Software": None})
    return dest


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
    dest = Path(dest)
    fig.savefig(dest, format="png", metadata={"Software": None})
    return dest
