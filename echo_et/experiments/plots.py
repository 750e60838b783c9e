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
